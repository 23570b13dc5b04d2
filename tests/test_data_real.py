"""Real data from the data folder: MNIST, Fashion-MNIST, KMNIST (test only), CIFAR-10.

The folder is $GEDL_DATA_DIR. Every test here skips, with the reason, where it is unset or lacks
the files; CI sets it. The network is blocked throughout.
"""

import hashlib
import os
import time
from pathlib import Path

import numpy as np
import pytest

from gedl_jax import data

DATA_DIR = Path(os.environ["GEDL_DATA_DIR"]) if os.environ.get("GEDL_DATA_DIR") else None

pytestmark = [
    pytest.mark.skipif(DATA_DIR is None or not (DATA_DIR / "mnist").is_dir(),
                       reason="GEDL_DATA_DIR is not set" if DATA_DIR is None
                       else f"real data folder {DATA_DIR} is absent (set GEDL_DATA_DIR)"),
    pytest.mark.usefixtures("no_network"),
]

MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
MNIST_TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("real_cache")


def _needs(*rel):
    missing = [r for r in rel if not (DATA_DIR / r).is_file()]
    if missing:
        pytest.skip(f"not in {DATA_DIR}: {missing}")


def test_sha256sums_and_registered_checksums():
    sums = DATA_DIR / "SHA256SUMS"
    if not sums.is_file():
        pytest.skip(f"{sums} absent")
    for line in sums.read_text().split("\n"):
        if not line.strip():
            continue
        sha, rel = line.split()
        path = DATA_DIR / rel
        assert hashlib.sha256(path.read_bytes()).hexdigest() == sha, rel
        dataset, name = rel.split("/")
        kind = "arrays" if name.endswith(".npz") else "official"
        spec = data.registered_files(dataset, kind)[name]
        assert (spec.sha256, spec.size) == (sha, path.stat().st_size), rel


def test_mnist_protocol(cache):
    _needs("mnist/train-images-idx3-ubyte.gz", "mnist/t10k-images-idx3-ubyte.gz")
    s = data.load_train_val_test("mnist", DATA_DIR, seed=0, cache_dir=cache)
    assert s["train"].images.shape == (48000, 28, 28, 1)
    assert s["validation"].images.shape == (12000, 28, 28, 1)
    assert s["test"].images.shape == (10000, 28, 28, 1)
    assert s["train"].images.dtype == np.uint8 and s["train"].labels.dtype == np.int32
    counts = s["train"].label_counts(10) + s["validation"].label_counts(10)
    assert counts.tolist() == MNIST_TRAIN_COUNTS
    assert s["test"].label_counts(10).tolist() == MNIST_TEST_COUNTS
    # the well-known MNIST pixel statistics (0.1307, 0.3081)
    official = data.load_split("mnist", "train", DATA_DIR, cache_dir=cache)
    mean, std = data.channel_stats(official)
    np.testing.assert_allclose(mean, [0.1307], atol=1e-4)
    np.testing.assert_allclose(std, [0.3081], atol=1e-4)
    # the split is deterministic for a seed and the same as the reference shuffle
    again = data.load_train_val_test("mnist", DATA_DIR, seed=0, cache_dir=cache)
    assert again["train"].source == "official+cache"
    np.testing.assert_array_equal(again["validation"].labels, s["validation"].labels)
    train_idx, _ = data.split_indices(60000, 0.2, 0)
    np.testing.assert_array_equal(s["train"].labels, official.labels[train_idx])


def test_fashion_mnist(cache):
    _needs("fashion_mnist/train-images-idx3-ubyte.gz", "fashion_mnist/t10k-images-idx3-ubyte.gz")
    s = data.load_train_val_test("fashion_mnist", DATA_DIR, seed=0, cache_dir=cache)
    assert [len(s[k]) for k in ("train", "validation", "test")] == [48000, 12000, 10000]
    assert (s["train"].label_counts(10) + s["validation"].label_counts(10)).tolist() == [6000] * 10
    assert s["test"].label_counts(10).tolist() == [1000] * 10
    ood = data.load_ood("fashion_mnist", DATA_DIR, cache_dir=cache)
    np.testing.assert_array_equal(ood.images, s["test"].images)


def test_kmnist_test_only(cache, tmp_path):
    _needs("kmnist/t10k-images-idx3-ubyte.gz", "kmnist/t10k-labels-idx1-ubyte.gz")
    ood = data.load_ood("kmnist", DATA_DIR, cache_dir=cache)
    assert ood.images.shape == (10000, 28, 28, 1) and ood.name == "kmnist/test"
    assert ood.label_counts(10).tolist() == [1000] * 10
    if not (DATA_DIR / "kmnist" / "train-images-idx3-ubyte.gz").exists():
        t = time.perf_counter()
        with pytest.raises(data.MissingDataError, match="train-images-idx3-ubyte.gz"):
            data.load_split("kmnist", "train", DATA_DIR, cache_dir=cache,
                            tfds_data_dir=tmp_path / "tfds")
        assert time.perf_counter() - t < 5
    # the same files as an extra OOD folder (unverified path) decode identically
    folder = data.load_ood(DATA_DIR / "kmnist")
    np.testing.assert_array_equal(folder.images, ood.images)


def test_default_ood_sets_of_mnist_load(cache):
    _needs("kmnist/t10k-images-idx3-ubyte.gz", "fashion_mnist/t10k-images-idx3-ubyte.gz")
    for name in data.default_ood_sets("mnist"):
        s = data.load_ood(name, DATA_DIR, cache_dir=cache)
        assert s.images.shape == (10000, 28, 28, 1)


def test_cifar10_arrays(cache):
    _needs("cifar10/train.npz", "cifar10/test.npz")
    s = data.load_train_val_test("cifar10", DATA_DIR, seed=0, cache_dir=cache)
    assert s["train"].images.shape == (47500, 32, 32, 3)
    assert s["validation"].images.shape == (2500, 32, 32, 3)
    assert s["test"].images.shape == (10000, 32, 32, 3)
    assert (s["train"].label_counts(10) + s["validation"].label_counts(10)).tolist() == [5000] * 10
    assert s["test"].label_counts(10).tolist() == [1000] * 10
    assert s["train"].source.startswith("arrays")
    mean, std = data.channel_stats(data.load_split("cifar10", "train", DATA_DIR, cache_dir=cache))
    np.testing.assert_allclose(mean, [0.4914, 0.4822, 0.4465], atol=2e-4)
    np.testing.assert_allclose(std, [0.2470, 0.2435, 0.2616], atol=2e-4)
