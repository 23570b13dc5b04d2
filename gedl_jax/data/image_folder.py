"""Folders of image files (PNG, JPEG, ...) as data: `images:<folder>`.

    ood = data.image_folder.load_ood("textures/", like=splits["train"])   # any image sizes
    ds = data.image_folder.load_dataset("my_images/")    # train/ and test/ class folders

**An OOD set** (`--config.ood_datasets=images:<folder>`, `evaluate --extra_ood=images:<folder>`) is
every image file under the folder, at any depth, in the order of their relative paths (sorted,
so the order, and with it `config.eval_examples`' subset, does not depend on the filesystem);
its labels are zeros. Each image is made the in-distribution examples' shape (H, W, C):
1. its mode is converted with Pillow, to "L" for C = 1 (ITU-R 601-2 luma) or "RGB" for C = 3
   (alpha dropped, a palette expanded), as torchvision's `pil_loader` does;
2. an image of another size is resized with Pillow's bilinear filter (antialiased when it
   shrinks), by `resize`:
   - "crop" (the default): scaled, aspect kept, to the smallest size that covers H x W, then
     cut to its centre H x W. For a square H = W = s this is torchvision's
     `Resize(s) + CenterCrop(s)` on a PIL image, OpenOOD's test transform (`crop_box`);
   - "stretch": resized to H x W directly (`Resize((H, W))`), the aspect ratio not kept.
   An image of the right size is taken as it is, pixel for pixel. Both modes equal
   torchvision's pipelines pixel for pixel (`python -m studies.image_folder_vs_torchvision`).

**A dataset** (`--config.dataset=images:<folder>`) is the ImageFolder layout: `<folder>/train/
<class>/...` and `<folder>/test/<class>/...`, optionally `<folder>/val/<class>/...` (else the
validation split is cut from train, as for the other own data). The classes are the train
folder's subfolders in sorted order (label k = the k-th name, torchvision's ImageFolder rule),
K their number; a test or val class folder must be one of them. Every image of a dataset must
have one size (the in-distribution images are never resized; resize them beforehand), and C is 1
when every training image is grayscale ("1", "L" or "LA"), else 3.

Files: the suffixes torchvision's ImageFolder takes (`IMAGE_SUFFIXES`, any case); entries whose
name starts with "." (e.g. macOS's "._x.jpg") are skipped; symbolic links are followed. A
multi-frame file gives its first frame; images of 16-bit or floating pixels are refused (one
line: convert them to 8 bits), as is a file Pillow cannot decode (it is named).

Decoded arrays are cached (`cache.cached`, the cache folder of the other datasets) keyed by every
file's relative path, size, modification and change times, the target shape and resize mode,
and Pillow's version: a second run reads one .npz instead of decoding again, and any changed,
added or removed file decodes the set again. Decoding shows a progress bar (images, rate, ETA)
past 2,000 images.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from gedl_jax.data import cache as cache_lib
from gedl_jax.data.arrays import Split, subset_indices
from gedl_jax.data.errors import CorruptDataError, MissingDataError
from gedl_jax.data.registry import IMAGES_PREFIX

PREFIX = IMAGES_PREFIX   # `--config.dataset=images:<folder>`, `--config.ood_datasets=...`
# torchvision.datasets.folder.IMG_EXTENSIONS
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
RESIZE_MODES = ("crop", "stretch")
SPLIT_FOLDERS = {"train": ("train",), "test": ("test",), "validation": ("val", "validation")}
_GRAY_MODES = ("1", "L", "LA")
_DEEP_MODES = ("I", "F", "I;16", "I;16B", "I;16L", "I;16N")   # more than 8 bits a pixel
_PROGRESS_MIN_IMAGES = 2000
_MAX_DECODE_THREADS = 16
_CACHE_DATASET = "image_folders"


def parse_spec(text) -> Path | None:
    """The folder of "images:<folder>", else None (not this kind of name)."""
    text = str(text)
    if not text.startswith(PREFIX):
        return None
    folder = text[len(PREFIX):].strip()
    if not folder:
        raise ValueError(f"{text!r}: expected 'images:<folder of image files>'")
    return Path(folder).expanduser()


def _visible(name: str) -> bool:
    return not name.startswith(".")


def list_images(root: Path) -> list[Path]:
    """Every image file under `root` (module docstring), sorted by relative path."""
    found = []
    for folder, subfolders, names in os.walk(root, followlinks=True):
        subfolders[:] = [d for d in subfolders if _visible(d)]
        found += [Path(folder, n) for n in names
                  if _visible(n) and n.lower().endswith(IMAGE_SUFFIXES)]
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def crop_box(size_wh: tuple[int, int], target_hw: tuple[int, int], resize: str = "crop"
             ) -> tuple[tuple[int, int], tuple[int, int, int, int]]:
    """((width, height) to resize an image of `size_wh` to, (left, top, right, bottom) of the
    box then cut out) to give `target_hw`.

    "crop": the binding side is the one whose scale factor is larger; it becomes the target's,
    the other side int(target * other / binding), truncated as torchvision's Resize does (it is
    never below its target: the scale covers it). The box is centred with offsets
    int(round((resized - target) / 2)), torchvision's `center_crop` (round half to even).
    "stretch": the target size, the whole image.

    >>> crop_box((64, 48), (32, 32))     # landscape: height binds, 42 x 32, cut 5 on the left
    ((42, 32), (5, 0, 37, 32))
    >>> crop_box((48, 64), (32, 32), "stretch")
    ((32, 32), (0, 0, 32, 32))
    """
    (w, h), (th, tw) = (int(s) for s in size_wh), (int(s) for s in target_hw)
    if resize not in RESIZE_MODES:
        raise ValueError(f"resize={resize!r}: expected one of {RESIZE_MODES}")
    if resize == "stretch" or (w, h) == (tw, th):
        return (tw, th), (0, 0, tw, th)
    if tw * h >= th * w:   # tw / w >= th / h: the width binds
        new_w, new_h = tw, int(tw * h / w)
    else:
        new_w, new_h = int(th * w / h), th
    left, top = int(round((new_w - tw) / 2.0)), int(round((new_h - th) / 2.0))
    return (new_w, new_h), (left, top, left + tw, top + th)


def _open(path: Path):
    from PIL import Image, UnidentifiedImageError

    image = None
    try:
        image = Image.open(path)
        image.load()
    except Image.DecompressionBombError as e:   # Pillow's guard: over 2 x MAX_IMAGE_PIXELS
        raise CorruptDataError(f"{path}: {e} Downscale the image first (or, if you trust the "
                               f"file, raise PIL.Image.MAX_IMAGE_PIXELS)") from None
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        if image is not None:   # opened, then its pixels failed to decode (a truncated file)
            image.close()
        raise CorruptDataError(f"{path}: not a readable image ({type(e).__name__}: {e}); "
                               f"remove or replace the file") from None
    if image.mode in _DEEP_MODES:
        image.close()
        raise CorruptDataError(f"{path}: an image of mode {image.mode!r} (more than 8 bits a "
                               f"pixel); convert it to 8-bit grayscale or RGB first")
    return image


def decode(path: Path, channels: int, target_hw: tuple[int, int] | None = None,
           resize: str = "crop") -> np.ndarray:
    """One image file as uint8 (H, W, channels): mode converted, then (with `target_hw`)
    resized by `resize` (module docstring)."""
    from PIL import Image

    if channels not in (1, 3):
        raise ValueError(f"image folders give 1 or 3 channels, not {channels}")
    with _open(path) as image:
        image = image.convert("L" if channels == 1 else "RGB")
        if target_hw is not None and image.size != (target_hw[1], target_hw[0]):
            size, box = crop_box(image.size, target_hw, resize)
            image = image.resize(size, Image.Resampling.BILINEAR)
            if box != (0, 0) + size:
                image = image.crop(box)
        pixels = np.asarray(image, dtype=np.uint8)
    return pixels.reshape(pixels.shape[0], pixels.shape[1], channels)


def _stat_key(root: Path, files: Sequence[Path]) -> list[tuple[str, str]]:
    out = []
    for f in files:
        s = f.stat()
        out.append((f.relative_to(root).as_posix(),
                    f"{s.st_size}:{s.st_mtime_ns}:{s.st_ctime_ns}"))
    return out


def _pillow() -> str:
    import PIL

    return PIL.__version__


def _decode_all(files: Sequence[Path], channels: int, target_hw, resize: str,
                label: str) -> np.ndarray:
    from tqdm import tqdm

    first = decode(files[0], channels, target_hw, resize)
    images = np.empty((len(files),) + first.shape, np.uint8)
    images[0] = first
    # Pillow releases the GIL while it decodes and resamples: threads use every core
    workers = max(1, min(_MAX_DECODE_THREADS, os.cpu_count() or 1))
    pool = concurrent.futures.ThreadPoolExecutor(workers)
    try:
        with tqdm(total=len(files), initial=1, unit="img", desc=f"decoding {label}",
                  disable=len(files) < _PROGRESS_MIN_IMAGES, file=sys.stderr,
                  mininterval=0.5 if sys.stderr.isatty() else 10.0, leave=True) as bar:
            decoded = pool.map(lambda f: decode(f, channels, target_hw, resize), files[1:])
            for i, (f, image) in enumerate(zip(files[1:], decoded, strict=True), start=1):
                if image.shape != first.shape:   # only without target_hw (a dataset's split)
                    raise CorruptDataError(
                        f"{f}: an image of {image.shape[1]} x {image.shape[0]} pixels: every "
                        f"image of a dataset must have one size (resize them beforehand)\n"
                        f"  {files[0]} has {first.shape[1]} x {first.shape[0]}")
                images[i] = image
                bar.update(1)
    finally:   # an error (or Ctrl-C) does not wait for the files still queued
        pool.shutdown(wait=True, cancel_futures=True)
    return images


def _entry(root: Path, stat_key: list[tuple[str, str]], channels: int, target_hw,
           resize: str, split: str, cache_dir) -> Path:
    """The cache file of one decoded split (`_stat_key` of its files)."""
    shape = "x".join(map(str, target_hw)) if target_hw else "own_size"
    tag = f"{root.name or 'root'}_{split}_{shape}x{channels}_{resize if target_hw else 'none'}"
    # Pillow's version too: its resampling may change a pixel between releases
    return cache_lib.entry_path(cache_lib.resolve_cache_dir(cache_dir), _CACHE_DATASET, tag,
                                "images", stat_key + [(" pillow", _pillow())])


def _cached_images(root: Path, files: Sequence[Path], channels: int, target_hw, resize: str,
                   split: str, cache_dir, stat_key: list[tuple[str, str]] | None = None
                   ) -> tuple[np.ndarray, bool]:
    stat_key = _stat_key(root, files) if stat_key is None else stat_key
    entry = _entry(root, stat_key, channels, target_hw, resize, split, cache_dir)
    labels_unused = np.zeros(len(files), np.int32)
    images, _, hit = cache_lib.cached(
        entry, lambda: (_decode_all(files, channels, target_hw, resize, f"{root}/{split}"),
                        labels_unused),
        {"folder": str(root), "split": split, "num_files": len(files), "resize": resize,
         "channels": channels, "target_hw": list(target_hw) if target_hw else None})
    return images, hit


def _existing_folder(root: Path, what: str) -> Path:
    if not root.is_dir():
        raise MissingDataError(f"{what} {root}: no such folder (images:<folder> names a folder "
                               f"of image files)")
    return root


def load_ood(folder, like: Split | tuple[int, ...], resize: str = "crop", cache_dir=None,
             name: str | None = None, num_examples: int = 0) -> Split:
    """The OOD set of every image under `folder`, made the shape of `like` (the in-distribution
    training Split, or its (H, W, C)) by `resize` (module docstring); uint8, labels zeros.
    `num_examples` > 0: only the evenly spaced files `Split.subset(num_examples)` would keep
    are decoded (a smoke run's `config.eval_examples` on a large folder), the same examples."""
    root = _existing_folder(Path(folder).expanduser(), "OOD image folder")
    if resize not in RESIZE_MODES:
        raise ValueError(f"resize={resize!r}: expected one of {RESIZE_MODES}")
    shape = tuple(like.image_shape if isinstance(like, Split) else like)
    if len(shape) != 3 or shape[2] not in (1, 3):
        raise ValueError(f"OOD image folder {root}: the in-distribution examples have shape "
                         f"{shape}; image folders give (H, W, 1) or (H, W, 3) images")
    files = list_images(root)
    if not files:
        raise MissingDataError(f"OOD image folder {root} holds no image files (suffixes "
                               f"{', '.join(IMAGE_SUFFIXES)})")
    if 0 < num_examples < len(files):   # Split.subset's positions
        files = [files[i] for i in subset_indices(len(files), num_examples)]
    images, hit = _cached_images(root, files, shape[2], shape[:2], resize, "ood", cache_dir)
    return Split(images, np.zeros(len(files), np.int32), name or f"{root.name}/images",
                 "image_folder+cache" if hit else "image_folder")


@dataclasses.dataclass(frozen=True, eq=False)
class ImageFolderDataset:
    """A checked image-folder dataset (`validation` None: cut from `train`)."""

    root: Path
    train: Split
    test: Split
    validation: Split | None
    class_names: tuple[str, ...]

    @property
    def num_classes(self) -> int:
        return len(self.class_names)


def _split_folder(root: Path, split: str) -> Path | None:
    found = [root / n for n in SPLIT_FOLDERS[split] if (root / n).is_dir()]
    if len(found) > 1:
        raise CorruptDataError(f"{root}: both {found[0].name}/ and {found[1].name}/; keep one "
                               f"validation folder")
    return found[0] if found else None


def _class_files(folder: Path, classes: Sequence[str] | None
                 ) -> tuple[tuple[str, ...], list[Path], np.ndarray]:
    is_train = classes is None
    names = sorted(d.name for d in folder.iterdir() if d.is_dir() and _visible(d.name))
    if not names:
        raise CorruptDataError(f"{folder}: no class folders; the layout is {folder}/<class>/"
                               f"<image files>")
    if classes is not None:
        unknown = [n for n in names if n not in classes]
        if unknown:
            raise CorruptDataError(f"{folder}: class folder(s) {unknown} are not among the "
                                   f"training classes {list(classes)}")
    classes = tuple(classes if classes is not None else names)
    files, labels = [], []
    for n in names:
        in_class = list_images(folder / n)
        if not in_class and is_train:
            raise CorruptDataError(f"{folder / n}: a training class without image files")
        files += in_class
        labels += [classes.index(n)] * len(in_class)
    if not files:
        raise CorruptDataError(f"{folder}: no image files in its class folders")
    return classes, files, np.asarray(labels, np.int32)


def _is_gray(path: Path) -> bool:
    from PIL import Image

    try:
        with Image.open(path) as image:   # the header only: no pixels are decoded
            return image.mode in _GRAY_MODES
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        _open(path)   # raises the error that names the file
        raise


def _channels(root: Path, files: Sequence[Path], stat_key: list[tuple[str, str]],
              cache_dir) -> int:
    """1 when every training image is grayscale, else 3. A cached training split of exactly
    one channel count answers without opening a file: its key covers every file's size and
    times, so the same files give the same answer. Else every header is read (in threads: on
    a large folder this is file-system latency, not CPU)."""
    cached = [c for c in (1, 3)
              if _entry(root, stat_key, c, None, "crop", "train", cache_dir).is_file()]
    if len(cached) == 1:
        return cached[0]
    workers = max(1, min(_MAX_DECODE_THREADS, os.cpu_count() or 1))
    pool = concurrent.futures.ThreadPoolExecutor(workers)
    try:   # in file order: the first colour image answers, the first bad file is named
        return 1 if all(pool.map(_is_gray, files)) else 3
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def load_dataset(folder, cache_dir=None) -> ImageFolderDataset:
    """The dataset of an ImageFolder layout (module docstring)."""
    root = _existing_folder(Path(folder).expanduser(), "image folder dataset")
    train_folder, test_folder = _split_folder(root, "train"), _split_folder(root, "test")
    if train_folder is None or test_folder is None:
        raise MissingDataError(f"image folder dataset {root}: needs train/ and test/ "
                               f"subfolders, each with one folder of images per class")
    classes, train_files, train_labels = _class_files(train_folder, None)
    train_key = _stat_key(root, train_files)
    channels = _channels(root, train_files, train_key, cache_dir)
    splits: dict[str, Split] = {}
    shape = None
    for split, split_folder in (("train", train_folder), ("test", test_folder),
                                ("validation", _split_folder(root, "validation"))):
        if split_folder is None:
            continue
        _, files, labels = ((classes, train_files, train_labels) if split == "train" else
                            _class_files(split_folder, classes))
        images, hit = _cached_images(root, files, channels, None, "crop", split, cache_dir,
                                     train_key if split == "train" else None)
        if shape is not None and images.shape[1:] != shape:
            raise CorruptDataError(f"{split_folder}: images of {images.shape[2]} x "
                                   f"{images.shape[1]} pixels: every image of a dataset must "
                                   f"have one size (resize them first)\n"
                                   f"  the training images have {shape[1]} x {shape[0]}")
        shape = images.shape[1:]
        splits[split] = Split(images, labels, f"{root.name}/{split}",
                              "image_folder+cache" if hit else "image_folder")
    return ImageFolderDataset(root, splits["train"], splits["test"], splits.get("validation"),
                              classes)


def is_image_folder(name) -> bool:
    """Whether `name` is "images:<folder>"."""
    return str(name).startswith(PREFIX)


__all__ = ["IMAGE_SUFFIXES", "PREFIX", "RESIZE_MODES", "ImageFolderDataset", "crop_box",
           "decode", "is_image_folder", "list_images", "load_dataset", "load_ood", "parse_spec"]
