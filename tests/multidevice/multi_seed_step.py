"""vmap over seeds inside shard_map (4 fake CPU devices): each seed's batch, normalisation,
augmentation, dropout, synchronised batch-norm statistics and update equal its own step.

The network: `small` (the default suite's: one conv, synchronised batch norm, dropout, a Dense
head; every mechanism above, compiled in seconds) or `vgg16` (the CIFAR protocol's VGG16-bn,
about 2.5 CPU-minutes in float64: `pytest --run-extended`), given as the first argument.

float64 model: in float32 the two programs differ by rounding that a VGG16 on a few images
amplifies (measured: float32 single-seed and vmapped steps both stay within ~1e-6 of the
float64 result). With float64 weights (logits and loss stay float32) they agree to ~1e-8, and a
real difference (a wrong batch, key, statistic or reduction) moves the parameters by ~1e-2.
Run by tests/test_steps.py (tests/multidevice/__init__.py: run_script).
"""

import sys

import flax.linen as nn
import jax

jax.config.update("jax_enable_x64", True)   # before any array exists

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from gedl_jax import configs  # noqa: E402
from gedl_jax.run import sharding  # noqa: E402
from gedl_jax import networks as models  # noqa: E402
from gedl_jax.run import steps as steps_lib  # noqa: E402  (train steps)
from gedl_jax.methods.evidential import spec_from_config  # noqa: E402
from gedl_jax.methods.evidential import Evidential  # noqa: E402


class SmallBNDropoutNet(nn.Module):
    """Conv -> batch norm (statistics over `axis_name`) -> ReLU -> pool -> dropout -> Dense."""

    num_classes: int = 10
    axis_name: str | None = None
    dtype: jnp.dtype = jnp.float64

    @nn.compact
    def __call__(self, x_BxHxWxC: jax.Array, train: bool = False) -> jax.Array:
        x = nn.Conv(8, (3, 3), dtype=self.dtype, name="conv0")(x_BxHxWxC)
        x = nn.BatchNorm(use_running_average=not train, momentum=0.9, axis_name=self.axis_name,
                         dtype=self.dtype, name="bn0")(x)
        x = nn.avg_pool(nn.relu(x), (4, 4), strides=(4, 4))
        x = nn.Dropout(0.5, deterministic=not train)(x.reshape(x.shape[0], -1))
        return nn.Dense(self.num_classes, dtype=self.dtype, name="dense0")(x).astype(jnp.float32)


def build_pair(model: str):
    """(the network trained inside shard_map, the one that predicts) for `model`."""
    if model == "small":
        return SmallBNDropoutNet(axis_name=sharding.AXIS), SmallBNDropoutNet()
    if model == "vgg16":
        return (models.build_model("vgg16", 10, dtype=jnp.float64, axis_name=sharding.AXIS),
                models.build_model("vgg16", 10, dtype=jnp.float64))
    raise SystemExit(f"unknown model {model!r}: small or vgg16")


def main(model: str) -> None:
    assert jax.device_count() == 4, jax.devices()
    config = configs.build_config("cifar10", "gedl")
    spec = spec_from_config(config)
    rng = np.random.default_rng(0)
    n, batch, seeds = 48, 8, 2
    images = rng.integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n).astype(np.int32)
    # Each seed trains on its own subset of the pool, with its own normalisation statistics.
    orders = [rng.permutation(n)[:32].astype(np.int32) for _ in range(seeds)]
    means = [tuple(rng.uniform(0.3, 0.6, 3)) for _ in range(seeds)]
    stds = [tuple(rng.uniform(0.2, 0.3, 3)) for _ in range(seeds)]
    keys = [dict(zip(("augment", "dropout"), jax.random.split(jax.random.PRNGKey(10 + s))))
            for s in range(seeds)]
    # Batch norm (synchronised over the 4 devices) and dropout in both networks.
    method = Evidential(*build_pair(model), 10, spec=spec)
    tx = optax.sgd(0.05)

    def init(s):
        state = steps_lib.init_train_state(method, tx, jax.random.PRNGKey(s), (32, 32, 3))
        return jax.tree.map(lambda a: a.astype(jnp.float64)
                            if jnp.issubdtype(a.dtype, jnp.floating) else a, state)

    def settings(s):
        return steps_lib.StepSettings(steps_per_epoch=4, batch_size=batch, augment=True,
                                      normalize_mean=means[s], normalize_std=stds[s])

    # Dropout masks are drawn per device, so the reference is each seed alone on the same
    # 4-device mesh (data_parallel_step.py covers 4 vs 1 devices).
    mesh = sharding.make_mesh()
    expected = []
    for s in range(seeds):
        step = steps_lib.make_train_step(method, tx, mesh, settings(s), keys[s])
        state = jax.device_put(init(s), sharding.replicated(mesh))
        losses_ = []
        for _ in range(2):
            state, m = step(state, jnp.asarray(images), jnp.asarray(labels),
                            jnp.asarray(orders[s]))
            losses_.append(float(m["loss"]))
        expected.append((jax.device_get(state), losses_))

    step = steps_lib.make_multi_seed_train_step(method, tx, mesh, settings(0))
    state = jax.device_put(steps_lib.stack_states([init(s) for s in range(seeds)]),
                           sharding.replicated(mesh))
    keys_S = {k: jnp.stack([ks[k] for ks in keys]) for k in ("augment", "dropout")}
    args = (sharding.put_replicated(mesh, images), sharding.put_replicated(mesh, labels),
            jnp.asarray(np.stack(orders)), keys_S, jnp.asarray(means), jnp.asarray(stds))
    got_losses = []
    for _ in range(2):
        state, m = step(state, *args)
        got_losses.append(np.asarray(m["loss"]))
    assert step._cache_size() == 1, "the multi-seed step retraced"
    state = jax.device_get(state)
    for s in range(seeds):
        np.testing.assert_allclose([loss[s] for loss in got_losses], expected[s][1], rtol=1e-6)
        one = steps_lib.unstack_state(state, s)
        for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(expected[s][0])):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        moved = max(float(np.max(np.abs(a - b))) for a, b in
                    zip(jax.tree.leaves(init(s).params), jax.tree.leaves(one.params)))
        assert moved > 1e-2, moved  # the steps really trained
    print("OK", model, got_losses[-1])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "small")
