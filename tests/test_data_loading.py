"""Sources, checksums, cache, errors and the TFDS path, on small official-format files.

Every test runs with the network blocked (any connection attempt fails the test) and a private
cache folder.
"""

import os
import time

import numpy as np
import pytest
from data_fixtures import (
    cifar10c_arrays,
    specs_for,
    write_cifar10_tar,
    write_cifar10c_folder,
    write_cifar10c_tar,
    write_cifar100_tar,
    write_idx,
    write_mnist_folder,
    write_npz,
    write_svhn_mat,
)

from gedl_jax import data
from gedl_jax.data import readers, registry, tfds_source

pytestmark = pytest.mark.usefixtures("no_network", "isolated_env")

MNIST_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
               "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")


@pytest.fixture
def mnist_dir(tmp_path):
    """A data folder whose mnist/ holds small official-format files, registered for the test."""
    root = tmp_path / "data"
    arrays = write_mnist_folder(root / "mnist", n_train=50, n_test=20)
    with registry.override_file_specs("mnist", "official", specs_for(root / "mnist", MNIST_FILES)):
        yield root, arrays


def cache_files(cache):
    return sorted(p.relative_to(cache).as_posix() for p in cache.rglob("*") if p.is_file())


def test_load_split_and_cache_hit(mnist_dir, isolated_env, monkeypatch):
    root, arrays = mnist_dir
    train = data.load_split("mnist", "train", data_dir=root)
    assert train.images.shape == (50, 28, 28, 1) and train.labels.dtype == np.int32
    assert train.source == "official" and train.name == "mnist/train"
    np.testing.assert_array_equal(train.images[..., 0], arrays["train"][0])
    assert any(f.startswith("mnist/train.official.") for f in cache_files(isolated_env))
    assert not any(".tmp" in f for f in cache_files(isolated_env))

    def no_decode(*a, **k):
        raise AssertionError("decoded again despite a cache entry")

    monkeypatch.setattr(readers, "read_idx_pair", no_decode)
    again = data.load_split("mnist", "train", data_dir=root)
    assert again.source == "official+cache"
    np.testing.assert_array_equal(again.images, train.images)


def test_env_data_dir_and_config_empty_string(mnist_dir, monkeypatch):
    root, _ = mnist_dir
    monkeypatch.setenv("GEDL_DATA_DIR", str(root))
    assert len(data.load_split("mnist", "test", data_dir="")) == 20


def test_train_val_test_protocol(mnist_dir):
    root, arrays = mnist_dir
    s0 = data.load_train_val_test("mnist", data_dir=root, seed=0)
    assert [len(s0[k]) for k in ("train", "validation", "test")] == [40, 10, 20]
    s0b = data.load_train_val_test("mnist", data_dir=root, seed=0)
    s1 = data.load_train_val_test("mnist", data_dir=root, seed=1)
    np.testing.assert_array_equal(s0["train"].images, s0b["train"].images)
    assert not np.array_equal(s0["train"].images, s1["train"].images)
    # train + validation is a partition of the official train split
    both = np.concatenate([s0["train"].images, s0["validation"].images])[..., 0].reshape(50, -1)
    official = arrays["train"][0].reshape(50, -1)
    assert sorted(map(bytes, both)) == sorted(map(bytes, official))
    assert s0["validation"].name == "mnist/validation"
    s = data.load_train_val_test("mnist", data_dir=root, seed=0, val_fraction=0.3)
    assert (len(s["train"]), len(s["validation"])) == (35, 15)


def test_split_indices_match_the_reference_shuffle():
    """np.random.seed(seed); np.random.shuffle(list(range(n))) then cut at int(n * 0.8)."""
    for n, frac, n_train in ((60000, 0.2, 48000), (50000, 0.05, 47500), (1000, 0.2, 800)):
        train, val = data.split_indices(n, frac, seed=3)
        assert (len(train), len(val)) == (n_train, n - n_train)
        np.random.seed(3)
        ref = list(range(n))
        np.random.shuffle(ref)
        np.testing.assert_array_equal(np.concatenate([train, val]), ref)


