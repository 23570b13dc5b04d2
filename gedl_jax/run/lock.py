"""One writer per workdir: an advisory lock (`fcntl.flock`) on `<folder>/.gedl_jax.lock`, held
while a run trains into the folder or an evaluation writes its results there.

A second process that wants to write into the same folder, into a folder inside it (a seed's or
an ensemble member's) or into a folder around it stops at once with one line naming the first
one (pid, host, start time, command): `WorkdirBusyError`, a ValueError, so every CLI exits 2. The
kernel drops the lock when its process ends, however it ends (SIGKILL included): a
`.gedl_jax.lock` file left behind by a killed run blocks nobody, and a lock taken and released
leaves no file.

Within one process the lock is re-entrant: a folder inside a folder this process already holds
needs no second lock (`bin/reproduce.py` holds --out, then trains the runs below it).

Multi-host runs (jax.distributed): process 0 takes the lock for everyone, and every process
learns whether it got it, so all of them stop together instead of waiting for one another.

On NFS, Linux implements flock with the server's byte-range locks (NLM, or NFSv4 locks): two
hosts exclude each other when the server supports locking; where the filesystem has no locks
at all (ENOLCK, EOPNOTSUPP) the run goes on with a warning that nothing guards the folder.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import os
import pathlib
import socket
import sys
from collections.abc import Iterator

from gedl_jax import files

LOCK_NAME = ".gedl_jax.lock"   # specific: an ancestor's ".lock" may be another tool's
# Folders inside a locked folder that another process might hold on its own: seed_<s>,
# members/seed_<s>, runs/<name>/seed_<s> (bin/reproduce.py): checked this deep.
_NESTED_DEPTH = 3
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)

# The folders this process holds: resolved path -> the locked file descriptor (None on the
# processes other than 0 of a multi-host run, and where the filesystem has no locks).
_HELD: dict[pathlib.Path, int | None] = {}
# The folders this process will hold once it first writes into them (`claim`): path -> `what`.
_PENDING: dict[pathlib.Path, str] = {}


class WorkdirBusyError(ValueError):
    """Another process writes into the folder (or a folder around it, or inside it)."""


def held_by_this_process(folder: str | os.PathLike) -> bool:
    """Whether this process holds `folder` or a folder around it."""
    folder = _resolved(folder)
    return any(folder == held or held in folder.parents for held in _HELD)


@contextlib.contextmanager
def holding(folder: str | os.PathLike, what: str = "--workdir", *,
            create: bool = True) -> Iterator[pathlib.Path]:
    """Hold `folder`'s lock for the block: `WorkdirBusyError` when another process holds it, a
    folder around it or a folder inside it. It is checked writable first (a `PermissionError`
    names it and `what`, the name of the folder in messages).

    `create=False` for a run that checks its inputs before it writes anything: a folder that
    does not exist yet is not created here; the lock is taken when the run first writes into it
    (`claim`, called by `rundir.prepare`), so bad input leaves no folder behind."""
    folder = pathlib.Path(folder)
    if held_by_this_process(folder) or _pending_around(folder) is not None:
        yield folder
        return
    key = _resolved(folder)
    if create or folder.exists():
        _HELD[key] = _take(folder, what, _acquire)
    else:
        _together(lambda: _check_unborn(folder, what))
        _PENDING[key] = what
    try:
        yield folder
    finally:
        _PENDING.pop(key, None)
        if key in _HELD:
            fd = _HELD.pop(key)
            if fd is not None:
                _release(folder / LOCK_NAME, fd)


def claim(folder: str | os.PathLike) -> None:
    """Before the first write into `folder`: take the lock that a `holding(..., create=False)`
    around it deferred (creating the folder it names). Nothing when this process holds it
    already, or when no `holding` asked for it (a run started without one is not guarded)."""
    if held_by_this_process(folder):
        return
    pending = _pending_around(folder)
    if pending is not None:
        what = _PENDING.pop(pending)
        _HELD[pending] = _take(pending, what, _acquire)


def _pending_around(folder: str | os.PathLike) -> pathlib.Path | None:
    folder = _resolved(folder)
    return next((p for p in _PENDING if folder == p or p in folder.parents), None)


def _take(folder: pathlib.Path, what: str, acquire) -> int | None:
    """`acquire(folder, what)` on process 0 (the descriptor it returns; None elsewhere), every
    process raising together when it fails."""
    return _together(lambda: acquire(folder, what))


def _together(action):
    """`action()` on process 0; under jax.distributed every process learns whether it raised
    and raises too, so none waits for the others forever."""
    index, count = _process()
    result, failure = None, None
    if index == 0:
        try:
            result = action()
        except Exception as e:  # noqa: BLE001 (told to the other processes, then raised)
            failure = e
    if count > 1:
        _agree(failure)
    if failure is not None:
        raise failure
    return result


def _check_unborn(folder: pathlib.Path, what: str) -> None:
    """A folder not created yet: it can be created, and no other process holds one around it."""
    files.check_writable(folder, what)
    _refuse_if_locked(_around_and_inside(folder), folder, what)


def _resolved(folder: str | os.PathLike) -> pathlib.Path:
    return pathlib.Path(os.path.realpath(folder))


def _process() -> tuple[int, int]:
    """(process index, process count) under jax.distributed; (0, 1) where JAX is not in use."""
    if "jax" not in sys.modules:
        return 0, 1
    import jax

    return jax.process_index(), jax.process_count()


def _agree(failure: BaseException | None) -> None:
    """Every process learns whether process 0 took the lock; the others raise too if not."""
    import numpy as np
    from jax.experimental import multihost_utils

    ok = np.asarray(multihost_utils.process_allgather(np.int32(failure is None))).reshape(-1)
    if failure is None and not ok[0]:
        raise WorkdirBusyError("process 0 could not take the lock of the workdir (its error "
                               "names the reason)")


def _acquire(folder: pathlib.Path, what: str) -> int | None:
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{what}={folder} is a file, not a folder: give a folder (it is "
                         f"created if missing)")
    files.check_writable(folder, what)
    folder.mkdir(parents=True, exist_ok=True)
    _refuse_if_locked(_around_and_inside(folder), folder, what)
    path = folder / LOCK_NAME
    while True:
        fd = _open_lock_file(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise WorkdirBusyError(_busy_message(folder, folder, holder, what)) from None
        except OSError as e:
            os.close(fd)
            if e.errno not in _NO_LOCKS:
                raise
            print(f"warning: {folder} is on a filesystem without file locks ({e.strerror}): "
                  f"nothing stops a second run from writing into it at the same time",
                  file=sys.stderr, flush=True)
            return None
        try:   # the file we locked is still the one at `path` (not unlinked by its releaser)
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    record = {"pid": os.getpid(), "host": socket.gethostname(),
              "started": datetime.datetime.now(datetime.UTC).strftime(
                  "%Y-%m-%d %H:%M:%S UTC"),
              "command": " ".join(sys.argv)}
    os.ftruncate(fd, 0)
    os.write(fd, (json.dumps(record) + "\n").encode())
    return fd


def _open_lock_file(path: pathlib.Path) -> int:
    """The lock file, opened to read and write (created if missing), never through a link nor
    into a file with other names: its pid record would overwrite the file a planted link names
    (`files.open_in_place`; `files.PlantedLinkError`, exit 2, says what to remove)."""
    return files.open_in_place(path, os.O_RDWR | os.O_CREAT, "lock (its pid record)")


def _around_and_inside(folder: pathlib.Path) -> list[pathlib.Path]:
    """The lock files of the folders around `folder` and of those up to `_NESTED_DEPTH` inside
    it that exist now."""
    resolved = _resolved(folder)
    found = [parent / LOCK_NAME for parent in resolved.parents]
    pattern = LOCK_NAME
    for _ in range(_NESTED_DEPTH):
        pattern = f"*/{pattern}"
        found += sorted(resolved.glob(pattern))
    return [p for p in found if p.is_file()]


def _refuse_if_locked(lock_files: list[pathlib.Path], folder: pathlib.Path, what: str) -> None:
    for path in lock_files:
        try:   # read only; a link is not a lock of gedl-jax
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            raise WorkdirBusyError(_busy_message(folder, path.parent, holder, what)) from None
        except OSError:
            pass
        finally:
            os.close(fd)


def _holder(fd: int) -> dict:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        return json.loads(os.read(fd, 65536).decode() or "{}")
    except (OSError, ValueError):
        return {}


def _busy_message(folder: pathlib.Path, locked: pathlib.Path, holder: dict, what: str) -> str:
    who = (f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, started "
           f"{holder.get('started', '?')}"
           f"{': ' + holder['command'] if holder.get('command') else ''}")
    where = "" if _resolved(locked) == _resolved(folder) else f" (it holds {locked})"
    other = f"another {what}" if what.startswith("--") else "another folder"
    return (f"{what}={folder} is in use by another gedl-jax process ({who}){where}: wait for "
            f"it to finish or stop it, or use {other}")


def _release(path: pathlib.Path, fd: int) -> None:
    try:
        path.unlink(missing_ok=True)   # while still locked: a waiting process retries
    except OSError:
        pass
    os.close(fd)
