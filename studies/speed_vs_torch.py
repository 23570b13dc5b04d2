#!/usr/bin/env python
"""Our real training step beside the PyTorch reference step, interleaved in one run, with the ratio.

On a shared CPU absolute images/s move by up to 2x from minute to minute, so only a ratio measured
side by side is stable. This script starts one long-lived worker process per contestant and, in
every round, asks each worker in turn (rotating the order) to time `--steps` training steps; it
prints each contestant's median images/s over the rounds, and the median over rounds of the
per-round ratio to PyTorch's best: in each round, the faster of the torch workers (PyTorch's
oneDNN/OpenMP threads scale on a quiet machine and collapse on an oversubscribed one, so a fair
reference is the better thread count measured in the same minutes).

Contestants (`--worker LABEL:KIND:PYTHON[:OPTIONS]`, repeatable):
- KIND `jax`: the real GEDL train step that `gedl_jax.train` runs (`compiled_train_step` of
  `gedl_jax.run.step_benchmark`, which bin/benchmark.py times: on-device batch gather and scaling,
  the ConvNet, GEDL loss with the KL, Adam, non-finite guard), synthetic uint8 data resident on
  the device;
- KIND `torch`: the PyTorch reference step of `studies/profile_models.py --torch` (same
  architecture and PyTorch-default init, batch, softplus-evidence MSE loss, Adam; `threads`
  intra-op threads).
PYTHON is the interpreter that runs the worker (e.g. another venv: Python/jax versions side by
side); it runs `-m studies.speed_vs_torch` with this checkout on its PYTHONPATH, so every jax
worker runs this checkout's gedl_jax and a torch worker needs only torch and numpy. OPTIONS,
';'-separated: `dtype=bfloat16`, `threads=N` (torch), `env:NAME=VALUE` (e.g.
`env:XLA_FLAGS=--xla_cpu_use_onednn=true`).

From the repository root:

    python -m studies.speed_vs_torch                  # this venv's jax vs torch, 1 and 2 threads
    python -m studies.speed_vs_torch --torch_python="$TORCH_PYTHON"   # torch in another Python
    python -m studies.speed_vs_torch --rounds=8 --steps=10 \\
        --worker=jax311:jax:.venv-py311/bin/python --worker=jax313:jax:.venv/bin/python \\
        --worker=torch:torch:"$TORCH_PYTHON"

(`$TORCH_PYTHON`: the interpreter of a virtual environment with torch, e.g.
PATH/TO/torch-venv/bin/python.)

`--pool FILE.json:LABEL ...` times nothing: it pools the rounds of earlier `--out` files and
prints the median ratio to torch-best with a 95 % bootstrap interval.

torch is not a dependency of gedl-jax: install it into the Python that runs the torch worker
(`pip install torch`, CPU wheel).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --------------------------------------------------------------------------------------------
# Worker side: one contestant, driven over stdin/stdout
# --------------------------------------------------------------------------------------------
def _worker(kind: str, model: str, batch: int, steps: int, dtype: str, threads: int) -> None:
    if kind == "jax":
        import jax

        from gedl_jax.run.step_benchmark import compiled_train_step

        run, compile_s = compiled_train_step(model, batch, dtype, 1, steps)
        info = {"jax": jax.__version__, "backend": jax.default_backend(),
                "xla_flags": os.environ.get("XLA_FLAGS", "")}
    else:
        import torch

        from studies import profile_models

        step, compile_s = profile_models.torch_runner(model, "train", batch, threads)

        def run(n: int) -> None:
            for _ in range(n):
                step()

        info = {"torch": torch.__version__, "threads": threads}
    run(2)  # warm-up
    info.update(python=platform.python_version(), compile_s=compile_s)
    print(json.dumps(info), flush=True)
    for line in sys.stdin:
        n = int(line)
        t0 = time.perf_counter()
        run(n)
        print(time.perf_counter() - t0, flush=True)


# --------------------------------------------------------------------------------------------
# Driver side
# --------------------------------------------------------------------------------------------
def parse_worker(spec: str) -> dict:
    parts = spec.split(":", 3)
    if len(parts) < 3 or parts[1] not in ("jax", "torch"):
        raise SystemExit(f"--worker={spec!r}: expected LABEL:KIND:PYTHON[:OPTIONS] with KIND "
                         f"jax or torch, e.g. jax311:jax:.venv/bin/python")
    w = {"label": parts[0], "kind": parts[1], "python": parts[2], "dtype": "float32",
         "threads": 2, "env": {}}
    for opt in (parts[3].split(";") if len(parts) == 4 and parts[3] else []):
        key, _, value = opt.partition("=")
        if key.startswith("env:"):
            w["env"][key[4:]] = value
        elif key in ("dtype", "threads"):
            w[key] = int(value) if key == "threads" else value
        else:
            raise SystemExit(f"--worker={spec!r}: unknown option {key!r} (dtype, threads, env:X)")
    return w


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def load_average() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "?"


def reference_times(workers: list[dict], label: str | None) -> tuple[str, list[float]]:
    """The reference's time per round: the named worker's, or the fastest torch worker's."""
    if label:
        return label, next(w["times"] for w in workers if w["label"] == label)
    torch_times = [w["times"] for w in workers if w["kind"] == "torch"]
    return "torch-best", [min(ts) for ts in zip(*torch_times)]


