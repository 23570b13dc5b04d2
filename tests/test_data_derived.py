"""Derived OOD sets (gedl_jax.data.derived) and the near / far OOD groups of the registry.

The conversions are checked pixel by pixel against an exact-fraction brute force written from
their definitions; loading is checked on small files in the official formats (the network
blocked, a private cache); the real files of $GEDL_DATA_DIR are used where present.
"""

import doctest
import math
import os
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from data_fixtures import specs_for, write_cifar10_tar, write_mnist_folder

from gedl_jax import data
from gedl_jax.data import derived, registry

MNIST_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
               "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")


# ------------------------------------------------------------------ brute force, from definitions
def brute_gray28(image_32x32x3: np.ndarray) -> np.ndarray:
    """BT.601 luma (exact fractions), box average over [8i/7, 8(i+1)/7)^2, round half up."""
    img = image_32x32x3.astype(int)
    luma = [[Fraction(299 * img[r, c, 0] + 587 * img[r, c, 1] + 114 * img[r, c, 2], 1000)
             for c in range(32)] for r in range(32)]
    scale = Fraction(32, 28)

    def overlaps(i):   # (input index, overlap length) for output index i
        lo, hi = i * scale, (i + 1) * scale
        out = []
        for j in range(math.floor(lo), math.ceil(hi)):
            length = min(hi, j + 1) - max(lo, j)
            if length > 0:
                out.append((j, length))
        return out

    result = np.zeros((28, 28), np.uint8)
    for i in range(28):
        for k in range(28):
            total = sum(a * b * luma[j][m] for j, a in overlaps(i) for m, b in overlaps(k))
            value = total / (scale * scale)
            result[i, k] = math.floor(value + Fraction(1, 2))
    return result


