"""gedl_jax.run.steps: the shard_map train step on 4 fake CPU devices equals the single-device step
on the same batch.

SGD (not Adam) is used so that a gradient off by the device count (the shard_map pitfall of
summing instead of averaging) would show up in the parameters, not be normalised away.
Run by tests/test_steps.py (tests/multidevice/__init__.py: run_script).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax

from gedl_jax import configs
from gedl_jax import networks as models
from gedl_jax.methods.evidential import spec_from_config
from gedl_jax.methods.evidential import Evidential
from gedl_jax.run import sharding, steps


def main() -> None:
    assert jax.device_count() == 4, jax.devices()
    config = configs.build_config("mnist", "gedl")
    spec = spec_from_config(config)
    rng = np.random.default_rng(0)
    n, batch = 64, 16
    images = rng.integers(0, 256, size=(n, 28, 28, 1), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n).astype(np.int32)
    settings = steps.StepSettings(steps_per_epoch=n // batch, batch_size=batch, augment=False,
                                  normalize_mean=None, normalize_std=None)
    keys = {"augment": jax.random.PRNGKey(1), "dropout": jax.random.PRNGKey(2)}
    method = Evidential(models.build_model("convnet", 10, axis_name=sharding.AXIS),
                        models.build_model("convnet", 10), 10, spec=spec)
    tx = optax.sgd(0.5)

    def run(devices, num_steps):
        mesh = sharding.make_mesh(devices)
        state = steps.init_train_state(method, tx, jax.random.PRNGKey(0), (28, 28, 1))
        state = jax.device_put(state, sharding.replicated(mesh))
        step = steps.make_train_step(method, tx, mesh, settings, keys)
        imgs = sharding.put_replicated(mesh, images)
        labs = sharding.put_replicated(mesh, labels)
        perm = jax.device_put(jnp.arange(n, dtype=jnp.int32)[::-1], sharding.replicated(mesh))
        metrics = []
        for _ in range(num_steps):
            state, m = step(state, imgs, labs, perm)
            metrics.append(jax.device_get(m))
        assert step._cache_size() == 1, "the train step retraced"  # no retracing after step 1
        return jax.device_get(state), metrics

    one, m1 = run(jax.devices()[:1], 3)
    four, m4 = run(jax.devices(), 3)
    for a, b in zip(jax.tree.leaves(one.params), jax.tree.leaves(four.params)):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-6)
    for k in ("loss", "grad_norm", "mean_strength", "kl_weight", "accuracy"):
        np.testing.assert_allclose([m[k] for m in m1], [m[k] for m in m4], rtol=1e-5,
                                   err_msg=k)
    for a, b in zip(jax.tree.leaves(one.method_state), jax.tree.leaves(four.method_state)):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    # The parameters really moved (a no-op step would pass the comparison trivially).
    init = steps.init_train_state(method, tx, jax.random.PRNGKey(0), (28, 28, 1))
    moved = max(float(np.max(np.abs(a - b))) for a, b in
                zip(jax.tree.leaves(init.params), jax.tree.leaves(four.params)))
    assert moved > 1e-3, moved
    print("OK", m4[-1]["grad_norm"], moved)


if __name__ == "__main__":
    main()
