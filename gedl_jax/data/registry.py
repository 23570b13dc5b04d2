"""Dataset registry: names, classes, shapes, split sizes and the files each source needs.

The checksums of the *official* files are TensorFlow Datasets' registered url checksums (the
same size + sha256 TFDS's DownloadManager verifies for `manual_dir` files). They are read from the
installed `tensorflow_datasets` package (`tfds.builder_cls(name).url_infos`); where TFDS is not
installed (the lent GPU machines) a verbatim copy of those lines, kept below and tested to equal
TFDS's, is used instead.

Besides the official archives, a dataset folder may hold decoded arrays, `train.npz` / `test.npz`
(`images` N x H x W x C uint8, `labels` N), the same decoded form the cache keeps. For CIFAR-10 the
project registers the checksums of one lossless decoded copy (60,000 images exported losslessly
from the official release, pixel-exact but sorted by (label, file name) instead of the official
record order, so a seeded train/validation split differs from the official archive's); arrays of
other datasets are accepted unverified, with a warning.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import functools
import logging
from collections.abc import Iterator, Mapping

from gedl_jax.data.errors import DataError

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class FileSpec:
    """One registered file: its name in the dataset folder, byte size and sha256."""

    filename: str
    size: int
    sha256: str
    url: str = ""
    registered_by: str = ""  # "tensorflow_datasets" or "gedl_jax"


@dataclasses.dataclass(frozen=True)
class SourceSpec:
    """One way to obtain a dataset from files in its folder.

    kind: "official" (the archives TFDS registers) or "arrays" (decoded npz arrays).
    format: the reader to use ("idx", "cifar10_binary", "cifar100_binary", "svhn_mat", "npz",
      "cifar10c_tar").
    split_files: split name -> file names (in the dataset folder) that split needs.
    """

    kind: str
    format: str
    split_files: Mapping[str, tuple[str, ...]]


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    name: str
    num_classes: int
    image_shape: tuple[int, int, int]  # (H, W, C)
    num_examples: Mapping[str, int]  # official split sizes
    val_fraction: float  # held-out fraction of the official train split (I-EDL/R-EDL protocol)
    default_ood: tuple[str, ...]  # OOD test sets used with this dataset in-distribution
    sources: tuple[SourceSpec, ...]  # in order of preference
    description: str = ""

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(self.num_examples)

    @property
    def family(self) -> str:
        """"mnist" for the 28x28 grayscale sets (MNIST, Fashion-MNIST, KMNIST), "cifar" for the
        32x32 colour ones: which protocol network, quick subset and source recipe apply."""
        return "mnist" if self.image_shape == (28, 28, 1) else "cifar"

    @property
    def folder(self) -> str:
        """Subfolder of the data folder holding this dataset's files."""
        return self.name


_IDX_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
_NPZ_FILES = {"train": ("train.npz",), "test": ("test.npz",)}


def _idx_sources() -> tuple[SourceSpec, ...]:
    return (SourceSpec("official", "idx", _IDX_FILES), SourceSpec("arrays", "npz", _NPZ_FILES))


