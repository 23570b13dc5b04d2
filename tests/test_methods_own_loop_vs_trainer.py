"""A user's own loop with EvidentialObjective reproduces the built-in trainer's GEDL run.

Same network (the built-in ConvNet, the config's init), same parameter-init key, same data order
(`experiment.run_keys(seed)["order"]` folded with the epoch), same optimiser (the config's Adam
with cosine decay): 20 steps of the trainer's own program (`programs.single`, what
`train.train_and_evaluate` runs) against 20 steps of a plain jitted step calling the objective.
The two are separately compiled XLA programs (the trainer's is a shard_map with in-graph
batching), so the losses agree to float32 rounding, not necessarily bit for bit (measured: at
most ~2e-7 relative; the parameters at the end identical with XLA's optimisations off, within
~1.4e-6 with them on).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from gedl_jax import configuration, data
from gedl_jax.run import experiment
from gedl_jax.run import optimizer
from gedl_jax.run import programs
from gedl_jax.run import sharding
from gedl_jax.run import steps
from gedl_jax import EvidentialObjective

SEED, N, BATCH, STEPS = 0, 256, 32, 20


def _generated_mnist():
    """MNIST-shaped uint8 images with a learnable signal (class k lights rows 2k+4, 2k+5)."""
    rng = np.random.default_rng(0)
    labels = (np.arange(N) % 10).astype(np.int32)
    rng.shuffle(labels)
    images = rng.integers(0, 96, size=(N, 28, 28, 1), dtype=np.uint8)
    for k in range(10):
        images[labels == k, 2 * k + 4: 2 * k + 6, 4:24] = 255
    return data.Split(images, labels, "generated/train")


def test_own_loop_reproduces_the_trainers_gedl_losses(fast_compile):
    config = configuration.build_config("mnist", "gedl")
    config.batch_size = BATCH
    config.num_epochs = 3
    train = _generated_mnist()
    steps_per_epoch = N // BATCH                          # as train._prepare_loop
    tx = optimizer.make_optimizer(config, steps_per_epoch * config.num_epochs)
    method = experiment.build_method(config, train)

    # --- the built-in trainer's program -----------------------------------------------------
    settings = steps.StepSettings(steps_per_epoch=steps_per_epoch, batch_size=BATCH,
                                  augment=False, normalize_mean=None, normalize_std=None)
    program = programs.single(method, tx, sharding.make_mesh(jax.devices()[:1]), settings, SEED,
                              train)
    trainer_losses = []
    for step in range(STEPS):
        if step % steps_per_epoch == 0:
            order = program.epoch_order(step // steps_per_epoch)
        program.state, metrics = program.steps(program.state, order, 1)
        trainer_losses.append(float(metrics["loss"]))
    trainer_state = jax.device_get(program.state)

    # --- a user's own loop -------------------------------------------------------------------
    model = method.train_model                          # the config's ConvNet (init "flax")
    keys = experiment.run_keys(SEED)
    params = model.init({"params": keys["init"], "dropout": keys["init"]},
                        jnp.zeros((1, 28, 28, 1)), train=False)["params"]
    objective = EvidentialObjective.gedl(num_classes=10, steps_per_epoch=steps_per_epoch)
    assert objective.spec == method.spec
    opt_state, obj_state = tx.init(params), objective.init()

    @jax.jit
    def train_step(params, opt_state, obj_state, x, y):
        def loss_fn(p):
            loss, new_obj_state, _ = objective(model.apply({"params": p}, x, train=True), y,
                                               obj_state)
            return loss, new_obj_state

        (loss, obj_state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, obj_state, loss

    images, labels = jnp.asarray(train.images), jnp.asarray(train.labels)
    own_losses = []
    for step in range(STEPS):
        epoch, index = divmod(step, steps_per_epoch)
        if index == 0:
            perm = data.epoch_permutation(jax.random.fold_in(keys["order"], epoch), N)
        batch = perm[index * BATCH:(index + 1) * BATCH]
        params, opt_state, obj_state, loss = train_step(
            params, opt_state, obj_state, data.to_float(images[batch]), labels[batch])
        own_losses.append(float(loss))

    # The GEDL loss of every step, to float32 rounding (it rises with the KL weight 1/tau).
    np.testing.assert_allclose(own_losses, trainer_losses, rtol=1e-6)
    assert len(set(np.round(trainer_losses, 4))) > 15          # not a constant trajectory
    # The same tau accumulator (20 steps: two completed epochs and 4 steps of the third) ...
    assert int(obj_state.step) == int(trainer_state.step) == STEPS
    for got, want in zip(obj_state.tau, trainer_state.method_state):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    assert int(obj_state.tau.epoch) == 2 and int(obj_state.tau.epoch_count) == 4
    # ... and the same parameters.
    for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(trainer_state.params)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
