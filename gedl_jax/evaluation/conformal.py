"""Split conformal prediction sets for classification, calibrated on a held-out split.

Given predictive probabilities p(x) (any method: softmax, alpha/S, an ensemble mean), a
*non-conformity score* E(x, y) (higher = less conforming) is computed for the true label of each
of the n calibration (validation) examples; the threshold is

  q_hat = the k-th smallest calibration score,  k = ceil((n + 1)(1 - alpha)),

i.e. the empirical quantile at level k/n with the inverted-CDF ("higher", no interpolation)
rule: ``np.quantile(scores, k / n, method="inverted_cdf")``. (k > n gives q_hat = +inf: every
label.) The prediction set of a test example is {y : E(x, y) <= q_hat}. For exchangeable
calibration and test data, P(y in set) >= k / (n + 1) >= 1 - alpha (Vovk et al. 2005; Angelopoulos
& Bates 2021, whose ``np.quantile(..., ceil((n+1)(1-alpha))/n, method="higher")`` with numpy's
default (n - 1) q index picks the (k+1)-th smallest score for k < n, a slightly more conservative
threshold). With continuous scores, the coverage conditional on the calibration set is
Beta(k, n + 1 - k)-distributed (the tests check this).

Scores (o(y) = rank of y when the labels are sorted by decreasing p, 1 = most likely, ties broken
by the lower class index; rho(y) = sum of p over the labels ranked before y; u ~ U(0, 1), one per
example and shared by its labels):

  "lac" (a.k.a. THR, Sadinle et al. 2019):  E = 1 - p_y.  Smallest average sets for a
        well-specified model; may be empty.
  "aps" (Romano et al. 2020):  E = rho(y) + u p_y  (randomized, the default), or
        E = rho(y) + p_y  (``randomized=False``: the cumulative mass up to and including y).
  "raps" (Angelopoulos et al. 2021):  E = rho(y) + u p_y + lam (o(y) - k_reg)^+, randomized as in
        the paper (``randomized=False`` uses p_y instead of u p_y); defaults lam = 0.01,
        k_reg = 1.

Randomization is seeded: calibration draws u from ``np.random.default_rng([seed, 0])`` and
prediction from ``np.random.default_rng([seed, 1])`` unless a ``u_N`` is given. Sets may be
empty (the exact split-conformal sets; the RAPS paper's code adds the top label by default).

Conventions, in the terms of other libraries (tests/test_conformal.py checks them against
MAPIE 1.6):
- LAC is MAPIE's ``conformity_score="lac"``: the same q_hat (its "lower" quantile at level
  ceil((n + 1)(1 - alpha)) / n) and the same sets.
- APS (and RAPS) is *randomized* by default, Romano et al.'s randomized sets: the labels in
  rank order up to the first whose cumulative mass reaches q_hat, that crossing label kept
  only when rho(y) + u p_y <= q_hat, and calibration scored the same way. That is MAPIE's
  ``include_last_label="randomized"`` with u = 1 - U for its uniforms U (it scores
  calibration examples as cumsum - U p_y and drops the last label when U < V = (cumsum -
  q_hat) / p_last); fed the same draws, the sets are equal. It is not MAPIE's default
  ``include_last_label=True``, which always keeps the crossing label (our sets with u = 0)
  and so covers more than 1 - alpha.
- ``randomized=False`` (u = 1; ``aps_nonrandomized`` in a run's results): calibration and
  prediction both use the cumulative mass up to and including y, so the crossing label is
  left out unless its cumulative mass is exactly q_hat (MAPIE's ``include_last_label=False``
  sets, though MAPIE calibrates that option on randomized scores).

>>> import numpy as np
>>> cal_probs = np.array([[0.875, 0.125], [0.625, 0.375], [0.25, 0.75], [0.75, 0.25]])
>>> c = calibrate(cal_probs, np.array([0, 1, 1, 0]), "lac", alpha=0.4)  # k = ceil(5 * 0.6) = 3
>>> c.threshold  # the 3rd smallest of 1 - p_y: 0.125, 0.25, 0.25, 0.625
0.25
>>> prediction_sets(c, np.array([[0.75, 0.25], [0.5, 0.5]])).tolist()
[[True, False], [False, False]]
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from gedl_jax.evaluation import checks

__all__ = ["METHODS", "ConformalCalibration", "calibrate", "conformal_metrics",
           "conformal_quantile", "nonconformity_scores", "prediction_sets", "set_metrics"]

METHODS: tuple[str, ...] = ("lac", "aps", "raps")


@dataclasses.dataclass(frozen=True)
class ConformalCalibration:
    """A calibrated conformal predictor: the threshold and the score it applies to.

    threshold: q_hat (+inf when the calibration set is too small for alpha); num_calibration: n;
    rank: k = ceil((n + 1)(1 - alpha)); the rest are the score's settings."""

    method: str
    alpha: float
    threshold: float
    num_calibration: int
    rank: int
    randomized: bool = True
    lam: float = 0.01
    k_reg: int = 1
    seed: int = 0


