"""Writing result files safely: every file gedl-jax writes as a result (config.json,
eval_results.json, eval_table.md, plots, tables) goes to a temporary file in the same folder
and is renamed over the target, so a crash, a Ctrl-C or a full disk leaves either the old file
or the new one, never half of one. Also which errors are a full resource (a full disk, memory
that ran out) rather than bad data or a bug. Imports nothing from gedl_jax (every layer may use
it)."""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib
from collections.abc import Callable, Iterator


def _temporary(path: pathlib.Path) -> pathlib.Path:
    # Same folder (a rename within one filesystem is atomic), same suffix (matplotlib picks the
    # format from it), a name no other writer uses.
    return path.with_name(f".{path.stem}.tmp{os.getpid()}{path.suffix}")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[pathlib.Path]:
    """A temporary path to write `path`'s new content to; renamed over `path` when the block
    ends without an error, removed otherwise."""
    path = pathlib.Path(path)
    tmp = _temporary(path)
    try:
        yield tmp
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: str | os.PathLike, text: str) -> pathlib.Path:
    """Write `text` to `path` atomically (temporary file + rename)."""
    with atomic_path(path) as tmp:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    return pathlib.Path(path)


def write_with(path: str | os.PathLike, writer: Callable[[pathlib.Path], object]
               ) -> pathlib.Path:
    """`writer(tmp)` writes the file (e.g. `figure.savefig`); then it is renamed to `path`."""
    with atomic_path(path) as tmp:
        writer(tmp)
    return pathlib.Path(path)


def is_disk_full(error: BaseException) -> bool:
    """True for "no space left on device" / "disk quota exceeded", also when wrapped."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def out_of_memory(error: BaseException) -> BaseException | None:
    """The out-of-memory error in `error`'s chain (XLA's RESOURCE_EXHAUSTED status on any
    backend, or NumPy's MemoryError on the host), else None. Never evidence of a damaged file:
    a checkpoint that fails to restore for want of memory is not set aside."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, MemoryError) or (
                isinstance(error, RuntimeError)
                and str(error).lstrip().startswith("RESOURCE_EXHAUSTED")):
            return error
        error = error.__cause__ or error.__context__
    return None


def check_writable(folder: str | os.PathLike, what: str = "--workdir") -> None:
    """Raise `PermissionError` with a one-line message if `folder` (or, when it does not exist
    yet, its nearest existing parent) cannot be written: checked before any work starts."""
    folder = pathlib.Path(folder)
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    probe = existing / f".gedl_write_check_{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise PermissionError(f"{what}={folder} cannot be written ({e.strerror or e}): give a "
                              f"folder you can write to") from None
