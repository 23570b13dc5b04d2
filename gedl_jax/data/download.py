"""Get the official dataset files into the data folder: download with checksums, a mirror, offline.

The command line is `python -m gedl_jax.data.fetch` (fetch.py); the library entry point is
`fetch_datasets(["mnist", "kmnist", "fashion_mnist"])` -> the data folder. What it does, per file:
- **Where from.** The official URL registered with the file's checksum (TensorFlow Datasets'
  registered url checksums), or, when a mirror is given (`mirror=`, `config.data_mirror`,
  $GEDL_DATA_MIRROR), only `<mirror>/<dataset>/<official file name>`: an http(s) base URL or a local
  folder laid out like the data folder. A mirror also serves the decoded-array sources the project
  registers (CIFAR-10's `train.npz`/`test.npz`), which have no official URL.
- **Verified while it streams.** Size and sha256 are checked against the registration; the bytes go
  to a temporary name in the target folder and are renamed only once they match, so a wrong
  checksum or a broken transfer leaves nothing behind.
- **Bounded.** Connect timeout 10 s, read timeout 60 s; at most 2 retries, and only for a 5xx answer
  or a connection dropped mid-body. A DNS failure or a refused connection fails at once. Proxy
  environment variables (HTTP_PROXY, HTTPS_PROXY, NO_PROXY) are honoured.
- **Offline.** `download="never"` (or $GEDL_OFFLINE=1, which wins over everything) never touches the
  network; `"auto"` (the default) fetches only missing files; `"force"` fetches again and replaces.
- **Concurrent callers.** A per-file lock (under the cache folder) makes a second process wait for
  the first one's download and then verify it, instead of downloading the same file twice.
- A progress bar (bytes, rate, ETA) for files over 4 MB.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import sys
import time
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from gedl_jax import files
from gedl_jax.data import cache as cache_lib
from gedl_jax.data.errors import ChecksumError, DataError, MissingDataError
from gedl_jax.data.locations import ENV_DATA_DIR, data_dir_origin, resolve_data_dir
from gedl_jax.data.registry import DATASETS, FileSpec, get_info, registered_files

log = logging.getLogger(__name__)

DOWNLOAD_MODES = ("auto", "never", "force")
ENV_OFFLINE = "GEDL_OFFLINE"
ENV_MIRROR = "GEDL_DATA_MIRROR"
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0
MAX_RETRIES = 2
RETRY_BACKOFF_S = 0.5
PROGRESS_MIN_BYTES = 4 << 20
_CHUNK = 1 << 16
PathLike = str | os.PathLike


class DownloadError(MissingDataError):
    """A file could not be fetched (not on the server, refused, timed out, cut off)."""


class _NotOnServer(DownloadError):
    """404/410 from the server, or absent from a local mirror: another source may have it."""


@dataclasses.dataclass(frozen=True)
class Timeouts:
    connect: float = CONNECT_TIMEOUT_S
    read: float = READ_TIMEOUT_S


# ------------------------------------------------------------------------------ settings
def offline_forced() -> bool:
    """$GEDL_OFFLINE set to anything but '', '0', 'false', 'no'."""
    return os.environ.get(ENV_OFFLINE, "").strip().lower() not in ("", "0", "false", "no")


def download_mode(download: str | None = None) -> str:
    """The effective mode: "never" when $GEDL_OFFLINE is set, else `download` (default "auto")."""
    mode = download or "auto"
    if mode not in DOWNLOAD_MODES:
        raise ValueError(f"download={mode!r} is not allowed; allowed values: "
                         f"{list(DOWNLOAD_MODES)}")
    return "never" if offline_forced() else mode


def mirror_location(mirror: str | None = None) -> str | None:
    """`mirror` if given, else $GEDL_DATA_MIRROR, else None."""
    return (mirror or os.environ.get(ENV_MIRROR, "")).strip() or None


def _is_url(location: str) -> bool:
    return urllib.parse.urlsplit(location).scheme in ("http", "https")


def _local_path(location: str) -> Path:
    parts = urllib.parse.urlsplit(location)
    if parts.scheme == "file":
        return Path(urllib.parse.unquote(parts.path))
    return Path(location).expanduser()


def file_locations(spec: FileSpec, dataset: str, mirror: str | None) -> list[str]:
    """Where `spec` may be fetched from: the mirror alone when one is given, else its URL."""
    if mirror:
        if _is_url(mirror):
            return [f"{mirror.rstrip('/')}/{dataset}/{urllib.parse.quote(spec.filename)}"]
        return [str(_local_path(mirror) / dataset / spec.filename)]
    return [spec.url] if spec.url else []


# ------------------------------------------------------------------------------ one file
@contextlib.contextmanager
def _file_lock(final: Path, cache_root: Path) -> Iterator[None]:
    """An exclusive lock for one target file, kept under the cache (never in the data folder)."""
    try:
        import fcntl  # POSIX only
    except ImportError:  # pragma: no cover  (Windows: no cross-process lock)
        yield
        return
    digest = hashlib.sha256(str(final.resolve()).encode()).hexdigest()[:24]
    lock = cache_root / "locks" / f"{digest}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with files.open_append(lock, "download lock") as f:   # never through a planted link
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _progress(spec: FileSpec, label: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=spec.size, unit="B", unit_scale=True, unit_divisor=1024, desc=label,
                disable=not enabled or spec.size < PROGRESS_MIN_BYTES, file=sys.stderr,
                mininterval=0.5 if sys.stderr.isatty() else 10.0, leave=True)


def _write_verified(chunks: Iterable[bytes], final: Path, spec: FileSpec, source: str,
                    label: str, progress: bool) -> None:
    """Stream `chunks` to a temporary file beside `final`, hashing as it goes; rename it over
    `final` only if size and sha256 match `spec` (cache.atomic_file removes it otherwise)."""
    sha, size = hashlib.sha256(), 0
    with cache_lib.atomic_file(final) as out, \
            _progress(spec, label, progress) as bar:
        for chunk in chunks:
            size += len(chunk)
            if size > spec.size:
                raise ChecksumError(
                    f"{source}: more than the registered {spec.size:,} bytes of {spec.filename}; "
                    "not the registered file (nothing was written)")
            sha.update(chunk)
            out.write(chunk)
            bar.update(len(chunk))
        out.flush()
        if size < spec.size:
            raise _ShortBody(f"{source}: the transfer ended after {size:,} of {spec.size:,} "
                             "bytes")
        if sha.hexdigest() != spec.sha256:
            raise ChecksumError(
                f"{source}: checksum mismatch for {spec.filename}: the server (or mirror) holds "
                f"a damaged or different file, which was not kept\n"
                f"  expected sha256 {spec.sha256} (registered by "
                f"{spec.registered_by or 'the registry'})\n  got      sha256 {sha.hexdigest()}")


class _ShortBody(DownloadError):
    """The body ended before the registered size (a dropped connection): retried."""


def _copy_local(path: Path, final: Path, spec: FileSpec, label: str, progress: bool) -> None:
    if not path.is_file():
        raise _NotOnServer(f"{path}: not in the mirror folder")

    def chunks() -> Iterator[bytes]:
        with open(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                yield chunk

    _write_verified(chunks(), final, spec, str(path), label, progress)


def _http_get(url: str, final: Path, spec: FileSpec, label: str, progress: bool,
              timeouts: Timeouts) -> None:
    import requests  # only when downloading
    import urllib3

    attempts = MAX_RETRIES + 1
    for attempt in range(attempts):
        last = attempt == attempts - 1
        try:
            with requests.get(url, stream=True, timeout=(timeouts.connect, timeouts.read),
                              headers={"User-Agent": "gedl-jax (+requests)"}) as resp:
                if resp.status_code in (404, 410):
                    raise _NotOnServer(f"{url}: HTTP {resp.status_code} (not on the server)")
                if resp.status_code >= 500:
                    if last:
                        raise DownloadError(f"{url}: HTTP {resp.status_code} after {attempts} "
                                            "tries")
                    log.warning("%s: HTTP %d, retrying", url, resp.status_code)
                    time.sleep(RETRY_BACKOFF_S * 2 ** attempt)
                    continue
                if resp.status_code != 200:
                    raise DownloadError(f"{url}: HTTP {resp.status_code} {resp.reason}")
                _write_verified(resp.iter_content(_CHUNK), final, spec, url, label, progress)
                return
        except _ShortBody as e:
            reason = str(e)
        except requests.exceptions.ConnectTimeout:
            raise DownloadError(f"{url}: no connection within {timeouts.connect:g} s") from None
        except requests.exceptions.ReadTimeout:
            raise DownloadError(f"{url}: the server sent nothing for {timeouts.read:g} s "
                                "(read timeout)") from None
        except requests.exceptions.ChunkedEncodingError as e:  # dropped mid-body
            reason = f"{url}: connection dropped mid-transfer ({e})"
        except requests.exceptions.ConnectionError as e:
            inner = e.args[0] if e.args else None
            if isinstance(inner, urllib3.exceptions.ReadTimeoutError):
                raise DownloadError(f"{url}: the server stopped sending for {timeouts.read:g} s "
                                    "(read timeout)") from None
            if isinstance(inner, urllib3.exceptions.ProtocolError):
                reason = f"{url}: connection dropped mid-transfer ({inner})"
            else:  # DNS failure, refused, unreachable: fail at once
                raise DownloadError(f"{url}: cannot connect ({_root_cause(e)})") from None
        if last:
            raise DownloadError(f"{reason}; gave up after {attempts} tries")
        log.warning("%s; retrying", reason)
        time.sleep(RETRY_BACKOFF_S * 2 ** attempt)


def _root_cause(e: BaseException) -> str:
    """The innermost exception of requests' wrapping (ConnectionError > MaxRetryError > ...)."""
    seen: set[int] = set()
    while id(e) not in seen:
        seen.add(id(e))
        inner = getattr(e, "reason", None) or e.__cause__
        if inner is None and e.args and isinstance(e.args[0], BaseException):
            inner = e.args[0]
        if not isinstance(inner, BaseException):
            break
        e = inner
    return f"{type(e).__name__}: {e}"


