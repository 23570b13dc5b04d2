"""Posterior Networks (Charpentier, Zuegner, Guennemann, NeurIPS 2020; sharpenb/Posterior-Network).

An encoder maps x to a latent z in R^d (d = 6), and one normalising flow per class c gives a
density q_c(z); the Dirichlet is alpha_c = 1 + N_c q_c(z), with N_c the class count of the
training split. Each flow is a stack of radial layers (Rezende & Mohamed 2015, as in Pyro's
`Radial`) applied to z, with a standard normal base: log q_c(z) = log N(f_c(z); 0, I) + sum of the
layers' log |det J|. Loss (joint mode): UCE psi(alpha_0) - psi(alpha_y) minus reg * H(Dir(alpha)).

Numerics: log q reaches hundreds in float32 training, so alpha is carried as
log(alpha_c - 1) = log N_c + log q_c and clamped before the exp (the reference runs in float64);
the UM score is log alpha_0 = logsumexp_c softplus(log N_c + log q_c), exact and overflow-free.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from gedl_jax.evidential import differential_entropy, expected_nll

LOG_PSEUDO_COUNT_CLAMP = 80.0  # e^80 ~ 5.5e34: finite in float32 even summed over 100 classes


class RadialParams(NamedTuple):
    """One radial layer (leading axes stack layers and classes): z0 (..., D), a', b' (...)."""

    z0: jax.Array
    a_raw: jax.Array
    b_raw: jax.Array


def init_radial(key: jax.Array, num_classes: int, num_layers: int, dim: int) -> RadialParams:
    """Uniform(-1/sqrt(d), 1/sqrt(d)) for every parameter, as Pyro's Radial; shapes
    (K, L, D), (K, L), (K, L)."""
    bound = 1.0 / jnp.sqrt(dim)
    k1, k2, k3 = jax.random.split(key, 3)
    shape = (num_classes, num_layers)
    return RadialParams(jax.random.uniform(k1, (*shape, dim), minval=-bound, maxval=bound),
                        jax.random.uniform(k2, shape, minval=-bound, maxval=bound),
                        jax.random.uniform(k3, shape, minval=-bound, maxval=bound))


def radial_layer(z_BxD: ArrayLike, z0_D: ArrayLike, a_raw: ArrayLike, b_raw: ArrayLike
                 ) -> tuple[jax.Array, jax.Array]:
    """f(z) = z + beta h (z - z0), h = 1 / (a + r), r = ||z - z0||, with a = softplus(a') and
    beta = -a + softplus(b') >= -a (so f is invertible). Returns (f(z), log |det df/dz|):
    (d - 1) log(1 + beta h) + log(1 + beta h - beta r h^2) (the Jacobian is
    (1 + beta h) I + beta h'(r) (z - z0)(z - z0)^T / r with h' = -h^2)."""
    z_BxD = jnp.asarray(z_BxD)
    dim = z_BxD.shape[-1]
    a = jax.nn.softplus(jnp.asarray(a_raw))
    beta = -a + jax.nn.softplus(jnp.asarray(b_raw))
    diff_BxD = z_BxD - jnp.broadcast_to(jnp.asarray(z0_D), z_BxD.shape)
    r_B = jnp.sqrt(jnp.sum(diff_BxD ** 2, axis=-1))
    h_B = 1.0 / (a + r_B)
    out = z_BxD + (beta * h_B)[..., None] * diff_BxD
    logdet = (dim - 1) * jnp.log1p(beta * h_B) + jnp.log1p(beta * h_B - beta * r_B * h_B ** 2)
    return out, logdet


def flow_log_density(z_BxD: ArrayLike, layers: RadialParams) -> jax.Array:
    """log q(z) of one flow (layers stacked on the leading axis of `layers`), shape (B,)."""
    z_BxD = jnp.asarray(z_BxD)

    def step(carry, layer):
        z, total = carry
        z, logdet = radial_layer(z, *layer)
        return (z, total + logdet), None

    # The initial log-det total derives from z (not jnp.zeros), so inside shard_map it varies
    # over the data axis as the carry does.
    (u_BxD, logdet_B), _ = jax.lax.scan(step, (z_BxD, jnp.zeros_like(z_BxD[..., 0])), layers)
    dim = z_BxD.shape[-1]
    log_base = -0.5 * jnp.sum(u_BxD ** 2, axis=-1) - 0.5 * dim * jnp.log(2.0 * jnp.pi)
    return log_base + logdet_B


def class_log_densities(z_BxD: ArrayLike, flows: RadialParams) -> jax.Array:
    """log q_c(z) for every class's flow (`flows` stacked (K, L, ...)), shape (B, K)."""
    return jax.vmap(lambda layers: flow_log_density(z_BxD, layers), out_axes=-1)(flows)


def log_pseudo_counts(log_q_BxK: ArrayLike, class_counts_K: ArrayLike) -> jax.Array:
    """log(alpha_c - 1) = log N_c + log q_c(z)."""
    log_q_BxK = jnp.asarray(log_q_BxK)
    return log_q_BxK + jnp.broadcast_to(jnp.log(jnp.asarray(class_counts_K)), log_q_BxK.shape)


def concentration(log_q_BxK: ArrayLike, class_counts_K: ArrayLike,
                  clamp: float = LOG_PSEUDO_COUNT_CLAMP) -> jax.Array:
    """alpha_c = 1 + N_c q_c(z), the pseudo-count's log clamped at `clamp` (float32 safety)."""
    return 1.0 + jnp.exp(jnp.minimum(log_pseudo_counts(log_q_BxK, class_counts_K), clamp))


def log_concentration(log_q_BxK: ArrayLike, class_counts_K: ArrayLike) -> jax.Array:
    """log alpha_c = log(1 + N_c q_c(z)) = softplus(log N_c + log q_c), exact and unclamped."""
    return jax.nn.softplus(log_pseudo_counts(log_q_BxK, class_counts_K))


def log_precision(log_q_BxK: ArrayLike, class_counts_K: ArrayLike) -> jax.Array:
    """log alpha_0 = logsumexp_c log alpha_c, log alpha_c = softplus(log N_c + log q_c): the UM
    score without overflow (exact, unclamped)."""
    return jax.nn.logsumexp(log_concentration(log_q_BxK, class_counts_K), axis=-1)


def uce_loss(alpha_BxK: ArrayLike, labels_B: ArrayLike, entropy_weight: float) -> jax.Array:
    """Per example: psi(alpha_0) - psi(alpha_y) - entropy_weight * H(Dir(alpha)) (the reference
    sums it over the batch; weight 1e-6 on MNIST, 1e-5 on CIFAR-10)."""
    return expected_nll(alpha_BxK, labels_B) - entropy_weight * differential_entropy(alpha_BxK)
