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

The special functions and difference quadratures they use are in `special.py`.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.custom_derivatives import SymbolicZero
from jax.scipy import special
from jax.typing import ArrayLike

from gedl_jax.evidential.special import (
    bregman_excess,
    complement_sum,
    digamma_minus_log,
    digamma_minus_log_diff,
    gauss_legendre,
    near_split,
    phi_times,
    scaled_trigamma_minus_one,
    trigamma_parts,
)


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
        phi_times(sh.rescaled_alpha_BxK, sh.t_BxK, sh.log_x_BxK, beta_BxK), axis=-1)

    # sum_k D~(b_k, a_k) - D~(B, A) without the far pairs' d terms; the strength pair is
    # evaluated as an extra column with the classes.
    near_all, excess_all = bregman_excess(
        jnp.concatenate([alpha_BxK, sh.strength_a_B[..., None]], axis=-1),
        jnp.concatenate([sh.delta_BxK, sh.delta_B[..., None]], axis=-1),
        jnp.concatenate([beta_BxK, sh.strength_b_B[..., None]], axis=-1))
    class_near_BxK, strength_near_B = near_all[..., :-1], near_all[..., -1]
    excess_B = jnp.sum(excess_all[..., :-1], axis=-1) - excess_all[..., -1]

    # The far pairs' d terms: sum_{far k} -delta_k d(a_k) + [S far] delta_S d(A)
    #   = sum_{far k} delta_k (d(A) - d(a_k)) + d(A) ([S far] delta_S - sum_{far k} delta_k).
    class_far_BxK = jnp.logical_not(class_near_BxK)
    d_gap_BxK = digamma_minus_log_diff(alpha_BxK, complement_sum(alpha_BxK),
                                        sh.strength_a_B[..., None])
    far_delta_BxK = jnp.where(class_far_BxK, sh.delta_BxK, 0.0)
    coefficient_B = jnp.where(strength_near_B, -jnp.sum(far_delta_BxK, axis=-1),
                              jnp.sum(jnp.where(class_far_BxK, 0.0, sh.delta_BxK), axis=-1))
    d_terms_B = (jnp.sum(far_delta_BxK * d_gap_BxK, axis=-1)
                 + digamma_minus_log(sh.strength_a_B) * coefficient_B)
    return categorical_B + excess_B + d_terms_B


@functools.partial(_dirichlet_kl.defjvp, symbolic_zeros=True)
def _dirichlet_kl_jvp(primals, tangents):
    alpha_BxK, beta_BxK = primals
    alpha_dot, beta_dot = tangents
    kl_B = _dirichlet_kl(alpha_BxK, beta_BxK)
    sh = _kl_shared(alpha_BxK, beta_BxK)
    tangent_B = jnp.zeros_like(kl_B)
    if not isinstance(alpha_dot, SymbolicZero):
        v_all = scaled_trigamma_minus_one(
            jnp.concatenate([alpha_BxK, sh.strength_a_B[..., None]], axis=-1))
        grad_alpha_BxK = (-sh.t_BxK * (sh.strength_b_B / sh.strength_a_B)[..., None]
                          + (sh.delta_B * v_all[..., -1] / sh.strength_a_B)[..., None]
                          - sh.delta_BxK * v_all[..., :-1] / alpha_BxK)
        tangent_B = tangent_B + jnp.sum(grad_alpha_BxK * alpha_dot, axis=-1)
    if not isinstance(beta_dot, SymbolicZero):
        d_gaps = digamma_minus_log_diff(
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
      (`bregman_excess`); the far pairs' terms -delta_k d(a_k) and +delta_S d(A) are regrouped
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
    v_all, s_all = trigamma_parts(jnp.concatenate(
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
    is_near, h_near = near_split(alpha_max_B, rest_max_B)
    trigamma_drop_B = jnp.where(
        is_near,
        -h_near * gauss_legendre(lambda t: special.polygamma(2, t), alpha_max_B, h_near),
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
    v_all, dv_all = jax.jvp(scaled_trigamma_minus_one, (points,), (jnp.ones_like(points),))
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
