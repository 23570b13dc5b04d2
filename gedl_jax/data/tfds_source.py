"""TensorFlow Datasets as a source: reading prepared datasets, and preparing from manual_dir.

Reading uses `tfds.data_source` (ArrayRecord, random access, no TensorFlow needed) with
`download=False`, so it never reaches for the network. The examples are decoded once into numpy
arrays (then cached by the loader); training never touches TFDS.

Preparing an official builder from the files in the data folder (`prepare_tfds`) needs TensorFlow
(an optional extra). TFDS retries the network for minutes when a registered file is missing from
manual_dir, so every registered file name is checked first, then every checksum, and only then is
TFDS asked to prepare anything.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from gedl_jax.data import cache as cache_lib
from gedl_jax.data.errors import DataError, MissingDataError
from gedl_jax.data.locations import resolve_data_dir
from gedl_jax.data.registry import get_info, registered_files

log = logging.getLogger(__name__)
_CHUNK = 2048


def _tfds():
    try:
        import tensorflow_datasets as tfds
    except Exception as e:  # noqa: BLE001
        raise DataError("tensorflow-datasets is not importable here, and the TFDS source "
                        "needs it: use the raw files in the data folder (source='raw'), or the "
                        f"decoded-array cache\n  ({type(e).__name__}: {e})") from None
    return tfds


def tfds_available() -> bool:
    try:
        _tfds()
    except DataError:
        return False
    return True


def _no_local_folder(tfds_name: str, tfds_data_dir: str | os.PathLike | None) -> bool:
    """True when every TFDS data dir is a local folder and none holds `tfds_name`'s folder.

    Asking TFDS about a dataset it has no folder for logs "Variant folder ... has no
    dataset_info.json" twice per call (absl WARNING), on every run that reads the raw files
    through source='auto': the answer (not prepared) is known without asking."""
    try:
        from tensorflow_datasets.core.utils import file_utils

        dirs = [str(d) for d in file_utils.list_data_dirs(given_data_dir=tfds_data_dir)]
    except Exception:  # noqa: BLE001  (another TFDS version: ask TFDS itself)
        return False
    base = tfds_name.split("/")[0].split(":")[0]
    if any("://" in d for d in dirs):   # gs:// and the like: only TFDS can tell
        return False
    return not any((Path(d) / base).is_dir() for d in dirs)


def is_prepared(tfds_name: str, tfds_data_dir: str | os.PathLike | None = None,
                split: str | None = None, *, skip_without_folder: bool = False) -> bool:
    """Whether TFDS has `tfds_name` prepared under `tfds_data_dir` (its default if None), or at
    least `tfds.data_source` (what `read_tfds` uses) can open `split` of it with examples in it.
    (Without a split, data_source opens even an empty or half-written folder, so it proves
    nothing.) `skip_without_folder` (the source='auto' fallback, asked on every run that reads
    the raw files): False at once, without asking TFDS, when no data dir has a folder for it.
    source='tfds' always asks TFDS, so `tfds.testing.mock_data` (no folder) still answers."""
    try:
        tfds = _tfds()
    except DataError:
        return False
    if skip_without_folder and _no_local_folder(tfds_name, tfds_data_dir):
        return False
    try:
        if tfds.builder(tfds_name, data_dir=tfds_data_dir).is_prepared():
            return True
    except Exception:  # noqa: BLE001  (unknown name, broken folder: try the reader)
        pass
    if split is None:
        return False
    try:
        return len(tfds.data_source(tfds_name, split=split, data_dir=tfds_data_dir,
                                    download=False)) > 0
    except Exception:  # noqa: BLE001
        return False


def prepared_files(tfds_name: str, split: str, tfds_data_dir: str | os.PathLike | None
                   ) -> list[Path]:
    """The prepared record files of a split (empty where none can be found, e.g. under mock)."""
    try:
        tfds = _tfds()
        data_path = Path(tfds.builder(tfds_name, data_dir=tfds_data_dir).data_dir)
    except Exception:  # noqa: BLE001
        return []
    base = tfds_name.split("/")[0]
    return sorted(data_path.glob(f"{base}-{split}.*")) if data_path.is_dir() else []


def _examples(ds: Any, start: int, stop: int) -> list[dict[str, Any]]:
    keys = list(range(start, stop))
    try:
        return list(ds.__getitems__(keys))
    except (AttributeError, TypeError):  # mock data sources lack a working __getitems__
        return [ds[k] for k in keys]


def read_tfds(tfds_name: str, split: str, tfds_data_dir: str | os.PathLike | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
    """Decode a prepared TFDS split to (images N x H x W x C uint8, labels N int32)."""
    tfds = _tfds()
    try:
        ds = tfds.data_source(tfds_name, split=split, data_dir=tfds_data_dir, download=False)
    except NotImplementedError as e:
        raise DataError(f"TFDS dataset {tfds_name!r} is in a format tfds.data_source cannot "
                        "read: prepare it with file_format='array_record' "
                        "(gedl_jax.data.prepare_tfds does), or put the raw files in the data "
                        f"folder\n  ({str(e).splitlines()[0]})") from None
    except Exception as e:  # noqa: BLE001  (TFDS raises AssertionError / various when absent)
        raise MissingDataError(f"TFDS dataset {tfds_name!r} split {split!r} is not prepared in "
                               f"{tfds_data_dir or 'the default TFDS data dir'} "
                               f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
                               ) from None
    n = len(ds)
    images, labels = [], []
    for start in range(0, n, _CHUNK):
        for ex in _examples(ds, start, min(n, start + _CHUNK)):
            img = np.asarray(ex["image"])
            images.append(img[..., None] if img.ndim == 2 else img)
            labels.append(int(ex["label"]))
    if not images:
        raise DataError(f"TFDS dataset {tfds_name!r} split {split!r} is empty")
    return (np.ascontiguousarray(np.stack(images).astype(np.uint8, copy=False)),
            np.asarray(labels, np.int32))


def prepare_tfds(name: str, data_dir: str | os.PathLike | None = None,
                 tfds_data_dir: str | os.PathLike | None = None, config: str | None = None,
                 cache_dir: str | os.PathLike | None = None) -> Path:
    """Prepare the official TFDS builder `name` (ArrayRecord) from the files in
    `<data_dir>/<name>/` used as TFDS's manual_dir. Fails within seconds, before TFDS runs, if a
    registered file is missing or has the wrong checksum. Needs TensorFlow (extra
    `tfds-prepare`); returns the prepared dataset's folder."""
    info = get_info(name)
    manual_dir = resolve_data_dir(data_dir) / info.folder
    specs = registered_files(name, "official")
    missing = [s for s in specs.values() if not (manual_dir / s.filename).is_file()]
    if missing:
        lines = "\n".join(f"  {s.filename}  {s.size:,} bytes  {s.url}" for s in missing)
        raise MissingDataError(
            f"cannot prepare TFDS {name!r} offline: put the official files below, under these "
            f"names, into its manual_dir\n  {manual_dir}\n"
            f"  (TFDS needs every registered file there; without them it would retry the "
            f"network for minutes)\n{lines}")
    cache_root = cache_lib.resolve_cache_dir(cache_dir)
    for s in specs.values():
        cache_lib.verify_file(manual_dir / s.filename, s, cache_root)
    try:
        import tensorflow  # noqa: F401
    except Exception as e:  # noqa: BLE001
        raise DataError(
            f"preparing the official TFDS builder {name!r} needs TensorFlow: pip install "
            f"'gedl-jax[tfds-prepare]', or skip preparing (source='raw' reads the same files)\n"
            f"  ({type(e).__name__}: {e})") from e
    tfds = _tfds()
    tfds_name = f"{name}/{config}" if config else name
    builder = tfds.builder(tfds_name, data_dir=tfds_data_dir, file_format="array_record")
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(manual_dir=str(manual_dir)))
    return Path(builder.data_dir)
