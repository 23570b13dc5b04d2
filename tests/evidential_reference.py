"""Independent float64 NumPy/SciPy references for the evidential math tests.

Closed forms are transcribed from the textbook formulas (scipy.special gammaln / digamma /
polygamma, no rewrites); Monte-Carlo estimators sample numpy's Dirichlet; the KL also has a
cancellation-free path-integral form for nearly equal arguments. None of this imports
`gedl_jax`, so a test comparing against it cannot compare a function to itself.
"""

from __future__ import annotations

import numpy as np
from scipy import special

F32_EPS = float(np.finfo(np.float32).eps)   # 1.19e-7


# ---------------------------------------------------------------------------------------------
# Inputs


def log_uniform(rng: np.random.Generator, shape, low: float = 1e-4,
                high: float = 1e6) -> np.ndarray:
    """float32 values log-uniform in [low, high], returned as float32 (the exact inputs)."""
    return (10.0 ** rng.uniform(np.log10(low), np.log10(high), size=shape)).astype(np.float32)


def f64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def _f64_or_complex(x) -> np.ndarray:
    """float64, or complex128 for complex input (the closed forms below are analytic, so they
    also serve for complex-step derivatives)."""
    x = np.asarray(x)
    return x.astype(np.complex128) if np.iscomplexobj(x) else x.astype(np.float64)


def complex_step_gradient(fn, a, step: float = 1e-30) -> np.ndarray:
    """d sum(fn(a)) / d a_k per example by the complex-step method, Im fn(a + i h e_k) / h: exact
    to float64 rounding (no subtraction), so it is a reference even where fn cancels."""
    a = f64(a)
    grad = np.zeros_like(a)
    for j in range(a.shape[-1]):
        shifted = a.astype(np.complex128)
        shifted[..., j] += 1j * step
        grad[..., j] = np.imag(fn(shifted)) / step
    return grad


def assert_close(got, want, rtol: float, atol, what: str = "") -> None:
    """|got - want| <= atol + rtol |want| elementwise (atol may be an array), with the worst case
    in the message."""
    got, want = f64(got), f64(want)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert np.all(np.isfinite(got)), f"{what}: non-finite values {got[~np.isfinite(got)]}"
    bound = np.asarray(atol, np.float64) + rtol * np.abs(want)
    excess = np.abs(got - want) / bound
    i = np.unravel_index(np.argmax(excess), excess.shape)
    worst_bound = np.broadcast_to(bound, excess.shape)[i]
    assert excess[i] <= 1.0, (f"{what}: worst |got - want| = {abs(got[i] - want[i]):.3g} at {i} "
                              f"(got {got[i]!r}, want {want[i]!r}, bound {worst_bound:.3g})")


# ---------------------------------------------------------------------------------------------
# Closed forms


def kl(a, b) -> np.ndarray:
    """KL(Dir(a) || Dir(b)), textbook closed form (complex-safe for complex-step derivatives)."""
    a, b = _f64_or_complex(a), _f64_or_complex(b)
    a0, b0 = a.sum(-1), b.sum(-1)
    return (special.loggamma(a0) - special.loggamma(b0)
            + np.sum(special.loggamma(b) - special.loggamma(a), -1)
            + np.sum((a - b) * (special.digamma(a) - special.digamma(a0)[..., None]), -1))


def kl_rounding_scale(a, b) -> np.ndarray:
    """Sum of the magnitudes of the closed form's terms: its float64 rounding error is about
    1e-16 times this (the reference is only that accurate)."""
    a, b = f64(a), f64(b)
    a0, b0 = a.sum(-1), b.sum(-1)
    return (np.abs(special.gammaln(a0)) + np.abs(special.gammaln(b0))
            + np.sum(np.abs(special.gammaln(b)) + np.abs(special.gammaln(a)), -1)
            + np.sum(np.abs(a - b) * (np.abs(special.digamma(a))
                                      + np.abs(special.digamma(a0))[..., None]), -1))


