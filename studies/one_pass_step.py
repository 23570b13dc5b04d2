"""DAEDL's and F-EDL's train step on a user network: one forward pass per step, or two.

Both methods read a network's features and its logits. A user network with
`features_and_logits` (the built-in "resnet18" and "mlp" have it) runs once per step; one
without it runs twice (`features`, then `__call__`). This script times the real train step
(`gedl_jax.run.step_benchmark.compiled_train_step`: synthetic uint8 data resident on the
device) both ways, the two-pass way by building the method with `UserBackbone(one_pass=False)`, in
interleaved rounds so that a shared machine's load falls on both alike, and prints the median
step time of each and their ratio.

    python -m studies.one_pass_step                          # resnet18 and mlp, DAEDL and F-EDL
    python -m studies.one_pass_step --models=resnet18 --variants=daedl --batch=64
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import time
from unittest import mock

import jax

from gedl_jax.methods import common
from gedl_jax.run.step_benchmark import compiled_train_step


@contextlib.contextmanager
def two_pass_backbones():
    """Within: the methods built wrap a user network in `UserBackbone(one_pass=False)`, as for
    a network without `features_and_logits`."""
    original = common.UserBackbone

    def two_pass(*args, **kwargs):
        return original(*args, **{**kwargs, "one_pass": False})

    with mock.patch.object(common, "UserBackbone", two_pass):
        yield


def compiled(variant: str, model: str, batch: int, steps: int, one_pass: bool):
    with contextlib.nullcontext() if one_pass else two_pass_backbones():
        run, _ = compiled_train_step(model, batch, "float32", 1, steps, variant=variant)
    run(1)   # warm-up
    return run


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="resnet18,mlp",
                   help="comma-separated networks with features_and_logits (default resnet18,mlp)")
    p.add_argument("--variants", default="daedl,fedl",
                   help="comma-separated methods that read features and logits "
                        "(default daedl,fedl)")
    p.add_argument("--batch", type=int, default=32, help="batch size (default 32)")
    p.add_argument("--steps", type=int, default=3, help="steps per timed round")
    p.add_argument("--rounds", type=int, default=5,
                   help="interleaved timed rounds of both ways; each time is their median")
    args = p.parse_args(argv)

    dev = jax.devices()[0]
    print(f"# {getattr(dev, 'device_kind', dev.platform)} x{jax.device_count()}, "
          f"{platform.machine()}, jax {jax.__version__}; batch {args.batch}, float32, "
          f"median of {args.rounds} interleaved rounds of {args.steps} steps")
    print("| method | network | one pass (ms/step) | two passes (ms/step) | two / one |")
    print("|---|---|---:|---:|---:|")
    for variant in args.variants.split(","):
        for model in args.models.split(","):
            runs = {one: compiled(variant, model, args.batch, args.steps, one)
                    for one in (True, False)}
            times: dict[bool, list[float]] = {True: [], False: []}
            for _ in range(args.rounds):
                for one, run in runs.items():
                    t0 = time.perf_counter()
                    run(args.steps)
                    times[one].append((time.perf_counter() - t0) / args.steps)
            once, twice = (1e3 * statistics.median(times[k]) for k in (True, False))
            print(f"| {variant} | {model} | {once:.1f} | {twice:.1f} | {twice / once:.2f} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
