"""Data-parallel train and eval steps: one jitted program, `jax.shard_map` over a 1-D "data" mesh.

The whole training split lives on the devices (replicated); each step slices its global batch
from the epoch's permutation, converts and augments it on device, and lays it out over the
"data" axis. No host round-trip happens inside a step: metrics stay on device until the loop
asks for them.

Gradient convention (platform.md, measured): inside `shard_map` with `check_vma=True` the
gradient of replicated parameters is already summed over devices, so we differentiate the
*global* mean loss `pmean(mean_local_loss)`; that gives exactly the single-device gradient of the
global batch (tests/test_parallel.py checks this on 4 fake devices).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from gedl_jax import data
from gedl_jax import evidential as ev
from gedl_jax import losses

AXIS = "data"


@flax.struct.dataclass
class TrainState:
    """Everything a resumed run needs besides the config (the data order is a pure function of
    the seed and the epoch, so the step counter determines it)."""

    step: jax.Array
    params: Any
    batch_stats: Any
    opt_state: Any
    tau_state: ev.TauState


def make_mesh(devices: list | None = None) -> jax.sharding.Mesh:
    """A 1-D mesh over all devices (of all processes), axis "data"."""
    devices = jax.devices() if devices is None else devices
    return jax.sharding.Mesh(np.asarray(devices), (AXIS,),
                             axis_types=(jax.sharding.AxisType.Auto,))


def replicated(mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def make_optimizer(config, total_steps: int) -> optax.GradientTransformation:
    """Adam with a cosine (or constant) learning rate and L2 or decoupled weight decay.

    "l2" adds wd * params to the gradient before Adam's moments, which is what PyTorch's
    `Adam(weight_decay=...)` in the reference code does; "decoupled" is AdamW.
    """
    if config.lr_schedule == "cosine":
        lr = optax.cosine_decay_schedule(config.learning_rate, decay_steps=max(total_steps, 1))
    else:
        lr = optax.constant_schedule(config.learning_rate)
    parts = []
    if config.grad_clip_norm:
        parts.append(optax.clip_by_global_norm(config.grad_clip_norm))
    if config.weight_decay and config.weight_decay_mode == "l2":
        parts.append(optax.add_decayed_weights(config.weight_decay))
    parts.append(optax.scale_by_adam())
    if config.weight_decay and config.weight_decay_mode == "decoupled":
        parts.append(optax.add_decayed_weights(config.weight_decay))
    parts.append(optax.scale_by_learning_rate(lr))
    return optax.chain(*parts)


def init_train_state(model, tx, key: jax.Array, image_shape: tuple[int, ...]) -> TrainState:
    variables = model.init({"params": key, "dropout": key},
                           jnp.zeros((1, *image_shape), jnp.float32), train=False)
    params = variables["params"]
    return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                      batch_stats=variables.get("batch_stats", {}), opt_state=tx.init(params),
                      tau_state=ev.tau_init())


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


def _make_local_step(model, spec: losses.LossSpec, tx: optax.GradientTransformation) -> Callable:
    """The per-device body of a train step: forward, loss, global-mean gradient, update.

    Runs inside `shard_map` (collectives over AXIS); pure in its arguments, so it can also be
    `vmap`ped over a leading seed axis of every argument but `epoch`.
    """
    def pmean(x):
        return jax.lax.pmean(x, AXIS)

    def local_step(state: TrainState, images_BxHxWxC, labels_B, epoch, dropout_key):
        # Each device draws its own dropout mask.
        dropout_key = jax.random.fold_in(dropout_key, jax.lax.axis_index(AXIS))

        def loss_fn(params):
            variables = {"params": params, "batch_stats": state.batch_stats}
            logits_BxK, new_model_state = model.apply(
                variables, images_BxHxWxC, train=True, mutable=["batch_stats"],
                rngs={"dropout": dropout_key})
            loss_B, new_tau, terms = losses.per_example_loss(
                spec, logits_BxK, labels_B, state.tau_state, epoch, global_mean=pmean)
            # Differentiate the global mean (see module docstring).
            loss = pmean(jnp.mean(loss_B))
            return loss, (new_model_state, new_tau, terms, logits_BxK)

        (loss, (model_state, new_tau, terms, logits_BxK)), grads = jax.value_and_grad(
            loss_fn, has_aux=True)(state.params)
        updates, new_opt_state = tx.update(grads, state.opt_state, state.params)
        new_params = optax.apply_updates(state.params, updates)
        finite = jnp.isfinite(loss) & _all_finite(grads)
        # A non-finite step changes nothing but the step counter; the loop stops the run at its
        # next metrics fetch, so no checkpoint ever holds non-finite parameters.
        new_state = TrainState(
            step=state.step + 1,
            params=_tree_where(finite, new_params, state.params),
            batch_stats=_tree_where(finite, model_state.get("batch_stats", {}),
                                    state.batch_stats),
            opt_state=_tree_where(finite, new_opt_state, state.opt_state),
            tau_state=_tree_where(finite, new_tau, state.tau_state))
        correct_B = (jnp.argmax(logits_BxK, -1) == labels_B).astype(jnp.float32)
        metrics = {
            "loss": loss,
            "accuracy": pmean(jnp.mean(correct_B)),
            "likelihood": pmean(jnp.mean(terms.likelihood_B)),
            "kl": pmean(jnp.mean(terms.kl_B)),
            "kl_weight": terms.kl_weight,
            "mean_strength": terms.mean_strength,
            "mean_prior_strength": terms.mean_prior_strength,
            "grad_norm": optax.tree.norm(grads),
            "nonfinite": jnp.logical_not(finite).astype(jnp.int32),
        }
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


def make_train_step(model, spec: losses.LossSpec, tx: optax.GradientTransformation, mesh,
                    settings: StepSettings, keys: dict[str, jax.Array]) -> Callable:
    """Returns `train_step(state, images_NxHxWxC, labels_N, permutation_N) -> (state, metrics)`.

    `state` is donated. `images`/`labels` are the device-resident training split (uint8/int32,
    replicated); `permutation` is the current epoch's order (`data.epoch_permutation`).
    """
    mean = None if settings.normalize_mean is None else jnp.asarray(settings.normalize_mean)
    std = None if settings.normalize_std is None else jnp.asarray(settings.normalize_std)
    sharded_step = jax.shard_map(
        _make_local_step(model, spec, tx), mesh=mesh,
        in_specs=(P(), P(AXIS), P(AXIS), P(), P()),
        out_specs=(P(), P()))
    batch_sharding = NamedSharding(mesh, P(AXIS))

    @functools.partial(jax.jit, donate_argnums=(0,))
    def train_step(state: TrainState, images_NxHxWxC, labels_N, permutation_N):
        step = state.step
        x, labels_B = _input_batch(settings, images_NxHxWxC, labels_N, permutation_N, step,
                                   keys["augment"], mean, std)
        x = jax.lax.with_sharding_constraint(x, batch_sharding)
        labels_B = jax.lax.with_sharding_constraint(labels_B, batch_sharding)
        dropout_key = jax.random.fold_in(keys["dropout"], step)
        return sharded_step(state, x, labels_B, step // settings.steps_per_epoch, dropout_key)

    return train_step


def make_multi_seed_train_step(model, spec: losses.LossSpec, tx: optax.GradientTransformation,
                               mesh, settings: StepSettings) -> Callable:
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
    than one. `state_S` is donated.
    """
    local_step = jax.vmap(_make_local_step(model, spec, tx), in_axes=(0, 0, 0, None, 0))
    sharded_step = jax.shard_map(
        local_step, mesh=mesh,
        in_specs=(P(), P(None, AXIS), P(None, AXIS), P(), P()),
        out_specs=(P(), P()))
    batch_sharding = NamedSharding(mesh, P(None, AXIS))

    @functools.partial(jax.jit, donate_argnums=(0,))
    def train_step(state_S: TrainState, images_NxHxWxC, labels_N, order_SxN, keys_S,
                   mean_SxC=None, std_SxC=None):
        step = state_S.step[0]  # the seeds advance together
        x_SxB, labels_SxB = jax.vmap(
            lambda order_N, augment_key, mean, std: _input_batch(
                settings, images_NxHxWxC, labels_N, order_N, step, augment_key, mean, std),
            in_axes=(0, 0, None if mean_SxC is None else 0, None if std_SxC is None else 0))(
                order_SxN, keys_S["augment"], mean_SxC, std_SxC)
        x_SxB = jax.lax.with_sharding_constraint(x_SxB, batch_sharding)
        labels_SxB = jax.lax.with_sharding_constraint(labels_SxB, batch_sharding)
        dropout_keys_S = jax.vmap(lambda k: jax.random.fold_in(k, step))(keys_S["dropout"])
        return sharded_step(state_S, x_SxB, labels_SxB, step // settings.steps_per_epoch,
                            dropout_keys_S)

    return train_step


