"""Small files written in the exact official formats, for the data tests.

- MNIST-family IDX (gzip): magic 0x00000803 / 0x00000801, big-endian dimensions, uint8 payload.
- CIFAR-10 `cifar-10-binary.tar.gz`: `cifar-10-batches-bin/data_batch_{1..5}.bin`,
  `test_batch.bin` (records: 1 label byte + 3072 CHW pixel bytes), `batches.meta.txt`.
- CIFAR-100 `cifar-100-binary.tar.gz`: `cifar-100-binary/{train,test}.bin` (records: coarse label
  byte, fine label byte, 3072 pixel bytes), `{coarse,fine}_label_names.txt`.
- SVHN `*_32x32.mat` (MATLAB v5): X 32 x 32 x 3 x N uint8, y N x 1 with digit 0 stored as 10.
- CIFAR-10-C `CIFAR-10-C.tar` (uncompressed): `CIFAR-10-C/<corruption>.npy` (5n x 32 x 32 x 3,
  severities 1..5 in order) and `CIFAR-10-C/labels.npy` (5n, the test labels repeated).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import hashlib
import io
import json
import struct
import tarfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from gedl_jax.data import registry
from gedl_jax.data.registry import FileSpec


def rng_images(rng: np.random.Generator, n: int, shape) -> np.ndarray:
    return rng.integers(0, 256, size=(n, *shape), dtype=np.uint8)


def idx_bytes(array: np.ndarray) -> bytes:
    array = np.asarray(array, np.uint8)
    magic = struct.pack(">BBBB", 0, 0, 0x08, array.ndim)
    dims = struct.pack(f">{array.ndim}I", *array.shape)
    return magic + dims + array.tobytes()


def write_idx(path: Path, array: np.ndarray, compress: bool = True) -> Path:
    data = idx_bytes(array)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data, mtime=0) if compress else data)
    return path


def write_mnist_folder(folder: Path, n_train: int = 50, n_test: int = 20, seed: int = 0,
                       splits=("train", "test"), num_classes: int = 10
                       ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The four official MNIST file names; returns split -> (images N x 28 x 28, labels)."""
    rng = np.random.default_rng(seed)
    out = {}
    for split, n in (("train", n_train), ("test", n_test)):
        if split not in splits:
            continue
        prefix = "train" if split == "train" else "t10k"
        images = rng_images(rng, n, (28, 28))
        labels = (np.arange(n) % num_classes).astype(np.uint8)
        rng.shuffle(labels)
        write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", images)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", labels)
        out[split] = (images, labels)
    return out


def cifar_records(images_NxHxWxC: np.ndarray, labels: list[np.ndarray]) -> bytes:
    chw = np.asarray(images_NxHxWxC, np.uint8).transpose(0, 3, 1, 2).reshape(len(images_NxHxWxC),
                                                                             -1)
    cols = [np.asarray(lab, np.uint8)[:, None] for lab in labels]
    return np.concatenate([*cols, chw], axis=1).tobytes()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 1244148411
    tar.addfile(info, io.BytesIO(data))


