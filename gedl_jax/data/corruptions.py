r"""CIFAR-10-C regenerated from the CIFAR-10 test split, without the 2.9 GB release archive.

The corruptions and their per-severity CIFAR parameters are those of CIFAR-10-C (Hendrycks &
Dietterich, "Benchmarking Neural Network Robustness to Common Corruptions and Perturbations",
ICLR 2019; the generator is `ImageNet-C/create_c/make_cifar_c.py` in github.com/hendrycks/
robustness). They are re-implemented here with numpy, scipy and Pillow only, following the
release's conventions: each image goes to float on [0, 1] (x / 255), is corrupted, clipped to
[0, 1], scaled by 255 and converted with `np.uint8`, which *truncates* (it does not round).

    from gedl_jax.data import corruptions
    snowy_Nx32x32x3 = corruptions.corrupt(images_Nx32x32x3, "snow", severity=3, seed=0)

Regenerating the whole set into a data folder: `gedl_jax.data.regenerate`
(`python -m gedl_jax.data.regenerate --data_dir=D --corruptions=snow,brightness --seed=0`).

How close each one is to the release (see docs/cifar10c.md):
- same computation, deterministic: pixelate and jpeg_compression (Pillow, byte-identical for the
  same Pillow/libjpeg), contrast, zoom_blur (scipy, as the release); brightness, saturate,
  gaussian_blur and defocus_blur (own HSV conversion, scipy filters and OpenCV's kernel rebuilt
  in numpy; byte-identical to scikit-image 0.26 / OpenCV on the CIFAR-10 test images checked in
  docs/results/cifar10c_library_parity.md).
- same computation, own random draws: gaussian_noise, shot_noise, impulse_noise, speckle_noise,
  glass_blur, fog. The release drew from numpy's global generator, never seeded, so no
  regenerator can reproduce its bytes; here one `np.random.Generator` per (corruption, severity)
  is derived from a base seed, so a regeneration is reproducible.
- approximate: motion_blur and snow (ImageMagick's MotionBlurImage replaced by the same
  one-sided Gaussian line kernel in numpy, with edge replication), elastic_transform (OpenCV's
  fixed-point affine warp replaced by scipy's bilinear one).
- not provided: frost (needs the release's frost photographs, which this package does not
  ship) and spatter (needs OpenCV's Canny edges, distance transform and histogram
  equalisation, which scipy/Pillow do not provide with the same semantics).
"""

from __future__ import annotations

import io
import logging
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy import ndimage

from gedl_jax.data.arrays import subset_indices  # noqa: F401  (re-exported: its old home)
from gedl_jax.data.errors import DataError
from gedl_jax.data.registry import CORRUPTION_FILES, corruption_file_stem
from gedl_jax.data.regenerated import (  # noqa: F401  (facts about the regenerated set, re-exported)
    NOT_REGENERABLE,
    PROVENANCE_FILE,
    REGENERATED_FOLDER,
    RELEASE_SUBFOLDER,
    describe_source,
    read_provenance,
    regenerated_folder,
)

log = logging.getLogger(__name__)

IMAGE_SIZE = 32  # the CIFAR parameters below are for 32 x 32 images