DATASETS: dict[str, DatasetInfo] = {
    "mnist": DatasetInfo(
        "mnist", 10, (28, 28, 1), {"train": 60000, "test": 10000}, 0.2,
        ("kmnist", "fashion_mnist"), _idx_sources(), "MNIST handwritten digits"),
    "fashion_mnist": DatasetInfo(
        "fashion_mnist", 10, (28, 28, 1), {"train": 60000, "test": 10000}, 0.2,
        ("mnist", "kmnist"), _idx_sources(), "Fashion-MNIST (Zalando article images)"),
    "kmnist": DatasetInfo(
        "kmnist", 10, (28, 28, 1), {"train": 60000, "test": 10000}, 0.2,
        ("mnist", "fashion_mnist"), _idx_sources(), "Kuzushiji-MNIST (cursive Japanese)"),
    "cifar10": DatasetInfo(
        "cifar10", 10, (32, 32, 3), {"train": 50000, "test": 10000}, 0.05,
        ("svhn_cropped", "cifar100"),
        (SourceSpec("official", "cifar10_binary",
                    {"train": ("cifar-10-binary.tar.gz",), "test": ("cifar-10-binary.tar.gz",)}),
         SourceSpec("arrays", "npz", _NPZ_FILES)),
        "CIFAR-10"),
    "cifar100": DatasetInfo(
        "cifar100", 100, (32, 32, 3), {"train": 50000, "test": 10000}, 0.05,
        ("svhn_cropped",),
        (SourceSpec("official", "cifar100_binary",
                    {"train": ("cifar-100-binary.tar.gz",), "test": ("cifar-100-binary.tar.gz",)}),
         SourceSpec("arrays", "npz", _NPZ_FILES)),
        "CIFAR-100 (fine labels, as TFDS's `label`)"),
    "svhn_cropped": DatasetInfo(
        "svhn_cropped", 10, (32, 32, 3), {"train": 73257, "test": 26032, "extra": 531131}, 0.05,
        ("cifar10", "cifar100"),
        (SourceSpec("official", "svhn_mat",
                    {"train": ("train_32x32.mat",), "test": ("test_32x32.mat",),
                     "extra": ("extra_32x32.mat",)}),
         SourceSpec("arrays", "npz", _NPZ_FILES)),
        "SVHN cropped digits (label 10 -> 0, as TFDS)"),
    "cifar10_corrupted": DatasetInfo(
        "cifar10_corrupted", 10, (32, 32, 3), {"test": 10000}, 0.0, (),
        (SourceSpec("official", "cifar10c_tar", {"test": ("CIFAR-10-C.tar",)}),),
        "CIFAR-10-C (Hendrycks & Dietterich): 19 corruptions x 5 severities of the CIFAR-10 "
        "test split; load with load_corrupted(corruption, severity)"),
}

# Your own data by name (gedl_jax.data.own): one .npz file, a prepared TFDS dataset, a folder
# of image files.
NPZ_PREFIX, TFDS_PREFIX, IMAGES_PREFIX = "npz:", "tfds:", "images:"
OWN_DATA_PREFIXES = (NPZ_PREFIX, TFDS_PREFIX, IMAGES_PREFIX)

# Held-out fraction of your own data's training set where it brings no validation split
# (`npz:<path>`, `tfds:<name>`, `images:<folder>` without val/): the MNIST family's.
OWN_DATA_VAL_FRACTION = 0.2

# TFDS config name -> file stem in CIFAR-10-C.tar (tensorflow_datasets cifar10_corrupted.py).
CORRUPTION_FILES: dict[str, str] = {
    "gaussian_noise": "gaussian_noise", "shot_noise": "shot_noise",
    "impulse_noise": "impulse_noise", "defocus_blur": "defocus_blur",
    "frosted_glass_blur": "glass_blur", "motion_blur": "motion_blur", "zoom_blur": "zoom_blur",
    "snow": "snow", "frost": "frost", "fog": "fog", "brightness": "brightness",
    "contrast": "contrast", "elastic": "elastic_transform", "pixelate": "pixelate",
    "jpeg_compression": "jpeg_compression", "gaussian_blur": "gaussian_blur",
    "saturate": "saturate", "spatter": "spatter", "speckle_noise": "speckle_noise",
}
# The 15 benchmark corruptions (TFDS names), in TFDS's order; the last 4 of the 19 are "extra".
CORRUPTIONS: tuple[str, ...] = (
    "gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "frosted_glass_blur",
    "motion_blur", "zoom_blur", "snow", "frost", "fog", "brightness", "contrast", "elastic",
    "pixelate", "jpeg_compression")
EXTRA_CORRUPTIONS: tuple[str, ...] = ("gaussian_blur", "saturate", "spatter", "speckle_noise")
SEVERITIES: tuple[int, ...] = (1, 2, 3, 4, 5)

