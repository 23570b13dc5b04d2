"""What an epoch end's checkpoint saves cost: the host's time for them, and the training steps'
speed while they run.

    python -m studies.checkpoint_save_cost [--seeds=5] [--epoch_ends=6] [--model=convnet]
    python -m studies.checkpoint_save_cost --beside_steps [--seeds=5] [--epochs=10]
    python -m studies.checkpoint_save_cost --layouts [--model=convnet]

Without `--beside_steps`: `--seeds` runs' `best` and `last` saves of the trainer's train state
(GEDL, the MNIST ConvNet by default), handed to one saver thread as the training loop hands them
off the CPU (`gedl_jax.run.checkpointing.RunCheckpoints`), for `--epoch_ends` epoch ends. It
prints, per epoch end, the wall time until every save is on disk and the process's CPU time over
it (every thread's: Orbax's Python work, which holds the interpreter's lock, and TensorStore's).
The first epoch end, which creates the folders and Orbax's thread pools, is left out of the
median.

With `--layouts`: one save's wall and CPU time (the median of 6, after 2) for the train state
as the trainer saves it (every array, beside the loop's JSON metadata) and for the same bytes
as one array, with and without the metadata: what a save costs per array and what it costs
anyway.

With `--beside_steps` (for a GPU): the trainer's program (`step_benchmark.synthetic_program`:
`--seeds` seeds vmapped, `--steps_per_call` steps a call, the device loop) dispatched as the
training loop does (the next call queued before the last one's metrics are fetched) for
`--epochs` epochs of `--calls_per_epoch` calls, each epoch end handing every seed's `best` and
`last` to the saver thread, as an epoch where every seed improved does. It prints the steps'
images/s in each setting, one after another in this process:
- `alone`: no saves (the floor of this loop);
- `saves`: the trainer's saves (Orbax's asynchronous mode, in the saver thread);
- `saves_sync`: the same saves with Orbax's synchronous mode inside the saver thread;
- `saves_switch_1ms`: the trainer's saves with Python's thread switch interval at 1 ms (5 ms
  by default), so the loop's thread waits less for the interpreter's lock;
- `saves_two_queued`: the trainer's saves, the loop fetching the metrics of the call two
  before the newest, so two calls stay queued on the device while the host works.
What kept a vmapped run above its floor on a GPU is the question
(docs/results/gpu/nvidia_h200/earlier_78c8da6/NOTES.md): there the epochs took 100-170 ms
longer per extra save. Since then the trainer saves at most a round a minute
(`config.checkpoint_interval_seconds`), and five seeds ran at 1.15x their floor on an H200
(docs/results/gpu/nvidia_h200/earlier_492beaf/NOTES.md). On a CPU the host is the device, so only
`--dry_run` (the MLP, two epochs of two calls of two steps) is meant to run there: it checks
the script.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import os
import pathlib
import platform
import sys
import tempfile
import time

import jax
import numpy as np
import orbax.checkpoint as ocp

from gedl_jax.run import checkpointing, step_benchmark

META = {"best_val_accuracy": 0.5, "best_step": 1, "epoch": 1, "variant": "gedl", "seed": 0}
SETTINGS = ("alone", "saves", "saves_sync", "saves_switch_1ms", "saves_two_queued")


def epoch_end_costs(state, seeds: int, epoch_ends: int) -> list[tuple[float, float]]:
    """(wall s, process CPU s) of each epoch end's saves of `state`: `best` and `last` for each
    of `seeds` runs."""
    saver = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gedl-checkpoints")
    costs = []
    with tempfile.TemporaryDirectory() as root:
        runs = [checkpointing.RunCheckpoints(pathlib.Path(root) / f"seed_{s}", saver)
                for s in range(seeds)]
        for step in range(1, epoch_ends + 1):
            wall, cpu = time.perf_counter(), time.process_time()
            for ckpt in runs:
                ckpt.save_best(step, state, META)
                ckpt.save_last(step, state, META)
            for ckpt in runs:
                ckpt.wait()
            costs.append((time.perf_counter() - wall, time.process_time() - cpu))
            if not all(step in c.last_steps() and c.best.latest_step() == step for c in runs):
                raise RuntimeError(f"a save of epoch end {step} is not on disk")
        for ckpt in runs:
            ckpt.close()
    saver.shutdown()
    return costs


def layout_costs(state) -> dict[str, tuple[float, float]]:
    """{layout: (wall s, process CPU s)} of one synchronous save (`--layouts`)."""
    flat = {"flat": jax.numpy.concatenate(
        [x.reshape(-1).astype(np.float32) for x in jax.tree.leaves(state)])}
    layouts = {"every array + metadata": (state, True), "every array": (state, False),
               "one array + metadata": (flat, True), "one array": (flat, False)}
    costs = {}
    with tempfile.TemporaryDirectory() as root:
        for i, (name, (tree, with_meta)) in enumerate(layouts.items()):
            manager = ocp.CheckpointManager(
                pathlib.Path(root) / str(i),
                options=ocp.CheckpointManagerOptions(max_to_keep=2, create=True))
            items = {"state": ocp.args.StandardSave(tree)}
            if with_meta:
                items["meta"] = ocp.args.JsonSave(META)
            runs = []
            for step in range(8):
                wall, cpu = time.perf_counter(), time.process_time()
                manager.save(step, args=ocp.args.Composite(**items))
                manager.wait_until_finished()
                runs.append((time.perf_counter() - wall, time.process_time() - cpu))
            manager.close()
            costs[name] = tuple(np.median(np.array(runs[2:]), axis=0))
    return costs


def _synchronous(ckpt: checkpointing.RunCheckpoints) -> None:
    """`ckpt`'s managers in Orbax's synchronous mode (each save returns once on disk)."""
    for name in ("last", "best"):
        manager = getattr(ckpt, name)
        options = dataclasses.replace(manager._options, enable_async_checkpointing=False)
        manager.close()
        setattr(ckpt, name, ocp.CheckpointManager(manager.directory, options=options))


def steps_beside_saves(program, compiled, seeds: int, setting: str, epochs: int,
                       calls_per_epoch: int, root: pathlib.Path) -> tuple[float, int]:
    """(seconds, steps) of `epochs` x `calls_per_epoch` calls of `compiled` (`program`'s steps
    of `seeds` seeds, compiled once for every setting), dispatched as the training loop
    dispatches them, with `setting`'s saves at each epoch end (module docstring). The clock
    starts after one warm-up epoch."""
    saver = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gedl-checkpoints")
    runs = [] if setting == "alone" else [
        checkpointing.RunCheckpoints(root / setting / f"seed_{s}", saver) for s in range(seeds)]
    if setting == "saves_sync":
        for ckpt in runs:
            _synchronous(ckpt)
    switch = sys.getswitchinterval()
    if setting == "saves_switch_1ms":
        sys.setswitchinterval(0.001)
    try:
        # a copy: the calls donate their input state, and every setting starts from the same
        state = jax.tree.map(lambda x: x.copy(), program.state)
        queued = 2 if setting == "saves_two_queued" else 1   # calls left pending at a fetch
        pending, start, step = [], None, 0
        for epoch in range(epochs + 1):   # epoch 0 warms up: compiles the copy, starts Orbax
            if epoch == 1:
                jax.block_until_ready(state)
                start = time.perf_counter()
            for _ in range(calls_per_epoch):
                state, metrics = compiled(state, program.max_steps)
                step += program.max_steps
                pending.append(metrics)
                while len(pending) > queued:   # as the loop fetches: the calls before
                    jax.device_get(pending.pop(0))
            members = [program.detached(state, i) for i in range(seeds)]
            for ckpt, member in zip(runs, members):
                ckpt.save_best(step, member, META)
                ckpt.save_last(step, member, META)
        jax.block_until_ready((state, *pending))
        seconds = time.perf_counter() - start
        for ckpt in runs:
            ckpt.wait()
            if step not in ckpt.last_steps() or ckpt.best.latest_step() != step:
                raise RuntimeError(f"the saves of step {step} are not on disk")
            ckpt.close()
    finally:
        sys.setswitchinterval(switch)
        saver.shutdown()
    return seconds, epochs * calls_per_epoch * program.max_steps


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=5,
                        help="runs saved at each epoch end, each a best and a last save (with "
                             "--beside_steps: seeds vmapped in the program; default 5)")
    parser.add_argument("--epoch_ends", type=int, default=6,
                        help="epoch ends timed; the first is left out of the median (default 6)")
    parser.add_argument("--model", default="convnet",
                        help="network of the saved train state: convnet (MNIST shapes) or "
                             "another of gedl_jax.networks, e.g. vgg16 (CIFAR shapes)")
    parser.add_argument("--beside_steps", action="store_true",
                        help="instead: the training steps' images/s beside the saves, in each "
                             "of --settings (for a GPU)")
    parser.add_argument("--layouts", action="store_true",
                        help="instead: one save's wall and CPU time for the train state as "
                             "saved and as one array, with and without the metadata")
    parser.add_argument("--epochs", type=int, default=10,
                        help="with --beside_steps: timed epochs, after one warm-up epoch")
    parser.add_argument("--calls_per_epoch", type=int, default=4,
                        help="with --beside_steps: compiled calls an epoch")
    parser.add_argument("--steps_per_call", type=int, default=100,
                        help="with --beside_steps: training steps a call (batch 128)")
    parser.add_argument("--settings", default=",".join(SETTINGS),
                        help="with --beside_steps: comma-separated settings to time, of "
                             + ", ".join(SETTINGS) + " (default: all)")
    parser.add_argument("--dry_run", action="store_true",
                        help="--beside_steps on the MLP, 2 epochs of 2 calls of 2 steps")
    args = parser.parse_args(argv)
    if args.dry_run:
        args.beside_steps, args.model, args.epochs = True, "mlp", 2
        args.calls_per_epoch, args.steps_per_call = 2, 2
    where = (f"jax {jax.__version__} on {jax.default_backend()} ({jax.devices()[0].device_kind}), "
             f"{platform.machine()} with {os.cpu_count()} CPU cores")
    if args.beside_steps:
        program = step_benchmark.synthetic_program(
            args.model, 128, "float32", 1, args.steps_per_call, seeds=args.seeds,
            device_loop=True)
        print(f"{args.model}, {args.seeds} seed(s) vmapped, batch 128, {args.steps_per_call} "
              f"steps a call, {args.calls_per_epoch} calls an epoch, {args.epochs} epochs; "
              f"{2 * args.seeds} saves at each epoch end; {where}")
        compiled = program.compile(program.epoch_order(0))
        with tempfile.TemporaryDirectory() as root:
            for setting in args.settings.split(","):
                if setting not in SETTINGS:
                    parser.error(f"unknown setting {setting!r} (one of {', '.join(SETTINGS)})")
                try:
                    seconds, steps = steps_beside_saves(
                        program, compiled, args.seeds, setting, args.epochs,
                        args.calls_per_epoch, pathlib.Path(root))
                except Exception as e:  # noqa: BLE001 (one setting's failure, e.g. another
                    # Orbax's options, must not cost the others' numbers on a lent GPU)
                    print(f"{setting}: failed ({type(e).__name__}: {e})")
                    continue
                print(f"{setting}: {steps * 128 * args.seeds / seconds:,.0f} img/s, "
                      f"{seconds / steps * 1e3:.3f} ms a step ({steps} steps in {seconds:.2f} s)")
        return
    state = step_benchmark.synthetic_program(args.model, 128, "float32", 1, 1).state
    leaves = jax.tree.leaves(state)
    if args.layouts:
        print(f"{args.model} train state: {len(leaves)} arrays, "
              f"{sum(x.nbytes for x in leaves) / 2**20:.1f} MiB; one save each, {where}")
        for name, (wall, cpu) in layout_costs(state).items():
            print(f"{name}: {wall * 1e3:.0f} ms to disk, {cpu * 1e3:.0f} ms of CPU")
        return
    print(f"{args.model} train state: {len(leaves)} arrays, "
          f"{sum(x.nbytes for x in leaves) / 2**20:.1f} MiB; {args.seeds} seed(s) x (best + last) "
          f"saves per epoch end; {where}")
    costs = epoch_end_costs(state, args.seeds, args.epoch_ends)
    for i, (wall, cpu) in enumerate(costs, 1):
        print(f"epoch end {i}: on disk after {wall * 1e3:.0f} ms, process CPU {cpu * 1e3:.0f} ms")
    if len(costs) > 1:
        wall, cpu = np.median(np.array(costs[1:]), axis=0)
        print(f"median of epoch ends 2-{len(costs)}: {wall * 1e3:.0f} ms to disk, "
              f"{cpu * 1e3:.0f} ms of CPU, for {2 * args.seeds} saves")


if __name__ == "__main__":
    main()
