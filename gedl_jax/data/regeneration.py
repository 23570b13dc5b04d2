"""Regenerate CIFAR-10-C from the CIFAR-10 test split into the data folder, in the release's
layout (`<data_dir>/cifar10_corrupted_regenerated/CIFAR-10-C/<corruption>.npy`, labels.npy) with a
provenance record: the pipeline beside `regenerated` (the facts the loader reads about the set),
over the corruption operations of `corruptions`.

    from gedl_jax.data import regenerate
    regenerate.regenerate_cifar10c(data_dir, corruptions=["snow", "pixelate"])

Code reads it as `gedl_jax.data.regenerate` (which re-exports it); the command line, `python -m
gedl_jax.data.regenerate --data_dir=D --corruptions=snow,brightness --seed=0`, is
gedl_jax/commands/regenerate.py.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gedl_jax import files
from gedl_jax.data.errors import DataError
from gedl_jax.data.regenerated import (  # noqa: F401  (facts about the regenerated set, re-exported)
    NOT_REGENERABLE,
    PROVENANCE_FILE,
    REGENERATED_FOLDER,
    RELEASE_SUBFOLDER,
    describe_source,
    read_provenance,
    regenerated_folder,
)
from gedl_jax.data.corruptions import (
    APPROXIMATE,
    FIDELITY,
    PARAMETERS,
    REGENERABLE,
    corrupt,
    release_stem,
    subset_indices,
)
from gedl_jax.data.registry import CORRUPTION_FILES

log = logging.getLogger("gedl_jax.data.regenerate")   # its name before the move


def _atomic_write(path: Path, write: Callable[[Any], None], mode: str = "wb") -> None:
    with files.atomic_file(path, mode) as f:   # readable by others, as a file open() makes
        write(f)


def library_versions() -> dict[str, str]:
    import PIL
    import scipy

    return {"numpy": np.__version__, "scipy": scipy.__version__, "Pillow": PIL.__version__,
            "python": sys.version.split()[0]}


@dataclasses.dataclass(frozen=True)
class _TestSplit:
    images: np.ndarray
    labels: np.ndarray
    description: str


def _load_test(data_dir, cache_dir, num_examples: int) -> _TestSplit:
    from gedl_jax.data import loading  # loading imports this module

    test = loading.load_split("cifar10", "test", data_dir, cache_dir)
    index = subset_indices(len(test), num_examples)
    images, labels = test.images[index], test.labels[index]
    which = (f"{len(index)} evenly spaced examples (indices (i * {len(test)}) // {len(index)})"
             if len(index) < len(test) else f"all {len(index)} examples")
    return _TestSplit(np.ascontiguousarray(images), labels,
                      f"{test.name} (source {test.source}), {which}")


def regenerate_cifar10c(data_dir=None, *, corruptions: Sequence[str] | None = None, seed: int = 0,
                        num_examples: int = 0, cache_dir=None) -> Path:
    """Build CIFAR-10-C corruptions from the CIFAR-10 test split and write them in the official
    layout under `<data_dir>/cifar10_corrupted_regenerated/CIFAR-10-C/`: `<stem>.npy` uint8
    (5n, 32, 32, 3), severities 1..5 in order, and `labels.npy` (the test labels tiled 5x), plus
    `provenance.json` (seed, library versions, parameters, which corruptions are approximate).

    corruptions: TFDS names or file stems (default: every one in REGENERABLE); num_examples: n
    evenly spaced test images (`subset_indices`; 0 = all 10,000). Each file is written
    atomically (temporary name, then rename). Returns the folder. `data.load_corrupted` reads it
    where the official archive is absent."""
    from gedl_jax.data import (
        loading,
        locations,
    )

    # The default data folder (under the user's cache) is created, as a download would create
    # it; a folder the user named must exist.
    root = loading.resolve_data_dir(data_dir, create=locations.data_dir_origin(data_dir)[1]
                                    == "default")
    names = list(corruptions) if corruptions else list(REGENERABLE)
    stems = [release_stem(c) for c in names]  # fail on a bad name before any work
    test = _load_test(root, cache_dir, int(num_examples))
    n = len(test.labels)
    folder = regenerated_folder(root)
    folder.mkdir(parents=True, exist_ok=True)
    labels_5n = np.tile(test.labels.astype(np.uint8), 5)
    provenance = read_provenance(folder)
    labels_path = folder / "labels.npy"
    if labels_path.is_file():
        existing = np.load(labels_path, allow_pickle=False)
        others = set(provenance.get("corruptions", {})) - set(stems)
        if others and not np.array_equal(existing, labels_5n):
            raise DataError(
                f"{folder} holds corruptions regenerated from another test subset: regenerate "
                f"with --num_examples={provenance.get('num_examples')}, or delete {folder}\n"
                f"  corruptions {sorted(others)}, from {len(existing) // 5} examples (now {n})")
    _atomic_write(labels_path, lambda f: np.save(f, labels_5n, allow_pickle=False))
    provenance.update({
        "dataset": "CIFAR-10-C, regenerated by gedl_jax (not the official release)",
        "reference": "Hendrycks & Dietterich, ICLR 2019; CIFAR parameters of "
                     "github.com/hendrycks/robustness ImageNet-C/create_c/make_cifar_c.py",
        "layout": "<stem>.npy uint8 (5n, 32, 32, 3), severity s in rows n(s-1)..ns-1; "
                  "labels.npy uint8 (5n,) = the test labels tiled 5x",
        "source_split": test.description,
        "num_examples": n,
        "conversion": "float x/255, corrupt, clip [0,1], x255, np.uint8 (truncation)",
    })
    entries = provenance.setdefault("corruptions", {})
    for stem in stems:
        start = time.perf_counter()
        blocks = [corrupt(test.images, stem, s, seed=seed) for s in (1, 2, 3, 4, 5)]
        images_5n = np.concatenate(blocks) if n else np.zeros((0, 32, 32, 3), np.uint8)
        _atomic_write(folder / f"{stem}.npy", lambda f, a=images_5n: np.save(f, a,
                                                                              allow_pickle=False))
        kind, how = FIDELITY[stem]
        entries[stem] = {
            "tfds_name": next(t for t, s in CORRUPTION_FILES.items() if s == stem),
            "seed": int(seed), "num_examples": n,
            "parameters_by_severity": [list(p) if isinstance(p, tuple) else p
                                       for p in PARAMETERS[stem]],
            "fidelity": kind, "approximate": kind == APPROXIMATE, "how": how,
            "library_versions": library_versions(),
            "created_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "seconds": round(time.perf_counter() - start, 2),
        }
        log.info("regenerated %s (%d x 5 images) in %.1f s", stem, n, entries[stem]["seconds"])
        print(f"{stem}: {n} x 5 severities, {entries[stem]['seconds']:.1f} s ({kind})",
              flush=True)
    provenance["not_regenerable"] = NOT_REGENERABLE
    text = json.dumps(provenance, indent=2)
    _atomic_write(folder / PROVENANCE_FILE, lambda f: f.write(text), mode="w")
    return folder
