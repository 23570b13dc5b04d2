"""Multi-seed aggregation and paper-style tables (markdown or LaTeX) of ``evaluate_outputs`` output.

``aggregate(results)`` turns a list of result dicts (one per seed) into the same tree with every
number replaced by ``{"mean", "std", "n"}`` (std = sample std, ddof=1; None for a single run).
``results_table`` prints the paper's main-table layout (Acc, Conf.MP, then MP and UM per OOD set:
AUPR in %, mean ± std) followed by a calibration table (NLL, Brier, ECE as fractions, as in the
paper's calibration table) and a detection-detail table (AUPR-in/out, AUROC, FPR95).
``load_runs`` and ``main`` back ``bin/report.py``.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import math
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gedl_jax import files
from gedl_jax.evaluation.ood_aupr import AUPR_TRAPEZOIDAL_HEADER

__all__ = ["aggregate", "main_table_values", "results_table", "load_runs", "main",
           "RESULTS_FILENAME"]

RESULTS_FILENAME = "eval_results.json"
_SKIP_KEYS = frozenset({"conventions", "seed"})   # not aggregated
_PAPER_SCORES = (("mp", "MP"), ("um", "UM"))


# ------------------------------------------------------------------------------------------------
# Aggregation
# ------------------------------------------------------------------------------------------------
def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool,
                                                                                        np.bool_))


def _stats(values: list[Any]) -> dict[str, Any]:
    vals = [float(v) for v in values if _is_number(v) and math.isfinite(float(v))]
    n = len(vals)
    if n == 0:
        return {"mean": None, "std": None, "n": 0}
    return {"mean": float(np.mean(vals)), "std": float(np.std(vals, ddof=1)) if n > 1 else None,
            "n": n}


def _aggregate_nodes(nodes: list[Any]) -> Any:
    dicts = [x for x in nodes if isinstance(x, Mapping)]
    if dicts:
        keys = list(dict.fromkeys(k for d in dicts for k in d))
        out = {}
        for k in keys:
            if k in _SKIP_KEYS:
                continue
            sub = _aggregate_nodes([d[k] for d in dicts if k in d])
            if sub is not None:
                out[k] = sub
        return out or None
    if any(_is_number(x) for x in nodes) or (nodes and all(x is None for x in nodes)):
        return _stats(nodes)
    return None   # strings, lists (per-bin data): not aggregated


def aggregate(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Mean and spread of every number over runs (e.g. seeds) of ``evaluate_outputs`` results.

    Returns the union tree of the inputs where each numeric leaf becomes
    ``{"mean": float | None, "std": float | None, "n": int}``: mean and *sample* standard deviation
    (ddof=1; None when n == 1) over the runs where the leaf is a finite number (null / missing
    entries are left out and ``n`` counts the rest). Strings, lists (per-bin calibration data) and
    the keys "conventions" and "seed" are not aggregated.
    """
    if not results:
        raise ValueError("aggregate() needs at least one result.")
    return _aggregate_nodes(list(results)) or {}


# ------------------------------------------------------------------------------------------------
# Tables
# ------------------------------------------------------------------------------------------------
def _get(tree: Mapping[str, Any], path: Sequence[str]) -> dict[str, Any] | None:
    node: Any = tree
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node if isinstance(node, Mapping) and "mean" in node else None


def _fmt(stat: Mapping[str, Any] | None, scale: float, digits: int, latex: bool,
         runs: int) -> str:
    """mean ± std; "(n=...)" when fewer than all `runs` had a finite value; a dash if none."""
    if stat is None or stat["mean"] is None:
        return "--" if latex else "–"
    text = f"{stat['mean'] * scale:.{digits}f}"
    if stat["std"] is not None:
        text += (r"$\pm$" if latex else " ± ") + f"{stat['std'] * scale:.{digits}f}"
    if stat["n"] < runs:
        text += f" (n={stat['n']})"
    return text


def _latex_escape(text: str) -> str:
    return re.sub(r"([_&%#$])", r"\\\1", str(text))


def _render(header: list[str], rows: list[list[str]], latex: bool,
            groups: list[tuple[str, int]] | None = None) -> str:
    if not latex:
        lines = ["| " + " | ".join(header) + " |",
                 "|" + "|".join(["---"] + [":---:"] * (len(header) - 1)) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        return "\n".join(lines)
    lines = [r"\begin{tabular}{l " + " ".join("c" * (len(header) - 1)) + "}", r"\toprule"]
    if groups:
        cells, rules, col = [""], [], 2
        for title, span in groups:
            cells.append(rf"\multicolumn{{{span}}}{{c}}{{{title}}}" if span > 1 else title)
            if title:
                rules.append(rf"\cmidrule(lr){{{col}-{col + span - 1}}}")
            col += span
        lines.append(" & ".join(cells) + r" \\")
        lines.append("".join(rules))
    lines.append(" & ".join(header) + r" \\")
    lines.append(r"\midrule")
    lines += [" & ".join(r) + r" \\" for r in rows]
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines)


