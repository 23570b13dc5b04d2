"""What every table section reads: the rows (methods, and their calibrated twins) with their
aggregated results, and how a cell, a header line and a table are written in markdown or LaTeX.

>>> set_labels(["kmnist", "images:/data/ood/textures/", "npz:/a/x.npz", "npz:/b/x.npz"])
{'kmnist': 'kmnist', 'images:/data/ood/textures/': 'images:textures', \
'npz:/a/x.npz': 'npz:/a/x.npz', 'npz:/b/x.npz': 'npz:/b/x.npz'}
>>> mean_std({"mean": 0.5, "std": 0.01, "n": 2}, 100, 2, latex=False, runs=3)
'50.00 ± 1.00 (n=2)'
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any

from gedl_jax.evaluation.aggregation import aggregate

__all__ = ["PAPER_SCORES", "Context", "latex_escape", "mean_std", "node_at", "render",
           "set_labels", "stat_at"]

# The paper's two scores: (results key, column label).
PAPER_SCORES = (("mp", "MP"), ("um", "UM"))


# ------------------------------------------------------------------------------ cells and tables
def node_at(tree: Mapping[str, Any], path: Sequence[str]) -> Any:
    """What `tree` holds at `path`, or None."""
    node: Any = tree
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


def stat_at(tree: Mapping[str, Any], path: Sequence[str]) -> dict[str, Any] | None:
    """The aggregated number ({"mean", "std", "n"}) at `path`, or None."""
    node = node_at(tree, path)
    return node if isinstance(node, Mapping) and "mean" in node else None


def mean_std(stat: Mapping[str, Any] | None, scale: float, digits: int, latex: bool,
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


def latex_escape(text: str) -> str:
    return re.sub(r"([_&%#$])", r"\\\1", str(text))


def render(header: list[str], rows: list[list[str]], latex: bool,
           groups: list[tuple[str, int]] | None = None) -> str:
    """A markdown table, or a booktabs tabular (with a multicolumn row of `groups`: (title,
    columns spanned))."""
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


def set_labels(names: Sequence[str]) -> dict[str, str]:
    """The tables' label of each OOD set in `names`: a set named by an absolute or home path
    (`images:/data/ood/textures`, `npz:~/sets/c100.npz`, an IDX folder) by its prefix and the
    path's last part (`images:textures`), where no other set of `names` gets that label; every
    other name as it is. The results files keep the full names."""
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


# ------------------------------------------------------------------------------------- the rows
def _seed_phrase(counts: dict[str, int]) -> str:
    values = set(counts.values())
    if len(values) == 1:
        n = values.pop()
        return f"{n} seed{'s' if n != 1 else ''}"
    return "seeds per method: " + ", ".join(f"{k} {v}" for k, v in counts.items())


def _calibrated_label(name: str, runs: Sequence[Mapping[str, Any]]) -> str | None:
    """The row name of a method's calibrated predictions ("gedl (calibrated: evidence_scale)"),
    or None where its results have none (calibrate=False)."""
    fits = [r["posthoc_calibration"]["fit"].get("calibrator") for r in runs
            if isinstance(r.get("posthoc_calibration"), Mapping)
            and isinstance(r.get("calibrated"), Mapping)]
    if not fits:
        return None
    return f"{name} (calibrated: {'/'.join(dict.fromkeys(str(f) for f in fits))})"


@dataclasses.dataclass(frozen=True)
class Context:
    """The aggregated rows of `results_table` and how to print them: every section reads
    this."""

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
    def build(cls, groups: Mapping[str, list], latex: bool,
              ood_names: Sequence[str] | None) -> Context:
        """The rows of {method: [results of its seeds]}: each method, then (calibrate=True) its
        calibrated predictions' row."""
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
    def labels_note(self) -> str:
        """The full name of each set shown by a shorter label."""
        short = [f"{label} = {name}" for name, label in self.labels.items() if label != name]
        return f" OOD sets shown by their path's last part: {'; '.join(short)}." if short else ""

    @property
    def comment(self) -> str:
        """How a header line above a table starts."""
        return "% " if self.latex else "> "

    @property
    def dash(self) -> str:
        """The cell of a value the results do not hold."""
        return "--" if self.latex else "–"

    def esc(self, text: str) -> str:
        return latex_escape(text) if self.latex else str(text)

    def set_label(self, name: str) -> str:
        """OOD set `name` as the tables show it (`set_labels`), escaped."""
        return self.esc(self.labels.get(name, name))

    def pct(self, name: str):
        """Row `name`'s cell writer of a fraction, in % (`mean_std`)."""
        return functools.partial(mean_std, scale=100, digits=2, latex=self.latex,
                                 runs=len(self.groups[name]))

    def fmt(self, name: str):
        """Row `name`'s cell writer at a given scale and number of digits (`mean_std`)."""
        return functools.partial(mean_std, latex=self.latex, runs=len(self.groups[name]))

    def has(self, *path: str) -> bool:
        """Whether any row's results hold `path`."""
        return any(node_at(agg, path) is not None for agg in self.aggregates.values())

    def score_labels(self, agg: Mapping[str, Any], section: Sequence[str]
                     ) -> list[tuple[str, str]]:
        """The paper's scores (MP, UM) that `agg` holds under `section`."""
        node = node_at(agg, section) or {}
        return [(s, label) for s, label in PAPER_SCORES if s in node]
