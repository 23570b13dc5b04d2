"""gedl_jax.networks.mlp: the MLP for vector inputs (and flattened images)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from gedl_jax.networks.mlp import MLP

K = 4


def _init(module, x):
    return module.init(jax.random.PRNGKey(0), x, train=False)


def test_shapes_parameter_count_and_dtypes():
    x = jnp.ones((5, 20))
    module = MLP(num_classes=K)
    variables = _init(module, x)
    assert set(variables) == {"params"}            # no BatchNorm, no batch_stats
    shapes = jax.tree.map(lambda a: a.shape, variables["params"])
    assert shapes == {"dense0": {"kernel": (20, 256), "bias": (256,)},
                      "dense1": {"kernel": (256, 256), "bias": (256,)},
                      "head": {"kernel": (256, K), "bias": (K,)}}
    # (20*256 + 256) + (256*256 + 256) + (256*K + K)
    assert sum(a.size for a in jax.tree.leaves(variables)) == 5376 + 65792 + 1028
    logits = module.apply(variables, x, train=False)
    feats = module.apply(variables, x, train=False, method="features")
    assert (logits.shape, logits.dtype) == ((5, K), jnp.float32)
    assert (feats.shape, feats.dtype) == ((5, 256), jnp.float32)
    head = variables["params"]["head"]
    np.testing.assert_allclose(feats @ head["kernel"] + head["bias"][None, :], logits,
                               rtol=1e-5, atol=1e-6)
    # bfloat16 compute keeps float32 parameters and outputs.
    out16 = MLP(num_classes=K, dtype=jnp.bfloat16).apply(variables, x, train=False)
    assert out16.dtype == jnp.float32


def test_images_are_flattened_and_hidden_widths_are_configurable():
    images = jax.random.uniform(jax.random.PRNGKey(1), (3, 6, 6, 2))
    module = MLP(num_classes=K, hidden=(32, 16, 8))
    variables = _init(module, images)
    assert variables["params"]["dense0"]["kernel"].shape == (72, 32)
    np.testing.assert_allclose(module.apply(variables, images, train=False),
                               module.apply(variables, images.reshape(3, -1), train=False),
                               rtol=1e-6)
    assert module.apply(variables, images, method="features").shape == (3, 8)
    # No hidden layer: a linear classifier whose features are the flattened input.
    linear = MLP(num_classes=K, hidden=())
    v = _init(linear, images)
    assert list(v["params"]) == ["head"]
    np.testing.assert_array_equal(linear.apply(v, images, method="features"),
                                  images.reshape(3, -1))


def test_dropout_only_in_training_and_from_the_dropout_stream():
    x = jax.random.normal(jax.random.PRNGKey(2), (8, 10))
    module = MLP(num_classes=K, hidden=(64,), dropout_rate=0.5)
    variables = _init(module, x)
    eval_a = module.apply(variables, x, train=False)
    np.testing.assert_array_equal(eval_a, module.apply(variables, x, train=False))
    train_a = module.apply(variables, x, train=True, rngs={"dropout": jax.random.PRNGKey(3)})
    train_b = module.apply(variables, x, train=True, rngs={"dropout": jax.random.PRNGKey(4)})
    assert not np.allclose(train_a, eval_a) and not np.allclose(train_a, train_b)
    # About half of the hidden units are dropped, the rest scaled by 1 / (1 - 0.5).
    h_train = module.apply(variables, x, train=True, method="features",
                           rngs={"dropout": jax.random.PRNGKey(3)})
    h_eval = module.apply(variables, x, train=False, method="features")
    kept = (h_train != 0) & (h_eval != 0)
    np.testing.assert_allclose(h_train[kept], 2.0 * h_eval[kept], rtol=1e-5)
    active = np.asarray(h_eval != 0)
    dropped = float(np.mean(np.asarray(h_train == 0)[active]))
    assert 0.35 < dropped < 0.65
    with pytest.raises(Exception, match="dropout"):
        module.apply(variables, x, train=True)   # training needs the "dropout" rng


@pytest.mark.parametrize("param_init", ["flax", "torch"])
def test_initialisations(param_init):
    v = _init(MLP(num_classes=K, hidden=(400,), param_init=param_init), jnp.zeros((1, 100)))
    kernel, bias = v["params"]["dense0"]["kernel"], v["params"]["dense0"]["bias"]
    if param_init == "torch":   # U(+-1/sqrt(100)) for kernel and bias
        assert float(jnp.abs(kernel).max()) <= 0.1 and float(jnp.abs(bias).max()) <= 0.1
        assert float(jnp.abs(bias).max()) > 0.05
        np.testing.assert_allclose(float(kernel.std()), 0.1 / np.sqrt(3), rtol=0.05)
    else:                       # lecun_normal: std 1/sqrt(fan_in), zero bias
        np.testing.assert_array_equal(bias, 0.0)
        np.testing.assert_allclose(float(kernel.std()), 0.1, rtol=0.05)


def test_jitted_train_step_decreases_the_loss():
    rng = np.random.default_rng(0)
    labels = np.arange(32) % K
    x = rng.normal(size=(32, 12)).astype(np.float32)
    x[np.arange(32), labels] += 3.0        # class k: feature k is large
    module = MLP(num_classes=K, hidden=(32,), dropout_rate=0.1)
    params = _init(module, x)["params"]
    tx = optax.adam(1e-2)
    opt_state = tx.init(params)

    @jax.jit
    def step(params, opt_state, key):
        def loss_fn(p):
            logits = module.apply({"params": p}, x, train=True, rngs={"dropout": key})
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    history = []
    for i in range(30):
        params, opt_state, loss = step(params, opt_state, jax.random.PRNGKey(i))
        history.append(float(loss))
    assert history[-1] < 0.3 * history[0], history
