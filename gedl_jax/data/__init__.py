"""Datasets of the paper: offline loading, checksums, decoded-array cache, splits, device input.

    from gedl_jax import data
    splits = data.load_train_val_test("mnist", seed=0)  # 48k/12k/10k; downloads what is missing
    oods = [data.load_ood(n, data_dir) for n in data.default_ood_sets("mnist")]  # kmnist, fmnist
    extra = data.load_ood("/path/to/idx_folder")   # any folder of MNIST-format t10k IDX files
    far = data.load_ood("cifar10_gray28", data_dir)  # derived: CIFAR-10 test as 28x28 gray
    data.ood_group("mnist", "cifar10_gray28")        # "far" (data.OOD_GROUPS: near / far)
    mine = data.load_npz_train_val_test("my.npz", seed=0)  # your own arrays (npz.py)
    tex = data.load_own_ood("images:dtd/images", like=mine["train"])  # image files, resized
    fog3 = data.load_corrupted("fog", 3, data_dir)  # CIFAR-10-C (official, else regenerated)
    # python -m gedl_jax.data.regenerate --data_dir=D   regenerates CIFAR-10-C (regenerate.py)

Host side (numpy): registry.py (names, shapes, registered checksums), locations.py (the data
folder), download.py (verified download, mirror, offline switch), fetch.py (its command line,
`python -m gedl_jax.data.fetch`), readers.py (official formats), cache.py (verification, cache),
loading.py (sources, the run's pre-flight), splits.py (protocol), tfds_source.py (TFDS),
derived.py (OOD sets converted from another dataset's test split), npz.py (a user's dataset in
one .npz file), image_folder.py (folders of image files), own.py (`npz:<path>` / `tfds:<name>` /
`images:<folder>` by name). Device
side (pure JAX, jit-able): device.py. Nothing here imports TensorFlow; tensorflow_datasets is
optional (registered checksums, the TFDS source).
"""

from gedl_jax.data.arrays import Split, channel_stats
from gedl_jax.data.cache import resolve_cache_dir, sha256_file, verify_file
from gedl_jax.data.device import (
    apply_geometry,
    augment_cifar,
    epoch_permutation,
    pad_for_eval,
    take_batch,
    to_float,
)
from gedl_jax.data.download import DOWNLOAD_MODES, DownloadError, fetch_datasets
from gedl_jax.data.errors import ChecksumError, CorruptDataError, DataError, MissingDataError
from gedl_jax.data.loading import (
    SOURCES,
    ensure_available,
    load_corrupted,
    load_ood,
    load_split,
    loadable_offline,
    read_idx_folder,
)
from gedl_jax.data.locations import ENV_DATA_DIR, default_data_dir, resolve_data_dir
from gedl_jax.data.registry import (
    CORRUPTIONS,
    DATASETS,
    DERIVED_OOD,
    EXTRA_CORRUPTIONS,
    OOD_GROUP_NAMES,
    OOD_GROUPS,
    SEVERITIES,
    DatasetInfo,
    DerivedSpec,
    FileSpec,
    add_ood_groups,
    check_ood_groups,
    dataset_family,
    default_ood_sets,
    get_info,
    is_ood_name,
    ood_group,
    ood_sets_by_group,
    parse_ood_groups,
    registered_files,
    source_split,
)
from gedl_jax.data.splits import load_train_val_test, split_indices, train_val_split
from gedl_jax.data import image_folder, npz, own
from gedl_jax.data.own import OwnDataset, is_own, load_own, load_own_ood
from gedl_jax.data.npz import NpzDataset, load_npz_ood, load_npz_train_val_test, read_npz
from gedl_jax.data.tfds_source import prepare_tfds

__all__ = [
    "CORRUPTIONS", "DATASETS", "DERIVED_OOD", "DOWNLOAD_MODES", "ENV_DATA_DIR",
    "EXTRA_CORRUPTIONS", "OOD_GROUP_NAMES", "OOD_GROUPS", "SEVERITIES", "SOURCES", "ChecksumError",
    "CorruptDataError", "DataError", "DatasetInfo", "DerivedSpec", "DownloadError", "FileSpec",
    "MissingDataError", "NpzDataset", "OwnDataset", "Split",
    "add_ood_groups", "apply_geometry", "augment_cifar", "channel_stats", "check_ood_groups",
    "dataset_family", "default_data_dir",
    "default_ood_sets", "ensure_available", "epoch_permutation", "fetch_datasets", "get_info",
    "load_corrupted",
    "load_npz_ood", "load_npz_train_val_test", "load_ood", "load_split", "load_train_val_test",
    "loadable_offline",
    "image_folder", "is_own", "load_own", "load_own_ood", "npz", "own", "pad_for_eval",
    "prepare_tfds", "read_npz",
    "read_idx_folder", "registered_files", "resolve_cache_dir",
    "resolve_data_dir", "sha256_file", "source_split", "split_indices", "is_ood_name",
    "ood_group", "ood_sets_by_group", "parse_ood_groups",
    "take_batch", "to_float", "train_val_split", "verify_file",
]
