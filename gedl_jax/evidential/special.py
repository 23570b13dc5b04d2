"""Special functions of the Dirichlet math, accurate in float32 from 1e-4 to 1e6.

lgamma, digamma and trigamma are split into Stirling leading parts, whose combinations callers
simplify analytically, and small remainders evaluated by asymptotic series (shifted by the
recurrences below the series range; no XLA lgamma / digamma, which carry ~2e-6 absolute error in
float32). Differences F(y) - F(x) of nearly equal arguments are integrals of F' by 8-node
Gauss-Legendre, so they keep relative precision however close y is to x. `dirichlet`,
`loss_terms` and `uncertainty` build on these; each function states its domain and accuracy.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

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
# 8-node Gauss-Legendre rule on [0, 1] (nodes s_i, weights w_i), for `gauss_legendre`.
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


def lgamma_remainder(x: jax.Array) -> jax.Array:
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


def digamma_series_part(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(n, d(x + n) + log1p(n/x) - sum_{0<j<n} 1/(x + j)), shared by d and g."""
    n, y = _shift(x, _SERIES_MIN_LOG)
    z = 1.0 / (y * y)
    result = -0.5 / y - z * _horner(_DIGAMMA_REMAINDER, z) + jnp.log1p(n / x)
    for j in (1.0, 2.0):
        result = result - jnp.where(j < n, 1.0 / (x + j), 0.0)
    return n, result


def digamma_minus_log(x: jax.Array) -> jax.Array:
    """d(x) = digamma(x) - log x (~ -1/(2x) for large x; ~ -1/x for small x).

    From digamma(x) = digamma(x + n) - sum_{j<n} 1/(x + j):
    d(x) = d(x + n) + log1p(n/x) - sum_{j<n} 1/(x + j).
    """
    n, part = digamma_series_part(x)
    return part - jnp.where(n > 0, 1.0 / x, 0.0)


def digamma1p_minus_log(x: jax.Array) -> jax.Array:
    """g(x) = digamma(x + 1) - log x = d(x) + 1/x (~ 1/(2x) for large x; ~ -log x for small x).

    For n > 0 the 1/x of the recurrence cancels analytically (never d(x) + 1/x, which would
    cancel -1/x against 1/x in floating point for small x).
    """
    n, part = digamma_series_part(x)
    return part + jnp.where(n > 0, 0.0, 1.0 / x)


def trigamma_core(x: jax.Array):
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


def scaled_trigamma_minus_one(x: jax.Array) -> jax.Array:
    """v(x) = x psi1(x) - 1 > 0 (~ 1/(2x) for large x; ~ 1/x for small x)."""
    n, _, _, core = trigamma_core(x)
    return core + jnp.where(n > 0, 1.0 / x, 0.0)


def trigamma(x: jax.Array) -> jax.Array:
    """trigamma(x) = (1 + v(x)) / x."""
    return (1.0 + scaled_trigamma_minus_one(x)) / x


