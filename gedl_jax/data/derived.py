"""OOD sets derived deterministically from the test split of a dataset that is already loaded.

They let a far-OOD set from another image format be used with no new download, built from the
checksum-verified official test files (registry.DERIVED_OOD names them; `load_ood` builds them):

  cifar10_gray28       CIFAR-10 test (32 x 32 RGB) -> 28 x 28 x 1, far OOD for MNIST.
  mnist_rgb32          MNIST test (28 x 28 gray) -> 32 x 32 x 3, far OOD for CIFAR-10.
  fashion_mnist_rgb32  Fashion-MNIST test -> 32 x 32 x 3, far OOD for CIFAR-10.

The conversions are exact integer arithmetic in NumPy (no PIL / TF resampler whose version could
change a pixel), so the same files give the same bytes on every machine:

``rgb32_to_gray28`` (32 x 32 x 3 -> 28 x 28 x 1):
  1. Luma of ITU-R BT.601, Y = 0.299 R + 0.587 G + 0.114 B, kept exact as the integer
     1000 Y = 299 R + 587 G + 114 B.
  2. Area averaging (box resampling) 32 -> 28 along each axis: output pixel i covers the input
     interval [8i/7, 8(i+1)/7), and input pixel j contributes its overlap with it, an integer
     number w_ij in 0..7 of sevenths of a pixel (sum_j w_ij = 8). The 2-D average is
     sum_jl w_ij w_kl Y_jl / 64, computed as the integer sum_jl w_ij w_kl (1000 Y_jl).
  3. One rounding at the end, half up: floor(v + 1/2) of the exact average v, done in integers
     as (2 S + D) // (2 D) with S the integer sum and D = 64000. No intermediate rounding.
  The mean pixel value is preserved before the rounding (every input pixel has total weight
  (7/8)^2 = 28^2 / 32^2).

``gray28_to_rgb32`` (28 x 28 x 1 -> 32 x 32 x 3):
  zero-padding of 2 pixels on every side, then the gray channel copied to R, G and B. Chosen over
  a resize because it is exact and lossless (the original is the centre crop), keeps the
  strokes' width and pixel statistics, and MNIST / Fashion-MNIST backgrounds are 0, so the
  padding only extends the background. (OpenOOD v1.5 instead resizes its MNIST images to 32 x 32
  with bilinear interpolation, so its pixels differ from these.)

Labels are the source's labels (unused as OOD; kept so a Split stays a Split).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from gedl_jax.data.arrays import Split
from gedl_jax.data.errors import CorruptDataError

__all__ = ["TRANSFORMS", "area_weights", "derive", "gray28_to_rgb32", "rgb32_to_gray28"]

_LUMA_1000 = np.array([299, 587, 114], dtype=np.int64)   # BT.601, x 1000
_CHUNK = 2048                                            # images per integer matmul


@functools.cache
def area_weights(size_in: int, size_out: int) -> tuple[np.ndarray, int]:
    """(W, d): integer (size_out, size_in) box-resampling weights and their row sum d: output
    pixel i = sum_j W[i, j] x_j / d is the mean of x over [i s, (i + 1) s), s = size_in /
    size_out. W[i, j] is the overlap of that interval with input pixel j, [j, j + 1), in units of
    g / size_out of a pixel, g = gcd(size_in, size_out) (for 32 -> 28: sevenths, d = 8).

    >>> w, d = area_weights(32, 28)
    >>> w[0, :3].tolist(), w[3, 2:6].tolist(), d, bool((w.sum(1) == d).all())
    ([7, 1, 0], [0, 4, 4, 0], 8, True)
    """
    g = math.gcd(size_in, size_out)
    i = np.arange(size_out)[:, None]
    j = np.arange(size_in)[None, :]
    # In units of 1 / size_out of an input pixel: output i = [i size_in, (i + 1) size_in),
    # input j = [j size_out, (j + 1) size_out).
    lo = np.maximum(i * size_in, j * size_out)
    hi = np.minimum((i + 1) * size_in, (j + 1) * size_out)
    w = np.maximum(hi - lo, 0).astype(np.int64) // g
    w.setflags(write=False)   # cached: shared by every caller
    return w, size_in // g


def rgb32_to_gray28(images_Nx32x32x3: np.ndarray) -> np.ndarray:
    """BT.601 luma, area-averaged 32 -> 28, rounded half up once (module docstring); uint8
    N x 28 x 28 x 1.

    >>> x = np.zeros((1, 32, 32, 3), np.uint8); x[..., 0] = 255   # pure red: Y = 76.245
    >>> int(rgb32_to_gray28(x)[0, 5, 5, 0])
    76
    """
    x = np.asarray(images_Nx32x32x3)
    if x.ndim != 4 or x.shape[1:] != (32, 32, 3) or x.dtype != np.uint8:
        raise CorruptDataError(f"rgb32_to_gray28 needs N x 32 x 32 x 3 uint8 images, got "
                               f"{x.shape} {x.dtype}")
    w, d = area_weights(32, 28)   # 28 x 32 sevenths, rows summing to d = 8
    denom = d * d * 1000          # the integer sum is 64000 x the area-averaged luma
    out = np.empty((x.shape[0], 28, 28, 1), np.uint8)
    for start in range(0, x.shape[0], _CHUNK):
        y1000 = x[start:start + _CHUNK].astype(np.int64) @ _LUMA_1000          # N x 32 x 32
        s = w @ (y1000 @ w.T)             # N x 28 x 28, exact: int64 matmul, no float
        out[start:start + _CHUNK, :, :, 0] = ((2 * s + denom) // (2 * denom)).astype(np.uint8)
    return out


def gray28_to_rgb32(images_Nx28x28x1: np.ndarray) -> np.ndarray:
    """Zero-pad 2 pixels on each side, replicate to 3 channels; uint8 N x 32 x 32 x 3.

    >>> y = gray28_to_rgb32(np.full((1, 28, 28, 1), 9, np.uint8))
    >>> y.shape, int(y[0, 1, 1, 0]), int(y[0, 2, 2, 2])
    ((1, 32, 32, 3), 0, 9)
    """
    x = np.asarray(images_Nx28x28x1)
    if x.ndim != 4 or x.shape[1:] != (28, 28, 1) or x.dtype != np.uint8:
        raise CorruptDataError(f"gray28_to_rgb32 needs N x 28 x 28 x 1 uint8 images, got "
                               f"{x.shape} {x.dtype}")
    padded = np.pad(x, ((0, 0), (2, 2), (2, 2), (0, 0)), mode="constant", constant_values=0)
    return np.ascontiguousarray(np.repeat(padded, 3, axis=3))


TRANSFORMS = {"gray28": rgb32_to_gray28, "rgb32": gray28_to_rgb32}


def derive(name: str, transform: str, source: Split) -> Split:
    """The derived set `name`: `transform` ("gray28" or "rgb32") applied to the `source` split.
    Its Split.name is "<name>/test" and its source "derived:<source's source>"."""
    if transform not in TRANSFORMS:
        raise ValueError(f"unknown transform {transform!r}; known: {sorted(TRANSFORMS)}")
    return Split(TRANSFORMS[transform](source.images), source.labels.copy(), f"{name}/test",
                 f"derived:{source.source}")
