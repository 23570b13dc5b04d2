"""gedl_jax.steps: the shard_map train step on 4 fake CPU devices equals the single-device step
on the same batch.

Runs in a subprocess because the fake device count must be set before JAX is imported.
SGD (not Adam) is used so that a gradient off by the device count (the measured shard_map
pitfall, see the steps module docstring) would show up in the parameters, not be normalised away.
"""

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(r"""
    import jax, jax.numpy as jnp, numpy as np, optax
    from gedl_jax import configuration, losses, models, sharding, steps
    from gedl_jax.methods.evidential import Evidential

    assert jax.device_count() == 4, jax.devices()
    config = configuration.build_config("mnist", "gedl")
    spec = losses.LossSpec.from_config(config)
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
""")


def test_data_parallel_step_equals_single_device():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK" in proc.stdout


MULTI_SEED_SCRIPT = textwrap.dedent(r"""
    import jax
    # float64 model: in float32 the two programs differ by rounding that a VGG16 on a few
    # images amplifies (measured: float32 single-seed and vmapped steps both stay within ~1e-6
    # of the float64 result). With float64 weights (logits and loss stay float32) they agree to
    # ~1e-8, and a real difference (a wrong batch, key, statistic or reduction) moves the
    # parameters by ~1e-2.
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp, numpy as np, optax
    from gedl_jax import configuration, losses, models, sharding, steps
    from gedl_jax.methods.evidential import Evidential

    assert jax.device_count() == 4, jax.devices()
    config = configuration.build_config("cifar10", "gedl")
    spec = losses.LossSpec.from_config(config)
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
    # Batch norm (synchronised over the 4 devices) and dropout.
    method = Evidential(models.build_model("vgg16", 10, dtype=jnp.float64,
                                           axis_name=sharding.AXIS),
                        models.build_model("vgg16", 10, dtype=jnp.float64), 10, spec=spec)
    tx = optax.sgd(0.05)

    def init(s):
        state = steps.init_train_state(method, tx, jax.random.PRNGKey(s), (32, 32, 3))
        return jax.tree.map(lambda a: a.astype(jnp.float64)
                            if jnp.issubdtype(a.dtype, jnp.floating) else a, state)

    def settings(s):
        return steps.StepSettings(steps_per_epoch=4, batch_size=batch, augment=True,
                                  normalize_mean=means[s], normalize_std=stds[s])

    # Dropout masks are drawn per device, so the reference is each seed alone on the same
    # 4-device mesh (test_data_parallel_step_equals_single_device covers 4 vs 1 devices).
    mesh = sharding.make_mesh()
    expected = []
    for s in range(seeds):
        step = steps.make_train_step(method, tx, mesh, settings(s), keys[s])
        state = jax.device_put(init(s), sharding.replicated(mesh))
        losses_ = []
        for _ in range(2):
            state, m = step(state, jnp.asarray(images), jnp.asarray(labels),
                            jnp.asarray(orders[s]))
            losses_.append(float(m["loss"]))
        expected.append((jax.device_get(state), losses_))

    step = steps.make_multi_seed_train_step(method, tx, mesh, settings(0))
    state = jax.device_put(steps.stack_states([init(s) for s in range(seeds)]),
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
        np.testing.assert_allclose([l[s] for l in got_losses], expected[s][1], rtol=1e-6)
        one = steps.unstack_state(state, s)
        for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(expected[s][0])):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        moved = max(float(np.max(np.abs(a - b))) for a, b in
                    zip(jax.tree.leaves(init(s).params), jax.tree.leaves(one.params)))
        assert moved > 1e-2, moved  # the steps really trained
    print("OK", got_losses[-1])
""")


def test_multi_seed_step_equals_each_seed_alone():
    """vmap over seeds inside shard_map (4 devices): each seed's batch, normalisation,
    augmentation, dropout, synchronised batch-norm statistics and update equal its own step."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", MULTI_SEED_SCRIPT], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "OK" in proc.stdout