def test_missing_files_fail_fast_with_names(tmp_path):
    root = tmp_path / "data"
    write_mnist_folder(root / "kmnist", splits=("test",))  # an OOD set with only its test files
    t = time.perf_counter()
    with pytest.raises(data.MissingDataError) as e:
        data.load_split("kmnist", "train", data_dir=root, tfds_data_dir=tmp_path / "tfds")
    assert time.perf_counter() - t < 30  # seconds, not TFDS's minutes of network retries
    msg = str(e.value)
    assert "train-images-idx3-ubyte.gz" in msg and "train-labels-idx1-ubyte.gz" in msg
    assert str(root / "kmnist") in msg and "downloads are off" in msg and "GEDL_OFFLINE" in msg
    assert "GEDL_DATA_MIRROR" in msg  # the two ways out: copy the files, or a mirror
    with pytest.raises(data.MissingDataError, match="cifar-100-binary.tar.gz"):
        data.load_split("cifar100", "test", data_dir=root, tfds_data_dir=tmp_path / "tfds")
    with pytest.raises(data.MissingDataError, match="GEDL_DATA_DIR"):
        data.load_split("mnist", "test", tfds_data_dir=tmp_path / "tfds")


def test_test_only_ood_set(tmp_path):
    root = tmp_path / "data"
    arrays = write_mnist_folder(root / "kmnist", splits=("test",), n_test=30)
    specs = specs_for(root / "kmnist", MNIST_FILES[2:])
    with registry.override_file_specs("kmnist", "official", specs):
        ood = data.load_ood("kmnist", data_dir=root)
    assert ood.images.shape == (30, 28, 28, 1) and ood.name == "kmnist/test"
    np.testing.assert_array_equal(ood.labels, arrays["test"][1])


def test_wrong_checksum_is_clear_and_leaves_nothing(tmp_path, isolated_env):
    root = tmp_path / "data"
    write_mnist_folder(root / "mnist")  # real registered checksums: these files do not match
    t = time.perf_counter()
    with pytest.raises(data.ChecksumError) as e:
        data.load_split("mnist", "test", data_dir=root)
    assert time.perf_counter() - t < 30  # seconds, not TFDS's minutes of network retries
    msg = str(e.value)
    assert "t10k-images-idx3-ubyte.gz" in msg and "1,648,877 bytes" in msg
    assert "replace it with the official file" in msg
    assert cache_files(isolated_env) == []  # no cache entry, no verified-file record


def test_same_size_wrong_sha256(mnist_dir, isolated_env):
    root, _ = mnist_dir
    p = root / "mnist" / "t10k-labels-idx1-ubyte.gz"
    raw = bytearray(p.read_bytes())
    raw[-3] ^= 0xFF
    p.write_bytes(bytes(raw))
    with pytest.raises(data.ChecksumError, match="sha256"):
        data.load_split("mnist", "test", data_dir=root)
    assert not any(f.startswith("mnist/") for f in cache_files(isolated_env))


def test_corrupt_registered_file(tmp_path, isolated_env):
    """A file whose checksum is registered but which does not decode: CorruptDataError."""
    root = tmp_path / "data"
    write_mnist_folder(root / "mnist")
    (root / "mnist" / "t10k-images-idx3-ubyte.gz").write_bytes(b"\x1f\x8b\x08garbage")
    with registry.override_file_specs("mnist", "official",
                                      specs_for(root / "mnist", MNIST_FILES)):
        with pytest.raises(data.CorruptDataError, match="t10k-images-idx3-ubyte.gz"):
            data.load_split("mnist", "test", data_dir=root)
    assert not any(f.startswith("mnist/") for f in cache_files(isolated_env))