def _add_dir(tar: tarfile.TarFile, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = 0o755
    tar.addfile(info)


def write_cifar10_tar(path: Path, per_batch: int = 4, n_test: int = 6, seed: int = 0):
    """cifar-10-binary.tar.gz; returns split -> (images N x 32 x 32 x 3, labels) in record order."""
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    train_i, train_l = [], []
    with tarfile.open(path, "w:gz") as tar:
        _add_dir(tar, "cifar-10-batches-bin")
        names = "airplane automobile bird cat deer dog frog horse ship truck".split()
        _add(tar, "cifar-10-batches-bin/batches.meta.txt", ("\n".join(names) + "\n\n").encode())
        for b in range(1, 6):
            images = rng_images(rng, per_batch, (32, 32, 3))
            labels = rng.integers(0, 10, per_batch).astype(np.uint8)
            _add(tar, f"cifar-10-batches-bin/data_batch_{b}.bin", cifar_records(images, [labels]))
            train_i.append(images)
            train_l.append(labels)
        test_i = rng_images(rng, n_test, (32, 32, 3))
        test_l = rng.integers(0, 10, n_test).astype(np.uint8)
        _add(tar, "cifar-10-batches-bin/test_batch.bin", cifar_records(test_i, [test_l]))
        _add(tar, "cifar-10-batches-bin/readme.html", b"<meta>")
    return {"train": (np.concatenate(train_i), np.concatenate(train_l)), "test": (test_i, test_l)}


def write_cifar100_tar(path: Path, n_train: int = 12, n_test: int = 5, seed: int = 0):
    """cifar-100-binary.tar.gz; returns split -> (images, fine labels, coarse labels)."""
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    out = {}
    with tarfile.open(path, "w:gz") as tar:
        _add_dir(tar, "cifar-100-binary")
        _add(tar, "cifar-100-binary/coarse_label_names.txt",
             "\n".join(f"c{i}" for i in range(20)).encode())
        _add(tar, "cifar-100-binary/fine_label_names.txt",
             "\n".join(f"f{i}" for i in range(100)).encode())
        for split, n in (("train", n_train), ("test", n_test)):
            images = rng_images(rng, n, (32, 32, 3))
            fine = rng.integers(0, 100, n).astype(np.uint8)
            coarse = (fine // 5).astype(np.uint8)
            _add(tar, f"cifar-100-binary/{split}.bin", cifar_records(images, [coarse, fine]))
            out[split] = (images, fine, coarse)
    return out


def write_svhn_mat(path: Path, n: int = 7, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """An SVHN `*_32x32.mat`; returns (images N x 32 x 32 x 3, digits 0..9)."""
    import scipy.io

    rng = np.random.default_rng(seed)
    images = rng_images(rng, n, (32, 32, 3))
    digits = (np.arange(n) % 10).astype(np.uint8)
    stored = np.where(digits == 0, 10, digits).astype(np.uint8)[:, None]
    path.parent.mkdir(parents=True, exist_ok=True)
    scipy.io.savemat(str(path), {"X": np.ascontiguousarray(images.transpose(1, 2, 3, 0)),
                                 "y": stored})
    return images, digits


def cifar10c_arrays(n: int = 4, seed: int = 0, stems=("fog", "glass_blur")):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n).astype(np.uint8)
    arrays = {f"{s}.npy": rng_images(rng, 5 * n, (32, 32, 3)) for s in stems}
    arrays["labels.npy"] = np.tile(labels, 5)
    return arrays


def _npy_bytes(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def write_cifar10c_tar(path: Path, arrays: dict[str, np.ndarray]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        _add_dir(tar, "CIFAR-10-C")
        for name, a in arrays.items():
            _add(tar, f"CIFAR-10-C/{name}", _npy_bytes(a))
    return path


def write_cifar10c_folder(folder: Path, arrays: dict[str, np.ndarray]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, a in arrays.items():
        np.save(folder / name, a)
    return folder


def write_npz(path: Path, images: np.ndarray, labels: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, images=images, labels=labels)
    return path


def specs_for(folder: Path, names) -> dict[str, FileSpec]:
    """FileSpecs matching the files as written (to register small fixture files in tests)."""
    out = {}
    for name in names:
        data = (folder / name).read_bytes()
        out[name] = FileSpec(name, len(data), hashlib.sha256(data).hexdigest(),
                             f"https://example.invalid/{name}", "test fixture")
    return out


def learnable_images(labels: np.ndarray, seed: int = 0, pattern: str = "grid") -> np.ndarray:
    """uint8 images N x 28 x 28 with a class signal a small ConvNet learns in a few steps: noise
    in [0, 32) plus, for class k, a bright 10 x 5 block at cell k of a 2 x 5 grid ("grid"), or
    of the transposed grid ("transposed": another dataset, for OOD sets)."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 32, size=(len(labels), 28, 28), dtype=np.uint8)
    for k in np.unique(labels):
        r, c = divmod(int(k), 5)
        rows, cols = slice(2 + 12 * r, 12 + 12 * r), slice(1 + 5 * c, 6 + 5 * c)
        if pattern == "transposed":
            rows, cols = cols, rows
        images[labels == k, rows, cols] = 255
    return images


def write_learnable_mnist_folder(folder: Path, n_train: int = 400, n_test: int = 100,
                                 seed: int = 0, pattern: str = "grid",
                                 splits=("train", "test")) -> dict[str, tuple[np.ndarray,
                                                                              np.ndarray]]:
    """The four official MNIST-family IDX gz files (`write_mnist_folder`'s names and format),
    with balanced labels and `learnable_images`; returns split -> (images, labels)."""
    out = {}
    for i, (split, n) in enumerate((("train", n_train), ("test", n_test))):
        if split not in splits:
            continue
        prefix = "train" if split == "train" else "t10k"
        labels = np.random.default_rng(seed + 100 * i).permutation(np.arange(n) % 10)
        labels = labels.astype(np.uint8)
        images = learnable_images(labels, seed=seed + 100 * i + 1, pattern=pattern)
        write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", images)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", labels)
        out[split] = (images, labels)
    return out


# ----------------------------------------------------------- a generated data folder (tests)
# Sizes: the training-mechanics runs take 256 training + 64 validation examples of the 400.
GENERATED_SETS = {"mnist": "grid", "kmnist": "transposed", "fashion_mnist": "transposed"}
SPECS_FILE = "fixture_file_specs.json"


@dataclasses.dataclass(frozen=True)
class GeneratedData:
    """A data folder of generated official-format files and the FileSpecs that register them."""

    root: Path
    specs: dict[str, dict[str, registry.FileSpec]]

    @contextlib.contextmanager
    def registered(self) -> Iterator[Path]:
        """Within: the generated files verify as the official ones (sizes and sha256)."""
        with contextlib.ExitStack() as stack:
            for name, specs in self.specs.items():
                stack.enter_context(registry.override_file_specs(name, "official", specs))
            yield self.root


def write_generated_data(root: Path, seed: int = 0) -> GeneratedData:
    """MNIST (train 400, test 100; `learnable_images` "grid") and KMNIST / Fashion-MNIST
    (train 40, test 100; "transposed": the OOD sets) in the official IDX gz files, plus
    `<root>/fixture_file_specs.json` for subprocesses (tests/fixture_cli.py)."""
    specs = {}
    for i, (name, pattern) in enumerate(GENERATED_SETS.items()):
        n_train = 400 if name == "mnist" else 40
        write_learnable_mnist_folder(root / name, n_train, 100, seed=seed + 1000 * i,
                                     pattern=pattern)
        names = [p.name for p in sorted((root / name).iterdir())]
        specs[name] = specs_for(root / name, names)
    (root / SPECS_FILE).write_text(json.dumps(
        {name: [dataclasses.asdict(s) for s in by_file.values()] for name, by_file in
         specs.items()}))
    return GeneratedData(root, specs)


def write_generated_cifar10(root: Path, per_batch: int = 4, n_test: int = 4,
                            seed: int = 0) -> GeneratedData:
    """A data folder holding a generated CIFAR-10 in its official binary tarball
    (`write_cifar10_tar`: 5 x `per_batch` training images, random pixels and labels) and the
    FileSpec that registers it, for training the cifar10 preset's VGG16 on it."""
    write_cifar10_tar(root / "cifar10" / "cifar-10-binary.tar.gz", per_batch, n_test, seed)
    return GeneratedData(root, {"cifar10": specs_for(root / "cifar10",
                                                      ["cifar-10-binary.tar.gz"])})
