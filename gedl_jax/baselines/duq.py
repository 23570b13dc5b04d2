"""DUQ (van Amersfoort, Smith, Teh, Gal, "Uncertainty Estimation Using a Single Deep
Deterministic Neural Network", ICML 2020; y0ast/deterministic-uncertainty-quantification).

A feature z in R^d is mapped per class c to an embedding W_c z in R^n; the class kernel is
K_c = exp(-||W_c z - e_c||^2 / (2 n sigma^2)) (the mean over the n embedding coordinates), with
centroids e_c = m_c / N_c kept as exponential moving averages (no gradient). The prediction is
argmax_c K_c, the certainty max_c K_c. Training: binary cross-entropy of every K_c against the
one-hot label plus lambda * (||grad_x sum_c K_c||_2 - 1)^2 (two-sided gradient penalty).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

LOG_CLAMP = -100.0  # PyTorch's binary_cross_entropy clamps each log at -100


def class_embeddings(features_BxD: ArrayLike, weights_NxKxD: ArrayLike) -> jax.Array:
    """W_c z for every class: shape (B, K, N)."""
    return jnp.einsum("bd,nkd->bkn", jnp.asarray(features_BxD), jnp.asarray(weights_NxKxD))


def centroids(sums_KxN: ArrayLike, counts_K: ArrayLike) -> jax.Array:
    """e_c = m_c / N_c."""
    return jnp.asarray(sums_KxN) / jnp.asarray(counts_K)[:, None]


def log_kernel(embeddings_BxKxN: ArrayLike, centroids_KxN: ArrayLike,
               length_scale: float) -> jax.Array:
    """log K_c = -mean_j (W_c z - e_c)_j^2 / (2 sigma^2), shape (B, K); computed in log space so
    the BCE's log(1 - K) never sees a rounded-to-1 kernel."""
    diff = jnp.asarray(embeddings_BxKxN) - jnp.asarray(centroids_KxN)[None]
    return -jnp.mean(diff * diff, axis=-1) / (2.0 * length_scale ** 2)


def certainty(log_kernel_BxK: ArrayLike) -> jax.Array:
    """max_c K_c in (0, 1]: DUQ's confidence (the MP column; higher = more in-distribution)."""
    return jnp.exp(jnp.max(jnp.asarray(log_kernel_BxK), axis=-1))


def log1mexp(x: ArrayLike) -> jax.Array:
    """log(1 - e^x) for x <= 0, stable at both ends (Maechler 2012: log(-expm1(x)) near 0,
    log1p(-exp(x)) below -log 2)."""
    x = jnp.asarray(x)
    near_zero = x > -jnp.log(2.0)
    safe_near = jnp.where(near_zero, x, -1.0)
    safe_far = jnp.where(near_zero, -1.0, x)
    return jnp.where(near_zero, jnp.log(-jnp.expm1(safe_near)), jnp.log1p(-jnp.exp(safe_far)))


def bce_loss(log_kernel_BxK: ArrayLike, labels_B: ArrayLike) -> jax.Array:
    """Per-example mean over the K classes of BCE(K_c, onehot_c), each log clamped at -100 as
    PyTorch's binary_cross_entropy does (DUQ's reference loss averages over B * K entries)."""
    log_k = jnp.asarray(log_kernel_BxK)
    onehot = jax.nn.one_hot(jnp.asarray(labels_B), log_k.shape[-1], dtype=log_k.dtype)
    log_p = jnp.maximum(log_k, LOG_CLAMP)
    log_not_p = jnp.maximum(log1mexp(jnp.minimum(log_k, 0.0)), LOG_CLAMP)
    return -jnp.mean(onehot * log_p + (1.0 - onehot) * log_not_p, axis=-1)


def centroid_batch_stats(embeddings_BxKxN: ArrayLike, labels_B: ArrayLike
                         ) -> tuple[jax.Array, jax.Array]:
    """This batch's per-class sums sum_{i in c} W_c z_i (K, N) and counts n_c (K,), without
    gradient (sum them over devices before the EMA step to get the global batch's)."""
    emb = jax.lax.stop_gradient(jnp.asarray(embeddings_BxKxN))
    onehot_BxK = jax.nn.one_hot(jnp.asarray(labels_B), emb.shape[1], dtype=emb.dtype)
    return jnp.einsum("bk,bkn->kn", onehot_BxK, emb), jnp.sum(onehot_BxK, axis=0)


def ema_step(old: ArrayLike, batch_value: ArrayLike, gamma: float) -> jax.Array:
    """gamma * old + (1 - gamma) * batch_value."""
    return gamma * jnp.asarray(old) + (1.0 - gamma) * jnp.asarray(batch_value)


def update_centroid_stats(sums_KxN: ArrayLike, counts_K: ArrayLike,
                          embeddings_BxKxN: ArrayLike, labels_B: ArrayLike, gamma: float
                          ) -> tuple[jax.Array, jax.Array]:
    """One EMA step after an optimiser step: N_c <- gamma N_c + (1 - gamma) n_c(batch),
    m_c <- gamma m_c + (1 - gamma) sum_{i in c} W_c z_i. The embeddings come from the updated
    model in eval mode; the result carries no gradient."""
    batch_sums_KxN, batch_counts_K = centroid_batch_stats(embeddings_BxKxN, labels_B)
    return ema_step(sums_KxN, batch_sums_KxN, gamma), ema_step(counts_K, batch_counts_K, gamma)


def penalty_from_gradients(grads_BxS: ArrayLike) -> jax.Array:
    """(||g_i||_2 - 1)^2 per example, g_i its input gradient (any trailing shape, flattened).

    Where g_i = 0 (every kernel underflowed, or flushed-to-zero squares) the norm's derivative is
    taken as 0, PyTorch's subgradient of `norm` at 0, instead of sqrt's inf * 0 = NaN."""
    g = jnp.asarray(grads_BxS)
    squared_B = jnp.sum(g.reshape(g.shape[0], -1) ** 2, axis=-1)
    positive_B = squared_B > 0
    norms_B = jnp.where(positive_B, jnp.sqrt(jnp.where(positive_B, squared_B, 1.0)), 0.0)
    return (norms_B - 1.0) ** 2


def gradient_penalty(kernel_fn: Callable[[jax.Array], jax.Array],
                     inputs_BxS: ArrayLike) -> jax.Array:
    """Per-example (||d/dx_i sum_c K_c(x_i)||_2 - 1)^2, the gradient taken through `kernel_fn`
    (inputs -> K, shape (B, K)) with respect to each example's flattened input. The gradient of
    the batch total equals every example's own gradient when examples do not interact (eval-mode
    batch norm); with train-mode batch norm it is the reference's quantity too."""
    x = jnp.asarray(inputs_BxS)
    return penalty_from_gradients(jax.grad(lambda v: jnp.sum(kernel_fn(v)))(x))
