"""One entry point per kind of set: `load_split`, `load_ood`, `load_corrupted`.

Sources, in the order `source="auto"` tries them:
1. raw files in the data folder, `<data_dir>/<dataset>/<official file names>` (the official archives
   TFDS registers, else decoded arrays `train.npz`/`test.npz`): size + sha256 verified, decoded by
   our readers (the same decoding TFDS does), cached as uint8 arrays;
2. a cache entry decoded earlier from registered files (so a machine with only the cache, e.g. a
   GPU machine without TensorFlow/TFDS, still loads);
3. a dataset prepared by TFDS (`tfds.data_source`, ArrayRecord; no TensorFlow needed);
otherwise, with `download="auto"` (the default; "never" or $GEDL_OFFLINE=1 turn it off), the
official files are fetched into the data folder, verified
(`gedl_jax.data.download`), and read as in 1;
with downloads off, a MissingDataError names every missing file, its size and URL, and the ways out.
`source="raw"` stops after 2, `source="tfds"` uses only 3.

`ensure_available` is the pre-flight of a run: it checks every (dataset, split) the run needs,
fetches what is missing in one go (or names all of it in one error), before any training.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from gedl_jax.data import cache as cache_lib
from gedl_jax.data import download as download_lib
from gedl_jax.data import readers, tfds_source
from gedl_jax.data.arrays import Split, check_arrays
from gedl_jax.data.errors import CorruptDataError, DataError, MissingDataError
from gedl_jax.data.locations import ENV_DATA_DIR, data_dir_origin, resolve_data_dir
from gedl_jax.data.registry import (
    CORRUPTION_FILES,
    DATASETS,
    DatasetInfo,
    SourceSpec,
    corruption_file_stem,
    get_info,
    registered_files,
)

log = logging.getLogger(__name__)

SOURCES = ("auto", "raw", "tfds")
PathLike = str | os.PathLike
__all__ = ["ENV_DATA_DIR", "SOURCES", "ensure_available", "load_corrupted", "load_ood",
           "load_split", "read_idx_folder", "resolve_data_dir"]


def _data_root(data_dir: PathLike | None) -> tuple[Path | None, str]:
    """The data folder, or None (and why) if it does not exist yet: the cache, TFDS or a
    download (which creates it) may still serve."""
    path, origin = data_dir_origin(data_dir)
    if path.is_dir():
        return path, ""
    if origin == "default":
        return None, (f"no data folder given (data_dir or ${ENV_DATA_DIR}), and the default "
                      f"{path} does not exist yet")
    return None, f"the data folder {path} (from {origin}) does not exist"


def _check_source(source: str) -> None:
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}")


# ------------------------------------------------------------------------------ raw files
def _decode(info: DatasetInfo, src: SourceSpec, folder: Path, split: str,
            cache_root: Path, shas: dict[str, str]) -> tuple[np.ndarray, np.ndarray]:
    files = [folder / f for f in src.split_files[split]]
    if src.format == "idx":
        return readers.read_idx_pair(files[0], files[1])
    if src.format == "npz":
        return readers.read_arrays_npz(files[0])
    if src.format == "svhn_mat":
        return readers.read_svhn_mat(files[0])
    if src.format in ("cifar10_binary", "cifar100_binary"):
        variant = src.format.split("_")[0]
        out = None
        # One archive holds both splits: decode both in one pass, cache the other on the way.
        for s, (images, labels) in readers.read_cifar_binary_tar_all(files[0], variant).items():
            check_arrays(images, labels, f"{files[0]} ({s})", info.image_shape, info.num_classes)
            if s == split:
                out = images, labels
            else:
                other = [(f, shas[f]) for f in src.split_files[s]]
                path = cache_lib.entry_path(cache_root, info.name, s, src.kind, other)
                if not path.is_file():
                    cache_lib.save_entry(path, images, labels,
                                         _meta(info.name, s, src.kind, other, folder))
        assert out is not None
        return out
    raise DataError(f"no reader for format {src.format!r}")


def _meta(dataset: str, split: str, kind: str, files: list[tuple[str, str]],
          folder: Path | None) -> dict[str, Any]:
    return {"dataset": dataset, "split": split, "source": kind,
            "files": [{"name": f, "sha256": s} for f, s in files],
            "folder": str(folder) if folder else ""}


def _from_raw(info: DatasetInfo, split: str, src: SourceSpec, folder: Path,
              cache_root: Path) -> Split:
    specs = registered_files(info.name, src.kind)
    names = src.split_files[split]
    unverified = [f for f in names if f not in specs]
    if unverified:
        log.warning("%s: %s not checksum-verified (no registered checksum for %s source files); "
                    "their shapes and labels are still checked", info.name,
                    ", ".join(str(folder / f) for f in unverified), src.kind)
    shas = {f: cache_lib.verify_file(folder / f, specs.get(f), cache_root) for f in names}
    files = [(f, shas[f]) for f in names]
    path = cache_lib.entry_path(cache_root, info.name, split, src.kind, files)

    def decode() -> tuple[np.ndarray, np.ndarray]:
        images, labels = _decode(info, src, folder, split, cache_root, shas)
        check_arrays(images, labels, f"{info.name} {split} from {folder}", info.image_shape,
                     info.num_classes)
        return images, labels

    images, labels, hit = cache_lib.cached(path, decode, _meta(info.name, split, src.kind, files,
                                                                 folder))
    return Split(images, labels, f"{info.name}/{split}", src.kind + ("+cache" if hit else ""))


def _from_cache_only(info: DatasetInfo, split: str, cache_root: Path) -> Split | None:
    """A cache entry decoded earlier from *registered* files, when those files are not here."""
    for src in info.sources:
        names = src.split_files.get(split)
        try:
            specs = registered_files(info.name, src.kind)
        except DataError:
            continue
        if not names or any(f not in specs for f in names):
            continue
        path = cache_lib.entry_path(cache_root, info.name, split, src.kind,
                                    [(f, specs[f].sha256) for f in names])
        try:
            hit = cache_lib.load_entry(path)
        except CorruptDataError as e:
            raise CorruptDataError(f"{e}. The source files are not in the data folder, so it "
                                   "cannot be rebuilt: delete it and give the data folder."
                                   ) from None
        if hit is not None:
            images, labels, _ = hit
            check_arrays(images, labels, str(path), info.image_shape, info.num_classes)
            log.info("%s/%s: source files absent, using the verified cache entry %s", info.name,
                     split, path)
            return Split(images, labels, f"{info.name}/{split}", f"{src.kind}+cache")
    return None


# ----------------------------------------------------------------------------------- TFDS
def _from_tfds(info: DatasetInfo, split: str, cache_root: Path, tfds_data_dir: PathLike | None,
               tfds_name: str | None = None, name: str | None = None) -> Split:
    tfds_name = tfds_name or info.name
    name = name or f"{info.name}/{split}"
    files = tfds_source.prepared_files(tfds_name, split, tfds_data_dir)
    if files:  # key the cache on the prepared files' identity
        ids = [(f.name, f"{f.stat().st_size}:{f.stat().st_mtime_ns}") for f in files]
        path = cache_lib.entry_path(cache_root, info.name, name.split("/", 1)[1], "tfds", ids)
        images, labels, hit = cache_lib.cached(
            path, lambda: tfds_source.read_tfds(tfds_name, split, tfds_data_dir),
            _meta(info.name, split, "tfds", ids, None))
    else:  # nothing to key a cache entry on (e.g. tfds.testing.mock_data): read directly
        images, labels = tfds_source.read_tfds(tfds_name, split, tfds_data_dir)
        hit = False
    check_arrays(images, labels, f"TFDS {tfds_name} {split}", info.image_shape, info.num_classes)
    return Split(images, labels, name, "tfds" + ("+cache" if hit else ""))


def _raw_attempts(info: DatasetInfo, split: str, root: Path | None
                  ) -> tuple[SourceSpec | None, list[tuple[SourceSpec, list[str]]]]:
    """The first source with all of `split`'s files in the folder, and the others' missing files."""
    attempts: list[tuple[SourceSpec, list[str]]] = []
    if root is None:
        return None, attempts
    folder = root / info.folder
    for src in info.sources:
        names = src.split_files.get(split)
        if not names:
            continue
        missing = [f for f in names if not (folder / f).is_file()]
        if not missing:
            return src, attempts
        attempts.append((src, missing))
    return None, attempts


def _check_split(info: DatasetInfo, split: str) -> None:
    if split not in info.num_examples:
        raise DataError(f"{info.name} has splits {list(info.num_examples)}, not {split!r} (the "
                        "validation split is carved from train by load_train_val_test)")


def _fetch(info: DatasetInfo, split: str, data_dir: PathLike | None, mirror: str | None,
           cache_dir: PathLike | None, force: bool) -> Path:
    """Download `split`'s files into the data folder (created if it is the default); its root."""
    root = resolve_data_dir(data_dir, create=True)
    download_lib.fetch_split(info.name, split, root, mirror=download_lib.mirror_location(mirror),
                         force=force, cache_dir=cache_dir)
    return root


