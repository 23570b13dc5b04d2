#!/usr/bin/env python
"""Where the time of one training step goes: per-op times of our real GEDL step or of the PyTorch
reference step, and the step's FLOP rate beside this machine's matmul rate.

From the repository root:

    python -m studies.profile_step                        # our step (jax), ConvNet, batch 128
    "$TORCH_PYTHON" -m studies.profile_step --framework=torch   # the PyTorch reference step

(`$TORCH_PYTHON`: a Python with torch, e.g. PATH/TO/torch-venv/bin/python; it needs neither jax
nor gedl_jax.)

jax: the real train step (what `gedl_jax.train` runs: `gedl_jax.run.step_benchmark`, which
bin/benchmark.py times) is traced with `jax.profiler` for `--steps` steps; every XLA thunk (a
fusion, a library call) is summed over the steps and labelled with what it computes, read from the
optimized HLO: a convolution is shown with its output shape and window (a window as large as the
image, e.g. 14x14 for a 5x5 kernel, is a weight gradient; a 5x5 window is a forward or
input-gradient convolution), then dots, reductions, transposes and elementwise loops. XLA runs
independent thunks concurrently (a layer's input and weight gradients at the same time, each on
the shared thread pool), so the per-op times add up to more than the step's wall time.
torch: `torch.profiler` over the same number of steps of `studies/profile_models.py --torch`'s
step (same architecture, batch, softplus-evidence MSE loss, Adam), by operator (self CPU time).

Both print the wall time per step, the step's analytic FLOP rate (3x the forward FLOPs,
`gedl_jax.networks.model_flops_per_example`, written out for torch) and the rate of one
float32 2048x2048 matmul in the same framework, so the step can be read against what this CPU's
matrix units reach at all.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import statistics
import sys
import tempfile
import time

# Forward multiply-adds x 2 of the ConvNet (28x28x1 input, three 5x5 'SAME' convs to 64 channels
# each followed by a 2x2 pool, then 576-64-64-64-10), per image: the torch branch must not import
# gedl_jax (torch's Python need not have jax). `tests/test_profile_step.py` checks it against
# `gedl_jax.networks.model_flops_per_example`.
CONVNET_FORWARD_FLOPS = 2 * (28 * 28 * 25 * 64 + 14 * 14 * 25 * 64 * 64 + 7 * 7 * 25 * 64 * 64
                             + 576 * 64 + 64 * 64 + 64 * 64 + 64 * 10)

_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(\S+) = (\S+?) (\w[\w-]*)\(")
_CALLS = re.compile(r"calls=%([\w.\-]+)")
_WINDOW = re.compile(r"window=\{size=(\S+?)[ ,}]")
_LABEL_ORDER = ("convolution", "dot", "reduce", "reduce-window", "select-and-scatter",
                "transpose", "copy", "concatenate", "pad", "slice")
_IGNORED = {"parameter", "constant", "bitcast", "broadcast", "get-tuple-element", "tuple"}


def hlo_labels(hlo_text: str) -> dict[str, str]:
    """{top-level instruction name: what it computes}, from `Compiled.as_text()`."""
    bodies: dict[str, list[tuple[str, str, str, str]]] = {}
    current = None
    calls: dict[str, str] = {}
    for line in hlo_text.splitlines():
        header = re.match(r"^(?:ENTRY )?%([\w.\-]+) .*\{$", line)
        if header:
            current = header.group(1)
            bodies[current] = []
            continue
        m = _INSTRUCTION.match(line)
        if m and current is not None:
            name, shape, op = m.groups()
            window = _WINDOW.search(line)
            bodies[current].append((name, shape, op, window.group(1) if window else ""))
            called = _CALLS.search(line)
            if called:
                calls[name] = called.group(1)
    labels = {}
    for comp in bodies.values():
        for name, shape, op, window in comp:
            inner = bodies.get(calls.get(name, ""), [(name, shape, op, window)])
            ops = [o for o in inner if o[2] not in _IGNORED] or inner
            ops.sort(key=lambda o: _LABEL_ORDER.index(o[2]) if o[2] in _LABEL_ORDER else 99)
            _, main_shape, main_op, main_window = ops[0]
            text = f"{main_op} {main_shape}"
            if main_window:
                text += f" window {main_window}"
            others = sorted({o[2] for o in ops[1:]})
            if others:
                text += " + " + ",".join(others[:4]) + ("..." if len(others) > 4 else "")
            labels[name] = text
    return labels


def trace_op_times(trace_dir: str, steps: int) -> list[tuple[str, float, int]]:
    """[(thunk name, ms per step, count)] from the perfetto trace `jax.profiler` wrote."""
    files = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)
    if not files:
        raise SystemExit(f"jax.profiler wrote no trace under {trace_dir}")
    with gzip.open(files[0]) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    total: collections.Counter = collections.Counter()
    count: collections.Counter = collections.Counter()
    for e in events:
        name = e.get("name", "")
        if e.get("ph") != "X" or name.startswith(("$", "end: ")) or "::" in name \
                or name.startswith("PjitFunction"):
            continue   # Python frames and runtime wrappers, not XLA work
        total[name] += e["dur"]
        count[name] += 1
    return [(n, t / 1e3 / steps, count[n]) for n, t in total.most_common()]


def gemm_gflops(matmul, make, n: int = 2048, repeats: int = 5) -> float:
    a = make(n)
    matmul(a)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        matmul(a)
        times.append(time.perf_counter() - t0)
    return 2 * n ** 3 / statistics.median(times) / 1e9


def profile_jax(args) -> None:
    import jax
    import jax.numpy as jnp

    from gedl_jax import networks as models
    from gedl_jax.run.step_benchmark import compiled_train_step

    run, _ = compiled_train_step(args.model, args.batch, "float32", 1, args.steps)
    run(args.steps)   # warm-up
    t0 = time.perf_counter()
    run(args.steps)
    step_s = (time.perf_counter() - t0) / args.steps
    with tempfile.TemporaryDirectory() as trace_dir:
        with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
            run(args.steps)
        ops = trace_op_times(trace_dir, args.steps)
    labels = hlo_labels(run.compiled.as_text())
    shape = (28, 28, 1) if args.model == "convnet" else (32, 32, 3)
    flops = 3 * models.model_flops_per_example(args.model, shape) * args.batch
    matmul = jax.jit(lambda a: a @ a)
    gemm = gemm_gflops(lambda a: matmul(a).block_until_ready(),
                       lambda n: jnp.ones((n, n), jnp.float32))
    print(f"# our GEDL train step ({args.model}, batch {args.batch}, float32): jax "
          f"{jax.__version__}, {jax.devices()[0].platform}, XLA_FLAGS="
          f"{os.environ.get('XLA_FLAGS', '')!r}")
    _print_summary(step_s, flops, gemm, args.batch)
    print(f"{'ms/step':>8}  {'calls':>5}  thunk: what it computes (optimized HLO)")
    for name, ms, n in ops[:args.top]:
        print(f"{ms:8.2f}  {n // args.steps:5d}  {name}: {labels.get(name, '')}")
    print(f"{sum(ms for _, ms, _ in ops):8.2f}  total of all thunks (concurrent thunks overlap)")


def profile_torch(args) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    from studies import profile_models

    if args.model != "convnet":
        raise SystemExit("--framework=torch profiles the ConvNet only (its FLOPs are written "
                         "out here); use --model=convnet")
    run, _ = profile_models.torch_runner(args.model, "train", args.batch, args.threads)
    for _ in range(args.steps):
        run()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        run()
    step_s = (time.perf_counter() - t0) / args.steps
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            run()
    gemm = gemm_gflops(lambda a: a @ a, lambda n: torch.ones(n, n))
    print(f"# PyTorch reference train step ({args.model}, batch {args.batch}, float32): torch "
          f"{torch.__version__}, {args.threads} threads")
    _print_summary(step_s, 3 * CONVNET_FORWARD_FLOPS * args.batch, gemm, args.batch)
    rows = sorted(prof.key_averages(), key=lambda r: r.self_cpu_time_total, reverse=True)
    print(f"{'ms/step':>8}  {'calls':>5}  operator (self CPU time)")
    for r in rows[:args.top]:
        print(f"{r.self_cpu_time_total / 1e3 / args.steps:8.2f}  {r.count // args.steps:5d}  "
              f"{r.key}")
    total = sum(r.self_cpu_time_total for r in rows) / 1e3 / args.steps
    print(f"{total:8.2f}  total self CPU time")


def _print_summary(step_s: float, flops: float, gemm_gflops_: float, batch: int) -> None:
    rate = flops / step_s / 1e9
    print(f"step {1e3 * step_s:.1f} ms ({batch / step_s:,.0f} img/s); analytic "
          f"{flops / 1e9:.1f} GFLOP/step -> {rate:.0f} GFLOP/s; a 2048x2048 float32 matmul "
          f"here: {gemm_gflops_:.0f} GFLOP/s (step at {rate / gemm_gflops_:.0%} of it)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--framework", choices=("jax", "torch"), default="jax",
                   help="profile our step (jax) or the PyTorch reference step (torch)")
    p.add_argument("--model", choices=("convnet", "vgg16"), default="convnet",
                   help="network: convnet (MNIST) or vgg16 (CIFAR VGG16-bn)")
    p.add_argument("--batch", type=int, default=128, help="batch size (default 128)")
    p.add_argument("--steps", type=int, default=10, help="profiled steps (and warm-up steps)")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument("--top", type=int, default=25, help="rows to print")
    args = p.parse_args(argv)
    if args.framework == "torch":
        from studies import profile_models

        profile_models.require_torch(p)
    (profile_jax if args.framework == "jax" else profile_torch)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