def fetch_file(spec: FileSpec, dataset: str, folder: Path, *, mirror: str | None = None,
               force: bool = False, cache_root: Path | None = None, progress: bool = True,
               timeouts: Timeouts = Timeouts()) -> Path:
    """Make `folder/spec.filename` a verified copy of the registered file and return its path.

    A file already there is verified (size, sha256) and kept, unless `force`. Raises
    DownloadError (nothing fetched, with the reason), _NotOnServer (a DownloadError: the location
    does not have the file) or ChecksumError (the bytes are not the registered file; nothing
    kept)."""
    cache_root = cache_lib.resolve_cache_dir(cache_root)
    final = folder / spec.filename
    locations = file_locations(spec, dataset, mirror)
    with _file_lock(final, cache_root):
        if final.is_file() and not force:
            cache_lib.verify_file(final, spec, cache_root)
            return final
        if not locations:
            raise _NotOnServer(f"{dataset}/{spec.filename} has no official URL (it is registered "
                               f"by {spec.registered_by or 'the project'}); only a mirror "
                               f"(${ENV_MIRROR}) or a copy in {folder} can provide it")
        label = f"{dataset}/{spec.filename}"
        errors = []
        for location in locations:
            log.info("fetching %s from %s", label, location)
            try:
                if _is_url(location):
                    _http_get(location, final, spec, label, progress, timeouts)
                else:
                    _copy_local(_local_path(location), final, spec, label, progress)
            except _NotOnServer as e:
                errors.append(str(e))
                continue
            cache_lib.record_verified(final, spec.sha256, cache_root)
            return final
        raise _NotOnServer("; ".join(errors))


