"""Two evaluated runs, or two methods' runs over seeds, compared on the same examples: a paired
bootstrap of every metric's difference (``bin/compare_runs.py``).

    python bin/compare_runs.py runs/mnist_gedl runs/mnist_edl [--samples 2000] [--out FILE.md]
    python bin/compare_runs.py runs/gedl5 runs/edl5          # folders of seed_* runs
    python bin/compare_runs.py runs/gedl_seed0,runs/gedl_seed1 runs/edl_seed0,runs/edl_seed1

Each argument is a run's results folder (its ``predictions.npz``, which every evaluation
writes) or that file; a folder whose ``seed_*`` subfolders are runs (``--config.seeds``
writes one); or several of these joined by commas. Every run must hold the same test set (same
labels in the same order, as runs on one dataset do); the OOD sets they all have are compared.
Each replicate draws the test examples, and each OOD set's examples, with replacement, the same
draws for every run (``bootstrap.paired_section``), so the interval of A - B leaves out the
variation the runs share: a difference whose interval excludes 0 is one that other draws of the
test examples would keep. With several runs a side, a replicate also draws that side's runs
with replacement and averages them, so the interval holds the variation over training seeds as
well; with few seeds (under 5) it is too narrow, as any bootstrap over so few draws.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from gedl_jax import files
from gedl_jax.evaluation import bootstrap, saved

__all__ = ["compare_runs", "main", "paired_table", "run_paths"]

PREDICTIONS_FILENAME = "predictions.npz"
DEFAULT_SCORES = ("mp", "um")


def _predictions(path) -> tuple[str, dict[str, Any]]:
    path = pathlib.Path(path)
    file = path / PREDICTIONS_FILENAME if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"{path}: no {PREDICTIONS_FILENAME} (give an evaluated run's "
                                f"folder, which python -m gedl_jax.evaluate writes, or a folder "
                                f"of seed_* runs)")
    results = file.with_name("eval_results.json")
    name = path.name if path.is_dir() else file.parent.name
    if results.is_file():   # the method's name, as the tables name it
        with open(results) as f:
            name = str(json.load(f).get("variant") or name)
    return name, saved.load_predictions(file)


def run_paths(spec: str | pathlib.Path) -> list[pathlib.Path]:
    """The runs one side of a comparison names: a run's folder or its predictions.npz, a
    folder of `seed_*` runs (in seed order), or several of these joined by commas."""
    paths: list[pathlib.Path] = []
    for part in str(spec).split(","):
        path = pathlib.Path(part.strip())
        seeds = [] if (path / PREDICTIONS_FILENAME).is_file() or not path.is_dir() else sorted(
            (d for d in path.glob("seed_*") if (d / PREDICTIONS_FILENAME).is_file()),
            key=lambda d: (len(d.name), d.name))
        paths.extend(seeds or [path])
    return paths


def _side(spec) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """({"name", "path", "runs"}, the runs' predictions) of one side."""
    paths = run_paths(spec)
    loaded = [_predictions(p) for p in paths]
    name = "/".join(dict.fromkeys(name for name, _ in loaded))
    return ({"name": name, "path": str(spec), "runs": [str(p) for p in paths]},
            [runs for _, runs in loaded])


def compare_runs(a, b, samples: int = 2000, confidence: float = 0.95, seed: int = 0,
                 scores: Sequence[str] | None = None) -> dict[str, Any]:
    """`bootstrap.paired_section` of the runs that `a` and `b` name (`run_paths`), over
    `scores` (default: those of "mp" and "um" that every run has), with "a" and "b" naming
    them."""
    (about_a, runs_a), (about_b, runs_b) = _side(a), _side(b)
    everyone = runs_a + runs_b
    shared = [s for s in everyone[0]["test"].scores
              if all(s in run["test"].scores for run in everyone)]
    chosen = [s for s in DEFAULT_SCORES if s in shared] if scores is None else list(scores)
    if not chosen:
        raise ValueError(f"the runs share no score to compare (A: "
                         f"{sorted(runs_a[0]['test'].scores)}, B: "
                         f"{sorted(runs_b[0]['test'].scores)})")
    section = bootstrap.paired_section(runs_a, runs_b, chosen, samples, confidence, seed)
    return {"a": about_a, "b": about_b, **section}


def paired_table(comparison: Mapping[str, Any]) -> str:
    """Markdown: each metric's A, B and A - B [low, high], and the fraction of replicates in
    which A is better."""
    settings = comparison["settings"]

    def row(metric, where, score, entry, scale):
        digits = 2 if scale == 100 else 4
        if entry["low"] is None:
            interval = "–"
        else:
            interval = (f"{entry['difference'] * scale:+.{digits}f} "
                        f"[{entry['low'] * scale:+.{digits}f}, "
                        f"{entry['high'] * scale:+.{digits}f}]")
        better = "–" if entry["a_better"] is None else f"{entry['a_better']:.3f}"
        return (f"| {metric} | {where} | {score} | {entry['a'] * scale:.{digits}f} | "
                f"{entry['b'] * scale:.{digits}f} | {interval} | {better} |")

    def side(key):
        about = comparison[key]
        runs = len(about.get("runs", [about["path"]]))
        return f"{about['name']} ({about['path']}{f', {runs} runs' if runs > 1 else ''})"

    several = max(settings.get("runs", [1, 1])) > 1
    seeds = (" Each replicate also draws each side's runs with replacement and averages them "
             "(A and B: the means over the runs), so the interval holds the variation over "
             "training seeds too." if several else "")
    lines = [f"> Paired bootstrap: A = {side('a')}, B = {side('b')}. A - B with its "
             f"{settings['confidence']:.0%} percentile interval over {settings['samples']:,} "
             f"replicates that draw the same test examples (and the same examples of each OOD "
             f"set) for every run.{seeds} 'A better': the fraction of replicates in which A is "
             f"better (higher; lower for NLL, Brier, ECE and FPR95). Acc, AUPR, AUROC and "
             f"FPR95 in %; NLL, Brier and ECE as fractions. Seed {settings['seed']}.",
             "",
             "| Metric | Set | Score | A | B | A - B [low, high] | A better |",
             "|---|:---:|:---:|:---:|:---:|:---:|:---:|"]
    test = comparison["id"]
    for key, label, scale in (("accuracy", "Acc", 100), ("nll", "NLL", 1), ("brier", "Brier", 1),
                              ("ece", "ECE", 1)):
        lines.append(row(label, "test", "–", test[key], scale))
    for score, by_metric in test["misclassification"].items():
        for key, label in (("aupr", "Conf. AUPR"), ("auroc", "Conf. AUROC")):
            lines.append(row(label, "test", score, by_metric[key], 100))
    for name, by_score in comparison["ood"].items():
        for score, by_metric in by_score.items():
            for key, label in (("aupr_in", "AUPR-in"), ("aupr_out", "AUPR-out"),
                               ("auroc", "AUROC"), ("fpr95", "FPR95")):
                lines.append(row(label, name, score, by_metric[key], 100))
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (bin/compare_runs.py): bad input is one `error:` line and exit 2."""
    from gedl_jax import cli

    parser = cli.ArgumentParser(
        description="Compare two evaluated runs, or two methods' runs over seeds, on the "
                    "same examples: a paired bootstrap of every metric's difference A - B.")
    parser.add_argument("run_a", help="run A: its results folder (predictions.npz) or the "
                                      "file; a folder of seed_* runs; or several joined by "
                                      "commas (a method's seeds)")
    parser.add_argument("run_b", help="run B, the same way, on the same test set")
    parser.add_argument("--samples", type=int, default=2000, help="replicates (default 2000)")
    parser.add_argument("--confidence", type=float, default=0.95,
                        help="the intervals' level (default 0.95)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the draws (default 0)")
    parser.add_argument("--scores", help="comma-separated scores (default: mp,um where every "
                                         "run has them)")
    parser.add_argument("--out", help="also write the table (.md) or the numbers (.json) here")
    return cli.run_argparse(parser, _main, argv)


def _main(args: Any) -> int:
    comparison = compare_runs(args.run_a, args.run_b, args.samples, args.confidence, args.seed,
                              args.scores.split(",") if args.scores else None)
    text = paired_table(comparison)
    print(text, end="")
    if args.out:
        out = pathlib.Path(args.out)
        files.write_text(out, json.dumps(comparison, indent=2) if out.suffix == ".json"
                         else text)
    return 0
