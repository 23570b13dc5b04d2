"""SmoothECE (Błasiok & Nakkiran, 2023, "Smooth ECE: Principled reliability diagrams via kernel
smoothing") and its reliability-diagram data. Float64 NumPy.

Definitions, for confidences f_i in [0, 1] and outcomes y_i in {0, 1} (top-label calibration:
f = max_k p_k, y = [argmax_k p_k == label], ``top_label_confidences``):

* The **reflected Gaussian kernel** on [0, 1],
  K_sigma(t, f) = sum_{m in Z} phi_sigma(t - f - 2m) + phi_sigma(t + f - 2m), phi_sigma the
  N(0, sigma^2) density: a Gaussian folded back at 0 and at 1, so int_0^1 K_sigma(t, f) dt = 1.
* The smoothed residual h(t) = 1/N sum_i K_sigma(t, f_i) (f_i - y_i) and the smoothed density
  delta(t) = 1/N sum_i K_sigma(t, f_i).
* **smECE_sigma** = int_0^1 |h(t)| dt (in [0, 1]; 0 for a perfectly calibrated f in the limit).
* **SmoothECE** = smECE_sigma* at the bandwidth sigma* with smECE_sigma* = sigma*: smECE_sigma
  falls as sigma grows, so the fixed point is unique, and it is found by bisection on
  [``SIGMA_MIN``, 1] to 1e-9. As the ``relplot`` package, sigma* is floored at 1e-3 (a
  calibrated model's SmoothECE then reads smECE at sigma = 1e-3 instead of a vanishing
  bandwidth).
* The **reliability diagram**: the kernel regression of y on f,
  mu(t) = sum_i K_sigma*(t, f_i) y_i / sum_i K_sigma*(t, f_i), plotted against t with the
  density delta(t) (the paper's Figure 1 draws the curve's width by it).

Computation: f is spread onto a uniform grid of G points on [0, 1] by linear interpolation
(``values`` at the two nearest grid points), mirrored to a circle of length 2 (the images -f and
2 - f of the reflection; a grid point at 0 or 1 is its own image, so its weight counts twice),
and convolved with the wrapped Gaussian by FFT: exactly the reflected kernel of the gridded
inputs. The grid spacing is at most sigma / 10 (G - 1 >= 4096). The integrals are trapezoidal
sums over the grid, |h| divided by the sum of delta so that the discretised kernel integrates to 1.
``relplot`` (the authors' package) discretises differently (a 200-point mesh, a kernel cut at
+-1/2, sigma* to 1/1024): the tests compare the two within a stated tolerance. One difference is
more than discretisation: relplot mirrors a confidence of exactly 0 or 1 (a saturated softmax)
once instead of twice, so such points weigh half as much there as the definition gives them.

>>> f = np.full(1000, 0.7); y = np.r_[np.ones(700), np.zeros(300)]
>>> round(smooth_ece(f, y).smooth_ece, 6)  # calibrated: at the 1e-3 floor, ~0
0.0
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from gedl_jax.evaluation import checks

__all__ = ["SIGMA_MIN", "SmoothEceResult", "smooth_ece", "smooth_ece_at", "top_label_confidences"]

SIGMA_MIN = 1e-3
_MIN_INTERVALS = 4096


@dataclasses.dataclass(frozen=True, eq=False)
class SmoothEceResult:
    """SmoothECE, its bandwidth, and the reliability-diagram data on a grid t_M of [0, 1].

    Attributes:
      smooth_ece: smECE at sigma (a fraction in [0, 1]).
      sigma: the fixed-point bandwidth sigma* (or the one given).
      t_M: grid points (M,).
      mean_outcome_M: mu(t), the kernel-smoothed outcome (the diagram's curve).
      density_M: delta(t), the kernel density of the confidences (integrates to 1).
      num_examples: N.
    """

    smooth_ece: float
    sigma: float
    t_M: np.ndarray
    mean_outcome_M: np.ndarray
    density_M: np.ndarray
    num_examples: int

    def to_dict(self, num_points: int = 101) -> dict[str, Any]:
        """JSON-serialisable form with the diagram resampled to `num_points` points."""
        t = np.linspace(0.0, 1.0, num_points)
        return {"smooth_ece": float(self.smooth_ece), "sigma": float(self.sigma),
                "num_examples": self.num_examples, "t": t.tolist(),
                "mean_outcome": np.interp(t, self.t_M, self.mean_outcome_M).tolist(),
                "density": np.interp(t, self.t_M, self.density_M).tolist()}


def _inputs(confidence_N: Any, outcome_N: Any) -> tuple[np.ndarray, np.ndarray]:
    f, y = checks.pair(confidence_N, outcome_N, "confidence_N", "outcome_N")
    checks.nonempty(f, "confidence_N")
    f = f.astype(np.float64)
    if not np.all(np.isfinite(f)) or f.min() < 0 or f.max() > 1:
        raise ValueError("confidence_N must lie in [0, 1].")
    y = y.astype(np.float64)
    if not np.all(np.isfinite(y)) or y.min() < 0 or y.max() > 1:
        raise ValueError("outcome_N must lie in [0, 1] (0/1 or bool: whether the prediction "
                         "was right).")
    return f, y


def top_label_confidences(probs_NxK: Any, labels_N: Any) -> tuple[np.ndarray, np.ndarray]:
    """(max_k p_k, [argmax_k p_k == label]) per example, float64: the top-label pairs.

    >>> top_label_confidences(np.array([[0.7, 0.3], [0.4, 0.6]]), np.array([0, 0]))
    (array([0.7, 0.6]), array([1., 0.]))
    """
    p = checks.matrix(probs_NxK, "probs_NxK")
    labels_N = checks.class_labels(labels_N, p.shape[0], p.shape[1])
    return np.clip(p.max(axis=1), 0.0, 1.0), (p.argmax(axis=1) == labels_N).astype(np.float64)


def _num_intervals(sigma: float) -> int:
    return max(_MIN_INTERVALS, 2 ** math.ceil(math.log2(10.0 / sigma)))


def _smooth(f: np.ndarray, values_VxN: np.ndarray, sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """(grid t (G,), 1/N sum_i K_sigma(t, f_i) v_i for each row v of values_VxN, (V, G))."""
    intervals = _num_intervals(sigma)
    g = intervals + 1
    step = 1.0 / intervals
    position = f / step
    left = np.minimum(position.astype(np.int64), intervals - 1)
    frac = position - left
    period = 2 * intervals
    # The inputs and their mirror images on a circle of length 2 (periodic grid of 2 G - 2).
    circle = np.zeros((values_VxN.shape[0], period))
    for index, weight in ((left, 1.0 - frac), (left + 1, frac)):
        image = (period - index) % period   # the mirror image of grid point `index`
        for v, row in enumerate(values_VxN):
            np.add.at(circle[v], index, weight * row)
            np.add.at(circle[v], image, weight * row)
    distance = np.arange(period) * step
    kernel = sum(np.exp(-0.5 * ((distance - 2.0 * m) / sigma) ** 2) for m in range(-3, 4))
    kernel /= math.sqrt(2.0 * math.pi) * sigma
    smoothed = np.fft.irfft(np.fft.rfft(circle, axis=1) * np.fft.rfft(kernel), n=period, axis=1)
    return np.linspace(0.0, 1.0, g), smoothed[:, :g] / f.size


def _trapezoid(y: np.ndarray) -> float:
    return float(np.sum(y[1:] + y[:-1]) / 2.0)


def _smece_at(f: np.ndarray, y: np.ndarray, sigma: float):
    t, (residual, density, outcome) = _smooth(f, np.stack([f - y, np.ones_like(f), y]), sigma)
    return _trapezoid(np.abs(residual)) / _trapezoid(density), t, density, outcome


def smooth_ece_at(confidence_N: Any, outcome_N: Any, sigma: float) -> float:
    """smECE_sigma at a given bandwidth sigma > 0 (module docstring).

    >>> round(smooth_ece_at(np.full(4, 0.5), np.array([1, 1, 1, 1]), 0.1), 6)  # |f - y| = 0.5
    0.5
    """
    f, y = _inputs(confidence_N, outcome_N)
    return _smece_at(f, y, checks.positive(sigma, "sigma"))[0]


def smooth_ece(confidence_N: Any, outcome_N: Any, sigma: float | None = None
               ) -> SmoothEceResult:
    """SmoothECE at the fixed-point bandwidth (or at `sigma` when given), with the diagram data.

    Args:
      confidence_N: f in [0, 1] (``top_label_confidences`` for a classifier's max probability).
      outcome_N: y in {0, 1} (bool, or values in [0, 1]).
      sigma: None = the fixed point sigma* = smECE_sigma* (floored at ``SIGMA_MIN``).

    Returns:
      ``SmoothEceResult``.
    """
    f, y = _inputs(confidence_N, outcome_N)
    if sigma is None:
        def gap(s: float) -> float:   # smECE_s - s, decreasing in s
            return _smece_at(f, y, s)[0] - s

        if gap(1.0) >= 0:
            sigma = 1.0
        elif gap(SIGMA_MIN) <= 0:
            sigma = SIGMA_MIN
        else:
            lo, hi = SIGMA_MIN, 1.0
            while hi - lo > 1e-9:
                mid = 0.5 * (lo + hi)
                lo, hi = (mid, hi) if gap(mid) > 0 else (lo, mid)
            sigma = 0.5 * (lo + hi)
    else:
        sigma = checks.positive(sigma, "sigma")
    value, t, density, outcome = _smece_at(f, y, float(sigma))
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_outcome = np.where(density > 0, outcome / density, np.nan)
    density_integral = _trapezoid(density) * (t[1] - t[0])
    return SmoothEceResult(smooth_ece=value, sigma=float(sigma), t_M=t,
                           mean_outcome_M=mean_outcome, density_M=density / density_integral,
                           num_examples=int(f.size))