# ------------------------------------------------------------------------------ datasets
def source_options(dataset: str, split: str, mirror: str | None, *, every: bool = False
                   ) -> list[tuple[str, list[FileSpec]]]:
    """The ways to obtain `dataset`'s `split` by fetching, in order of preference: (source kind,
    the registered files it needs). A source needs checksums for all its files, and a location:
    the official files their URLs (or a mirror); decoded arrays a mirror. `every`: also the
    sources only a mirror could serve, when no mirror is given (for messages)."""
    info = get_info(dataset)
    options = []
    for src in info.sources:
        names = src.split_files.get(split)
        if not names:
            continue
        try:
            specs = registered_files(dataset, src.kind)
        except DataError:
            continue
        if any(n not in specs for n in names):
            continue
        chosen = [specs[n] for n in names]
        if not (mirror or every) and any(not s.url for s in chosen):
            continue
        options.append((src.kind, chosen))
    return options


def fetch_split(dataset: str, split: str, data_dir: PathLike | None = None, *,
                mirror: str | None = None, force: bool = False,
                cache_dir: PathLike | None = None, progress: bool = True,
                timeouts: Timeouts = Timeouts()) -> list[Path]:
    """Fetch the files `dataset`'s `split` needs into `<data_dir>/<dataset>/` (trying the sources
    in order; one complete source is enough); returns their paths."""
    info = get_info(dataset)
    folder = resolve_data_dir(data_dir, create=True) / info.folder
    cache_root = cache_lib.resolve_cache_dir(cache_dir)
    options = source_options(dataset, split, mirror)
    if not options:
        raise DownloadError(f"{dataset} {split!r}: no source can be fetched "
                            f"{'from the mirror' if mirror else '(no official URL registered)'}")
    if not force:  # one complete source already here: only verify it
        for _, specs in options:
            if all((folder / s.filename).is_file() for s in specs):
                return [fetch_file(s, dataset, folder, mirror=mirror, cache_root=cache_root,
                                   progress=progress, timeouts=timeouts) for s in specs]
    errors = []
    for kind, specs in options:
        try:
            return [fetch_file(s, dataset, folder, mirror=mirror, force=force,
                               cache_root=cache_root, progress=progress, timeouts=timeouts)
                    for s in specs]
        except _NotOnServer as e:  # try the next source (e.g. the mirror has arrays only)
            errors.append(f"{kind} files: {e}")
    raise DownloadError(f"{dataset} {split!r}: no source could be fetched: " + "; ".join(errors))