def test_changed_mtime_rehashes_but_keeps_cache(mnist_dir, monkeypatch):
    root, _ = mnist_dir
    data.load_split("mnist", "test", data_dir=root)
    p = root / "mnist" / "t10k-images-idx3-ubyte.gz"
    os.utime(p, (1, 1))
    calls = []
    real = data.cache.sha256_file
    monkeypatch.setattr(data.cache, "sha256_file", lambda q: calls.append(q) or real(q))
    assert data.load_split("mnist", "test", data_dir=root).source == "official+cache"
    assert calls == [p]  # only the touched file was hashed again


def test_corrupt_cache_entry_is_rebuilt(mnist_dir, isolated_env, caplog):
    root, _ = mnist_dir
    first = data.load_split("mnist", "test", data_dir=root)
    [entry] = [isolated_env / f for f in cache_files(isolated_env) if f.startswith("mnist/test")]
    raw = bytearray(entry.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    entry.write_bytes(bytes(raw))
    again = data.load_split("mnist", "test", data_dir=root)
    assert again.source == "official" and "rebuilding" in caplog.text
    np.testing.assert_array_equal(again.images, first.images)
    assert data.load_split("mnist", "test", data_dir=root).source == "official+cache"


def test_cache_only_when_sources_absent(mnist_dir, tmp_path):
    """A verified cache entry serves where the files are gone (e.g. a GPU machine)."""
    root, _ = mnist_dir
    first = data.load_split("mnist", "test", data_dir=root)
    empty = tmp_path / "empty"
    (empty / "mnist").mkdir(parents=True)
    again = data.load_split("mnist", "test", data_dir=empty, tfds_data_dir=tmp_path / "tfds")
    assert again.source == "official+cache"
    np.testing.assert_array_equal(again.images, first.images)
    no_dir = data.load_split("mnist", "test", tfds_data_dir=tmp_path / "tfds")
    assert no_dir.source == "official+cache"


def test_extra_ood_idx_folder(tmp_path):
    folder = tmp_path / "my_ood"
    arrays = write_mnist_folder(folder, splits=("test",), n_test=15)
    ood = data.load_ood(folder)
    assert ood.images.shape == (15, 28, 28, 1) and ood.name == "my_ood/test"
    np.testing.assert_array_equal(ood.labels, arrays["test"][1])
    assert len(data.load_ood(str(folder))) == 15
    with pytest.raises(data.MissingDataError, match="t10k-images-idx3-ubyte.gz"):
        data.load_ood(tmp_path)  # a folder without the files
    with pytest.raises(data.MissingDataError, match="neither a registered dataset") as e:
        data.load_ood("not_a_dataset")
    assert "did you mean" not in str(e.value) and "images:<folder" in str(e.value)
    for near_miss, suggested in [("svhn", "(did you mean 'svhn_cropped'?)"),
                                 ("KMNIST", "(did you mean 'kmnist' or 'mnist'?)"),
                                 ("cifar-100", "(did you mean 'cifar100' or")]:
        with pytest.raises(data.MissingDataError) as e:
            data.load_ood(near_miss)
        assert suggested in str(e.value), str(e.value)
    write_idx(folder / "t10k-labels-idx1-ubyte.gz", np.zeros(3, np.uint8))
    with pytest.raises(data.CorruptDataError):
        data.load_ood(folder)


def test_cifar10_official_tarball_caches_both_splits(tmp_path, monkeypatch):
    root = tmp_path / "data"
    expected = write_cifar10_tar(root / "cifar10" / "cifar-10-binary.tar.gz")
    specs = specs_for(root / "cifar10", ["cifar-10-binary.tar.gz"])
    with registry.override_file_specs("cifar10", "official", specs):
        train = data.load_split("cifar10", "train", data_dir=root)
        np.testing.assert_array_equal(train.images, expected["train"][0])
        monkeypatch.setattr(readers, "read_cifar_binary_tar_all",
                            lambda *a: pytest.fail("archive decoded twice"))
        test = data.load_split("cifar10", "test", data_dir=root)
    assert test.source == "official+cache"
    np.testing.assert_array_equal(test.labels, expected["test"][1])


def test_cifar10_arrays_source(tmp_path):
    """CIFAR-10 decoded arrays: checksum-verified against the project registration."""
    root = tmp_path / "data"
    rng = np.random.default_rng(0)
    for split, n in (("train", 40), ("test", 10)):
        write_npz(root / "cifar10" / f"{split}.npz",
                  rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8), np.arange(n) % 10)
    with pytest.raises(data.ChecksumError, match="gedl_jax"):
        data.load_split("cifar10", "train", data_dir=root)
    with registry.override_file_specs("cifar10", "arrays",
                                      specs_for(root / "cifar10", ["train.npz", "test.npz"])):
        s = data.load_train_val_test("cifar10", data_dir=root, seed=0)
    assert [len(s[k]) for k in ("train", "validation", "test")] == [38, 2, 10]
    assert s["train"].source == "arrays"