# Verbatim copy of tensorflow_datasets 4.9.10's registered url checksums for these datasets
# (url_checksums/<name>.txt; svhn_cropped: datasets/svhn_cropped/checksums.tsv): (url, size,
# sha256). Used only where TFDS is not installed; tests/test_data_registry.py checks it equals
# what TFDS registers.
_TFDS_CHECKSUMS_COPY: dict[str, tuple[tuple[str, int, str], ...]] = {
    "mnist": (
        ("https://storage.googleapis.com/cvdf-datasets/mnist/t10k-images-idx3-ubyte.gz",
         1648877, "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6"),
        ("https://storage.googleapis.com/cvdf-datasets/mnist/t10k-labels-idx1-ubyte.gz",
         4542, "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6"),
        ("https://storage.googleapis.com/cvdf-datasets/mnist/train-images-idx3-ubyte.gz",
         9912422, "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609"),
        ("https://storage.googleapis.com/cvdf-datasets/mnist/train-labels-idx1-ubyte.gz",
         28881, "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c"),
    ),
    "fashion_mnist": (
        ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/t10k-images-idx3-ubyte.gz",
         4422102, "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073"),
        ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/t10k-labels-idx1-ubyte.gz",
         5148, "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5"),
        ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/train-images-idx3-ubyte.gz",
         26421880, "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84"),
        ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/train-labels-idx1-ubyte.gz",
         29515, "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845"),
    ),
    "kmnist": (
        ("http://codh.rois.ac.jp/kmnist/dataset/kmnist/t10k-images-idx3-ubyte.gz",
         3041136, "edd7a857845ad6bb1d0ba43fe7e794d164fe2dce499a1694695a792adfac43c5"),
        ("http://codh.rois.ac.jp/kmnist/dataset/kmnist/t10k-labels-idx1-ubyte.gz",
         5120, "20bb9a0ef54c7db3efc55a92eef5582c109615df22683c380526788f98e42a1c"),
        ("http://codh.rois.ac.jp/kmnist/dataset/kmnist/train-images-idx3-ubyte.gz",
         18165135, "51467d22d8cc72929e2a028a0428f2086b092bb31cfb79c69cc0a90ce135fde4"),
        ("http://codh.rois.ac.jp/kmnist/dataset/kmnist/train-labels-idx1-ubyte.gz",
         29497, "e38f9ebcd0f3ebcdec7fc8eabdcdaef93bb0df8ea12bee65224341c8183d8e17"),
    ),
    "cifar10": (
        ("https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz",
         170052171, "c4a38c50a1bc5f3a1c5537f2155ab9d68f9f25eb1ed8d9ddda3db29a59bca1dd"),
    ),
    "cifar100": (
        ("https://www.cs.toronto.edu/~kriz/cifar-100-binary.tar.gz",
         168513733, "58a81ae192c23a4be8b1804d68e518ed807d710a4eb253b1f2a199162a40d8ec"),
    ),
    "svhn_cropped": (
        ("http://ufldl.stanford.edu/housenumbers/extra_32x32.mat",
         1329278602, "a133a4beb38a00fcdda90c9489e0c04f900b660ce8a316a5e854838379a71eb3"),
        ("http://ufldl.stanford.edu/housenumbers/test_32x32.mat",
         64275384, "cdce80dfb2a2c4c6160906d0bd7c68ec5a99d7ca4831afa54f09182025b6a75b"),
        ("http://ufldl.stanford.edu/housenumbers/train_32x32.mat",
         182040794, "435e94d69a87fde4fd4d7f3dd208dfc32cb6ae8af2240d066de1df7508d083b8"),
    ),
    "cifar10_corrupted": (
        ("https://zenodo.org/record/2535967/files/CIFAR-10-C.tar",
         2918471680, "c72763e101c723b7c507b96205f7e938912a5d587376173b825850cf3cb876a7"),
    ),
}

# Sources the project itself registers (not TFDS): lossless decoded arrays with known checksums.
_PROJECT_CHECKSUMS: dict[tuple[str, str], tuple[FileSpec, ...]] = {
    ("cifar10", "arrays"): (
        FileSpec("train.npz", 140708691,
                 "05a9bf3fd111dda8b5f2acb52dd9f969125e37c9e22bedd9060e5caee8a86d70",
                 registered_by="gedl_jax"),
        FileSpec("test.npz", 28178803,
                 "54703a73ece79f2cfe386002680aa45f422c42bf56d1df143957416515d8e374",
                 registered_by="gedl_jax"),
    ),
}

_OVERRIDES: dict[tuple[str, str], dict[str, FileSpec]] = {}


