"""Your own dataset as one `.npz` file: `npz:<path>` for the in-distribution set or an OOD set.

    ds = data.npz.read_npz("my_data.npz")               # checked arrays, K from the labels
    splits = data.npz.load_npz_train_val_test("my_data.npz", seed=0, val_fraction=0.2)
    ood = data.npz.load_npz_ood("other.npz", like=splits["train"])

The file (`np.savez(path, train_images=..., ...)`; read with allow_pickle=False):

- required `train_images`, `train_labels`, `test_images`, `test_labels`; optional `val_images`
  with `val_labels` (both or neither); other arrays are ignored;
- images (N, H, W, C): uint8 pixels 0..255 (kept as uint8, scaled to [0, 1] on device like
  the built-in sets) or floating values in [0, 1] (stored as float32); or vectors (N, D) of
  finite floating values (float32); a floating dtype other than float32 is converted;
- labels: N integers; K = (largest training label) + 1, and every class 0..K-1 must occur in
  the training labels; test and validation labels must lie in 0..K-1;
- every split's examples have the training examples' shape.

An OOD file needs only `test_images` (its `test_labels`, if present, are integers >= 0 and are
otherwise zeros): its examples must have the in-distribution examples' shape.

Without `val_*` arrays the training arrays are cut into train / validation exactly as the
built-in sets' official training split is (`data.split_indices`: a seeded permutation, the last
`val_fraction` validates), so a seed gives the same split a run of the built-in trainer would.

Every problem is a one-line `CorruptDataError` (a `DataError` and `ValueError`) naming the file
and the array; a missing file is a `MissingDataError`. What is returned are `data.Split`s, as
the built-in loaders return (name "<file stem>/<split>", source "npz").
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np

from gedl_jax.data.arrays import Split
from gedl_jax.data.errors import CorruptDataError, MissingDataError
from gedl_jax.data.registry import NPZ_PREFIX, OWN_DATA_VAL_FRACTION
from gedl_jax.data.splits import train_val_split

PREFIX = NPZ_PREFIX   # `--config.dataset=npz:<path>`, `--config.ood_datasets=npz:<path>`
REQUIRED = ("train_images", "train_labels", "test_images", "test_labels")
SPLIT_KEYS = {"train": ("train_images", "train_labels"), "test": ("test_images", "test_labels"),
              "validation": ("val_images", "val_labels")}
PathLike = str | os.PathLike


@dataclasses.dataclass(frozen=True, eq=False)
class NpzDataset:
    """A checked `.npz` dataset.

    Attributes:
      path: the file.
      name: the dataset's name (the file stem unless given).
      train: the file's whole training set (before any validation cut).
      test: the test set.
      validation: the file's validation set, or None (then `load_npz_train_val_test` cuts one).
      num_classes: K (largest training label + 1).
    """

    path: Path
    name: str
    train: Split
    test: Split
    validation: Split | None
    num_classes: int

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Per-example shape: (H, W, C) images or (D,) vectors."""
        return self.train.image_shape


def parse_spec(text: str) -> Path | None:
    """The path of "npz:<path>" (user folder expanded), or None for any other dataset name."""
    if not str(text).startswith(PREFIX):
        return None
    path = str(text)[len(PREFIX):].strip()
    if not path:
        raise ValueError(f"{text!r}: expected 'npz:<path to the .npz file>'")
    return Path(path).expanduser()


# --------------------------------------------------------------------------------- reading
def _open(path: Path) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise MissingDataError(f"{path}: no such .npz file")
    try:
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except Exception as e:  # noqa: BLE001  (zipfile / zlib / ValueError for damaged files)
        reason = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise CorruptDataError(f"{path}: cannot read it as an .npz file ({type(e).__name__}: "
                               f"{reason})") from None


def _require(arrays: dict[str, np.ndarray], path: Path, keys) -> None:
    missing = [k for k in keys if k not in arrays]
    if missing:
        raise CorruptDataError(f"{path}: missing array(s) {', '.join(map(repr, missing))}; "
                               f"found {sorted(arrays) or 'none'} (needed: {', '.join(keys)})")


