"""A trained workdir evaluated (`evaluate_workdir`): what `gedl-evaluate --workdir=DIR` does
for each run, and what `gedl_jax.evaluate` offers code under the same name."""

from __future__ import annotations

import pathlib
from typing import Any

import jax

from gedl_jax import methods
from gedl_jax.run import lock, tracking
from gedl_jax.run.ensemble import evaluate_ensemble_and_write, member_dirs
from gedl_jax.run.training import headline_numbers, result_files
from gedl_jax.run.workdir import evaluate_run, restore_run, saved_config

__all__ = ["evaluate_workdir"]


def evaluate_workdir(workdir, extra_ood: tuple[str, ...] = (),
                     overrides: dict[str, Any] | None = None,
                     results_dir=None, as_method: str | None = None) -> dict[str, Any]:
    """Restore `workdir`'s best checkpoint (its saved config.json) and evaluate it; a deep
    ensemble's workdir is evaluated as one model from its members. The result files go to
    `results_dir` (created; default: the workdir, or workdir/as_<method> with `as_method`).
    `as_method`: evaluate the run as another method whose training it is
    (`methods.evaluated_as`: a softmax run as "laplace"), without retraining."""
    if as_method:
        trained = saved_config(workdir, overrides).method
        overrides = {**(overrides or {}), **methods.evaluated_as(as_method, trained)}
        results_dir = results_dir or pathlib.Path(workdir) / f"as_{as_method}"
    config = saved_config(workdir, overrides)
    results_dir = pathlib.Path(results_dir or workdir)
    # Checked writable and created before any work; no training or other evaluation writes
    # into it meanwhile.
    with lock.holding(results_dir, "the results folder"):
        # A run trained with config.tracker="mlflow": this evaluation is an MLflow run too,
        # nested under the training's (`tracking.MlflowRun.open_evaluation`).
        tracker = tracking.MlflowRun.open_evaluation(
            config, workdir, results_dir,
            {"extra_ood": list(extra_ood), "results_dir": str(results_dir.absolute()),
             "as_method": as_method or "", **{f"override.{k}": v
                                              for k, v in (overrides or {}).items()}})
        with tracking.ending(tracker):
            if config.ensemble_size:   # scored as one model, at no one step: 0 (as trained)
                results, step = evaluate_ensemble_and_write(
                    config, member_dirs(workdir, config), results_dir, overrides,
                    extra_ood), 0
            else:
                run = restore_run(workdir, overrides)
                results = evaluate_run(run, results_dir, extra_ood, source=workdir)
                step = int(jax.device_get(run.state.step))
            if tracker is not None:
                tracker.log_results(headline_numbers(results), step,
                                    result_files(results_dir, results))
        return results
