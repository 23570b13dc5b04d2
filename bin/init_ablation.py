#!/usr/bin/env python
"""Table of an ablation over config fields (default: `init`), per seed and mean ± std.

    python bin/init_ablation.py /tmp/h16/runs [--fields=init,tau_reading] [--out=table.md]

Finds every `eval_results.json` under the given folders (one per seed run, with its `config.json`
beside it), groups the runs by variant and by the values of `--fields` (fields that have one value
across all runs are left out of the row names), and prints a markdown table: MNIST test accuracy,
then AUPR of OOD detection with in-distribution positive (%) for the max-probability (MP) and the
uncertainty-mass (UM) score on each OOD set. Each seed is a row, followed by the group's mean ±
sample std (ddof=1) when it has more than one seed.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
from collections import defaultdict


def load_runs(folders: list[str]) -> list[dict]:
    runs = []
    for folder in folders:
        for path in sorted(pathlib.Path(folder).rglob("eval_results.json")):
            config_path = path.parent / "config.json"
            if not config_path.exists():
                print(f"skipping {path}: no config.json beside it", file=sys.stderr)
                continue
            runs.append({"path": path, "results": json.loads(path.read_text()),
                         "config": json.loads(config_path.read_text())})
    return runs


def row_values(results: dict, ood_sets: list[str]) -> list[float | None]:
    values = [results["id"]["accuracy"]]
    for name in ood_sets:
        det = results.get("ood", {}).get(name, {}).get("detection", {})
        values += [det.get(score, {}).get("aupr_in") for score in ("mp", "um")]
    return [None if v is None else 100 * v for v in values]


def fmt(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}"


def table(runs: list[dict], fields: list[str], ood_sets: list[str]) -> str:
    varying = [f for f in fields if len({json.dumps(r["config"].get(f)) for r in runs}) > 1]
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in runs:
        key = (r["config"].get("variant"), *(r["config"].get(f) for f in varying))
        groups[key].append(r)
    head = ["variant", *varying, "seed", "Acc"]
    for name in ood_sets:
        head += [f"{name} MP", f"{name} UM"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for key in sorted(groups, key=lambda k: tuple(str(x) for x in k)):
        members = sorted(groups[key], key=lambda r: r["config"].get("seed", 0))
        rows = [row_values(r["results"], ood_sets) for r in members]
        for r, vals in zip(members, rows):
            lines.append("| " + " | ".join([*map(str, key), str(r["config"].get("seed")),
                                            *map(fmt, vals)]) + " |")
        if len(rows) > 1:
            cells = []
            for column in zip(*rows):
                xs = [x for x in column if x is not None]
                cells.append(f"**{statistics.mean(xs):.2f} ± {statistics.stdev(xs):.2f}**"
                             if len(xs) > 1 else "–")
            lines.append("| " + " | ".join([*map(str, key), f"mean ± std ({len(rows)})",
                                            *cells]) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folders", nargs="+", help="folders searched recursively for eval_results.json")
    p.add_argument("--fields", default="init,tau_reading",
                   help="config fields that tell the ablation's arms apart")
    p.add_argument("--ood", default="kmnist,fashion_mnist", help="OOD sets, in column order")
    p.add_argument("--out", default=None, help="also write the table to this file")
    args = p.parse_args(argv)
    runs = load_runs(args.folders)
    if not runs:
        raise SystemExit(f"no eval_results.json with a config.json under {args.folders}")
    text = table(runs, [f for f in args.fields.split(",") if f], args.ood.split(","))
    print(text)
    if args.out:
        pathlib.Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
