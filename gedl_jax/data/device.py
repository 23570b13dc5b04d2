"""Device-resident input: shuffling, batching, augmentation and scaling in pure JAX.

Everything here except `pad_for_eval` is jit-able and runs *inside* the jitted train step
(`gedl_jax.run.steps`), on a split kept whole on the accelerator (uint8: MNIST's 47 MB, CIFAR-10's
154 MB; placed once with `gedl_jax.run.sharding.put_replicated`), so no step needs a host
round-trip:

    perm = data.epoch_permutation(jax.random.fold_in(order_key, epoch), images.shape[0])
    x, y = data.take_batch(images, labels, perm, step % steps_per_epoch, batch_size)
    x = data.augment_cifar(jax.random.fold_in(augment_key, step), x)   # CIFAR train only
    x = data.to_float(x, mean, std)          # after augmentation: the fill stays pixel 0

(The permutation is computed once per epoch and passed in; it is 4 bytes per example.)
Evaluation never augments and never drops a remainder: `pad_for_eval` pads the last batch and
returns a mask, so every example is scored exactly once.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np


# ------------------------------------------------------------------------------- batching
def epoch_permutation(key: jax.Array, num_examples: int) -> jax.Array:
    """A random permutation of range(num_examples), int32; key it from the epoch number."""
    return jax.random.permutation(key, num_examples).astype(jnp.int32)


def take_batch(images_NxHxWxC: jax.Array, labels_N: jax.Array, permutation_N: jax.Array,
               batch_index, batch_size: int) -> tuple[jax.Array, jax.Array]:
    """Batch `batch_index` (0 <= batch_index < steps_per_epoch) of the epoch's permutation:
    a dynamic_slice of the permutation and a gather. batch_size is static."""
    start = jnp.asarray(batch_index, jnp.int32) * batch_size
    idx_B = jax.lax.dynamic_slice_in_dim(permutation_N, start, batch_size)
    return (jnp.take(images_NxHxWxC, idx_B, axis=0, mode="clip"),
            jnp.take(labels_N, idx_B, axis=0, mode="clip"))


def to_float(images_BxHxWxC: jax.Array, mean=None, std=None) -> jax.Array:
    """uint8 pixels -> float32 in [0, 1] (the I-EDL/R-EDL protocol), then optionally
    (x - mean) / std with per-channel stats in [0, 1] units (use the ID training split's stats
    for every set, OOD sets included). Float input is taken as already in [0, 1]."""
    x = images_BxHxWxC
    if jnp.issubdtype(x.dtype, jnp.integer):
        x = x.astype(jnp.float32) * (1.0 / 255.0)
    else:
        x = x.astype(jnp.float32)
    if mean is not None:
        # Per-channel stats as 1 x ... x 1 x C: explicit, no implicit rank promotion.
        stats_shape = (1,) * (x.ndim - 1) + (-1,)
        x = ((x - jnp.asarray(mean, jnp.float32).reshape(stats_shape))
             / jnp.asarray(std, jnp.float32).reshape(stats_shape))
    return x


# ---------------------------------------------------------------------------- augmentation
def augment_cifar(key: jax.Array, images_BxHxWxC: jax.Array, *, pad: int = 4,
                  max_degrees: float = 15.0) -> jax.Array:
    """The reference CIFAR training augmentation, per example and independent, vectorised:
    RandomHorizontalFlip(0.5) -> RandomCrop(size, padding=pad, zero fill) -> RandomRotation
    (angle uniform in [-max_degrees, max_degrees], nearest, fill 0, about the image centre), the
    torchvision defaults on PIL images. All three are composed into one nearest-neighbour gather.

    Works on uint8 or float images (same shape and dtype out); apply it before `to_float`'s
    normalisation so the fill is pixel value 0, as in the reference. Key it from the step
    number, e.g. jax.random.fold_in(augment_key, step)."""
    b = images_BxHxWxC.shape[0]
    k_flip, k_crop, k_rot = jax.random.split(key, 3)
    flip_B = jax.random.bernoulli(k_flip, 0.5, (b,))
    offset_Bx2 = jax.random.randint(k_crop, (b, 2), 0, 2 * pad + 1)
    angle_B = jax.random.uniform(k_rot, (b,), jnp.float32, -max_degrees, max_degrees)
    return apply_geometry(images_BxHxWxC, flip_B, offset_Bx2[:, 0] - pad,
                          offset_Bx2[:, 1] - pad, angle_B)


def apply_geometry(images_BxHxWxC: jax.Array, flip_B: jax.Array, shift_y_B: jax.Array,
                   shift_x_B: jax.Array, angle_deg_B: jax.Array) -> jax.Array:
    """out = rotate(crop(flip(x))) with explicit per-example parameters.

    flip: mirror left-right. crop: out[i, j] = x[i + shift_y, j + shift_x], zero outside (the
    RandomCrop window offset minus the padding). rotate: PIL's Image.rotate(angle) convention
    (counter-clockwise for positive angles, about (W/2, H/2), source pixel = floor of the mapped
    pixel centre, zero outside)."""
    b, h, w, c = images_BxHxWxC.shape
    theta_B = -jnp.deg2rad(angle_deg_B.astype(jnp.float32))
    cos_B, sin_B = jnp.cos(theta_B)[:, None, None], jnp.sin(theta_B)[:, None, None]
    dy_1xHx1 = (jnp.arange(h, dtype=jnp.float32) + 0.5 - h / 2)[None, :, None]
    dx_1x1xW = (jnp.arange(w, dtype=jnp.float32) + 0.5 - w / 2)[None, None, :]
    src_x = cos_B * dx_1x1xW + sin_B * dy_1xHx1 + w / 2
    src_y = -sin_B * dx_1x1xW + cos_B * dy_1xHx1 + h / 2
    valid = (src_x >= 0) & (src_x < w) & (src_y >= 0) & (src_y < h)
    qx = jnp.floor(src_x).astype(jnp.int32) + shift_x_B[:, None, None]
    qy = jnp.floor(src_y).astype(jnp.int32) + shift_y_B[:, None, None]
    valid &= (qx >= 0) & (qx < w) & (qy >= 0) & (qy < h)
    qx = jnp.where(flip_B[:, None, None], w - 1 - qx, qx)
    flat_BxHW = (jnp.clip(qy, 0, h - 1) * w + jnp.clip(qx, 0, w - 1)).reshape(b, h * w, 1)
    gathered = jnp.take_along_axis(images_BxHxWxC.reshape(b, h * w, c), flat_BxHW, axis=1)
    out = jnp.where(valid.reshape(b, h * w, 1), gathered, jnp.zeros((), images_BxHxWxC.dtype))
    return out.reshape(b, h, w, c)


# ------------------------------------------------------------------------------ evaluation
def pad_for_eval(images_NxHxWxC: np.ndarray, labels_N: np.ndarray, batch_size: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(images M x B x H x W x C, labels M x B, mask M x B) with M = ceil(N / B): the last batch
    is padded with zero images (label 0, mask False). Reduce every metric with the mask, and
    every example is scored exactly once."""
    images = np.asarray(images_NxHxWxC)
    labels = np.asarray(labels_N)
    n = len(labels)
    m = math.ceil(n / batch_size)
    total = m * batch_size
    out_images = np.zeros((total, *images.shape[1:]), images.dtype)
    out_images[:n] = images
    out_labels = np.zeros((total,), labels.dtype)
    out_labels[:n] = labels
    mask = np.zeros((total,), bool)
    mask[:n] = True
    return (out_images.reshape(m, batch_size, *images.shape[1:]),
            out_labels.reshape(m, batch_size), mask.reshape(m, batch_size))
