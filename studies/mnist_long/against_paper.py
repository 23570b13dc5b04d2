"""The long table's rows against the paper's copied rows, column by column.

Reads the committed per-seed evaluations (`runs/<row>_seed<s>/eval_results.json` beside this
script, or the folder given), takes each row's mean over its seeds of the six columns of the
paper's MNIST table (in %, printed to 2 decimals as in `results.md`), and prints the difference
from the paper's row (`gedl_jax.paper.PAPER`) for every column both have, and the columns
where the row is below the paper's. The difference is taken between the printed numbers, so
that subtracting the two tables' numbers gives it to the digit.

    python studies/mnist_long/against_paper.py [RUNS_FOLDER]
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import statistics
import sys

from gedl_jax.paper import PAPER

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
COLUMNS = ("Acc", "Conf.MP", "KMNIST MP", "KMNIST UM", "FMNIST MP", "FMNIST UM")
PATHS = (("id", "accuracy"), ("id", "misclassification", "mp", "aupr"),
         ("ood", "kmnist", "detection", "mp", "aupr_in"),
         ("ood", "kmnist", "detection", "um", "aupr_in"),
         ("ood", "fashion_mnist", "detection", "mp", "aupr_in"),
         ("ood", "fashion_mnist", "detection", "um", "aupr_in"))


def paper_rows() -> dict[str, list[float | None]]:
    return {k: v for k, v in PAPER["mnist"].items() if k != "columns"}


def headline(result: dict) -> list[float | None]:
    """The six columns of one evaluation, in % (None where the method has no such score)."""
    values = []
    for path in PATHS:
        node = result
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        values.append(None if node is None else 100 * float(node))
    return values


def row_means(runs: pathlib.Path) -> dict[str, tuple[int, list[float | None]]]:
    """{row: (number of seeds, [mean over seeds of each column, rounded to 2 decimals])}."""
    by_row = collections.defaultdict(list)
    for path in sorted(runs.glob("*_seed*/eval_results.json")):
        row = path.parent.name.rsplit("_seed", 1)[0]
        by_row[row].append(headline(json.loads(path.read_text())))
    means = {}
    for row, seeds in by_row.items():
        columns = zip(*seeds)
        means[row] = (len(seeds), [None if None in c else round(statistics.mean(c), 2)
                                   for c in columns])
    return means


def compare(runs: pathlib.Path) -> list[tuple[str, int, list[float | None], list[str]]]:
    """[(row, seeds, [ours - paper per column, None where either lacks it], [columns below])]
    for every row the paper has, in the order of the paper's table."""
    paper = paper_rows()
    means = row_means(runs)
    rows = []
    for row, theirs in paper.items():
        if row not in means:
            continue
        seeds, ours = means[row]
        diffs = [None if o is None or p is None else round(o - p, 2) + 0.0
                 for o, p in zip(ours, theirs)]
        below = [c for c, d in zip(COLUMNS, diffs) if d is not None and d < 0]
        rows.append((row, seeds, diffs, below))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=pathlib.Path, nargs="?",
                        default=REPO / "docs" / "results" / "mnist_long" / "runs",
                        help="folder of <row>_seed<s>/eval_results.json (default: "
                             "docs/results/mnist_long/runs)")
    args = parser.parse_args(argv)
    if not any(args.runs.glob("*_seed*/eval_results.json")):
        print(f"error: no <row>_seed<s>/eval_results.json under {args.runs}", file=sys.stderr)
        return 2
    print("| row | seeds | " + " | ".join(COLUMNS) + " | below the paper's row on |")
    print("|---|---:|" + "---:|" * len(COLUMNS) + "---|")
    for row, seeds, diffs, below in compare(args.runs):
        cells = ["–" if d is None else f"{d:+.2f}" for d in diffs]
        print(f"| {row} | {seeds} | " + " | ".join(cells)
              + f" | {', '.join(below) if below else 'none'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
