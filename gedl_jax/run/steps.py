"""The train state and the jitted steps: one data-parallel program, `jax.shard_map` over "data".

The whole training split lives on the devices (replicated); each step slices its global batch
from the epoch's permutation, converts and augments it on device, and lays it out over the
"data" axis. No host round-trip happens inside a step: metrics stay on device until the loop
asks for them. What is trained is the method's business (`gedl_jax.methods`): the step calls
`method.loss` per device and differentiates the global mean.

Gradient convention (measured on jax 0.10-0.12): inside `shard_map` with `check_vma=True` the
gradient of replicated parameters is already summed over devices, so we differentiate the
*global* mean loss `pmean(mean_local_loss)`; that gives exactly the single-device gradient of the
global batch (tests/test_steps.py checks this on 4 fake devices).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec as P

from gedl_jax import data
from gedl_jax.methods import Method, StepContext
from gedl_jax.run.sharding import AXIS, batch_sharding, replicated


@flax.struct.dataclass
class TrainState:
    """Everything a resumed run needs besides the config (the data order is a pure function of
    the seed and the epoch, so the step counter determines it).

    model_state: the model's mutable collections ({"batch_stats": ...} for VGG16, else {}).
    method_state: the method's own state (the EDL family: GEDL's tau accumulator).
    """

    step: jax.Array
    params: Any
    model_state: Any
    opt_state: Any
    method_state: Any

    @property
    def variables(self) -> dict[str, Any]:
        """The flax variables the model applies."""
        return {"params": self.params, **self.model_state}


def init_train_state(method: Method, tx: optax.GradientTransformation, key: jax.Array,
                     image_shape: tuple[int, ...]) -> TrainState:
    """The step-0 train state: the method's initial variables for images of `image_shape`,
    the optimiser state of `tx` and the method's own state."""
    variables = dict(method.init(key, image_shape))
    params = variables.pop("params")
    return TrainState(step=jnp.zeros((), jnp.int32), params=params, model_state=variables,
                      opt_state=tx.init(params), method_state=method.init_method_state())


@dataclasses.dataclass(frozen=True)
class StepSettings:
    steps_per_epoch: int
    batch_size: int
    augment: bool
    normalize_mean: tuple[float, ...] | None
    normalize_std: tuple[float, ...] | None


def _tree_where(cond, new, old):
    return jax.tree.map(lambda a, b: jnp.where(cond, a, b), new, old)


def _all_finite(tree) -> jax.Array:
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)


def _make_local_step(method: Method, tx: optax.GradientTransformation) -> Callable:
    """The per-device body of a train step: forward, loss, global-mean gradient, update.

    Runs inside `shard_map` (collectives over AXIS); pure in its arguments, so it can also be
    `vmap`ped over a leading seed axis of every argument but `epoch`.
    """
    def pmean(x):
        return jax.lax.pmean(x, AXIS)

    def local_step(state: TrainState, images_BxHxWxC, labels_B, epoch, dropout_key):
        # Each device draws its own dropout mask.
        ctx = StepContext(epoch=epoch, key=jax.random.fold_in(dropout_key,
                                                              jax.lax.axis_index(AXIS)),
                          mean=pmean, sum=lambda x: jax.lax.psum(x, AXIS))

        def loss_fn(params):
            out = method.loss(params, state.model_state, state.method_state, images_BxHxWxC,
                              labels_B, ctx)
            return pmean(jnp.mean(out.loss_B)), out   # the global mean (module docstring)

        (loss, out), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        updates, new_opt_state = tx.update(grads, state.opt_state, state.params)
        finite = jnp.isfinite(loss) & _all_finite(grads)
        # A non-finite step changes nothing but the step counter; the loop stops the run at its
        # next metrics fetch, so no checkpoint ever holds non-finite parameters.
        new_state = TrainState(
            step=state.step + 1,
            params=_tree_where(finite, optax.apply_updates(state.params, updates),
                               state.params),
            model_state=_tree_where(finite, out.model_state, state.model_state),
            opt_state=_tree_where(finite, new_opt_state, state.opt_state),
            method_state=_tree_where(finite, out.method_state, state.method_state))
        metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads),
                   "nonfinite": jnp.logical_not(finite).astype(jnp.int32)}
        for name, value in out.logs.items():
            name = "accuracy" if name == "correct_B" else name
            metrics[name] = pmean(jnp.mean(value)) if jnp.ndim(value) else value
        return new_state, metrics

    return local_step