# ------------------------------------------------------------------------------ public API
def load_split(name: str, split: str = "train", data_dir: PathLike | None = None,
               cache_dir: PathLike | None = None, source: str = "auto",
               tfds_data_dir: PathLike | None = None, *, download: str | None = "auto",
               mirror: str | None = None) -> Split:
    """An official split ("train" / "test"; SVHN also "extra") of a registered dataset, decoded
    to uint8 arrays. For cifar10_corrupted, split is "<corruption>_<severity>" (e.g. "fog_3").

    data_dir: the data folder (else $GEDL_DATA_DIR, else ~/.cache/gedl_jax/data); cache_dir: the
    decoded-array cache (else $GEDL_CACHE_DIR, else ~/.cache/gedl_jax); source: "auto", "raw" or
    "tfds" (module docstring); tfds_data_dir: where TFDS keeps prepared datasets (else TFDS's
    default); download: "auto" fetches missing official files (verified), "never" does not,
    "force" fetches again ($GEDL_OFFLINE=1 means "never"); mirror: a base URL or folder laid out
    as <mirror>/<dataset>/<file> to fetch from instead of the official URLs (else
    $GEDL_DATA_MIRROR)."""
    _check_source(source)
    info = get_info(name)
    if info.name == "cifar10_corrupted" and split != "test":
        corruption, _, severity = split.rpartition("_")
        if corruption and severity.isdigit():
            return load_corrupted(corruption, int(severity), data_dir, cache_dir, source,
                                  tfds_data_dir)
    if info.name == "cifar10_corrupted":
        raise DataError("cifar10_corrupted has one test set per corruption and severity: use "
                        "load_corrupted(corruption, severity) or split='<corruption>_<severity>'")
    _check_split(info, split)
    cache_root = cache_lib.resolve_cache_dir(cache_dir)
    if source == "tfds":
        return _from_tfds(info, split, cache_root, tfds_data_dir)
    mode = download_lib.download_mode(download)
    root, root_note = _data_root(data_dir)
    if mode == "force":
        root = _fetch(info, split, data_dir, mirror, cache_dir, force=True)
    src, _ = _raw_attempts(info, split, root)
    if src is not None:
        return _from_raw(info, split, src, root / info.folder, cache_root)
    cached = _from_cache_only(info, split, cache_root)
    if cached is not None:
        return cached
    if source == "auto" and tfds_source.is_prepared(info.name, tfds_data_dir):
        return _from_tfds(info, split, cache_root, tfds_data_dir)
    if mode == "auto":
        root = _fetch(info, split, data_dir, mirror, cache_dir, force=False)
        src, _ = _raw_attempts(info, split, root)
        if src is not None:
            return _from_raw(info, split, src, root / info.folder, cache_root)
    shown_root = root if root is not None else data_dir_origin(data_dir)[0]
    note = f"{root_note}.\n" if root is None else ""
    tfds_note = (f"\nNo prepared TFDS dataset {info.name!r} was found either "
                 f"({tfds_data_dir or 'default TFDS data dir'})." if source == "auto" else "")
    raise MissingDataError(f"{info.name} {split!r} split: no usable source found.\n{note}"
                           + download_lib.missing_files_message([(info.name, split)], shown_root,
                                                         download_lib.mirror_location(mirror), mode)
                           + tfds_note)