def test_unregistered_arrays_are_accepted_with_a_warning(tmp_path, caplog):
    root = tmp_path / "data"
    rng = np.random.default_rng(0)
    write_npz(root / "fashion_mnist" / "test.npz",
              rng.integers(0, 256, (12, 28, 28), dtype=np.uint8), np.arange(12) % 10)
    s = data.load_split("fashion_mnist", "test", data_dir=root)
    assert s.images.shape == (12, 28, 28, 1) and s.source == "arrays"
    assert "not checksum-verified" in caplog.text
    write_npz(root / "fashion_mnist" / "test.npz",
              rng.integers(0, 256, (12, 28, 28), dtype=np.uint8), np.arange(12) + 5)
    with pytest.raises(data.CorruptDataError, match="labels span"):
        data.load_split("fashion_mnist", "test", data_dir=root)


def test_cifar100_and_svhn(tmp_path):
    root = tmp_path / "data"
    expected = write_cifar100_tar(root / "cifar100" / "cifar-100-binary.tar.gz")
    images, digits = write_svhn_mat(root / "svhn_cropped" / "test_32x32.mat", n=11)
    with registry.override_file_specs("cifar100", "official",
                                      specs_for(root / "cifar100", ["cifar-100-binary.tar.gz"])), \
         registry.override_file_specs("svhn_cropped", "official",
                                      specs_for(root / "svhn_cropped", ["test_32x32.mat"])):
        c100 = data.load_ood("cifar100", data_dir=root)
        svhn = data.load_ood("svhn_cropped", data_dir=root)
        with pytest.raises(data.MissingDataError, match="train_32x32.mat"):
            data.load_split("svhn_cropped", "train", data_dir=root, tfds_data_dir=tmp_path / "t")
    np.testing.assert_array_equal(c100.labels, expected["test"][1])
    np.testing.assert_array_equal(svhn.images, images)
    np.testing.assert_array_equal(svhn.labels, digits)


@pytest.mark.parametrize("layout", ["tar", "extracted"])
def test_cifar10_corrupted(tmp_path, layout, monkeypatch):
    root = tmp_path / "data"
    arrays = cifar10c_arrays(n=4)
    folder = root / "cifar10_corrupted"
    if layout == "tar":
        write_cifar10c_tar(folder / "CIFAR-10-C.tar", arrays)
        specs = specs_for(folder, ["CIFAR-10-C.tar"])
    else:
        write_cifar10c_folder(folder / "CIFAR-10-C", arrays)
        specs = registry.registered_files("cifar10_corrupted")
    with registry.override_file_specs("cifar10_corrupted", "official", specs):
        s3 = data.load_corrupted("fog", 3, data_dir=root)
        np.testing.assert_array_equal(s3.images, arrays["fog.npy"][8:12])
        np.testing.assert_array_equal(s3.labels, arrays["labels.npy"][:4])
        assert s3.name == "cifar10_corrupted/fog_3"
        glass = data.load_corrupted("frosted_glass_blur", 1, data_dir=root)
        assert glass.name == "cifar10_corrupted/frosted_glass_blur_1"
        np.testing.assert_array_equal(glass.images, arrays["glass_blur.npy"][:4])
        monkeypatch.setattr(readers, "read_cifar10c_all",
                            lambda *a: pytest.fail("decoded again"))
        s5 = data.load_split("cifar10_corrupted", "fog_5", data_dir=root)  # cached on first use
        np.testing.assert_array_equal(s5.images, arrays["fog.npy"][16:20])


