"""Prior Networks: a Dirichlet with alpha = exp(logits), fitted by KL to Dirichlet targets.

KL-PN (Malinin & Gales, "Predictive Uncertainty Estimation via Prior Networks", NeurIPS 2018)
minimises the *forward* KL(Dir(target) || Dir(alpha)); RKL-PN (Malinin & Gales, "Reverse KL-
Divergence Training of Prior Networks", NeurIPS 2019; official code KaosEngineer/PriorNetworks)
the *reverse* KL(Dir(alpha) || Dir(target)). In-distribution targets are sharp on the label, OOD
training examples get the flat Dir(1). Two target readings exist: the 2019 code's
`1 + concentration * onehot` ("pnet": (101, 1, ..., 1) for 100) and the 2018 paper's smoothed mean
times a precision ("smoothed": precision 100, smoothing 0.01 -> (91, 1, ..., 1) for K = 10).

The KL itself is `evidential.dirichlet_kl`, written to stay accurate in float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from gedl_jax.evidential import dirichlet_kl

TARGET_FORMS = ("pnet", "smoothed")
# In-graph OOD training inputs (never the evaluation OOD sets): see `ood_noise`.
OOD_NOISE = ("noise_uniform", "noise_smoothed")
SMOOTHING_SIGMA = 1.0   # pixels, the Gaussian blur of "noise_smoothed"


def concentration_from_logits(logits_BxK: ArrayLike, clip: float = 30.0) -> jax.Array:
    """alpha = exp(logits), the logits clipped to +-clip: exp overflows float32 above ~88.7 and
    lgamma(inf) is NaN, while e^30 ~ 1e13 is already far past any target precision."""
    return jnp.exp(jnp.clip(jnp.asarray(logits_BxK), -clip, clip))


def log_precision(logits_BxK: ArrayLike) -> jax.Array:
    """log alpha_0 = logsumexp(logits): the UM score in log space (same ranking as alpha_0, no
    overflow and no ties from inf)."""
    return jax.nn.logsumexp(jnp.asarray(logits_BxK), axis=-1)


def in_distribution_target(labels_B: ArrayLike, num_classes: int, form: str = "pnet",
                           concentration: float = 100.0, smoothing: float = 0.01) -> jax.Array:
    """Target concentrations (..., K) for labelled in-distribution examples.

    form "pnet": 1 + concentration * onehot (RKL-PN code). form "smoothed": concentration *
    [1 - (K - 1) smoothing on the label, smoothing elsewhere] (the 2018 paper; its total
    precision is `concentration`)."""
    onehot_BxK = jax.nn.one_hot(jnp.asarray(labels_B), num_classes)
    if form == "pnet":
        return 1.0 + concentration * onehot_BxK
    if form == "smoothed":
        mean_BxK = smoothing + (1.0 - num_classes * smoothing) * onehot_BxK
        return concentration * mean_BxK
    raise ValueError(f"form={form!r}; allowed: {TARGET_FORMS}")


def ood_target(shape: tuple[int, ...]) -> jax.Array:
    """The flat Dir(1) target of OOD training examples, shape (..., K)."""
    return jnp.ones(shape)


def forward_kl(alpha_BxK: ArrayLike, target_BxK: ArrayLike) -> jax.Array:
    """KL-PN's per-example loss KL(Dir(target) || Dir(alpha))."""
    return dirichlet_kl(target_BxK, alpha_BxK)


def reverse_kl(alpha_BxK: ArrayLike, target_BxK: ArrayLike) -> jax.Array:
    """RKL-PN's per-example loss KL(Dir(alpha) || Dir(target)). The reference divides the batch
    total by the largest target concentration (matters under SGD, hardly under Adam): that is
    the caller's reduction."""
    return dirichlet_kl(alpha_BxK, target_BxK)


def _blur_axis(x: jax.Array, axis: int, taps: jax.Array) -> jax.Array:
    radius = (taps.shape[0] - 1) // 2
    pad = [(0, 0)] * x.ndim
    pad[axis] = (radius, radius)
    xp = jnp.pad(x, pad, mode="edge")
    n = x.shape[axis]
    return sum(taps[i] * jax.lax.slice_in_dim(xp, i, i + n, axis=axis)
               for i in range(taps.shape[0]))


def gaussian_blur(images_BxHxWxC: ArrayLike, sigma: float = SMOOTHING_SIGMA) -> jax.Array:
    """Separable Gaussian blur over H and W (taps to 2 sigma, normalised; edge padding)."""
    x = jnp.asarray(images_BxHxWxC)
    radius = max(1, int(round(2 * sigma)))
    offsets = jnp.arange(-radius, radius + 1, dtype=x.dtype)
    taps = jnp.exp(-0.5 * (offsets / sigma) ** 2)
    taps = taps / jnp.sum(taps)
    return _blur_axis(_blur_axis(x, 1, taps), 2, taps)


def ood_noise(key: jax.Array, images_BxHxWxC: ArrayLike, kind: str = "noise_uniform"
              ) -> jax.Array:
    """Synthetic OOD training images, one per in-distribution image, drawn from `key`.

    "noise_uniform": i.i.d. uniform pixels; "noise_smoothed": the same, Gaussian-blurred
    (sigma = 1 px) and stretched back to the full range per image (spatially correlated
    blobs, closer to natural-image statistics). Either spans each channel's [min, max] over the
    in-distribution batch: U[0, 1] for [0, 1] images, and the same pixels after any input
    standardisation (the method need not know the normalisation)."""
    if kind not in OOD_NOISE:
        raise ValueError(f"kind={kind!r}; allowed: {OOD_NOISE}")
    x = jnp.asarray(images_BxHxWxC)
    lo_1x1x1xC = jax.lax.stop_gradient(jnp.min(x, axis=(0, 1, 2), keepdims=True))
    hi_1x1x1xC = jax.lax.stop_gradient(jnp.max(x, axis=(0, 1, 2), keepdims=True))
    u = jax.random.uniform(key, x.shape, x.dtype)
    if kind == "noise_smoothed":
        u = gaussian_blur(u)
        u_min = jnp.min(u, axis=(1, 2, 3), keepdims=True)
        u_max = jnp.max(u, axis=(1, 2, 3), keepdims=True)
        u = (u - u_min) / jnp.maximum(u_max - u_min, 1e-12)
    return lo_1x1x1xC + (hi_1x1x1xC - lo_1x1x1xC) * u