def default_splits(dataset: str) -> tuple[str, ...]:
    """What `fetch <dataset>` gets without `:splits`: every split but SVHN's 1.3 GB `extra`."""
    return tuple(s for s in get_info(dataset).splits if s != "extra")


def requests_for_run(dataset: str, ood: Sequence[str] = ()) -> list[tuple[str, str]]:
    """(dataset, split) pairs a run needs: the ID dataset's train and test splits, and the test
    split of each OOD set (default: the protocol's, e.g. kmnist + fashion_mnist for mnist)."""
    ood = tuple(ood) if ood else get_info(dataset).default_ood
    return [(dataset, "train"), (dataset, "test")] + [(o, "test") for o in ood if o in DATASETS]


def fetch_datasets(names: Sequence[str], data_dir: PathLike | None = None, *,
                   splits: Mapping[str, Sequence[str]] | None = None,
                   download: str | None = "auto", mirror: str | None = None,
                   cache_dir: PathLike | None = None, progress: bool = True) -> Path:
    """Make sure the files of `names` (all splits but SVHN's `extra`, or `splits[name]`) are in
    the data folder, verified; download what is missing (see the module docstring) and return
    the data folder. With downloads off, a MissingDataError lists every missing file."""
    wanted = [(n, s) for n in names for s in (splits or {}).get(n, default_splits(n))]
    return ensure_files(wanted, data_dir, download=download, mirror=mirror, cache_dir=cache_dir,
                        progress=progress)


def ensure_files(wanted: Sequence[tuple[str, str]], data_dir: PathLike | None = None, *,
                 download: str | None = "auto", mirror: str | None = None,
                 cache_dir: PathLike | None = None, progress: bool = True,
                 timeouts: Timeouts = Timeouts()) -> Path:
    """Fetch the (dataset, split) pairs `wanted` into the data folder (module docstring). All
    missing files are reported together, before anything is downloaded, when downloads are off."""
    mode = download_mode(download)
    mirror = mirror_location(mirror)
    folder, origin = data_dir_origin(data_dir)
    if origin == "default":
        log.warning("data folder: %s (default; set $GEDL_DATA_DIR or config.data_dir to change)",
                    folder)
    missing = [(d, s) for d, s in wanted if not split_present(folder, d, s)]
    if missing and mode == "never":
        raise MissingDataError(missing_files_message(missing, folder, mirror, mode))
    if mode == "never":
        return folder  # present; loading verifies them
    for dataset, split in wanted:  # fetches what is missing, verifies what is present
        try:
            fetch_split(dataset, split, folder, mirror=mirror, force=mode == "force",
                        cache_dir=cache_dir, progress=progress, timeouts=timeouts)
        except DownloadError as e:
            raise DownloadError(missing_files_message(
                [(d, s) for d, s in missing if not split_present(folder, d, s)], folder, mirror,
                mode, lead=" ".join(str(e).split()))) from None
    if not folder.is_dir():
        folder.mkdir(parents=True, exist_ok=True)
    return folder


def split_present(root: Path, dataset: str, split: str) -> bool:
    """Whether some source of `split` has all its files in the folder (not yet verified)."""
    info = get_info(dataset)
    return any(names and all((root / info.folder / n).is_file() for n in names)
               for names in (src.split_files.get(split) for src in info.sources))


