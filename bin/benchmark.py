#!/usr/bin/env python
"""Training-step benchmark of the real GEDL train step (the one `gedl_jax.train` runs).

For each model (MNIST ConvNet, CIFAR VGG16-bn), batch size, compute dtype and device count it
prints: images/s (median over repeats after warm-up), step time, compile time, peak memory,
FLOPs per image (analytic, forward x3 for a training step) and achieved FLOP/s, and on a GPU the
fraction of the chip's dense peak. Results go to a JSON file and a markdown table with the
hardware and versions named.

    python bin/benchmark.py                                  # default grid, this machine
    python bin/benchmark.py --models=vgg16 --batches=128,512 --dtypes=bfloat16 --out=bench.json
    python bin/benchmark.py --models=convnet --loop_epochs=3  # + the real training loop
    python bin/benchmark.py --models=vgg16 --devices=1 --seeds=1,5  # 5 seeds against one

With `--seeds=1,5` each setting's 5-seed row (the vmapped step of `config.vmap_seeds`) is set
beside its one-seed row: "5 seeds: X ms/step = Y x one seed's step", below the table and as
`step_over_one_seed` in the JSON.

The data is synthetic uint8 resident on device, so this measures the model step (input cost is
measured separately by tools/input_throughput.py). By default the step is timed as the training
loop runs it on this platform: on an accelerator `--steps` steps in one compiled call
(`steps.multi_step`, the device-side loop of `config.steps_per_dispatch`), on a CPU one call per
step; `--device_loop=true/false` chooses.
`--loop_epochs=N` then runs the real training loop (`gedl_jax.train` on MNIST, the program of
the main job `bin/train`: validation every epoch, checkpoints, metrics) for N epochs and prints its
images/s beside the bare step's, so the loop's overhead is one number (needs the MNIST files;
timed from the first epoch end to the last, so the first epoch's compilation is left out:
`--loop_epochs=3` or more).
`--deterministic` sets the XLA flags of `config.deterministic` (on by default, as in training:
deterministic kernels, autotuning kept) before the backend starts; `--deterministic=ops` uses
XLA's stricter `--xla_gpu_deterministic_ops` (deterministic kernels, no autotuning) and
`--deterministic=false` XLA's fastest kernels, so what each costs is measured.

"% of peak" divides by the peak of the arithmetic that ran: float32 convolutions and matmuls
under the default precision run on TF32 tensor cores on an NVIDIA Ampere or later GPU, so
their peak is the dense TF32 tensor-core peak, not the non-tensor float32 one.
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

from gedl_jax import config as config_lib
from gedl_jax import files
from gedl_jax import networks as models
from gedl_jax.networks import layers, protocol
from gedl_jax.run.step_benchmark import compiled_train_step, loop_rate

# Dense peak throughput (FLOP/s) per chip and arithmetic, for the "fraction of peak" column
# (NVIDIA's data sheets, SXM, no sparsity): "tf32" is the tensor-core peak that float32
# products reach under matmul_precision "default", "float32" the non-tensor peak of
# matmul_precision "highest".
PEAK_FLOPS = {
    "H100": {"bfloat16": 989e12, "tf32": 494.5e12, "float32": 67e12},
    "H200": {"bfloat16": 989e12, "tf32": 494.5e12, "float32": 67e12},
    "A100": {"bfloat16": 312e12, "tf32": 156e12, "float32": 19.5e12},
}


def device_name() -> str:
    d = jax.devices()[0]
    return getattr(d, "device_kind", d.platform)


def arithmetic(dtype: str, precision: str) -> str:
    """The arithmetic a step of `dtype` runs under `precision` on this device: "bfloat16",
    "tf32" (float32 under the default precision on a tensor-core GPU) or "float32"."""
    if dtype == "bfloat16":
        return "bfloat16"
    on_tensor_core_gpu = jax.default_backend() == "gpu" and any(
        key in device_name() for key in PEAK_FLOPS)
    return "tf32" if precision == "default" and on_tensor_core_gpu else "float32"


def peak_for(arith: str) -> float | None:
    kind = device_name()
    for key, peaks in PEAK_FLOPS.items():
        if key in kind:
            return peaks[arith]
    return None


def peak_memory_bytes() -> int | None:
    stats = jax.devices()[0].memory_stats() if jax.devices()[0].platform != "cpu" else None
    if stats:
        return int(stats.get("peak_bytes_in_use", 0))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # host RSS on CPU


def bench_one(model_name: str, batch: int, dtype: str, num_devices: int, steps: int,
              repeats: int, seeds: int = 1, device_loop: bool = True,
              precision: str = "default") -> dict:
    """One configuration; with `seeds` > 1 the vmapped multi-seed step (`config.vmap_seeds`)
    trains that many models at once and images/s counts every seed's images."""
    image_shape = (28, 28, 1) if model_name == "convnet" else (32, 32, 3)
    with jax.default_matmul_precision(precision):
        run, compile_s = compiled_train_step(model_name, batch, dtype, num_devices, steps, seeds,
                                             device_loop=device_loop)
    run(1)  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run(steps)
        times.append((time.perf_counter() - t0) / steps)
    step_s = statistics.median(times)
    flops_per_image = 3 * models.model_flops_per_example(model_name, image_shape)
    achieved = flops_per_image * batch * seeds / step_s
    arith = arithmetic(dtype, precision)
    peak = peak_for(arith)
    return {
        "model": model_name, "batch": batch, "dtype": dtype, "devices": num_devices,
        "seeds": seeds, "precision": precision, "arithmetic": arith,
        "device_loop": device_loop, "images_per_s": batch * seeds / step_s,
        "step_ms": 1e3 * step_s,
        "step_ms_spread": [1e3 * min(times), 1e3 * max(times)], "compile_s": compile_s,
        "peak_memory_bytes": peak_memory_bytes(), "train_flops_per_image": flops_per_image,
        "achieved_flops": achieved, "fraction_of_peak": (achieved / peak) if peak else None,
    }