_GL_X, _GL_W = np.polynomial.legendre.leggauss(24)


def kl_path_integral(a, b) -> np.ndarray:
    """KL(Dir(a) || Dir(b)) = int_0^1 s d^T I(b + s d) d ds, d = a - b, I the Fisher matrix.

    (d/ds KL(Dir(b + s d) || Dir(b)) = s d^T I(b + s d) d.) Every quantity is O(|d|^2): no
    cancellation, so it is the accurate reference when a ~ b (the closed form above loses ~1e-7
    absolute at S ~ 1e8 even in float64). 24-node Gauss-Legendre, exact to float64 for
    a / b in [1/2, 2] (the integrand's pole at c = 0 is then >= 3 half-lengths away).
    """
    a, b = f64(a), f64(b)
    d = a - b
    total = np.zeros(a.shape[:-1])
    for x, w in zip(_GL_X, _GL_W):
        s = 0.5 * (x + 1.0)
        c = b + s * d
        quad = (np.sum(d * d * special.polygamma(1, c), -1)
                - np.sum(d, -1) ** 2 * special.polygamma(1, c.sum(-1)))
        total = total + 0.5 * w * s * quad
    return total


def fisher_matrix(a) -> np.ndarray:
    """I(a) = diag(psi1(a)) - psi1(S) 1 1^T, shape (..., K, K)."""
    a = f64(a)
    k = a.shape[-1]
    return (np.einsum("...k,kl->...kl", special.polygamma(1, a), np.eye(k))
            - special.polygamma(1, a.sum(-1))[..., None, None])


def fisher_neg_logdet_explicit(a) -> np.ndarray:
    """-log det I(a) from numpy.linalg.slogdet of the explicit K x K matrix."""
    sign, logdet = np.linalg.slogdet(fisher_matrix(a))
    assert np.all(sign > 0)
    return -logdet


def fisher_neg_logdet_lemma(a) -> np.ndarray:
    """-log det I(a) via the matrix determinant lemma in float64 (log1p(-x) directly)."""
    a = f64(a)
    t = special.polygamma(1, a)
    x = special.polygamma(1, a.sum(-1)) * np.sum(1.0 / t, -1)
    return -(np.sum(np.log(t), -1) + np.log1p(-x))


def onehot(labels, k: int) -> np.ndarray:
    return np.eye(k)[np.asarray(labels)]


def expected_nll(a, y) -> np.ndarray:
    a = _f64_or_complex(a)
    a_y = np.take_along_axis(a, y[..., None], -1)[..., 0]
    return special.digamma(a.sum(-1)) - special.digamma(a_y)


def log_nll(a, y) -> np.ndarray:
    a = _f64_or_complex(a)
    return np.log(a.sum(-1)) - np.log(np.take_along_axis(a, y[..., None], -1)[..., 0])


def variance_terms(a) -> np.ndarray:
    a = _f64_or_complex(a)
    s = a.sum(-1, keepdims=True)
    return a * (s - a) / (s * s * (s + 1.0))


def expected_mse(a, y, include_variance=True) -> np.ndarray:
    a = _f64_or_complex(a)
    p = a / a.sum(-1, keepdims=True)
    out = np.sum((onehot(y, a.shape[-1]) - p) ** 2, -1)
    return out + np.sum(variance_terms(a), -1) if include_variance else out


def fisher_weighted_mse(a, y) -> np.ndarray:
    a = f64(a)
    p = a / a.sum(-1, keepdims=True)
    return np.sum((onehot(y, a.shape[-1]) - p) ** 2 * special.polygamma(1, a), -1)


def fisher_weighted_variance(a) -> np.ndarray:
    a = f64(a)
    return np.sum(variance_terms(a) * special.polygamma(1, a), -1)


