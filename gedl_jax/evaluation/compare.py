"""Two evaluated runs, or two methods' runs over seeds, compared on the same examples: a paired
bootstrap of every metric's difference (``bin/compare_runs.py``, whose command line is
``gedl_jax.commands.compare``).

    python bin/compare_runs.py runs/mnist_gedl runs/mnist_edl [--bootstrap_samples=2000]
    python bin/compare_runs.py runs/gedl5 runs/edl5          # folders of seed_* runs
    python bin/compare_runs.py runs/gedl_seed0,runs/gedl_seed1 runs/edl_seed0,runs/edl_seed1

Each argument is a run's results folder (its ``predictions.npz``, which every evaluation
writes) or that file; a folder whose ``seed_*`` subfolders are runs (``--config.seeds``
writes one); or several of these joined by commas. Every run must hold the same test set (same
labels in the same order, as runs on one dataset do); the OOD sets they all have are compared.
``--scores`` may also name the post-hoc OOD scores the runs' evaluations saved (energy,
neg_mahalanobis, ...: ``config.posthoc_scores``).
Each replicate draws the test examples, and each OOD set's examples, with replacement, the same
draws for every run (``bootstrap.paired_section``), so the interval of A - B leaves out the
variation the runs share: a difference whose interval excludes 0 is one that other draws of the
test examples would keep. With several runs a side, a replicate also draws that side's runs
with replacement and averages them, so the interval holds the variation over training seeds as
well; with few seeds (under 5) it is too narrow, as any bootstrap over so few draws.

With ``--calibrate`` the runs' calibrated predictions are compared instead: each run's
calibrator (its evaluation's ``calibrator``, evidence scaling for the EDL family and temperature
scaling otherwise; ``--calibrator`` chooses one for every run) is fitted on the validation
predictions its ``predictions.npz`` holds and applied to its test and OOD predictions, as the
evaluation's ``--config.calibrate`` does (``core.calibrated_predictions``). Each fit is in the
comparison's ``calibration``. Compared after calibration, two methods differ in what a
one-parameter fit on held-out data cannot remove.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from gedl_jax.evaluation import bootstrap, checks, core, saved

__all__ = ["compare_runs", "paired_table", "run_paths"]

PREDICTIONS_FILENAME = "predictions.npz"
DEFAULT_SCORES = ("mp", "um")
CALIBRATOR_NAMES = {"temperature": "temperature scaling", "evidence_scale": "evidence scaling"}


def _predictions(path) -> tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(the run's name, its predictions by split, its evaluation's options or {}, the post-hoc
    OOD scores it saved by split)."""
    path = pathlib.Path(path)
    file = path / PREDICTIONS_FILENAME if path.is_dir() else path
    if not file.is_file():
        raise FileNotFoundError(f"{path}: no {PREDICTIONS_FILENAME} (give an evaluated run's "
                                f"folder, which python -m gedl_jax.evaluate writes, or a folder "
                                f"of seed_* runs)")
    results = file.with_name("eval_results.json")
    name, options = (path.name if path.is_dir() else file.parent.name), {}
    if results.is_file():   # the method's name, as the tables name it
        with open(results) as f:
            evaluated = json.load(f)
        name = str(evaluated.get("variant") or name)
        options = dict(evaluated.get("evaluation_options") or {})
    return name, saved.load_predictions(file), options, saved.load_posthoc_scores(file)


def _with_posthoc(predictions: dict[str, Any], posthoc: Mapping[str, Any]) -> dict[str, Any]:
    """`predictions` with the post-hoc OOD scores its evaluation saved (energy, ...) among the
    scores of their splits, so --scores may name them; the method's own score of the same name
    comes first. They are the evaluation's, calibrated or not: no calibrator here acts on the
    logits they come from."""
    out = dict(predictions)
    for split, by_score in posthoc.items():
        if split in out:
            out[split] = dataclasses.replace(out[split],
                                             scores={**by_score, **out[split].scores})
    return out


