"""Uncertainty measures of a Dirichlet prediction (paper Sec. 3.4, Eqs. dist_uncertainty, dist_MI,
dist_var_sum; Appendix propositions expectation and u).

All functions return one value per example. Large-S accuracy matters here: the mutual information
is the difference of two entropies that agree to ~(K - 1) / (2S), so at S = 1e6 the textbook
H(p) - E[H(pi)] in float32 is pure rounding noise. It is evaluated instead as a sum of
non-negative per-class terms p_k [g(alpha_k) - g(S)], g(x) = psi(x + 1) - log x (~ 1/(2x)), which
is the same quantity with the large logarithms cancelled analytically.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from gedl_jax.evidential.special import (
    digamma1p_minus_log_diff,
    digamma_diff,
    digamma_minus_log_diff,
    lgamma_remainder,
    stable_probabilities,
)

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def _probability_and_complement(alpha_BxK: jax.Array):
    """(S, p_k = alpha_k / S, S - alpha_k), accurate in value and derivative
    (`special.stable_probabilities`)."""
    probabilities = stable_probabilities(alpha_BxK)
    return probabilities.strength_B, probabilities.p_BxK, probabilities.rest_BxK


def predictive_entropy(alpha_BxK: ArrayLike) -> jax.Array:
    """H(E[pi]) = -sum_k p_k log p_k, p = alpha / S (total uncertainty; Eq. dist_uncertainty).

    log p_k is evaluated as -log1p((S - alpha_k) / alpha_k), exact for p_k near 1 as well.

    Args:
      alpha_BxK: concentrations, shape (..., K).

    Returns:
      Entropy in nats, shape (...), in [0, log K].

    Example:
      >>> alpha_BxK = jnp.array([[1.0, 1.0, 1.0], [98.0, 1.0, 1.0]])
      >>> print(np.asarray(ev.predictive_entropy(alpha_BxK)).round(4))  # log 3, then near 0
      [1.0986 0.1119]
    """
    alpha_BxK = jnp.asarray(alpha_BxK)
    _, p_BxK, rest_BxK = _probability_and_complement(alpha_BxK)
    return jnp.sum(p_BxK * jnp.log1p(rest_BxK / alpha_BxK), axis=-1)


def expected_entropy(alpha_BxK: ArrayLike) -> jax.Array:
    """E_{pi ~ Dir(alpha)}[H(pi)] = -sum_k p_k (psi(alpha_k + 1) - psi(S + 1)) (aleatoric part;
    Appendix proposition expectation, E[pi_k log pi_k]).

    psi(S + 1) - psi(alpha_k + 1) is integrated (quadrature of psi1) when alpha_k carries most of
    S, so the small entropy of a confident prediction keeps its relative precision.

    Args:
      alpha_BxK: concentrations, shape (..., K).

    Returns:
      Expected entropy in nats, shape (...), >= 0.

    Example:
      >>> alpha_BxK = jnp.array([[1.0, 1.0, 1.0], [98.0, 1.0, 1.0]])
      >>> print(np.asarray(ev.expected_entropy(alpha_BxK)).round(4))
      [0.8333 0.1034]
    """
    alpha_BxK = jnp.asarray(alpha_BxK)
    strength_B, p_BxK, rest_BxK = _probability_and_complement(alpha_BxK)
    gap_BxK = digamma_diff(alpha_BxK + 1.0, rest_BxK, (strength_B + 1.0)[..., None])
    return jnp.sum(p_BxK * gap_BxK, axis=-1)


def mutual_information(alpha_BxK: ArrayLike) -> jax.Array:
    """I(y; pi) = H(E[pi]) - E[H(pi)] (distributional uncertainty, Eq. dist_uncertainty).

    Rewrite: with log p_k = log alpha_k - log S and g(x) = psi(x + 1) - log x,

        I = sum_k p_k [psi(alpha_k + 1) - psi(S + 1) - log p_k] = sum_k p_k [g(alpha_k) - g(S)],

    a sum of non-negative terms (g is decreasing). g(alpha_k) - g(S) is an asymptotic series for
    large arguments and a quadrature of 1/t - psi1(t + 1) when alpha_k ~ S, so I keeps float32
    relative precision at any S, where it approaches (K - 1) / (2S) (Eq. dist_MI, Appendix
    proposition u), instead of being the difference of two O(log K) numbers.

    Args:
      alpha_BxK: concentrations, shape (..., K).

    Returns:
      Mutual information in nats, shape (...), >= 0.

    Example:
      >>> alpha_BxK = jnp.array([[1.0, 1.0, 1.0], [100.0, 100.0, 100.0]])
      >>> print(np.asarray(ev.mutual_information(alpha_BxK)).round(4))  # same mean, more evidence
      [0.2653 0.0033]
    """
    alpha_BxK = jnp.asarray(alpha_BxK)
    strength_B, p_BxK, rest_BxK = _probability_and_complement(alpha_BxK)
    gap_BxK = digamma1p_minus_log_diff(alpha_BxK, rest_BxK, strength_B[..., None])
    return jnp.sum(p_BxK * gap_BxK, axis=-1)


def mutual_information_asymptote(alpha_BxK: ArrayLike) -> jax.Array:
    """(K - 1) / (2S): the leading term of the mutual information as S -> infinity at a fixed
    mean (Eq. dist_MI; Appendix proposition u), MI = (K - 1)/(2S) + O(S^-2). It depends on S
    only, so evidential uncertainty u = W/S with a bounded W follows the same 1/S law.

    Args:
      alpha_BxK: concentrations, shape (..., K).

    Returns:
      Shape (...), in nats.

    Example:
      >>> alpha_BxK = jnp.array([[100.0, 100.0, 100.0]])
      >>> print(np.asarray(ev.mutual_information_asymptote(alpha_BxK)).round(4))  # (K - 1) / (2 S)
      [0.0033]
    """
    alpha_BxK = jnp.asarray(alpha_BxK)
    num_classes = alpha_BxK.shape[-1]
    return (num_classes - 1) / (2.0 * jnp.sum(alpha_BxK, axis=-1))


def differential_entropy(alpha_BxK: ArrayLike) -> jax.Array:
    """Differential entropy of Dir(alpha) (the baselines' "-differential entropy" score).

    H = log B(alpha) + (S - K) psi(S) - sum_k (alpha_k - 1) psi(alpha_k). Rewrite: with
    lgamma(x) = (x - 1/2) log x - x + log(2 pi)/2 + r(x) and psi(x) = log x + d(x), the S log S
    terms cancel analytically and

        H = (1/2) sum_k log p_k - ((K - 1)/2) log S + (K - 1) log(2 pi)/2
            + sum_k r(alpha_k) - r(S) + sum_k (alpha_k - 1) (d(S) - d(alpha_k)),

    whose terms are O(K log S) rather than O(S log S) (lgamma(1e8) ~ 1.7e9 has a float32 spacing
    of 128; H itself is ~ -(K - 1)/2 log S). For large S it tends to the Gaussian entropy
    (1/2) log det(2 pi e Sigma) on the simplex.

    Args:
      alpha_BxK: concentrations, shape (..., K).

    Returns:
      Differential entropy in nats, shape (...) (negative for concentrated Dirichlets).

    Example:
      >>> alpha_BxK = jnp.array([[1.0, 1.0, 1.0], [10.0, 10.0, 10.0]])
      >>> print(np.asarray(ev.differential_entropy(alpha_BxK)).round(4))  # log(1/2) for Dir(1)
      [-0.6931 -2.269 ]
    """
    alpha_BxK = jnp.asarray(alpha_BxK)
    num_classes = alpha_BxK.shape[-1]
    strength_B, _, rest_BxK = _probability_and_complement(alpha_BxK)
    half_log_p_B = -0.5 * jnp.sum(jnp.log1p(rest_BxK / alpha_BxK), axis=-1)
    d_gap_BxK = digamma_minus_log_diff(alpha_BxK, rest_BxK, strength_B[..., None])
    return (half_log_p_B
            - 0.5 * (num_classes - 1) * (jnp.log(strength_B) - 2.0 * _HALF_LOG_2PI)
            + jnp.sum(lgamma_remainder(alpha_BxK), axis=-1) - lgamma_remainder(strength_B)
            + jnp.sum((alpha_BxK - 1.0) * d_gap_BxK, axis=-1))


def variance_sum(alpha_BxK: ArrayLike) -> jax.Array:
    """sum_k Var[pi_k] = sum_k p_k (1 - p_k) / (S + 1) (Eq. dist_var_sum; proposition expectation).

    Args:
      alpha_BxK: concentrations, shape (..., K).

    Returns:
      Total variance, shape (...), in [0, 1).

    Example:
      >>> print(np.asarray(ev.variance_sum(jnp.array([[1.0, 1.0, 1.0], [5.0, 1.0, 2.0]]))).round(4))
      [0.1667 0.059 ]
    """
    alpha_BxK = jnp.asarray(alpha_BxK)
    strength_B, p_BxK, one_minus_p_BxK, _ = stable_probabilities(alpha_BxK)
    return jnp.sum(p_BxK * one_minus_p_BxK, axis=-1) / (strength_B + 1.0)


def max_probability(alpha_BxK: ArrayLike) -> jax.Array:
    """max_k alpha_k / S (the "MP" confidence score of the I-EDL/R-EDL evaluation,
    github.com/danruod/IEDL, code_classical/utils/metrics.py).

    Args:
      alpha_BxK: concentrations, shape (..., K).

    Returns:
      Maximum projected probability, shape (...), in [1/K, 1].

    Example:
      >>> alpha_BxK = jnp.array([[5.0, 1.0, 2.0], [1.0, 1.0, 1.0]])
      >>> print(np.asarray(ev.max_probability(alpha_BxK)).round(4))
      [0.625  0.3333]
    """
    alpha_BxK = jnp.asarray(alpha_BxK)
    return jnp.max(alpha_BxK, axis=-1) / jnp.sum(alpha_BxK, axis=-1)


def total_evidence(evidence_BxK: ArrayLike) -> jax.Array:
    """E = sum_k e_k (ranks like -u = -W/S for GEDL's adaptive W: u = 1 / (1 + E / W) falls as E
    grows, while S = E + W does not rank with E).

    Args:
      evidence_BxK: non-negative evidence, shape (..., K).

    Returns:
      Total evidence, shape (...).

    Example:
      >>> print(ev.total_evidence(jnp.array([[4.0, 0.0, 1.0], [0.0, 0.0, 0.0]])))
      [5. 0.]
    """
    return jnp.sum(jnp.asarray(evidence_BxK), axis=-1)