def fisher_weighted_gradients(a, y):
    """Analytic d/d a_j of fisher_weighted_mse and fisher_weighted_variance, each returned with
    the sum of the absolute values of its pieces (the scale of its float32 rounding error):

      mse: -2 sum_k r_k psi1(a_k) dp_k/da_j + r_j^2 psi2(a_j),              r = y - p
      var: sum_k psi1(a_k) [(1 - 2 p_k) dp_k/da_j - V_k] / (S + 1) + V_j psi2(a_j),
    with dp_k/da_j = (delta_jk - p_k) / S and V_k = p_k (1 - p_k) / (S + 1).
    """
    a = f64(a)
    k = a.shape[-1]
    s = a.sum(-1)[..., None, None]
    p = a / a.sum(-1, keepdims=True)
    dp = (np.eye(k) - p[..., None, :]) / s                     # [..., j, k]
    t1, t2 = special.polygamma(1, a), special.polygamma(2, a)
    r = onehot(y, k) - p
    mse_a = -2 * np.sum(dp * (r * t1)[..., None, :], -1)
    mse_b = r * r * t2
    var = p * (1 - p) / (s[..., 0] + 1)
    var_a = np.sum(t1[..., None, :] * ((1 - 2 * p)[..., None, :] * dp - var[..., None, :]), -1)
    var_a = var_a / (s[..., 0] + 1)
    var_b = var * t2
    mse_size = 2 * np.sum(np.abs(dp * (r * t1)[..., None, :]), -1) + np.abs(mse_b)
    var_size = (np.sum(np.abs(t1[..., None, :] * ((1 - 2 * p)[..., None, :] * dp)), -1)
                + np.sum(np.abs(t1 * var), -1, keepdims=True)) / (s[..., 0] + 1) + np.abs(var_b)
    return (mse_a + mse_b, mse_size), (var_a + var_b, var_size)


def predictive_entropy(a) -> np.ndarray:
    a = _f64_or_complex(a)
    p = a / a.sum(-1, keepdims=True)
    return -np.sum(p * np.log(p), -1)


def expected_entropy(a) -> np.ndarray:
    a = _f64_or_complex(a)
    s = a.sum(-1, keepdims=True)
    return -np.sum(a / s * (special.digamma(a + 1.0) - special.digamma(s + 1.0)), -1)


def mutual_information(a) -> np.ndarray:
    return predictive_entropy(a) - expected_entropy(a)


def differential_entropy(a) -> np.ndarray:
    """Textbook: log B(a) + (S - K) psi(S) - sum (a_k - 1) psi(a_k)."""
    a = _f64_or_complex(a)
    s = a.sum(-1)
    k = a.shape[-1]
    return (np.sum(special.loggamma(a), -1) - special.loggamma(s) + (s - k) * special.digamma(s)
            - np.sum((a - 1.0) * special.digamma(a), -1))


def variance_sum(a) -> np.ndarray:
    return np.sum(variance_terms(a), -1)


# ---------------------------------------------------------------------------------------------
# Monte Carlo (fixed seeds; returns mean and standard error per example)


def dirichlet_samples(rng: np.random.Generator, a, n: int) -> np.ndarray:
    """(..., n, K) samples of Dir(a) for each row of a (float64)."""
    a = f64(a)
    flat = a.reshape(-1, a.shape[-1])
    out = np.stack([rng.dirichlet(row, size=n) for row in flat])
    return out.reshape(a.shape[:-1] + (n, a.shape[-1]))


def mc_mean(values) -> tuple[np.ndarray, np.ndarray]:
    """Mean and standard error over the sample axis (-1)."""
    n = values.shape[-1]
    return values.mean(-1), values.std(-1, ddof=1) / np.sqrt(n)


def log_dirichlet_pdf(pi, a) -> np.ndarray:
    """log Dir(pi | a) for pi (..., n, K), a (..., K)."""
    a = f64(a)
    return (special.gammaln(a.sum(-1))[..., None] - np.sum(special.gammaln(a), -1)[..., None]
            + np.sum((a[..., None, :] - 1.0) * np.log(pi), -1))