def _available_offline(info: DatasetInfo, split: str, root: Path | None, cache_root: Path,
                       source: str, tfds_data_dir: PathLike | None) -> bool:
    """Whether `split` loads without the network: raw files, a verified cache entry, or TFDS."""
    if source == "tfds":
        return tfds_source.is_prepared(info.name, tfds_data_dir)
    if _raw_attempts(info, split, root)[0] is not None:
        return True
    try:
        if _from_cache_only(info, split, cache_root) is not None:
            return True
    except CorruptDataError:
        return False
    return source == "auto" and tfds_source.is_prepared(info.name, tfds_data_dir)


def ensure_available(wanted: list[tuple[str, str]], data_dir: PathLike | None = None,
                     cache_dir: PathLike | None = None, source: str = "auto",
                     tfds_data_dir: PathLike | None = None, *, download: str | None = "auto",
                     mirror: str | None = None) -> None:
    """Pre-flight of a run: make every (dataset, split) of `wanted` loadable before any work.

    What loads offline (raw files, cache, prepared TFDS) is left alone; the rest is fetched in
    one go (`download="auto"`), or named in one MissingDataError (`"never"`, $GEDL_OFFLINE=1):
    every missing file with its size and URL, and the ways out. `download="force"` fetches every
    raw file again. With `source="tfds"`, a dataset TFDS has not prepared is prepared from the
    official files (fetched first when allowed) with the data folder as TFDS's manual_dir, which
    needs TensorFlow (extra `tfds-prepare`)."""
    _check_source(source)
    for name, split in wanted:
        _check_split(get_info(name), split)
    mode = download_lib.download_mode(download)
    mirror = download_lib.mirror_location(mirror)
    cache_root = cache_lib.resolve_cache_dir(cache_dir)
    folder, origin = data_dir_origin(data_dir)
    root = folder if folder.is_dir() else None  # created below if something must be fetched
    if source == "tfds":
        return _ensure_tfds(wanted, data_dir, cache_dir, tfds_data_dir, mode, mirror)
    if mode == "force":
        download_lib.ensure_files(wanted, resolve_data_dir(data_dir, create=True), download=mode,
                           mirror=mirror, cache_dir=cache_dir)
        return None
    missing = [(n, s) for n, s in wanted
               if not _available_offline(get_info(n), s, root, cache_root, source, tfds_data_dir)]
    if not missing:
        return None
    if mode == "never":
        absent = "" if root is not None else f"The data folder {folder} (from {origin}) does " \
                                             "not exist.\n"
        raise MissingDataError(absent + download_lib.missing_files_message(missing, folder,
                                                                            mirror, mode))
    download_lib.ensure_files(missing, resolve_data_dir(data_dir, create=True), download=mode,
                       mirror=mirror, cache_dir=cache_dir)
    return None


