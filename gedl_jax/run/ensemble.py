"""Deep ensembles scored as one model: N members of any method, trained as seeds.

The ensemble's predictive distribution is the mean of its members' probabilities; its scores
are "mp" and "neg_entropy" of that mean and "neg_mi", minus the mutual information between the
prediction and the member, H(mean_m p_m) - mean_m H(p_m) (Lakshminarayanan et al., NeurIPS
2017; the epistemic part of the total entropy). An ensemble has no single Dirichlet precision,
so it has no UM score ("–" in the tables), whatever its members are.
"""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from gedl_jax.evaluation import core, scores
from gedl_jax.run import experiment, workdir

__all__ = ["combine", "evaluate_ensemble_and_write", "member_dirs", "restore_members"]


def combine(members: Sequence[core.Predictions]) -> core.Predictions:
    """One ensemble's `Predictions` from its members' on the same examples."""
    probs_MxNxK = np.stack([m.probs for m in members])
    mean_NxK, ensemble_scores = scores.sampled_scores(probs_MxNxK)
    return core.Predictions(mean_NxK, ensemble_scores, members[0].labels)


def member_dirs(ensemble_dir, config) -> list[pathlib.Path]:
    """The members' workdirs of an ensemble run (`train.train_ensemble`'s layout)."""
    size, seed = int(config.ensemble_size), int(config.seed)
    return [pathlib.Path(ensemble_dir) / "members" / f"seed_{seed * size + m}"
            for m in range(size)]


def restore_members(dirs: Sequence[pathlib.Path], overrides: dict[str, Any] | None = None
                    ) -> list[workdir.RestoredRun]:
    """Every member's best checkpoint; the official data is loaded once for all of them."""
    first = workdir.saved_config(dirs[0], overrides)
    official = experiment.OfficialData.load(first)
    return [workdir.restore_run(d, overrides, official=official) for d in dirs]


def evaluate_ensemble_and_write(config, dirs: Sequence[pathlib.Path], ensemble_dir,
                                overrides: dict[str, Any] | None = None,
                                extra_ood: tuple[str, ...] = ()) -> dict[str, Any]:
    """Evaluate the members in `dirs` as one model on the test, validation and OOD sets (an
    ensemble's mean probabilities are calibrated by temperature scaling); write the results
    (JSON, table, predictions.npz, plots) into `ensemble_dir`."""
    members = restore_members(dirs, overrides)
    exp = members[0].experiment
    ood_sets = dict(exp.data.ood)
    for name in extra_ood:
        ood_sets[name] = experiment.load_ood_set(exp.config, name, exp.data.train)
    id_pred = combine([workdir.predict(m, exp.data.test) for m in members])
    # Members trained on different train/validation splits (seeds seed*N + m) have no
    # validation split that none of them trained on: no conformal sets / calibration then.
    shared = all(np.array_equal(m.experiment.data.train_index, exp.data.train_index)
                 for m in members)
    val_pred = (combine([workdir.predict(m, exp.data.validation) for m in members])
                if shared else None)
    ood_preds = {name: combine([workdir.predict(m, split, with_labels=False) for m in members])
                 for name, split in ood_sets.items()}
    options = workdir.evaluation_options(exp, ood_preds)
    options = dataclasses.replace(options, calibrate=options.calibrate and shared,
                                  calibrator="temperature", base_rate=None)
    results = core.evaluate_predictions(id_pred, ood_preds, validation=val_pred,
                                        options=options)
    results.update({"variant": config.variant,
                    "method": f"deep ensemble of {len(members)} x {exp.method.describe()}",
                    "score_captions": {},   # probabilities averaged: no precision score
                    "dataset": config.dataset, "seed": int(config.seed),
                    "ensemble_members": [str(d) for d in dirs],
                    "workdir": str(ensemble_dir)})
    return workdir.write_results(results, pathlib.Path(ensemble_dir), id_pred, ood_preds,
                                 config.plots, validation=val_pred)
