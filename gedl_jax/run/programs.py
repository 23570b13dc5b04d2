"""One or several seeds as one compiled program, behind one object (`SeedProgram`).

The training loop never asks how many seeds it trains: it calls `program.steps(state, order,
n)` (n train steps in one call), draws `program.epoch_order(epoch)`, and reads seed i's state
with `program.member(state, i)`. `program.compile(order)` is the same step compiled ahead of
time, for timing it (`gedl_jax.run.step_benchmark`, bin/benchmark.py).
A single seed runs `steps.make_train_step`; S seeds trained together (`config.vmap_seeds`) run
`steps.make_multi_seed_train_step` on states with a leading seed axis, each seed following the
same data order, augmentation and dropout draws as its own sequential run.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from gedl_jax import data
from gedl_jax.methods import Method
from gedl_jax.run import experiment, steps
from gedl_jax.run.sharding import put_replicated, replicated


@dataclasses.dataclass
class SeedProgram:
    """S >= 1 seeds' training as one program.

    state: the TrainState (leaves with a leading seed axis when S > 1).
    step: the jitted step program (`steps.make_train_step` or `make_multi_seed_train_step`);
        `steps` calls it.
    step_inputs: order -> the step's arguments after the state and the step count (the
        resident training data, the order, and the seeds' keys and normalisation if S > 1).
    epoch_order: epoch -> the epoch's order of the training examples (per seed if S > 1).
    member: (state, i) -> seed i's TrainState, as saved and restored.
    detached: (state, i) -> the same in buffers of its own, which the next call (donating the
        program's state) leaves intact: what the loop validates and saves while it goes on.
    stack: [seed states] -> state (for a resume).
    """

    state: Any
    step: Any
    step_inputs: Callable[[jax.Array], tuple]
    max_steps: int
    epoch_order: Callable[[int], jax.Array]
    member: Callable[[Any, int], steps.TrainState]
    stack: Callable[[list], Any]
    num_seeds: int
    detached: Callable[[Any, int], steps.TrainState]

    def steps(self, state, order: jax.Array, n: int) -> tuple[Any, dict[str, jax.Array]]:
        """n <= max_steps train steps in one compiled call (`steps.multi_step`: each metric has
        max_steps leading rows, the first n valid, then a seed axis if S > 1; every n runs the
        same program). max_steps 1: the one-step program, metrics without the row axis."""
        return _call(self.step, self.max_steps, state, self.step_inputs(order), n)

    def compile(self, order: jax.Array) -> Callable[[Any, int], tuple[Any, dict[str, jax.Array]]]:
        """`steps` with this `order`, compiled now (ahead of time): (state, n) -> (state,
        metrics); its `executable` attribute is the compiled XLA program."""
        inputs = self.step_inputs(order)
        count = (np.int32(self.max_steps),) if self.max_steps > 1 else ()
        executable = self.step.lower(self.state, *count, *inputs).compile()

        def compiled_steps(state, n: int):
            return _call(executable, self.max_steps, state, inputs, n)

        compiled_steps.executable = executable
        return compiled_steps

    def current_step(self) -> int:
        """The step the program's state is at (the seeds' maximum)."""
        return int(np.max(jax.device_get(self.state.step)))


@jax.jit
def _copied(state):
    """`state` in new device buffers (one compiled copy; jnp.copy is not forwarded as an
    unchanged input would be)."""
    return jax.tree.map(jnp.copy, state)


def _call(step: Callable, max_steps: int, state, inputs: tuple, n: int):
    if max_steps > 1:
        return step(state, np.int32(n), *inputs)
    assert n == 1, n   # one step per call: the step program itself
    return step(state, *inputs)


def single(method: Method, tx: optax.GradientTransformation, mesh, settings: steps.StepSettings,
           seed: int, train: data.Split, max_steps: int = 1) -> SeedProgram:
    """One seed training on its own training split, resident on the devices, up to
    `max_steps` steps per call."""
    keys = experiment.run_keys(seed)
    image_shape = train.images.shape[1:]
    state = jax.jit(lambda k: steps.init_train_state(method, tx, k, image_shape),
                    out_shardings=replicated(mesh))(keys["init"])
    train_step = steps.make_train_step(method, tx, mesh, settings, keys, max_steps,
                                       device_loop=max_steps > 1)
    images = put_replicated(mesh, train.images)
    labels = put_replicated(mesh, train.labels.astype(np.int32))
    num_train = len(train.labels)
    epoch_order = jax.jit(lambda epoch: data.epoch_permutation(
        jax.random.fold_in(keys["order"], epoch), num_train), out_shardings=replicated(mesh))
    return SeedProgram(
        state=state, step=train_step, step_inputs=lambda order: (images, labels, order),
        max_steps=max_steps, epoch_order=epoch_order, member=lambda state, i: state,
        stack=lambda states: states[0], num_seeds=1,
        detached=lambda state, i: _copied(state))


def vmapped(method: Method, tx: optax.GradientTransformation, mesh,
            settings: steps.StepSettings, seeds: list[int], train_index_SxN: np.ndarray,
            pool: data.Split, norms: list[tuple], max_steps: int = 1) -> SeedProgram:
    """S seeds trained together; `pool` is the official training split every seed's
    `train_index_SxN` row points into, `norms` each seed's normalisation statistics; up to
    `max_steps` steps per call."""
    keys = [experiment.run_keys(s) for s in seeds]
    image_shape = pool.images.shape[1:]
    state = jax.jit(jax.vmap(lambda k: steps.init_train_state(method, tx, k, image_shape)),
                    out_shardings=replicated(mesh))(jnp.stack([k["init"] for k in keys]))
    multi_step = steps.make_multi_seed_train_step(method, tx, mesh, settings, max_steps,
                                                  device_loop=max_steps > 1)
    images = put_replicated(mesh, pool.images)
    labels = put_replicated(mesh, pool.labels.astype(np.int32))
    train_idx_SxN = put_replicated(mesh, train_index_SxN.astype(np.int32))
    order_keys_S = jnp.stack([k["order"] for k in keys])
    step_keys_S = {name: jnp.stack([k[name] for k in keys]) for name in ("augment", "dropout")}
    mean_S = None if norms[0][0] is None else jnp.asarray([n[0] for n in norms])
    std_S = None if norms[0][1] is None else jnp.asarray([n[1] for n in norms])
    num_train = train_index_SxN.shape[1]

    @functools.partial(jax.jit, out_shardings=replicated(mesh))
    def epoch_order(epoch):
        perm_SxN = jax.vmap(lambda k: data.epoch_permutation(
            jax.random.fold_in(k, epoch), num_train))(order_keys_S)
        return jnp.take_along_axis(train_idx_SxN, perm_SxN, axis=1)

    member = jax.jit(steps.unstack_state, static_argnums=1)
    stack = jax.jit(steps.stack_states, out_shardings=replicated(mesh))
    return SeedProgram(
        state=state, step=multi_step,
        step_inputs=lambda order: (images, labels, order, step_keys_S, mean_S, std_S),
        max_steps=max_steps, epoch_order=epoch_order, member=member, stack=stack,
        num_seeds=len(seeds), detached=member)   # a seed's slice is a new buffer already
