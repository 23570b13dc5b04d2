"""Your own data by name: `npz:<path>` (`data.npz`), `tfds:<name>` (a prepared TFDS dataset) or
`images:<folder>` (image files, `data.image_folder`).

    ds = data.own.load_own("npz:my_data.npz")            # OwnDataset: train, test, validation?, K
    ds = data.own.load_own("tfds:my_dataset", tfds_data_dir="~/tensorflow_datasets")
    ds = data.own.load_own("images:my_images")           # train/<class>/..., test/<class>/...
    ood = data.own.load_own_ood("npz:far.npz", like=ds.train)
    ood = data.own.load_own_ood("images:textures", like=ds.train)   # resized to ds's images

A TFDS dataset is read with `tfds.data_source` (download=False, never the network, no
TensorFlow needed) from `tfds_data_dir` (TFDS's default data folder when None): its "train" and
"test" splits as uint8 (N, H, W, C) images with integer labels (the keys "image" and "label" of
an image-classification builder), K from the builder's label feature. A dataset that is not
prepared there is a one-line `MissingDataError`. An OOD set by TFDS name is its "test" split.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path

import numpy as np

from gedl_jax.data import image_folder
from gedl_jax.data import npz as npz_lib
from gedl_jax.data import registry
from gedl_jax.data import tfds_source
from gedl_jax.data.arrays import Split
from gedl_jax.data.errors import CorruptDataError

PREFIXES = registry.OWN_DATA_PREFIXES
TFDS_PREFIX = registry.TFDS_PREFIX


def is_own(name: str) -> bool:
    """Whether `name` is your own data ("npz:<path>", "tfds:<name>" or "images:<folder>")."""
    return str(name).startswith(PREFIXES)


@dataclasses.dataclass(frozen=True, eq=False)
class OwnDataset:
    """Checked splits of your own dataset (`validation` None: cut from `train` as for the
    official sets)."""

    name: str
    train: Split
    test: Split
    validation: Split | None
    num_classes: int


def _tfds_name(name: str) -> str:
    text = str(name)[len(TFDS_PREFIX):].strip()
    if not text:
        raise ValueError(f"{name!r}: expected 'tfds:<prepared TFDS dataset name>'")
    return text


def _tfds_num_classes(tfds_name: str, tfds_data_dir, labels: np.ndarray) -> int:
    """K from the builder's label feature, else the largest label + 1."""
    try:
        tfds = tfds_source._tfds()
        feature = tfds.builder(tfds_name, data_dir=tfds_data_dir).info.features["label"]
        return int(feature.num_classes)
    except Exception:  # noqa: BLE001  (no info: the labels decide)
        return int(labels.max()) + 1


def _tfds_split(tfds_name: str, split: str, tfds_data_dir) -> Split:
    images, labels = tfds_source.read_tfds(tfds_name, split, tfds_data_dir)
    if images.ndim != 4:
        raise CorruptDataError(f"TFDS {tfds_name!r} {split}: images of shape {images.shape[1:]};"
                               f" expected (H, W, C) images")
    return Split(images, labels, f"{tfds_name}/{split}", "tfds")


@functools.lru_cache(maxsize=4)
def _load_own(name: str, tfds_data_dir: str | None, stamp: tuple[int, int] | None
              ) -> OwnDataset:
    """Read once per process and file version (`stamp`: an .npz file's mtime and size, so a
    file written again, e.g. by a notebook cell run twice, is read again)."""
    del stamp
    path = npz_lib.parse_spec(name)
    if path is not None:
        ds = npz_lib.read_npz(path)
        return OwnDataset(name, ds.train, ds.test, ds.validation, ds.num_classes)
    tfds_name = _tfds_name(name)
    train = _tfds_split(tfds_name, "train", tfds_data_dir)
    test = _tfds_split(tfds_name, "test", tfds_data_dir)
    k = _tfds_num_classes(tfds_name, tfds_data_dir, train.labels)
    for split in (train, test):
        if test.image_shape != train.image_shape:
            raise CorruptDataError(f"TFDS {tfds_name!r}: test images {test.image_shape} differ "
                                   f"from train images {train.image_shape}")
        if len(split.labels) and int(split.labels.max()) >= k:
            raise CorruptDataError(f"TFDS {tfds_name!r}: {split.name} holds label "
                                   f"{int(split.labels.max())}, outside 0..{k - 1}")
    return OwnDataset(name, train, test, None, k)


def load_own(name: str, tfds_data_dir: str | os.PathLike | None = None,
             cache_dir: str | os.PathLike | None = None) -> OwnDataset:
    """The checked dataset `name` ("npz:<path>", "tfds:<name>" or "images:<folder>"; module
    docstring). `cache_dir`: where an image folder's decoded arrays are cached.

    Raises:
      MissingDataError: the file, folder, or prepared TFDS dataset is not there.
      CorruptDataError: arrays or files that break the format (one line naming them).
    """
    if not is_own(name):
        raise ValueError(f"{name!r} is not your own data ('npz:<path>', 'tfds:<name>' or "
                         f"'images:<folder>')")
    folder = image_folder.parse_spec(name)
    if folder is not None:   # decoded arrays cached on disk, keyed by the files' stat
        ds = image_folder.load_dataset(folder, cache_dir)
        return OwnDataset(str(name), ds.train, ds.test, ds.validation, ds.num_classes)
    path = npz_lib.parse_spec(name)
    stamp = None
    if path is not None and path.is_file():
        stat = path.stat()
        stamp = (stat.st_mtime_ns, stat.st_size)
    return _load_own(str(name), str(tfds_data_dir) if tfds_data_dir else None, stamp)


def load_own_ood(name: str, like: Split | tuple[int, ...] | None = None,
                 tfds_data_dir: str | os.PathLike | None = None, *,
                 image_resize: str = "crop", cache_dir: str | os.PathLike | None = None,
                 num_examples: int = 0) -> Split:
    """An OOD set: the `test_images` of "npz:<path>", or the "test" split of "tfds:<name>",
    whose examples must have the shape of `like` (the in-distribution training split); or the
    images of "images:<folder>", made that shape by `image_resize` ("crop" or "stretch":
    `data.image_folder`; `num_examples` > 0 decodes only the examples `Split.subset` keeps)."""
    folder = image_folder.parse_spec(name)
    if folder is not None:
        if like is None:
            raise ValueError(f"{name!r}: an image folder OOD set needs `like` (the "
                             f"in-distribution examples' shape) to size its images")
        return image_folder.load_ood(folder, like, image_resize, cache_dir,
                                     num_examples=num_examples)
    path = npz_lib.parse_spec(name)
    if path is not None:
        return npz_lib.load_npz_ood(path, like=like, name=f"{Path(path).stem}/test")
    tfds_name = _tfds_name(name)
    split = _tfds_split(tfds_name, "test", str(tfds_data_dir) if tfds_data_dir else None)
    expected = like.image_shape if isinstance(like, Split) else like
    if expected is not None and split.image_shape != tuple(expected):
        raise CorruptDataError(f"OOD set {name!r} has examples of shape {split.image_shape} but "
                               f"the in-distribution examples have {tuple(expected)}: an OOD "
                               f"set must have the same shape")
    return split
