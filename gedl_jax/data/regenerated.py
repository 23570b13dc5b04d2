"""Facts about the regenerated CIFAR-10-C that the loader needs: where the set lives, its
provenance record, and which corruptions can be regenerated at all.

They live apart from `corruptions` (the generator, which loads the CIFAR-10 test split through
`loading`) so that `loading` can find a regenerated set without importing the generator.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gedl_jax.data.registry import CORRUPTION_FILES, corruption_file_stem

# Folder (inside the data folder) and subfolder of the regenerated set. The name says
# "regenerated" so that nobody mistakes it for the release; the subfolder is the release's.
REGENERATED_FOLDER = "cifar10_corrupted_regenerated"
RELEASE_SUBFOLDER = "CIFAR-10-C"
PROVENANCE_FILE = "provenance.json"

# Release file stems that numpy, scipy and Pillow cannot regenerate, and why.
NOT_REGENERABLE: dict[str, str] = {
    "frost": "needs the release's frost photographs (frost1.png ... frost6.jpg), which "
             "gedl_jax does not ship",
    "spatter": "needs OpenCV's Canny edge detector, distance transform and histogram "
               "equalisation, which numpy/scipy/Pillow do not provide with the same semantics",
}

# TFDS names (registry.CORRUPTION_FILES keys) of the corruptions that can be regenerated, in the
# registry's order (tests/test_corruptions.py checks this equals the generator's own list).
REGENERABLE: tuple[str, ...] = tuple(t for t, stem in CORRUPTION_FILES.items()
                                     if stem not in NOT_REGENERABLE)


def regenerated_folder(data_dir: str | os.PathLike) -> Path:
    """Where the regenerated set lives: `<data_dir>/cifar10_corrupted_regenerated/CIFAR-10-C/`."""
    return Path(data_dir).expanduser() / REGENERATED_FOLDER / RELEASE_SUBFOLDER


def read_provenance(folder: str | os.PathLike) -> dict[str, Any]:
    """The provenance record of a regenerated folder ({} when there is none)."""
    path = Path(folder) / PROVENANCE_FILE
    if not path.is_file():
        return {}
    return json.loads(path.read_text())


def describe_source(folder: str | os.PathLike, corruption: str) -> str:
    """A one-line label of a regenerated corruption for outputs (tables, plot titles)."""
    stem = corruption_file_stem(corruption)
    entry = read_provenance(folder).get("corruptions", {}).get(stem, {})
    label = "regenerated CIFAR-10-C"
    if entry:
        label += f", seed {entry.get('seed')}"
        if entry.get("approximate"):
            label += ", approximate"
    return label
