"""The long table's post-hoc rows: the softmax ConvNet with each post-hoc OOD score, and its
last-layer Laplace posterior, from the softmax runs' checkpoints (no retraining); and the same
scores on the EDL family's shipped seed-0 models beside their own MP and UM.

Reads the committed per-seed evaluations beside this script (`runs/softmax_seed<s>/` and
`runs/laplace_seed<s>/eval_results.json`, or the folder given) and prints two tables, mean ±
sample std (ddof=1) over the seeds, in %:

- detection: accuracy, misclassification AUPR (correct positive) and the KMNIST and
  Fashion-MNIST AUPR (in-distribution positive) of the softmax classifier under each post-hoc
  score of its run's `posthoc` section, then of the Laplace predictive under its MP and
  negative entropy;
- calibration: NLL, ECE and Brier of the softmax classifier and of its Laplace predictive, and
  the prior precision each Laplace fit chose on the validation split;
- the EDL family at seed 0 (where `posthoc_edl_family/<method>_seed0/eval_results.json`
  exists): the KMNIST and Fashion-MNIST AUPR of each shipped model (`mnist/<method>`, the long
  setting's seed 0) under its own MP and UM and under each post-hoc score of its logits and
  features, beside the shipped softmax's. One seed: no std.

`--evaluate_pretrained` first makes those evaluations (`python -m gedl_jax.evaluate
--pretrained=mnist/<method>` for each, about 90 s each on 2 CPU cores; the data folder from
`$GEDL_DATA_DIR`, with the MNIST training split for the feature scores).

`--collect=STUDY_OUT` first copies the finished softmax runs of a `bin/reproduce.py` study
(STUDY_OUT/runs/softmax/seed_<s>) into the runs folder, with each one's evaluation as a
Laplace run (`python -m gedl_jax.evaluate --as_method=laplace --out=STUDY_OUT_as_laplace/
seed_<s>`, run here when that folder has none yet: beside the study, which may still be
training), machine paths replaced by RUNS_DIR.

    python studies/mnist_long/posthoc_rows.py [RUNS_FOLDER] [--collect=STUDY_OUT]
                                              [--evaluate_pretrained]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import statistics
import sys

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
OOD_SETS = (("kmnist", "KMNIST"), ("fashion_mnist", "FMNIST"))
SCORE_LABELS = {"msp": "MSP", "max_logit": "max-logit", "energy": "energy",
                "neg_entropy": "neg. entropy", "neg_mahalanobis": "Mahalanobis",
                "neg_knn_distance": "KNN", "vim": "ViM", "mp": "MP"}
SOFTMAX_FILES = ("eval_results.json", "config.json", "environment.json")
# The shipped long-setting models whose predictions are functions of their K logits (the EDL
# family: `Method.posthoc_from_logits`), and the softmax for reference.
PRETRAINED_ROWS = ("softmax", "edl", "iedl", "redl", "red", "gedl")
FAMILY_FOLDER = "posthoc_edl_family"


def _seed_results(runs: pathlib.Path, row: str) -> list[dict]:
    paths = sorted(runs.glob(f"{row}_seed*/eval_results.json"),
                   key=lambda p: int(p.parent.name.rsplit("_seed", 1)[1]))
    return [json.loads(p.read_text()) for p in paths]


def _cell(values: list[float]) -> str:
    mean = statistics.mean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{mean:.2f} ± {std:.2f}"


def detection_rows(runs: pathlib.Path) -> list[tuple[str, int, list[str]]]:
    """[(row, seeds, [Acc, Conf., KMNIST, FMNIST cells])]: the softmax runs under each
    post-hoc score, then the Laplace runs under MP and negative entropy."""
    rows = []
    softmax = _seed_results(runs, "softmax")
    if softmax:
        accuracy = [100 * r["id"]["accuracy"] for r in softmax]
        for score in softmax[0]["posthoc"]["scores"]:
            columns = [accuracy,
                       [100 * r["posthoc"]["misclassification"][score]["aupr"] for r in softmax]]
            columns += [[100 * r["posthoc"]["ood"][name]["detection"][score]["aupr_in"]
                         for r in softmax] for name, _ in OOD_SETS]
            rows.append((f"softmax + {SCORE_LABELS.get(score, score)}", len(softmax),
                         [_cell(c) for c in columns]))
    laplace = _seed_results(runs, "laplace")
    for score in ("mp", "neg_entropy"):
        if not laplace or score not in laplace[0]["scores"]:
            continue
        columns = [[100 * r["id"]["accuracy"] for r in laplace],
                   [100 * r["id"]["misclassification"][score]["aupr"] for r in laplace]]
        columns += [[100 * r["ood"][name]["detection"][score]["aupr_in"] for r in laplace]
                    for name, _ in OOD_SETS]
        rows.append((f"Laplace ({laplace[0]['method'].split('(')[1].rstrip(')')}) + "
                     f"{SCORE_LABELS[score]}", len(laplace), [_cell(c) for c in columns]))
    return rows


def calibration_rows(runs: pathlib.Path) -> list[tuple[str, int, list[str]]]:
    """[(row, seeds, [NLL, ECE %, Brier, the prior precisions chosen])]."""
    rows = []
    for row, label in (("softmax", "softmax"), ("laplace", "Laplace")):
        results = _seed_results(runs, row)
        if not results:
            continue
        chosen = ", ".join(f"{r['fit']['prior_precision']:.3g}" for r in results
                           if "fit" in r) or "–"
        rows.append((label, len(results), [
            f"{statistics.mean(r['id']['nll'] for r in results):.4f}",
            _cell([100 * r["id"]["ece"] for r in results]),
            f"{statistics.mean(r['id']['brier'] for r in results):.4f}", chosen]))
    return rows


def tables(runs: pathlib.Path) -> str:
    lines = ["| row | seeds | Acc | Conf. | " + " | ".join(label for _, label in OOD_SETS)
             + " |", "|---|---:|---:|---:|" + "---:|" * len(OOD_SETS)]
    lines += [f"| {row} | {seeds} | " + " | ".join(cells) + " |"
              for row, seeds, cells in detection_rows(runs)]
    lines += ["", "| row | seeds | NLL | ECE | Brier | prior precision (per seed) |",
              "|---|---:|---:|---:|---:|---|"]
    lines += [f"| {row} | {seeds} | " + " | ".join(cells) + " |"
              for row, seeds, cells in calibration_rows(runs)]
    return "\n".join(lines)


def family_results(runs: pathlib.Path) -> dict[str, dict]:
    """{method: eval_results} of the shipped seed-0 models evaluated into
    `runs/../posthoc_edl_family/<method>_seed0/`, in PRETRAINED_ROWS order."""
    folder = runs.parent / FAMILY_FOLDER
    return {m: json.loads((folder / f"{m}_seed0" / "eval_results.json").read_text())
            for m in PRETRAINED_ROWS
            if (folder / f"{m}_seed0" / "eval_results.json").exists()}


def family_tables(runs: pathlib.Path) -> str:
    """Per OOD set: one row per shipped model, its AUPR (in %) under its own MP and UM and under
    each post-hoc score ('–' where the model has no such score)."""
    results = family_results(runs)
    if not results:
        return ""
    scores = list(next(iter(results.values()))["posthoc"]["scores"])
    own = ("mp", "um")
    header = ("| model (seed 0) | " + " | ".join(["MP", "UM"] + [SCORE_LABELS.get(s, s)
                                                                for s in scores]) + " |")
    lines = []
    for name, label in OOD_SETS:
        lines += ["", f"{label} AUPR:", "", header, "|---|" + "---:|" * (len(own) + len(scores))]
        for method, r in results.items():
            cells = [r["ood"][name]["detection"].get(s, {}).get("aupr_in") for s in own]
            cells += [r["posthoc"]["ood"][name]["detection"][s]["aupr_in"] for s in scores]
            lines.append(f"| {method} | " + " | ".join(
                "–" if c is None else f"{100 * c:.2f}" for c in cells) + " |")
    return "\n".join(lines)


def evaluate_pretrained(runs: pathlib.Path) -> list[str]:
    """Evaluate each shipped model of PRETRAINED_ROWS into `runs/../posthoc_edl_family/` (its
    eval_results.json without the entries that name paths); returns the names."""
    import tempfile

    from gedl_jax import pretrained
    from gedl_jax.pretrained import export

    done = []
    for method in PRETRAINED_ROWS:
        dest = runs.parent / FAMILY_FOLDER / f"{method}_seed0" / "eval_results.json"
        with tempfile.TemporaryDirectory(prefix="posthoc_rows_") as out:
            results = pretrained.evaluate(f"mnist/{method}", out, overrides={"calibrate": True})
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(json.dumps(export.portable_results(results), indent=2) + "\n")
        done.append(method)
    return done


def _copy_scrubbed(source: pathlib.Path, dest: pathlib.Path, study_out: pathlib.Path) -> None:
    """`source` into `dest` with the absolute path of the study folder's parent as RUNS_DIR."""
    text = source.read_text().replace(str(study_out.resolve().parent), "RUNS_DIR")
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(text)


