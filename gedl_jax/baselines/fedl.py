"""F-EDL (Yoon & Kim, "Uncertainty Quantification with the Flexible Dirichlet", NeurIPS 2025;
TaeseongYoon/F-EDL): the network predicts a Flexible Dirichlet FD(alpha, p, tau), the mixture
sum_k p_k Dir(alpha + tau e_k), with alpha = exp(g_alpha(f)), p = softmax(g_p(f)),
tau = softplus(g_tau(f)) (one scalar per example).

Moments (exact; variance re-derived from E[pi_j^2] of each mixture component), s = alpha_0 + tau:
  mean_k = (alpha_k + tau p_k) / s
  var_k  = mean_k (1 - mean_k) / (s + 1) + tau^2 p_k (1 - p_k) / (s (s + 1)).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike


class Moments(NamedTuple):
    mean_BxK: jax.Array
    variance_BxK: jax.Array


def moments(alpha_BxK: ArrayLike, p_BxK: ArrayLike, tau_B: ArrayLike) -> Moments:
    """Mean and per-class variance of FD(alpha, p, tau); tau -> 0 gives Dir(alpha)'s."""
    alpha_BxK, p_BxK = jnp.asarray(alpha_BxK), jnp.asarray(p_BxK)
    tau_Bx1 = jnp.asarray(tau_B)[..., None]
    s_Bx1 = jnp.sum(alpha_BxK, axis=-1, keepdims=True) + tau_Bx1
    mean = (alpha_BxK + tau_Bx1 * p_BxK) / s_Bx1
    variance = (mean * (1.0 - mean) / (s_Bx1 + 1.0)
                + tau_Bx1 ** 2 * p_BxK * (1.0 - p_BxK) / (s_Bx1 * (s_Bx1 + 1.0)))
    return Moments(mean, variance)


def loss(alpha_BxK: ArrayLike, p_BxK: ArrayLike, tau_B: ArrayLike,
         labels_B: ArrayLike) -> jax.Array:
    """Per example: sum_k (y_k - mean_k)^2 + sum_k var_k + sum_k (y_k - p_k)^2 (the reference
    sums it over the batch)."""
    m = moments(alpha_BxK, p_BxK, tau_B)
    onehot = jax.nn.one_hot(jnp.asarray(labels_B), m.mean_BxK.shape[-1], dtype=m.mean_BxK.dtype)
    return (jnp.sum((onehot - m.mean_BxK) ** 2, axis=-1) + jnp.sum(m.variance_BxK, axis=-1)
            + jnp.sum((onehot - jnp.asarray(p_BxK)) ** 2, axis=-1))


class Uncertainties(NamedTuple):
    total: jax.Array        # TU = 1 - sum_k mean_k^2
    epistemic: jax.Array    # EU = sum_k var_k
    aleatoric: jax.Array    # AU = TU - EU = E[1 - sum_k pi_k^2]


def uncertainties(alpha_BxK: ArrayLike, p_BxK: ArrayLike, tau_B: ArrayLike) -> Uncertainties:
    """F-EDL's decomposition (its uq.py); OOD and confidence scores are -AU and -EU."""
    m = moments(alpha_BxK, p_BxK, tau_B)
    total = 1.0 - jnp.sum(m.mean_BxK ** 2, axis=-1)
    epistemic = jnp.sum(m.variance_BxK, axis=-1)
    return Uncertainties(total, epistemic, total - epistemic)