def _same_setting(row: dict) -> tuple:
    """What a row measured besides its seed count."""
    return tuple(row.get(k) for k in ("model", "batch", "dtype", "devices", "precision",
                                      "device_loop"))


def with_seed_ratios(rows: list[dict]) -> list[dict]:
    """The rows; each of S > 1 seeds whose setting was also benchmarked with one seed
    (`--seeds=1,5`) with `step_over_one_seed`: the time of one step of all S seeds (each its
    own batch) over one seed's step. What `config.vmap_seeds` is for: on an accelerator that a
    small model leaves idle, S seeds in little more than one seed's time."""
    single = {_same_setting(r): r["step_ms"] for r in rows if r.get("seeds", 1) == 1}
    return [dict(r, step_over_one_seed=r["step_ms"] / single[_same_setting(r)])
            if r.get("seeds", 1) > 1 and _same_setting(r) in single else r for r in rows]


def seed_ratio_lines(rows: list[dict]) -> list[str]:
    """"<model> b<batch> <dtype> <arithmetic> x<devices>: 5 seeds: X ms/step = Y x one seed's
    step" for each row with a `step_over_one_seed` (`with_seed_ratios`)."""
    return [f"{r['model']} b{r['batch']} {r['dtype']} {r['arithmetic']} x{r['devices']}: "
            f"{r['seeds']} seeds: {r['step_ms']:.2f} ms/step = {r['step_over_one_seed']:.2f} x "
            f"one seed's step" for r in rows if "step_over_one_seed" in r]


def environment() -> dict:
    # GEDL_COMMIT names the tree of a copy whose git metadata is not its own (tools/gpu_check.sh)
    commit = os.environ.get("GEDL_COMMIT", "")
    try:
        commit = commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"],
                                          capture_output=True, text=True,
                                          cwd=os.path.dirname(__file__)).stdout.strip()
    except OSError:
        commit = "?"
    import flax
    from gedl_jax.run import numerics
    return {"device": device_name(), "platform": jax.devices()[0].platform,
            "device_count": jax.device_count(), "cpu": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "jax": jax.__version__, "flax": flax.__version__,
            "python": platform.python_version(), "commit": commit,
            "deterministic_kernels": numerics.flags_in_force(),
            "xla_flags": os.environ.get("XLA_FLAGS", "")}


