"""Prior specification and the evidence -> Dirichlet map (paper Sec. 2 and Sec. 4).

alpha = e + W a (Eq. e2alpha), with base rate a (a probability vector over the K classes) and
prior strength W, either fixed (EDL: W = K; R-EDL: W = lambda K) or GEDL's adaptive
W = (K + C_w K E) / (1 + K E) (Eq. weight_update). The subjective opinion is b = e / S, u = W / S
(Eq. compute_opinion) and the projected probability p = b + u a = alpha / S (Eq. opinion2prob).

All functions are pure, act on the last axis (classes) and keep arbitrary leading batch axes.
W is always returned under `jax.lax.stop_gradient` (paper, Appendix "Implementation Details").
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike


class Opinion(NamedTuple):
    """A subjective opinion (Eq. compute_opinion): belief masses b_k = e_k / S, uncertainty
    mass u = W / S and the base rate a. sum_k b_k + u = 1 when sum_k a_k = 1."""

    belief_BxK: jax.Array
    uncertainty_B: jax.Array
    base_rate_K: jax.Array


def uniform_base_rate(num_classes: int, dtype=jnp.float32) -> jax.Array:
    """The uniform base rate a = (1/K, ..., 1/K) used by EDL, I-EDL, R-EDL, RED and GEDL.

    Args:
      num_classes: K (a static Python int, >= 1).
      dtype: floating dtype of the result.

    Returns:
      a_K, shape (K,).

    Example:
      >>> print(ev.uniform_base_rate(4))
      [0.25 0.25 0.25 0.25]
    """
    if int(num_classes) < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    return jnp.full((int(num_classes),), 1.0 / int(num_classes), dtype=dtype)


def base_rate_from_counts(counts_K: ArrayLike) -> jax.Array:
    """A base rate from label frequencies, a_k = n_k / sum_j n_j (MERIT's prior, paper Sec. 3.1).

    The counts are validated when they are concrete (not traced): every count must be finite and
    strictly positive, since a_k = 0 would give alpha_k = 0 for a class without evidence, outside
    the Dirichlet's domain.

    Args:
      counts_K: per-class counts (or any positive weights), shape (K,).

    Returns:
      a_K, float32 (or the counts' floating dtype), summing to 1.

    Raises:
      ValueError: if concrete counts are not all finite and > 0, or not one-dimensional.

    Example:
      >>> print(ev.base_rate_from_counts(jnp.array([10, 10, 20])))
      [0.25 0.25 0.5 ]
    """
    try:
        counts_np = np.asarray(counts_K, dtype=np.float64)
    except jax.errors.TracerArrayConversionError:
        counts_np = None                 # traced: nothing to validate
    if counts_np is not None:
        if counts_np.ndim != 1 or counts_np.size == 0:
            raise ValueError(f"counts_K must be a non-empty vector, got shape {counts_np.shape}")
        if not np.all(np.isfinite(counts_np)) or not np.all(counts_np > 0):
            raise ValueError(f"every class count must be finite and > 0, got {counts_np}")
    counts = jnp.asarray(counts_K)
    if not jnp.issubdtype(counts.dtype, jnp.floating):
        counts = counts.astype(jnp.float32)
    return counts / jnp.sum(counts)


def adaptive_prior_strength(evidence_BxK: ArrayLike, c_w: ArrayLike) -> jax.Array:
    """GEDL's prior strength W = (K + C_w K E) / (1 + K E), E = sum_k e_k (Eq. weight_update).

    W(E = 0) = K (the EDL prior Dir(1) under a uniform base rate) and W -> C_w as E -> infinity,
    monotonically. Computed as the algebraically equal W = C_w + (K - C_w) / (1 + K E), which has
    no inf/inf at huge E (K E overflowing float32 gives exactly C_w) and no cancellation.
    Stop-gradient: W is a prior, not a function the network may shape (paper, Appendix).

    Args:
      evidence_BxK: non-negative evidence, shape (..., K).
      c_w: the limit C_w (a scalar; 0.5 in the paper).

    Returns:
      W_B, shape (...), under stop_gradient.

    Example:
      >>> evidence_BxK = jnp.array([[0.0, 0.0, 0.0], [9.0, 0.5, 0.5]])
      >>> w_B = ev.adaptive_prior_strength(evidence_BxK, c_w=0.5)
      >>> print(np.asarray(w_B).round(4))  # K at E = 0, towards C_w as E grows
      [3.     0.5806]
    """
    evidence_BxK = jnp.asarray(evidence_BxK)
    num_classes = evidence_BxK.shape[-1]
    total_B = jnp.sum(evidence_BxK, axis=-1)
    c_w = jnp.asarray(c_w, dtype=total_B.dtype)
    w_B = c_w + (num_classes - c_w) / (1.0 + num_classes * total_B)
    return jax.lax.stop_gradient(w_B)


def fixed_prior_strength(evidence_BxK: ArrayLike, w: ArrayLike) -> jax.Array:
    """A constant prior strength W broadcast to the batch shape (EDL: W = K; R-EDL: W = lambda K).

    Args:
      evidence_BxK: evidence, shape (..., K); only its shape and dtype are used.
      w: the prior strength (a scalar).

    Returns:
      W_B, shape (...), under stop_gradient.

    Example:
      >>> print(ev.fixed_prior_strength(jnp.ones((2, 3)), 3.0))
      [3. 3.]
    """
    evidence_BxK = jnp.asarray(evidence_BxK)
    dtype = evidence_BxK.dtype if jnp.issubdtype(evidence_BxK.dtype, jnp.floating) else jnp.float32
    w_B = jnp.broadcast_to(jnp.asarray(w, dtype=dtype), evidence_BxK.shape[:-1])
    return jax.lax.stop_gradient(w_B)


def dirichlet_alpha(evidence_BxK: ArrayLike, prior_strength_B: ArrayLike,
                    base_rate_K: ArrayLike) -> jax.Array:
    """Dirichlet concentrations alpha = e + W a (Eq. e2alpha).

    Args:
      evidence_BxK: non-negative evidence, shape (..., K).
      prior_strength_B: W, shape (...) (one value per example; a scalar is broadcast).
      base_rate_K: a, shape (K,) (or (..., K) for a per-example base rate).

    Returns:
      alpha_BxK, shape (..., K).

    Example:
      >>> evidence_BxK = jnp.array([[4.0, 0.0, 1.0]])
      >>> print(ev.dirichlet_alpha(evidence_BxK, 3.0, ev.uniform_base_rate(3)))
      [[5. 1. 2.]]
    """
    evidence_BxK = jnp.asarray(evidence_BxK)
    prior_strength_B = jnp.broadcast_to(jnp.asarray(prior_strength_B), evidence_BxK.shape[:-1])
    base_rate_BxK = jnp.broadcast_to(jnp.asarray(base_rate_K), evidence_BxK.shape)
    return evidence_BxK + prior_strength_B[..., None] * base_rate_BxK


def dirichlet_strength(alpha_BxK: ArrayLike) -> jax.Array:
    """Dirichlet strength S = sum_k alpha_k (Eq. compute_opinion).

    Args:
      alpha_BxK: concentrations, shape (..., K).

    Returns:
      S_B, shape (...).

    Example:
      >>> print(ev.dirichlet_strength(jnp.array([[5.0, 1.0, 2.0], [1.0, 1.0, 1.0]])))
      [8. 3.]
    """
    return jnp.sum(jnp.asarray(alpha_BxK), axis=-1)


def projected_probability(alpha_BxK: ArrayLike) -> jax.Array:
    """Projected probability p_k = alpha_k / S = E[pi_k] (Eq. opinion2prob).

    Args:
      alpha_BxK: concentrations, shape (..., K).

    Returns:
      p_BxK, shape (..., K), summing to 1.

    Example:
      >>> print(ev.projected_probability(jnp.array([5.0, 1.0, 2.0])))
      [0.625 0.125 0.25 ]
    """
    alpha_BxK = jnp.asarray(alpha_BxK)
    return alpha_BxK / dirichlet_strength(alpha_BxK)[..., None]


def uncertainty_mass(alpha_BxK: ArrayLike, prior_strength_B: ArrayLike) -> jax.Array:
    """Uncertainty mass u = W / S (Eq. compute_opinion).

    For a fixed W this ranks like 1/S; for GEDL's adaptive W it is the correct score: S = E + W is
    not monotone in the evidence E (K = 10, C_w = 0.5: E = 0, 1, 10 give S = 10, 2.36, 10.59),
    while u = 1 / (1 + E / W) decreases (1, 0.577, 0.056).

    Args:
      alpha_BxK: concentrations, shape (..., K).
      prior_strength_B: W, shape (...).

    Returns:
      u_B, shape (...), in (0, 1] when alpha = e + W a with e >= 0 and sum a = 1.

    Example:
      >>> alpha_BxK = jnp.array([[5.0, 1.0, 2.0], [1.0, 1.0, 1.0]])
      >>> print(ev.uncertainty_mass(alpha_BxK, jnp.array([3.0, 3.0])))
      [0.375 1.   ]
    """
    return jnp.asarray(prior_strength_B) / dirichlet_strength(alpha_BxK)


def subjective_opinion(evidence_BxK: ArrayLike, prior_strength_B: ArrayLike,
                       base_rate_K: ArrayLike) -> Opinion:
    """The subjective opinion (b, u, a) of Eq. compute_opinion: b_k = e_k / S, u = W / S.

    With S = sum_k (e_k + W a_k): sum_k b_k + u = 1 and b + u a = alpha / S (Eq. opinion2prob).

    Args:
      evidence_BxK: non-negative evidence, shape (..., K).
      prior_strength_B: W, shape (...).
      base_rate_K: a, shape (K,).

    Returns:
      Opinion(belief_BxK, uncertainty_B, base_rate_K).

    Example:
      >>> op = ev.subjective_opinion(jnp.array([4.0, 0.0, 1.0]), 3.0, ev.uniform_base_rate(3))
      >>> print(op.belief_BxK, op.uncertainty_B)
      [0.5   0.    0.125] 0.375
    """
    evidence_BxK = jnp.asarray(evidence_BxK)
    alpha_BxK = dirichlet_alpha(evidence_BxK, prior_strength_B, base_rate_K)
    strength_B = dirichlet_strength(alpha_BxK)
    belief_BxK = evidence_BxK / strength_B[..., None]
    uncertainty_B = jnp.asarray(prior_strength_B) / strength_B
    return Opinion(belief_BxK, uncertainty_B, jnp.asarray(base_rate_K))
