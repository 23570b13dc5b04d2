"""Real small and read-only filesystems for the tests of what a full or read-only disk does.

A test mounts a tmpfs of a few MB on a folder of its own (`mount -t tmpfs -o size=...`), or makes
it read-only (`mount -o remount,ro`). Mounting needs root (or CAP_SYS_ADMIN): as root, permission
bits do not stop writes, so a read-only filesystem is the only honest read-only folder. Without
root, permission bits do stop writes, so `read_only` falls back to `chmod 555`; a test that needs
a small filesystem is skipped where mounting is refused, with the reason.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import stat
import subprocess
from collections.abc import Iterator

import pytest


def _mount(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["mount", *args], capture_output=True, text=True, timeout=30)


@contextlib.contextmanager
def small_filesystem(folder: pathlib.Path, size: str = "20m") -> Iterator[pathlib.Path]:
    """A tmpfs of `size` mounted on `folder` (created) for the block; skips where mounting is
    refused."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        mounted = _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder))
    except (OSError, subprocess.SubprocessError) as e:
        pytest.skip(f"cannot run mount here ({e}): a real small filesystem needs it")
    if mounted.returncode != 0:
        pytest.skip(f"mounting a tmpfs is refused here (not root, or no CAP_SYS_ADMIN: "
                    f"{mounted.stderr.strip()})")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True, timeout=30)


@contextlib.contextmanager
def read_only(folder: pathlib.Path) -> Iterator[pathlib.Path]:
    """`folder` (a mount point of `small_filesystem` as root; any folder otherwise) read-only
    for the block, then writable again."""
    if os.geteuid() != 0:
        modes = {p: p.stat().st_mode for p in [folder, *folder.rglob("*")] if p.is_dir()}
        for p in modes:
            p.chmod(stat.S_IMODE(modes[p]) & ~0o222)
        try:
            yield folder
        finally:
            for p, mode in modes.items():
                p.chmod(stat.S_IMODE(mode))
        return
    remounted = _mount("-o", "remount,ro", str(folder))
    if remounted.returncode != 0:
        pytest.skip(f"cannot remount {folder} read-only: {remounted.stderr.strip()}")
    try:
        yield folder
    finally:
        _mount("-o", "remount,rw", str(folder))


@contextlib.contextmanager
def folder_that_can_be_made_read_only(folder: pathlib.Path) -> Iterator[pathlib.Path]:
    """A folder that `read_only` can turn read-only: a tmpfs of its own as root, else a plain
    folder (permission bits stop a user who is not root)."""
    if os.geteuid() != 0:
        folder.mkdir(parents=True, exist_ok=True)
        yield folder
        return
    with small_filesystem(folder) as mounted:
        yield mounted
