"""Where datasets live: the data folder and its default.

The data folder holds one subfolder per dataset (mnist/, fashion_mnist/, kmnist/, cifar10/,
cifar100/, svhn_cropped/, cifar10_corrupted/) with the official files under their official names.
It is, in order: the `data_dir` argument (config.data_dir, --data_dir), else $GEDL_DATA_DIR, else
a default folder under the user's cache ($XDG_CACHE_HOME/gedl_jax/data, else
~/.cache/gedl_jax/data), where downloads go when nothing else is said.
"""

from __future__ import annotations

import os
from pathlib import Path

from gedl_jax.data.errors import MissingDataError

ENV_DATA_DIR = "GEDL_DATA_DIR"
PathLike = str | os.PathLike


def default_data_dir() -> Path:
    """$XDG_CACHE_HOME/gedl_jax/data, else ~/.cache/gedl_jax/data (may not exist yet)."""
    base = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(base).expanduser() / "gedl_jax" / "data"


def data_dir_origin(data_dir: PathLike | None = None) -> tuple[Path, str]:
    """(folder, where it came from: "data_dir", "$GEDL_DATA_DIR" or "default"). Not checked."""
    if data_dir:
        return Path(data_dir).expanduser(), "data_dir"
    if os.environ.get(ENV_DATA_DIR):
        return Path(os.environ[ENV_DATA_DIR]).expanduser(), f"${ENV_DATA_DIR}"
    return default_data_dir(), "default"


def resolve_data_dir(data_dir: PathLike | None = None, *, create: bool = False) -> Path:
    """The data folder (module docstring). An explicitly given folder (argument or
    $GEDL_DATA_DIR) must exist unless `create`; the default one is created when `create`."""
    path, origin = data_dir_origin(data_dir)
    if create:
        path.mkdir(parents=True, exist_ok=True)
    if not path.is_dir():
        hint = ("it is created when something is downloaded into it" if origin == "default"
                else "create it, or give another folder")
        raise MissingDataError(f"data folder {path} (from {origin}) does not exist or is not a "
                               f"folder; {hint}")
    return path