def test_gray28_equals_exact_brute_force():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(3, 32, 32, 3), dtype=np.uint8)
    images[1] = (images[1] // 64) * 64          # coarse levels: many exact .5 averages
    got = derived.rgb32_to_gray28(images)
    assert got.shape == (3, 28, 28, 1) and got.dtype == np.uint8
    for n in range(3):
        np.testing.assert_array_equal(got[n, :, :, 0], brute_gray28(images[n]))


def test_gray28_constants_luma_and_half_up_rounding():
    def const(r, g, b):
        x = np.zeros((1, 32, 32, 3), np.uint8)
        x[..., 0], x[..., 1], x[..., 2] = r, g, b
        return derived.rgb32_to_gray28(x)

    assert np.all(const(0, 0, 0) == 0) and np.all(const(255, 255, 255) == 255)
    assert np.all(const(17, 17, 17) == 17)                 # the weights sum to 1
    assert np.all(const(255, 0, 0) == 76)                  # 76.245
    assert np.all(const(0, 255, 0) == 150)                 # 149.685
    assert np.all(const(0, 0, 255) == 29)                  # 29.07
    # A colour whose luma is exactly x.5 rounds up (half up, not half to even).
    r, g, b = next((r, g, b) for r in range(256) for g in range(4) for b in range(4)
                   if (299 * r + 587 * g + 114 * b) % 1000 == 500
                   and ((299 * r + 587 * g + 114 * b) // 1000) % 2 == 0)
    y = (299 * r + 587 * g + 114 * b) // 1000
    assert np.all(const(r, g, b) == y + 1)


def test_gray28_preserves_the_mean_up_to_rounding():
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, size=(64, 32, 32, 3), dtype=np.uint8)
    luma = images.astype(np.float64) @ np.array([0.299, 0.587, 0.114])
    got = derived.rgb32_to_gray28(images).astype(np.float64)
    assert abs(got.mean() - luma.mean()) < 0.02
    assert np.all(np.abs(got.mean(axis=(1, 2, 3)) - luma.mean(axis=(1, 2))) <= 0.5)


def test_rgb32_pads_and_replicates():
    rng = np.random.default_rng(2)
    x = rng.integers(0, 256, size=(5, 28, 28, 1), dtype=np.uint8)
    y = derived.gray28_to_rgb32(x)
    assert y.shape == (5, 32, 32, 3) and y.dtype == np.uint8 and y.flags.c_contiguous
    for c in range(3):
        np.testing.assert_array_equal(y[:, 2:30, 2:30, c], x[..., 0])
    border = np.ones((32, 32), bool)
    border[2:30, 2:30] = False
    assert np.all(y[:, border, :] == 0)


def test_transforms_reject_wrong_shapes():
    with pytest.raises(data.CorruptDataError):
        derived.rgb32_to_gray28(np.zeros((1, 28, 28, 1), np.uint8))
    with pytest.raises(data.CorruptDataError):
        derived.gray28_to_rgb32(np.zeros((1, 32, 32, 3), np.uint8))
    with pytest.raises(data.CorruptDataError):
        derived.rgb32_to_gray28(np.zeros((1, 32, 32, 3), np.float32))


# ------------------------------------------------------------------ registry: names and groups
def test_registry_declares_derived_sets_and_groups():
    assert set(data.DERIVED_OOD) == {"cifar10_gray28", "mnist_rgb32", "fashion_mnist_rgb32"}
    for name, spec in data.DERIVED_OOD.items():
        assert name not in data.DATASETS and spec.source in data.DATASETS
        assert spec.transform in derived.TRANSFORMS
        assert data.source_split(name) == (spec.source, "test")
    assert data.DERIVED_OOD["cifar10_gray28"].image_shape == data.DATASETS["mnist"].image_shape
    for name in ("mnist_rgb32", "fashion_mnist_rgb32"):
        assert data.DERIVED_OOD[name].image_shape == data.DATASETS["cifar10"].image_shape
    assert data.ood_sets_by_group("mnist") == {"near": ("kmnist", "fashion_mnist"),
                                               "far": ("cifar10_gray28",)}
    assert data.ood_sets_by_group("cifar10") == {
        "near": ("cifar100",), "far": ("svhn_cropped", "mnist_rgb32", "fashion_mnist_rgb32")}
    for id_name, groups in data.OOD_GROUPS.items():
        assert not set(groups["near"]) & set(groups["far"])
        for group, names in groups.items():
            for ood in names:
                assert data.is_ood_name(ood) and ood != id_name
                assert data.ood_group(id_name, ood) == group
                shape = (data.DERIVED_OOD[ood].image_shape if ood in data.DERIVED_OOD
                         else data.DATASETS[ood].image_shape)
                assert shape == data.DATASETS[id_name].image_shape   # the model reads it
    assert data.ood_group("mnist", "svhn_cropped") is None
    assert data.ood_group("fashion_mnist", "mnist") is None     # nothing declared
    assert data.ood_group("mnist", "/some/idx_folder") is None
    with pytest.raises(data.DataError, match="only a test split"):
        data.source_split("mnist_rgb32", "train")
    with pytest.raises(data.DataError, match="load_ood"):
        data.get_info("cifar10_gray28")


def test_doctests():
    for module in (derived, registry):
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        assert result.failed == 0
    assert doctest.testmod(derived).attempted > 0


# ------------------------------------------------------------------ loading generated files
@pytest.mark.usefixtures("no_network", "isolated_env")
def test_load_derived_sets_from_official_format_files(tmp_path):
    root = tmp_path / "data"
    cifar = write_cifar10_tar(root / "cifar10" / "cifar-10-binary.tar.gz", n_test=6)
    mnist = write_mnist_folder(root / "mnist", n_train=10, n_test=7, seed=1)
    fashion = write_mnist_folder(root / "fashion_mnist", n_train=10, n_test=5, seed=2)
    with registry.override_file_specs("cifar10", "official",
                                      specs_for(root / "cifar10", ["cifar-10-binary.tar.gz"])), \
            registry.override_file_specs("mnist", "official",
                                         specs_for(root / "mnist", MNIST_FILES)), \
            registry.override_file_specs("fashion_mnist", "official",
                                         specs_for(root / "fashion_mnist", MNIST_FILES)):
        data.ensure_available([("cifar10_gray28", "test"), ("mnist_rgb32", "test"),
                               ("fashion_mnist_rgb32", "test")], data_dir=root,
                              download="never")
        gray = data.load_ood("cifar10_gray28", root, download="never")
        assert gray.name == "cifar10_gray28/test" and gray.source == "derived:official"
        assert gray.images.shape == (6, 28, 28, 1)
        np.testing.assert_array_equal(gray.images, derived.rgb32_to_gray28(cifar["test"][0]))
        np.testing.assert_array_equal(gray.labels, cifar["test"][1])
        for name, arrays, n in (("mnist_rgb32", mnist, 7), ("fashion_mnist_rgb32", fashion, 5)):
            rgb = data.load_ood(name, root, download="never")
            assert rgb.name == f"{name}/test" and rgb.images.shape == (n, 32, 32, 3)
            for c in range(3):
                np.testing.assert_array_equal(rgb.images[:, 2:30, 2:30, c], arrays["test"][0])
            np.testing.assert_array_equal(rgb.labels, arrays["test"][1])
        again = data.load_ood("cifar10_gray28", root, download="never")
        assert again.source == "derived:official+cache"
        np.testing.assert_array_equal(again.images, gray.images)


@pytest.mark.usefixtures("no_network", "isolated_env")
def test_missing_source_files_are_named(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    with pytest.raises(data.MissingDataError, match="cifar-10-binary.tar.gz"):
        data.ensure_available([("cifar10_gray28", "test")], data_dir=root, download="never")
    with pytest.raises(data.MissingDataError, match="t10k-images-idx3-ubyte.gz"):
        data.load_ood("mnist_rgb32", root, download="never")
    with pytest.raises(data.MissingDataError, match="derived OOD set"):
        data.load_ood("cifar10_grey28", root)


# ------------------------------------------------------------------ the real files
REAL = Path(os.environ.get("GEDL_DATA_DIR") or Path(__file__).resolve().parents[2]
            / "shared" / "data")


def _real(*rel):
    missing = [r for r in rel if not (REAL / r).is_file()]
    if missing:
        pytest.skip(f"real data absent: {missing} not in {REAL} (set GEDL_DATA_DIR)")


@pytest.mark.usefixtures("no_network")
def test_real_cifar10_gray28(tmp_path):
    _real("cifar10/test.npz")
    cache = tmp_path / "cache"
    gray = data.load_ood("cifar10_gray28", REAL, cache_dir=cache, download="never")
    src = data.load_split("cifar10", "test", REAL, cache_dir=cache, download="never")
    assert gray.images.shape == (10000, 28, 28, 1) and gray.images.dtype == np.uint8
    np.testing.assert_array_equal(gray.labels, src.labels)
    assert gray.label_counts(10).tolist() == [1000] * 10
    luma = src.images.astype(np.float64) @ np.array([0.299, 0.587, 0.114])
    # The mean is preserved up to the final rounding (whose errors average out).
    assert abs(gray.images.mean() - luma.mean()) < 0.01
    # Spot check against the exact brute force, and the conversion is deterministic.
    for n in (0, 4999, 9999):
        np.testing.assert_array_equal(gray.images[n, :, :, 0], brute_gray28(src.images[n]))
    np.testing.assert_array_equal(
        data.load_ood("cifar10_gray28", REAL, cache_dir=cache, download="never").images,
        gray.images)


@pytest.mark.usefixtures("no_network")
@pytest.mark.parametrize("name,source", [("mnist_rgb32", "mnist"),
                                         ("fashion_mnist_rgb32", "fashion_mnist")])
def test_real_rgb32(tmp_path, name, source):
    _real(f"{source}/t10k-images-idx3-ubyte.gz", f"{source}/t10k-labels-idx1-ubyte.gz")
    cache = tmp_path / "cache"
    rgb = data.load_ood(name, REAL, cache_dir=cache, download="never")
    src = data.load_ood(source, REAL, cache_dir=cache, download="never")
    assert rgb.images.shape == (10000, 32, 32, 3)
    for c in range(3):
        np.testing.assert_array_equal(rgb.images[:, 2:30, 2:30, c], src.images[..., 0])
    assert rgb.images[:, :2].max() == 0 and rgb.images[:, :, 30:].max() == 0
