"""The trainer's train-step program on synthetic data, compiled ahead of time, for timing.

`synthetic_program` builds the program `gedl_jax.train` runs (`programs.single`, or
`programs.vmapped` for several seeds: the same step, keys, epoch order and initialisation) on
uint8 images resident on the device; `compiled_train_step` compiles it. bin/benchmark.py times
it; the speed and profiling scripts of studies/ use it too.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import jax
import numpy as np

from gedl_jax import config as config_lib
from gedl_jax import data, methods
from gedl_jax.run import experiment
from gedl_jax.run import optimizer, programs, sharding
from gedl_jax.run import steps as steps_lib


def synthetic_program(model_name: str, batch: int, dtype: str, num_devices: int, steps: int,
                      seeds: int = 1, variant: str = "gedl",
                      device_loop: bool = False) -> programs.SeedProgram:
    """The trainer's program (`programs.single`, or `programs.vmapped` for `seeds` > 1) of
    `variant` with network `model_name` on `steps` batches of synthetic uint8 images: the
    ConvNet on MNIST-shaped ones, any other network on CIFAR-shaped ones. With `device_loop`,
    up to `steps` steps per call (`steps.multi_step`), else one."""
    dataset = "mnist" if model_name == "convnet" else "cifar10"
    config = experiment.resolve_config(config_lib.set_fields(
        config_lib.build_config(dataset, variant), compute_dtype=dtype, batch_size=batch,
        model=model_name), num_devices)
    image_shape = (28, 28, 1) if model_name == "convnet" else (32, 32, 3)
    mesh = sharding.make_mesh(jax.devices()[:num_devices])
    method = methods.build(config, methods.MethodSetup(10, (1,) * 10, image_shape))
    tx = optimizer.make_optimizer(config, total_steps=10 * steps)
    settings = steps_lib.StepSettings(steps_per_epoch=steps, batch_size=batch,
                                      augment=config.augment, normalize_mean=None,
                                      normalize_std=None)
    n = batch * steps
    rng = np.random.default_rng(0)
    train = data.Split(rng.integers(0, 256, (n, *image_shape), np.uint8),
                       rng.integers(0, 10, n).astype(np.int32), "synthetic/train", "synthetic")
    max_steps = steps if device_loop else 1
    if seeds == 1:
        return programs.single(method, tx, mesh, settings, 0, train, max_steps)
    return programs.vmapped(method, tx, mesh, settings, list(range(seeds)),
                            np.tile(np.arange(n), (seeds, 1)), train, [(None, None)] * seeds,
                            max_steps)


def compiled_train_step(model_name: str, batch: int, dtype: str, num_devices: int, steps: int,
                        seeds: int = 1, variant: str = "gedl",
                        device_loop: bool = False) -> tuple[Callable[[int], None], float]:
    """The real GEDL train step (as `gedl_jax.train` runs it: `synthetic_program`), compiled,
    on `steps` batches of synthetic uint8 data resident on the device (another preset's step
    with `variant`; `model_name` may be any network `config.model` takes).

    Returns (run, compile_s): `run(n)` does n steps from the current state and blocks on the
    result; with `seeds` > 1 the vmapped multi-seed step (`config.vmap_seeds`); with
    `device_loop` the program the training loop runs, up to `steps` steps per call
    (`steps.multi_step`), called once for `run(steps)`. `run.compiled` is the compiled XLA
    program behind the timings.
    """
    program = synthetic_program(model_name, batch, dtype, num_devices, steps, seeds, variant,
                                device_loop)
    order = program.epoch_order(0)
    t0 = time.perf_counter()
    compiled_steps = program.compile(order)
    compile_s = time.perf_counter() - t0
    current = {"state": program.state}

    def run(num_steps: int) -> None:
        state = current["state"]
        for start in range(0, num_steps, program.max_steps):
            state, metrics = compiled_steps(state, min(program.max_steps, num_steps - start))
        jax.block_until_ready(metrics)
        current["state"] = state

    run.compiled = compiled_steps.executable
    return run, compile_s


def loop_rate(records: list[dict], batch_size: int) -> dict:
    """The training loop's steady images/s from a run's metrics.jsonl records: from the first
    epoch end's validation record to the last one's, so each epoch in the window has its steps
    and its epoch end (validation, checkpoints), and the first epoch, which compiles the step
    and the validation, is left out. With fewer than two validations: from the first train
    record to the last (the first record's window, which compiles the step, left out)."""
    validations = [r for r in records if r["split"] == "validation"]
    if len(validations) >= 2:
        first, last = validations[0], validations[-1]
        window = f"epoch ends at steps {first['step']}-{last['step']}"
    else:
        train = [r for r in records if r["split"] == "train"]
        first, last = train[0], train[-1]
        window = f"train records at steps {first['step']}-{last['step']}"
    steps = last["step"] - first["step"]
    return {"loop_images_per_s": steps * batch_size / (last["time"] - first["time"]),
            "loop_window": window, "loop_window_steps": steps}