def _input_batch(settings: StepSettings, images_NxHxWxC, labels_N, order_N, step,
                 augment_key, mean, std) -> tuple[jax.Array, jax.Array]:
    """Batch `step % steps_per_epoch` of the epoch order, augmented and converted on device."""
    batch_index = step % settings.steps_per_epoch
    images_u8, labels_B = data.take_batch(images_NxHxWxC, labels_N, order_N, batch_index,
                                          settings.batch_size)
    if settings.augment:
        # On the uint8 pixels, so crop/rotation fill is pixel 0 as in the reference even with
        # normalisation; keyed from the step number: a resumed run draws the same ones.
        images_u8 = data.augment_cifar(jax.random.fold_in(augment_key, step), images_u8)
    return data.to_float(images_u8, mean, std), labels_B.astype(jnp.int32)


def _as_array(stats: tuple[float, ...] | None) -> jax.Array | None:
    return None if stats is None else jnp.asarray(stats)


def make_train_step(method: Method, tx: optax.GradientTransformation, mesh,
                    settings: StepSettings, keys: dict[str, jax.Array],
                    max_steps: int = 1, device_loop: bool = False) -> Callable:
    """Returns `train_step(state, images_NxHxWxC, labels_N, permutation_N) -> (state, metrics)`;
    with `device_loop`, `train_steps(state, num_steps, images_NxHxWxC, labels_N,
    permutation_N)`: up to `max_steps` steps in one call (`multi_step`), the program the
    training loop runs.

    `state` is donated. `images`/`labels` are the device-resident training split (uint8/int32,
    replicated); `permutation` is the current epoch's order (`data.epoch_permutation`).
    """
    mean, std = _as_array(settings.normalize_mean), _as_array(settings.normalize_std)
    sharded_step = jax.shard_map(
        _make_local_step(method, tx), mesh=mesh,
        in_specs=(P(), P(AXIS), P(AXIS), P(), P()),
        out_specs=(P(), P()))
    layout = batch_sharding(mesh)

    def train_step(state: TrainState, images_NxHxWxC, labels_N, permutation_N):
        step = state.step
        x, labels_B = _input_batch(settings, images_NxHxWxC, labels_N, permutation_N, step,
                                   keys["augment"], mean, std)
        x = jax.lax.with_sharding_constraint(x, layout)
        labels_B = jax.lax.with_sharding_constraint(labels_B, layout)
        dropout_key = jax.random.fold_in(keys["dropout"], step)
        return sharded_step(state, x, labels_B, step // settings.steps_per_epoch, dropout_key)

    return _compiled(train_step, max_steps, device_loop)


def make_multi_seed_train_step(method: Method, tx: optax.GradientTransformation, mesh,
                               settings: StepSettings, max_steps: int = 1,
                               device_loop: bool = False) -> Callable:
    """S seeds trained in one program: the single-seed step `vmap`ped over a leading seed axis.

    Returns `train_step(state_S, images_NxHxWxC, labels_N, order_SxN, keys_S, mean_SxC, std_SxC)
    -> (state_S, metrics_S)`. Every leaf of `state_S` has a leading axis of size S (all seeds at
    the same step); `images`/`labels` are one shared pool (the official training split) and
    `order_SxN` is each seed's epoch order as indices into the pool, so seeds may use different
    train/validation splits without S copies of the images. `keys_S` holds each seed's
    "augment" and "dropout" keys, shape (S, 2); `mean_SxC`/`std_SxC` each seed's normalisation
    statistics, or None. Seed s computes exactly what `make_train_step` computes for that seed
    (same batch, augmentation and dropout draws), with the seeds batched into one larger
    computation: on an accelerator that a single small model cannot fill, S seeds cost little more
    than one. `state_S` is donated. `device_loop`: up to `max_steps` steps per call, as
    `make_train_step`.
    """
    local_step = jax.vmap(_make_local_step(method, tx), in_axes=(0, 0, 0, None, 0))
    sharded_step = jax.shard_map(
        local_step, mesh=mesh,
        in_specs=(P(), P(None, AXIS), P(None, AXIS), P(), P()),
        out_specs=(P(), P()))
    layout = batch_sharding(mesh, leading=1)

    def train_step(state_S: TrainState, images_NxHxWxC, labels_N, order_SxN, keys_S,
                   mean_SxC=None, std_SxC=None):
        step = state_S.step[0]  # the seeds advance together
        x_SxB, labels_SxB = jax.vmap(
            lambda order_N, augment_key, mean, std: _input_batch(
                settings, images_NxHxWxC, labels_N, order_N, step, augment_key, mean, std),
            in_axes=(0, 0, None if mean_SxC is None else 0, None if std_SxC is None else 0))(
                order_SxN, keys_S["augment"], mean_SxC, std_SxC)
        x_SxB = jax.lax.with_sharding_constraint(x_SxB, layout)
        labels_SxB = jax.lax.with_sharding_constraint(labels_SxB, layout)
        dropout_keys_S = jax.vmap(lambda k: jax.random.fold_in(k, step))(keys_S["dropout"])
        return sharded_step(state_S, x_SxB, labels_SxB, step // settings.steps_per_epoch,
                            dropout_keys_S)

    return _compiled(train_step, max_steps, device_loop)


def _compiled(train_step: Callable, max_steps: int, device_loop: bool) -> Callable:
    """`train_step` jitted with the state donated; with `device_loop`, the jitted
    `multi_step(state, num_steps, *args) -> (state, metrics)` instead (`multi_step`)."""
    if not device_loop:
        return jax.jit(train_step, donate_argnums=(0,))
    return jax.jit(multi_step(train_step, max_steps), donate_argnums=(0,))


def multi_step(train_step: Callable, max_steps: int) -> Callable:
    """`num_steps` applications of `train_step` in one program: `(state, num_steps, *args) ->
    (state, metrics)`, where `num_steps` (an int32 scalar, at most `max_steps`) is an argument,
    so every count runs the same compiled program, and each metric has `max_steps` leading
    rows: row i holds step i's value, the rows from `num_steps` on are zeros.

    One dispatch for many steps: the host neither waits for nor launches each step, which on
    an accelerator costs more than a small model's step itself. The training loop runs this
    program for every call, one step or a hundred, so the parameters do not depend on how
    the steps are cut into calls (tests/test_multi_step.py). They are not bit-identical to
    `train_step` compiled alone: inside XLA's while loop the convolution gradients sum in
    another order (on XLA:CPU up to ~1e-7 relative on a conv kernel's gradient).
    """
    def run(state, num_steps, *args):
        _, metrics_shape = jax.eval_shape(train_step, state, *args)
        rows = jax.tree.map(lambda m: jnp.zeros((max_steps, *m.shape), m.dtype), metrics_shape)

        def body(i, carry):
            state, rows = carry
            state, metrics = train_step(state, *args)
            return state, jax.tree.map(lambda r, m: r.at[i].set(m), rows, metrics)

        return jax.lax.fori_loop(0, num_steps, body, (state, rows))

    return run


def stack_states(states: list) -> Any:
    """[state_0, ..., state_{S-1}] -> one state with a leading seed axis on every leaf."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *states)


def unstack_state(state_S, index: int) -> Any:
    """Seed `index` of a state with a leading seed axis."""
    return jax.tree.map(lambda x: x[index], state_S)


POSTHOC_PREFIX = "posthoc/"   # the keys of `method.posthoc_outputs` in a predictor's outputs


def make_predict_step(method: Method, mesh, normalize_mean=None,
                      normalize_std=None, with_posthoc: bool = False,
                      posthoc_features: bool = True) -> Callable:
    """`predict_step(variables, method_state, images_BxHxWxC_u8, key) -> raw outputs`
    (`method.predict`: a dict of per-example arrays). `with_posthoc`: also
    `method.posthoc_outputs` (the network's logits and, with `posthoc_features`, its
    penultimate features, which the post-hoc OOD scores read) under `POSTHOC_PREFIX` + their
    names, from the same program: XLA computes the network once for both (on XLA:CPU the
    predictions are bit for bit those of the predictor without them,
    tests/test_posthoc_run.py).

    The batch is laid out over the "data" axis by the jit partitioner (batch norm uses its
    running statistics in evaluation); the outputs are gathered onto every device, so each
    process can read all of them (JAX refuses to fetch an array with shards on other
    processes' devices).
    """
    mean, std = _as_array(normalize_mean), _as_array(normalize_std)
    layout = batch_sharding(mesh)

    @functools.partial(jax.jit, out_shardings=replicated(mesh))
    def predict_step(variables, method_state, images_BxHxWxC, key):
        x = jax.lax.with_sharding_constraint(data.to_float(images_BxHxWxC, mean, std), layout)
        out = dict(method.predict(variables, method_state, x, key))
        if with_posthoc:
            out.update({POSTHOC_PREFIX + k: v for k, v in method.posthoc_outputs(
                variables, x, with_features=posthoc_features).items()})
        return out

    return predict_step


def split_posthoc(raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the method's raw outputs, the post-hoc outputs by their own names) of a
    `make_predict_step(..., with_posthoc=True)` result."""
    posthoc = {k[len(POSTHOC_PREFIX):]: v for k, v in raw.items() if k.startswith(POSTHOC_PREFIX)}
    return {k: v for k, v in raw.items() if not k.startswith(POSTHOC_PREFIX)}, posthoc