def _as_groups(results: Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Mapping[str, Any]]]
               ) -> dict[str, list[Mapping[str, Any]]]:
    if isinstance(results, Mapping):
        groups = {str(k): list(v) for k, v in results.items()}
    else:
        results = list(results)
        names = [r.get("variant") or r.get("name") for r in results]
        if len(set(names) - {None}) > 1:   # never average different methods together
            groups = {}
            for name, r in zip(names, results):
                groups.setdefault(str(name or "results"), []).append(r)
        else:
            groups = {str(next((n for n in names if n), "results")): results}
    if not groups or any(not v for v in groups.values()):
        raise ValueError("results_table needs at least one result per method.")
    return groups


def _seed_phrase(counts: dict[str, int]) -> str:
    values = set(counts.values())
    if len(values) == 1:
        n = values.pop()
        return f"{n} seed{'s' if n != 1 else ''}"
    return "seeds per method: " + ", ".join(f"{k} {v}" for k, v in counts.items())


def main_table_values(results: Sequence[Mapping[str, Any]]
                      | Mapping[str, Sequence[Mapping[str, Any]]],
                      ood_names: Sequence[str] | None = None
                      ) -> tuple[list[str], dict[str, list[tuple[float | None, float | None]]]]:
    """The numbers of ``results_table``'s main table: (column labels, {method: [(mean, std) in %
    per column]}), columns Acc, Conf.MP, then <set> MP and <set> UM per OOD set (AUPR-in).
    Accepts the same ``results`` and ``ood_names`` as ``results_table``; a value no seed has is
    (None, None), a single seed's std is None. Backs ``plots.method_comparison``."""
    groups = _as_groups(results)
    if ood_names is None:
        ood_names = list(dict.fromkeys(k for runs in groups.values() for r in runs
                                       for k in (r.get("ood") or {})))
    paths = [("Acc", ("id", "accuracy")), ("Conf.MP", ("id", "misclassification", "mp", "aupr"))]
    paths += [(f"{o} {label}", ("ood", o, "detection", s, "aupr_in"))
              for o in ood_names for s, label in _PAPER_SCORES]
    values = {}
    for name, runs in groups.items():
        agg = aggregate(runs)
        row = []
        for _, path in paths:
            stat = _get(agg, path)
            mean = None if stat is None or stat["mean"] is None else 100 * stat["mean"]
            std = None if stat is None or stat["std"] is None else 100 * stat["std"]
            row.append((mean, std))
        values[name] = row
    return [label for label, _ in paths], values


def results_table(results: Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Mapping[str, Any]]],
                  fmt: str = "markdown", ood_names: Sequence[str] | None = None,
                  extra: bool = True) -> str:
    """Paper-style tables of mean ± std over seeds.

    Args:
      results: the ``evaluate_outputs`` dicts of the seeds of one method (one table row, named by
        their "variant" / "name" key; a list mixing several such names is split into one row per
        name), or ``{method: [results of its seeds]}`` (one row each, in order).
      fmt: "markdown" or "latex" (booktabs; the main table's group header uses multicolumn).
      ood_names: OOD sets and their order (default: every set, in order of first appearance).
      extra: also print the calibration table (NLL, Brier, Brier-L2, ECE, adaptive ECE; fractions
        as in the paper's calibration table) and the detection-detail table (Conf. AUPR / AUROC,
        OOD AUPR-in, AUPR-out, AUROC, FPR95 for MP and UM; in %).

    The main table is the paper's layout: Method | Acc | Conf.MP | <set> MP | <set> UM | ...,
    in %, with AUPR = average precision, correct (Conf.) / in-distribution (OOD) positive. Every
    table is preceded by a header line stating the conventions and the number of seeds.
    Spread = sample standard deviation (ddof=1); a single seed prints the mean alone; a value
    missing (null) in some seeds is averaged over the others and marked "(n=...)".
    """
    if fmt not in ("markdown", "latex"):
        raise ValueError(f"fmt must be 'markdown' or 'latex', got {fmt!r}.")
    t = _Tables.build(_as_groups(results), fmt == "latex", ood_names)
    parts = t.main() + t.methods()
    if extra:
        parts += t.calibration() + t.details()
        parts += (t.posthoc_scores() + t.selective() + t.scod() + t.conformal()
                  + t.ood_groups() + t.trapezoidal() + t.bootstrap() + t.posthoc()
                  + t.calibrators())
    return "\n\n".join(parts) + "\n"


def _calibrated_label(name: str, runs: Sequence[Mapping[str, Any]]) -> str | None:
    """The row name of a method's calibrated predictions ("gedl (calibrated: evidence_scale)"),
    or None where its results have none (calibrate=False)."""
    fits = [r["posthoc_calibration"]["fit"].get("calibrator") for r in runs
            if isinstance(r.get("posthoc_calibration"), Mapping)
            and isinstance(r.get("calibrated"), Mapping)]
    if not fits:
        return None
    return f"{name} (calibrated: {'/'.join(dict.fromkeys(str(f) for f in fits))})"


