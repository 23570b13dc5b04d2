"""Readers of the official file formats, decoding to (images N x H x W x C uint8, labels N int32).

Each reader decodes exactly what the TFDS builder of the same dataset decodes from the same file,
in the same record order:
- IDX (MNIST, Fashion-MNIST, KMNIST; `.gz` or uncompressed): images N x 28 x 28 x 1.
- CIFAR-10 / CIFAR-100 binary tarballs: records of 1 (CIFAR-10) or 2 (CIFAR-100: coarse, fine)
  label bytes followed by 3072 CHW pixel bytes; CIFAR-100's label is the fine label.
- SVHN cropped MATLAB files: X is 32 x 32 x 3 x N, y is N x 1 with the digit 0 stored as 10 (-> 0).
- Decoded arrays (`.npz` with `images` and `labels`), the form the cache itself keeps.
- CIFAR-10-C: `<corruption>.npy` (50000 x 32 x 32 x 3: severities 1..5, 10000 each, in order) and
  `labels.npy`, either extracted or inside the official `CIFAR-10-C.tar`.

Readers raise CorruptDataError (naming the file) on anything that does not decode as expected.
"""

from __future__ import annotations

import gzip
import tarfile
import zlib
from pathlib import Path

import numpy as np

from gedl_jax.data.errors import CorruptDataError, MissingDataError

IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
CIFAR_RECORD_PIXELS = 3 * 32 * 32
CIFAR10_MEMBERS = {
    "train": tuple(f"cifar-10-batches-bin/data_batch_{i}.bin" for i in range(1, 6)),
    "test": ("cifar-10-batches-bin/test_batch.bin",),
}
CIFAR100_MEMBERS = {
    "train": ("cifar-100-binary/train.bin",),
    "test": ("cifar-100-binary/test.bin",),
}