def check_images(images: np.ndarray, path: Path, key: str) -> np.ndarray:
    """One images/vectors array, checked: uint8 (N, H, W, C) kept; floating (N, H, W, C) in
    [0, 1] or (N, D) finite, as float32. CorruptDataError (one line) otherwise."""
    where = f"{path}: {key!r}"
    if images.ndim == 3:
        raise CorruptDataError(f"{where} has shape {images.shape} (3 dimensions); expected "
                               f"(N, H, W, C) images or (N, D) vectors (grayscale images need "
                               f"a channel axis: images[..., None])")
    if images.ndim not in (2, 4):
        raise CorruptDataError(f"{where} has shape {images.shape} ({images.ndim} dimensions); "
                               f"expected (N, H, W, C) images or (N, D) vectors")
    if len(images) == 0:
        raise CorruptDataError(f"{where} holds no examples (shape {images.shape})")
    if images.dtype == np.uint8:
        if images.ndim == 2:
            raise CorruptDataError(f"{where} is uint8 (N, D) = {images.shape}; vectors must be "
                                   f"floating (float32)")
        return np.ascontiguousarray(images)
    if not np.issubdtype(images.dtype, np.floating):
        raise CorruptDataError(f"{where} has dtype {images.dtype}; expected uint8 images "
                               f"(0..255) or float32 (images in [0, 1], or vectors)")
    images = np.ascontiguousarray(images, dtype=np.float32)
    finite = np.isfinite(images.reshape(len(images), -1)).all(axis=1)
    if not finite.all():
        bad = np.flatnonzero(~finite)
        raise CorruptDataError(f"{where} holds NaN or inf values in {len(bad)} example(s) "
                               f"(first: index {int(bad[0])})")
    if images.ndim == 4:
        low, high = float(images.min()), float(images.max())
        if low < 0.0 or high > 1.0:
            raise CorruptDataError(f"{where} are float images with values in [{low:g}, "
                                   f"{high:g}]; expected [0, 1] (store 0..255 pixels as uint8, "
                                   f"or divide them by 255)")
    return images


def check_labels(labels: np.ndarray, num_examples: int, path: Path, key: str,
                 images_key: str) -> np.ndarray:
    """N integer labels >= 0, as int32; CorruptDataError (one line) otherwise."""
    where = f"{path}: {key!r}"
    if not np.issubdtype(labels.dtype, np.integer):
        raise CorruptDataError(f"{where} has dtype {labels.dtype}; expected integer class "
                               f"indices 0..K-1")
    if labels.ndim != 1:
        raise CorruptDataError(f"{where} has shape {labels.shape}; expected (N,) class indices")
    if len(labels) != num_examples:
        raise CorruptDataError(f"{where} has {len(labels)} labels but {images_key!r} has "
                               f"{num_examples} examples")
    if len(labels) and int(labels.min()) < 0:
        raise CorruptDataError(f"{where} holds negative labels (min {int(labels.min())}); "
                               f"expected class indices 0..K-1")
    if len(labels) and int(labels.max()) > np.iinfo(np.int32).max:
        raise CorruptDataError(f"{where} holds labels up to {int(labels.max())}; expected "
                               f"class indices 0..K-1")
    return labels.astype(np.int32)


def _split(arrays: dict[str, np.ndarray], path: Path, name: str, split: str,
           shape: tuple[int, ...] | None) -> Split:
    images_key, labels_key = SPLIT_KEYS[split]
    images = check_images(arrays[images_key], path, images_key)
    if shape is not None and images.shape[1:] != shape:
        raise CorruptDataError(f"{path}: {images_key!r} examples have shape {images.shape[1:]} "
                               f"but 'train_images' examples have {shape}")
    labels = check_labels(arrays[labels_key], len(images), path, labels_key, images_key)
    return Split(images, labels, f"{name}/{split}", "npz")


