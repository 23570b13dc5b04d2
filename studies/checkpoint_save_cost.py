"""What an epoch end's checkpoint saves cost the host: `--seeds` runs' `best` and `last` saves of
the trainer's train state (GEDL, the MNIST ConvNet by default), handed to one saver thread as the
training loop hands them off the CPU (`gedl_jax.run.checkpointing.RunCheckpoints`), repeated
for `--epoch_ends` epoch ends.

    python -m studies.checkpoint_save_cost [--seeds=5] [--epoch_ends=6] [--model=convnet]

Prints, per epoch end: the wall time until every save is on disk and the process's CPU time
over it (every thread's: Orbax's Python work, which holds the interpreter's lock, and
TensorStore's). Five seeds trained together save up to ten checkpoints at an epoch end; on a
GPU the loop's own thread, which dispatches the next steps, shares the interpreter with that
work (docs/results/gpu/nvidia_h200/NOTES.md). The first epoch end, which creates the folders
and Orbax's thread pools, is left out of the median.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import pathlib
import platform
import tempfile
import time

import jax
import numpy as np

from gedl_jax.run import checkpointing, step_benchmark


def epoch_end_costs(state, seeds: int, epoch_ends: int) -> list[tuple[float, float]]:
    """(wall s, process CPU s) of each epoch end's saves of `state`: `best` and `last` for each
    of `seeds` runs."""
    meta = {"best_val_accuracy": 0.5, "best_step": 1, "epoch": 1, "variant": "gedl", "seed": 0}
    saver = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gedl-checkpoints")
    costs = []
    with tempfile.TemporaryDirectory() as root:
        runs = [checkpointing.RunCheckpoints(pathlib.Path(root) / f"seed_{s}", saver)
                for s in range(seeds)]
        for step in range(1, epoch_ends + 1):
            wall, cpu = time.perf_counter(), time.process_time()
            for ckpt in runs:
                ckpt.save_best(step, state, meta)
                ckpt.save_last(step, state, meta)
            for ckpt in runs:
                ckpt.wait()
            costs.append((time.perf_counter() - wall, time.process_time() - cpu))
            if not all(step in c.last_steps() and c.best.latest_step() == step for c in runs):
                raise RuntimeError(f"a save of epoch end {step} is not on disk")
        for ckpt in runs:
            ckpt.close()
    saver.shutdown()
    return costs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--epoch_ends", type=int, default=6)
    parser.add_argument("--model", default="convnet")
    args = parser.parse_args(argv)
    state = step_benchmark.synthetic_program(args.model, 128, "float32", 1, 1).state
    leaves = jax.tree.leaves(state)
    print(f"{args.model} train state: {len(leaves)} arrays, "
          f"{sum(x.nbytes for x in leaves) / 2**20:.1f} MiB; {args.seeds} seed(s) x (best + last) "
          f"saves per epoch end; jax {jax.__version__} on {jax.default_backend()}, "
          f"{platform.machine()} with {os.cpu_count()} CPU cores")
    costs = epoch_end_costs(state, args.seeds, args.epoch_ends)
    for i, (wall, cpu) in enumerate(costs, 1):
        print(f"epoch end {i}: on disk after {wall * 1e3:.0f} ms, process CPU {cpu * 1e3:.0f} ms")
    if len(costs) > 1:
        wall, cpu = np.median(np.array(costs[1:]), axis=0)
        print(f"median of epoch ends 2-{len(costs)}: {wall * 1e3:.0f} ms to disk, "
              f"{cpu * 1e3:.0f} ms of CPU, for {2 * args.seeds} saves")


if __name__ == "__main__":
    main()