def get_info(name: str) -> DatasetInfo:
    """The registry entry of `name`, or a DataError listing the known names."""
    try:
        return DATASETS[name]
    except KeyError:
        derived = (f", derived OOD sets (load_ood only): {sorted(DERIVED_OOD)}"
                   if name not in DERIVED_OOD else
                   f"; {name!r} is a derived OOD set: load it with load_ood")
        raise DataError(f"unknown dataset {name!r}; known datasets: {sorted(DATASETS)}{derived} "
                        "(an extra OOD set can also be a folder of MNIST-format IDX files, "
                        "see load_ood)") from None


def _copied_specs(name: str, registered_by: str) -> dict[str, FileSpec]:
    """FileSpecs from the copy of TFDS's registration (the file name is the URL's basename)."""
    out = {}
    for url, size, sha in _TFDS_CHECKSUMS_COPY[name]:
        filename = url.rsplit("/", 1)[-1]
        out[filename] = FileSpec(filename, size, sha, url, registered_by)
    return out


@functools.cache
def tfds_registered_files(name: str) -> dict[str, FileSpec] | None:
    """The files TFDS registers for `name` (`tfds.builder_cls(name).url_infos`), or None where
    tensorflow_datasets is not importable or does not register url checksums for `name`."""
    try:
        import tensorflow_datasets as tfds  # optional, slow import
    except Exception:  # noqa: BLE001  (not installed, or broken: fall back to the copy)
        return None
    try:
        infos = tfds.builder_cls(name).url_infos
    except Exception as e:  # noqa: BLE001
        log.warning("tensorflow_datasets has no url checksums for %r (%s); using gedl_jax's copy",
                    name, e)
        return None
    if not infos:
        return None
    version = getattr(tfds, "__version__", "?")
    out = {}
    for url, info in infos.items():
        filename = getattr(info, "filename", None) or url.rsplit("/", 1)[-1]
        out[filename] = FileSpec(filename, int(info.size), str(info.checksum), url,
                                 f"tensorflow_datasets {version}")
    return out


def registered_files(name: str, kind: str = "official") -> dict[str, FileSpec]:
    """filename -> FileSpec for the files of `name`'s source `kind` that have registered
    checksums. Empty for an unregistered source (its files are then read unverified)."""
    if (name, kind) in _OVERRIDES:
        return dict(_OVERRIDES[(name, kind)])
    if kind == "official":
        specs = tfds_registered_files(name)
        if specs is None and name in _TFDS_CHECKSUMS_COPY:
            specs = _copied_specs(name, "tensorflow_datasets 4.9.10 (gedl_jax copy)")
        if specs is None:
            raise DataError(f"no registered checksums for the official files of {name!r}: "
                            "install tensorflow-datasets (>=4.9.10) or use the decoded arrays")
        return dict(specs)
    return {s.filename: s for s in _PROJECT_CHECKSUMS.get((name, kind), ())}


@contextlib.contextmanager
def override_file_specs(name: str, kind: str, specs: Mapping[str, FileSpec]) -> Iterator[None]:
    """Temporarily register `specs` (filename -> FileSpec) for `name`'s source `kind`.

    For tests that write small files in the official formats, and for a private mirror whose
    files legitimately differ; never needed for the official files themselves."""
    key = (name, kind)
    previous = _OVERRIDES.get(key)
    _OVERRIDES[key] = dict(specs)
    try:
        yield
    finally:
        if previous is None:
            _OVERRIDES.pop(key, None)
        else:
            _OVERRIDES[key] = previous


def dataset_family(name: str) -> str | None:
    """The family of a registered dataset (`DatasetInfo.family`); None for your own data.

    >>> dataset_family("fashion_mnist"), dataset_family("cifar100"), dataset_family("npz:x.npz")
    ('mnist', 'cifar', None)
    """
    return DATASETS[name].family if name in DATASETS else None


def default_ood_sets(name: str) -> tuple[str, ...]:
    """The OOD test sets of the protocol for in-distribution dataset `name` (the R-EDL code's,
    github.com/MengyuanChen21/ICLR2024-REDL, code_classical/configs/): mnist -> (kmnist,
    fashion_mnist); cifar10 -> (svhn_cropped, cifar100); always their test splits."""
    return get_info(name).default_ood


