"""`images:<folder>` OOD sets against torchvision's transforms, pixel for pixel.

`gedl_jax.data.image_folder` sizes an image folder to the model's input with Pillow. Its "crop"
reading is meant to be torchvision's `Resize(s)` + `CenterCrop(s)` on a PIL image (OpenOOD's
test transform) and "stretch" `Resize((s, s))`, after the mode conversion torchvision's
ImageFolder loader does (`pil_loader`: `convert("RGB")`, then `Grayscale()` for a 1-channel
model). This script writes images of many sizes, modes and formats into a folder, loads it with
`image_folder.load_ood` for a 32 x 32 x 3 and a 28 x 28 x 1 model in both modes, runs the
torchvision pipeline on the same files and prints how many pixels differ.

Needs torchvision (not a dependency of gedl-jax):

    pip install torch torchvision
    python -m studies.image_folder_vs_torchvision [--num_images=300] [--seed=0] [--out=FILE.md]

Exit status 0 when every pixel agrees, 1 otherwise. The last run's table:
docs/results/image_folder_vs_torchvision.md.
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

MODES = ("RGB", "L", "RGBA", "P")
FORMATS = ("png", "jpg", "bmp", "webp")
TARGETS = ((32, 32, 3), (28, 28, 1))


def _image(rng: np.random.Generator, mode: str) -> Image.Image:
    """Random size (4..160 a side, landscape, portrait, square and the targets' own sizes) and
    content: a smooth gradient plus noise, so resampling has something to get wrong."""
    w, h = (int(rng.choice([32, 28])),) * 2 if rng.random() < 0.15 else \
        tuple(int(v) for v in rng.integers(4, 161, 2))
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([(xx * 255 // max(w - 1, 1)), (yy * 255 // max(h - 1, 1)),
                     ((xx + yy) * 127 // max(w + h - 2, 1))], axis=-1)
    pixels = np.clip(base + rng.integers(-40, 41, (h, w, 3)), 0, 255).astype(np.uint8)
    image = Image.fromarray(pixels, "RGB")
    if mode == "P":
        return image.convert("P", palette=Image.Palette.ADAPTIVE, colors=64)
    if mode == "RGBA":
        alpha = rng.integers(0, 256, (h, w, 1), dtype=np.uint8)
        return Image.fromarray(np.concatenate([pixels, alpha], axis=-1), "RGBA")
    return image.convert(mode)


def write_folder(root: Path, num_images: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    kinds = []
    for i in range(num_images):
        mode, fmt = MODES[i % len(MODES)], FORMATS[(i // len(MODES)) % len(FORMATS)]
        if fmt == "jpg" and mode in ("RGBA", "P"):   # JPEG has neither
            fmt = "png"
        if fmt == "bmp" and mode == "RGBA":
            fmt = "png"
        _image(rng, mode).save(root / f"{i:04d}.{fmt}")
        kinds.append(f"{mode}/{fmt}")
    return kinds


def torchvision_images(files: list[Path], target: tuple[int, int, int], resize: str
                       ) -> np.ndarray:
    from torchvision import transforms
    from torchvision.datasets.folder import pil_loader

    h, w, c = target
    steps = [transforms.Grayscale(1)] if c == 1 else []
    steps += ([transforms.Resize(h), transforms.CenterCrop(h)] if resize == "crop" else
              [transforms.Resize((h, w))])
    pipeline = transforms.Compose(steps)
    out = [np.asarray(pipeline(pil_loader(str(f))), np.uint8) for f in files]
    return np.stack([o.reshape(h, w, c) for o in out])


def _commit() -> str:
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True, cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num_images", type=int, default=300,
                        help="images of random sizes, modes and formats written and compared")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the images' sizes, modes and pixels")
    parser.add_argument("--out", default="", help="also write the table to this markdown file")
    args = parser.parse_args(argv)
    import PIL
    import torchvision

    from gedl_jax.data import image_folder

    command = " ".join(["python -m studies.image_folder_vs_torchvision", *(argv or sys.argv[1:])])
    lines = ["# `images:<folder>` OOD sets against torchvision's transforms", "",
             f"Command: `{command}` (commit {_commit()}, {_cpu()}).", "",
             f"torchvision {torchvision.__version__}, Pillow {PIL.__version__}, numpy "
             f"{np.__version__}, Python {platform.python_version()}; {args.num_images} images "
             f"(seed {args.seed}) of modes {', '.join(MODES)} in {', '.join(FORMATS)}, sizes "
             f"4-160 a side and the targets' own", "",
             "| model input | image_resize | torchvision pipeline | images differing | "
             "pixels differing | max abs diff |", "|---|---|---|---|---|---|"]
    worst = 0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "ood"
        root.mkdir()
        write_folder(root, args.num_images, args.seed)
        files = image_folder.list_images(root)
        for target in TARGETS:
            for resize in image_folder.RESIZE_MODES:
                ours = image_folder.load_ood(root, target, resize, cache_dir=Path(tmp) / "c")
                theirs = torchvision_images(files, target, resize)
                diff = np.abs(ours.images.astype(np.int16) - theirs.astype(np.int16))
                pipeline = ("pil_loader" + (", Grayscale(1)" if target[2] == 1 else "") +
                            (f", Resize({target[0]}), CenterCrop({target[0]})" if resize == "crop"
                             else f", Resize(({target[0]}, {target[1]}))"))
                lines.append(
                    f"| {target[0]} x {target[1]} x {target[2]} | {resize} | {pipeline} | "
                    f"{int((diff.reshape(len(diff), -1).max(1) > 0).sum())} / {len(diff)} | "
                    f"{(diff > 0).mean():.5%} | {int(diff.max())} |")
                worst = max(worst, int(diff.max()))
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if worst == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
