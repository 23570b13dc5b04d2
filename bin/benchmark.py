#!/usr/bin/env python
"""Training-step benchmark of the real GEDL train step (the one `gedl_jax.train` runs).

For each model (MNIST ConvNet, CIFAR VGG16-bn), batch size, compute dtype and device count it
prints: images/s (median over repeats after warm-up), step time, compile time, peak memory,
FLOPs per image (analytic, forward x3 for a training step) and achieved FLOP/s, and on a GPU the
fraction of the chip's dense peak. Results go to a JSON file and a markdown table with the
hardware and versions named.

    python bin/benchmark.py                                  # default grid, this machine
    python bin/benchmark.py --models=vgg16 --batches=128,512 --dtypes=bfloat16 --out=bench.json

The data is synthetic uint8 resident on device, so this measures the model step (input cost is
measured separately by bin/input_throughput.py).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from gedl_jax import configuration, methods
from gedl_jax import networks as models
from gedl_jax.run import optimizer, sharding
from gedl_jax.run import steps as steps_lib

# Dense peak throughput (FLOP/s) per chip, for the "fraction of peak" column.
PEAK_FLOPS = {
    "H100": {"bfloat16": 989e12, "float32": 67e12},   # SXM, dense, no sparsity
    "H200": {"bfloat16": 989e12, "float32": 67e12},
    "A100": {"bfloat16": 312e12, "float32": 19.5e12},
}


def device_name() -> str:
    d = jax.devices()[0]
    return getattr(d, "device_kind", d.platform)


def peak_for(dtype: str) -> float | None:
    kind = device_name()
    for key, peaks in PEAK_FLOPS.items():
        if key in kind:
            return peaks[dtype]
    return None


def peak_memory_bytes() -> int | None:
    stats = jax.devices()[0].memory_stats() if jax.devices()[0].platform != "cpu" else None
    if stats:
        return int(stats.get("peak_bytes_in_use", 0))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # host RSS on CPU


def compiled_train_step(model_name: str, batch: int, dtype: str, num_devices: int, steps: int,
                        seeds: int = 1, variant: str = "gedl"):
    """The real GEDL train step (`steps.make_train_step`, as `gedl_jax.train` runs it), compiled,
    on `steps` batches of synthetic uint8 data resident on the device (another preset's step
    with `variant`; `model_name` may be any network `config.model` takes).

    Returns (run, compile_s): `run(n)` does n steps from the current state and blocks on the
    result; with `seeds` > 1 the vmapped multi-seed step (`config.vmap_seeds`).
    """
    dataset = "mnist" if model_name == "convnet" else "cifar10"
    config = configuration.build_config(dataset, variant)
    config.compute_dtype = dtype
    config.batch_size = batch
    image_shape = (28, 28, 1) if model_name == "convnet" else (32, 32, 3)
    config.model = model_name
    mesh = sharding.make_mesh(jax.devices()[:num_devices])
    method = methods.from_config(config, methods.MethodSetup(10, (1,) * 10, image_shape))
    n = batch * steps
    tx = optimizer.make_optimizer(config, total_steps=10 * steps)
    settings = steps_lib.StepSettings(steps_per_epoch=steps, batch_size=batch,
                                     augment=config.augment, normalize_mean=None,
                                     normalize_std=None)
    keys = {"augment": jax.random.PRNGKey(1), "dropout": jax.random.PRNGKey(2)}
    rng = np.random.default_rng(0)
    images = sharding.put_replicated(mesh, rng.integers(0, 256, (n, *image_shape), np.uint8))
    labels = sharding.put_replicated(mesh, rng.integers(0, 10, n).astype(np.int32))
    replicated = sharding.replicated(mesh)

    def init(key):
        return steps_lib.init_train_state(method, tx, key, image_shape)

    if seeds == 1:
        step_fn = steps_lib.make_train_step(method, tx, mesh, settings, keys)
        extra = (jax.device_put(jnp.arange(n, dtype=jnp.int32), replicated),)
        state = jax.jit(init, out_shardings=replicated)(jax.random.PRNGKey(0))
    else:
        step_fn = steps_lib.make_multi_seed_train_step(method, tx, mesh, settings)
        order_SxN = jnp.tile(jnp.arange(n, dtype=jnp.int32), (seeds, 1))
        keys_S = {k: jnp.stack([jax.random.fold_in(v, s) for s in range(seeds)])
                  for k, v in keys.items()}
        extra = (jax.device_put(order_SxN, replicated), jax.device_put(keys_S, replicated))
        state = jax.jit(jax.vmap(init), out_shardings=replicated)(
            jax.random.split(jax.random.PRNGKey(0), seeds))
    t0 = time.perf_counter()
    compiled = step_fn.lower(state, images, labels, *extra).compile()
    compile_s = time.perf_counter() - t0
    current = {"state": state}

    def run(num_steps: int) -> None:
        state = current["state"]
        for _ in range(num_steps):
            state, m = compiled(state, images, labels, *extra)
        jax.block_until_ready(m)
        current["state"] = state

    run.compiled = compiled   # for benchmarks/profile_step.py: the optimized HLO behind the timings
    return run, compile_s


def bench_one(model_name: str, batch: int, dtype: str, num_devices: int, steps: int,
              repeats: int, seeds: int = 1) -> dict:
    """One configuration; with `seeds` > 1 the vmapped multi-seed step (`config.vmap_seeds`)
    trains that many models at once and images/s counts every seed's images."""
    image_shape = (28, 28, 1) if model_name == "convnet" else (32, 32, 3)
    run, compile_s = compiled_train_step(model_name, batch, dtype, num_devices, steps, seeds)
    run(1)  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run(steps)
        times.append((time.perf_counter() - t0) / steps)
    step_s = statistics.median(times)
    flops_per_image = 3 * models.model_flops_per_example(model_name, image_shape)
    achieved = flops_per_image * batch * seeds / step_s
    peak = peak_for(dtype)
    return {
        "model": model_name, "batch": batch, "dtype": dtype, "devices": num_devices,
        "seeds": seeds, "images_per_s": batch * seeds / step_s, "step_ms": 1e3 * step_s,
        "step_ms_spread": [1e3 * min(times), 1e3 * max(times)], "compile_s": compile_s,
        "peak_memory_bytes": peak_memory_bytes(), "train_flops_per_image": flops_per_image,
        "achieved_flops": achieved, "fraction_of_peak": (achieved / peak) if peak else None,
    }