# ------------------------------------------------------------- derived OOD sets, near / far
@dataclasses.dataclass(frozen=True)
class DerivedSpec:
    """An OOD set derived deterministically from the test split of a registered dataset
    (gedl_jax.data.derived): no files of its own, only its source's verified files."""

    name: str
    source: str                       # the registered dataset whose test split is converted
    transform: str                    # "gray28" or "rgb32" (derived.TRANSFORMS)
    image_shape: tuple[int, int, int]
    description: str = ""
    split: str = "test"


DERIVED_OOD: dict[str, DerivedSpec] = {
    "cifar10_gray28": DerivedSpec(
        "cifar10_gray28", "cifar10", "gray28", (28, 28, 1),
        "CIFAR-10 test as 28x28 grayscale (BT.601 luma, exact area averaging): far OOD for the "
        "MNIST family"),
    "mnist_rgb32": DerivedSpec(
        "mnist_rgb32", "mnist", "rgb32", (32, 32, 3),
        "MNIST test zero-padded to 32x32, gray copied to RGB: far OOD for CIFAR-10"),
    "fashion_mnist_rgb32": DerivedSpec(
        "fashion_mnist_rgb32", "fashion_mnist", "rgb32", (32, 32, 3),
        "Fashion-MNIST test zero-padded to 32x32, gray copied to RGB: far OOD for CIFAR-10"),
}

# Near / far OOD sets per in-distribution dataset. The split follows OpenOOD v1.5 (Zhang et al.,
# 2023; configs/datasets/*/..._ood.yml) restricted to what we load: for MNIST it lists NotMNIST and
# Fashion-MNIST as near (grayscale 28x28 glyph / object images; KMNIST, cursive characters in the
# same format, plays NotMNIST's role here) and Textures, CIFAR-10, TinyImageNet, Places365 as far
# (natural colour images); for CIFAR-10 it lists CIFAR-100 and TinyImageNet as near (natural
# images of similar objects) and MNIST, SVHN, Textures, Places365 as far. Fashion-MNIST is far for
# CIFAR-10 for the same reason as MNIST (grayscale, centred single items on a black background).
OOD_GROUPS: dict[str, dict[str, tuple[str, ...]]] = {
    "mnist": {"near": ("kmnist", "fashion_mnist"), "far": ("cifar10_gray28",)},
    "cifar10": {"near": ("cifar100",),
                "far": ("svhn_cropped", "mnist_rgb32", "fashion_mnist_rgb32")},
}


def is_ood_name(name: str) -> bool:
    """Whether `name` is an OOD set `load_ood` knows by name (registered or derived)."""
    return name in DATASETS or name in DERIVED_OOD


def source_split(name: str, split: str = "test") -> tuple[str, str]:
    """The registered (dataset, split) whose files `name`'s `split` is read from: itself for a
    registered dataset, its source's test split for a derived OOD set."""
    if name in DERIVED_OOD:
        if split != "test":
            raise DataError(f"{name} is a derived OOD set with only a test split, not {split!r}")
        spec = DERIVED_OOD[name]
        return spec.source, spec.split
    get_info(name)
    return name, split


# The groups an OOD set can be declared in (OOD_GROUPS' keys, `config.ood_groups`' GROUP).
OOD_GROUP_NAMES: tuple[str, ...] = ("near", "far")


def ood_identity(name: str) -> str:
    """The set an OOD name stands for, to tell two spellings of one set from two sets: a
    registered or derived dataset and `tfds:<name>` as written; an `npz:` file, an `images:`
    folder and an IDX folder by their real path (`npz:a.npz` and `npz:x/../a.npz` are one set,
    and so are a folder and a link to it)."""
    name = str(name)
    if name in DATASETS or name in DERIVED_OOD or name.startswith(TFDS_PREFIX):
        return name
    prefix = next((p for p in (NPZ_PREFIX, IMAGES_PREFIX) if name.startswith(p)), "")
    return prefix + os.path.realpath(os.path.expanduser(name[len(prefix):]))


