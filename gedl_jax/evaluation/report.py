"""Multi-seed aggregation and paper-style tables (markdown or LaTeX) of ``evaluate_outputs`` output.

``aggregate(results)`` turns a list of result dicts (one per seed) into the same tree with every
number replaced by ``{"mean", "std", "n"}`` (std = sample std, ddof=1; None for a single run).
``results_table`` prints the paper's main-table layout (Acc, Conf.MP, then MP and UM per OOD set:
AUPR in %, mean ± std) followed by a calibration table (NLL, Brier, ECE as fractions, as in the
paper's calibration table) and a detection-detail table (AUPR-in/out, AUROC, FPR95).
``load_runs`` and ``main`` back ``bin/report.py``.
"""

from __future__ import annotations

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
    return "\n\n".join(parts) + "\n"


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

    @classmethod
    def build(cls, groups, latex: bool, ood_names) -> _Tables:
        if ood_names is None:
            ood_names = list(dict.fromkeys(k for runs in groups.values() for r in runs
                                           for k in (r.get("ood") or {})))
        datasets = {r.get("dataset") for runs in groups.values() for r in runs} - {None}
        known = len(datasets) == 1
        return cls(groups, {name: aggregate(runs) for name, runs in groups.items()}, latex,
                   list(ood_names), datasets.pop() if known else "ID", known,
                   _seed_phrase({name: len(runs) for name, runs in groups.items()}))

    @property
    def comment(self) -> str:
        return "% " if self.latex else "> "

    def esc(self, text: str) -> str:
        return _latex_escape(text) if self.latex else str(text)

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
                f"{self.id_name}→{o} {label}" for o in self.ood_names
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
            (f"{self.esc(self.id_name)}{arrow}{self.esc(o)}", 2) for o in self.ood_names]
        return [self.comment + f"Main table, mean ± sample std (ddof=1) over {self.seeds}; all "
                "values in %. Acc = top-1 accuracy. Conf.MP = misclassification detection "
                "(correct predictions positive). OOD columns: in-distribution positive. AUPR = "
                "average precision (step-wise, = sklearn average_precision_score). Scores higher "
                "= more confident: MP = max_k p_k (alpha_k/S for a Dirichlet); UM = the method's "
                "precision score: -u = -W/S for the EDL family, log alpha_0 for KL-PN, RKL-PN, "
                "PostNet and DAEDL (a constant W: ranks as -W/S), log(alpha_0 + tau) for F-EDL; "
                "– for a method without one (MC Dropout, DUQ, ensembles).",
                _render(header, rows, self.latex, group_titles if self.latex else None)]

    def methods(self) -> list[str]:
        """What each row ran, as its results record it (`Method.describe()`: the reading,
        protocol or source, and a Prior Network's OOD training data); nothing for results
        written before they recorded it."""
        described = {name: list(dict.fromkeys(str(r["method"]) for r in runs if r.get("method")))
                     for name, runs in self.groups.items()}
        if not any(described.values()):
            return []
        lines = [f"{self.comment}Rows: what each method ran (as its runs' results record it)."]
        for name, texts in described.items():
            if texts:
                lines.append(f"{'% ' if self.latex else '- '}{self.esc(name)}: "
                             f"{self.esc('; '.join(texts))}")
        return ["\n".join(lines)]

    def calibration(self) -> list[str]:
        header = ["Method", "NLL", "Brier", "Brier-L2", "ECE", "ECE-adaptive"]
        keys = ("nll", "brier", "brier_l2", "ece", "ece_adaptive")
        rows = [[self.esc(name)] + [_fmt(_get(agg, ("id", k)), 1, 4, self.latex,
                                         len(self.groups[name])) for k in keys]
                for name, agg in self.aggregates.items()]
        return [self.comment + f"Calibration on the {self.id_name} test set, mean ± sample std "
                f"(ddof=1) over {self.seeds}; fractions, lower is better. Brier = mean_i sum_k "
                "(p_ik - y_ik)^2 (standard); Brier-L2 = mean_i ||p_i - y_i||_2 (the I-EDL/R-EDL "
                "code's un-squared variant). ECE: 15 equal-width bins (lower, upper] on the max "
                "predictive probability; ECE-adaptive: 15 equal-mass bins. NLL: natural log.",
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
                    rows.append([esc(name), esc(o), label] + [
                        pct(_get(agg, ("ood", o, "detection", s, k)))
                        for k in ("aupr_in", "aupr_out", "auroc", "fpr95")])
        return [self.comment + f"Detection details, mean ± sample std (ddof=1) over "
                f"{self.seeds}; in %. Conf.: correct positive (AUPR-in column = AUPR). AUPR-in / "
                "AUROC: in-distribution positive; AUPR-out: OOD positive with the negated score; "
                "FPR95: fraction of OOD accepted at the first threshold keeping >= 95% of ID "
                "(lower is better).", _render(header, rows, self.latex)]


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
    from gedl_jax import cli  # noqa: PLC0415

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
