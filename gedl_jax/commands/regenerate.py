"""Regenerate CIFAR-10-C from the CIFAR-10 test split into the data folder
(`gedl_jax.data.regeneration.regenerate_cifar10c`).

    python -m gedl_jax.data.regenerate --data_dir=D --corruptions=snow,brightness --seed=0
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from gedl_jax.data.errors import DataError
from gedl_jax.data.regeneration import (
    REGENERABLE,
    REGENERATED_FOLDER,
    RELEASE_SUBFOLDER,
    regenerate_cifar10c,
)

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gedl_jax.data.regenerate",
        description="Regenerate CIFAR-10-C from the CIFAR-10 test split (CIFAR-10-C's CIFAR "
                    "parameters; numpy/scipy/Pillow) into <data_dir>/"
                    f"{REGENERATED_FOLDER}/{RELEASE_SUBFOLDER}/.")
    parser.add_argument("--data_dir", default=None,
                        help="data folder holding (or receiving) cifar10/ (default: "
                             "$GEDL_DATA_DIR, else the default data folder under the user's "
                             "cache)")
    parser.add_argument("--corruptions", default="",
                        help="comma-separated TFDS names or file stems (default: all of "
                             f"{','.join(REGENERABLE)})")
    parser.add_argument("--seed", type=int, default=0, help="base seed (default 0)")
    parser.add_argument("--num_examples", type=int, default=0,
                        help="use N evenly spaced test images (default 0 = all 10,000)")
    parser.add_argument("--cache_dir", default=None, help="decoded-array cache folder")
    args = parser.parse_args(argv)
    names = [c.strip() for c in args.corruptions.split(",") if c.strip()] or None
    try:
        folder = regenerate_cifar10c(args.data_dir, corruptions=names, seed=args.seed,
                                     num_examples=args.num_examples, cache_dir=args.cache_dir)
    except (DataError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr, flush=True)
        return 2
    print(f"wrote {folder}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
