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

More calibrators of categorical predictions, and which rankings they change
-----------------------------------------------------------------------------
* **Vector scaling** (Guo et al., 2017): p = softmax(z * w + b), w, b in R^K (``fit_vector_scaling``
  / ``apply_affine``). w = (1/T, ..., 1/T), b = 0 is temperature scaling. Unregularised.
* **Matrix scaling** (Guo et al., 2017): p = softmax(z W + b), W (K, K). With the off-diagonal
  and intercept L2 of Kull et al. (2019) ("ODIR"): the objective is NLL + lambda / (K (K - 1))
  sum_{i != j} W_ij^2 + mu / K sum_k b_k^2, default lambda = mu = 0.01 (the paper chooses them by
  cross-validation; pass your own). ``fit_matrix_scaling`` / ``apply_affine``.
* **Dirichlet calibration** (Kull et al., 2019): p = softmax(log(q) W + b), the same linear map
  with ODIR on the log-probabilities q (clipped at 1e-12) of a model that outputs probabilities
  (``fit_dirichlet_calibration`` / ``apply_dirichlet_calibration``). Implemented here from the
  paper's formula: the ``dirichletcal`` package (0.5.3, 2025) would add a dependency for one
  linear layer.
  These three start at the identity (W = I, b = 0) and minimise with scipy's L-BFGS-B with the
  exact gradient; the start has zero penalty, so the fitted validation NLL never exceeds the
  uncalibrated one.
* **Isotonic regression** (Zadrozny & Elkan, 2002), **one-vs-rest per class** as scikit-learn's
  ``CalibratedClassifierCV``: for each class k a non-decreasing step map g_k of p_k fitted to
  [y == k] (pool-adjacent-violators, tied p_k pooled first), interpolated linearly between its
  points and clipped outside them; then p'_k = g_k(p_k) / sum_j g_j(p_j) (uniform where every
  g_j is 0). ``fit_isotonic`` / ``apply_isotonic``.

Which keep a ranking: temperature scaling keeps the argmax, but with K > 2 classes not the order
of the examples by max_k p_k (the maximum of softmax(z / T) depends on every logit: logits
(2, 0, 0) and (3, 2.9, -100) have max probabilities 0.79 > 0.52 at T = 1 and 0.38 < 0.50 at
T = 10); the evidence scale keeps the argmax and the order by u (above). **Vector and matrix
scaling and Dirichlet calibration can change the predicted class** (a per-class weight or bias
moves the argmax) and the order of examples by any confidence score. **Isotonic regression
creates ties** (a step map sends whole intervals of p_k to one value) and, through the
renormalisation, can change both the argmax and the order by max_k p_k. Only the evidence
scale keeps the UM ranking; no categorical calibrator here touches a score that is not a
function of p (a precision's "um", DUQ's kernel, the post-hoc feature scores).

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

from gedl_jax.evaluation import checks, metrics

__all__ = ["AffineCalibrationFit", "EvidenceScaleFit", "IsotonicFit", "TemperatureFit",
           "apply_affine", "apply_dirichlet_calibration", "apply_evidence_scale",
           "apply_isotonic", "apply_temperature", "calibration_summary", "evidence_from_alpha",
           "fit_dirichlet_calibration", "fit_evidence_scale", "fit_isotonic",
           "fit_matrix_scaling", "fit_temperature", "fit_vector_scaling", "probs_as_logits"]

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
def _finite_logits(logits_NxK: Any) -> np.ndarray:
    logits = checks.matrix(logits_NxK, "logits_NxK", need_examples=True)
    if not np.all(np.isfinite(logits)):
        raise ValueError("logits_NxK must be finite (for probabilities use probs_as_logits).")
    return logits


def _unit_probabilities(x: Any, name: str) -> np.ndarray:
    """(N, K) probabilities in [0, 1], N >= 1, rows not necessarily normalised (one-vs-rest)."""
    return checks.probabilities(checks.matrix(x, name, need_examples=True), name,
                                rows_sum_to_one=False)


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


