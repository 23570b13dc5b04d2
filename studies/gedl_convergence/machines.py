"""Seed 0 of one reading trained on two machines, beside the spread between seeds.

Four readings were trained at the long setting both on the project's CPU (seed 0 only:
`<reading>_seed0/` beside this script) and on the H100 (seeds 0, 1 and 2:
`h100/<reading>_seed<s>/`). For each of them and each column of the paper's MNIST table
(in %), this prints the CPU's seed 0, the H100's seed 0, their difference (CPU - H100), and the
H100's three seeds: their range (max - min) and sample standard deviation. Differences and
ranges are taken between the printed (2-decimal) numbers, so that subtracting the printed
numbers gives them to the digit. The CPU's seeds 1 and 2 of these readings were not trained, so
the CPU's own spread between seeds is not measured.

A second table ranks every run of the folder within its machine by its distance to the paper's
GEDL row (the mean absolute difference over the six columns, as `rank_readings.py` computes it
for the 3-seed means), so that readings are compared on one machine.

    python -m studies.gedl_convergence.machines [FOLDER]   # from the repository root
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

# The paper's MNIST columns and where an evaluation holds them: the long table's definition
from studies.gedl_convergence.rank_readings import paper_row
from studies.mnist_long.against_paper import COLUMNS, PATHS

HERE = pathlib.Path(__file__).resolve().parent
RESULTS = HERE.parents[1] / "docs" / "results" / "gedl_convergence"   # the study's results
READINGS = ("gedl", "kl_masked", "tau_step", "tau_sum_over_c")


def headline(path: pathlib.Path) -> list[float]:
    """The six columns of one run's eval_results.json, in %."""
    result = json.loads(path.read_text())
    values = []
    for keys in PATHS:
        node = result
        for key in keys:
            node = node[key]
        values.append(100 * float(node))
    return values


def distances(folder: pathlib.Path) -> list[tuple[str, str, int, float]]:
    """[(machine, reading, seed, mean |run - paper| over the six columns)] of every run in the
    folder (`<reading>_seed<s>/`: the CPU; `h100/<reading>_seed<s>/`: the H100), sorted by
    machine, then distance."""
    paper = paper_row()
    rows = []
    for machine, runs in (("CPU", folder), ("H100", folder / "h100")):
        for path in sorted(runs.glob("*_seed*/eval_results.json")):
            reading, seed = path.parent.name.rsplit("_seed", 1)
            gaps = [abs(o - p) for o, p in zip(headline(path), paper)]
            rows.append((machine, reading, int(seed), sum(gaps) / len(gaps)))
    return sorted(rows, key=lambda row: (row[0], row[3]))


def compare(folder: pathlib.Path) -> list[tuple[str, str, float, float, float, float, float]]:
    """[(reading, column, CPU seed 0, H100 seed 0, CPU - H100, H100 range, H100 std)], in %."""
    rows = []
    for reading in READINGS:
        cpu = headline(folder / f"{reading}_seed0" / "eval_results.json")
        h100 = [headline(folder / "h100" / f"{reading}_seed{s}" / "eval_results.json")
                for s in range(3)]
        for i, column in enumerate(COLUMNS):
            seeds = [run[i] for run in h100]
            printed = [round(v, 2) for v in seeds]
            rows.append((reading, column, cpu[i], seeds[0],
                         round(round(cpu[i], 2) - printed[0], 2) + 0.0,
                         round(max(printed) - min(printed), 2), statistics.stdev(seeds)))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=pathlib.Path, nargs="?", default=RESULTS,
                        help="the folder holding <reading>_seed0/ and h100/ (default: "
                             "docs/results/gedl_convergence)")
    args = parser.parse_args(argv)
    try:
        rows = compare(args.folder)
    except (OSError, KeyError, json.JSONDecodeError) as e:
        print(f"error: cannot read the runs under {args.folder}: {e}", file=sys.stderr)
        return 2
    print("| reading | column | CPU seed 0 | H100 seed 0 | CPU - H100 "
          "| H100 seeds 0-2: range | H100 seeds 0-2: std |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for reading, column, cpu, h100, diff, spread, std in rows:
        print(f"| `{reading}` | {column} | {cpu:.2f} | {h100:.2f} | {diff:+.2f} "
              f"| {spread:.2f} | {std:.2f} |")
    print()
    print("| machine | reading | seed | mean abs. difference from the paper's row |")
    print("|---|---|---:|---:|")
    for machine, reading, seed, distance in distances(args.folder):
        print(f"| {machine} | `{reading}` | {seed} | {distance:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
