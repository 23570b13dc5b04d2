"""gedl_jax/run/step_benchmark.py: what bin/benchmark.py times is the trainer's own program
(`run/programs.py`), and the ahead-of-time compiled step (`SeedProgram.compile`) computes what
the trainer's `program.steps` computes, bit for bit."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from gedl_jax.run import step_benchmark

# The MLP on CIFAR-shaped images: the cheapest network to compile.
MODEL, BATCH, STEPS = "mlp", 4, 2


def _leaves(state):
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(state))]


def _copy(state):
    """A copy in new buffers, same placement: the step donates the state it is given."""
    return jax.tree.map(lambda x: jax.device_put(np.asarray(x), x.sharding), state)


@pytest.mark.parametrize("seeds,device_loop", [(1, False), (1, True), (2, True)])
def test_the_compiled_step_is_the_trainers_step(seeds, device_loop):
    program = step_benchmark.synthetic_program(MODEL, BATCH, "float32", 1, STEPS, seeds,
                                               device_loop=device_loop)
    order = program.epoch_order(0)
    compiled = program.compile(order)
    n = program.max_steps
    assert n == (STEPS if device_loop else 1)
    by_trainer, _ = program.steps(_copy(program.state), order, n)
    by_benchmark, metrics = compiled(_copy(program.state), n)
    assert "HloModule" in compiled.executable.as_text()
    for a, b in zip(_leaves(by_trainer), _leaves(by_benchmark), strict=True):
        np.testing.assert_array_equal(a, b)
    steps_done = np.asarray(jax.device_get(by_benchmark.step))
    assert np.all(steps_done == n) and steps_done.size == seeds
    assert np.all(np.isfinite(np.asarray(jax.device_get(metrics["loss"]))))


def test_compiled_train_step_runs_any_number_of_steps():
    run, compile_s = step_benchmark.compiled_train_step(MODEL, BATCH, "float32", 1, STEPS,
                                                        device_loop=True)
    assert compile_s > 0 and "HloModule" in run.compiled.as_text()
    run(1)
    run(STEPS + 1)   # more than one call's worth: two calls of the device loop
