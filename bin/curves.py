#!/usr/bin/env python
"""Per-epoch curves of runs: what the KL weight, the strength and OOD detection did over training.

    python bin/curves.py RUNS/runs/gedl RUNS/runs/tau_step --out=docs/results/gedl_convergence
    python bin/curves.py RUNS/runs/*  --out=DIR           # every run folder of a reproduce study

Each argument is a run folder (`workdir` with metrics.jsonl) or a folder of seeds
(`<name>/seed_<s>/metrics.jsonl`, as `bin/reproduce.py` and `--config.seeds` write them); runs in
one folder are the seeds of one curve, named by the folder. Per epoch it takes the training
log's mean KL weight (1/tau), batch-mean strength S and prior strength W over the epoch's steps,
and the `epoch_eval` record (`--config.epoch_eval=True`: test accuracy, AUPR of each OOD set by MP
and UM, mean S of each set). It writes `curves.png` (mean over seeds, min-max band) and
`curves.md` (every epoch's means, and the last epoch's mean ± std) into --out.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from collections import defaultdict

import numpy as np

from gedl_jax import files

TRAIN_KEYS = {"kl_weight": "1/tau (KL weight)", "mean_strength": "train S (batch mean)",
              "mean_prior_strength": "W (batch mean)"}


def epoch_records(metrics_path: pathlib.Path, steps_per_epoch: int | None = None
                  ) -> dict[int, dict[str, float]]:
    """{epoch (1-based): {name: value}} from one run's metrics.jsonl: the epoch means of the
    training log's TRAIN_KEYS and the epoch's `epoch_eval` record."""
    records = [json.loads(line) for line in metrics_path.read_text().splitlines() if line]
    evals = [r for r in records if r["split"] == "validation"]
    if steps_per_epoch is None:
        steps = sorted(r["step"] for r in evals)
        steps_per_epoch = steps[0] if steps else None
    if not steps_per_epoch:
        return {}
    train: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    out: dict[int, dict[str, float]] = defaultdict(dict)
    for r in records:
        epoch = (r["step"] - 1) // steps_per_epoch + 1
        if r["split"] == "train":
            for key in TRAIN_KEYS:
                if key in r:
                    train[epoch][key].append(r[key])
        elif r["split"] == "epoch_eval":
            out[epoch].update({k: v for k, v in r.items() if k not in ("step", "split", "time")})
        elif r["split"] == "validation":
            out[epoch]["val_accuracy"] = r["accuracy"]
    for epoch, values in train.items():
        out[epoch].update({k: float(np.mean(v)) for k, v in values.items()})
    return dict(sorted(out.items()))


def find_runs(paths: list[str]) -> dict[str, list[pathlib.Path]]:
    """{curve name: [metrics.jsonl of each seed]}."""
    groups: dict[str, list[pathlib.Path]] = {}
    for arg in paths:
        path = pathlib.Path(arg)
        if (path / "metrics.jsonl").exists():
            groups.setdefault(path.name, []).append(path / "metrics.jsonl")
        else:
            seeds = sorted(path.glob("seed_*/metrics.jsonl"))
            if seeds:
                groups[path.name] = seeds
    return groups


def aggregate(runs: list[dict[int, dict[str, float]]]) -> dict[str, dict[int, np.ndarray]]:
    """{metric: {epoch: values over the seeds that have it}}."""
    table: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        for epoch, values in run.items():
            for key, value in values.items():
                table[key][epoch].append(value)
    return {k: {e: np.asarray(v) for e, v in sorted(d.items())} for k, d in table.items()}


def panels(curves: dict[str, dict]) -> list[str]:
    keys = set().union(*(c.keys() for c in curves.values()))
    ood = sorted(k for k in keys if k.endswith(("_mp", "_um")) and not k.startswith("conf_"))
    sets_strength = sorted(k for k in keys if k.endswith("_strength")
                           and k not in ("test_strength", *TRAIN_KEYS))
    order = ["accuracy", *ood, "test_strength", *sets_strength, *TRAIN_KEYS]
    return [k for k in order if k in keys]


def plot(curves: dict[str, dict], path: pathlib.Path) -> pathlib.Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = panels(curves)
    cols = 4
    rows = -(-len(names) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax, key in zip(axes.flat, names):
        for label, curve in curves.items():
            if key not in curve:
                continue
            epochs = np.array(list(curve[key]))
            values = list(curve[key].values())
            scale = 100.0 if key == "accuracy" or key.endswith(("_mp", "_um")) else 1.0
            mean = np.array([v.mean() for v in values]) * scale
            line, = ax.plot(epochs, mean, marker=".", label=label)
            ax.fill_between(epochs, [v.min() * scale for v in values],
                            [v.max() * scale for v in values], color=line.get_color(), alpha=0.15)
        ax.set_title(TRAIN_KEYS.get(key, key + (" AUPR %" if key.endswith(("_mp", "_um"))
                                                 else "")), fontsize=9)
        ax.set_xlabel("epoch")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    files.write_with(path, lambda f: fig.savefig(f, dpi=110, format="png"))   # never via a link
    plt.close(fig)
    return path


def markdown(curves: dict[str, dict], seeds: dict[str, int]) -> str:
    names = panels(curves)
    lines = ["## Last epoch, mean ± std over seeds (AUPR and accuracy in %)", "",
             "| run | seeds | epoch | " + " | ".join(names) + " |",
             "|---|---:|---:|" + "---:|" * len(names)]
    for label, curve in curves.items():
        evaluated = curve.get("accuracy") or curve.get("val_accuracy") or {}
        last = max(evaluated) if evaluated else max(max(curve[k]) for k in names if k in curve)
        cells = []
        for key in names:
            values = curve.get(key, {}).get(last)
            scale = 100.0 if key == "accuracy" or key.endswith(("_mp", "_um")) else 1.0
            cells.append("–" if values is None else
                         f"{values.mean() * scale:.2f} ± {values.std(ddof=1) * scale:.2f}"
                         if len(values) > 1 else f"{values.mean() * scale:.2f}")
        lines.append(f"| {label} | {seeds[label]} | {last} | " + " | ".join(cells) + " |")
    lines += ["", "## Every epoch (mean over seeds)", ""]
    for label, curve in curves.items():
        epochs = sorted(set().union(*(curve[k].keys() for k in names if k in curve)))
        lines += [f"### {label}", "", "| epoch | " + " | ".join(names) + " |",
                  "|---:|" + "---:|" * len(names)]
        for e in epochs:
            cells = []
            for key in names:
                values = curve.get(key, {}).get(e)
                scale = 100.0 if key == "accuracy" or key.endswith(("_mp", "_um")) else 1.0
                cells.append("–" if values is None else f"{values.mean() * scale:.3g}")
            lines.append(f"| {e} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", help="run folders or folders of seed_<s> runs")
    p.add_argument("--out", required=True, help="folder for curves.png and curves.md")
    args = p.parse_args(argv)
    groups = find_runs(args.runs)
    if not groups:
        print(f"error: no metrics.jsonl under {args.runs}: give run folders (or folders of "
              f"seed_<s> runs) that training wrote", file=sys.stderr)
        return 2
    curves = {name: aggregate([epoch_records(m) for m in paths]) for name, paths in groups.items()}
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plot(curves, out / "curves.png")
    files.write_text(out / "curves.md",
                     markdown(curves, {n: len(p) for n, p in groups.items()}) + "\n")
    print(f"wrote {out / 'curves.png'} and {out / 'curves.md'} ({len(groups)} curves)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