def test_cifar10_corrupted_missing(tmp_path):
    (tmp_path / "data").mkdir()
    with pytest.raises(data.MissingDataError, match="CIFAR-10-C.tar") as e:
        data.load_corrupted("contrast", 1, data_dir=tmp_path / "data",
                            tfds_data_dir=tmp_path / "t")
    assert "contrast.npy" in str(e.value)


def test_cifar10_corrupted_wrong_checksum(tmp_path):
    root = tmp_path / "data"
    write_cifar10c_tar(root / "cifar10_corrupted" / "CIFAR-10-C.tar", cifar10c_arrays())
    with pytest.raises(data.ChecksumError, match="CIFAR-10-C.tar"):
        data.load_corrupted("fog", 1, data_dir=root)


def test_unknown_split_and_source(mnist_dir):
    root, _ = mnist_dir
    with pytest.raises(data.DataError, match="splits"):
        data.load_split("mnist", "validation", data_dir=root)
    with pytest.raises(ValueError, match="source"):
        data.load_split("mnist", "test", data_dir=root, source="web")


# ------------------------------------------------------------------------------ TFDS path
def test_tfds_source_with_mock_data(tmp_path):
    tfds = pytest.importorskip("tensorflow_datasets")
    with tfds.testing.mock_data(num_examples=13):
        s = data.load_split("mnist", "test", source="tfds", tfds_data_dir=tmp_path / "tfds")
        c = data.load_split("cifar10", "train", source="tfds", tfds_data_dir=tmp_path / "tfds")
        c10c = data.load_corrupted("fog", 2, source="tfds", tfds_data_dir=tmp_path / "tfds")
    assert s.images.shape == (13, 28, 28, 1) and s.images.dtype == np.uint8
    assert s.labels.dtype == np.int32 and s.labels.max() < 10 and s.source == "tfds"
    assert c.images.shape == (13, 32, 32, 3)
    assert c10c.images.shape == (13, 32, 32, 3) and c10c.name == "cifar10_corrupted/fog_2"


def test_auto_falls_back_to_a_prepared_tfds_dataset(tmp_path, monkeypatch):
    tfds = pytest.importorskip("tensorflow_datasets")
    monkeypatch.setattr(tfds_source, "is_prepared",
                        lambda name, d=None, split=None, **_: name == "svhn_cropped")
    (tmp_path / "data").mkdir()
    with tfds.testing.mock_data(num_examples=9):
        s = data.load_ood("svhn_cropped", data_dir=tmp_path / "data")
    assert s.source == "tfds" and s.images.shape == (9, 32, 32, 3)


def test_tfds_source_unprepared_is_a_clear_error(tmp_path):
    pytest.importorskip("tensorflow_datasets")
    t = time.perf_counter()
    with pytest.raises(data.DataError, match="mnist"):
        data.load_split("mnist", "test", source="tfds", tfds_data_dir=tmp_path / "tfds")
    assert time.perf_counter() - t < 10


def test_prepare_tfds_checks_files_first(tmp_path):
    pytest.importorskip("tensorflow_datasets")
    root = tmp_path / "data"
    write_mnist_folder(root / "kmnist", splits=("test",))
    t = time.perf_counter()
    with pytest.raises(data.MissingDataError) as e:
        data.prepare_tfds("kmnist", data_dir=root, tfds_data_dir=tmp_path / "tfds")
    assert time.perf_counter() - t < 5
    assert "train-images-idx3-ubyte.gz" in str(e.value) and "manual_dir" in str(e.value)
    assert "t10k-images-idx3-ubyte.gz" not in str(e.value)
    write_mnist_folder(root / "mnist")
    with pytest.raises(data.ChecksumError):  # before TFDS (or TensorFlow) is involved
        data.prepare_tfds("mnist", data_dir=root, tfds_data_dir=tmp_path / "tfds")