# ------------------------------------------------------------------------ CIFAR parameters
# make_cifar_c.py's lists, severity 1..5 (tuples as in the release: see each function).
PARAMETERS: dict[str, tuple[Any, ...]] = {
    "gaussian_noise": (0.04, 0.06, 0.08, 0.09, 0.10),                 # sigma on [0, 1]
    "shot_noise": (500, 250, 100, 75, 50),                            # Poisson rate scale c
    "impulse_noise": (0.01, 0.02, 0.03, 0.05, 0.07),                  # salt-and-pepper amount
    "speckle_noise": (0.06, 0.10, 0.12, 0.16, 0.20),                  # multiplicative sigma
    "gaussian_blur": (0.4, 0.6, 0.7, 0.8, 1.0),                       # sigma in pixels
    "glass_blur": ((0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2),
                   (0.4, 1, 2)),                                      # (sigma, delta, iters)
    "defocus_blur": ((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2),
                     (1.5, 0.1)),                                     # (disk radius, alias sigma)
    "motion_blur": ((6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5)),      # (radius, sigma)
    "zoom_blur": (1.06, 1.11, 1.16, 1.21, 1.26),                      # np.arange(1, end, .01)
    "snow": ((0.1, 0.2, 1, 0.6, 8, 3, 0.95),
             (0.1, 0.2, 1, 0.5, 10, 4, 0.9),
             (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9),
             (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85),
             (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8)),  # (mu, sigma, zoom, threshold, blur radius,
                                                    #  blur sigma, blend)
    "fog": ((0.2, 3), (0.5, 3), (0.75, 2.5), (1, 2), (1.5, 1.75)),    # (c, wibble decay)
    "brightness": (0.05, 0.1, 0.15, 0.2, 0.3),                        # added to HSV value
    "contrast": (0.75, 0.5, 0.4, 0.3, 0.15),                          # factor around the mean
    "elastic_transform": tuple((IMAGE_SIZE * a, IMAGE_SIZE * s, IMAGE_SIZE * f) for a, s, f in (
        (0, 0, 0.08), (0.05, 0.2, 0.07), (0.08, 0.06, 0.06), (0.1, 0.04, 0.05),
        (0.1, 0.03, 0.03))),                                          # (alpha, sigma, affine)
    "pixelate": (0.95, 0.9, 0.85, 0.75, 0.65),                        # BOX down to int(32 c)
    "jpeg_compression": (80, 65, 58, 50, 40),                         # Pillow JPEG quality
    "saturate": ((0.3, 0), (0.1, 0), (1.5, 0), (2, 0.1), (2.5, 0.2)),  # S <- S a + b
}

# How faithful each regenerated corruption is to the release (written to the provenance file).
EXACT, OWN_DRAWS, APPROXIMATE = "deterministic", "stochastic (own seeded draws)", "approximate"
FIDELITY: dict[str, tuple[str, str]] = {
    "gaussian_noise": (OWN_DRAWS, "x + N(0, sigma^2), as the release"),
    "shot_noise": (OWN_DRAWS, "Poisson(x c) / c, as the release"),
    "impulse_noise": (OWN_DRAWS, "each element replaced with prob. amount by 0 or 1 (1:1), as "
                                 "scikit-image's random_noise('s&p')"),
    "speckle_noise": (OWN_DRAWS, "x + x N(0, c^2), as the release"),
    "gaussian_blur": (EXACT, "scipy gaussian_filter (mode nearest, truncate 4), which "
                             "scikit-image's gaussian calls"),
    "glass_blur": (OWN_DRAWS, "scipy gaussian_filter + the release's local pixel moves (shifts "
                              "-1 or 0; each move copies, as numpy's tuple assignment does)"),
    "defocus_blur": (EXACT, "OpenCV's anti-aliased disk kernel (float32) and filter2D "
                            "(reflect-101) rebuilt with numpy/scipy; byte-identical to OpenCV "
                            "on the images checked"),
    "motion_blur": (APPROXIMATE, "ImageMagick MotionBlurImage replaced by its one-sided "
                                 "Gaussian line kernel in numpy (edge replicate, rounded to "
                                 "8 bit); random angle U(-45, 45)"),
    "zoom_blur": (EXACT, "scipy ndimage.zoom (order 1), as the release; 7/12/16/21/26 zooms"),
    "snow": (APPROXIMATE, "the snow layer's ImageMagick motion blur replaced by the numpy line "
                          "kernel (PNG round trip as uint8 truncation, blur rounded to 8 bit)"),
    "fog": (OWN_DRAWS, "diamond-square plasma fractal (mapsize 32), as the release"),
    "brightness": (EXACT, "HSV value + delta (own HSV conversion, the same float operations "
                          "as scikit-image's)"),
    "contrast": (EXACT, "(x - mean_HW) c + mean_HW, as the release"),
    "elastic_transform": (APPROXIMATE, "OpenCV affine warp (fixed-point bilinear, reflect-101) "
                                       "replaced by scipy affine_transform (bilinear, mirror); "
                                       "displacement field as the release"),
    "pixelate": (EXACT, "Pillow BOX resize down and back up, as the release (byte-identical)"),
    "jpeg_compression": (EXACT, "Pillow JPEG encode/decode, as the release (byte-identical for "
                                "the same libjpeg)"),
    "saturate": (EXACT, "HSV saturation S a + b (own HSV conversion, the same float "
                        "operations as scikit-image's)"),
}

