"""`Split`: a decoded split held as host numpy arrays, and its channel statistics."""

from __future__ import annotations

import dataclasses

import numpy as np

from gedl_jax.data.errors import CorruptDataError


def subset_indices(total: int, num_examples: int) -> np.ndarray:
    """`num_examples` evenly spaced indices of range(total) (all of them for 0 or >= total).

    Evenly spaced rather than the first n: a test split stored sorted by label (as some decoded
    copies of CIFAR-10 are) would otherwise give a subset of one class."""
    if num_examples < 0:
        raise ValueError(f"num_examples must be >= 0, got {num_examples}")
    if not num_examples or num_examples >= total:
        return np.arange(total)
    return (np.arange(num_examples) * total) // num_examples


@dataclasses.dataclass(frozen=True, eq=False)
class Split:
    """images: N x H x W x C uint8 (pixels 0..255), or float32 (N x H x W x C images in [0, 1],
    or N x D vectors: `gedl_jax.data.npz`); labels: N int32; name: e.g. "mnist/train".

    source says where the arrays came from ("official", "arrays", "tfds", "idx_folder", ... with
    "+cache" when read from the decoded-array cache)."""

    images: np.ndarray
    labels: np.ndarray
    name: str
    source: str = ""

    def __post_init__(self) -> None:
        uint8_images = self.images.ndim == 4 and self.images.dtype == np.uint8
        float_arrays = self.images.ndim in (2, 4) and self.images.dtype == np.float32
        if not (uint8_images or float_arrays):
            raise CorruptDataError(f"{self.name}: images must be N x H x W x C uint8, or float32 "
                                   f"N x H x W x C / N x D, got {self.images.shape} "
                                   f"{self.images.dtype}")
        if self.labels.shape != (len(self.images),) or self.labels.dtype != np.int32:
            raise CorruptDataError(f"{self.name}: labels must be ({len(self.images)},) int32, got "
                                   f"{self.labels.shape} {self.labels.dtype}")

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def image_shape(self) -> tuple[int, ...]:
        """(H, W, C), or (D,) for vectors."""
        return tuple(self.images.shape[1:])

    def take(self, indices: np.ndarray, name: str | None = None) -> Split:
        """The examples at `indices` (a copy), as a new Split."""
        return Split(np.ascontiguousarray(self.images[indices]),
                     np.ascontiguousarray(self.labels[indices]), name or self.name, self.source)

    def subset(self, n: int) -> Split:
        """`n` evenly spaced examples, indices (i * len) // n (a copy), or this Split itself when
        n <= 0 or n >= len. Evenly spaced, not the first n: a split stored sorted by label (the
        decoded CIFAR-10 test arrays) still gives every class; the same positions as
        `subset_indices`, so a subset of the test set matches a subset of CIFAR-10-C."""
        if n <= 0 or n >= len(self):
            return self
        return self.take(subset_indices(len(self), n))

    def label_counts(self, num_classes: int | None = None) -> np.ndarray:
        """The number of examples of each class (length at least `num_classes`)."""
        return np.bincount(self.labels, minlength=num_classes or 0)


def check_arrays(images: np.ndarray, labels: np.ndarray, origin: str,
                 image_shape: tuple[int, ...] | None = None,
                 num_classes: int | None = None) -> None:
    """Raise CorruptDataError unless the decoded arrays have the registered shape and labels."""
    if images.ndim != 4 or images.dtype != np.uint8:
        raise CorruptDataError(f"{origin}: decoded images are {images.shape} {images.dtype}, "
                               "expected N x H x W x C uint8")
    if image_shape is not None and tuple(images.shape[1:]) != tuple(image_shape):
        raise CorruptDataError(f"{origin}: images are {tuple(images.shape[1:])}, expected "
                               f"{tuple(image_shape)}")
    if labels.shape != (len(images),):
        raise CorruptDataError(f"{origin}: {labels.shape} labels for {len(images)} images")
    if len(labels) and num_classes is not None and (labels.min() < 0
                                                    or labels.max() >= num_classes):
        raise CorruptDataError(f"{origin}: labels span {labels.min()}..{labels.max()}, expected "
                               f"0..{num_classes - 1}")


def channel_stats(split: Split | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and std of the pixels scaled to [0, 1] (float32, shape (C,)), computed in
    float64 in chunks (float arrays are taken as they are: images already in [0, 1], or vectors,
    whose "channels" are their D features). Use the in-distribution *training* split's stats for
    every set."""
    images = split.images if isinstance(split, Split) else np.asarray(split)
    c = images.shape[-1]
    flat = images.reshape(-1, c)
    total = np.zeros(c, np.float64)
    total_sq = np.zeros(c, np.float64)
    step = 1 << 20
    for i in range(0, len(flat), step):
        chunk = flat[i:i + step].astype(np.float64)
        if images.dtype == np.uint8:
            chunk /= 255.0
        total += chunk.sum(0)
        total_sq += np.square(chunk).sum(0)
    n = max(len(flat), 1)
    mean = total / n
    std = np.sqrt(np.maximum(total_sq / n - np.square(mean), 0.0))
    return mean.astype(np.float32), std.astype(np.float32)
