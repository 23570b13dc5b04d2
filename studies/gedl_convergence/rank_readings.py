"""Rank the readings of GEDL's KL weight by their distance to the paper's MNIST row.

Reads the 3-seed table that `bin/reproduce.py --study=readings` wrote (its results.json) and
prints, for each reading, the six headline numbers (mean over seeds, in %), the mean absolute
difference from the paper's GEDL row over those six numbers, and the largest shortfall (the
column furthest below the paper). The paper's row is `gedl_jax.paper.PAPER`, so the
numbers compared are the ones every table prints beside ours.

    python studies/gedl_convergence/rank_readings.py OUT/results.json

(OUT: the --out folder of `bin/reproduce.py --study=readings --seeds=0,1,2`.)

Which readings fit the paper's text is a reading of words, not a number; the README next to
this script says which and why, and uses this ranking only to choose between readings that fit.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from gedl_jax.paper import PAPER

COLUMNS = ("Acc", "Conf.MP", "KMNIST MP", "KMNIST UM", "FMNIST MP", "FMNIST UM")


def paper_row() -> list[float]:
    return [float(x) for x in PAPER["mnist"]["gedl"]]


def headline(aggregate: dict) -> list[float]:
    """The six columns of the paper's MNIST table, mean over seeds, in %."""
    ood = aggregate["ood"]
    values = [aggregate["id"]["accuracy"]["mean"],
              aggregate["id"]["misclassification"]["mp"]["aupr"]["mean"]]
    for name in ("kmnist", "fashion_mnist"):
        for score in ("mp", "um"):
            values.append(ood[name]["detection"][score]["aupr_in"]["mean"])
    return [100 * v for v in values]


def rank(results: dict) -> list[tuple[str, list[float], float, tuple[str, float]]]:
    """[(reading, its six numbers, mean |difference| from the paper, (column, shortfall))],
    closest first."""
    paper = paper_row()
    rows = []
    for name, aggregate in results["aggregate"].items():
        ours = headline(aggregate)
        gaps = [p - o for p, o in zip(paper, ours)]
        worst = max(range(len(gaps)), key=lambda i: gaps[i])
        rows.append((name, ours, sum(abs(g) for g in gaps) / len(gaps),
                     (COLUMNS[worst], max(gaps[worst], 0.0))))
    return sorted(rows, key=lambda row: row[2])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results_json", type=pathlib.Path,
                        help="results.json of `bin/reproduce.py --study=readings`")
    args = parser.parse_args(argv)
    try:
        results = json.loads(args.results_json.read_text())
    except (OSError, json.JSONDecodeError) as e:
        print(f"error: cannot read {args.results_json}: {e}", file=sys.stderr)
        return 2
    seeds = results.get("args", {}).get("seeds", "?")
    print(f"Distance to the paper's GEDL row (MNIST, 200 epochs), seeds {seeds}, in points:")
    print()
    print("| reading | " + " | ".join(COLUMNS) + " | mean abs. difference | largest shortfall |")
    print("|---|" + "---:|" * (len(COLUMNS) + 1) + "---|")
    print("| the paper | " + " | ".join(f"{v:.2f}" for v in paper_row()) + " | | |")
    for name, ours, distance, (column, shortfall) in rank(results):
        print(f"| `{name}` | " + " | ".join(f"{v:.2f}" for v in ours)
              + f" | {distance:.2f} | {shortfall:.2f} ({column}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
