"""Readers on small files written in the exact official formats."""

import gzip

import numpy as np
import pytest
from data_fixtures import (
    cifar10c_arrays,
    idx_bytes,
    write_cifar10_tar,
    write_cifar10c_folder,
    write_cifar10c_tar,
    write_cifar100_tar,
    write_idx,
    write_mnist_folder,
    write_npz,
    write_svhn_mat,
)

from gedl_jax.data import CorruptDataError, MissingDataError, readers

pytestmark = pytest.mark.usefixtures("no_network", "isolated_env")


def test_idx_gz_and_uncompressed(tmp_path):
    a = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    np.testing.assert_array_equal(readers.read_idx(write_idx(tmp_path / "a.gz", a)), a)
    np.testing.assert_array_equal(
        readers.read_idx(write_idx(tmp_path / "a", a, compress=False)), a)


def test_idx_pair_shapes_and_dtypes(tmp_path):
    arrays = write_mnist_folder(tmp_path, n_train=30, n_test=10)
    images, labels = readers.read_idx_pair(tmp_path / "t10k-images-idx3-ubyte.gz",
                                           tmp_path / "t10k-labels-idx1-ubyte.gz")
    assert images.shape == (10, 28, 28, 1) and images.dtype == np.uint8
    assert labels.dtype == np.int32
    np.testing.assert_array_equal(images[..., 0], arrays["test"][0])
    np.testing.assert_array_equal(labels, arrays["test"][1])


def test_idx_errors(tmp_path):
    good = idx_bytes(np.zeros((3, 28, 28), np.uint8))
    (tmp_path / "trunc.gz").write_bytes(gzip.compress(good[:-5]))
    with pytest.raises(CorruptDataError, match="truncated"):
        readers.read_idx(tmp_path / "trunc.gz")
    (tmp_path / "magic").write_bytes(b"\x12\x34" + good[2:])
    with pytest.raises(CorruptDataError, match="magic"):
        readers.read_idx(tmp_path / "magic")
    (tmp_path / "badgz.gz").write_bytes(gzip.compress(good)[:40])
    with pytest.raises(CorruptDataError, match="decompress"):
        readers.read_idx(tmp_path / "badgz.gz")
    with pytest.raises(MissingDataError):
        readers.read_idx(tmp_path / "absent.gz")
    write_idx(tmp_path / "i.gz", np.zeros((3, 28, 28), np.uint8))
    write_idx(tmp_path / "l.gz", np.zeros((4,), np.uint8))
    with pytest.raises(CorruptDataError, match="3 images but"):
        readers.read_idx_pair(tmp_path / "i.gz", tmp_path / "l.gz")


def test_idx_wrong_magic_is_named_as_such_not_as_truncated(tmp_path):
    """A valid-looking IDX magic of the wrong type (a labels file where the images belong, a
    header edited to 0x00000803) used to read on into the payload and be called "truncated"."""
    write_idx(tmp_path / "i.gz", np.zeros((3, 28, 28), np.uint8))
    labels = idx_bytes(np.zeros((3,), np.uint8))
    (tmp_path / "l.gz").write_bytes(gzip.compress(b"\0\0\x08\x03" + labels[4:]))
    with pytest.raises(CorruptDataError) as e:
        readers.read_idx_pair(tmp_path / "i.gz", tmp_path / "l.gz")
    message = str(e.value)
    assert message.startswith(f"{tmp_path / 'l.gz'}: wrong IDX magic number 0x00000803 "
                              "(uint8, 3 dimensions), expected 0x00000801 (uint8, 1 dimension)")
    assert "not an IDX file of MNIST-format labels; replace it with the official file" in message
    assert "truncated" not in message
    write_idx(tmp_path / "real_l.gz", np.zeros((3,), np.uint8))
    with pytest.raises(CorruptDataError, match=r"real_l.gz: wrong IDX magic number 0x00000801 .*"
                                               r"expected 0x00000803 .* MNIST-format images"):
        readers.read_idx_pair(tmp_path / "real_l.gz", tmp_path / "i.gz")   # swapped
    (tmp_path / "z.gz").write_bytes(gzip.compress(b"\0\0\0\0" + labels[4:]))
    with pytest.raises(CorruptDataError, match=r"unsupported IDX magic number 0x00000000 "
                                               r"\(unknown type 0x00, 0 dimensions\)"):
        readers.read_idx(tmp_path / "z.gz")


