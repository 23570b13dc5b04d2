"""Checksums and the decoded-array cache.

- `verify_file` checks a source file's size and sha256 against its registered FileSpec. Hashing a
  large archive on every run is slow, so a verified (path, size, mtime, ctime, inode) -> sha256
  record is kept under `<cache_dir>/verified/`; a file whose stat is unchanged is not hashed
  again. The change time is in the record because a file edited in place can be given its old
  mtime back (`touch -d`, `os.utime`, a copy with `cp -p`), but not its old ctime: any write or
  metadata change makes the next read hash it again.
- Decoded splits are cached as uncompressed `.npz` files (images uint8, labels int32, a JSON
  `meta` with the sources' checksums and the arrays' own sha256), keyed by the dataset, split,
  source kind and the sha256 of every source file. Every write goes to a temporary file in the
  same folder, then `os.replace`: a reader sees the whole entry or none. Every read re-hashes the
  arrays (about 0.1 s for CIFAR-10's 150 MB) and treats a mismatch as a corrupt entry.

Cache folder: the `cache_dir` argument (config.cache_dir), else $GEDL_CACHE_DIR, else
~/.cache/gedl_jax.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from gedl_jax import files
from gedl_jax.data.errors import ChecksumError, CorruptDataError, MissingDataError
from gedl_jax.data.registry import FileSpec

log = logging.getLogger(__name__)

CACHE_FORMAT_VERSION = 1
_CHUNK = 1 << 22


def resolve_cache_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """`cache_dir` if given (non-empty), else $GEDL_CACHE_DIR, else ~/.cache/gedl_jax."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    env = os.environ.get("GEDL_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    return Path("~/.cache/gedl_jax").expanduser()


def sha256_file(path: str | os.PathLike) -> str:
    """The SHA-256 hex digest of the file at `path`, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def sha256_array(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).data).hexdigest()


@contextlib.contextmanager
def atomic_file(final: Path, mode: str = "wb") -> Iterator[IO]:
    """A new file open in `mode` beside `final` (its folder created), renamed over `final` on
    success and removed on any error (`files.atomic_file`: a random name created exclusively,
    never through a link). Nothing half-written is ever visible under `final`'s name."""
    final.parent.mkdir(parents=True, exist_ok=True)
    with files.atomic_file(final, mode) as f:
        yield f


def _stat_key(path: Path) -> dict[str, Any]:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns,
            "inode": st.st_ino}


def _ledger_path(cache_root: Path, path: Path) -> Path:
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:24]
    return cache_root / "verified" / f"{digest}.json"


def recorded_sha256(path: Path, cache_root: Path | None) -> str | None:
    """The sha256 recorded when `path` was last verified, if its stat is unchanged since."""
    path = Path(path)
    record = _ledger_path(cache_root, path) if cache_root is not None else None
    if record is None or not record.is_file():
        return None
    try:
        entry = json.loads(record.read_text())
        if entry.get("path") == str(path.resolve()) and entry.get("stat") == _stat_key(path):
            return str(entry["sha256"])
    except (OSError, ValueError, KeyError):
        pass
    return None


def file_sha256(path: Path, cache_root: Path | None) -> str:
    """sha256 of `path`, taken from the verified-file record when its stat is unchanged."""
    return recorded_sha256(path, cache_root) or sha256_file(path)


def record_verified(path: Path, sha256: str, cache_root: Path | None) -> None:
    """Remember that `path` (as it is now) has `sha256`, so it is not hashed again (a download
    hashes while it streams, then records)."""
    if cache_root is None:
        return
    record = _ledger_path(cache_root, path)
    entry = {"path": str(path.resolve()), "stat": _stat_key(path), "sha256": sha256}
    try:
        with atomic_file(record, "w") as f:
            f.write(json.dumps(entry))
    except OSError as e:
        log.warning("could not record the verified checksum of %s in %s (%s)", path, record, e)


