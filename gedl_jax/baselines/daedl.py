"""DAEDL (Yoon & Kim, "Uncertainty Estimation by Density Aware Evidential Deep Learning",
ICML 2024; TaeseongYoon/DAEDL).

After training an exp-evidence EDL model (alpha = exp(logits) + 1e-6, no +1 prior), a
class-conditional Gaussian (GDA) is fitted on penultimate training features. A test input's
density score s(x) = logsumexp_c log N(z; mu_c, Sigma_c) (no class weights) is clipped to the
training range and min-max normalised to d in [0, 1]; the logits are scaled by it:
alpha* = exp(d * logits), p* = softmax(d * logits). d = 0 gives alpha* = 1 and a uniform p*, so
far-from-data inputs get the flat Dirichlet; d = 1 is the plain exp-EDL model.

The fit is one host-side NumPy float64 step (the reference fits in float64, with growing jitter
on the covariance until its Cholesky factorisation succeeds); everything else is jit-able.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from gedl_jax.evidential import dirichlet_kl

# Jitters tried in order until a class covariance factorises, *relative to its mean variance*.
# The reference adds absolute jitters starting at 1e-308, which "factorise" a singular covariance
# with pivots ~1e-154 and give -inf log densities off the features' subspace (its scorer then
# replaces the non-finite values); a relative jitter keeps the densities finite and meaningful.
JITTERS = (0.0, 1e-10, 1e-8, 1e-6, 1e-4, 1e-3, 1e-2, 1e-1)
EPS = 1e-6  # added to alpha in the reference's training parameterisation and scorers


class GDA(NamedTuple):
    """Per-class Gaussians: means (K, D), lower Cholesky factors (K, D, D), the jitter used."""

    means_KxD: np.ndarray
    cholesky_KxDxD: np.ndarray
    jitter_K: np.ndarray


def fit_gda(features_NxD: np.ndarray, labels_N: np.ndarray, num_classes: int) -> GDA:
    """Class means and unbiased covariances (divided by n_c - 1) in float64; each covariance
    gets the smallest jitter * mean(diag) * I of JITTERS that makes it positive definite. Raises
    ValueError naming the class if none does, or if a class has fewer than 2 examples."""
    z = np.asarray(features_NxD, np.float64)
    labels_N = np.asarray(labels_N)
    dim = z.shape[1]
    means, chols, jitters = [], [], []
    for c in range(num_classes):
        zc = z[labels_N == c]
        if len(zc) < 2:
            raise ValueError(f"class {c} has {len(zc)} training feature(s); the GDA needs >= 2")
        mean = zc.mean(axis=0)
        centred = zc - mean
        cov = centred.T @ centred / (len(zc) - 1)
        scale = max(float(np.mean(np.diag(cov))), np.finfo(np.float64).tiny)
        for jitter in JITTERS:
            try:
                chol = np.linalg.cholesky(cov + jitter * scale * np.eye(dim))
            except np.linalg.LinAlgError:
                continue
            if np.all(np.isfinite(chol)):
                break
        else:
            raise ValueError(f"class {c}: the feature covariance is not positive definite even "
                             f"with jitter {JITTERS[-1]}")
        means.append(mean)
        chols.append(chol)
        jitters.append(jitter)
    return GDA(np.stack(means), np.stack(chols), np.asarray(jitters))


def class_log_densities(features_BxD: ArrayLike, gda: GDA) -> jax.Array:
    """log N(z; mu_c, Sigma_c) for every class, shape (B, K), via the Cholesky factors."""
    z = jnp.asarray(features_BxD)
    chol = jnp.asarray(gda.cholesky_KxDxD, z.dtype)
    diff_KxBxD = z[None, :, :] - jnp.asarray(gda.means_KxD, z.dtype)[:, None, :]  # explicit ranks
    solved = jax.vmap(lambda lower, d: jax.scipy.linalg.solve_triangular(lower, d.T, lower=True)
                      )(chol, diff_KxBxD)  # (K, D, B)
    mahalanobis_KxB = jnp.sum(solved ** 2, axis=1)
    log_det_K = 2.0 * jnp.sum(jnp.log(jnp.diagonal(chol, axis1=-2, axis2=-1)), axis=-1)
    dim = z.shape[-1]
    log_n_KxB = -0.5 * (mahalanobis_KxB + log_det_K[:, None] + dim * jnp.log(2.0 * jnp.pi))
    return log_n_KxB.T


def density_score(features_BxD: ArrayLike, gda: GDA) -> jax.Array:
    """s(x) = logsumexp_c log N(z; mu_c, Sigma_c) (log of the unweighted mixture times K)."""
    return jax.nn.logsumexp(class_log_densities(features_BxD, gda), axis=-1)


def normalized_density(score_B: ArrayLike, train_min: float, train_max: float) -> jax.Array:
    """d = (clip(s, min, max) - min) / (max - min) with the training scores' range: in [0, 1]."""
    s = jnp.clip(jnp.asarray(score_B), train_min, train_max)
    return (s - train_min) / (train_max - train_min)


