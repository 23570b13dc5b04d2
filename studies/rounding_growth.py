"""How a rounding difference grows through training: the same GEDL run of the MNIST ConvNet
twice, once with XLA's convolutions and once with im2col convolutions (the same arithmetic
summed in another order, as another platform's or another program's kernels may), from the
same initialisation, data order and Adam.

    python -m studies.rounding_growth [--steps=20]

Prints, for every step:
- the free runs' relative loss difference (each run on its own);
- the largest parameter difference after one im2col step taken from the XLA run's state
  (what one step's rounding moves, without the growth).

It is why `tests/test_methods_own_loop_vs_trainer.py` compares a user's loop with the trainer
step by step on every platform, and their free runs on XLA:CPU only (docs/gpu.md). The data are
256 generated MNIST-shaped images, 32 per batch (`generated_mnist`).
"""

from __future__ import annotations

import argparse
import platform

import jax
import jax.numpy as jnp
import numpy as np
import optax

from gedl_jax import EvidentialObjective, data
from gedl_jax import config as config_lib
from gedl_jax.run import experiment, optimizer

SEED, N, BATCH = 0, 256, 32


def generated_mnist(n: int = N) -> data.Split:
    """MNIST-shaped uint8 images with a learnable signal (class k lights rows 2k+4, 2k+5)."""
    rng = np.random.default_rng(0)
    labels = (np.arange(n) % 10).astype(np.int32)
    rng.shuffle(labels)
    images = rng.integers(0, 96, size=(n, 28, 28, 1), dtype=np.uint8)
    for k in range(10):
        images[labels == k, 2 * k + 4: 2 * k + 6, 4:24] = 255
    return data.Split(images, labels, "generated/train")


def own_train_step(model, objective: EvidentialObjective, tx: optax.GradientTransformation):
    """A user's jitted step: the objective on the network's logits, then the optimiser."""

    @jax.jit
    def train_step(params, opt_state, obj_state, x, y):
        def loss_fn(p):
            loss, new_obj_state, _ = objective(model.apply({"params": p}, x, train=True), y,
                                               obj_state)
            return loss, new_obj_state

        (loss, obj_state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, obj_state, loss

    return train_step


def max_abs_difference(a, b) -> float:
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
               for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20,
                        help="training steps of each run (batch 32, 8 an epoch; default 20)")
    args = parser.parse_args()
    config = experiment.resolve_config(config_lib.set_fields(
        config_lib.build_config("mnist", "gedl"), batch_size=BATCH, num_epochs=3), 1)
    train = generated_mnist()
    steps_per_epoch = N // BATCH
    tx = optimizer.make_optimizer(config, steps_per_epoch * config.num_epochs)
    model = experiment.build_method(config, train).train_model
    keys = experiment.run_keys(SEED)
    params0 = model.init({"params": keys["init"], "dropout": keys["init"]},
                         jnp.zeros((1, 28, 28, 1)), train=False)["params"]
    objective = EvidentialObjective.gedl(num_classes=10, steps_per_epoch=steps_per_epoch)
    step_fns = {impl: own_train_step(model.clone(conv_impl=impl), objective, tx)
                for impl in ("xla", "im2col")}
    images, labels = jnp.asarray(train.images), jnp.asarray(train.labels)
    states = {impl: (params0, tx.init(params0), objective.init()) for impl in step_fns}
    print(f"GEDL, MNIST ConvNet, {N} generated images, batch {BATCH}; jax {jax.__version__} on "
          f"{jax.default_backend()} ({platform.machine()})")
    print("step | free runs: relative loss difference | one im2col step from the XLA run's "
          "state: largest parameter difference")
    for step in range(args.steps):
        epoch, index = divmod(step, steps_per_epoch)
        perm = data.epoch_permutation(jax.random.fold_in(keys["order"], epoch), N)
        rows = perm[index * BATCH:(index + 1) * BATCH]
        x, y = data.to_float(images[rows]), labels[rows]
        one_step = step_fns["im2col"](*states["xla"], x, y)[0]
        losses = {}
        for impl, step_fn in step_fns.items():
            *new_state, loss = step_fn(*states[impl], x, y)
            states[impl], losses[impl] = tuple(new_state), float(loss)
        gap = abs(losses["im2col"] - losses["xla"]) / abs(losses["xla"])
        print(f"{step:4d} | {gap:.2e} | {max_abs_difference(one_step, states['xla'][0]):.2e}")


if __name__ == "__main__":
    main()