def verify_file(path: str | os.PathLike, spec: FileSpec | None, cache_root: Path | None) -> str:
    """Check `path` against `spec` (size first, then sha256); returns its sha256.

    spec None: an unregistered file, hashed (for the cache key) but not verified.
    Raises MissingDataError if absent, ChecksumError on a mismatch (and records nothing)."""
    path = Path(path)
    if not path.is_file():
        raise MissingDataError(f"file not found: {path}")
    if spec is not None:
        size = path.stat().st_size
        if size != spec.size:
            raise ChecksumError(_checksum_message(path, spec, f"{size:,} bytes",
                                                  f"{spec.size:,} bytes"))
    sha = file_sha256(path, cache_root)
    if spec is not None and sha != spec.sha256:
        raise ChecksumError(_checksum_message(path, spec, f"sha256 {sha}", f"sha256 {spec.sha256}"))
    record_verified(path, sha, cache_root)
    return sha


def _checksum_message(path: Path, spec: FileSpec, actual: str, expected: str) -> str:
    origin = f"\n  official file: {spec.url}" if spec.url else ""
    return (f"{path}: checksum mismatch: the file is damaged, truncated or not the official "
            f"{spec.filename}: replace it with the official file (same name) and run again\n"
            f"  expected sha256 {expected} (registered by {spec.registered_by or 'the registry'})"
            f"\n  found    sha256 {actual}{origin}")


# ----------------------------------------------------------------------------- array cache
def entry_path(cache_root: Path, dataset: str, split: str, source: str,
               files: Sequence[tuple[str, str]]) -> Path:
    """Cache file of a decoded split; `files` are (file name, sha256) of its sources."""
    key = json.dumps({"v": CACHE_FORMAT_VERSION, "dataset": dataset, "split": split,
                      "source": source, "files": sorted(files)}, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    safe_split = split.replace("/", "_")
    return cache_root / dataset / f"{safe_split}.{source}.{digest}.npz"


def load_entry(path: Path) -> tuple[np.ndarray, np.ndarray, dict[str, Any]] | None:
    """(images, labels, meta) of a cache entry, None if absent. A damaged entry (unreadable, or
    arrays whose sha256 differs from the one recorded in it) raises CorruptDataError."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            images, labels = z["images"], z["labels"]
            meta = json.loads(z["meta"].tobytes().decode())
    except Exception as e:  # noqa: BLE001
        raise CorruptDataError(f"cache entry {path} is unreadable ({type(e).__name__}: {e})"
                               ) from None
    if (meta.get("images_sha256") != sha256_array(images)
            or meta.get("labels_sha256") != sha256_array(labels)):
        raise CorruptDataError(f"cache entry {path}: arrays do not match their recorded sha256")
    return images, labels, meta


def save_entry(path: Path, images: np.ndarray, labels: np.ndarray,
               meta: dict[str, Any]) -> bool:
    """Write a cache entry atomically; False (with a warning) if the cache is not writable."""
    meta = dict(meta, format_version=CACHE_FORMAT_VERSION,
                images_sha256=sha256_array(images), labels_sha256=sha256_array(labels),
                images_shape=list(images.shape), labels_shape=list(labels.shape))
    meta_bytes = np.frombuffer(json.dumps(meta, sort_keys=True).encode(), np.uint8)
    try:
        with atomic_file(path) as f:
            np.savez(f, images=images, labels=labels, meta=meta_bytes)
    except OSError as e:
        log.warning("could not write the cache entry %s (%s); continuing without it", path, e)
        return False
    return True


def cached(path: Path, decode: Callable[[], tuple[np.ndarray, np.ndarray]],
           meta: dict[str, Any]) -> tuple[np.ndarray, np.ndarray, bool]:
    """Cache hit, or decode + save. Returns (images, labels, was_hit). A damaged entry is
    reported, removed and rebuilt from the sources."""
    try:
        hit = load_entry(path)
    except CorruptDataError as e:
        log.warning("%s; rebuilding it from the source files", e)
        with contextlib.suppress(OSError):
            path.unlink()
        hit = None
    if hit is not None:
        return hit[0], hit[1], True
    images, labels = decode()
    save_entry(path, images, labels, meta)
    return images, labels, False