def test_prepare_tfds_without_tensorflow_says_what_to_install(mnist_dir, tmp_path):
    pytest.importorskip("tensorflow_datasets")
    try:
        import tensorflow  # noqa: F401
        pytest.skip("TensorFlow is installed here")
    except ImportError:
        pass
    root, _ = mnist_dir
    with pytest.raises(data.DataError, match="tfds-prepare"):
        data.prepare_tfds("mnist", data_dir=root, tfds_data_dir=tmp_path / "tfds")


NO_TFDS = r"""
import sys
sys.modules["tensorflow_datasets"] = None   # as on the GPU machines: neither TFDS nor TF
sys.modules["tensorflow"] = None
from pathlib import Path
from gedl_jax import data
from gedl_jax.data import registry
root = Path(sys.argv[1])
assert registry.tfds_registered_files("mnist") is None
assert data.registered_files("mnist")["t10k-images-idx3-ubyte.gz"].size == 1648877
assert not data.tfds_source.is_prepared("mnist")
import data_fixtures
specs = data_fixtures.specs_for(root / "mnist", ["t10k-images-idx3-ubyte.gz",
                                                 "t10k-labels-idx1-ubyte.gz"])
with registry.override_file_specs("mnist", "official", specs):
    s = data.load_split("mnist", "test", root)
assert s.images.shape == (20, 28, 28, 1), s.images.shape
try:
    data.load_split("mnist", "test", root, source="tfds")
except data.DataError as e:
    assert "not importable" in str(e)
else:
    raise AssertionError("tfds source without TFDS")
print("OK")
"""


def test_works_without_tensorflow_datasets(tmp_path):
    import subprocess
    import sys
    root = tmp_path / "data"
    write_mnist_folder(root / "mnist", splits=("test",))
    env = dict(os.environ, GEDL_CACHE_DIR=str(tmp_path / "c"),
               PYTHONPATH=os.pathsep.join([os.path.dirname(__file__),
                                           os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", NO_TFDS, str(root)], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and "OK" in r.stdout, r.stderr[-3000:]


def test_importing_the_package_imports_neither_tf_nor_tfds():
    import subprocess
    import sys
    code = ("import sys; import gedl_jax.data; "
            "print(any(m.split('.')[0] in ('tensorflow', 'tensorflow_datasets') "
            "for m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "False", r.stderr[-2000:]


def test_generated_data_folder_loads_as_the_official_files(generated_data, isolated_env,
                                                           no_network, monkeypatch):
    """The training-mechanics tests' data (conftest `generated_data`, also $GEDL_DATA_DIR): the
    official IDX gz names and format, verified against the sizes and sha256 registered for the
    test, balanced labels, a class signal."""
    monkeypatch.setenv("GEDL_DATA_DIR", str(generated_data))   # isolated_env removed it
    train = data.load_split("mnist", "train")
    ood = data.load_split("kmnist", "test")
    assert train.source == "official" and train.images.shape == (400, 28, 28, 1)
    assert ood.images.shape == (100, 28, 28, 1)
    np.testing.assert_array_equal(np.bincount(train.labels), np.full(10, 40))
    # The class signal: the mean image of class k is brightest in block k of the 2 x 5 grid.
    means = np.stack([train.images[train.labels == k, ..., 0].mean(0) for k in range(10)])
    assert np.all(np.argmax(means.reshape(10, -1), 1) // 28 // 12 == np.arange(10) // 5)


def test_generated_data_without_its_registration_fails_the_real_checksums(
        generated_data_files, isolated_env, no_network):
    with pytest.raises(data.ChecksumError, match="checksum mismatch"):
        data.load_split("mnist", "test", generated_data_files.root)