Array = np.ndarray
CorruptionFn = Callable[[Array, int, np.random.Generator], Array]


# ------------------------------------------------------------------------------- helpers
def _unit(images_NxHxWx3: Array, dtype=np.float64) -> Array:
    """uint8 pixels -> float on [0, 1] (the release's `np.array(pil_image) / 255.`)."""
    return images_NxHxWx3.astype(dtype) / dtype(255.0)


def _to_255(x: Array) -> Array:
    """The release's return value: clip to [0, 1], scale to [0, 255] (float)."""
    return np.clip(x, 0, 1) * 255


def to_uint8(x_0to255: Array) -> Array:
    """`np.uint8(...)` as the release applies it: clip to [0, 255] and *truncate* (not round)."""
    return np.clip(x_0to255, 0, 255).astype(np.uint8)


def _param(name: str, severity: int) -> Any:
    return PARAMETERS[name][severity - 1]


def _gaussian_hw(x_NxHxWxC: Array, sigma: float, mode: str = "nearest",
                 truncate: float = 4.0) -> Array:
    """scikit-image's `gaussian(x, sigma, multichannel=True)`: scipy's gaussian_filter over H and
    W only (sigma 0 on the batch and channel axes), mode 'nearest', truncate 4."""
    return ndimage.gaussian_filter(x_NxHxWxC, sigma=(0, sigma, sigma, 0), mode=mode,
                                   truncate=truncate)


def _zoom_matrix(size: int, zoom: float) -> Array:
    """scipy's `ndimage.zoom` (order 1) along one axis as a matrix (round(size zoom) x size): the
    zoom of the identity. Order-1 zoom is separable, so A @ X @ A.T equals zooming X."""
    return ndimage.zoom(np.eye(size), (zoom, 1), order=1)


def _clipped_zoom(x_NxHxW_: Array, zoom: float) -> Array:
    """make_cifar_c's `clipped_zoom`, batched: centre crop of ceil(H / zoom) pixels, scipy zoom
    (order 1) back to about H, centre trim to H. Axes after the second are kept as they are.
    Computed in float64 and returned in the input's dtype, as scipy does."""
    h = x_NxHxW_.shape[1]
    ch = int(np.ceil(h / zoom))
    top = (h - ch) // 2
    crop = x_NxHxW_[:, top:top + ch, top:top + ch].astype(np.float64)
    a = _zoom_matrix(ch, zoom)
    moved = np.moveaxis(crop, (1, 2), (-2, -1))  # N x ... x ch x ch
    out = np.moveaxis(a @ moved @ a.T, (-2, -1), (1, 2))
    trim = (out.shape[1] - h) // 2
    return out[:, trim:trim + h, trim:trim + h].astype(x_NxHxW_.dtype)


def motion_blur_kernel(radius: int, sigma: float) -> Array:
    """ImageMagick's motion-blur weights: a one-sided Gaussian exp(-i^2 / (2 sigma^2)) over
    i = 0 .. 2 radius (width 2 radius + 1), normalised to sum 1."""
    i = np.arange(2 * int(radius) + 1, dtype=np.float64)
    w = np.exp(-(i * i) / (2.0 * sigma * sigma))
    return w / w.sum()


def motion_blur_offsets(width: int, angle_deg: float) -> tuple[Array, Array]:
    """Pixel offsets (dx, dy) of the `width` taps along `angle_deg` (x right, y down), rounded
    as ImageMagick rounds them: ceil(i cos(angle) - 0.5), ceil(i sin(angle) - 0.5)."""
    i = np.arange(width, dtype=np.float64)
    a = np.deg2rad(angle_deg)
    return (np.ceil(i * np.cos(a) - 0.5).astype(np.int64),
            np.ceil(i * np.sin(a) - 0.5).astype(np.int64))