def _ensure_tfds(wanted: list[tuple[str, str]], data_dir: PathLike | None,
                 cache_dir: PathLike | None, tfds_data_dir: PathLike | None, mode: str,
                 mirror: str | None) -> None:
    """TFDS prepares a whole builder from *every* registered file (for svhn_cropped that includes
    the 1.3 GB extra split; for kmnist the training images), so those are what is fetched."""
    names = [n for n in dict.fromkeys(n for n, _ in wanted)
             if not tfds_source.is_prepared(n, tfds_data_dir)]
    if not names:
        return
    every = [(n, s) for n in names for s in get_info(n).splits]
    folder, _ = data_dir_origin(data_dir)
    if mode == "never":
        missing = [(n, s) for n, s in every if not download_lib.split_present(folder, n, s)]
        if missing:
            raise MissingDataError(
                f"TFDS has not prepared {names} in {tfds_data_dir or 'its default data dir'}, and "
                "preparing needs the official files:\n"
                + download_lib.missing_files_message(missing, folder, mirror, mode))
    else:
        download_lib.ensure_files(every, resolve_data_dir(data_dir, create=True), download=mode,
                           mirror=mirror, cache_dir=cache_dir)
    for n in names:
        tfds_source.prepare_tfds(n, data_dir, tfds_data_dir, cache_dir=cache_dir)