def scaled_concentration(logits_BxK: ArrayLike, density_B: ArrayLike) -> jax.Array:
    """alpha* = exp(d * logits) + 1e-6 (the reference's scorers add 1e-6)."""
    return jnp.exp(jnp.asarray(density_B)[..., None] * jnp.asarray(logits_BxK)) + EPS


def scaled_probabilities(logits_BxK: ArrayLike, density_B: ArrayLike) -> jax.Array:
    """p* = softmax(d * logits): MP is max p*."""
    return jax.nn.softmax(jnp.asarray(density_B)[..., None] * jnp.asarray(logits_BxK), axis=-1)


def scaled_log_precision(logits_BxK: ArrayLike, density_B: ArrayLike) -> jax.Array:
    """log sum_c exp(d * logit_c): the UM score alpha*_0 in log space (same ranking up to the
    1e-6 offsets, no overflow)."""
    return jax.nn.logsumexp(jnp.asarray(density_B)[..., None] * jnp.asarray(logits_BxK),
                            axis=-1)


def training_loss(logits_BxK: ArrayLike, labels_B: ArrayLike, kl_weight: float = 0.05,
                  logit_clip: float = 30.0) -> jax.Array:
    """DAEDL's per-example training loss (its train.py sums it over the batch), with
    alpha = exp(logits) + 1e-6 (no +1 prior), p = alpha / alpha_0:

      sum_k (y_k - p_k)^2 + sum_k alpha_k (alpha_0 - alpha_k) / (alpha_0^2 (alpha_0 + 1))
        + kl_weight * KL(Dir(alpha~ + 1e-6) || Dir(1)),   alpha~ = alpha (1 - y) + y.

    The variance term is evaluated as sum_k p_k (1 - p_k) / (alpha_0 + 1) (the same value; alpha_0^2
    overflows float32 from alpha_0 ~ 1.8e19). The logits are clipped to +-logit_clip first (the
    reference does not clip; exp overflows float32 above ~88.7 and e^30 ~ 1e13 is far past any
    useful concentration)."""
    logits = jnp.clip(jnp.asarray(logits_BxK), -logit_clip, logit_clip)
    alpha_BxK = jnp.exp(logits) + EPS
    onehot_BxK = jax.nn.one_hot(jnp.asarray(labels_B), alpha_BxK.shape[-1], dtype=alpha_BxK.dtype)
    strength_Bx1 = jnp.sum(alpha_BxK, axis=-1, keepdims=True)
    p_BxK = alpha_BxK / strength_Bx1
    squared_error_B = jnp.sum((onehot_BxK - p_BxK) ** 2, axis=-1)
    variance_B = jnp.sum(p_BxK * (1.0 - p_BxK), axis=-1) / (strength_Bx1[..., 0] + 1.0)
    tilde_BxK = alpha_BxK * (1.0 - onehot_BxK) + onehot_BxK + EPS
    kl_B = dirichlet_kl(tilde_BxK, jnp.ones_like(tilde_BxK))
    return squared_error_B + variance_B + kl_weight * kl_B