def motion_blur_batch(x_NxHxWxC: Array, radius: int, sigma: float, angles_deg_N: Array) -> Array:
    """Blur each image along its own angle: out(y, x) = sum_i w_i in(y + dy_i, x + dx_i), with
    the coordinates clamped to the image (ImageMagick's edge virtual pixels). Float in, float
    out (same scale). This is the numpy stand-in for ImageMagick's MotionBlurImage."""
    n, h, w = x_NxHxWxC.shape[:3]
    weights = motion_blur_kernel(radius, sigma)
    rows, cols = np.arange(h), np.arange(w)
    out = np.zeros(x_NxHxWxC.shape, np.float64)
    offsets = [motion_blur_offsets(len(weights), a) for a in np.asarray(angles_deg_N)]
    dx_NxT = np.array([o[0] for o in offsets]).reshape(n, len(weights))
    dy_NxT = np.array([o[1] for o in offsets]).reshape(n, len(weights))
    batch = np.arange(n)[:, None, None]
    for t, wt in enumerate(weights):
        r = np.clip(rows[None, :] + dy_NxT[:, t:t + 1], 0, h - 1)  # N x H
        c = np.clip(cols[None, :] + dx_NxT[:, t:t + 1], 0, w - 1)  # N x W
        out += wt * x_NxHxWxC[batch, r[:, :, None], c[:, None, :]]
    return out


def _round_to_8bit(x_0to255: Array) -> Array:
    """ImageMagick's quantum -> 8-bit PNG output rounds half up (not the release's truncation)."""
    return np.floor(np.clip(x_0to255, 0, 255) + 0.5)


def rgb_to_hsv(rgb_NxHxWx3: Array) -> Array:
    """RGB on [0, 1] -> HSV on [0, 1] (hexcone model; where channels tie for the maximum the
    hue formula of the last of R, G, B wins, as in scikit-image's rgb2hsv)."""
    r, g, b = rgb_NxHxWx3[..., 0], rgb_NxHxWx3[..., 1], rgb_NxHxWx3[..., 2]
    v = rgb_NxHxWx3.max(-1)
    delta = v - rgb_NxHxWx3.min(-1)
    grey = delta == 0
    safe = np.where(grey, 1.0, delta)
    s = np.where(grey, 0.0, delta / np.where(v == 0, 1.0, v))
    h = np.where(b == v, 4.0 + (r - g) / safe,
                 np.where(g == v, 2.0 + (b - r) / safe, (g - b) / safe))
    h = np.where(grey, 0.0, (h / 6.0) % 1.0)
    return np.stack([h, s, v], -1)


def hsv_to_rgb(hsv_NxHxWx3: Array) -> Array:
    """HSV on [0, 1] -> RGB on [0, 1] (the textbook sector formulas, as scikit-image's hsv2rgb)."""
    h, s, v = hsv_NxHxWx3[..., 0], hsv_NxHxWx3[..., 1], hsv_NxHxWx3[..., 2]
    sector = np.floor(h * 6)
    f = h * 6 - sector
    p = v * (1 - s)
    q = v * (1 - f * s)
    t = v * (1 - (1 - f) * s)
    sector = sector.astype(np.int64) % 6
    table = (  # (R, G, B) per sector 0..5
        (v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q))
    out = np.empty(hsv_NxHxWx3.shape, np.float64)
    for ch in range(3):
        out[..., ch] = np.choose(sector, [row[ch] for row in table])
    return out