def pooled_ratios(sources: list[str]) -> list[float]:
    """Every round's ratio of one contestant to that round's fastest torch worker, pooled over
    several `--out` files; a source is `FILE.json:LABEL` (the contestant's label in that file)."""
    ratios = []
    for source in sources:
        path, _, label = source.rpartition(":")
        with open(path) as f:
            workers = json.load(f)["workers"]
        if label not in workers:
            raise SystemExit(f"{path} has no worker {label!r}; it has {sorted(workers)}")
        torch_ips = [w["img_per_s"] for w in workers.values() if "torch" in w["info"]]
        if not torch_ips:
            raise SystemExit(f"{path} has no torch worker to take ratios to")
        ratios += [ips / max(ref) for ips, ref in zip(workers[label]["img_per_s"],
                                                       zip(*torch_ips))]
    return ratios


def summarize_ratios(ratios: list[float], resamples: int = 10_000, seed: int = 0) -> dict:
    """Median of the per-round ratios, its 95 % bootstrap interval (percentile method, rounds
    resampled with replacement) and the fraction of rounds above 1."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios)))
                     for _ in range(resamples))
    return {"rounds": len(ratios), "median": statistics.median(ratios),
            "ci95": (medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]),
            "above_1": sum(r > 1 for r in ratios) / len(ratios)}


def print_pooled(sources: list[str]) -> int:
    s = summarize_ratios(pooled_ratios(sources))
    print(f"# pooled over {len(sources)} runs: {', '.join(sources)}")
    print(f"rounds {s['rounds']}; median ratio to torch-best {s['median']:.3f}, 95% bootstrap "
          f"interval {s['ci95'][0]:.3f}-{s['ci95'][1]:.3f}; rounds above 1.0: "
          f"{s['above_1']:.0%}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="append", default=[],
                   help="LABEL:KIND:PYTHON[:OPTIONS]; default: jax and torch with this Python")
    p.add_argument("--model", default="convnet", choices=("convnet", "vgg16"),
                   help="network: convnet (MNIST) or vgg16 (CIFAR VGG16-bn)")
    p.add_argument("--batch", type=int, default=128, help="batch size (default 128)")
    p.add_argument("--steps", type=int, default=10, help="timed steps per worker per round")
    p.add_argument("--rounds", type=int, default=6,
                   help="rounds, each timing every worker in turn; the medians are over them")
    p.add_argument("--reference", default=None,
                   help="label of the worker the ratios are taken to (default: in each round the "
                        "fastest torch worker, 'torch-best')")
    p.add_argument("--torch_python", default=sys.executable,
                   help="the Python with torch installed, for the default workers")
    p.add_argument("--out", default=None, help="write the per-round times as JSON")
    p.add_argument("--pool", nargs="+", default=None, metavar="FILE.json:LABEL",
                   help="instead of timing: pool the rounds of earlier --out files (contestant "
                        "LABEL in each) and print the median ratio to torch-best with its 95%% "
                        "bootstrap interval")
    p.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_dtype", default="float32", help=argparse.SUPPRESS)
    p.add_argument("--_threads", type=int, default=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._worker:
        _worker(args._worker, args.model, args.batch, args.steps, args._dtype, args._threads)
        return 0
    if args.pool:
        return print_pooled(args.pool)

    specs = args.worker or [f"jax:jax:{sys.executable}",
                            f"torch-1thr:torch:{args.torch_python}:threads=1",
                            f"torch-2thr:torch:{args.torch_python}:threads=2"]
    workers = [parse_worker(s) for s in specs]
    if not any(w["kind"] == "torch" for w in workers):
        raise SystemExit("give one --worker of KIND torch: ratios are taken against it")
    if args.reference and not any(w["label"] == args.reference for w in workers):
        raise SystemExit(f"--reference={args.reference!r} names no --worker label")
    for w in workers:   # before anything starts: a worker without torch would die unseen
        if w["kind"] == "torch" and subprocess.run(
                [w["python"], "-c", "import torch"], capture_output=True).returncode != 0:
            p.exit(2, f"{p.prog}: error: {w['python']} cannot import torch: pip install torch "
                      f"there (not a gedl-jax dependency), or give --torch_python=A_PYTHON_WITH_"
                      f"TORCH\n")
    print(f"# {args.model} train step, batch {args.batch}, {args.rounds} rounds x {args.steps} "
          f"steps per worker; host {platform.node()}, {os.cpu_count()} CPUs; load average "
          f"(1, 5, 15 min) at start: {load_average()}", flush=True)
    for w in workers:   # start all first, so compilation does not overlap the timed rounds
        env = {**os.environ, **w["env"], "PYTHONPATH": REPO}
        w["proc"] = subprocess.Popen(
            [w["python"], "-m", "studies.speed_vs_torch", "--_worker", w["kind"],
             "--model", args.model, "--batch", str(args.batch), "--steps", str(args.steps),
             "--_dtype", w["dtype"], "--_threads", str(w["threads"])],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    for w in workers:
        line = w["proc"].stdout.readline()
        if not line:
            raise SystemExit(f"worker {w['label']} ({w['python']}) failed to start; run it alone "
                             f"to see its error")
        w["info"] = json.loads(line)
        w["times"] = []
        print(f"# {w['label']}: {w['kind']} dtype {w['dtype']} {json.dumps(w['info'])}"
              + (f" env {w['env']}" if w["env"] else ""), flush=True)
    # SIGTERM (or Ctrl-C) ends the rounds early: the summary covers the rounds completed.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        for r in range(args.rounds):
            order = workers[r % len(workers):] + workers[:r % len(workers)]
            times = {}
            for w in order:
                w["proc"].stdin.write(f"{args.steps}\n")
                w["proc"].stdin.flush()
                times[w["label"]] = float(w["proc"].stdout.readline())
            for w in workers:   # a round counts only when every worker finished it
                w["times"].append(times[w["label"]])
            print(f"round {r + 1}: " + "  ".join(
                f"{w['label']} {args.batch * args.steps / w['times'][-1]:,.0f}" for w in workers)
                + f" img/s  (load {load_average()})", flush=True)
    except KeyboardInterrupt:
        print("# interrupted: summary of the completed rounds", flush=True)
    finally:
        for w in workers:
            w["proc"].kill()
            w["proc"].wait()
    ref_label, ref_times = reference_times(workers, args.reference)
    if not ref_times:
        raise SystemExit("no round completed")
    print(f"\n# load average at end: {load_average()}")
    print(f"{'worker':>18} {'img/s (median)':>15} {'ratio to ' + ref_label:>20} "
          f"{'ratio range':>14}")
    summary = {}
    for w in workers:
        ips = [args.batch * args.steps / t for t in w["times"]]
        ratios = [rt / t for t, rt in zip(w["times"], ref_times)]
        summary[w["label"]] = {"img_per_s": ips, "ratio_to_ref": ratios, "info": w["info"],
                               "dtype": w["dtype"], "env": w["env"]}
        print(f"{w['label']:>18} {statistics.median(ips):15,.0f} "
              f"{statistics.median(ratios):20.2f} {min(ratios):6.2f}-{max(ratios):.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"model": args.model, "batch": args.batch, "steps": args.steps,
                       "reference": ref_label, "reference_times": ref_times,
                       "workers": summary}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
