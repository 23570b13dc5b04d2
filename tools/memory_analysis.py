#!/usr/bin/env python
"""Compiled memory analysis of the real GEDL train and eval steps (VGG16 by default).

    python tools/memory_analysis.py                            # VGG16, batch 128 and 1024
    python tools/memory_analysis.py --models=convnet,vgg16 --batches=128,512 --dtypes=bfloat16

For each model, batch size and compute dtype it compiles the train step `gedl_jax.train` runs
(`steps.make_train_step`: forward, backward, Adam, with the on-device input step) and the eval
step (`steps.make_predict_step`) for abstract inputs (nothing is allocated or run) and prints
XLA's `memory_analysis()`: the bytes of the arguments, outputs and temporaries and the peak
estimate (arguments + outputs + temporaries - aliased, i.e. the donated state counted once).

It compiles for the backend it runs on. Without a GPU that is the CPU: the CPU compiler's buffer
assignment and fusion differ from the CUDA compiler's, so the numbers are an estimate of a GPU
run's footprint (the parameters, optimiser state and data are the same bytes; temporaries
differ), not a measurement of it. On a GPU machine the same command prints the CUDA numbers.
The training split resident on the device is counted at `--train_examples` images (the CIFAR-10
training split: 50,000 at 32x32x3 uint8 = 147 MiB).
"""

from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp

from gedl_jax import config as config_lib
from gedl_jax import methods
from gedl_jax.run import experiment, optimizer, sharding, steps

DATASETS = {"convnet": ("mnist", (28, 28, 1)), "vgg16": ("cifar10", (32, 32, 3))}


def analyse(model: str, batch: int, dtype: str, train_examples: int) -> dict[str, dict]:
    """{"train": {...}, "eval": {...}}: each step's memory analysis in bytes."""
    dataset, image_shape = DATASETS[model]
    config = experiment.resolve_config(config_lib.set_fields(
        config_lib.build_config(dataset, "gedl"), compute_dtype=dtype, batch_size=batch), 1)
    method = methods.from_config(config, methods.MethodSetup(
        config.num_classes, (1,) * config.num_classes, image_shape))
    tx = optimizer.make_optimizer(config, total_steps=1000)
    mesh = sharding.make_mesh(jax.devices()[:1])
    settings = steps.StepSettings(steps_per_epoch=max(train_examples // batch, 1),
                                  batch_size=batch, augment=bool(config.augment),
                                  normalize_mean=None, normalize_std=None)
    keys = experiment.run_keys(0)
    state = jax.eval_shape(lambda k: steps.init_train_state(method, tx, k, image_shape),
                           keys["init"])
    n = train_examples
    train = steps.make_train_step(method, tx, mesh, settings, keys).lower(
        state, jax.ShapeDtypeStruct((n, *image_shape), jnp.uint8),
        jax.ShapeDtypeStruct((n,), jnp.int32), jax.ShapeDtypeStruct((n,), jnp.int32))
    predict = steps.make_predict_step(method, mesh).lower(
        state.variables, state.method_state,
        jax.ShapeDtypeStruct((batch, *image_shape), jnp.uint8), keys["dropout"])
    return {name: _memory(lowered.compile().memory_analysis())
            for name, lowered in (("train", train), ("eval", predict))}


def _memory(stats) -> dict[str, int]:
    fields = {k: int(getattr(stats, f"{k}_size_in_bytes"))
              for k in ("argument", "output", "temp", "alias", "generated_code")}
    fields["peak"] = fields["argument"] + fields["output"] + fields["temp"] - fields["alias"]
    return fields


def table(rows: list[tuple[str, int, str, str, dict[str, int]]]) -> str:
    mib = 2 ** 20
    lines = ["| model | batch | dtype | step | arguments MiB | outputs MiB | temporaries MiB | "
             "aliased MiB | peak MiB |", "|---|---:|---|---|---:|---:|---:|---:|---:|"]
    for model, batch, dtype, step, m in rows:
        lines.append(f"| {model} | {batch} | {dtype} | {step} | {m['argument'] / mib:,.1f} | "
                     f"{m['output'] / mib:,.1f} | {m['temp'] / mib:,.1f} | "
                     f"{m['alias'] / mib:,.1f} | {m['peak'] / mib:,.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="vgg16",
                   help="comma-separated models: convnet (MNIST), vgg16 (CIFAR-10 VGG16-bn)")
    p.add_argument("--batches", default="128,1024", help="comma-separated batch sizes")
    p.add_argument("--dtypes", default="float32",
                   help="comma-separated compute dtypes (float32, bfloat16)")
    p.add_argument("--train_examples", type=int, default=50_000,
                   help="images of the device-resident training split")
    args = p.parse_args(argv)
    print(f"# backend {jax.default_backend()} ({jax.devices()[0].device_kind}), "
          f"jax {jax.__version__}", flush=True)
    rows = []
    for model in args.models.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            for dtype in args.dtypes.split(","):
                for step, m in analyse(model, batch, dtype, args.train_examples).items():
                    rows.append((model, batch, dtype, step, m))
                    print(f"{model} b{batch} {dtype} {step}: peak {m['peak'] / 2**20:,.1f} MiB",
                          flush=True)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
