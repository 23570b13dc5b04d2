"""The last layer's GGN by our closed form (`evaluation.laplace.last_layer_ggn`) and by laplax
(`methods.laplace.laplax_last_layer_ggn`, the `laplace` method's `curvature="laplax"`): the
largest difference and each one's wall time, on seeded random features of the MNIST ConvNet's
size (48,000 training images, 64 features, 10 classes; the GGN does not depend on what the
features mean, only on their values). Needs `pip install laplax`.

    python -m studies.laplace_vs_laplax [--examples=48000] [--features=64] [--repeats=3]

Prints one line per implementation (the median of `--repeats` timed calls after one untimed
call, which compiles laplax's program) and the largest absolute and relative difference.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import numpy as np


def _timed(fn, repeats: int) -> tuple[np.ndarray, float]:
    out = fn()   # untimed: laplax compiles here
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return out, statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=48_000,
                        help="rows of random features (training images; default 48,000)")
    parser.add_argument("--features", type=int, default=64,
                        help="the last layer's input features (default 64)")
    parser.add_argument("--classes", type=int, default=10, help="classes (default 10)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed calls after one untimed one; each time is their median")
    args = parser.parse_args(argv)

    import jax

    from gedl_jax.evaluation import laplace
    from gedl_jax.methods.laplace import laplax_last_layer_ggn

    rng = np.random.default_rng(0)
    features = np.abs(rng.normal(size=(args.examples, args.features)))   # post-ReLU features
    weight = rng.normal(size=(args.features, args.classes)) * 0.3
    bias = rng.normal(size=args.classes)
    ours, t_ours = _timed(lambda: laplace.last_layer_ggn(features, weight, bias), args.repeats)
    theirs, t_laplax = _timed(lambda: laplax_last_layer_ggn(features, weight, bias),
                              args.repeats)
    diff = np.abs(ours - theirs).max()
    print(f"{args.examples} examples x {args.features} features, {args.classes} classes "
          f"(a {ours.shape[0]} x {ours.shape[1]} GGN); {os.cpu_count()} CPU cores "
          f"({platform.machine()}), jax {jax.__version__}, median of {args.repeats}")
    print(f"closed form (NumPy float64): {t_ours:.2f} s")
    print(f"laplax (float64):            {t_laplax:.2f} s ({t_laplax / t_ours:.1f}x)")
    print(f"largest difference: {diff:.2e} absolute, {diff / np.abs(ours).max():.2e} relative "
          f"to the largest entry")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
