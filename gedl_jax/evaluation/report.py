"""Paper-style tables (markdown or LaTeX) of ``evaluate_outputs`` results over seeds, and the runs
on disk they are made from.

``results_table`` prints the sections of ``gedl_jax.evaluation.tables``, in its ``SECTIONS``
order: the paper's main-table layout (Acc, Conf.MP, then MP and UM per OOD set: AUPR in %, mean ±
std), a calibration table (NLL, Brier, ECE as fractions, as in the paper's calibration table), a
detection-detail table (AUPR-in/out, AUROC, FPR95), then each section the results hold beyond
the paper. ``aggregate`` (``gedl_jax.evaluation.aggregation``) gives the mean and spread they
print. ``load_runs`` backs ``bin/report.py`` (its command line: ``gedl_jax.commands.report``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gedl_jax.evaluation import tables
from gedl_jax.evaluation.aggregation import aggregate
from gedl_jax.evaluation.tables.context import PAPER_SCORES, set_labels, stat_at

__all__ = ["aggregate", "main_table_values", "results_table", "load_runs", "RESULTS_FILENAME",
           "set_labels"]

RESULTS_FILENAME = "eval_results.json"


# ------------------------------------------------------------------------------------------------
# Tables
# ------------------------------------------------------------------------------------------------
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
              for o in ood_names for s, label in PAPER_SCORES]
    values = {}
    for name, runs in groups.items():
        agg = aggregate(runs)
        row = []
        for _, path in paths:
            stat = stat_at(agg, path)
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
    parts = tables.render_sections(_as_groups(results), fmt == "latex", ood_names, extra)
    return "\n\n".join(parts) + "\n"


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