def stack_states(states: list) -> Any:
    """[state_0, ..., state_{S-1}] -> one state with a leading seed axis on every leaf."""
    return jax.tree.map(lambda *xs: jnp.stack(xs), *states)


def unstack_state(state_S, index: int) -> Any:
    """Seed `index` of a state with a leading seed axis."""
    return jax.tree.map(lambda x: x[index], state_S)


def make_eval_step(model, spec: losses.LossSpec, mesh,
                   normalize_mean=None, normalize_std=None) -> Callable:
    """`eval_step(params, batch_stats, images_BxHxWxC_u8) -> (alpha_BxK, prior_strength_B)`.

    The batch is laid out over the "data" axis by the jit partitioner (batch norm uses its
    running statistics in evaluation); the outputs are gathered onto every device, so each
    process can read all of them (JAX refuses to fetch an array with shards on other
    processes' devices).
    """
    mean = None if normalize_mean is None else jnp.asarray(normalize_mean)
    std = None if normalize_std is None else jnp.asarray(normalize_std)
    batch_sharding = NamedSharding(mesh, P(AXIS))

    @functools.partial(jax.jit, out_shardings=replicated(mesh))
    def eval_step(params, batch_stats, images_BxHxWxC):
        x = jax.lax.with_sharding_constraint(data.to_float(images_BxHxWxC, mean, std),
                                             batch_sharding)
        logits_BxK = model.apply({"params": params, "batch_stats": batch_stats}, x, train=False)
        out = losses.evidential_outputs(spec, logits_BxK)
        return out.alpha_BxK, out.prior_strength_B

    return eval_step