def read_npz(path: PathLike, name: str | None = None) -> NpzDataset:
    """The checked dataset of one `.npz` file (module docstring for the format).

    Args:
      path: the file.
      name: the dataset's name in Split names and logs (default: the file stem).

    Returns:
      The NpzDataset (train, test, optional validation, K).

    Raises:
      MissingDataError: the file does not exist.
      CorruptDataError: any violation of the format, one line naming the file and array.
    """
    path = Path(path).expanduser()
    name = name or path.stem
    arrays = _open(path)
    _require(arrays, path, REQUIRED)
    has_val = ("val_images" in arrays, "val_labels" in arrays)
    if any(has_val) and not all(has_val):
        present, absent = ("val_images", "val_labels") if has_val[0] else ("val_labels",
                                                                           "val_images")
        raise CorruptDataError(f"{path}: {present!r} without {absent!r}; give both or neither "
                               f"(without them a validation set is cut from the training set)")
    train = _split(arrays, path, name, "train", None)
    counts = np.bincount(train.labels)
    num_classes = len(counts)
    if num_classes < 2:
        raise CorruptDataError(f"{path}: 'train_labels' hold one class (0); a classifier needs "
                               f"at least 2")
    absent = np.flatnonzero(counts == 0)
    if len(absent):
        shown = ", ".join(str(int(c)) for c in absent[:10]) + (", ..." if len(absent) > 10
                                                                else "")
        raise CorruptDataError(f"{path}: 'train_labels' run to {num_classes - 1} (K = "
                               f"{num_classes}) but class(es) {shown} never occur; labels must "
                               f"be 0..K-1 with every class in the training set")
    others = {}
    for split in ("test", "validation") if all(has_val) else ("test",):
        s = _split(arrays, path, name, split, train.image_shape)
        if len(s.labels) and int(s.labels.max()) >= num_classes:
            raise CorruptDataError(f"{path}: {SPLIT_KEYS[split][1]!r} hold label "
                                   f"{int(s.labels.max())}, outside the training classes "
                                   f"0..{num_classes - 1}")
        others[split] = s
    return NpzDataset(path, name, train, others["test"], others.get("validation"), num_classes)


def load_npz_train_val_test(path: PathLike, seed: int = 0,
                            val_fraction: float = OWN_DATA_VAL_FRACTION, *,
                            name: str | None = None) -> dict[str, Split]:
    """{"train", "validation", "test"} of an `.npz` dataset, as `data.load_train_val_test`
    returns for a built-in one: the file's `val_*` arrays if it has them, else the seeded cut
    of its training set (`data.train_val_split`, the official sets' protocol).

    Args:
      path: the file.
      seed: the split seed (the run's seed, or config.split_seed).
      val_fraction: the fraction of the training set held out when there are no `val_*`
        arrays (ignored otherwise).
      name: the dataset's name (default: the file stem).

    Returns:
      The three Splits.
    """
    ds = read_npz(path, name)
    if ds.validation is not None:
        return {"train": ds.train, "validation": ds.validation, "test": ds.test}
    train, validation = train_val_split(ds.train, val_fraction, seed, ds.name)
    return {"train": train, "validation": validation, "test": ds.test}


def load_npz_ood(path: PathLike, like: Split | tuple[int, ...] | None = None,
                 name: str | None = None) -> Split:
    """An OOD set: the `test_images` of an `.npz` file (labels from `test_labels` if present,
    else zeros), checked like the in-distribution arrays.

    Args:
      path: the file.
      like: the in-distribution training Split (or its per-example shape): the OOD examples
        must have that shape.
      name: the set's name (default: "<file stem>/test").

    Returns:
      The Split.
    """
    path = Path(path).expanduser()
    arrays = _open(path)
    _require(arrays, path, ("test_images",))
    images = check_images(arrays["test_images"], path, "test_images")
    expected = like.image_shape if isinstance(like, Split) else like
    if expected is not None and tuple(images.shape[1:]) != tuple(expected):
        raise CorruptDataError(f"{path}: OOD 'test_images' examples have shape "
                               f"{images.shape[1:]} but the in-distribution examples have "
                               f"{tuple(expected)}: an OOD set must have the same shape")
    if "test_labels" in arrays:
        labels = check_labels(arrays["test_labels"], len(images), path, "test_labels",
                              "test_images")
    else:
        labels = np.zeros(len(images), np.int32)
    return Split(images, labels, name or f"{path.stem}/test", "npz")