def _warn_bound(kind: str, value: float, lo: float, hi: float, meaning: str = "") -> None:
    warnings.warn(f"the fitted {kind} {value:.4g} lies on the search bound [{lo:g}, {hi:g}]"
                  f"{meaning}; widen the bounds (or check the validation outputs).",
                  RuntimeWarning, stacklevel=3)


# ------------------------------------------------------------------------ temperature scaling
def probs_as_logits(probs_NxK: Any) -> np.ndarray:
    """log max(p, tiny): logits of given probabilities (softmax(probs_as_logits(p)) = p up to the
    clipping of exact zeros to ~1e-308), for temperature scaling of a method without logits.

    >>> np.round(probs_as_logits(np.array([[0.5, 0.5]])), 4).tolist()
    [[-0.6931, -0.6931]]
    """
    probs = _unit_probabilities(probs_NxK, "probs_NxK")
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
    labels = checks.class_labels(labels_N, *logits.shape)
    lo, hi = (checks.positive(b, "bounds") for b in bounds)
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
    t = checks.positive(t, "temperature")
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
    e = checks.positive_entries(
        checks.matrix(evidence_NxK, "evidence_NxK", need_examples=True), "evidence_NxK",
        allow_zero=True)
    w = checks.positive_entries(checks.prior_strength(prior_strength_N, e.shape[0]),
                                "prior_strength_N")
    return e, w, _base_rate(base_rate_K, e.shape[1])


def evidence_from_alpha(alpha_NxK: Any, prior_strength_N: Any, base_rate_K: Any = None
                        ) -> np.ndarray:
    """e = alpha - W a (clipped at 0 against rounding), for outputs of the EDL family where
    alpha = e + W a (not for Prior Networks / PostNet, whose alpha has no such split).

    >>> evidence_from_alpha(np.array([[5.0, 1.0]]), 2.0).tolist()
    [[4.0, 0.0]]
    """
    alpha = checks.matrix(alpha_NxK, "alpha_NxK", need_examples=True)
    w = checks.prior_strength(prior_strength_N, alpha.shape[0])
    return np.maximum(alpha - w[:, None] * _base_rate(base_rate_K, alpha.shape[1])[None, :], 0.0)


def apply_evidence_scale(evidence_NxK: Any, prior_strength_N: Any,
                         scale: float | EvidenceScaleFit, base_rate_K: Any = None) -> np.ndarray:
    """alpha = scale * e + W a, (N, K) float64 (then p = alpha / S, u = W / S as usual).

    >>> apply_evidence_scale(np.array([[4.0, 0.0]]), 2.0, 0.5).tolist()
    [[3.0, 1.0]]
    """
    s = scale.scale if isinstance(scale, EvidenceScaleFit) else scale
    s = checks.positive(s, "scale")
    e, w, a = _evidence_inputs(evidence_NxK, prior_strength_N, base_rate_K)
    return s * e + w[:, None] * a[None, :]


def _evidence_nll(e_y: np.ndarray, e_sum: np.ndarray, prior_y: np.ndarray, w: np.ndarray,
                  s: float) -> float:
    p_y = (s * e_y + prior_y) / (s * e_sum + w)
    return float(-np.mean(np.log(np.clip(p_y, _EPS, 1.0))))