def trigamma_parts(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(v(x), s(x)) with s(x) = x v(x) - 1/2 (~ 1/(6x) for large x, = P / x there without
    cancellation; 1/2 + x core below the series range)."""
    n, p, y, core = trigamma_core(x)
    v = core + jnp.where(n > 0, 1.0 / x, 0.0)
    s = jnp.where(n > 0, 0.5 + x * core, p / y)
    return v, s


def reciprocal_minus_trigamma1p(t: jax.Array) -> jax.Array:
    """1/t - psi1(t + 1) = (1/t - v(t)) / t > 0 (minus the derivative of g).

    1/t - v(t) is -core below the series range (no 1/t to cancel) and 1/t - v(t) ~ 1/(2t) above.
    """
    n, _, _, core = trigamma_core(t)
    return jnp.where(n > 0, -core, 1.0 / t - core) / t


def phi_times(scale: jax.Array, t: jax.Array, log_x: jax.Array, target: jax.Array) -> jax.Array:
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


def complement_sum(alpha_BxK: jax.Array) -> jax.Array:
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


def stable_probabilities(alpha_BxK: jax.Array) -> _Probabilities:
    """S, p = alpha/S, 1 - p and S - alpha, accurate in value and in derivative.

    p_k = 1 / (1 + rest_k / alpha_k) and 1 - p_k = 1 / (1 + alpha_k / rest_k): the textbook
    alpha_k / S differentiates to 1/S - alpha_k/S**2, which rounds to 0 instead of rest_k/S**2
    for a dominant class (and (S - alpha_k)/S likewise for a class with p_k ~ 1e-8); these forms
    differentiate to rest_k/S**2 and alpha_k/S**2 directly, and 1 - p_k has no 1 - p cancellation.
    """
    rest_BxK = complement_sum(alpha_BxK)
    return _Probabilities(jnp.sum(alpha_BxK, axis=-1), 1.0 / (1.0 + rest_BxK / alpha_BxK),
                          1.0 / (1.0 + alpha_BxK / rest_BxK), rest_BxK)


def gauss_legendre(integrand, x: jax.Array, h: jax.Array, weight=None) -> jax.Array:
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


def trigamma_minus_reciprocal(t: jax.Array) -> jax.Array:
    """psi1(t) - 1/t = v(t) / t > 0 (the derivative of d(t) = digamma(t) - log t)."""
    return scaled_trigamma_minus_one(t) / t


def near_split(x: jax.Array, h: jax.Array) -> tuple[jax.Array, jax.Array]:
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


@_difference(trigamma_minus_reciprocal)
def digamma_minus_log_diff(x: jax.Array, h: jax.Array, y: jax.Array) -> jax.Array:
    """d(y) - d(x) for y = x + h (both given, so the caller's accurate h is used).

    Quadrature of psi1(t) - 1/t > 0 when |h| <= x/2 (no cancellation of two nearly equal d values,
    e.g. for the largest class, where S - alpha_k is tiny); the plain difference otherwise.
    """
    is_near, h_near = near_split(x, h)
    near = h_near * gauss_legendre(trigamma_minus_reciprocal, x, h_near)
    return jnp.where(is_near, near, digamma_minus_log(y) - digamma_minus_log(x))


@_difference(reciprocal_minus_trigamma1p)
def digamma1p_minus_log_diff(x: jax.Array, h: jax.Array, y: jax.Array) -> jax.Array:
    """g(x) - g(y) >= 0 for y = x + h >= x, g(t) = digamma(t + 1) - log t (decreasing), i.e.
    G(y) - G(x) with G = -g, G' = 1/t - psi1(t + 1).

    Quadrature of 1/t - psi1(t + 1) > 0 when h <= x/2; the plain difference otherwise.
    """
    is_near, h_near = near_split(x, h)
    near = h_near * gauss_legendre(reciprocal_minus_trigamma1p, x, h_near)
    return jnp.where(is_near, near, digamma1p_minus_log(x) - digamma1p_minus_log(y))


@_difference(trigamma)
def digamma_diff(x: jax.Array, h: jax.Array, y: jax.Array) -> jax.Array:
    """digamma(y) - digamma(x) for y = x + h: quadrature of psi1 when |h| <= x/2, else direct."""
    is_near, h_near = near_split(x, h)
    near = h_near * gauss_legendre(trigamma, x, h_near)
    far = jnp.log(y / x) + digamma_minus_log(y) - digamma_minus_log(x)
    return jnp.where(is_near, near, far)


def bregman_excess(x: jax.Array, h: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The second-order part of lgamma's Bregman divergence from x to y = x + h, without d.

    D(y, x) = lgamma(y) - lgamma(x) - digamma(x) h splits into x phi(y/x) (the Bregman divergence
    of t log t - t) plus D~(y, x) = int_x^y (y - t)(psi1(t) - 1/t) dt. Returns (is_near, G) with

    * near pairs (|h| <= x/2): G = D~ = h**2 int_0^1 (1 - s)(psi1 - 1/t)(x + s h) ds by quadrature,
      second order in h with float32 relative precision however small h is (two lgamma values
      would carry float32 lgamma's ~1e-6 absolute error below 10 into a result that can be 1e-12);
    * far pairs: G = D~ + h d(x) = (1/2) log(x/y) + r(y) - r(x), every term O(1) or O(1/x). The
      caller adds -h d(x), grouped with the matching strength term (see `dirichlet_kl`).
    """
    is_near, h_near = near_split(x, h)
    near = h_near * h_near * gauss_legendre(trigamma_minus_reciprocal, x, h_near,
                                             weight=lambda s: 1.0 - s)
    remainder = lgamma_remainder(jnp.concatenate([x, y], axis=-1))
    size = x.shape[-1]
    far = 0.5 * jnp.log(x / y) + remainder[..., size:] - remainder[..., :size]
    return is_near, jnp.where(is_near, near, far)