IDX_TEST_NAMES = (
    ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
    ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
    ("t10k-images.idx3-ubyte", "t10k-labels.idx1-ubyte"),
)


def read_idx_folder(folder: PathLike, name: str | None = None) -> Split:
    """A folder of MNIST-format IDX test files (t10k-images-idx3-ubyte.gz +
    t10k-labels-idx1-ubyte.gz, compressed or not) as a Split. Not checksum-verified (there is no
    registry entry); shapes and label/image counts are checked."""
    folder = Path(folder).expanduser()
    for images_name, labels_name in IDX_TEST_NAMES:
        if (folder / images_name).is_file() and (folder / labels_name).is_file():
            images, labels = readers.read_idx_pair(folder / images_name, folder / labels_name)
            if len(labels) and labels.min() < 0:
                raise CorruptDataError(f"{folder / labels_name}: negative labels")
            return Split(images, labels, name or f"{folder.name}/test", "idx_folder")
    raise MissingDataError(
        f"{folder}: no MNIST-format IDX test files; expected {IDX_TEST_NAMES[0][0]} and "
        f"{IDX_TEST_NAMES[0][1]} (or the same names uncompressed) in that folder")


def load_ood(name_or_path: PathLike, data_dir: PathLike | None = None,
             cache_dir: PathLike | None = None, source: str = "auto",
             tfds_data_dir: PathLike | None = None, *, download: str | None = "auto",
             mirror: str | None = None) -> Split:
    """An OOD set: the official *test* split of a registered dataset (only its test files need be
    present or fetched, e.g. kmnist's two t10k files), or a folder of MNIST-format IDX test
    files."""
    if isinstance(name_or_path, str) and name_or_path in DATASETS:
        return load_split(name_or_path, "test", data_dir, cache_dir, source, tfds_data_dir,
                          download=download, mirror=mirror)
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return read_idx_folder(path)
    raise MissingDataError(
        f"OOD set {str(name_or_path)!r} is neither a registered dataset ({sorted(DATASETS)}) nor "
        "an existing folder of MNIST-format IDX files (t10k-images-idx3-ubyte.gz + "
        "t10k-labels-idx1-ubyte.gz)")


def _tfds_corruption_name(corruption: str) -> str:
    stem = corruption_file_stem(corruption)
    return next(k for k, v in CORRUPTION_FILES.items() if v == stem)