def plasma_fractal(n: int, decay: float, rng: np.random.Generator, size: int = 32) -> Array:
    """`n` diamond-square height maps (size x size, size a power of two) scaled to [0, 1], as
    make_cifar_c's `plasma_fractal(mapsize=32, wibbledecay=decay)`: the midpoint of each square
    (then each diamond) is the mean of its 4 corners plus wibble * U(-wibble, wibble), with
    periodic neighbours; wibble starts at 100 and is divided by `decay` at each halving."""
    if size & (size - 1):
        raise ValueError(f"size must be a power of two, got {size}")
    m = np.zeros((n, size, size), np.float64)
    step, wibble = size, 100.0
    while step >= 2:
        half = step // 2
        corners = m[:, ::step, ::step]
        square = corners + np.roll(corners, -1, axis=1)
        square = square + np.roll(square, -1, axis=2)
        m[:, half::step, half::step] = square / 4 + wibble * rng.uniform(-wibble, wibble,
                                                                          square.shape)
        centres = m[:, half::step, half::step]
        corners = m[:, ::step, ::step]
        top = centres + np.roll(centres, 1, axis=1) + corners + np.roll(corners, -1, axis=2)
        m[:, ::step, half::step] = top / 4 + wibble * rng.uniform(-wibble, wibble, top.shape)
        left = centres + np.roll(centres, 1, axis=2) + corners + np.roll(corners, -1, axis=1)
        m[:, half::step, ::step] = left / 4 + wibble * rng.uniform(-wibble, wibble, left.shape)
        step //= 2
        wibble /= decay
    m -= m.min(axis=(1, 2), keepdims=True)
    return m / m.max(axis=(1, 2), keepdims=True)


def defocus_kernel(radius: float, alias_sigma: float) -> Array:
    """make_cifar_c's `disk`: the indicator of x^2 + y^2 <= r^2 on a 17 x 17 grid (r <= 8),
    normalised, then anti-aliased by OpenCV's 3 x 3 GaussianBlur of sigma `alias_sigma`: taps
    exp(-k^2 / (2 sigma^2)), k = -1, 0, 1, normalised, applied as a row pass then a column pass
    in float32 (as OpenCV filters a float32 image). Trimmed to its non-zero support (the zeros
    add nothing). Returned as float64 (filter2D converts the kernel to the image's depth)."""
    if radius > 8:
        raise ValueError("the CIFAR parameters use radius <= 8 (17 x 17 grid)")
    grid = np.arange(-8, 9)
    xx, yy = np.meshgrid(grid, grid)
    disk = ((xx ** 2 + yy ** 2) <= radius ** 2).astype(np.float32)
    disk /= disk.sum()
    g = np.exp(-(np.arange(-1, 2) ** 2) / (2.0 * alias_sigma ** 2))
    g = (g / g.sum()).astype(np.float32)
    kernel = ndimage.correlate1d(ndimage.correlate1d(disk, g, axis=1, mode="mirror"), g, axis=0,
                                 mode="mirror").astype(np.float64)
    nz = np.nonzero(kernel.any(axis=0))[0]
    half = int(max(8 - nz.min(), nz.max() - 8))
    return kernel[8 - half:9 + half, 8 - half:9 + half]


# -------------------------------------------------------------------- the corruptions
# Each takes uint8 images N x 32 x 32 x 3, a severity 1..5 and a numpy Generator (unused by the
# deterministic ones) and returns float values on [0, 255] (or uint8 where the release returns a
# PIL image); `corrupt` applies the release's truncation.
def gaussian_noise(images: Array, severity: int, rng: np.random.Generator) -> Array:
    x = _unit(images)
    return _to_255(x + rng.normal(size=x.shape, scale=_param("gaussian_noise", severity)))


def shot_noise(images: Array, severity: int, rng: np.random.Generator) -> Array:
    c = _param("shot_noise", severity)
    x = _unit(images)
    return _to_255(rng.poisson(x * c) / c)


def impulse_noise(images: Array, severity: int, rng: np.random.Generator) -> Array:
    amount = _param("impulse_noise", severity)
    x = _unit(images)
    flipped = rng.random(x.shape) < amount
    salt = rng.random(x.shape) < 0.5
    x = np.where(flipped & salt, 1.0, x)
    x = np.where(flipped & ~salt, 0.0, x)
    return _to_255(x)


def speckle_noise(images: Array, severity: int, rng: np.random.Generator) -> Array:
    x = _unit(images)
    return _to_255(x + x * rng.normal(size=x.shape, scale=_param("speckle_noise", severity)))