def environment() -> dict:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, cwd=os.path.dirname(__file__)).stdout.strip()
    except OSError:
        commit = "?"
    import flax  # noqa: PLC0415
    return {"device": device_name(), "platform": jax.devices()[0].platform,
            "device_count": jax.device_count(), "cpu": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "jax": jax.__version__, "flax": flax.__version__,
            "python": platform.python_version(), "commit": commit}


def markdown(env: dict, rows: list[dict]) -> str:
    lines = [f"Hardware: {env['device']} x{env['device_count']} ({env['platform']}), "
             f"{env['cpu_count']} CPU cores; jax {env['jax']}, flax {env['flax']}, "
             f"commit {env['commit']}. Median of repeats after warm-up; synthetic on-device data.",
             "",
             "| model | batch | dtype | devices | seeds | img/s | step ms | compile s | "
             "peak mem MiB | train GFLOP/img | achieved TFLOP/s | % of peak |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        frac = f"{100 * r['fraction_of_peak']:.1f}" if r["fraction_of_peak"] else "n/a"
        mem = f"{r['peak_memory_bytes'] / 2**20:,.0f}" if r["peak_memory_bytes"] else "n/a"
        lines.append(f"| {r['model']} | {r['batch']} | {r['dtype']} | {r['devices']} | "
                     f"{r.get('seeds', 1)} | "
                     f"{r['images_per_s']:,.0f} | {r['step_ms']:.1f} | {r['compile_s']:.1f} | "
                     f"{mem} | {r['train_flops_per_image'] / 1e9:.3f} | "
                     f"{r['achieved_flops'] / 1e12:.3f} | {frac} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="convnet,vgg16")
    p.add_argument("--batches", default="128", help="comma-separated global batch sizes")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--devices", default="1,all", help="device counts, 'all' = every device")
    p.add_argument("--seeds", default="1",
                   help="comma-separated seed counts; >1 times the vmapped multi-seed step "
                        "(img/s then counts all seeds' images)")
    p.add_argument("--steps", type=int, default=5, help="steps per timed repeat")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=None, help="JSON output (a .md table is written beside it)")
    args = p.parse_args(argv)
    env = environment()
    print(f"# {env}", flush=True)
    counts = sorted({jax.device_count() if d == "all" else int(d)
                     for d in args.devices.split(",")})
    seed_counts = [int(s) for s in args.seeds.split(",")]
    rows = []
    for model_name in args.models.split(","):
        for batch in [int(b) for b in args.batches.split(",")]:
            for dtype in args.dtypes.split(","):
                for count, seeds in itertools.product(counts, seed_counts):
                    if batch % count:
                        continue
                    try:
                        row = bench_one(model_name, batch, dtype, count, args.steps, args.repeats,
                                        seeds)
                    except Exception as e:  # e.g. out of memory at a large batch
                        print(f"{model_name} b{batch} {dtype} x{count} s{seeds}: failed: {e!r}"
                              [:300], file=sys.stderr, flush=True)
                        continue
                    rows.append(row)
                    print(f"{model_name:8s} b{batch:5d} {dtype:9s} x{count} seeds {seeds}: "
                          f"{row['images_per_s']:10,.0f} img/s  {row['step_ms']:8.1f} ms/step  "
                          f"compile {row['compile_s']:.1f} s", flush=True)
    table = markdown(env, rows)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"environment": env, "results": rows}, f, indent=2)
        with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
            f.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