def missing_files_message(missing: Sequence[tuple[str, str]], root: Path, mirror: str | None,
                          mode: str, lead: str | None = None) -> str:
    """The error of missing data files, as `cli.error_text` prints it: a first line with the
    cause (`lead`, else how many files the data folder lacks) and the way out ($GEDL_DATA_DIR,
    or the fetch command below it on a machine with a network), then indented detail lines:
    that command, every missing file with its size and URL, and the mirror as another way."""
    by_dataset: dict[str, list[str]] = {}
    for dataset, split in missing:
        by_dataset.setdefault(dataset, []).append(split)
    listed, count = [], 0
    for dataset, splits in by_dataset.items():
        options: dict[str, dict[str, FileSpec]] = {}  # source kind -> files, over the splits
        for split in splits:
            for kind, specs in source_options(dataset, split, mirror, every=True):
                options.setdefault(kind, {}).update({s.filename: s for s in specs})
        listed.append(f"  {dataset} ({', '.join(splits)}), in {root / get_info(dataset).folder}:")
        for i, (kind, specs) in enumerate(options.items()):
            if i:
                listed.append(f"    or, as {'decoded arrays' if kind == 'arrays' else kind}:")
            for s in specs.values():
                count += not i
                listed.append(f"    {s.filename}  {s.size:,} bytes  {s.url or 'a mirror only'}")
        if not options:
            names = sorted(n for sp in splits for n in _split_names(dataset, sp))
            count += len(names)
            listed.append(f"    {', '.join(names)} (no registered checksums)")
    lead = lead or f"the data folder {root} lacks {count} input file(s)"
    why = f"${ENV_OFFLINE} is set" if offline_forced() else "download=never"
    return "\n".join([
        f"{lead}{', and downloads are off' if mode == 'never' else ''}: set ${ENV_DATA_DIR} to "
        f"a folder with these files, or fetch them:",
        f"  python -m gedl_jax.data.fetch --data_dir=DIR {_targets_text(missing)}   (where there "
        f"is a network)",
        "  the files (<data folder>/<dataset>/<file name>; --config.data_dir=DIR names a folder):",
        *listed,
        f"  or let a mirror serve them: ${ENV_MIRROR} (--config.data_mirror), a URL or a folder "
        f"laid out as <mirror>/<dataset>/<file name>",
        *([f"  (downloads are off: {why}; --config.download=auto and ${ENV_OFFLINE} unset allow "
           f"them)"] if mode == "never" else [])])


def _targets_text(missing: Sequence[tuple[str, str]]) -> str:
    by_dataset: dict[str, list[str]] = {}
    for d, s in missing:
        by_dataset.setdefault(d, []).append(s)
    return " ".join(f"{d}:{','.join(s)}" for d, s in by_dataset.items())


def _split_names(dataset: str, split: str) -> set[str]:
    return {n for src in get_info(dataset).sources for n in src.split_files.get(split, ())}


# ------------------------------------------------------------------------------ listing
def list_datasets(data_dir: PathLike | None = None, cache_dir: PathLike | None = None
                  ) -> list[dict[str, object]]:
    """Every registered file of every dataset: its folder, size, URL and status here
    ("verified", "present" (right size, not hashed yet), "wrong size", "missing")."""
    root, _ = data_dir_origin(data_dir)
    cache_root = cache_lib.resolve_cache_dir(cache_dir)
    rows = []
    for name, info in DATASETS.items():
        for src in info.sources:
            try:
                specs = registered_files(name, src.kind)
            except DataError:
                continue
            files = sorted({f for names in src.split_files.values() for f in names})
            for f in files:
                spec = specs.get(f)
                if spec is None:
                    continue
                path = root / info.folder / f
                splits = [s for s, names in src.split_files.items() if f in names]
                rows.append({"dataset": name, "source": src.kind, "file": f,
                             "splits": splits, "size": spec.size, "url": spec.url,
                             "status": _status(path, spec, cache_root)})
    return rows


def _status(path: Path, spec: FileSpec, cache_root: Path) -> str:
    if not path.is_file():
        return "missing"
    if path.stat().st_size != spec.size:
        return "wrong size"
    return "verified" if cache_lib.recorded_sha256(path, cache_root) == spec.sha256 else "present"
