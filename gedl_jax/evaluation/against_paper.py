"""Our runs beside the paper's tables, column by column (`gedl_jax.paper`).

The main table has the paper's six columns (accuracy, Conf.MP and the MP and UM AUPR of its two
OOD sets), then an MP and a UM column for every other OOD set our runs evaluated (e.g. the
far-OOD sets derived from MNIST for CIFAR-10): a set the paper did not use is never put under
the paper's column name. A paper column whose set no run evaluated says "not measured" in our
rows, and a line under the table names the sets. Our rows are means ± sample std over their
seeds (the std from 2 seeds on), in %; the paper's rows ("paper: <method>") are its means ± its
printed std. The calibration table (CIFAR-10 only: the paper's Table calibration_cifar10) sets
our ECE (15 equal-width bins) and Brier beside the paper's, as fractions.

>>> run = {"id": {"accuracy": 0.9, "misclassification": {"mp": {"aupr": 0.98}},
...               "ece": 0.43, "brier": 0.38},
...        "ood": {"mnist_rgb32": {"detection": {"mp": {"aupr_in": 0.86},
...                                              "um": {"aupr_in": 0.44}}}}}
>>> row = main_table("cifar10", {"gedl": [run]}).splitlines()[2]
>>> row.split(" | ")[:3], row.split(" | ")[3:7] == ["not measured"] * 4, row.split(" | ")[7:]
(['| gedl (1 seed)', '90.00', '98.00'], True, ['86.00', '44.00 |'])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gedl_jax.evaluation.aggregation import aggregate
from gedl_jax.paper import CALIBRATION, CALIBRATION_STD, PAPER, PAPER_STD

# The OOD set behind each of the paper's OOD column prefixes ("SVHN MP" -> svhn_cropped).
PAPER_OOD_SETS: dict[str, dict[str, str]] = {
    "mnist": {"KMNIST": "kmnist", "FMNIST": "fashion_mnist"},
    "cifar10": {"SVHN": "svhn_cropped", "CIFAR-100": "cifar100"},
}
_ID_PATHS = {"Acc": ("id", "accuracy"), "Conf.MP": ("id", "misclassification", "mp", "aupr")}
_SCORES = {"MP": "mp", "UM": "um"}
Results = Mapping[str, Sequence[Mapping[str, Any]]]   # row name -> its seeds' eval_results


def _node(tree: Any, path: Sequence[str]) -> Any:
    for key in path:
        if not isinstance(tree, Mapping) or key not in tree:
            return None
        tree = tree[key]
    return tree


def _cell(stat: Any, scale: float, digits: int) -> str:
    if not isinstance(stat, Mapping) or stat.get("mean") is None:
        return "–"
    text = f"{stat['mean'] * scale:.{digits}f}"
    return text + (f" ± {stat['std'] * scale:.{digits}f}" if stat.get("std") is not None else "")


def _paper_cell(mean: float | None, std: float | None, digits: int) -> str:
    if mean is None:
        return "–"
    return f"{mean:.{digits}f}" + ("" if std is None else f" ± {std:.{digits}f}")


def evaluated_sets(grouped: Results) -> list[str]:
    """Every OOD set some run evaluated, in the order the runs list them."""
    return list(dict.fromkeys(name for runs in grouped.values() for run in runs
                              for name in run.get("ood", {})))


def missing_paper_sets(dataset: str, grouped: Results) -> list[tuple[str, str]]:
    """(column prefix, set) of the paper's OOD sets that no run evaluated."""
    seen = set(evaluated_sets(grouped))
    return [(label, name) for label, name in PAPER_OOD_SETS.get(dataset, {}).items()
            if name not in seen]


def _row_label(name: str, runs: Sequence[Any]) -> str:
    return f"{name} ({len(runs)} seed{'s' * (len(runs) != 1)})"


def main_table(dataset: str, grouped: Results) -> str:
    """The markdown main table: our rows, then the paper's rows of the same methods."""
    paper = PAPER.get(dataset, {})
    paper_sets = PAPER_OOD_SETS.get(dataset, {})
    extra = [s for s in evaluated_sets(grouped) if s not in paper_sets.values()]
    columns = ["Acc", "Conf.MP"] + [f"{label} {score}" for label in paper_sets
                                    for score in _SCORES] \
        + [f"{name} {score}" for name in extra for score in _SCORES]
    missing = {name for _, name in missing_paper_sets(dataset, grouped)}
    lines = ["| Method | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    for name, runs in grouped.items():
        stats = aggregate(runs)
        cells = [_cell(_node(stats, _ID_PATHS[c]), 100, 2) for c in ("Acc", "Conf.MP")]
        for ood in [*paper_sets.values(), *extra]:
            for score in _SCORES.values():
                cells.append("not measured" if ood in missing else _cell(
                    _node(stats, ("ood", ood, "detection", score, "aupr_in")), 100, 2))
        lines.append(f"| {_row_label(name, runs)} | " + " | ".join(cells) + " |")
    stds = PAPER_STD.get(dataset, {})
    for name in grouped:
        if name in paper and name != "columns":
            cells = [_paper_cell(m, s, 2) for m, s in
                     zip(paper[name], stds.get(name, [None] * len(paper[name])))]
            cells += ["–"] * (len(columns) - len(cells))   # sets the paper did not use
            lines.append(f"| paper: {name} | " + " | ".join(cells) + " |")
    if missing:
        labels = [label for label, name in missing_paper_sets(dataset, grouped)]
        lines += ["", f"not measured: {' / '.join(labels)} not available to these runs "
                      f"({', '.join(sorted(missing))}); the columns after the paper's are "
                      f"other OOD sets, which the paper did not use."]
    return "\n".join(lines)


def calibration_table(dataset: str, grouped: Results) -> str:
    """The markdown calibration table (ECE, Brier) beside the paper's; "" where the paper has
    none for `dataset`."""
    paper = CALIBRATION.get(dataset)
    if not paper:
        return ""
    lines = ["| Method | ECE | Brier |", "|---|---:|---:|"]
    for name, runs in grouped.items():
        stats = aggregate(runs)
        lines.append(f"| {_row_label(name, runs)} | {_cell(_node(stats, ('id', 'ece')), 1, 4)} "
                     f"| {_cell(_node(stats, ('id', 'brier')), 1, 4)} |")
    stds = CALIBRATION_STD.get(dataset, {})
    for name in grouped:
        if name in paper:
            cells = [_paper_cell(m, s, 4) for m, s in
                     zip(paper[name], stds.get(name, [None, None]))]
            lines.append(f"| paper: {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