def load_corrupted(corruption: str, severity: int, data_dir: PathLike | None = None,
                   cache_dir: PathLike | None = None, source: str = "auto",
                   tfds_data_dir: PathLike | None = None) -> Split:
    """CIFAR-10-C: the CIFAR-10 test split under `corruption` (TFDS name, e.g. "fog",
    "frosted_glass_blur", or the release's file stem, e.g. "glass_blur") at `severity` 1..5.

    Raw sources in `<data_dir>/cifar10_corrupted/`: the official `CIFAR-10-C.tar` (sha256 verified
    against TFDS's registration; once per file thanks to the verified-file record), or its
    extracted `.npy` files (directly or under `CIFAR-10-C/`; TFDS registers only the tar, so those
    are checked for shape only). All 5 severities are cached on first use of a corruption."""
    _check_source(source)
    if int(severity) not in (1, 2, 3, 4, 5):
        raise ValueError(f"severity must be 1..5, got {severity}")
    severity = int(severity)
    info = DATASETS["cifar10_corrupted"]
    stem = corruption_file_stem(corruption)
    tname = _tfds_corruption_name(corruption)
    split_name = f"{tname}_{severity}"
    name = f"cifar10_corrupted/{split_name}"
    cache_root = cache_lib.resolve_cache_dir(cache_dir)
    if source == "tfds":
        return _from_tfds(info, "test", cache_root, tfds_data_dir,
                          f"cifar10_corrupted/{split_name}", name)
    root, root_note = _data_root(data_dir)
    specs = registered_files(info.name, "official")
    tar_spec = specs.get("CIFAR-10-C.tar")

    def split_key(sev: int, files: list[tuple[str, str]]) -> Path:
        return cache_lib.entry_path(cache_root, info.name, f"{tname}_{sev}", "official", files)

    def from_source(src: Path, files: list[tuple[str, str]], kind: str) -> Split:
        path = split_key(severity, files)
        try:
            hit = cache_lib.load_entry(path)
        except CorruptDataError as e:
            log.warning("%s; rebuilding it", e)
            hit = None
        if hit is not None:
            return Split(hit[0], hit[1], name, kind + "+cache")
        images5, labels = readers.read_cifar10c_all(src, stem)
        for sev in range(1, 6):
            check_arrays(images5[sev - 1], labels, f"{src} {stem} severity {sev}", (32, 32, 3), 10)
            cache_lib.save_entry(split_key(sev, files), images5[sev - 1], labels,
                                 _meta(info.name, f"{tname}_{sev}", kind, files, src.parent))
        return Split(np.ascontiguousarray(images5[severity - 1]), labels, name, kind)

    missing_note = ""
    if root is not None:
        folder = root / info.folder
        tar = folder / "CIFAR-10-C.tar"
        if tar.is_file():
            sha = cache_lib.verify_file(tar, tar_spec, cache_root)
            return from_source(tar, [("CIFAR-10-C.tar", sha)], "official")
        for sub in (folder / "CIFAR-10-C", folder):
            npy, lab = sub / f"{stem}.npy", sub / "labels.npy"
            if npy.is_file() and lab.is_file():
                log.warning("%s: extracted CIFAR-10-C files are not checksum-verified (TFDS "
                            "registers only CIFAR-10-C.tar); shapes are checked", sub)
                files = [(f"{stem}.npy", cache_lib.verify_file(npy, None, cache_root)),
                         ("labels.npy", cache_lib.verify_file(lab, None, cache_root))]
                return from_source(sub, files, "extracted")
        missing_note = (f"  Data folder: {root}\n  missing: {tar} "
                        f"({tar_spec.size:,} bytes, official URL {tar_spec.url})" if tar_spec
                        else f"  missing: {tar}")
        missing_note += f"\n  or its extracted {stem}.npy + labels.npy in {folder}/CIFAR-10-C/"
    if tar_spec is not None:  # cache-only: an entry decoded earlier from the registered tar
        hit = cache_lib.load_entry(split_key(severity, [("CIFAR-10-C.tar", tar_spec.sha256)]))
        if hit is not None:
            return Split(hit[0], hit[1], name, "official+cache")
    if source == "auto" and tfds_source.is_prepared(f"cifar10_corrupted/{split_name}",
                                                    tfds_data_dir):
        return _from_tfds(info, "test", cache_root, tfds_data_dir,
                          f"cifar10_corrupted/{split_name}", name)
    raise MissingDataError(f"CIFAR-10-C {split_name}: no usable source found.\n"
                           f"{missing_note or '  ' + root_note + '.'}\n"
                           "  Put the official CIFAR-10-C.tar (or its extracted .npy files) in "
                           "<data_dir>/cifar10_corrupted/. No download is attempted. (Generating "
                           "the corruptions locally is not supported.)")