def nonconformity_scores(probs_NxK: Any, method: str = "lac", *, u_N: Any = None,
                         randomized: bool = True, lam: float = 0.01, k_reg: int = 1
                         ) -> np.ndarray:
    """E(x, y) for every example and every candidate label y, (N, K) float64 (module docstring).

    Args:
      probs_NxK: predictive probabilities.
      method: "lac", "aps" or "raps".
      u_N: (N,) uniforms in [0, 1] for the randomized APS / RAPS (required then; ignored
        otherwise).
      randomized: APS / RAPS with u p_y (True) or p_y (False).
      lam, k_reg: the RAPS penalty lam (o(y) - k_reg)^+.

    >>> nonconformity_scores(np.array([[0.2, 0.5, 0.3]]), "aps", randomized=False).tolist()
    [[1.0, 0.5, 0.8]]
    """
    checks.one_of(method, METHODS, "method")
    p = checks.distributions(probs_NxK, "probs_NxK")
    if method == "lac":
        return 1.0 - p
    n, k = p.shape
    order = np.argsort(-p, axis=1, kind="stable")          # labels by decreasing p
    sorted_p = np.take_along_axis(p, order, axis=1)
    # rho: the mass ranked strictly before (an exclusive cumulative sum, so rho + p_y is exactly
    # the inclusive one)
    before = np.concatenate([np.zeros((n, 1)), np.cumsum(sorted_p, axis=1)[:, :-1]], axis=1)
    if randomized:
        if u_N is None:
            raise ValueError(f"the randomized {method!r} score needs u_N (uniforms, one per "
                             "example).")
        u = np.asarray(u_N, dtype=np.float64)
        if u.shape != (n,) or not np.all((u >= 0) & (u <= 1)):
            raise ValueError(f"u_N must be ({n},) values in [0, 1].")
        sorted_scores = before + u[:, None] * sorted_p
    else:
        sorted_scores = before + sorted_p
    if method == "raps":
        if lam < 0 or int(k_reg) != k_reg or k_reg < 0:
            raise ValueError(f"RAPS needs lam >= 0 and an integer k_reg >= 0, got {lam}, "
                             f"{k_reg}.")
        rank = np.arange(1, k + 1, dtype=np.float64)
        sorted_scores = sorted_scores + lam * np.maximum(0.0, rank - k_reg)[None, :]
    scores = np.empty_like(sorted_scores)
    np.put_along_axis(scores, order, sorted_scores, axis=1)
    return scores


def conformal_quantile(calibration_scores_n: Any, alpha: float) -> tuple[float, int]:
    """(q_hat, k): the k-th smallest score, k = ceil((n + 1)(1 - alpha)); (+inf, k) if k > n.

    ceil is taken after subtracting 1e-9, so that an exact product such as 10 x 0.9 is not
    pushed to the next integer by rounding.

    >>> conformal_quantile([0.5, 0.1, 0.4, 0.3, 0.2], 0.2)  # k = ceil(6 * 0.8) = 5
    (0.5, 5)
    """
    s = np.asarray(calibration_scores_n, dtype=np.float64)
    if s.ndim != 1 or s.size == 0 or np.isnan(s).any():
        raise ValueError("calibration scores must be a non-empty NaN-free 1-D array.")
    alpha = checks.open_unit(alpha, "alpha")
    n = s.size
    k = int(math.ceil((n + 1) * (1.0 - alpha) - 1e-9))
    if k > n:
        return math.inf, k
    return float(np.partition(s, k - 1)[k - 1]), k