def fit_evidence_scale(evidence_NxK: Any, prior_strength_N: Any, labels_N: Any,
                       base_rate_K: Any = None, *,
                       bounds: tuple[float, float] = (1e-6, 1e6)) -> EvidenceScaleFit:
    """Fits s > 0 minimising the NLL of the predictive mean (s e + W a) / (s E + W) on
    **validation** data (module docstring: why a scale on the evidence).

    Args:
      evidence_NxK: validation evidence e >= 0 (``evidence_from_alpha`` recovers it from alpha).
      prior_strength_N: W per example (or a scalar).
      labels_N: validation labels.
      base_rate_K: a, (K,) on the simplex; None = uniform 1/K.
      bounds: the search interval of s (searched on log s, 10 grid points a decade). Wide,
        because a network trained under a strong prior can need a large s: the shipped
        20-epoch GEDL MNIST model's validation NLL is lowest near s = 1e4.

    Returns:
      ``EvidenceScaleFit``; a RuntimeWarning if s lies on a bound (at the upper one, the
      validation NLL still falls as the prior's weight goes to 0, p -> e / sum e).

    >>> e = np.array([[9.0, 0.0], [0.0, 9.0], [9.0, 0.0], [9.0, 0.0]])  # p = 10/11, 1 error in 4
    >>> fit = fit_evidence_scale(e, 2.0, np.array([0, 1, 0, 1]))
    >>> round(fit.scale, 4), bool(fit.nll_after < fit.nll_before)  # p = 3/4: s = 2/9
    (0.2222, True)
    """
    e, w, a = _evidence_inputs(evidence_NxK, prior_strength_N, base_rate_K)
    labels = checks.class_labels(labels_N, *e.shape)
    rows = np.arange(labels.size)
    e_y, e_sum, prior_y = e[rows, labels], e.sum(axis=1), w * a[labels]
    lo, hi = (checks.positive(b, "bounds") for b in bounds)
    grid = max(2, round(10 * math.log10(hi / lo)) + 1)
    s, at_bound = _minimise_log_scalar(lambda x: _evidence_nll(e_y, e_sum, prior_y, w, x), lo,
                                       hi, grid=grid)
    if at_bound:
        _warn_bound("evidence scale", s, lo, hi, meaning=(
            ": the validation NLL still falls as the prior's weight goes to 0 (p -> e / sum e)"
            if s > math.sqrt(lo * hi) else ""))
    return EvidenceScaleFit(scale=s, nll_before=_evidence_nll(e_y, e_sum, prior_y, w, 1.0),
                            nll_after=_evidence_nll(e_y, e_sum, prior_y, w, s),
                            num_examples=int(labels.size), at_bound=at_bound)


# ------------------------------------------------------------------------------------ summary
def calibration_summary(probs_NxK: Any, labels_N: Any, num_bins: int = 15) -> dict[str, float]:
    """{"accuracy", "nll", "brier", "ece", "ece_classwise"} of probabilities, with the
    conventions of ``gedl_jax.evaluation.metrics``: NLL with p_y clipped to [eps, 1 - eps];
    Brier = mean_i sum_k (p_ik - y_ik)^2; ECE = top-label, ``num_bins`` equal-width bins (lower,
    upper]; ece_classwise = `metrics.classwise_calibration_error` (every class's probability).

    >>> calibration_summary(np.array([[0.75, 0.25], [0.75, 0.25]]), np.array([0, 1]))["ece"]
    0.25
    """
    p = checks.probabilities(checks.matrix(probs_NxK, "probs_NxK", need_examples=True),
                             "probs_NxK")
    labels = checks.class_labels(labels_N, *p.shape)
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
            "ece": float(np.sum(gap[count > 0]) / n),
            "ece_classwise": metrics.classwise_calibration_error(p, labels, num_bins)}


# ----------------------------------------------- vector / matrix scaling, Dirichlet calibration
_DIRICHLET_CLIP = 1e-12   # log-probabilities of Dirichlet calibration: log max(q, 1e-12)


@dataclasses.dataclass(frozen=True, eq=False)
class AffineCalibrationFit:
    """A fitted affine map of logits (or log-probabilities) x: p = softmax(x W + b).

    kind: "vector" (W diagonal), "matrix" or "dirichlet" (on log q); l2_off_diagonal / l2_bias:
    the ODIR weights (lambda, mu) it was fitted with; nll_before / nll_after: validation NLL
    at W = I, b = 0 and at the fit (the penalty excluded); converged: L-BFGS-B's flag."""

    weight_KxK: np.ndarray
    bias_K: np.ndarray
    kind: str
    nll_before: float
    nll_after: float
    num_examples: int
    l2_off_diagonal: float = 0.0
    l2_bias: float = 0.0
    converged: bool = True