def test_cifar10_binary_tarball(tmp_path):
    expected = write_cifar10_tar(tmp_path / "cifar-10-binary.tar.gz", per_batch=3, n_test=4)
    out = readers.read_cifar_binary_tar_all(tmp_path / "cifar-10-binary.tar.gz", "cifar10")
    for split in ("train", "test"):
        images, labels = out[split]
        assert images.dtype == np.uint8 and images.shape[1:] == (32, 32, 3)
        np.testing.assert_array_equal(images, expected[split][0])  # CHW -> HWC, record order
        np.testing.assert_array_equal(labels, expected[split][1])
    assert len(out["train"][0]) == 15  # 5 batches x 3, batches in order


def test_cifar100_uses_fine_labels(tmp_path):
    expected = write_cifar100_tar(tmp_path / "cifar-100-binary.tar.gz")
    images, labels = readers.read_cifar_binary_tar(tmp_path / "cifar-100-binary.tar.gz", "test",
                                                   "cifar100")
    np.testing.assert_array_equal(images, expected["test"][0])
    np.testing.assert_array_equal(labels, expected["test"][1])
    assert not np.array_equal(labels, expected["test"][2])


def test_cifar_tarball_errors(tmp_path):
    p = tmp_path / "cifar-10-binary.tar.gz"
    write_cifar10_tar(p)
    p.write_bytes(p.read_bytes()[:300])
    with pytest.raises(CorruptDataError, match="cannot read the tar"):
        readers.read_cifar_binary_tar(p, "train")
    with pytest.raises(CorruptDataError, match="not a whole number"):
        readers.parse_cifar_records(b"\x00" * 3000, 1, 0, "x")


def test_svhn_mat_maps_10_to_0(tmp_path):
    images, digits = write_svhn_mat(tmp_path / "test_32x32.mat", n=12)
    out_images, out_labels = readers.read_svhn_mat(tmp_path / "test_32x32.mat")
    np.testing.assert_array_equal(out_images, images)
    np.testing.assert_array_equal(out_labels, digits)
    assert out_labels.min() == 0 and out_labels.max() == 9
    (tmp_path / "bad.mat").write_bytes(b"MATLAB 5.0 MAT-file garbage")
    with pytest.raises(CorruptDataError):
        readers.read_svhn_mat(tmp_path / "bad.mat")


def test_npz_arrays(tmp_path):
    images = np.random.default_rng(0).integers(0, 256, (5, 32, 32, 3), dtype=np.uint8)
    write_npz(tmp_path / "a.npz", images, np.arange(5, dtype=np.uint8))
    out_images, out_labels = readers.read_arrays_npz(tmp_path / "a.npz")
    np.testing.assert_array_equal(out_images, images)
    assert out_labels.dtype == np.int32
    np.savez(tmp_path / "b.npz", x=images)
    with pytest.raises(CorruptDataError, match="'images' and 'labels'"):
        readers.read_arrays_npz(tmp_path / "b.npz")
    write_npz(tmp_path / "c.npz", images.astype(np.float32), np.arange(5))
    with pytest.raises(CorruptDataError, match="uint8"):
        readers.read_arrays_npz(tmp_path / "c.npz")


@pytest.mark.parametrize("layout", ["tar", "folder", "subfolder"])
def test_cifar10c_severities(tmp_path, layout):
    arrays = cifar10c_arrays(n=4)
    if layout == "tar":
        src = write_cifar10c_tar(tmp_path / "CIFAR-10-C.tar", arrays)
    elif layout == "folder":
        src = write_cifar10c_folder(tmp_path / "c", arrays)
    else:
        write_cifar10c_folder(tmp_path / "c" / "CIFAR-10-C", arrays)
        src = tmp_path / "c"
    for severity in (1, 3, 5):
        images, labels = readers.read_cifar10c(src, "fog", severity)
        np.testing.assert_array_equal(images, arrays["fog.npy"][(severity - 1) * 4:severity * 4])
        np.testing.assert_array_equal(labels, arrays["labels.npy"][:4])
    with pytest.raises(ValueError):
        readers.read_cifar10c(src, "fog", 6)
