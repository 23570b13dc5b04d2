"""Train / validation / test protocol of the I-EDL/R-EDL code (github.com/danruod/IEDL,
code_classical/dataset.py; the same file in github.com/MengyuanChen21/ICLR2024-REDL).

The official training split is shuffled by a seeded permutation and cut: the first
(1 - val_fraction) part trains, the rest validates (MNIST family 0.8/0.2 -> 48,000/12,000;
CIFAR 0.95/0.05 -> 47,500/2,500). The permutation is numpy's legacy `RandomState(seed)` shuffle
of range(N), the same indices as the reference's `np.random.seed(seed); np.random.shuffle(idx)`
on the same record order. The official test split is the ID test set.
"""

from __future__ import annotations

import numpy as np

from gedl_jax.data.arrays import Split
from gedl_jax.data.loading import PathLike, load_split
from gedl_jax.data.registry import get_info


def split_indices(num_examples: int, val_fraction: float, seed: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(train_indices, validation_indices) of a seeded permutation of range(num_examples)."""
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    num_val = int(round(num_examples * val_fraction))
    perm = np.random.RandomState(seed).permutation(num_examples)
    return perm[:num_examples - num_val], perm[num_examples - num_val:]


def train_val_split(train: Split, val_fraction: float, seed: int,
                    dataset: str | None = None) -> tuple[Split, Split]:
    """Cut an official training split into (train, validation) Splits."""
    dataset = dataset or train.name.split("/")[0]
    tr, va = split_indices(len(train), val_fraction, seed)
    return (train.take(tr, f"{dataset}/train"), train.take(va, f"{dataset}/validation"))


def load_train_val_test(name: str, data_dir: PathLike | None = None, seed: int = 0,
                        val_fraction: float | None = None, cache_dir: PathLike | None = None,
                        source: str = "auto", tfds_data_dir: PathLike | None = None, *,
                        download: str | None = "auto", mirror: str | None = None
                        ) -> dict[str, Split]:
    """{"train", "validation", "test"} of in-distribution dataset `name`. val_fraction defaults
    to the registry's protocol value (MNIST family 0.2, CIFAR 0.05). Missing official files are
    downloaded and verified unless `download="never"` (see `load_split`)."""
    info = get_info(name)
    if val_fraction is None:
        val_fraction = info.val_fraction
    fetching = dict(download=download, mirror=mirror)
    official = load_split(name, "train", data_dir, cache_dir, source, tfds_data_dir, **fetching)
    train, validation = train_val_split(official, val_fraction, seed, name)
    del official
    test = load_split(name, "test", data_dir, cache_dir, source, tfds_data_dir, **fetching)
    return {"train": train, "validation": validation, "test": test}
