"""Closed-form Dirichlet quantities: KL divergence and the Fisher information log-determinant.

KL(Dir(alpha) || Dir(beta)) is the regulariser of every EDL variant (paper Eq. elbo, Appendix
proposition closed-form). -log det I(alpha) is I-EDL's Fisher term (Deng et al., ICML 2023;
github.com/danruod/IEDL, code_classical/models/FisherEvidentialN.py).

Both are written so that float32 keeps its precision for concentrations from 1e-4 to 1e6 and
K up to 100. The textbook formulas add and subtract terms of size S log S (lgamma(1e8) ~ 1.7e9,
whose float32 spacing is 128) to produce results of size O(K log S) or smaller, so they lose every
digit at large concentrations, and near alpha == beta they lose everything at any size. Three
devices are used (each function documents its rewrite):

* lgamma, digamma and trigamma are split into Stirling leading parts, whose combinations are
  simplified analytically, and small remainders r, d, v evaluated by asymptotic series (shifted
  by the recurrences below the series range; no XLA lgamma/digamma, which carry ~2e-6 absolute
  error in float32);
* differences F(y) - F(x) of nearly equal arguments are integrals of F' by 8-node Gauss-Legendre,
  so they keep relative precision however close y is to x (confident classes, beta ~ alpha);
* derivatives of the selected forms are given analytically (`jax.custom_jvp`), which keeps them
  accurate and the compiled gradients small.

The private helpers here are shared with `objectives.py` and `uncertainty.py`.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero
from jax.scipy import special
from jax.typing import ArrayLike

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)

# Remainders of lgamma, digamma and trigamma after their Stirling leading parts. For x at or
# above the switch point they come from the asymptotic series below, accurate to ~1e-9 relative
# there (the first omitted term); below it from the recurrences Gamma(x + 1) = x Gamma(x) and
# psi1(x) = psi1(x + n) + sum_j 1/(x + j)**2 shifted up to the series range. That needs no
# float32 lgamma / digamma / polygamma, whose XLA versions carry ~2e-6 absolute error below 10,
# and it keeps the helpers smooth across the switch points.
_SERIES_MIN_LOG = 3.0        # r, d, g: series for x >= 3, shift by 3 below
_SERIES_MIN_TRIGAMMA = 4.0   # v, u, s: series for x >= 4, shift by 4 below

# Coefficients of z = 1/x**2 (Bernoulli numbers B_2 .. B_16), highest order first, for Horner.
# lgamma(x) = (x - 1/2) log x - x + log(2 pi)/2 + (1/x) sum_n B_2n / (2n (2n-1)) z**(n-1)
_LGAMMA_REMAINDER = (-3617.0 / 122400.0, 1.0 / 156.0, -691.0 / 360360.0, 1.0 / 1188.0,
                     -1.0 / 1680.0, 1.0 / 1260.0, -1.0 / 360.0, 1.0 / 12.0)
# digamma(x) = log x - 1/(2x) - z sum_n B_2n / (2n) z**(n-1)
_DIGAMMA_REMAINDER = (-3617.0 / 8160.0, 1.0 / 12.0, -691.0 / 32760.0, 1.0 / 132.0,
                      -1.0 / 240.0, 1.0 / 252.0, -1.0 / 120.0, 1.0 / 12.0)
# x trigamma(x) - 1 = 1/(2x) + z sum_n B_2n z**(n-1)
_TRIGAMMA_REMAINDER = (-3617.0 / 510.0, 7.0 / 6.0, -691.0 / 2730.0, 5.0 / 66.0,
                       -1.0 / 30.0, 1.0 / 42.0, -1.0 / 30.0, 1.0 / 6.0)
# phi(1 + t) = (1 + t) log(1 + t) - t = sum_{n >= 2} (-1)**n t**n / (n (n - 1)), |t| < 1
_PHI_SERIES_MAX_ABS_T = 0.25
_PHI_SERIES = tuple((-1.0) ** n / (n * (n - 1)) for n in range(14, 1, -1))
# 8-node Gauss-Legendre rule on [0, 1] (nodes s_i, weights w_i), for `_gauss_legendre`.
_GL_X, _GL_W = np.polynomial.legendre.leggauss(8)
_GL_NODES = tuple(float(v) for v in 0.5 * (_GL_X + 1.0))
_GL_WEIGHTS = tuple(float(v) for v in 0.5 * _GL_W)


def _horner(coefficients: tuple[float, ...], z: jax.Array) -> jax.Array:
    result = jnp.full_like(z, coefficients[0])
    for c in coefficients[1:]:
        result = result * z + c
    return result


def _shift(x: jax.Array, threshold: float) -> tuple[jax.Array, jax.Array]:
    """(n, x + n): the number of unit steps n in {0, ..., threshold} that lifts x to the series
    range [threshold, threshold + 1) (n = 0 at and above the threshold: the smallest shift, whose
    correction terms are the smallest; they all vanish for n = 0, so no branch is needed)."""
    n = jnp.clip(jnp.ceil(threshold - x), 0.0, threshold)
    return n, x + n


def _lgamma_remainder(x: jax.Array) -> jax.Array:
    """r(x) = lgamma(x) - [(x - 1/2) log x - x + log(2 pi)/2] (Binet's remainder, ~ 1/(12x)).

    From lgamma(x) = lgamma(x + n) - sum_{j<n} log(x + j):
    r(x) = r(x + n) + (x + 1/2) log1p(n/x) + sum_{0<j<n} log1p((n - j)/(x + j)) - n, with the
    asymptotic series for r(x + n).
    """
    n, y = _shift(x, _SERIES_MIN_LOG)
    result = (_horner(_LGAMMA_REMAINDER, 1.0 / (y * y)) / y
              + (x + 0.5) * jnp.log1p(n / x) - n)
    for j in (1.0, 2.0):
        result = result + jnp.where(j < n, jnp.log1p(jnp.maximum(n - j, 0.0) / (x + j)), 0.0)
    return result


def _digamma_series_part(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(n, d(x + n) + log1p(n/x) - sum_{0<j<n} 1/(x + j)), shared by d and g."""
    n, y = _shift(x, _SERIES_MIN_LOG)
    z = 1.0 / (y * y)
    result = -0.5 / y - z * _horner(_DIGAMMA_REMAINDER, z) + jnp.log1p(n / x)
    for j in (1.0, 2.0):
        result = result - jnp.where(j < n, 1.0 / (x + j), 0.0)
    return n, result


def _digamma_minus_log(x: jax.Array) -> jax.Array:
    """d(x) = digamma(x) - log x (~ -1/(2x) for large x; ~ -1/x for small x).

    From digamma(x) = digamma(x + n) - sum_{j<n} 1/(x + j):
    d(x) = d(x + n) + log1p(n/x) - sum_{j<n} 1/(x + j).
    """
    n, part = _digamma_series_part(x)
    return part - jnp.where(n > 0, 1.0 / x, 0.0)


def _digamma1p_minus_log(x: jax.Array) -> jax.Array:
    """g(x) = digamma(x + 1) - log x = d(x) + 1/x (~ 1/(2x) for large x; ~ -log x for small x).

    For n > 0 the 1/x of the recurrence cancels analytically (never d(x) + 1/x, which would
    cancel -1/x against 1/x in floating point for small x).
    """
    n, part = _digamma_series_part(x)
    return part + jnp.where(n > 0, 0.0, 1.0 / x)


def _trigamma_core(x: jax.Array):
    """(n, P, y, core) for v(x) = x psi1(x) - 1 = core + [n > 0] / x, from
    psi1(x) = psi1(x + n) + sum_{j<n} 1/(x + j)**2 and the series
    v(y) = 1/(2y) + P(1/y**2) / y**2:

        core = -n/y + (x/y) v(y) + sum_{0<j<n} x/(x + j)**2     (~ -1 near 0; = v(x) for n = 0).
    """
    n, y = _shift(x, _SERIES_MIN_TRIGAMMA)
    p = _horner(_TRIGAMMA_REMAINDER, 1.0 / (y * y))
    core = -n / y + (x / y) * (0.5 / y + p / (y * y))
    for j in (1.0, 2.0, 3.0):
        core = core + jnp.where(j < n, x / ((x + j) * (x + j)), 0.0)
    return n, p, y, core


def _scaled_trigamma_minus_one(x: jax.Array) -> jax.Array:
    """v(x) = x psi1(x) - 1 > 0 (~ 1/(2x) for large x; ~ 1/x for small x)."""
    n, _, _, core = _trigamma_core(x)
    return core + jnp.where(n > 0, 1.0 / x, 0.0)


def _trigamma(x: jax.Array) -> jax.Array:
    """trigamma(x) = (1 + v(x)) / x."""
    return (1.0 + _scaled_trigamma_minus_one(x)) / x


def _trigamma_parts(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(v(x), s(x)) with s(x) = x v(x) - 1/2 (~ 1/(6x) for large x, = P / x there without
    cancellation; 1/2 + x core below the series range)."""
    n, p, y, core = _trigamma_core(x)
    v = core + jnp.where(n > 0, 1.0 / x, 0.0)
    s = jnp.where(n > 0, 0.5 + x * core, p / y)
    return v, s


def _reciprocal_minus_trigamma1p(t: jax.Array) -> jax.Array:
    """1/t - psi1(t + 1) = (1/t - v(t)) / t > 0 (minus the derivative of g).

    1/t - v(t) is -core below the series range (no 1/t to cancel) and 1/t - v(t) ~ 1/(2t) above.
    """
    n, _, _, core = _trigamma_core(t)
    return jnp.where(n > 0, -core, 1.0 / t - core) / t


def _phi_times(scale: jax.Array, t: jax.Array, log_x: jax.Array, target: jax.Array) -> jax.Array:
    """scale * phi(x) with phi(x) = x log x - x + 1 >= 0, given t = x - 1, log x and
    target = scale * x.

    Near x = 1 phi is second order in t while x log x and x - 1 are first order, so a series in t
    is used for |t| < 0.25; elsewhere target log x - target + scale.
    """
    is_near = jnp.abs(t) < _PHI_SERIES_MAX_ABS_T
    t_near = jnp.where(is_near, t, 0.0)
    near = scale * t_near * t_near * _horner(_PHI_SERIES, t_near)
    far = target * log_x - target + scale
    return jnp.where(is_near, near, far)


def _complement_sum(alpha_BxK: jax.Array) -> jax.Array:
    """S - alpha_k for every k, without cancellation.

    For a class with alpha_k <= S/2 the subtraction is exact to an ulp or two. At most one class
    (the largest) can exceed S/2; its complement is summed over the other classes instead (when a
    confident prediction has alpha_y = S (1 - 1e-7), S - alpha_y in float32 would be pure noise).
    """
    num_classes = alpha_BxK.shape[-1]
    strength_B = jnp.sum(alpha_BxK, axis=-1)
    is_max_BxK = jax.nn.one_hot(jnp.argmax(alpha_BxK, axis=-1), num_classes, dtype=jnp.bool_)
    rest_of_max_B = jnp.sum(jnp.where(is_max_BxK, 0.0, alpha_BxK), axis=-1)
    return jnp.where(is_max_BxK, rest_of_max_B[..., None], strength_B[..., None] - alpha_BxK)


class _Probabilities(NamedTuple):
    strength_B: jax.Array
    p_BxK: jax.Array             # alpha_k / S
    one_minus_p_BxK: jax.Array   # (S - alpha_k) / S
    rest_BxK: jax.Array          # S - alpha_k


def _probabilities(alpha_BxK: jax.Array) -> _Probabilities:
    """S, p = alpha/S, 1 - p and S - alpha, accurate in value and in derivative.

    p_k = 1 / (1 + rest_k / alpha_k) and 1 - p_k = 1 / (1 + alpha_k / rest_k): the textbook
    alpha_k / S differentiates to 1/S - alpha_k/S**2, which rounds to 0 instead of rest_k/S**2
    for a dominant class (and (S - alpha_k)/S likewise for a class with p_k ~ 1e-8); these forms
    differentiate to rest_k/S**2 and alpha_k/S**2 directly, and 1 - p_k has no 1 - p cancellation.
    """
    rest_BxK = _complement_sum(alpha_BxK)
    return _Probabilities(jnp.sum(alpha_BxK, axis=-1), 1.0 / (1.0 + rest_BxK / alpha_BxK),
                          1.0 / (1.0 + alpha_BxK / rest_BxK), rest_BxK)


def _gauss_legendre(integrand, x: jax.Array, h: jax.Array, weight=None) -> jax.Array:
    """int_x^{x+h} integrand(t) [weight(s)] dt / h, s = (t - x) / h, by 8-node Gauss-Legendre.

    Used only for |h| <= x/2: the integrands below are analytic except at t <= 0, which is then at
    least 3 half-lengths from the interval, so the rule's error (< 1e-12 relative) is far below
    float32 rounding. The nodes form one trailing axis, so the integrand is traced once.
    """
    x = jnp.asarray(x)
    h = jnp.broadcast_to(jnp.asarray(h, x.dtype), x.shape)
    node_shape = (1,) * x.ndim + (len(_GL_NODES),)
    nodes = jnp.asarray(_GL_NODES, x.dtype).reshape(node_shape)
    factors = np.asarray(_GL_WEIGHTS)
    if weight is not None:
        factors = factors * np.asarray([weight(s) for s in _GL_NODES])
    factors = jnp.asarray(factors, x.dtype).reshape(node_shape)
    return jnp.sum(factors * integrand(x[..., None] + nodes * h[..., None]), axis=-1)


def _trigamma_minus_reciprocal(t: jax.Array) -> jax.Array:
    """psi1(t) - 1/t = v(t) / t > 0 (the derivative of d(t) = digamma(t) - log t)."""
    return _scaled_trigamma_minus_one(t) / t


def _near(x: jax.Array, h: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(|h| <= x/2, h where that holds else 0): the quadrature branch and its safe step."""
    is_near = jnp.abs(h) <= 0.5 * x
    return is_near, jnp.where(is_near, h, 0.0)


def _difference(derivative):
    """Wraps f(x, h, y) = F(y) - F(x) (h = y - x given separately for accuracy) with the
    derivative F'(y) dy - F'(x) dx, instead of differentiating through its quadrature."""
    def decorate(function):
        wrapped = jax.custom_jvp(function)

        @wrapped.defjvp
        def _jvp(primals, tangents):
            x, h, y = primals
            x_dot, _, y_dot = tangents
            return wrapped(x, h, y), derivative(y) * y_dot - derivative(x) * x_dot

        return functools.wraps(function)(wrapped)
    return decorate


@_difference(_trigamma_minus_reciprocal)
def _digamma_minus_log_diff(x: jax.Array, h: jax.Array, y: jax.Array) -> jax.Array:
    """d(y) - d(x) for y = x + h (both given, so the caller's accurate h is used).

    Quadrature of psi1(t) - 1/t > 0 when |h| <= x/2 (no cancellation of two nearly equal d values,
    e.g. for the largest class, where S - alpha_k is tiny); the plain difference otherwise.
    """
    is_near, h_near = _near(x, h)
    near = h_near * _gauss_legendre(_trigamma_minus_reciprocal, x, h_near)
    return jnp.where(is_near, near, _digamma_minus_log(y) - _digamma_minus_log(x))


@_difference(_reciprocal_minus_trigamma1p)
def _digamma1p_minus_log_diff(x: jax.Array, h: jax.Array, y: jax.Array) -> jax.Array:
    """g(x) - g(y) >= 0 for y = x + h >= x, g(t) = digamma(t + 1) - log t (decreasing), i.e.
    G(y) - G(x) with G = -g, G' = 1/t - psi1(t + 1).

    Quadrature of 1/t - psi1(t + 1) > 0 when h <= x/2; the plain difference otherwise.
    """
    is_near, h_near = _near(x, h)
    near = h_near * _gauss_legendre(_reciprocal_minus_trigamma1p, x, h_near)
    return jnp.where(is_near, near, _digamma1p_minus_log(x) - _digamma1p_minus_log(y))


@_difference(_trigamma)
def _digamma_diff(x: jax.Array, h: jax.Array, y: jax.Array) -> jax.Array:
    """digamma(y) - digamma(x) for y = x + h: quadrature of psi1 when |h| <= x/2, else direct."""
    is_near, h_near = _near(x, h)
    near = h_near * _gauss_legendre(_trigamma, x, h_near)
    far = jnp.log(y / x) + _digamma_minus_log(y) - _digamma_minus_log(x)
    return jnp.where(is_near, near, far)


def _bregman_excess(x: jax.Array, h: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The second-order part of lgamma's Bregman divergence from x to y = x + h, without d.

    D(y, x) = lgamma(y) - lgamma(x) - digamma(x) h splits into x phi(y/x) (the Bregman divergence
    of t log t - t) plus D~(y, x) = int_x^y (y - t)(psi1(t) - 1/t) dt. Returns (is_near, G) with

    * near pairs (|h| <= x/2): G = D~ = h**2 int_0^1 (1 - s)(psi1 - 1/t)(x + s h) ds by quadrature,
      second order in h with float32 relative precision however small h is (two lgamma values
      would carry float32 lgamma's ~1e-6 absolute error below 10 into a result that can be 1e-12);
    * far pairs: G = D~ + h d(x) = (1/2) log(x/y) + r(y) - r(x), every term O(1) or O(1/x). The
      caller adds -h d(x), grouped with the matching strength term (see `dirichlet_kl`).
    """
    is_near, h_near = _near(x, h)
    near = h_near * h_near * _gauss_legendre(_trigamma_minus_reciprocal, x, h_near,
                                             weight=lambda s: 1.0 - s)
    remainder = _lgamma_remainder(jnp.concatenate([x, y], axis=-1))
    size = x.shape[-1]
    far = 0.5 * jnp.log(x / y) + remainder[..., size:] - remainder[..., :size]
    return is_near, jnp.where(is_near, near, far)


class _KLShared(NamedTuple):
    strength_a_B: jax.Array
    strength_b_B: jax.Array
    delta_BxK: jax.Array
    delta_B: jax.Array
    rescaled_alpha_BxK: jax.Array
    is_near_BxK: jax.Array
    t_BxK: jax.Array
    log_x_BxK: jax.Array


def _kl_shared(alpha_BxK: jax.Array, beta_BxK: jax.Array) -> _KLShared:
    """Strengths, differences and the categorical ratios x_k = b_k A / (a_k B) of a KL pair."""
    strength_a_B = jnp.sum(alpha_BxK, axis=-1)
    strength_b_B = jnp.sum(beta_BxK, axis=-1)
    # Differences are formed per class (exact for b_k within a factor 2 of a_k) and summed, so
    # B - A is not the difference of two rounded sums.
    delta_BxK = beta_BxK - alpha_BxK
    delta_B = jnp.sum(delta_BxK, axis=-1)
    # When b_k is near a_k and B near A, t_k = x_k - 1 is formed from the differences,
    # (delta_k A - a_k delta_S) / (a_k B), with an error of a few ulps of 1 rather than of
    # x_k; elsewhere x_k - 1 itself is accurate enough (|t_k| is not small there).
    rescaled_alpha_BxK = alpha_BxK * (strength_b_B / strength_a_B)[..., None]
    is_near_BxK = ((jnp.abs(delta_BxK) <= 0.5 * alpha_BxK)
                   & (jnp.abs(delta_B) <= 0.5 * strength_a_B)[..., None])
    t_from_delta_BxK = ((delta_BxK * strength_a_B[..., None] - alpha_BxK * delta_B[..., None])
                        / (alpha_BxK * strength_b_B[..., None]))
    t_BxK = jnp.where(is_near_BxK, t_from_delta_BxK, beta_BxK / rescaled_alpha_BxK - 1.0)
    log_x_BxK = (jnp.log(strength_a_B / strength_b_B)[..., None]
                 - jnp.log(alpha_BxK / beta_BxK))
    return _KLShared(strength_a_B, strength_b_B, delta_BxK, delta_B, rescaled_alpha_BxK,
                     is_near_BxK, t_BxK, log_x_BxK)


@jax.custom_jvp
def _dirichlet_kl(alpha_BxK: jax.Array, beta_BxK: jax.Array) -> jax.Array:
    sh = _kl_shared(alpha_BxK, beta_BxK)

    # B KL_cat(b/B || a/A) = sum_k a'_k phi(x_k).
    categorical_B = jnp.sum(
        _phi_times(sh.rescaled_alpha_BxK, sh.t_BxK, sh.log_x_BxK, beta_BxK), axis=-1)

    # sum_k D~(b_k, a_k) - D~(B, A) without the far pairs' d terms; the strength pair is
    # evaluated as an extra column with the classes.
    near_all, excess_all = _bregman_excess(
        jnp.concatenate([alpha_BxK, sh.strength_a_B[..., None]], axis=-1),
        jnp.concatenate([sh.delta_BxK, sh.delta_B[..., None]], axis=-1),
        jnp.concatenate([beta_BxK, sh.strength_b_B[..., None]], axis=-1))
    class_near_BxK, strength_near_B = near_all[..., :-1], near_all[..., -1]
    excess_B = jnp.sum(excess_all[..., :-1], axis=-1) - excess_all[..., -1]

    # The far pairs' d terms: sum_{far k} -delta_k d(a_k) + [S far] delta_S d(A)
    #   = sum_{far k} delta_k (d(A) - d(a_k)) + d(A) ([S far] delta_S - sum_{far k} delta_k).
    class_far_BxK = jnp.logical_not(class_near_BxK)
    d_gap_BxK = _digamma_minus_log_diff(alpha_BxK, _complement_sum(alpha_BxK),
                                        sh.strength_a_B[..., None])
    far_delta_BxK = jnp.where(class_far_BxK, sh.delta_BxK, 0.0)
    coefficient_B = jnp.where(strength_near_B, -jnp.sum(far_delta_BxK, axis=-1),
                              jnp.sum(jnp.where(class_far_BxK, 0.0, sh.delta_BxK), axis=-1))
    d_terms_B = (jnp.sum(far_delta_BxK * d_gap_BxK, axis=-1)
                 + _digamma_minus_log(sh.strength_a_B) * coefficient_B)
    return categorical_B + excess_B + d_terms_B


@functools.partial(_dirichlet_kl.defjvp, symbolic_zeros=True)
def _dirichlet_kl_jvp(primals, tangents):
    alpha_BxK, beta_BxK = primals
    alpha_dot, beta_dot = tangents
    kl_B = _dirichlet_kl(alpha_BxK, beta_BxK)
    sh = _kl_shared(alpha_BxK, beta_BxK)
    tangent_B = jnp.zeros_like(kl_B)
    if not isinstance(alpha_dot, SymbolicZero):
        v_all = _scaled_trigamma_minus_one(
            jnp.concatenate([alpha_BxK, sh.strength_a_B[..., None]], axis=-1))
        grad_alpha_BxK = (-sh.t_BxK * (sh.strength_b_B / sh.strength_a_B)[..., None]
                          + (sh.delta_B * v_all[..., -1] / sh.strength_a_B)[..., None]
                          - sh.delta_BxK * v_all[..., :-1] / alpha_BxK)
        tangent_B = tangent_B + jnp.sum(grad_alpha_BxK * alpha_dot, axis=-1)
    if not isinstance(beta_dot, SymbolicZero):
        d_gaps = _digamma_minus_log_diff(
            jnp.concatenate([alpha_BxK, sh.strength_a_B[..., None]], axis=-1),
            jnp.concatenate([sh.delta_BxK, sh.delta_B[..., None]], axis=-1),
            jnp.concatenate([beta_BxK, sh.strength_b_B[..., None]], axis=-1))
        log_x_BxK = jnp.where(sh.is_near_BxK, jnp.log1p(sh.t_BxK), sh.log_x_BxK)
        grad_beta_BxK = log_x_BxK + d_gaps[..., :-1] - d_gaps[..., -1:]
        tangent_B = tangent_B + jnp.sum(grad_beta_BxK * beta_dot, axis=-1)
    return kl_B, tangent_B


def dirichlet_kl(alpha_BxK: ArrayLike, beta_BxK: ArrayLike) -> jax.Array:
    """KL(Dir(alpha) || Dir(beta)) per example, for an arbitrary per-example beta.

    The closed form (paper, Appendix proposition closed-form) is

        lgamma(A) - lgamma(B) + sum_k [lgamma(b_k) - lgamma(a_k)]
            + sum_k (a_k - b_k) (digamma(a_k) - digamma(A)),     A = sum a,  B = sum b.

    Rewrite (algebraically identical; why: see the module docstring). The closed form equals
    sum_k D(b_k, a_k) - D(B, A), with D(y, x) = lgamma(y) - lgamma(x) - digamma(x) (y - x) the
    Bregman divergence of lgamma (each D >= 0). Splitting D(y, x) = x phi(y/x) + D~(y, x) with
    phi(z) = z log z - z + 1 and summing the leading parts exactly gives

        KL = sum_k a'_k phi(b_k / a'_k)      (= B KL_cat(b/B || a/A) >= 0,  a' = a B / A)
           + sum_k D~(b_k, a_k) - D~(B, A).

    * phi is evaluated by its series near 1, with t = x - 1 formed from the differences
      delta_k = b_k - a_k when b is near a (no cancellation in x - 1).
    * D~ is a quadrature of psi1(t) - 1/t for near pairs and Stirling remainders for far ones
      (`_bregman_excess`); the far pairs' terms -delta_k d(a_k) and +delta_S d(A) are regrouped
      as delta_k (d(A) - d(a_k)), which is evaluated by quadrature when alpha_k ~ A (a confident
      class with a huge delta_k would otherwise multiply the rounding error of d(A) - d(a_k)).
    * B - A is the sum of the per-class differences, not the difference of two rounded sums.
    * The derivative is supplied analytically (`jax.custom_jvp`), in the same cancellation-free
      terms: dKL/dalpha_k = psi1(A)(B - A) - psi1(a_k)(b_k - a_k)
      = -t_k B/A + [(B - A) v(A)/A - (b_k - a_k) v(a_k)/a_k] and
      dKL/dbeta_k = log x_k + [d(b_k) - d(a_k)] - [d(B) - d(A)]; this also keeps the compiled
      gradient small.

    No term is of size S log S any more; every term vanishes identically at alpha == beta (so
    KL(Dir(a) || Dir(a)) is exactly 0), and near alpha == beta every term is second order, so
    small divergences keep float32 relative precision instead of an absolute error of ~1e2 at
    S ~ 1e8 (or ~1e-6 for S < 10).

    Args:
      alpha_BxK: concentrations of the first Dirichlet (the prediction), shape (..., K), > 0.
      beta_BxK: concentrations of the second (the prior / target), broadcastable to alpha's
        shape, > 0.

    Returns:
      kl_B, shape (...), >= 0 up to rounding.

    Example:
      >>> alpha_BxK = jnp.array([[5.0, 1.0, 2.0], [1.0, 1.0, 1.0]])
      >>> kl_B = ev.dirichlet_kl(alpha_BxK, jnp.ones((2, 3)))
      >>> print(np.asarray(kl_B).round(4))  # 0 for identical Dirichlets
      [1.023 0.   ]
    """
    alpha_BxK = jnp.asarray(alpha_BxK)
    beta_BxK = jnp.broadcast_to(jnp.asarray(beta_BxK, dtype=alpha_BxK.dtype), alpha_BxK.shape)
    return _dirichlet_kl(alpha_BxK, beta_BxK)


def _fisher_logdet_and_numerator(alpha_BxK: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(-log det I(alpha), N = S (1 - x)); see `fisher_logdet`."""
    num_classes = alpha_BxK.shape[-1]
    strength_B = jnp.sum(alpha_BxK, axis=-1)
    is_max_BxK = jax.nn.one_hot(jnp.argmax(alpha_BxK, axis=-1), num_classes, dtype=jnp.bool_)
    alpha_max_B = jnp.max(alpha_BxK, axis=-1)
    rest_max_B = jnp.sum(jnp.where(is_max_BxK, 0.0, alpha_BxK), axis=-1)
    # v and s of every alpha_k, of S and of alpha_m in one evaluation.
    v_all, s_all = _trigamma_parts(jnp.concatenate(
        [alpha_BxK, strength_B[..., None], alpha_max_B[..., None]], axis=-1))
    v_BxK, v_B, v_max_B = v_all[..., :-2], v_all[..., -2], v_all[..., -1]
    s_B, s_max_B = s_all[..., -2], s_all[..., -1]
    c_BxK = alpha_BxK * v_BxK / (1.0 + v_BxK)                  # alpha_k - 1/psi1(alpha_k)
    inv_trigamma_BxK = alpha_BxK / (1.0 + v_BxK)               # 1/psi1(alpha_k)
    c_sum_B = jnp.sum(c_BxK, axis=-1)

    # 1. C - v(S) (S - C).
    q_B = jnp.sum(inv_trigamma_BxK, axis=-1)
    form1_B = c_sum_B - v_B * q_B
    size1_B = c_sum_B + v_B * q_B
    # 2. sum_{k != m} c_k - (1/2 - c_m) + C v(S) - s(S).
    half_minus_c_max_B = (0.5 * v_max_B - s_max_B) / (1.0 + v_max_B)
    c_rest_B = jnp.sum(jnp.where(is_max_BxK, 0.0, c_BxK), axis=-1)
    form2_B = c_rest_B - half_minus_c_max_B + c_sum_B * v_B - s_B
    size2_B = c_rest_B + jnp.abs(half_minus_c_max_B) + c_sum_B * v_B + jnp.abs(s_B)
    # 3. S (psi1(a_m) - psi1(S)) / psi1(a_m) - (1 + v(S)) sum_{k != m} 1/psi1(a_k).
    trigamma_max_B = (1.0 + v_max_B) / alpha_max_B
    is_near, h_near = _near(alpha_max_B, rest_max_B)
    trigamma_drop_B = jnp.where(
        is_near,
        -h_near * _gauss_legendre(lambda t: special.polygamma(2, t), alpha_max_B, h_near),
        trigamma_max_B - (1.0 + v_B) / strength_B)
    first_B = strength_B * trigamma_drop_B / trigamma_max_B
    second_B = (1.0 + v_B) * jnp.sum(jnp.where(is_max_BxK, 0.0, inv_trigamma_BxK), axis=-1)
    form3_B = first_B - second_B
    size3_B = jnp.abs(first_B) + second_B

    numerator_B = jnp.where(size1_B <= size2_B, form1_B, form2_B)
    numerator_B = jnp.where(size3_B < jnp.minimum(size1_B, size2_B), form3_B, numerator_B)
    numerator_B = jnp.maximum(numerator_B, jnp.finfo(numerator_B.dtype).tiny)
    log_one_minus_x_B = jnp.log(numerator_B) - jnp.log(strength_B)
    sum_log_trigamma_B = jnp.sum(jnp.log1p(v_BxK) - jnp.log(alpha_BxK), axis=-1)
    return -(sum_log_trigamma_B + log_one_minus_x_B), numerator_B


@jax.custom_jvp
def _fisher_logdet(alpha_BxK: jax.Array) -> jax.Array:
    return _fisher_logdet_and_numerator(alpha_BxK)[0]


@_fisher_logdet.defjvp
def _fisher_logdet_jvp(primals, tangents):
    (alpha_BxK,), (alpha_dot,) = primals, tangents
    value_B, numerator_B = _fisher_logdet_and_numerator(alpha_BxK)
    strength_B = jnp.sum(alpha_BxK, axis=-1)
    points = jnp.concatenate([alpha_BxK, strength_B[..., None]], axis=-1)
    v_all, dv_all = jax.jvp(_scaled_trigamma_minus_one, (points,), (jnp.ones_like(points),))
    v_BxK, v_B = v_all[..., :-1], v_all[..., -1]
    dv_BxK, dv_B = dv_all[..., :-1], dv_all[..., -1]
    q_B = jnp.sum(alpha_BxK / (1.0 + v_BxK), axis=-1)                 # sum_k 1/psi1(alpha_k)
    dc_BxK = (v_BxK * (1.0 + v_BxK) + alpha_BxK * dv_BxK) / (1.0 + v_BxK) ** 2
    bracket_BxK = ((v_B + dv_B * q_B)[..., None] - (1.0 + v_B)[..., None] * dc_BxK)
    grad_BxK = (1.0 / alpha_BxK - dv_BxK / (1.0 + v_BxK) + (1.0 / strength_B)[..., None]
                + bracket_BxK / numerator_B[..., None])
    return value_B, jnp.sum(grad_BxK * alpha_dot, axis=-1)


def fisher_logdet(alpha_BxK: ArrayLike) -> jax.Array:
    """-log det I(alpha) for the Dirichlet Fisher information I = diag(psi1(alpha)) - psi1(S) 1 1^T.

    I-EDL's L_F (github.com/danruod/IEDL, code_classical/models/FisherEvidentialN.py), via the
    matrix determinant lemma:

        -log det I = -[sum_k log psi1(alpha_k) + log(1 - x)],  x = psi1(S) sum_k 1/psi1(alpha_k).

    Numerics. log psi1(a) = log1p(v(a)) - log a with v(a) = a psi1(a) - 1 > 0 (~ 1/(2a); its
    asymptotic series for large a). The factor 1 - x is the delicate part: at large concentrations
    x -> 1 and 1 - x ~ (K - 1) / (2S) is lost entirely in float32 (log1p(-x) is -inf once x rounds
    to 1, e.g. at S ~ 1e7), and when one class dominates (alpha = (3, 1e-4), say) 1 - x ~ 1e-5 is
    a small difference of O(1) terms. S (1 - x) is therefore evaluated in three algebraically
    equal ways, and the one whose terms have the smallest total magnitude (the smallest rounding
    error) is used. With c(a) = a - 1/psi1(a) = a v / (1 + v) in (0, 1/2), C = sum_k c(alpha_k),
    m the largest class and s(x) = x v(x) - 1/2 (~ 1/(6x), a series for large x):

      1. C - v(S) (S - C)                                    (small S, where v(S) ~ 1/S);
      2. sum_{k != m} c_k - (1/2 - c_m) + C v(S) - s(S)      (large S: only O(1/S) terms cancel);
      3. S (psi1(alpha_m) - psi1(S)) / psi1(alpha_m) - (1 + v(S)) sum_{k != m} 1/psi1(alpha_k)
         (one dominant class; psi1(alpha_m) - psi1(S) is a quadrature of -psi2 over
         [alpha_m, S] when S - alpha_m <= alpha_m / 2, so it keeps relative precision).

    The result is floored at the smallest normal float so the log stays finite.

    The derivative is supplied analytically (`jax.custom_jvp`) from the same pieces: with
    N = S (1 - x), Q = sum_k 1/psi1(alpha_k) and v' the derivative of v,

        d/d alpha_j = 1/alpha_j - v'_j / (1 + v_j) + 1/S
                      + [v(S) + v'(S) Q - (1 + v(S)) c'(alpha_j)] / N,

    where the bracket is O(1/S**2) at large S and the other terms O(1/alpha_j), so its rounding
    does not matter; differentiating the three-way selection above instead would compile a
    several times larger program.

    Args:
      alpha_BxK: concentrations, shape (..., K), K >= 2, > 0.

    Returns:
      -log det I(alpha), shape (...).

    Example:
      >>> alpha_BxK = jnp.array([[1.0, 1.0, 1.0], [10.0, 2.0, 2.0]])
      >>> print(np.asarray(ev.fisher_logdet(alpha_BxK)).round(4))
      [-0.2192  5.842 ]
    """
    return _fisher_logdet(jnp.asarray(alpha_BxK))
