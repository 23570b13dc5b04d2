"""The result sections beyond the paper's columns, each a pure function of arrays (NumPy float64).

``evaluate_predictions`` (``core``) assembles them into the results dict; they are public so the
same numbers can be recomputed from saved per-example outputs (``predictions.npz``):

* ``selective_section``: selective-prediction metrics (``selective.selective_metrics``) of every
  confidence score on the in-distribution test set, correct = (argmax p == label).
* ``conformal_section``: split-conformal sets (LAC, APS, RAPS; ``conformal.conformal_metrics``)
  calibrated on the validation split, coverage and set size on the test split.
* ``group_means``: the unweighted mean of every detection metric over the OOD sets of each
  group ("near" / "far", the OpenOOD protocol; ``data.OOD_GROUPS`` declares them per dataset,
  ``config.ood_groups`` a user's sets).
* ``trapezoidal_detection``: OpenOOD's trapezoidal AUPR-in / AUPR-out (``ood_aupr``).
* ``ranking_changes``: whether post-hoc calibration changed a score's OOD ranking.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats

from gedl_jax.data.registry import OOD_GROUP_NAMES
from gedl_jax.evaluation import conformal, metrics, ood_aupr, selective

__all__ = ["GROUPS", "conformal_section", "group_means", "ranking_changes", "selective_section",
           "trapezoidal_detection"]

GROUPS: tuple[str, ...] = OOD_GROUP_NAMES


def selective_section(correct_N: np.ndarray, scores: Mapping[str, np.ndarray],
                      names: Sequence[str]) -> dict[str, dict[str, float]]:
    """{score: selective_metrics(correct_N, scores[score])} for each name in `names`."""
    return {s: selective.selective_metrics(correct_N, scores[s]) for s in names}


def scod_section(correct_N: np.ndarray, id_scores: Mapping[str, np.ndarray],
                 ood_scores: Mapping[str, np.ndarray], names: Sequence[str]
                 ) -> dict[str, dict[str, float]]:
    """{score: scod_metrics(...)}: selective prediction over the pool of the test set and one
    OOD set, an accepted OOD input counting as an error (`selective.scod_pool`). Risk at
    coverages `SCOD_COVERAGES`: an OOD set as large as the test set is half the pool, so only
    coverages up to about one half can hold no OOD input."""
    return {s: selective.scod_metrics(correct_N, id_scores[s], ood_scores[s], SCOD_COVERAGES)
            for s in names}


SCOD_COVERAGES = (0.25, 0.5, 0.8)


def posthoc_section(correct_N: np.ndarray, id_scores: Mapping[str, np.ndarray],
                    ood_scores: Mapping[str, Mapping[str, np.ndarray]],
                    settings: Mapping[str, Any]) -> dict[str, Any]:
    """The post-hoc OOD scores' results ("posthoc"): for each score (`id_scores`' names, in
    their order), misclassification detection and selective prediction on the test set, and
    for each OOD set its detection and SCOD metrics, as the method's own scores get them;
    `settings`: what the scores were computed with (temperature, k, D, the fit's split)."""
    names = list(id_scores)
    return {
        "scores": names, "settings": dict(settings),
        "misclassification": {s: metrics.misclassification_detection(correct_N, id_scores[s])
                              for s in names},
        "selective": selective_section(correct_N, id_scores, names),
        "ood": {o: {"detection": {s: metrics.ood_detection(id_scores[s], scores[s])
                                  for s in names},
                    "scod": scod_section(correct_N, id_scores, scores, names)}
                for o, scores in ood_scores.items()},
    }


def conformal_section(val_probs_NxK: np.ndarray, val_labels_N: np.ndarray,
                      test_probs_MxK: np.ndarray, test_labels_M: np.ndarray, alpha: float,
                      seed: int) -> dict[str, Any]:
    """{"alpha", "seed", "sets": conformal_metrics(...)}: LAC, APS, RAPS (APS and RAPS
    randomized with `seed`) and APS non-randomized, calibrated on the validation split."""
    return {"alpha": float(alpha), "seed": int(seed),
            "sets": conformal.conformal_metrics(val_probs_NxK, val_labels_N, test_probs_MxK,
                                                test_labels_M, alpha, seed=seed)}


def group_means(ood: Mapping[str, Mapping[str, Any]], groups: Mapping[str, str],
                scores: Sequence[str]) -> dict[str, dict[str, Any]]:
    """{group: {"sets": [...], "detection": {score: {metric: unweighted mean over the sets}}}}
    for each group that has at least one of the evaluated OOD sets (`groups`: {set: group}).

    A metric that is undefined (None) for some set of the group makes the group's mean None."""
    out = {}
    for group in GROUPS:
        sets = [name for name in ood if groups.get(name) == group]
        if not sets:
            continue
        detection = {}
        for s in scores:
            keys = list(ood[sets[0]]["detection"][s])
            detection[s] = {}
            for k in keys:
                values = [ood[name]["detection"][s][k] for name in sets]
                detection[s][k] = (None if any(v is None or not np.isfinite(v) for v in values)
                                   else float(np.mean(values)))
        out[group] = {"sets": sets, "detection": detection}
    return out


def trapezoidal_detection(id_scores_N: np.ndarray, ood_scores_M: np.ndarray) -> dict[str, float]:
    """OpenOOD's AUPR (trapezoidal area), in-distribution and OOD positive."""
    return ood_aupr.ood_aupr_trapezoidal(id_scores_N, ood_scores_M)


def ranking_changes(id_before: Mapping[str, np.ndarray], ood_before: Mapping[str, Mapping],
                    id_after: Mapping[str, np.ndarray], ood_after: Mapping[str, Mapping],
                    scores: Sequence[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """{score: {set: {"auroc_before", "auroc_after", "aupr_in_before", "aupr_in_after",
    "ranking_changed"}}}: "ranking_changed" is whether the ranks (ties averaged) of the pooled
    in-distribution and OOD scores differ after calibration at any position."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for s in scores:
        out[s] = {}
        for name in ood_before:
            before = metrics.ood_detection(id_before[s], ood_before[name][s])
            after = metrics.ood_detection(id_after[s], ood_after[name][s])
            pooled_before = np.concatenate([id_before[s], ood_before[name][s]])
            pooled_after = np.concatenate([id_after[s], ood_after[name][s]])
            changed = not np.array_equal(stats.rankdata(pooled_before),
                                         stats.rankdata(pooled_after))
            out[s][name] = {"auroc_before": before["auroc"], "auroc_after": after["auroc"],
                            "aupr_in_before": before["aupr_in"],
                            "aupr_in_after": after["aupr_in"], "ranking_changed": changed}
    return out