def set_labels(names: Sequence[str]) -> dict[str, str]:
    """The tables' label of each OOD set in `names`: a set named by an absolute or home path
    (`images:/data/ood/textures`, `npz:~/sets/c100.npz`, an IDX folder) by its prefix and the
    path's last part (`images:textures`), where no other set of `names` gets that label; every
    other name as it is. The results files keep the full names.

    >>> set_labels(["kmnist", "images:/data/ood/textures/", "npz:/a/x.npz", "npz:/b/x.npz"])
    {'kmnist': 'kmnist', 'images:/data/ood/textures/': 'images:textures', \
'npz:/a/x.npz': 'npz:/a/x.npz', 'npz:/b/x.npz': 'npz:/b/x.npz'}
    """
    def short(name: str) -> str:
        prefix, sep, rest = name.partition(":")
        if not sep or not prefix.isalpha():
            prefix, sep, rest = "", "", name
        if not rest.startswith(("/", "~")):
            return name
        last = rest.rstrip("/").rsplit("/", 1)[-1]
        return f"{prefix}{sep}{last}" if last else name

    shorts = {n: short(n) for n in names}
    counts = collections.Counter(shorts.values())
    return {n: label if counts[label] == 1 else n for n, label in shorts.items()}


@dataclasses.dataclass(frozen=True)
class _Tables:
    """The aggregated rows of `results_table` and how to print them."""

    groups: dict[str, list]
    aggregates: dict[str, Any]
    latex: bool
    ood_names: list[str]
    id_name: str
    datasets_known: bool
    seeds: str

    calibrated_rows: tuple[str, ...] = ()
    labels: dict[str, str] = dataclasses.field(default_factory=dict)   # `set_labels`

    @classmethod
    def build(cls, groups, latex: bool, ood_names) -> _Tables:
        if ood_names is None:
            ood_names = list(dict.fromkeys(k for runs in groups.values() for r in runs
                                           for k in (r.get("ood") or {})))
        datasets = {r.get("dataset") for runs in groups.values() for r in runs} - {None}
        known = len(datasets) == 1
        seeds = _seed_phrase({name: len(runs) for name, runs in groups.items()})
        rows, aggregates, calibrated = {}, {}, []
        for name, runs in groups.items():   # calibrate=True: a calibrated row after each method
            rows[name], aggregates[name] = runs, aggregate(runs)
            label = _calibrated_label(name, runs)
            if label is not None and "calibrated" in aggregates[name]:
                rows[label] = [r for r in runs if isinstance(r.get("calibrated"), Mapping)]
                aggregates[label] = {**aggregates[name]["calibrated"],
                                     "scores": aggregates[name].get("scores")}
                calibrated.append(label)
        return cls(rows, aggregates, latex, list(ood_names), datasets.pop() if known else "ID",
                   known, seeds, tuple(calibrated), set_labels(list(ood_names)))

    @property
    def um_note(self) -> str:
        """What UM is in each row, in its method's words (the results' "score_captions"); rows
        whose results predate them are named as such."""
        rows: dict[str, list[str]] = {}
        for name, runs in self.groups.items():
            if name in self.calibrated_rows:
                continue
            recorded = [r["score_captions"] for r in runs if "score_captions" in r]
            caption = ("not recorded" if not recorded
                       else recorded[0].get("um") or "– for a method without one")
            rows.setdefault(caption, []).append(self.esc(name))
        return ": " + "; ".join(f"{caption} ({', '.join(names)})"
                                for caption, names in rows.items()) if rows else ""

    @property
    def calibrated_note(self) -> str:
        if not self.calibrated_rows:
            return ""
        return (" Rows '<method> (calibrated: ...)': the same predictions after post-hoc "
                "calibration fitted on the validation split (temperature: p = softmax(log p / "
                "T); evidence_scale: alpha = s e + W a).")

    @property
    def comment(self) -> str:
        return "% " if self.latex else "> "

    def esc(self, text: str) -> str:
        return _latex_escape(text) if self.latex else str(text)

    def set_label(self, name: str) -> str:
        """OOD set `name` as the tables show it (`set_labels`), escaped."""
        return self.esc(self.labels.get(name, name))

    @property
    def labels_note(self) -> str:
        """The full name of each set shown by a shorter label."""
        short = [f"{label} = {name}" for name, label in self.labels.items() if label != name]
        return f" OOD sets shown by their path's last part: {'; '.join(short)}." if short else ""

    def pct(self, name: str):
        return functools.partial(_fmt, scale=100, digits=2, latex=self.latex,
                                 runs=len(self.groups[name]))

    def main(self) -> list[str]:
        """Method | Acc | Conf.MP | <set> MP | <set> UM | ... (the paper's layout)."""
        if self.latex:   # the set names go into the multicolumn group row, as in the paper
            header = ["Method", "Acc", "Conf.MP"] + [label for _ in self.ood_names
                                                     for _, label in _PAPER_SCORES]
        else:            # markdown has no multi-row header: name the sets in the column titles
            header = ["Method", f"Acc ({self.id_name})", "Conf.MP"] + [
                f"{self.id_name}→{self.labels.get(o, o)} {label}" for o in self.ood_names
                for _, label in _PAPER_SCORES]
        rows = []
        for name, agg in self.aggregates.items():
            pct = self.pct(name)
            cells = [pct(_get(agg, ("id", "accuracy"))),
                     pct(_get(agg, ("id", "misclassification", "mp", "aupr")))]
            cells += [pct(_get(agg, ("ood", o, "detection", s, "aupr_in")))
                      for o in self.ood_names for s, _ in _PAPER_SCORES]
            rows.append([self.esc(name)] + cells)
        arrow = r"$\rightarrow$" if self.latex else "→"
        group_titles = [(f"{self.esc(self.id_name)} ID classification" if self.datasets_known
                         else "ID classification", 2)] + [
            (f"{self.esc(self.id_name)}{arrow}{self.set_label(o)}", 2) for o in self.ood_names]
        return [self.comment + f"Main table, mean ± sample std (ddof=1) over {self.seeds}; all "
                "values in %. Acc = top-1 accuracy. Conf.MP = misclassification detection "
                "(correct predictions positive). OOD columns: in-distribution positive. AUPR = "
                "average precision (step-wise, = sklearn average_precision_score). Scores higher "
                "= more confident: MP = max_k p_k (alpha_k/S for a Dirichlet); UM = the method's "
                "precision score" + self.um_note + "." + self.calibrated_note
                + self.labels_note,
                _render(header, rows, self.latex, group_titles if self.latex else None)]

    def methods(self) -> list[str]:
        """What each row ran, as its results record it (`Method.describe()`: the reading,
        protocol or source, and a Prior Network's OOD training data); nothing for results
        written before they recorded it."""
        described = {name: list(dict.fromkeys(str(r["method"]) for r in runs if r.get("method")))
                     for name, runs in self.groups.items() if name not in self.calibrated_rows}
        if not any(described.values()):
            return []
        lines = [f"{self.comment}Rows: what each method ran (as its runs' results record it)."]
        for name, texts in described.items():
            if texts:
                lines.append(f"{'% ' if self.latex else '- '}{self.esc(name)}: "
                             f"{self.esc('; '.join(texts))}")
        return ["\n".join(lines)]

    def calibration(self) -> list[str]:
        header = ["Method", "NLL", "Brier", "Brier-L2", "ECE", "ECE-over", "ECE-under",
                  "ECE-adaptive"]
        keys = ("nll", "brier", "brier_l2", "ece", "ece_overconfidence", "ece_underconfidence",
                "ece_adaptive")
        rows = [[self.esc(name)] + [_fmt(_get(agg, ("id", k)), 1, 4, self.latex,
                                         len(self.groups[name])) for k in keys]
                for name, agg in self.aggregates.items()]
        return [self.comment + f"Calibration on the {self.id_name} test set, mean ± sample std "
                f"(ddof=1) over {self.seeds}; fractions, lower is better. Brier = mean_i sum_k "
                "(p_ik - y_ik)^2 (standard); Brier-L2 = mean_i ||p_i - y_i||_2 (the I-EDL/R-EDL "
                "code's un-squared variant). ECE: 15 equal-width bins (lower, upper] on the max "
                "predictive probability, split into ECE-over + ECE-under = ECE, the part from the "
                "bins whose mean confidence is above (below) their accuracy; ECE-adaptive: 15 "
                "equal-mass bins. NLL: natural log.",
                _render(header, rows, self.latex)]

    def details(self) -> list[str]:
        header = ["Method", "Set", "Score", "AUPR-in", "AUPR-out", "AUROC", "FPR95"]
        rows = []
        dash = "--" if self.latex else "–"
        for name, agg in self.aggregates.items():
            pct, esc = self.pct(name), self.esc
            for s, label in _PAPER_SCORES:
                conf = ("id", "misclassification", s)
                rows.append([esc(name), "Conf.", label, pct(_get(agg, conf + ("aupr",))), dash,
                             pct(_get(agg, conf + ("auroc",))), dash])
            for o in self.ood_names:
                for s, label in _PAPER_SCORES:
                    rows.append([esc(name), self.set_label(o), label] + [
                        pct(_get(agg, ("ood", o, "detection", s, k)))
                        for k in ("aupr_in", "aupr_out", "auroc", "fpr95")])
        return [self.comment + f"Detection details, mean ± sample std (ddof=1) over "
                f"{self.seeds}; in %. Conf.: correct positive (AUPR-in column = AUPR). AUPR-in / "
                "AUROC: in-distribution positive; AUPR-out: OOD positive with the negated score; "
                "FPR95: fraction of OOD accepted at the first threshold keeping >= 95% of ID "
                "(lower is better).", _render(header, rows, self.latex)]


    def _has(self, *path: str) -> bool:
        return any(_get(agg, path) is not None or _node(agg, path) is not None
                   for agg in self.aggregates.values())

    def _score_labels(self, agg: Mapping[str, Any], section: Sequence[str]
                      ) -> list[tuple[str, str]]:
        node = _node(agg, section) or {}
        return [(s, label) for s, label in _PAPER_SCORES if s in node]

    def selective(self) -> list[str]:
        """Selective prediction of MP and UM on the test set (every score is in the JSON)."""
        if not self._has("id", "selective"):
            return []
        keys = [("aurc", "AURC"), ("e_aurc", "E-AURC"), ("augrc", "AUGRC"),
                ("risk_at_coverage_0.8", "Risk@80%"), ("risk_at_coverage_0.9", "Risk@90%"),
                ("risk_at_coverage_0.95", "Risk@95%"), ("coverage_at_risk_0.01", "Cov@1%"),
                ("coverage_at_risk_0.05", "Cov@5%")]
        rows = []
        for name, agg in self.aggregates.items():
            pct = self.pct(name)
            for s, label in self._score_labels(agg, ("id", "selective")):
                rows.append([self.esc(name), label] + [
                    pct(_get(agg, ("id", "selective", s, k))) for k, _ in keys])
        return [self.comment + f"Selective prediction on the {self.id_name} test set (abstain "
                f"on the least confident), mean ± sample std (ddof=1) over {self.seeds}; in %, "
                "lower is better except Cov. Risk = error rate among the accepted; ties "
                "accepted together; AURC / AUGRC = mean selective / generalized risk at "
                "coverages 1/N..N/N; E-AURC = AURC - oracle AURC; Risk@c: first point with "
                "coverage >= c; Cov@r: largest coverage with risk <= r.",
                _render([self.esc(h) for h in ["Method", "Score"] + [h for _, h in keys]], rows,
                        self.latex)]

    def posthoc_scores(self) -> list[str]:
        """The post-hoc OOD scores (results' "posthoc"): AUPR (in-distribution positive) and
        AUROC per OOD set, beside the method's own MP and UM rows of the main table."""
        names = [n for n in self.aggregates if _node(self.aggregates[n], ("posthoc",))]
        if not names:
            return []
        header = ["Method", "Score"] + [f"{self.set_label(o)} {what}" for o in self.ood_names
                                        for what in ("AUPR", "AUROC")]
        rows = []
        for name in names:
            agg, runs = self.aggregates[name], self.groups[name]
            pct = self.pct(name)
            own = [(s, label, ("ood",)) for s, label in _PAPER_SCORES]
            scores = next((r["posthoc"]["scores"] for r in runs if "posthoc" in r), [])
            extra = [(s, s, ("posthoc", "ood")) for s in scores]
            for s, label, root in own + extra:
                cells = [pct(_get(agg, (*root, o, "detection", s, k)))
                         for o in self.ood_names for k in ("aupr_in", "auroc")]
                if any(c not in ("–", "--") for c in cells):
                    rows.append([self.esc(name), self.esc(label)] + cells)
        return [self.comment + f"Post-hoc OOD scores of the network's logits and features "
                "(evaluation.posthoc: msp, max_logit, energy at T = 1, neg_entropy; "
                "neg_mahalanobis, neg_knn_distance (k = 50) and vim fitted on the training "
                "split) beside the method's own MP and UM, in-distribution positive; mean ± "
                f"sample std (ddof=1) over {self.seeds}; in %.",
                _render(header, rows, self.latex)]

    def scod(self) -> list[str]:
        """Selective prediction with each OOD set in the pool (SCOD), MP and UM."""
        if not any(_node(agg, ("ood", o, "scod")) is not None
                   for agg in self.aggregates.values() for o in self.ood_names):
            return []
        keys = [("aurc", "AURC"), ("e_aurc", "E-AURC"), ("risk_at_coverage_0.25", "Risk@25%"),
                ("risk_at_coverage_0.5", "Risk@50%"), ("coverage_at_risk_0.05", "Cov@5%")]
        rows = []
        for name, agg in self.aggregates.items():
            pct = self.pct(name)
            for o in self.ood_names:
                for s, label in self._score_labels(agg, ("ood", o, "scod")):
                    rows.append([self.esc(name), self.set_label(o), label] + [
                        pct(_get(agg, ("ood", o, "scod", s, k))) for k, _ in keys])
        if not rows:
            return []
        return [self.comment + f"Selective prediction with OOD inputs in the pool (SCOD): the "
                f"{self.id_name} test set plus one OOD set, ranked by the score; an accepted "
                f"OOD input counts as an error. Mean ± sample std (ddof=1) over {self.seeds}; "
                "in %, lower is better except Cov; definitions as in the selective table.",
                _render([self.esc(h) for h in ["Method", "OOD set", "Score"]
                         + [h for _, h in keys]], rows, self.latex)]

    def conformal(self) -> list[str]:
        """Conformal sets: coverage and mean set size of LAC, APS and RAPS."""
        if not self._has("conformal", "sets"):
            return []
        methods = (("lac", "LAC"), ("aps", "APS"), ("raps", "RAPS"))
        header = ["Method", "alpha"] + [f"{m} {what}" for _, m in methods
                                        for what in ("coverage (%)", "set size")]
        rows = []
        for name, agg in self.aggregates.items():
            fmt = functools.partial(_fmt, latex=self.latex, runs=len(self.groups[name]))
            cells = [fmt(_get(agg, ("conformal", "alpha")), 1, 3)]
            for m, _ in methods:
                cells += [fmt(_get(agg, ("conformal", "sets", m, "coverage")), 100, 2),
                          fmt(_get(agg, ("conformal", "sets", m, "mean_set_size")), 1, 3)]
            rows.append([self.esc(name)] + cells)
        return [self.comment + f"Conformal prediction sets on the {self.id_name} test set, "
                f"calibrated on the validation split, mean ± sample std (ddof=1) over "
                f"{self.seeds}. Target coverage >= 1 - alpha; set size = mean number of labels "
                "(smaller is better at the same coverage). LAC: E = 1 - p_y; APS (randomized): "
                "cumulative mass; RAPS: APS + 0.01 (rank - 1)^+.",
                _render([self.esc(h) for h in header], rows, self.latex)]

    def ood_groups(self) -> list[str]:
        """Near / far OOD: unweighted means over each group's sets (OpenOOD protocol)."""
        groups = [g for g in ("near", "far") if self._has("ood_groups", g)]
        if not groups:
            return []
        keys = (("aupr_in", "AUPR-in"), ("auroc", "AUROC"), ("fpr95", "FPR95"))
        header = ["Method", "Score"] + [f"{g.capitalize()} {h}" for g in groups for _, h in keys]
        rows = []
        for name, agg in self.aggregates.items():
            pct = self.pct(name)
            for s, label in _PAPER_SCORES:
                cells = [pct(_get(agg, ("ood_groups", g, "detection", s, k)))
                         for g in groups for k, _ in keys]
                if any(c not in ("–", "--") for c in cells):
                    rows.append([self.esc(name), label] + cells)
        members = {g: list(dict.fromkeys(n for runs in self.groups.values() for r in runs
                                         for n in ((r.get("ood_groups") or {}).get(g) or {})
                                         .get("sets", [])))
                   for g in groups}
        sets = "; ".join(f"{g}: {', '.join(self.labels.get(n, n) for n in members[g])}"
                         for g in groups)
        return [self.comment + f"Near / far OOD (OpenOOD protocol), unweighted mean over the "
                f"sets of each group ({self.esc(sets)}), mean ± sample std (ddof=1) over "
                f"{self.seeds}; in %. In-distribution positive; FPR95 lower is better.",
                _render(header, rows, self.latex)]

    def bootstrap(self) -> list[str]:
        """The bootstrap intervals (results' "bootstrap") of the methods with one run each:
        value [low, high] at the run's confidence; a calibrated row's from its results'
        "calibrated" section. Over several seeds each run's intervals stay in its
        eval_results.json (their mean is no interval)."""
        single = {}
        for name, runs in self.groups.items():
            if len(runs) != 1:
                continue
            run = runs[0]["calibrated"] if name in self.calibrated_rows else runs[0]
            if isinstance(run.get("bootstrap"), Mapping):
                single[name] = run
        if not single:
            return []
        dash = "--" if self.latex else "–"

        def cell(value, bounds, scale):
            if value is None or not isinstance(bounds, Mapping) or bounds.get("low") is None:
                return dash
            digits = 2 if scale == 100 else 4
            return (f"{value * scale:.{digits}f} [{bounds['low'] * scale:.{digits}f}, "
                    f"{bounds['high'] * scale:.{digits}f}]")

        id_keys = (("accuracy", "Acc", 100), ("nll", "NLL", 1), ("brier", "Brier", 1),
                   ("ece", "ECE", 1), ("ece_overconfidence", "ECE-over", 1),
                   ("ece_underconfidence", "ECE-under", 1),
                   ("ece_classwise", "Classwise-ECE", 1))
        id_rows, rows = [], []
        for name, run in single.items():
            boot, esc = run["bootstrap"], self.esc
            id_rows.append([esc(name)] + [cell(_node(run, ("id", k)), _node(boot, ("id", k)),
                                               scale) for k, _, scale in id_keys])
            # the method's own MP and UM, then the post-hoc scores with intervals: (score,
            # label, its values, their intervals, the misclassification path in both)
            scored = [(s, label, run, boot, ("id", "misclassification"))
                      for s, label in _PAPER_SCORES]
            post = _node(run, ("posthoc",)) if name not in self.calibrated_rows else None
            if post is not None and isinstance(post.get("bootstrap"), Mapping):
                scored += [(s, s, post, post["bootstrap"], ("misclassification",))
                           for s in post["scores"]]
            for s, label, values, bounds, conf in scored:
                if _node(values, conf + (s,)) is not None:
                    rows.append([esc(name), "Conf.", esc(label)] + [
                        cell(_node(values, conf + (s, k)), _node(bounds, conf + (s, k)), 100)
                        if k else dash for k in ("aupr", None, "auroc", None)])
            for o in self.ood_names:
                for s, label, values, bounds, _ in scored:
                    path = ("ood", o, "detection", s)
                    if _node(values, path) is not None:
                        rows.append([esc(name), self.set_label(o), esc(label)] + [
                            cell(_node(values, path + (k,)), _node(bounds, ("ood", o, s, k)),
                                 100) for k in ("aupr_in", "aupr_out", "auroc", "fpr95")])
        settings = {(r["bootstrap"]["settings"]["samples"],
                     r["bootstrap"]["settings"]["confidence"],
                     r["bootstrap"]["settings"].get("method", "percentile"))
                    for r in single.values()}
        level = "; ".join(f"{c:.0%} over {b:,} replicates, {m} method"
                          for b, c, m in sorted(settings))
        note = (f"Bootstrap intervals of each single run ({level}): the test "
                f"examples and, independently, each OOD set's examples drawn with replacement; "
                f"value [low, high]")
        return [self.comment + note + ". Acc in %, NLL, Brier and the ECEs (15 equal-width "
                "bins; ECE-over + ECE-under = ECE; Classwise-ECE: every class's probability) "
                "as fractions; a dash where the results hold no interval (written before "
                "them).",
                _render([self.esc(h) for h in ["Method"] + [label for _, label, _ in id_keys]],
                        id_rows, self.latex),
                self.comment + note + "; in %. Scores by name (energy, ...): the post-hoc "
                "OOD scores, on the same draws as MP and UM. Conf.: correct positive; AUPR-in "
                "/ AUROC: in-distribution positive; AUPR-out: OOD positive; FPR95 lower is "
                "better.",
                _render([self.esc(h) for h in ["Method", "Set", "Score", "AUPR-in", "AUPR-out",
                                               "AUROC", "FPR95"]], rows, self.latex)]

    def trapezoidal(self) -> list[str]:
        """OpenOOD's trapezoidal AUPR, only where the results hold it (aupr_trapezoidal=True)."""
        present = any(_get(agg, ("ood", o, "detection", s, "aupr_in_trapezoidal")) is not None
                      for agg in self.aggregates.values() for o in self.ood_names
                      for s, _ in _PAPER_SCORES)
        if not present:
            return []
        header = ["Method", "Set", "Score", f"AUPR-in, {AUPR_TRAPEZOIDAL_HEADER}",
                  f"AUPR-out, {AUPR_TRAPEZOIDAL_HEADER}"]
        header = [self.esc(h) for h in header]
        rows = []
        for name, agg in self.aggregates.items():
            pct = self.pct(name)
            for o in self.ood_names:
                for s, label in _PAPER_SCORES:
                    cells = [pct(_get(agg, ("ood", o, "detection", s, k)))
                             for k in ("aupr_in_trapezoidal", "aupr_out_trapezoidal")]
                    rows.append([self.esc(name), self.set_label(o), label] + cells)
        return [self.comment + f"{AUPR_TRAPEZOIDAL_HEADER}: sklearn.metrics.auc(recall, "
                "precision) through precision_recall_curve's points, as OpenOOD v1.5 computes "
                "it (the other tables' AUPR is average precision); mean ± sample std (ddof=1) "
                f"over {self.seeds}; in %.", _render(header, rows, self.latex)]

    def posthoc(self) -> list[str]:
        """Post-hoc calibration: fitted value, NLL / ECE / Brier before and after on the test
        set, and the scores whose OOD ranking changed."""
        names = [n for n in self.aggregates if n not in self.calibrated_rows
                 and _node(self.aggregates[n], ("posthoc_calibration",)) is not None]
        if not names:
            return []
        header = ["Method", "Calibrator", "Fitted", "NLL before", "NLL after", "ECE before",
                  "ECE after", "Brier before", "Brier after", "OOD ranking changed"]
        rows = []
        for name in names:
            agg, runs = self.aggregates[name], self.groups[name]
            fmt = functools.partial(_fmt, latex=self.latex, runs=len(runs))
            fits = [r["posthoc_calibration"]["fit"] for r in runs if "posthoc_calibration" in r]
            kind = "/".join(dict.fromkeys(str(f.get("calibrator")) for f in fits))
            param = "temperature" if "temperature" in kind else "scale"
            changed = sorted({s for r in runs for s in
                              r.get("posthoc_calibration", {}).get("ood_ranking_changed", [])})
            cells = [self.esc(kind), f"{param} " + fmt(_get(agg, ("posthoc_calibration", "fit",
                                                                  param)), 1, 4)]
            for k in ("nll", "ece", "brier"):
                cells += [fmt(_get(agg, ("posthoc_calibration", "test", when, k)), 1, 4)
                          for when in ("before", "after")]
            cells.append(self.esc(", ".join(changed) or "none"))
            rows.append([self.esc(name)] + cells)
        return [self.comment + f"Post-hoc calibration fitted on the validation split (never the "
                f"test set); {self.id_name} test set before / after, mean ± sample std (ddof=1) "
                f"over {self.seeds}; fractions. temperature: p = softmax(log p / T); "
                "evidence_scale: alpha = s e + W a (keeps the UM ranking). Last column: the "
                "scores whose pooled ID+OOD ranking changed on some set (any seed).",
                _render(header, rows, self.latex)]


    def calibrators(self) -> list[str]:
        """The calibrators side by side (results' "calibrators"): NLL, ECE, SmoothECE and Brier
        on the test set before and after each, and whether it kept the predicted classes and
        the max-probability ranking in every seed."""
        names = [n for n in self.aggregates if n not in self.calibrated_rows
                 and _node(self.aggregates[n], ("calibrators",)) is not None]
        if not names:
            return []
        metrics_ = ("nll", "ece", "smooth_ece", "ece_classwise", "brier")
        header = ["Method", "Calibrator", "NLL", "ECE", "SmoothECE", "Classwise-ECE", "Brier",
                  "Keeps class", "Keeps MP ranking"]
        rows = []
        for name in names:
            agg, runs = self.aggregates[name], self.groups[name]
            fmt = functools.partial(_fmt, latex=self.latex, runs=len(runs))
            rows.append([self.esc(name), "none"]
                        + [fmt(_get(agg, ("calibrators", "before", k)), 1, 4) for k in metrics_]
                        + ["–", "–"])
            fitted = _node(self.aggregates[name], ("calibrators", "after")) or {}
            for calibrator in fitted:
                flags = [[r["calibrators"]["after"][calibrator].get(k) for r in runs
                          if calibrator in r.get("calibrators", {}).get("after", {})]
                         for k in ("keeps_predicted_class", "keeps_mp_ranking")]
                rows.append(
                    [self.esc(name), self.esc(calibrator)]
                    + [fmt(_get(agg, ("calibrators", "after", calibrator, k)), 1, 4)
                       for k in metrics_]
                    + [("yes" if all(f) else "no" if not any(f) else "some seeds")
                       for f in flags])
        return [self.comment + f"Calibrators fitted on the validation split's log predictive "
                f"probabilities (never the test set), {self.id_name} test set; mean ± sample "
                f"std (ddof=1) over {self.seeds}; fractions. SmoothECE: kernel-smoothed "
                "top-label ECE at its own bandwidth (Blasiok & Nakkiran 2023). Classwise-ECE: "
                "the mean over classes of each class probability's 15-bin ECE (Kull et al. "
                "2019). Keeps class / MP "
                "ranking: every test example's predicted class, and the order of the examples "
                "by max probability (what MP detection and selective prediction read).",
                _render(header, rows, self.latex)]