def collect(study_out: pathlib.Path, runs: pathlib.Path) -> list[int]:
    """Copy each finished softmax seed of `study_out` (and its Laplace evaluation, made here
    when missing) into `runs`; returns the seeds copied."""
    from gedl_jax.evaluate import evaluate_workdir

    copied = []
    as_laplace = study_out.parent / f"{study_out.name}_as_laplace"
    for seed_dir in sorted((study_out / "runs" / "softmax").glob("seed_*")):
        if not (seed_dir / "eval_results.json").exists():
            continue
        seed = int(seed_dir.name.split("_")[1])
        laplace_dir = as_laplace / seed_dir.name
        if not (laplace_dir / "eval_results.json").exists():
            evaluate_workdir(seed_dir, as_method="laplace", results_dir=laplace_dir)
        for name in SOFTMAX_FILES:
            if (seed_dir / name).exists():
                _copy_scrubbed(seed_dir / name, runs / f"softmax_seed{seed}" / name, study_out)
        laplace = runs / f"laplace_seed{seed}"
        shutil.rmtree(laplace, ignore_errors=True)
        _copy_scrubbed(laplace_dir / "eval_results.json",
                       laplace / "eval_results.json", study_out)
        copied.append(seed)
    return copied


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=pathlib.Path, nargs="?",
                        default=REPO / "docs" / "results" / "mnist_long" / "runs",
                        help="folder of softmax_seed<s>/ and laplace_seed<s>/ (default: "
                             "docs/results/mnist_long/runs)")
    parser.add_argument("--collect", type=pathlib.Path, default=None, metavar="STUDY_OUT",
                        help="first copy the finished softmax runs of this bin/reproduce.py "
                             "--out folder (and their Laplace evaluations) into RUNS_FOLDER")
    parser.add_argument("--evaluate_pretrained", action="store_true",
                        help="first evaluate the shipped models mnist/<method> of the EDL family "
                             f"(and mnist/softmax) into RUNS_FOLDER/../{FAMILY_FOLDER}/")
    args = parser.parse_args(argv)
    if args.collect is not None:
        seeds = collect(args.collect, args.runs)
        print(f"collected softmax and laplace seeds {seeds} into {args.runs}", file=sys.stderr)
    if not any(args.runs.glob("softmax_seed*/eval_results.json")):
        print(f"error: no softmax_seed<s>/eval_results.json under {args.runs}", file=sys.stderr)
        return 2
    if args.evaluate_pretrained:
        names = evaluate_pretrained(args.runs)
        print(f"evaluated mnist/{', mnist/'.join(names)} into "
              f"{args.runs.parent / FAMILY_FOLDER}", file=sys.stderr)
    print(tables(args.runs))
    family = family_tables(args.runs)
    if family:
        print(family)
    return 0


if __name__ == "__main__":
    sys.exit(main())