def gaussian_blur(images: Array, severity: int, rng: np.random.Generator) -> Array:
    del rng
    return _to_255(_gaussian_hw(_unit(images), _param("gaussian_blur", severity)))


def glass_blur(images: Array, severity: int, rng: np.random.Generator) -> Array:
    sigma, delta, iterations = _param("glass_blur", severity)
    x = to_uint8(_gaussian_hw(_unit(images), sigma) * 255)
    n, size = len(x), x.shape[1]
    positions = range(size - delta, delta, -1)  # bottom-right to top-left, as the release
    batch = np.arange(n)
    for _ in range(iterations):
        # randint(-delta, delta) excludes +delta: shifts are -1 or 0 for delta = 1.
        shifts = rng.integers(-delta, delta, size=(len(positions), len(positions), n, 2))
        for i, h in enumerate(positions):
            for j, w in enumerate(positions):
                dx, dy = shifts[i, j, :, 0], shifts[i, j, :, 1]
                # The release's `x[h, w], x[h', w'] = x[h', w'], x[h, w]` acts on numpy views:
                # x[h, w] receives x[h', w'] and x[h', w'] keeps its value (a copy, not a swap).
                x[:, h, w] = x[batch, h + dy, w + dx]
    return _to_255(_gaussian_hw(x / 255.0, sigma))


def defocus_blur(images: Array, severity: int, rng: np.random.Generator) -> Array:
    del rng
    kernel = defocus_kernel(*_param("defocus_blur", severity))
    # cv2.filter2D correlates with BORDER_REFLECT_101 = scipy's "mirror".
    return _to_255(ndimage.correlate(_unit(images), kernel[None, :, :, None], mode="mirror"))


def motion_blur(images: Array, severity: int, rng: np.random.Generator) -> Array:
    radius, sigma = _param("motion_blur", severity)
    angles = rng.uniform(-45, 45, size=len(images))
    # The release blurs the 8-bit image in ImageMagick and reads back 8-bit pixels.
    return _round_to_8bit(motion_blur_batch(images.astype(np.float64), radius, sigma, angles))


def zoom_factors(severity: int) -> Array:
    """The release's `np.arange(1, end, 0.01)`: 7, 12, 16, 21, 26 zooms (float rounding makes
    the end point 1.06 etc. sometimes included)."""
    return np.arange(1, _param("zoom_blur", severity), 0.01)


def zoom_blur(images: Array, severity: int, rng: np.random.Generator) -> Array:
    del rng
    x = _unit(images, np.float32)
    out = np.zeros_like(x)
    factors = zoom_factors(severity)
    for z in factors:
        out += _clipped_zoom(x, float(z))
    return _to_255((x + out) / (len(factors) + 1))


def snow(images: Array, severity: int, rng: np.random.Generator) -> Array:
    mu, sd, zoom, threshold, radius, blur_sigma, blend = _param("snow", severity)
    x = _unit(images, np.float32)
    n, h, w = x.shape[:3]
    layer = rng.normal(size=(n, h, w), loc=mu, scale=sd)
    layer = _clipped_zoom(layer, zoom)
    layer[layer < threshold] = 0
    # The release writes the layer as an 8-bit PNG (truncation), motion-blurs it in ImageMagick
    # and decodes 8-bit pixels again.
    layer8 = to_uint8(np.clip(layer, 0, 1) * 255).astype(np.float64)
    angles = rng.uniform(-135, -45, size=n)
    layer = _round_to_8bit(motion_blur_batch(layer8[..., None], radius, blur_sigma,
                                             angles)) / 255.0
    grey = (np.float32(0.299) * x[..., 0] + np.float32(0.587) * x[..., 1]
            + np.float32(0.114) * x[..., 2])[..., None]  # cv2 RGB2GRAY weights
    x = blend * x + (1 - blend) * np.maximum(x, grey * 1.5 + 0.5)
    return _to_255(x + layer + np.rot90(layer, k=2, axes=(1, 2)))