def markdown(env: dict, rows: list[dict]) -> str:
    kernels = "XLA's fastest"
    if env.get("deterministic_kernels"):
        kernels = ("deterministic (no autotuning)" if "xla_gpu_deterministic_ops"
                   in env.get("xla_flags", "") else "deterministic")
    lines = [f"Hardware: {env['device']} x{env['device_count']} ({env['platform']}), "
             f"{env['cpu_count']} CPU cores; jax {env['jax']}, flax {env['flax']}, "
             f"commit {env['commit']}; {kernels} GPU kernels"
             f"{'' if env.get('pool_impl', 'auto') == 'auto' else '; max-pool ' + env['pool_impl']}"
             f". Median of repeats after warm-up; "
             f"synthetic on-device data; steps timed in one call each (device loop: yes) or one "
             f"call per step. % of peak: of the arithmetic's dense peak (tf32 = float32 on "
             f"tensor cores).",
             "",
             "| model | batch | dtype | arithmetic | devices | seeds | device loop | img/s | "
             "step ms | compile s | peak mem MiB | train GFLOP/img | achieved TFLOP/s | "
             "% of peak |",
             "|---|---:|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        frac = f"{100 * r['fraction_of_peak']:.1f}" if r["fraction_of_peak"] else "n/a"
        mem = f"{r['peak_memory_bytes'] / 2**20:,.0f}" if r["peak_memory_bytes"] else "n/a"
        lines.append(f"| {r['model']} | {r['batch']} | {r['dtype']} | "
                     f"{r.get('arithmetic', r['dtype'])} | {r['devices']} | "
                     f"{r.get('seeds', 1)} | {'yes' if r.get('device_loop') else 'no'} | "
                     f"{r['images_per_s']:,.0f} | {r['step_ms']:.2f} | {r['compile_s']:.1f} | "
                     f"{mem} | {r['train_flops_per_image'] / 1e9:.3f} | "
                     f"{r['achieved_flops'] / 1e12:.3f} | {frac} |")
    return "\n".join(lines)


def loop_benchmark(epochs: int, step_row: dict | None, train_examples: int = 0) -> dict:
    """The main job's program (`bin/train`: GEDL on MNIST, the ConvNet, batch 128, validation and
    checkpoints every epoch) for `epochs` epochs in a temporary workdir; images/s of the loop
    from the metrics records' times (`step_benchmark.loop_rate`: epochs 2 to N, each with its
    epoch end), beside the bare step's (`step_row`). `train_examples` > 0: on that many images
    only (a smoke run)."""
    import json as json_
    import tempfile

    from gedl_jax import train

    config = config_lib.build_config("mnist", "gedl")
    config.num_epochs, config.evaluate_at_end, config.plots = epochs, False, False
    config.train_examples = train_examples
    if train_examples:   # a smoke run: a few progress lines all the same
        config.log_every_steps = min(config.log_every_steps, max(1, train_examples // 256))
    with tempfile.TemporaryDirectory() as workdir:
        start = time.perf_counter()
        train.train_and_evaluate(config, workdir)
        wall = time.perf_counter() - start
        with open(os.path.join(workdir, "metrics.jsonl")) as f:
            records = [json_.loads(line) for line in f]
    row = {"loop_epochs": epochs, "loop_steps": max(r["step"] for r in records),
           "loop_wall_s": wall, **loop_rate(records, config.batch_size)}
    if step_row:
        row.update(step_images_per_s=step_row["images_per_s"],
                   loop_over_step_time=step_row["images_per_s"] / row["loop_images_per_s"])
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="convnet,vgg16",
                   help="comma-separated models: convnet (MNIST), vgg16 (CIFAR VGG16-bn)")
    p.add_argument("--batches", default="128", help="comma-separated global batch sizes")
    p.add_argument("--dtypes", default="float32,bfloat16",
                   help="comma-separated compute dtypes (float32, bfloat16)")
    p.add_argument("--devices", default="1,all", help="device counts, 'all' = every device")
    p.add_argument("--seeds", default="1",
                   help="comma-separated seed counts; >1 times the vmapped multi-seed step "
                        "(img/s then counts all seeds' images)")
    p.add_argument("--steps", type=int, default=5, help="steps per timed repeat")
    p.add_argument("--repeats", type=int, default=5,
                   help="timed repeats after the warm-up; the step time is their median")
    p.add_argument("--precisions", default="default",
                   help="comma-separated matmul precisions of float32 steps (default, highest)")
    p.add_argument("--device_loop", default="auto", choices=("auto", "true", "false"),
                   help="time --steps steps per compiled call (true) or one call per step "
                        "(false); auto: as the training loop runs them here (one call per step "
                        "on a CPU, training.steps_per_call)")
    p.add_argument("--deterministic", default="true", choices=("true", "ops", "false"),
                   help="XLA's deterministic GPU kernels with autotuning, as "
                        "config.deterministic (true); deterministic kernels without autotuning "
                        "(ops: --xla_gpu_deterministic_ops); or its fastest kernels (false)")
    p.add_argument("--pool_impl", default="auto", choices=layers.POOL_IMPLS,
                   help="the protocol networks' max-pool implementation (networks/layers.py), "
                        "for all models: which pool gradient a kernel setting slows down")
    p.add_argument("--loop_epochs", type=int, default=0,
                   help="also run the main job's (bin/train) training loop for this many epochs "
                        "(needs the MNIST files) and compare it with the convnet float32 step")
    p.add_argument("--loop_train_examples", type=int, default=0,
                   help="the loop's training images (0 = the whole split; fewer for a smoke run)")
    p.add_argument("--out", default=None, help="JSON output (a .md table is written beside it)")
    args = p.parse_args(argv)
    if args.deterministic != "false":   # before anything starts the backend
        from gedl_jax.run import numerics
        flags = ([numerics.DETERMINISTIC_OPS] if args.deterministic == "ops"
                 else numerics.determinism_flags(None))
        os.environ["XLA_FLAGS"] = numerics.with_flags(os.environ.get("XLA_FLAGS", ""), flags)
    if args.pool_impl != "auto":
        chosen = args.pool_impl
        protocol.max_pool_2x2 = lambda x, impl="auto", *, train=False: layers.max_pool_2x2(
            x, chosen, train=train)
    env = environment()
    env["pool_impl"] = args.pool_impl
    device_loop = (args.device_loop == "true" if args.device_loop != "auto"
                   else jax.default_backend() != "cpu")
    print(f"# {env}", flush=True)
    counts = sorted({jax.device_count() if d == "all" else int(d)
                     for d in args.devices.split(",")})
    seed_counts = [int(s) for s in args.seeds.split(",")]
    rows = []
    for model_name in args.models.split(","):
        for batch in [int(b) for b in args.batches.split(",")]:
            for dtype in args.dtypes.split(","):
                precisions = args.precisions.split(",") if dtype == "float32" else ["default"]
                for count, seeds, precision in itertools.product(counts, seed_counts,
                                                                  precisions):
                    if batch % count:
                        continue
                    try:
                        row = bench_one(model_name, batch, dtype, count, args.steps, args.repeats,
                                        seeds, device_loop, precision)
                    except Exception as e:  # e.g. out of memory at a large batch
                        print(f"{model_name} b{batch} {dtype} x{count} s{seeds}: failed: {e!r}"
                              [:300], file=sys.stderr, flush=True)
                        continue
                    rows.append(row)
                    print(f"{model_name:8s} b{batch:5d} {dtype:9s} {row['arithmetic']:8s} "
                          f"x{count} seeds {seeds}: {row['images_per_s']:10,.0f} img/s  "
                          f"{row['step_ms']:8.2f} ms/step  compile {row['compile_s']:.1f} s",
                          flush=True)
    rows = with_seed_ratios(rows)
    table = markdown(env, rows)
    if seed_ratio_lines(rows):
        table += "\n\n" + "\n".join(f"- {line}" for line in seed_ratio_lines(rows))
    print(table)
    loop = None
    if args.loop_epochs:
        step_row = next((r for r in rows if r["model"] == "convnet" and r["batch"] == 128
                         and r["dtype"] == "float32" and r["seeds"] == 1
                         and r["precision"] == "default"), None)
        loop = loop_benchmark(args.loop_epochs, step_row, args.loop_train_examples)
        ratio = (f", {loop['loop_over_step_time']:.2f}x the bare step's time per image "
                 f"({loop['step_images_per_s']:,.0f} img/s)") if step_row else \
            " (no convnet batch-128 float32 step row to compare with)"
        print(f"training loop (the main job's program, {args.loop_epochs} epochs, "
              f"{loop['loop_steps']} steps; timed over its {loop['loop_window']}): "
              f"{loop['loop_images_per_s']:,.0f} img/s{ratio}; "
              f"wall time {loop['loop_wall_s']:.1f} s", flush=True)
    if args.out:
        files.write_text(args.out, json.dumps({"environment": env, "results": rows,
                                               "loop": loop}, indent=2))
        files.write_text(os.path.splitext(args.out)[0] + ".md", table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