def calibrate(probs_NxK: Any, labels_N: Any, method: str = "lac", alpha: float = 0.1, *,
              randomized: bool = True, lam: float = 0.01, k_reg: int = 1, seed: int = 0,
              u_N: Any = None) -> ConformalCalibration:
    """Calibrates the threshold on a **calibration (validation) split**.

    Args:
      probs_NxK, labels_N: the calibration split's probabilities and labels.
      method: "lac", "aps" or "raps"; alpha: the miscoverage level (coverage >= 1 - alpha).
      randomized, lam, k_reg: the score's settings (``nonconformity_scores``).
      seed: seeds the calibration uniforms (``np.random.default_rng([seed, 0])``), and by
        default the prediction's (``[seed, 1]``).
      u_N: explicit calibration uniforms instead (tests).

    Returns:
      ``ConformalCalibration``.
    """
    checks.one_of(method, METHODS, "method")
    alpha = checks.open_unit(alpha, "alpha")
    p = checks.distributions(probs_NxK, "probs_NxK")
    labels = checks.class_labels(labels_N, *p.shape)
    checks.nonempty(p, "the calibration split's probs_NxK")
    uses_u = method != "lac" and randomized
    if uses_u and u_N is None:
        u_N = np.random.default_rng([seed, 0]).random(p.shape[0])
    scores = nonconformity_scores(p, method, u_N=u_N if uses_u else None, randomized=randomized,
                                  lam=lam, k_reg=k_reg)
    q, k = conformal_quantile(scores[np.arange(labels.size), labels], alpha)
    return ConformalCalibration(method=method, alpha=alpha, threshold=q,
                                num_calibration=int(labels.size), rank=k,
                                randomized=randomized, lam=float(lam), k_reg=int(k_reg),
                                seed=int(seed))


def prediction_sets(calibration: ConformalCalibration, probs_NxK: Any, *,
                    u_N: Any = None) -> np.ndarray:
    """The prediction sets {y : E(x, y) <= q_hat} of new (test) examples, (N, K) bool; no labels.

    Randomized scores draw u from ``np.random.default_rng([calibration.seed, 1])`` unless u_N is
    given.
    """
    c = calibration
    p = checks.distributions(probs_NxK, "probs_NxK")
    uses_u = c.method != "lac" and c.randomized
    if uses_u and u_N is None:
        u_N = np.random.default_rng([c.seed, 1]).random(p.shape[0])
    scores = nonconformity_scores(p, c.method, u_N=u_N if uses_u else None,
                                  randomized=c.randomized, lam=c.lam, k_reg=c.k_reg)
    return scores <= c.threshold


def set_metrics(sets_NxK: Any, labels_N: Any) -> dict[str, float]:
    """{"coverage": fraction of examples whose label is in its set, "mean_set_size",
    "empty_fraction"} of boolean prediction sets.

    >>> set_metrics(np.array([[True, True], [False, False]]), np.array([1, 0]))
    {'coverage': 0.5, 'mean_set_size': 1.0, 'empty_fraction': 0.5}
    """
    sets = np.asarray(sets_NxK)
    if sets.dtype != np.bool_ or sets.ndim != 2 or sets.shape[0] == 0:
        raise ValueError(f"sets_NxK must be a non-empty (N, K) bool array, got {sets.dtype} "
                         f"{sets.shape}.")
    labels = checks.class_labels(labels_N, *sets.shape)
    size = sets.sum(axis=1)
    return {"coverage": float(np.mean(sets[np.arange(labels.size), labels])),
            "mean_set_size": float(size.mean()),
            "empty_fraction": float(np.mean(size == 0))}


def conformal_metrics(calibration_probs_NxK: Any, calibration_labels_N: Any,
                      test_probs_MxK: Any, test_labels_M: Any, alpha: float = 0.1,
                      methods: Sequence[str] = METHODS, *, seed: int = 0,
                      lam: float = 0.01, k_reg: int = 1) -> dict[str, dict[str, float]]:
    """Calibrates every method on the calibration split and evaluates its sets on the test split.

    Returns:
      {method: {"alpha", "threshold", "num_calibration", "coverage", "mean_set_size",
      "empty_fraction"}} with "aps" and "raps" randomized, plus "aps_nonrandomized".
    """
    out: dict[str, dict[str, float]] = {}
    variants = [(m, True) for m in methods]
    if "aps" in methods:
        variants.append(("aps", False))
    for method, randomized in variants:
        c = calibrate(calibration_probs_NxK, calibration_labels_N, method, alpha,
                      randomized=randomized, lam=lam, k_reg=k_reg, seed=seed)
        name = method if randomized or method == "lac" else f"{method}_nonrandomized"
        out[name] = {"alpha": c.alpha, "threshold": c.threshold,
                     "num_calibration": c.num_calibration,
                     **set_metrics(prediction_sets(c, test_probs_MxK), test_labels_M)}
    return out