def parse_ood_groups(entries) -> dict[str, str]:
    """{OOD set: group} of `config.ood_groups`' "GROUP=SET" entries (GROUP one of
    OOD_GROUP_NAMES; SET an OOD set as the config names it, e.g. "far=images:/data/textures").
    Raises ValueError naming the entry for a malformed one or a set declared twice.

    >>> parse_ood_groups(("far=images:/data/textures", "near=npz:cifar100_like.npz"))
    {'images:/data/textures': 'far', 'npz:cifar100_like.npz': 'near'}
    """
    groups: dict[str, str] = {}
    for entry in entries:
        group, sep, name = str(entry).partition("=")
        group, name = group.strip(), name.strip()
        if not sep or group not in OOD_GROUP_NAMES or not name:
            raise ValueError(f"OOD group {entry!r}: expected GROUP=SET with GROUP one of "
                             f"{', '.join(OOD_GROUP_NAMES)}, e.g. 'far=images:/data/textures'")
        if groups.get(name, group) != group:
            raise ValueError(f"OOD set {name!r} is declared both {groups[name]!r} and "
                             f"{group!r}: declare it once")
        groups[name] = group
    return groups


def ood_group(id_dataset: str, ood_name: str, declared: Mapping[str, str] | None = None
              ) -> str | None:
    """"near" or "far" for OOD set `ood_name` with `id_dataset` in distribution: its group in
    `declared` (`parse_ood_groups` of `config.ood_groups`, which wins), else in OOD_GROUPS;
    None where neither declares one (an undeclared pair, or a user's set left undeclared).

    >>> ood_group("mnist", "fashion_mnist"), ood_group("cifar10", "mnist_rgb32")
    ('near', 'far')
    >>> ood_group("cifar10", "images:textures", {"images:textures": "far"})
    'far'
    """
    if declared and ood_name in declared:
        return declared[ood_name]
    for group, names in OOD_GROUPS.get(id_dataset, {}).items():
        if ood_name in names:
            return group
    return None


def check_ood_groups(entries, ood_names) -> dict[str, str]:
    """`entries` ("GROUP=SET", a config's `ood_groups`) parsed (`parse_ood_groups`), every set
    they group checked to be among `ood_names`, the OOD sets evaluated (a training run's:
    config.ood_datasets and config.extra_ood; an evaluation's: those and its --extra_ood sets): a
    misspelt set would otherwise end in no group, silently. ValueError names the field.

    >>> check_ood_groups(("far=a.npz",), ["a.npz", "kmnist"])
    {'a.npz': 'far'}
    """
    try:
        declared = parse_ood_groups(entries)
    except ValueError as e:
        raise ValueError(f"config.ood_groups: {e}") from None
    missing = [name for name in declared if name not in ood_names]
    if missing:
        raise ValueError(f"config.ood_groups groups {', '.join(map(repr, missing))}, not among "
                         f"the OOD sets evaluated ({', '.join(map(repr, ood_names)) or 'none'}):"
                         f" name each set as config.ood_datasets, config.extra_ood or "
                         f"evaluate --extra_ood does")
    return declared


def add_ood_groups(entries, added) -> tuple[str, ...]:
    """`entries` ("GROUP=SET") with the entries `added` (`evaluate --ood_groups`): an added
    set's group replaces the one `entries` gave it.

    >>> add_ood_groups(("near=a.npz",), ("far=a.npz", "far=b"))
    ('far=a.npz', 'far=b')
    """
    merged = {**parse_ood_groups(entries), **parse_ood_groups(added)}
    return tuple(f"{group}={name}" for name, group in merged.items())


def ood_sets_by_group(id_dataset: str) -> dict[str, tuple[str, ...]]:
    """{"near": (...), "far": (...)} of `id_dataset`; empty where none is declared."""
    return dict(OOD_GROUPS.get(id_dataset, {}))


def corruption_file_stem(corruption: str) -> str:
    """TFDS corruption name (or the release's file stem) -> file stem in CIFAR-10-C."""
    if corruption in CORRUPTION_FILES:
        return CORRUPTION_FILES[corruption]
    if corruption in CORRUPTION_FILES.values():
        return corruption
    raise DataError(f"unknown CIFAR-10-C corruption {corruption!r}; known: "
                    f"{sorted(CORRUPTION_FILES)}")