def _node(tree: Mapping[str, Any], path: Sequence[str]) -> Any:
    node: Any = tree
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


# ------------------------------------------------------------------------------------------------
# Runs on disk (bin/report.py)
# ------------------------------------------------------------------------------------------------
_SEED_DIR = re.compile(r"(seed|run|s)[_-]?\d+", re.IGNORECASE)
_SEED_SUFFIX = re.compile(r"[_-](seed|run|s)[_-]?\d+$", re.IGNORECASE)


def _variant_from_path(path: Path, root: Path) -> str:
    """Folder-derived method name: the parent folder, minus a seed suffix ("gedl_seed3" ->
    "gedl"); a parent that is only a seed ("seed3", "run_1") names the grandparent instead."""
    folder = path.parent
    if _SEED_DIR.fullmatch(folder.name) and folder != root:
        folder = folder.parent
    return _SEED_SUFFIX.sub("", folder.name) or folder.name


def load_runs(runs_dir: str | Path) -> dict[str | None, dict[str, list[dict[str, Any]]]]:
    """Finds every ``eval_results.json`` under runs_dir and groups them.

    Returns {dataset: {method: [results]}}: dataset from the JSON's "dataset" key (None if
    absent); method from its "variant" key, else its "name" key, else the folder
    (``_variant_from_path``). Files and groups are in sorted path order.
    """
    root = Path(runs_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a directory.")
    grouped: dict[str | None, dict[str, list[dict[str, Any]]]] = {}
    for path in sorted(root.rglob(RESULTS_FILENAME)):
        try:
            with open(path) as f:
                result = json.load(f)
        except (OSError, ValueError) as e:
            raise ValueError(f"{path} cannot be read ({type(e).__name__}: {e}): evaluate that "
                             f"run again (python -m gedl_jax.evaluate --workdir=...) or move "
                             f"the file away") from None
        if not isinstance(result, dict) or "id" not in result:
            raise ValueError(f"{path} is not an evaluate_outputs result (no 'id' entry).")
        method = str(result.get("variant") or result.get("name")
                     or _variant_from_path(path, root))
        grouped.setdefault(result.get("dataset"), {}).setdefault(method, []).append(result)
    return grouped


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (bin/report.py): bad input is one `error:` line and exit 2
    (gedl_jax.cli)."""
    from gedl_jax import cli

    parser = cli.ArgumentParser(
        description="Paper-style table (mean ± std over seeds) of every eval_results.json under "
                    "RUNS_DIR, grouped by dataset and method.")
    parser.add_argument("runs_dir", help="folder searched recursively for eval_results.json")
    parser.add_argument("--latex", action="store_true", help="LaTeX (booktabs) instead of markdown")
    parser.add_argument("--out", help="also write the tables to this file")
    parser.add_argument("--json", help="write the aggregated numbers {dataset: {method: ...}}")
    parser.add_argument("--ood", help="comma-separated OOD sets and their order (default: all)")
    parser.add_argument("--no-extra", action="store_true",
                        help="only the main table (no calibration / detection-detail tables)")
    return cli.run_argparse(parser, _main, argv)


def _main(args: Any) -> int:
    grouped = load_runs(args.runs_dir)
    if not grouped:
        raise FileNotFoundError(f"no {RESULTS_FILENAME} under {args.runs_dir}: give the folder "
                                f"of evaluated runs (python -m gedl_jax.evaluate writes it)")
    ood_names = args.ood.split(",") if args.ood else None
    texts, aggregated = [], {}
    for dataset, methods in grouped.items():
        for method, runs in methods.items():
            seeds = [r["seed"] for r in runs if "seed" in r]
            if len(seeds) != len(set(map(str, seeds))):
                print(f"warning: {method}: duplicate seeds {seeds}", file=sys.stderr)
        title = dataset or "results"
        heading = (f"% ---- {title} ----" if args.latex else f"## {title}")
        texts.append(heading + "\n\n" + results_table(
            methods, fmt="latex" if args.latex else "markdown", ood_names=ood_names,
            extra=not args.no_extra))
        aggregated[str(title)] = {m: aggregate(runs) for m, runs in methods.items()}
    text = "\n".join(texts)
    print(text, end="")
    if args.out:
        files.write_text(args.out, text)
    if args.json:
        files.write_text(args.json, json.dumps(aggregated, indent=2))
    return 0