def _affine_objective(x: np.ndarray, labels: np.ndarray, diagonal: bool, l2_off: float,
                      l2_bias: float):
    """(objective(theta), gradient) of the mean NLL of softmax(x W + b) plus ODIR, theta =
    (diag(W) or W row-major, b)."""
    n, k = x.shape
    rows = np.arange(n)
    off = ~np.eye(k, dtype=bool)
    off_scale = l2_off / (k * (k - 1))

    def unpack(theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        w = np.diag(theta[:k]) if diagonal else theta[:k * k].reshape(k, k)
        return w, theta[-k:]

    def fun(theta: np.ndarray) -> tuple[float, np.ndarray]:
        w, b = unpack(theta)
        z = x @ w + b
        log_p = z - special.logsumexp(z, axis=1, keepdims=True)
        value = -np.mean(log_p[rows, labels])
        grad_z = np.exp(log_p)
        grad_z[rows, labels] -= 1.0
        grad_z /= n
        grad_w = x.T @ grad_z
        grad_b = grad_z.sum(axis=0) + 2.0 * l2_bias / k * b
        value += l2_bias / k * float(b @ b)
        if diagonal:
            grad_theta_w = np.diag(grad_w)
        else:
            value += off_scale * float(np.sum(w[off] ** 2))
            grad_theta_w = (grad_w + 2.0 * off_scale * np.where(off, w, 0.0)).ravel()
        return float(value), np.concatenate([grad_theta_w, grad_b])

    return fun, unpack


def _fit_affine(x: np.ndarray, labels_N: Any, kind: str, l2_off: float, l2_bias: float,
                max_iterations: int) -> AffineCalibrationFit:
    labels = checks.class_labels(labels_N, *x.shape)
    for name, value in (("l2_off_diagonal", l2_off), ("l2_bias", l2_bias)):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be finite and >= 0, got {value}.")
    k = x.shape[1]
    diagonal = kind == "vector"
    fun, unpack = _affine_objective(x, labels, diagonal, float(l2_off), float(l2_bias))
    start = np.concatenate([np.ones(k) if diagonal else np.eye(k).ravel(), np.zeros(k)])
    res = optimize.minimize(fun, start, jac=True, method="L-BFGS-B",
                            options={"maxiter": int(max_iterations), "gtol": 1e-9,
                                     "ftol": 1e-14})
    theta = res.x if res.fun <= fun(start)[0] else start
    w, b = unpack(theta)
    return AffineCalibrationFit(weight_KxK=w, bias_K=b, kind=kind,
                                nll_before=_temperature_nll(x, labels, 1.0),
                                nll_after=_temperature_nll(x @ w + b, labels, 1.0),
                                num_examples=int(labels.size), l2_off_diagonal=float(l2_off),
                                l2_bias=float(l2_bias), converged=bool(res.success))


def fit_vector_scaling(logits_NxK: Any, labels_N: Any, *, max_iterations: int = 1000
                       ) -> AffineCalibrationFit:
    """Fits p = softmax(z * w + b) (w, b in R^K) minimising the **validation** NLL
    (module docstring; it can change the predicted class).

    >>> z = np.array([[4.0, 0.0], [0.0, 4.0], [4.0, 0.0], [4.0, 0.0]])
    >>> fit = fit_vector_scaling(z, np.array([0, 1, 0, 1]))
    >>> bool(fit.nll_after < fit.nll_before), fit.weight_KxK.shape
    (True, (2, 2))
    """
    return _fit_affine(_finite_logits(logits_NxK), labels_N, "vector", 0.0, 0.0,
                       max_iterations)


def fit_matrix_scaling(logits_NxK: Any, labels_N: Any, *, l2_off_diagonal: float = 0.01,
                       l2_bias: float = 0.01, max_iterations: int = 1000
                       ) -> AffineCalibrationFit:
    """Fits p = softmax(z W + b) minimising the **validation** NLL plus ODIR,
    l2_off_diagonal / (K (K - 1)) sum_{i != j} W_ij^2 + l2_bias / K sum_k b_k^2 (module
    docstring; it can change the predicted class).

    >>> z = np.array([[4.0, 0.0], [0.0, 4.0], [4.0, 0.0], [4.0, 0.0]])
    >>> bool(fit_matrix_scaling(z, np.array([0, 1, 0, 1])).nll_after < 1.0)
    True
    """
    return _fit_affine(_finite_logits(logits_NxK), labels_N, "matrix", l2_off_diagonal,
                       l2_bias, max_iterations)


def _dirichlet_log_probs(probs_NxK: Any) -> np.ndarray:
    probs = _unit_probabilities(probs_NxK, "probs_NxK")
    return np.log(np.maximum(probs, _DIRICHLET_CLIP))


def fit_dirichlet_calibration(probs_NxK: Any, labels_N: Any, *, l2_off_diagonal: float = 0.01,
                              l2_bias: float = 0.01, max_iterations: int = 1000
                              ) -> AffineCalibrationFit:
    """Dirichlet calibration (Kull et al., 2019): p = softmax(log(q) W + b) on the model's
    **validation** probabilities q, with ODIR (as ``fit_matrix_scaling``).

    >>> q = np.array([[0.9, 0.1], [0.1, 0.9], [0.9, 0.1], [0.9, 0.1]])
    >>> fit = fit_dirichlet_calibration(q, np.array([0, 1, 0, 1]))
    >>> fit.kind, bool(fit.nll_after < fit.nll_before)
    ('dirichlet', True)
    """
    return _fit_affine(_dirichlet_log_probs(probs_NxK), labels_N, "dirichlet", l2_off_diagonal,
                       l2_bias, max_iterations)


def apply_affine(logits_NxK: Any, fit: AffineCalibrationFit) -> np.ndarray:
    """softmax(z W + b), (N, K) float64, for a vector- or matrix-scaling fit.

    >>> fit = AffineCalibrationFit(np.eye(2) / 2, np.zeros(2), "vector", 0.0, 0.0, 1)
    >>> apply_affine(np.array([[np.log(9.0), 0.0]]), fit).round(4).tolist()  # = T = 2
    [[0.75, 0.25]]
    """
    if fit.kind == "dirichlet":
        raise ValueError("a Dirichlet calibration applies to probabilities: use "
                         "apply_dirichlet_calibration.")
    z = _finite_logits(logits_NxK)
    if z.shape[1] != fit.bias_K.size:
        raise ValueError(f"logits_NxK has {z.shape[1]} classes, the fit {fit.bias_K.size}.")
    return np.exp(_log_softmax(z @ fit.weight_KxK + fit.bias_K))


def apply_dirichlet_calibration(probs_NxK: Any, fit: AffineCalibrationFit) -> np.ndarray:
    """softmax(log(q) W + b), (N, K) float64, q clipped at 1e-12 before the log."""
    if fit.kind != "dirichlet":
        raise ValueError(f"apply_dirichlet_calibration needs a Dirichlet fit, got {fit.kind!r}.")
    x = _dirichlet_log_probs(probs_NxK)
    if x.shape[1] != fit.bias_K.size:
        raise ValueError(f"probs_NxK has {x.shape[1]} classes, the fit {fit.bias_K.size}.")
    return np.exp(_log_softmax(x @ fit.weight_KxK + fit.bias_K))


# ----------------------------------------------------------------------------- isotonic regression
@dataclasses.dataclass(frozen=True, eq=False)
class IsotonicFit:
    """Per class k, the points (x, g_k(x)) of the fitted non-decreasing map, x increasing:
    ``thresholds_x[k]`` and ``thresholds_y[k]``. nll_before / nll_after: validation NLL."""

    thresholds_x: tuple[np.ndarray, ...]
    thresholds_y: tuple[np.ndarray, ...]
    nll_before: float
    nll_after: float
    num_examples: int


def _pool_adjacent_violators(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The least-squares non-decreasing fit of y on x: (distinct x increasing, fitted values).
    Tied x are first pooled into their mean (weighted by their count)."""
    order = np.argsort(x, kind="stable")
    xs, ys = x[order], y[order]
    distinct, start = np.unique(xs, return_index=True)
    counts = np.diff(np.r_[start, xs.size]).astype(np.float64)
    means = np.add.reduceat(ys, start) / counts
    # Blocks of (value, weight, number of distinct points), merged while they decrease.
    values: list[float] = []
    weights: list[float] = []
    sizes: list[int] = []
    for v, w in zip(means, counts):
        values.append(float(v))
        weights.append(float(w))
        sizes.append(1)
        while len(values) > 1 and values[-2] > values[-1]:
            w_sum = weights[-2] + weights[-1]
            merged = (values[-2] * weights[-2] + values[-1] * weights[-1]) / w_sum
            size = sizes[-2] + sizes[-1]
            del values[-1], weights[-1], sizes[-1]
            values[-1], weights[-1], sizes[-1] = merged, w_sum, size
    return distinct, np.repeat(values, sizes)


def _apply_isotonic(probs: np.ndarray, fit: IsotonicFit) -> np.ndarray:
    mapped = np.stack([np.interp(probs[:, k], fit.thresholds_x[k], fit.thresholds_y[k])
                       for k in range(probs.shape[1])], axis=1)
    total = mapped.sum(axis=1, keepdims=True)
    uniform = np.full_like(mapped, 1.0 / mapped.shape[1])
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, mapped / total, uniform)


def _probs_nll(probs: np.ndarray, labels: np.ndarray) -> float:
    return float(-np.mean(np.log(np.clip(probs[np.arange(labels.size), labels], _EPS, 1.0))))


def fit_isotonic(probs_NxK: Any, labels_N: Any) -> IsotonicFit:
    """One-vs-rest isotonic regression per class on the **validation** probabilities (module
    docstring: it creates ties and can change the predicted class).

    >>> q = np.array([[0.9, 0.1], [0.8, 0.2], [0.7, 0.3], [0.6, 0.4]])
    >>> apply_isotonic(q, fit_isotonic(q, np.array([0, 0, 1, 0]))).round(3).tolist()
    [[1.0, 0.0], [1.0, 0.0], [0.5, 0.5], [0.5, 0.5]]
    """
    p = _unit_probabilities(probs_NxK, "probs_NxK")
    labels = checks.class_labels(labels_N, *p.shape)
    xs, ys = zip(*(_pool_adjacent_violators(p[:, k], (labels == k).astype(np.float64))
                   for k in range(p.shape[1])))
    fit = IsotonicFit(thresholds_x=tuple(xs), thresholds_y=tuple(ys), nll_before=0.0,
                      nll_after=0.0, num_examples=int(labels.size))
    return dataclasses.replace(fit, nll_before=_probs_nll(p, labels),
                               nll_after=_probs_nll(_apply_isotonic(p, fit), labels))


def apply_isotonic(probs_NxK: Any, fit: IsotonicFit) -> np.ndarray:
    """g_k(p_k) / sum_j g_j(p_j) per row, (N, K) float64 (uniform where every g_j(p_j) = 0)."""
    p = _unit_probabilities(probs_NxK, "probs_NxK")
    if p.shape[1] != len(fit.thresholds_x):
        raise ValueError(f"probs_NxK has {p.shape[1]} classes, the fit "
                         f"{len(fit.thresholds_x)}.")
    return _apply_isotonic(p, fit)


# ----------------------------------------------------------------- the calibrators side by side
CALIBRATORS = ("temperature", "vector_scaling", "matrix_scaling", "dirichlet", "isotonic")
# What `compare_calibrators` fits by default: matrix scaling of the log-probabilities that every
# method provides is Dirichlet calibration (the same model and penalty), so it is left out.
COMPARED_CALIBRATORS = ("temperature", "vector_scaling", "dirichlet", "isotonic")


def _fit_and_apply(name: str, val_probs: np.ndarray, val_labels: np.ndarray,
                   test_probs: np.ndarray) -> np.ndarray:
    """Calibrator `name` fitted on the validation probabilities, applied to the test ones. Every
    calibrator reads the log predictive probabilities (`probs_as_logits`), the one input every
    method has: for a softmax network these are its logits up to a per-example constant, which
    temperature and Dirichlet calibration ignore and vector and matrix scaling do not."""
    if name == "isotonic":
        return apply_isotonic(test_probs, fit_isotonic(val_probs, val_labels))
    if name == "dirichlet":
        return apply_dirichlet_calibration(
            test_probs, fit_dirichlet_calibration(val_probs, val_labels))
    val_z, test_z = probs_as_logits(val_probs), probs_as_logits(test_probs)
    if name == "temperature":
        return apply_temperature(test_z, fit_temperature(val_z, val_labels))
    fit = {"vector_scaling": fit_vector_scaling,
           "matrix_scaling": fit_matrix_scaling}[name](val_z, val_labels)
    return apply_affine(test_z, fit)


def _with_smooth_ece(probs: np.ndarray, labels: np.ndarray, num_bins: int) -> dict[str, float]:
    from gedl_jax.evaluation import smooth_ece  # it imports nothing from here

    summary = calibration_summary(probs, labels, num_bins)
    summary["smooth_ece"] = smooth_ece.smooth_ece(
        *smooth_ece.top_label_confidences(probs, labels)).smooth_ece
    return summary


def compare_calibrators(val_probs_NxK: Any, val_labels_N: Any, test_probs_MxK: Any,
                        test_labels_M: Any, names: tuple[str, ...] = COMPARED_CALIBRATORS,
                        num_bins: int = 15) -> dict[str, Any]:
    """Each calibrator in `names` fitted on the validation split and applied to the test set:
    accuracy, NLL, Brier, binned ECE and SmoothECE before and after, and whether it kept each
    test example's predicted class and the order of the examples by max probability (the MP
    score's ranking, which OOD detection and selective prediction read).

    Returns {"before": {...}, "after": {name: {..., "keeps_predicted_class": bool,
    "keeps_mp_ranking": bool}}}. Temperature scaling always keeps the predicted class; with more
    than two classes it can reorder examples by max probability, and the others can change both.
    """
    val_probs = _unit_probabilities(val_probs_NxK, "val_probs_NxK")
    test_probs = _unit_probabilities(test_probs_MxK, "test_probs_MxK")
    val_labels = checks.class_labels(val_labels_N, *val_probs.shape, "val_labels_N")
    test_labels = checks.class_labels(test_labels_M, *test_probs.shape, "test_labels_M")
    checks.known(names, CALIBRATORS, "calibrators")
    before_mp = test_probs.max(axis=1)
    out: dict[str, Any] = {"before": _with_smooth_ece(test_probs, test_labels, num_bins),
                           "after": {}}
    for name in names:
        after = _fit_and_apply(name, val_probs, val_labels, test_probs)
        summary = _with_smooth_ece(after, test_labels, num_bins)
        summary["keeps_predicted_class"] = bool(np.array_equal(after.argmax(1),
                                                               test_probs.argmax(1)))
        summary["keeps_mp_ranking"] = _same_order(before_mp, after.max(axis=1))
        out["after"][name] = summary
    return out


def _same_order(a_N: np.ndarray, b_N: np.ndarray) -> bool:
    """Whether every pair of examples is ordered alike by a and b (ties count as an order)."""
    order = np.lexsort((b_N, a_N))   # by a, ties by b
    a, b = a_N[order], b_N[order]
    same_a = np.diff(a) == 0
    return bool(np.all(np.where(same_a, np.diff(b) == 0, np.diff(b) > 0)))