def fog(images: Array, severity: int, rng: np.random.Generator) -> Array:
    c, decay = _param("fog", severity)
    x = _unit(images)
    max_val = x.max(axis=(1, 2, 3), keepdims=True)
    x = x + c * plasma_fractal(len(x), decay, rng, size=32)[:, :x.shape[1], :x.shape[2], None]
    return _to_255(x * max_val / (max_val + c))


def brightness(images: Array, severity: int, rng: np.random.Generator) -> Array:
    del rng
    hsv = rgb_to_hsv(_unit(images))
    hsv[..., 2] = np.clip(hsv[..., 2] + _param("brightness", severity), 0, 1)
    return _to_255(hsv_to_rgb(hsv))


def contrast(images: Array, severity: int, rng: np.random.Generator) -> Array:
    del rng
    x = _unit(images)
    means = x.mean(axis=(1, 2), keepdims=True)  # per image and channel
    return _to_255((x - means) * _param("contrast", severity) + means)


def saturate(images: Array, severity: int, rng: np.random.Generator) -> Array:
    del rng
    a, b = _param("saturate", severity)
    hsv = rgb_to_hsv(_unit(images))
    hsv[..., 1] = np.clip(hsv[..., 1] * a + b, 0, 1)
    return _to_255(hsv_to_rgb(hsv))


def pixelate_size(severity: int, size: int = IMAGE_SIZE) -> int:
    """The intermediate size int(32 c): 30, 28, 27, 24, 20."""
    return int(size * _param("pixelate", severity))


def pixelate(images: Array, severity: int, rng: np.random.Generator) -> Array:
    from PIL import Image

    del rng
    n = pixelate_size(severity, images.shape[1])
    out = np.empty_like(images)
    for k, img in enumerate(images):
        small = Image.fromarray(img, "RGB").resize((n, n), Image.Resampling.BOX)
        out[k] = np.asarray(small.resize(img.shape[1::-1], Image.Resampling.BOX))
    return out


def jpeg_compression(images: Array, severity: int, rng: np.random.Generator) -> Array:
    from PIL import Image

    del rng
    quality = _param("jpeg_compression", severity)
    out = np.empty_like(images)
    for k, img in enumerate(images):
        buf = io.BytesIO()
        Image.fromarray(img, "RGB").save(buf, "JPEG", quality=quality)
        buf.seek(0)
        with Image.open(buf) as decoded:
            out[k] = np.asarray(decoded.convert("RGB"))
    return out


def _affine_from_points(src_3x2: Array, dst_3x2: Array) -> Array:
    """The 2 x 3 matrix M with M @ (x, y, 1) = dst for the three (x, y) points (OpenCV's
    getAffineTransform)."""
    a = np.concatenate([src_3x2.astype(np.float64), np.ones((3, 1))], axis=1)  # 3 x 3
    return np.linalg.solve(a, dst_3x2.astype(np.float64)).T


def elastic_transform(images: Array, severity: int, rng: np.random.Generator) -> Array:
    alpha, sigma, affine = _param("elastic_transform", severity)
    x = _unit(images, np.float32)
    n, h, w = x.shape[:3]
    centre = np.float32([w, h]) // 2
    square = min(h, w) // 3
    pts1 = np.float32([centre + square, [centre[0] + square, centre[1] - square],
                       centre - square])
    out = np.empty_like(x)
    ys, xs = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    for k in range(n):
        pts2 = pts1 + rng.uniform(-affine, affine, size=pts1.shape).astype(np.float32)
        m = _affine_from_points(pts1, pts2)  # (x, y) -> (x', y'): source -> destination
        inv = np.linalg.inv(np.vstack([m, [0, 0, 1]]))
        # scipy works in (row, col) = (y, x): swap the axes of the inverse map.
        lin = np.array([[inv[1, 1], inv[1, 0]], [inv[0, 1], inv[0, 0]]])
        offset = np.array([inv[1, 2], inv[0, 2]])
        warped = np.stack([ndimage.affine_transform(x[k, :, :, ch], lin, offset, order=1,
                                                    mode="mirror") for ch in range(3)], -1)
        dx = (ndimage.gaussian_filter(rng.uniform(-1, 1, size=(h, w)), sigma, mode="reflect",
                                      truncate=3) * alpha).astype(np.float32)
        dy = (ndimage.gaussian_filter(rng.uniform(-1, 1, size=(h, w)), sigma, mode="reflect",
                                      truncate=3) * alpha).astype(np.float32)
        coords = [ys + dy, xs + dx]
        out[k] = np.stack([ndimage.map_coordinates(warped[:, :, ch], coords, order=1,
                                                   mode="reflect") for ch in range(3)], -1)
    return _to_255(out)


