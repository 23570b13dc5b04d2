"""Post-hoc calibration fitted on a validation split only, then applied to test / OOD outputs.

Every calibrator is a pair of pure functions: ``fit_*`` takes *validation* arrays (with their
labels) and returns a small frozen fit; ``apply_*`` takes the fit and any other arrays (test, OOD)
and no labels. A fit therefore cannot see test data unless the caller hands test arrays to it.
Everything is float64 NumPy; the 1-D search is scipy's bounded Brent.

Temperature scaling (Guo et al., 2017), for categorical predictions
--------------------------------------------------------------------
p = softmax(z / T) with one T > 0 minimising the validation NLL, -1/N sum_i log p_{i, y_i}. The
NLL is convex in 1/T (log-sum-exp is convex, the label term linear), hence unimodal in log T,
and T is searched on log T in [log T_min, log T_max] (default T in [0.01, 100]). T rescales every
logit of an example by the same factor, so the argmax (predicted class) never changes.
Where a method exposes only probabilities, its log-probabilities serve as logits
(``probs_as_logits``: z = log max(p, tiny)): softmax(log p / T) = p^(1/T) / sum_k p_k^(1/T),
the probabilities raised to 1/T and renormalised (exactly temperature scaling of any logits that
produced p, since softmax is invariant to a per-example shift of the logits).

Calibrating a Dirichlet (evidential) output: choice and why
-----------------------------------------------------------
The EDL family predicts alpha = e + W a (evidence e >= 0, prior strength W per example, base
rate a on the simplex; EDL: W = K, a = 1/K so alpha = e + 1), predictive mean p = alpha / S with
S = E + W, E = sum_k e_k, and uncertainty mass u = W / S. Two one-parameter calibrators were
considered:

1. A temperature on the pre-activation logits, e = act(z / T). For an increasing activation
   (softplus, exp, ReLU up to ties at 0) the argmax of e, hence of p for a uniform base rate, is
   unchanged; but E = sum_k act(z_k / T) is a different function of z for every T, and the order
   of two examples by E (hence by u) can swap: with act = exp, logits (2, 2) and (3, 0) have
   E = 14.8 < 21.1 at T = 1 but 3.30 > 3.12 at T = 4. It also needs the logits and the
   activation, which the saved predictions do not carry.
2. **One scale s > 0 on the evidence**, e -> s e, alpha(s) = s e + W a, S(s) = s E + W. This is
   what is implemented (``fit_evidence_scale`` / ``apply_evidence_scale``). s changes S and
   so both the calibration of p and the uncertainty mass (s < 1 moves every p toward the base
   rate and raises u), but:
   * u(s) = W / (s E + W) = 1 / (1 + s E / W) is a decreasing function of E / W with the same s
     for every example, so the **ranking by u (the "UM" OOD score) is exactly preserved**, and
     so are AUROC / AUPR / FPR95 of UM;
   * with a uniform base rate the argmax of s e_k + W / K is the argmax of e_k: the **predicted
     class is preserved** (accuracy unchanged). With a non-uniform base rate it can change, for
     s moves p between e / E and a;
   * the ranking by max_k p_k ("MP") is not guaranteed to be preserved when W differs between
     examples (GEDL): p_max(s) = (s e_max + W a_max) / (s E + W) moves at a rate that depends on
     W and E. With a fixed W and a uniform base rate it is not guaranteed either (two examples
     with different E cross).
   It needs only (e, W, a), which every EDL-family output carries (e = alpha - W a), works for
   any activation, and for act = exp it is a shift of the logits by log s.
   s is fitted to minimise the validation NLL of p(s). That NLL need not be unimodal in log s
   (p_y(s) = (s e_y + W a_y) / (s E + W) rises or falls with s per example), so the search is a
   grid over log s followed by a bounded Brent refinement around the best grid point.

The small ``calibration_summary`` (NLL, Brier, 15-bin ECE, accuracy) follows the conventions of
``evaluation.metrics`` (top-label ECE on (lower, upper] bins; NLL with p clipped at float64 eps;
squared multi-class Brier) without importing it; the tests check they agree.

>>> import numpy as np
>>> logits = np.array([[2.0, 0.0], [0.0, 2.0], [2.0, 0.0], [2.0, 0.0]])
>>> fit = fit_temperature(logits, np.array([0, 1, 0, 1]))  # 1 error in 4: softer than T = 1
>>> bool(fit.temperature > 1.0), bool(fit.nll_after < fit.nll_before)
(True, True)
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy import optimize, special

__all__ = ["EvidenceScaleFit", "TemperatureFit", "apply_evidence_scale", "apply_temperature",
           "calibration_summary", "evidence_from_alpha", "fit_evidence_scale", "fit_temperature",
           "probs_as_logits"]

_TINY = float(np.finfo(np.float64).tiny)   # log(_TINY) = -708.4, finite
_EPS = float(np.finfo(np.float64).eps)     # NLL clipping, as gedl_jax.evaluation.metrics.nll


@dataclasses.dataclass(frozen=True)
class TemperatureFit:
    """A fitted temperature: p = softmax(logits / temperature).

    nll_before / nll_after: validation NLL at T = 1 and at the fitted T; num_examples: the
    validation size; at_bound: True when the optimum lies on the search bound (widen it)."""

    temperature: float
    nll_before: float
    nll_after: float
    num_examples: int
    at_bound: bool = False


@dataclasses.dataclass(frozen=True)
class EvidenceScaleFit:
    """A fitted evidence scale: alpha = scale * e + W a.

    nll_before / nll_after: validation NLL of alpha / S at scale 1 and at the fitted scale."""

    scale: float
    nll_before: float
    nll_after: float
    num_examples: int
    at_bound: bool = False


# ------------------------------------------------------------------------------------- inputs
def _matrix(x: Any, name: str) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] < 2:
        raise ValueError(f"{name} must have shape (N, K) with K >= 2, got {x.shape}.")
    if x.shape[0] == 0:
        raise ValueError(f"{name} has no examples.")
    return x


def _labels(labels_N: Any, n: int, k: int) -> np.ndarray:
    labels_N = np.asarray(labels_N)
    if labels_N.shape != (n,) or not np.issubdtype(labels_N.dtype, np.integer):
        raise ValueError(f"labels_N must be integer class indices of shape ({n},), got dtype "
                         f"{labels_N.dtype} and shape {labels_N.shape}.")
    if labels_N.min() < 0 or labels_N.max() >= k:
        raise ValueError(f"labels_N must lie in [0, {k}).")
    return labels_N.astype(np.int64)


def _finite_logits(logits_NxK: Any) -> np.ndarray:
    logits = _matrix(logits_NxK, "logits_NxK")
    if not np.all(np.isfinite(logits)):
        raise ValueError("logits_NxK must be finite (for probabilities use probs_as_logits).")
    return logits


def _check_temperature(t: float, name: str = "temperature") -> float:
    t = float(t)
    if not (math.isfinite(t) and t > 0):
        raise ValueError(f"{name} must be finite and > 0, got {t}.")
    return t


def _minimise_log_scalar(objective: Callable[[float], float], lo: float, hi: float,
                         grid: int) -> tuple[float, bool]:
    """argmin over x in [lo, hi] (x > 0) of objective(x), searched on log x: a grid of `grid`
    points, then a bounded Brent search between the best grid point's neighbours. Returns
    (x, whether x is at a bound)."""
    if not 0 < lo < hi:
        raise ValueError(f"bounds must satisfy 0 < lower < upper, got ({lo}, {hi}).")
    log_grid = np.linspace(math.log(lo), math.log(hi), grid)
    values = np.array([objective(math.exp(v)) for v in log_grid])
    best = int(np.argmin(values))
    a, b = log_grid[max(best - 1, 0)], log_grid[min(best + 1, grid - 1)]
    res = optimize.minimize_scalar(lambda v: objective(math.exp(v)), bounds=(a, b),
                                   method="bounded", options={"xatol": 1e-10})
    if best in (0, grid - 1) and not res.fun < values[best]:
        return math.exp(log_grid[best]), True   # the minimum is (numerically) on a bound
    log_x = float(res.x) if res.fun <= values[best] else float(log_grid[best])
    step = log_grid[1] - log_grid[0]
    at_bound = min(log_x - log_grid[0], log_grid[-1] - log_x) < 1e-3 * step
    return math.exp(log_x), bool(at_bound)


def _warn_bound(kind: str, value: float, lo: float, hi: float) -> None:
    warnings.warn(f"the fitted {kind} {value:.4g} lies on the search bound [{lo:g}, {hi:g}]; "
                  "widen the bounds (or check the validation outputs).", RuntimeWarning,
                  stacklevel=3)


# ------------------------------------------------------------------------ temperature scaling
def probs_as_logits(probs_NxK: Any) -> np.ndarray:
    """log max(p, tiny): logits of given probabilities (softmax(probs_as_logits(p)) = p up to the
    clipping of exact zeros to ~1e-308), for temperature scaling of a method without logits.

    >>> np.round(probs_as_logits(np.array([[0.5, 0.5]])), 4).tolist()
    [[-0.6931, -0.6931]]
    """
    probs = _matrix(probs_NxK, "probs_NxK")
    if not np.all(np.isfinite(probs)) or probs.min() < 0:
        raise ValueError("probs_NxK must be finite and >= 0.")
    return np.log(np.maximum(probs, _TINY))


def _log_softmax(z_NxK: np.ndarray) -> np.ndarray:
    return z_NxK - special.logsumexp(z_NxK, axis=1, keepdims=True)


def _temperature_nll(logits: np.ndarray, labels: np.ndarray, t: float) -> float:
    return float(-np.mean(_log_softmax(logits / t)[np.arange(labels.size), labels]))


def fit_temperature(logits_NxK: Any, labels_N: Any, *,
                    bounds: tuple[float, float] = (0.01, 100.0)) -> TemperatureFit:
    """Fits T > 0 minimising the NLL of softmax(logits / T) on **validation** data.

    Args:
      logits_NxK: validation logits (or ``probs_as_logits(probs)``), finite.
      labels_N: validation labels, integer class indices.
      bounds: the search interval of T (searched on log T).

    Returns:
      ``TemperatureFit``; a RuntimeWarning if T lies on a bound.

    >>> z = np.array([[4.0, 0.0], [0.0, 4.0], [4.0, 0.0], [4.0, 0.0]])
    >>> round(fit_temperature(z, np.array([0, 1, 0, 1])).temperature, 4)  # p = 3/4 at T = 3.641
    3.641
    """
    logits = _finite_logits(logits_NxK)
    labels = _labels(labels_N, *logits.shape)
    lo, hi = (_check_temperature(b, "bounds") for b in bounds)
    t, at_bound = _minimise_log_scalar(lambda x: _temperature_nll(logits, labels, x), lo, hi,
                                       grid=33)
    if at_bound:
        _warn_bound("temperature", t, lo, hi)
    return TemperatureFit(temperature=t, nll_before=_temperature_nll(logits, labels, 1.0),
                          nll_after=_temperature_nll(logits, labels, t),
                          num_examples=int(labels.size), at_bound=at_bound)


def apply_temperature(logits_NxK: Any, temperature: float | TemperatureFit) -> np.ndarray:
    """softmax(logits / T), (N, K) float64, for any (test, OOD) logits; no labels involved.

    >>> apply_temperature(np.array([[np.log(3.0), 0.0]]), 1.0).round(4).tolist()
    [[0.75, 0.25]]
    """
    t = temperature.temperature if isinstance(temperature, TemperatureFit) else temperature
    t = _check_temperature(t)
    return np.exp(_log_softmax(_finite_logits(logits_NxK) / t))


# ---------------------------------------------------------------------------- evidence scaling
def _base_rate(base_rate_K: Any, k: int) -> np.ndarray:
    if base_rate_K is None:
        return np.full(k, 1.0 / k)
    a = np.asarray(base_rate_K, dtype=np.float64)
    if a.shape != (k,) or not np.all(np.isfinite(a)) or a.min() <= 0 or abs(a.sum() - 1) > 1e-6:
        raise ValueError(f"base_rate_K must be ({k},) positive and sum to 1, got {a}.")
    return a


def _evidence_inputs(evidence_NxK: Any, prior_strength_N: Any, base_rate_K: Any
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    e = _matrix(evidence_NxK, "evidence_NxK")
    if not np.all(np.isfinite(e)) or e.min() < 0:
        raise ValueError("evidence_NxK must be finite and >= 0.")
    w = np.asarray(prior_strength_N, dtype=np.float64)
    if w.ndim == 0:
        w = np.full(e.shape[0], float(w))
    if w.shape != (e.shape[0],) or not np.all(np.isfinite(w)) or w.min() <= 0:
        raise ValueError(f"prior_strength_N must be finite, > 0, of shape ({e.shape[0]},) or a "
                         f"scalar, got shape {w.shape}.")
    return e, w, _base_rate(base_rate_K, e.shape[1])


def evidence_from_alpha(alpha_NxK: Any, prior_strength_N: Any, base_rate_K: Any = None
                        ) -> np.ndarray:
    """e = alpha - W a (clipped at 0 against rounding), for outputs of the EDL family where
    alpha = e + W a (not for Prior Networks / PostNet, whose alpha has no such split).

    >>> evidence_from_alpha(np.array([[5.0, 1.0]]), 2.0).tolist()
    [[4.0, 0.0]]
    """
    alpha = _matrix(alpha_NxK, "alpha_NxK")
    w = np.asarray(prior_strength_N, dtype=np.float64)
    w = np.full(alpha.shape[0], float(w)) if w.ndim == 0 else w
    if w.shape != (alpha.shape[0],):
        raise ValueError(f"prior_strength_N must be a scalar or of shape ({alpha.shape[0]},).")
    return np.maximum(alpha - w[:, None] * _base_rate(base_rate_K, alpha.shape[1])[None, :], 0.0)


def apply_evidence_scale(evidence_NxK: Any, prior_strength_N: Any,
                         scale: float | EvidenceScaleFit, base_rate_K: Any = None) -> np.ndarray:
    """alpha = scale * e + W a, (N, K) float64 (then p = alpha / S, u = W / S as usual).

    >>> apply_evidence_scale(np.array([[4.0, 0.0]]), 2.0, 0.5).tolist()
    [[3.0, 1.0]]
    """
    s = scale.scale if isinstance(scale, EvidenceScaleFit) else scale
    s = _check_temperature(s, "scale")
    e, w, a = _evidence_inputs(evidence_NxK, prior_strength_N, base_rate_K)
    return s * e + w[:, None] * a[None, :]


def _evidence_nll(e_y: np.ndarray, e_sum: np.ndarray, prior_y: np.ndarray, w: np.ndarray,
                  s: float) -> float:
    p_y = (s * e_y + prior_y) / (s * e_sum + w)
    return float(-np.mean(np.log(np.clip(p_y, _EPS, 1.0))))


def fit_evidence_scale(evidence_NxK: Any, prior_strength_N: Any, labels_N: Any,
                       base_rate_K: Any = None, *,
                       bounds: tuple[float, float] = (1e-3, 1e3)) -> EvidenceScaleFit:
    """Fits s > 0 minimising the NLL of the predictive mean (s e + W a) / (s E + W) on
    **validation** data (module docstring: why a scale on the evidence).

    Args:
      evidence_NxK: validation evidence e >= 0 (``evidence_from_alpha`` recovers it from alpha).
      prior_strength_N: W per example (or a scalar).
      labels_N: validation labels.
      base_rate_K: a, (K,) on the simplex; None = uniform 1/K.
      bounds: the search interval of s (searched on log s).

    Returns:
      ``EvidenceScaleFit``; a RuntimeWarning if s lies on a bound.

    >>> e = np.array([[9.0, 0.0], [0.0, 9.0], [9.0, 0.0], [9.0, 0.0]])  # p = 10/11, 1 error in 4
    >>> fit = fit_evidence_scale(e, 2.0, np.array([0, 1, 0, 1]))
    >>> round(fit.scale, 4), bool(fit.nll_after < fit.nll_before)  # p = 3/4: s = 2/9
    (0.2222, True)
    """
    e, w, a = _evidence_inputs(evidence_NxK, prior_strength_N, base_rate_K)
    labels = _labels(labels_N, *e.shape)
    rows = np.arange(labels.size)
    e_y, e_sum, prior_y = e[rows, labels], e.sum(axis=1), w * a[labels]
    lo, hi = (_check_temperature(b, "bounds") for b in bounds)
    s, at_bound = _minimise_log_scalar(lambda x: _evidence_nll(e_y, e_sum, prior_y, w, x), lo,
                                       hi, grid=61)
    if at_bound:
        _warn_bound("evidence scale", s, lo, hi)
    return EvidenceScaleFit(scale=s, nll_before=_evidence_nll(e_y, e_sum, prior_y, w, 1.0),
                            nll_after=_evidence_nll(e_y, e_sum, prior_y, w, s),
                            num_examples=int(labels.size), at_bound=at_bound)


# ------------------------------------------------------------------------------------ summary
def calibration_summary(probs_NxK: Any, labels_N: Any, num_bins: int = 15) -> dict[str, float]:
    """{"accuracy", "nll", "brier", "ece"} of probabilities, with the conventions of
    ``gedl_jax.evaluation.metrics``: NLL with p_y clipped to [eps, 1 - eps]; Brier = mean_i sum_k
    (p_ik - y_ik)^2; ECE = top-label, ``num_bins`` equal-width bins (lower, upper].

    >>> calibration_summary(np.array([[0.75, 0.25], [0.75, 0.25]]), np.array([0, 1]))["ece"]
    0.25
    """
    p = _matrix(probs_NxK, "probs_NxK")
    if not np.all(np.isfinite(p)) or p.min() < 0 or np.abs(p.sum(1) - 1).max() > 1e-4:
        raise ValueError("probs_NxK rows must be finite probabilities summing to 1.")
    labels = _labels(labels_N, *p.shape)
    n = labels.size
    rows = np.arange(n)
    conf = np.clip(p.max(axis=1), 0.0, 1.0)
    correct = (np.argmax(p, axis=1) == labels).astype(np.float64)
    edges = np.linspace(0.0, 1.0, num_bins + 1)
    bins = np.clip(np.searchsorted(edges, conf, side="left") - 1, 0, num_bins - 1)
    count = np.bincount(bins, minlength=num_bins)
    gap = np.abs(np.bincount(bins, weights=conf, minlength=num_bins)
                 - np.bincount(bins, weights=correct, minlength=num_bins))
    onehot = np.eye(p.shape[1])[labels]
    return {"accuracy": float(correct.mean()),
            "nll": float(-np.mean(np.log(np.clip(p[rows, labels], _EPS, 1.0 - _EPS)))),
            "brier": float(np.mean(np.sum((p - onehot) ** 2, axis=1))),
            "ece": float(np.sum(gap[count > 0]) / n)}
