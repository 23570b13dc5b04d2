"""Writing files safely in folders gedl-jax does not own alone.

Every file gedl-jax writes whole (config.json, eval_results.json, eval_table.md, plots,
predictions, tables, model files) is written by `atomic_file`: into a temporary file created
under a random name in the same folder with O_CREAT | O_EXCL | O_NOFOLLOW (`tempfile.mkstemp`),
so never a file that a link planted in the folder points to, then renamed over the target
(`os.replace`), which replaces a link at the target's name rather than writing through it. A
crash, a Ctrl-C or a full disk leaves either the old file or the new one, never half of one.

A file or folder that is written in place (a log appended to, a lock, a folder of checkpoints)
is refused when its name is a link (`refuse_link`, `open_append`: `PlantedLinkError`, a
ValueError, so every CLI exits 2 saying what to remove): anyone who can put a file into a
shared runs folder, or into a run folder unpacked from someone else's archive, could otherwise
make the next run overwrite any file the user can write.

Also which errors are a full resource (a full disk, memory that ran out) rather than bad data or
a bug. Imports nothing from gedl_jax (every layer may use it)."""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from typing import IO

# The mode a new file gets from open(): what mkstemp's 0600 is widened to before the rename.
_UMASK = os.umask(0o022)
os.umask(_UMASK)


class PlantedLinkError(ValueError):
    """A name gedl-jax writes to in place is a link (or not a plain file or folder): writing
    there would write into whatever it points to. The message names it and says to remove it."""


def _planted(path: pathlib.Path, what: str, kind: str = "file",
             names: int = 1) -> PlantedLinkError:
    if names > 1:
        found = f"has {names} names (a hard link to another file)"
    else:
        try:
            target = f" (to {os.readlink(path)})"
        except OSError:
            target = ""
        found = f"is a symbolic link{target}" if path.is_symlink() else f"is not a plain {kind}"
    return PlantedLinkError(
        f"{path} {found}, where gedl-jax writes its {what}: writing there could overwrite "
        f"another file. Remove it (rm {path}) and rerun")


def refuse_link(path: str | os.PathLike, what: str, kind: str = "file") -> None:
    """`PlantedLinkError` when `path` exists as a symbolic link, or as something other than a
    `kind` ("file" or "folder"); nothing when it does not exist."""
    path = pathlib.Path(path)
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not (stat.S_ISDIR(mode) if kind == "folder" else stat.S_ISREG(mode)):
        raise _planted(path, what, kind)


def open_in_place(path: str | os.PathLike, flags: int, what: str) -> int:
    """A descriptor of `path` opened with `flags` (O_CREAT among them creates it) for a file
    written in place (a log, a lock), never through a symbolic link (O_NOFOLLOW) nor into a
    file that has other names (a hard link): `PlantedLinkError` naming what to remove."""
    path = pathlib.Path(path)
    refuse_link(path, what)
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:   # a link planted since the check above
            raise _planted(path, what) from None
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        raise _planted(path, what, names=info.st_nlink)
    return fd


def open_append(path: str | os.PathLike, what: str) -> IO[str]:
    """`path` opened to append text, created if missing (`open_in_place`)."""
    return os.fdopen(open_in_place(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, what), "a")


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO]:
    """A new file, open in `mode` ("wb" or "w"), to write `path`'s new content to: created
    under a random name beside `path` (mkstemp: O_CREAT | O_EXCL | O_NOFOLLOW); when the block
    ends without an error it is flushed to disk, given the mode a new file gets, and renamed
    over `path` (a link at `path` is replaced, its target left alone); removed otherwise."""
    path = pathlib.Path(path)
    # Same folder (a rename within one filesystem is atomic), a name no other writer uses.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=f".tmp{path.suffix}",
                               dir=path.parent)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
            os.fchmod(f.fileno(), 0o666 & ~_UMASK)   # mkstemp makes 0600
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def write_text(path: str | os.PathLike, text: str) -> pathlib.Path:
    """Write `text` to `path` atomically (`atomic_file`)."""
    with atomic_file(path, "w") as f:
        f.write(text)
    return pathlib.Path(path)


def write_with(path: str | os.PathLike, writer: Callable[[IO[bytes]], object]
               ) -> pathlib.Path:
    """`writer(f)` writes the file into the open binary file `f` (e.g. `figure.savefig(f,
    format="png")`, `np.savez(f, ...)`); then it is renamed to `path` (`atomic_file`)."""
    with atomic_file(path, "wb") as f:
        writer(f)
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


def disk_full_error(error: BaseException) -> OSError | None:
    """The OSError of a full disk or quota in `error`'s chain (its `filename` names the file
    whose write failed, where the library kept it), else None."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return error
        error = error.__cause__ or error.__context__
    return None


def free_space_text(path: str | os.PathLike) -> str:
    """How much space the filesystem of `path` (or of its nearest existing parent) has left,
    e.g. "12.3 MB free"; "free space unknown" where it cannot be read."""
    path = pathlib.Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        free = shutil.disk_usage(path).free
    except OSError:
        return "free space unknown"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if free >= size:
            return f"{free / size:.1f} {unit} free"
    return f"{free} bytes free"


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
    # A name nobody can have planted a link at, created only if it does not exist, never
    # through a link: the probe cannot write into another file.
    probe = existing / f".gedl_write_check_{os.getpid()}_{secrets.token_hex(8)}"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, 0o600))
        probe.unlink()
    except OSError as e:
        raise PermissionError(f"{what}={folder} cannot be written ({e.strerror or e}): give a "
                              f"folder you can write to") from None
