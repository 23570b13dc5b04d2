r"""How close the regenerated deterministic corruptions are to the release's libraries.

CIFAR-10-C's generator (hendrycks/robustness, ImageNet-C/create_c/make_cifar_c.py) computes
brightness and saturate with scikit-image's rgb2hsv/hsv2rgb, gaussian_blur with scikit-image's
`gaussian`, defocus_blur with OpenCV's GaussianBlur + filter2D, zoom_blur with scipy one image
at a time. gedl_jax.data.corruptions re-implements them with numpy/scipy (zoom_blur and contrast
batched). This script applies the library calls the release makes (today's APIs:
`channel_axis=-1` for the removed `multichannel=True`) to CIFAR-10 test images and counts the
pixels where the two disagree, and by how much.

Needs scikit-image and opencv-python-headless, which gedl-jax itself does not depend on:

    pip install scikit-image opencv-python-headless
    python bin/cifar10c_library_parity.py --data_dir=/path/to/data --num_examples=2000
"""

from __future__ import annotations

import argparse

import cv2
import numpy as np
import skimage
from skimage.color import hsv2rgb, rgb2hsv
from skimage.filters import gaussian

from gedl_jax import data
from gedl_jax.data import corruptions as C


def release_brightness(img: np.ndarray, d: float) -> np.ndarray:
    hsv = rgb2hsv(img / 255.0)
    hsv[:, :, 2] = np.clip(hsv[:, :, 2] + d, 0, 1)
    return np.clip(hsv2rgb(hsv), 0, 1) * 255


def release_saturate(img: np.ndarray, ab: tuple[float, float]) -> np.ndarray:
    hsv = rgb2hsv(img / 255.0)
    hsv[:, :, 1] = np.clip(hsv[:, :, 1] * ab[0] + ab[1], 0, 1)
    return np.clip(hsv2rgb(hsv), 0, 1) * 255


def release_gaussian_blur(img: np.ndarray, sigma: float) -> np.ndarray:
    return np.clip(gaussian(img / 255.0, sigma=sigma, channel_axis=-1), 0, 1) * 255


def release_defocus(img: np.ndarray, params: tuple[float, float]) -> np.ndarray:
    radius, alias = params
    grid = np.arange(-8, 9)
    xx, yy = np.meshgrid(grid, grid)
    disk = np.array((xx ** 2 + yy ** 2) <= radius ** 2, dtype=np.float32)
    disk /= np.sum(disk)
    kernel = cv2.GaussianBlur(disk, ksize=(3, 3), sigmaX=alias)
    x = img / 255.0
    out = np.stack([cv2.filter2D(x[:, :, c], -1, kernel) for c in range(3)], -1)
    return np.clip(out, 0, 1) * 255


def release_contrast(img: np.ndarray, c: float) -> np.ndarray:
    x = img / 255.0
    means = np.mean(x, axis=(0, 1), keepdims=True)
    return np.clip((x - means) * c + means, 0, 1) * 255


def release_zoom_blur(img: np.ndarray, end: float) -> np.ndarray:
    from scipy.ndimage import zoom  # noqa: PLC0415

    x = (img / 255.0).astype(np.float32)
    out = np.zeros_like(x)
    factors = np.arange(1, end, 0.01)
    for z in factors:  # the release's clipped_zoom, one image at a time
        ch = int(np.ceil(32 / z))
        top = (32 - ch) // 2
        zoomed = zoom(x[top:top + ch, top:top + ch], (z, z, 1), order=1)
        trim = (zoomed.shape[0] - 32) // 2
        out += zoomed[trim:trim + 32, trim:trim + 32]
    return np.clip((x + out) / (len(factors) + 1), 0, 1) * 255


RELEASE = {"brightness": release_brightness, "saturate": release_saturate,
           "gaussian_blur": release_gaussian_blur, "defocus_blur": release_defocus,
           "contrast": release_contrast, "zoom_blur": release_zoom_blur}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data_dir", default=None)
    parser.add_argument("--num_examples", type=int, default=2000)
    args = parser.parse_args()
    test = data.load_split("cifar10", "test", args.data_dir).images
    images = test[C.subset_indices(len(test), args.num_examples)]
    print(f"scikit-image {skimage.__version__}, OpenCV {cv2.__version__}, "
          f"{C.library_versions()}; {len(images)} evenly spaced CIFAR-10 test images")
    print("| corruption | severity | pixels differing | max abs diff (LSB) |")
    print("|---|---|---|---|")
    for name, fn in RELEASE.items():
        for s in range(1, 6):
            ref = np.stack([np.uint8(fn(img, C.PARAMETERS[name][s - 1])) for img in images])
            ours = C.corrupt(images, name, s)
            diff = np.abs(ref.astype(int) - ours.astype(int))
            print(f"| {name} | {s} | {(diff > 0).mean():.5%} | {diff.max()} |", flush=True)


if __name__ == "__main__":
    main()