FUNCTIONS: dict[str, CorruptionFn] = {
    "gaussian_noise": gaussian_noise, "shot_noise": shot_noise,
    "impulse_noise": impulse_noise, "defocus_blur": defocus_blur, "glass_blur": glass_blur,
    "motion_blur": motion_blur, "zoom_blur": zoom_blur, "snow": snow, "fog": fog,
    "brightness": brightness, "contrast": contrast, "elastic_transform": elastic_transform,
    "pixelate": pixelate, "jpeg_compression": jpeg_compression,
    "speckle_noise": speckle_noise, "gaussian_blur": gaussian_blur, "saturate": saturate,
}  # keyed by the release's file stem

# TFDS names (registry.CORRUPTION_FILES keys) of the corruptions this module regenerates, in the
# registry's order.
REGENERABLE: tuple[str, ...] = tuple(t for t, stem in CORRUPTION_FILES.items()
                                     if stem in FUNCTIONS)
APPROXIMATE_CORRUPTIONS: tuple[str, ...] = tuple(
    t for t in REGENERABLE if FIDELITY[CORRUPTION_FILES[t]][0] == APPROXIMATE)


def release_stem(corruption: str) -> str:
    stem = corruption_file_stem(corruption)  # DataError for unknown names
    if stem not in FUNCTIONS:
        raise DataError(f"CIFAR-10-C corruption {corruption!r} cannot be regenerated: "
                        f"{NOT_REGENERABLE[stem]}. Regenerable: {', '.join(REGENERABLE)}; for "
                        f"{stem}, use the official CIFAR-10-C.tar")
    return stem


def generator_for(corruption: str, severity: int, seed: int = 0) -> np.random.Generator:
    """The numpy Generator of one (corruption, severity): seeded by (seed, crc32 of the file
    stem, severity), so each pair has its own stream and a regeneration is reproducible."""
    stem = corruption_file_stem(corruption)
    return np.random.default_rng([int(seed), zlib.crc32(stem.encode()), int(severity)])


def corrupt(images_NxHxWx3: np.ndarray, corruption: str, severity: int, *,
            seed: int = 0) -> np.ndarray:
    """Corrupt uint8 CIFAR images (N x 32 x 32 x 3) with a CIFAR-10-C corruption (TFDS name,
    e.g. "snow", "frosted_glass_blur", or the release's file stem, e.g. "glass_blur") at
    `severity` 1..5, with CIFAR-10-C's CIFAR parameters. Returns uint8 N x 32 x 32 x 3
    (truncated, as the release). Same inputs and seed -> same bytes."""
    stem = release_stem(corruption)
    if int(severity) != severity or int(severity) not in (1, 2, 3, 4, 5):
        raise ValueError(f"severity must be 1..5, got {severity!r}")
    images = np.asarray(images_NxHxWx3)
    if images.ndim != 4 or images.shape[1:] != (IMAGE_SIZE, IMAGE_SIZE, 3) or \
            images.dtype != np.uint8:
        raise ValueError(f"images must be uint8 N x {IMAGE_SIZE} x {IMAGE_SIZE} x 3 (the CIFAR "
                         f"parameters are for 32 x 32 RGB), got {images.shape} {images.dtype}")
    if len(images) == 0:
        return images.copy()
    out = FUNCTIONS[stem](images, int(severity), generator_for(stem, int(severity), seed))
    return out if out.dtype == np.uint8 else to_uint8(out)