def _read_maybe_gzip(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            head = f.read(2)
            f.seek(0)
            if head == b"\x1f\x8b":
                return gzip.GzipFile(fileobj=f).read()
            return f.read()
    except FileNotFoundError:
        raise MissingDataError(f"file not found: {path}") from None
    except (OSError, EOFError, zlib.error) as e:
        raise CorruptDataError(f"{path}: cannot decompress ({e}); the file is damaged or "
                               "truncated: replace it with the official file") from None


IDX_IMAGES_MAGIC = 0x00000803   # unsigned bytes, 3 dimensions (N x H x W): MNIST-format images
IDX_LABELS_MAGIC = 0x00000801   # unsigned bytes, 1 dimension (N): MNIST-format labels
_IDX_KIND = {IDX_IMAGES_MAGIC: "MNIST-format images", IDX_LABELS_MAGIC: "MNIST-format labels"}
_REPLACE = "replace it with the official file"


def _describe_magic(magic: int) -> str:
    type_code, ndim = (magic >> 8) & 0xFF, magic & 0xFF
    dtype = IDX_DTYPES.get(type_code)
    what = np.dtype(dtype).name if dtype is not None else f"unknown type 0x{type_code:02x}"
    return f"0x{magic:08x} ({what}, {ndim} dimension{'s' if ndim != 1 else ''})"


def parse_idx(data: bytes, origin: str = "<bytes>", expect_magic: int | None = None
              ) -> np.ndarray:
    """Decode the bytes of one IDX file (magic 0x0000TTNN: type TT, NN dimensions).

    expect_magic: the magic number the file must have (`IDX_IMAGES_MAGIC`, `IDX_LABELS_MAGIC`):
    another one is reported as a wrong magic number (a labels file where the images belong, a
    damaged header), not as a size mismatch further on."""
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise CorruptDataError(f"{origin}: not an IDX file (magic number "
                               f"{'0x' + data[:4].hex() if data else 'missing: the file is empty'}"
                               f"; an IDX file starts with 0x0000TTNN): {_REPLACE}")
    magic = int.from_bytes(data[:4], "big")
    if expect_magic is not None and magic != expect_magic:
        raise CorruptDataError(
            f"{origin}: wrong IDX magic number {_describe_magic(magic)}, expected "
            f"{_describe_magic(expect_magic)}: not an IDX file of "
            f"{_IDX_KIND.get(expect_magic, 'the expected type')}; {_REPLACE}")
    type_code, ndim = data[2], data[3]
    if type_code not in IDX_DTYPES or ndim == 0:
        raise CorruptDataError(f"{origin}: unsupported IDX magic number {_describe_magic(magic)}"
                               f": not an IDX file of a known type; {_REPLACE}")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise CorruptDataError(f"{origin}: IDX header truncated: {_REPLACE}")
    shape = tuple(int(d) for d in np.frombuffer(data, ">u4", count=ndim, offset=4))
    dtype = np.dtype(IDX_DTYPES[type_code])
    expected = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if len(data) - header != expected:
        raise CorruptDataError(f"{origin}: IDX payload is {len(data) - header} bytes, header "
                               f"{shape} says {expected}: the file is truncated or damaged; "
                               f"{_REPLACE}")
    return np.frombuffer(data, dtype, offset=header).reshape(shape)


def read_idx(path: str | Path, expect_magic: int | None = None) -> np.ndarray:
    """One IDX file (gzip-compressed or not) as a numpy array (`parse_idx`)."""
    path = Path(path)
    return parse_idx(_read_maybe_gzip(path), str(path), expect_magic)


def read_idx_pair(images_path: str | Path, labels_path: str | Path
                  ) -> tuple[np.ndarray, np.ndarray]:
    """MNIST-format images + labels -> (N x H x W x 1 uint8, N int32)."""
    images = read_idx(images_path, IDX_IMAGES_MAGIC)
    labels = read_idx(labels_path, IDX_LABELS_MAGIC)
    if len(images) != len(labels):
        raise CorruptDataError(f"{images_path} holds {len(images)} images but {labels_path} "
                               f"holds {len(labels)} labels")
    return np.ascontiguousarray(images[..., None]), labels.astype(np.int32)


def parse_cifar_records(data: bytes, label_bytes: int, label_index: int, origin: str
                        ) -> tuple[np.ndarray, np.ndarray]:
    """CIFAR binary records -> (N x 32 x 32 x 3 uint8 HWC, N int32)."""
    record = label_bytes + CIFAR_RECORD_PIXELS
    if len(data) == 0 or len(data) % record:
        raise CorruptDataError(f"{origin}: {len(data)} bytes is not a whole number of "
                               f"{record}-byte CIFAR records: the file is truncated or damaged")
    rows = np.frombuffer(data, np.uint8).reshape(-1, record)
    labels = rows[:, label_index].astype(np.int32)
    images = rows[:, label_bytes:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(images), labels


def read_cifar_binary_tar_all(path: str | Path, variant: str = "cifar10"
                              ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Decode both splits ("train", "test") of the official cifar-10-binary.tar.gz or
    cifar-100-binary.tar.gz (fine labels) in one pass, in the official record order."""
    path = Path(path)
    if variant == "cifar10":
        split_members, label_bytes, label_index = CIFAR10_MEMBERS, 1, 0
    elif variant == "cifar100":
        split_members, label_bytes, label_index = CIFAR100_MEMBERS, 2, 1
    else:
        raise ValueError(f"variant must be 'cifar10' or 'cifar100', got {variant!r}")
    wanted = {m for members in split_members.values() for m in members}
    found: dict[str, bytes] = {}
    try:
        with tarfile.open(path, "r:*") as tar:
            for member in tar:
                if member.name in wanted and member.isfile():
                    f = tar.extractfile(member)
                    assert f is not None
                    found[member.name] = f.read()
    except FileNotFoundError:
        raise MissingDataError(f"file not found: {path}") from None
    except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
        raise CorruptDataError(f"{path}: cannot read the tar archive ({e}); replace it with the "
                               "official file") from None
    missing = sorted(wanted - set(found))
    if missing:
        raise CorruptDataError(f"{path}: archive lacks {missing}: not the official {variant} "
                               "binary archive")
    out = {}
    for split, members in split_members.items():
        parts = [parse_cifar_records(found[m], label_bytes, label_index, f"{path}:{m}")
                 for m in members]
        out[split] = (np.concatenate([p[0] for p in parts]),
                      np.concatenate([p[1] for p in parts]))
    return out


def read_cifar_binary_tar(path: str | Path, split: str, variant: str = "cifar10"
                          ) -> tuple[np.ndarray, np.ndarray]:
    """Decode `split` ("train"/"test") of an official CIFAR binary tarball."""
    return read_cifar_binary_tar_all(path, variant)[split]


def read_svhn_mat(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """SVHN `*_32x32.mat` -> (N x 32 x 32 x 3 uint8, N int32 with 10 mapped to 0, as TFDS)."""
    import scipy.io  # only SVHN needs scipy

    path = Path(path)
    try:
        mat = scipy.io.loadmat(str(path), variable_names=("X", "y"))
    except FileNotFoundError:
        raise MissingDataError(f"file not found: {path}") from None
    except Exception as e:  # noqa: BLE001  (scipy raises several types for damaged files)
        raise CorruptDataError(f"{path}: cannot read the MATLAB file ({type(e).__name__}: {e}); "
                               "replace it with the official file") from None
    if "X" not in mat or "y" not in mat:
        raise CorruptDataError(f"{path}: MATLAB file lacks the 'X' and 'y' variables of SVHN")
    x, y = mat["X"], np.asarray(mat["y"]).reshape(-1)
    if x.ndim != 4 or x.shape[:3] != (32, 32, 3) or x.shape[3] != len(y):
        raise CorruptDataError(f"{path}: X has shape {x.shape}, y has {len(y)} labels; expected "
                               "32 x 32 x 3 x N and N")
    images = np.ascontiguousarray(np.transpose(x, (3, 0, 1, 2))).astype(np.uint8, copy=False)
    labels = (y.astype(np.int64) % 10).astype(np.int32)
    return images, labels


def read_arrays_npz(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Decoded arrays: an `.npz` with `images` (N x H x W x C or N x H x W, uint8) and `labels`
    (N integers)."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            if "images" not in z.files or "labels" not in z.files:
                raise CorruptDataError(f"{path}: expected arrays 'images' and 'labels', found "
                                       f"{z.files}")
            images, labels = z["images"], z["labels"]
    except FileNotFoundError:
        raise MissingDataError(f"file not found: {path}") from None
    except CorruptDataError:
        raise
    except Exception as e:  # noqa: BLE001  (zipfile/zlib/ValueError for damaged files)
        raise CorruptDataError(f"{path}: cannot read the npz arrays ({type(e).__name__}: {e})"
                               ) from None
    if images.ndim == 3:
        images = images[..., None]
    if images.ndim != 4 or images.dtype != np.uint8:
        raise CorruptDataError(f"{path}: 'images' must be N x H x W x C uint8, got "
                               f"{images.shape} {images.dtype}")
    labels = np.asarray(labels).reshape(-1)
    if len(labels) != len(images) or not np.issubdtype(labels.dtype, np.integer):
        raise CorruptDataError(f"{path}: 'labels' must be {len(images)} integers, got "
                               f"{labels.shape} {labels.dtype}")
    return np.ascontiguousarray(images), labels.astype(np.int32)


class _ReadOnly:
    """Hides a tar member's BufferedReader type, so numpy reads it with read() (not fileno())."""

    def __init__(self, f):
        self.read = f.read


def _load_npy(fileobj, origin: str) -> np.ndarray:
    try:
        return np.lib.format.read_array(fileobj, allow_pickle=False)
    except Exception as e:  # noqa: BLE001
        raise CorruptDataError(f"{origin}: cannot read the .npy array ({type(e).__name__}: {e})"
                               ) from None


def read_cifar10c_all(source: str | Path, file_stem: str) -> tuple[np.ndarray, np.ndarray]:
    """Every severity of one CIFAR-10-C corruption -> (5 x n x 32 x 32 x 3 uint8, n int32).

    `source` is the official `CIFAR-10-C.tar` or a folder holding the extracted `.npy` files
    (directly or in a `CIFAR-10-C/` subfolder). As in TFDS, the labels are the first n of
    `labels.npy` (the release repeats the test labels once per severity).
    """
    source = Path(source)
    name = f"{file_stem}.npy"
    if source.is_dir():
        folder = source / "CIFAR-10-C" if (source / "CIFAR-10-C").is_dir() else source
        arrays = {}
        for n in (name, "labels.npy"):
            p = folder / n
            if not p.is_file():
                raise MissingDataError(f"CIFAR-10-C file {p} not found")
            with open(p, "rb") as f:
                arrays[n] = _load_npy(f, str(p))
        origin = str(folder / name)
    else:
        wanted = {f"CIFAR-10-C/{name}": name, "CIFAR-10-C/labels.npy": "labels.npy"}
        arrays = {}
        try:
            with tarfile.open(source, "r:*") as tar:
                for member in tar:
                    if member.name in wanted and member.isfile():
                        f = tar.extractfile(member)
                        assert f is not None
                        arrays[wanted[member.name]] = _load_npy(_ReadOnly(f),
                                                                f"{source}:{member.name}")
                    if len(arrays) == 2:
                        break
        except FileNotFoundError:
            raise MissingDataError(f"file not found: {source}") from None
        except (tarfile.TarError, OSError, EOFError) as e:
            raise CorruptDataError(f"{source}: cannot read the tar archive ({e})") from None
        if len(arrays) != 2:
            raise CorruptDataError(f"{source}: archive lacks CIFAR-10-C/{name} or labels.npy")
        origin = f"{source}:CIFAR-10-C/{name}"
    images, labels = arrays[name], np.asarray(arrays["labels.npy"]).reshape(-1)
    if (images.ndim != 4 or images.shape[1:] != (32, 32, 3) or images.dtype != np.uint8
            or len(images) != len(labels) or len(images) % 5 or not len(images)):
        raise CorruptDataError(f"{origin}: expected 5n x 32 x 32 x 3 uint8 images and 5n labels, "
                               f"got {images.shape} {images.dtype} and {labels.shape}")
    n = len(images) // 5
    return (np.ascontiguousarray(images.reshape(5, n, 32, 32, 3)),
            labels[:n].astype(np.int32))


def read_cifar10c(source: str | Path, file_stem: str, severity: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """One corruption at one severity (1..5) of CIFAR-10-C -> (n x 32 x 32 x 3 uint8, n int32)."""
    if severity not in (1, 2, 3, 4, 5):
        raise ValueError(f"severity must be 1..5, got {severity}")
    images, labels = read_cifar10c_all(source, file_stem)
    return images[severity - 1].copy(), labels