def _calibrated(path, predictions: dict[str, Any], options: Mapping[str, Any],
                calibrator: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the fit, the run's calibrated predictions) with `calibrator`, or the one its evaluation
    names (`evaluation_options`; temperature scaling where none is recorded)."""
    if "validation" not in predictions:
        raise ValueError(f"{path}: its predictions.npz holds no validation predictions, which "
                         f"a calibrator is fitted on (evaluate the run again: python -m "
                         f"gedl_jax.evaluate --workdir=RUN writes them)")
    name = calibrator or str(options.get("calibrator") or "temperature")
    if name == "evidence_scale" and not predictions["validation"].is_dirichlet:
        raise ValueError(f"{path}: calibrator 'evidence_scale' needs Dirichlet predictions "
                         f"(the EDL family's); use --calibrator=temperature")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fit, calibrated = core.calibrated_predictions(
            predictions["validation"],
            {k: v for k, v in predictions.items() if k != "validation"}, name,
            options.get("base_rate"))
    for warning in caught:   # a fit on its bound: which run's, among a comparison's many
        warnings.warn(f"{path}: {warning.message}", warning.category, stacklevel=3)
    calibrated.pop("validation")
    return fit, calibrated


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


def _side(spec, calibrated: bool = False, calibrator: str | None = None
          ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """({"name", "path", "runs"; with `calibrated` also "calibration": each run's fit}, the
    runs' predictions, calibrated with `calibrated`) of one side."""
    paths = run_paths(spec)
    loaded = [_predictions(p) for p in paths]
    about = {"name": "/".join(dict.fromkeys(name for name, *_ in loaded)), "path": str(spec),
             "runs": [str(p) for p in paths]}
    runs = [predictions for _, predictions, *_ in loaded]
    if calibrated:
        fits_and_runs = [_calibrated(p, predictions, options, calibrator)
                         for p, (_, predictions, options, _) in zip(paths, loaded, strict=True)]
        about["calibration"] = [fit for fit, _ in fits_and_runs]
        runs = [run for _, run in fits_and_runs]
    return about, [_with_posthoc(run, posthoc)
                   for run, (*_, posthoc) in zip(runs, loaded, strict=True)]


# compare_runs' keywords before they took the names the rest of the package gives these ideas
# (`EvaluationOptions`, the config fields, every command's flags); 0.2.0 removes them.
RETIRED_KEYWORDS = {"samples": "bootstrap_samples", "confidence": "bootstrap_confidence",
                    "seed": "bootstrap_seed", "calibrated": "calibrate",
                    "interval": "bootstrap_interval"}


def compare_runs(a, b, bootstrap_samples: int = 2000, bootstrap_confidence: float = 0.95,
                 bootstrap_seed: int = 0, scores: Sequence[str] | None = None,
                 calibrate: bool = False, calibrator: str | None = None,
                 bootstrap_interval: str = "percentile", **retired: Any) -> dict[str, Any]:
    """`bootstrap.paired_section` of the runs that `a` and `b` name (`run_paths`), over
    `scores` (default: those of "mp" and "um" that every run has), with "a" and "b" naming
    them: `bootstrap_samples` replicates, intervals at `bootstrap_confidence` by
    `bootstrap_interval` (`bootstrap.INTERVAL_METHODS`), draws seeded by `bootstrap_seed`.
    With `calibrate`, of each run's calibrated predictions (module docstring), by
    `calibrator` ("temperature" or "evidence_scale"; None: each run's evaluation's).

    The keywords' old names (`RETIRED_KEYWORDS`: samples, confidence, seed, calibrated,
    interval) still work in 0.1.0, with a DeprecationWarning."""
    given = {"bootstrap_samples": bootstrap_samples, "bootstrap_confidence": bootstrap_confidence,
             "bootstrap_seed": bootstrap_seed, "calibrate": calibrate,
             "bootstrap_interval": bootstrap_interval}
    for old, value in retired.items():
        if old not in RETIRED_KEYWORDS:
            raise TypeError(f"compare_runs() got an unexpected keyword argument {old!r}")
        new = RETIRED_KEYWORDS[old]
        warnings.warn(f"compare_runs({old}=...) is now {new}=...; the old name goes in 0.2.0",
                      DeprecationWarning, stacklevel=2)
        given[new] = value
    bootstrap_samples, bootstrap_confidence, bootstrap_seed, calibrate, bootstrap_interval = (
        given["bootstrap_samples"], given["bootstrap_confidence"], given["bootstrap_seed"],
        given["calibrate"], given["bootstrap_interval"])
    if calibrator is not None:
        checks.one_of(calibrator, core.CALIBRATORS, "calibrator")
    (about_a, runs_a), (about_b, runs_b) = (_side(a, calibrate, calibrator),
                                            _side(b, calibrate, calibrator))
    everyone = runs_a + runs_b
    shared = [s for s in everyone[0]["test"].scores
              if all(s in run["test"].scores for run in everyone)]
    chosen = [s for s in DEFAULT_SCORES if s in shared] if scores is None else list(scores)
    if not chosen:
        raise ValueError(f"the runs share no score to compare (A: "
                         f"{sorted(runs_a[0]['test'].scores)}, B: "
                         f"{sorted(runs_b[0]['test'].scores)})")
    section = bootstrap.paired_section(runs_a, runs_b, chosen, bootstrap_samples,
                                       bootstrap_confidence, bootstrap_seed,
                                       method=bootstrap_interval)
    section["settings"]["calibrated"] = bool(calibrate)   # the results' key, as saved files have
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
    calibration = ""
    if settings.get("calibrated"):
        def fitted(key):
            fits = comparison[key]["calibration"]
            names = sorted({CALIBRATOR_NAMES.get(fit["calibrator"], fit["calibrator"])
                            for fit in fits})
            on_bound = sum(bool(fit.get("at_bound")) for fit in fits)
            return " and ".join(names) + (
                f", {on_bound} of {len(fits)} fit(s) on the search bound" if on_bound else "")
        calibration = (f" Calibrated predictions: each run's calibrator fitted on its "
                       f"validation predictions and applied to its test and OOD sets (A: "
                       f"{fitted('a')}; B: {fitted('b')}).")
    seeds = (" Each replicate also draws each side's runs with replacement and averages them "
             "(A and B: the means over the runs), so the interval holds the variation over "
             "training seeds too." if several else "")
    lines = [f"> Paired bootstrap: A = {side('a')}, B = {side('b')}. A - B with its "
             f"{settings['confidence']:.0%} {settings.get('method', 'percentile')} interval "
             f"over {settings['samples']:,} "
             f"replicates that draw the same test examples (and the same examples of each OOD "
             f"set) for every run.{calibration}{seeds} 'A better': the fraction of "
             f"replicates in which A is better (higher; lower for NLL, Brier, the ECEs and "
             f"FPR95). Acc, AUPR, AUROC and FPR95 in %; NLL, Brier and the ECEs as fractions "
             f"(ECE-over + ECE-under = ECE). Seed {settings['seed']}.",
             "",
             "| Metric | Set | Score | A | B | A - B [low, high] | A better |",
             "|---|:---:|:---:|:---:|:---:|:---:|:---:|"]
    test = comparison["id"]
    for key, label, scale in (("accuracy", "Acc", 100), ("nll", "NLL", 1), ("brier", "Brier", 1),
                              ("ece", "ECE", 1), ("ece_overconfidence", "ECE-over", 1),
                              ("ece_underconfidence", "ECE-under", 1),
                              ("ece_classwise", "Classwise-ECE", 1)):
        if key in test:   # a comparison written before a metric was added has no row of it
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