def put_replicated(mesh, array: np.ndarray) -> jax.Array:
    """Host array -> one global array replicated on every device (works multi-process too,
    where every process holds the same host data)."""
    sharding = replicated(mesh)
    return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])


def put_batched(mesh, array: np.ndarray) -> jax.Array:
    """(M, B, ...) host array -> global array with the batch axis (1) over "data"."""
    sharding = NamedSharding(mesh, P(None, AXIS))
    return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])


def predict_dirichlet(eval_step, params, batch_stats, mesh, split: data.Split,
                      batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(alpha_NxK, prior_strength_N) for every example of `split`, each exactly once.

    The split is padded to whole batches (`data.pad_for_eval`); padding rows are dropped by the
    mask before anything is returned.
    """
    images, labels, mask = data.pad_for_eval(split.images, split.labels, batch_size)
    del labels
    images_dev = put_batched(mesh, images)
    alphas, strengths = [], []
    for m in range(images.shape[0]):
        alpha_BxK, w_B = eval_step(params, batch_stats, images_dev[m])
        alphas.append(alpha_BxK)
        strengths.append(w_B)
    alpha = np.asarray(jax.device_get(jnp.concatenate(alphas)))
    w = np.asarray(jax.device_get(jnp.concatenate(strengths)))
    keep = mask.reshape(-1)
    return alpha[keep], w[keep]
