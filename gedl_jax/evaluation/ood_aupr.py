"""OpenOOD-style AUPR: the trapezoidal area under the precision-recall curve, as an option.

The project's AUPR (``evaluation.metrics.average_precision``, the paper's and the I-EDL / R-EDL
code's) is *average precision*, the step-wise sum sum_n (R_n - R_{n-1}) P_n over the distinct
thresholds. OpenOOD (v1.5, ``openood/evaluators/metrics.py``) reports instead

    precision, recall, _ = sklearn.metrics.precision_recall_curve(is_positive, score)
    aupr = sklearn.metrics.auc(recall, precision)

i.e. the **trapezoidal** area through the curve's points, which include sklearn's extra end
point (recall 0, precision 1). Each recall step therefore counts the mean of the precisions at its
two ends, (R_n - R_{n-1}) (P_n + P_{n-1}) / 2 with (R_0, P_0) = (0, 1): never below average
precision at the first step, and generally different (the tests give a hand example). OpenOOD's
"AUPR-In" takes in-distribution as positive with the confidence as given; its "AUPR-Out" takes
OOD as positive with 1 - confidence (here the negated score, which orders identically).

NumPy only (the same distinct-threshold curve as sklearn's ``_binary_clf_curve``; scikit-learn is
the tests' oracle). Points after full recall (which older sklearn versions dropped) add zero
area, so the value does not depend on the sklearn version.

>>> import numpy as np
>>> aupr_trapezoidal(np.array([0.9, 0.7]), np.array([0.8]))  # average precision: 5/6
0.7916666666666666
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from gedl_jax.evaluation import checks

__all__ = ["AUPR_TRAPEZOIDAL_HEADER", "aupr_trapezoidal", "ood_aupr_trapezoidal",
           "trapezoidal_pr_area"]

# The column name to show in a table header.
AUPR_TRAPEZOIDAL_HEADER = "AUPR (trapezoidal, OpenOOD)"


def _scores(x: Any, name: str) -> np.ndarray:
    return checks.real_numbers(checks.nonempty(checks.vector(x, name), name), name)


def trapezoidal_pr_area(is_positive_N: Any, scores_N: Any) -> float:
    """sklearn.metrics.auc(recall, precision) of sklearn.metrics.precision_recall_curve(
    is_positive_N, scores_N): the trapezoidal PR area, higher score = more likely positive.
    Without positives: NaN and a RuntimeWarning.

    >>> trapezoidal_pr_area(np.array([True, False]), np.array([1.0, 0.0]))
    1.0
    """
    is_positive_N, scores_N = checks.pair(is_positive_N, scores_N, "is_positive_N", "scores_N")
    is_positive_N = checks.binary(is_positive_N, "is_positive_N")
    scores_N = _scores(scores_N, "scores_N")
    if not is_positive_N.any():
        warnings.warn("the PR area is undefined without positive examples; returning NaN.",
                      RuntimeWarning, stacklevel=2)
        return float("nan")
    order = np.argsort(-scores_N, kind="stable")
    s, pos = scores_N[order], is_positive_N[order]
    last_of_run = np.r_[np.flatnonzero(s[1:] != s[:-1]), s.size - 1]   # tied scores: one point
    tps = np.cumsum(pos, dtype=np.float64)[last_of_run]
    precision = np.r_[1.0, tps / (last_of_run + 1)]
    recall = np.r_[0.0, tps / tps[-1]]
    return float(np.sum(np.diff(recall) * (precision[1:] + precision[:-1]) / 2.0))


def aupr_trapezoidal(id_scores_N: Any, ood_scores_M: Any, positive: str = "in") -> float:
    """OpenOOD's AUPR of an OOD-detection score (higher = more in-distribution).

    Args:
      id_scores_N, ood_scores_M: the score on the in-distribution and the OOD examples.
      positive: "in" (AUPR-In: ID positive, the score as given) or "out" (AUPR-Out: OOD
        positive, the negated score).

    Returns:
      The trapezoidal PR area (``trapezoidal_pr_area``), a fraction in [0, 1].
    """
    checks.one_of(positive, ("in", "out"), "positive")
    id_scores_N = _scores(id_scores_N, "id_scores_N")
    ood_scores_M = _scores(ood_scores_M, "ood_scores_M")
    scores = np.r_[id_scores_N, ood_scores_M]
    is_id = np.r_[np.ones(id_scores_N.size, bool), np.zeros(ood_scores_M.size, bool)]
    if positive == "in":
        return trapezoidal_pr_area(is_id, scores)
    return trapezoidal_pr_area(~is_id, -scores)


def ood_aupr_trapezoidal(id_scores_N: Any, ood_scores_M: Any) -> dict[str, float]:
    """{"aupr_in_trapezoidal", "aupr_out_trapezoidal"}: both of OpenOOD's AUPRs, beside the
    default average-precision "aupr_in" / "aupr_out" of ``evaluation.metrics.ood_detection``."""
    return {"aupr_in_trapezoidal": aupr_trapezoidal(id_scores_N, ood_scores_M, "in"),
            "aupr_out_trapezoidal": aupr_trapezoidal(id_scores_N, ood_scores_M, "out")}
