"""gedl_jax.networks.layers: the CPU convolution (im2col) and max-pool implementations against
flax's nn.Conv and nn.max_pool (values and gradients, ties included), and what `auto` chooses."""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gedl_jax import networks as models

ON_CPU = jax.default_backend() == "cpu"


def _random_like(shapes, seed=0):
    """Random float32 arrays (scaled N(0, 1/fan_in) kernels) in the structure of `shapes`."""
    rng = np.random.default_rng(seed)
    def draw(s):
        scale = 1 / math.sqrt(np.prod(s.shape[:-1])) if len(s.shape) > 1 else 0.1
        return jnp.asarray(rng.normal(0.0, scale, s.shape), jnp.float32)
    return jax.tree_util.tree_map(draw, shapes)


@pytest.mark.parametrize("spatial,kernel", [((2, 2), 3), ((1, 1), 3), ((4, 4), 3), ((3, 5), 3),
                                            ((7, 7), 5), ((2, 2), 5)])
def test_im2col_conv_equals_nn_conv(spatial, kernel):
    x = jax.random.normal(jax.random.key(0), (3, *spatial, 5))
    ours = {impl: models.Conv2D(7, (kernel, kernel), kernel_init=models.vgg_conv_init,
                                bias_init=models.torch_default_init(9), impl=impl)
            for impl in ("im2col", "xla", "auto")}
    ref = nn.Conv(7, (kernel, kernel), padding="SAME")
    shapes = jax.eval_shape(lambda: ours["im2col"].init(jax.random.key(1), x))
    assert shapes == jax.eval_shape(lambda: ref.init(jax.random.key(1), x))   # same tree
    variables = _random_like(shapes)
    cot = jax.random.normal(jax.random.key(2), (3, *spatial, 7))

    @jax.jit
    def value_and_grads(variables, x):
        out = {}
        for impl, module in [("ref", ref), *ours.items()]:
            y, vjp = jax.vjp(lambda v, x, m=module: m.apply(v, x), variables, x)
            out[impl] = (y, *vjp(cot))
        return out

    out = value_and_grads(variables, x)
    y_ref, gv_ref, gx_ref = out.pop("ref")
    for impl, (y, gv, gx) in out.items():
        np.testing.assert_allclose(y, y_ref, rtol=1e-5, atol=1e-5, err_msg=impl)
        np.testing.assert_allclose(gx, gx_ref, rtol=1e-5, atol=1e-5, err_msg=impl)
        jax.tree_util.tree_map(
            lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-4, err_msg=impl),
            gv, gv_ref)


def test_auto_conv_uses_im2col_only_where_kernel_exceeds_input():
    conv = models.Conv2D(8, (3, 3), kernel_init=models.vgg_conv_init,
                         bias_init=nn.initializers.zeros)
    assert conv.use_im2col((2, 2)) == ON_CPU
    assert conv.use_im2col((1, 1)) == ON_CPU
    assert not conv.use_im2col((3, 3)) and not conv.use_im2col((4, 4))
    x = jnp.zeros((1, 32, 32, 3))
    for impl, n_conv in [("auto", 10 if ON_CPU else 13), ("xla", 13), ("im2col", 0)]:
        model = models.VGG16(conv_impl=impl)
        variables = jax.eval_shape(lambda m=model: m.init(jax.random.key(0), x, train=False))
        jaxpr = str(jax.make_jaxpr(lambda v, m=model: m.apply(v, x, train=False))(variables))
        assert jaxpr.count("conv_general_dilated[") == n_conv, impl


@pytest.mark.parametrize("shape", [(2, 8, 8, 3), (2, 7, 7, 3), (2, 7, 6, 4), (3, 3, 5, 2),
                                   (1, 2, 2, 1)])
def test_max_pool_implementations_equal_nn_max_pool(shape):
    x = jax.random.normal(jax.random.key(0), shape)   # continuous: no tied maxima
    ref = lambda x: nn.max_pool(x, (2, 2), strides=(2, 2), padding="VALID")  # noqa: E731
    y_ref, vjp_ref = jax.vjp(ref, x)
    assert y_ref.shape == (shape[0], shape[1] // 2, shape[2] // 2, shape[3])   # floor: 7 -> 3
    cot = jax.random.normal(jax.random.key(1), y_ref.shape)
    (g_ref,) = vjp_ref(cot)
    variants = [(impl, train) for impl in ("reduce_window", "reshape", "hybrid", "auto")
                for train in (False, True)]

    @jax.jit
    def values_and_grads(x):
        out = {}
        for impl, train in variants:
            y, vjp = jax.vjp(lambda x, i=impl, t=train: models.max_pool_2x2(x, i, train=t), x)
            out[impl, train] = (y, vjp(cot)[0])
        return out

    for key, (y, g) in values_and_grads(x).items():
        np.testing.assert_array_equal(y, y_ref, err_msg=str(key))
        np.testing.assert_allclose(g, g_ref, rtol=1e-6, atol=0, err_msg=str(key))


def test_max_pool_ties_reshape_and_hybrid_split_gradient_evenly():
    x = jnp.zeros((1, 4, 4, 1)).at[0, 0, 0, 0].set(1.0)   # one window with a max, three all-tied
    g = {impl: jax.grad(lambda x: models.max_pool_2x2(x, impl).sum())(x)
         for impl in ("reshape", "hybrid")}
    np.testing.assert_array_equal(g["reshape"], g["hybrid"])
    assert float(g["reshape"][0, 0, 0, 0]) == 1.0
    np.testing.assert_allclose(g["reshape"][0, 2:, 2:, 0], 0.25)
    np.testing.assert_allclose(g["reshape"].sum(), 4.0)


def test_hybrid_pool_gradient_under_vmap_equals_the_reshape_pools():
    """Off the CPU the hybrid pool trains vmapped seeds too (`vmap_seeds`): its custom VJP
    batches to the reshape pool's gradient, bit for bit."""
    x = jax.random.normal(jax.random.PRNGKey(0), (3, 2, 7, 6, 4))
    grads = {impl: jax.vmap(jax.grad(lambda v, i=impl: (models.max_pool_2x2(v, i) ** 2).sum()))(x)
             for impl in ("hybrid", "reshape")}
    np.testing.assert_array_equal(grads["hybrid"], grads["reshape"])


def test_auto_pool_choice(monkeypatch):
    """Training pools by reshape on a CPU and by the hybrid elsewhere; evaluation by
    reduce_window everywhere; and the choice is what runs."""
    from gedl_jax.networks import layers

    for on_cpu, train, want in [(True, True, "reshape"), (True, False, "reduce_window"),
                                (False, True, "hybrid"), (False, False, "reduce_window")]:
        monkeypatch.setattr(layers, "_on_cpu", lambda v=on_cpu: v)
        assert layers.pool_choice("auto", train) == want
        assert layers.pool_choice("reduce_window", train) == "reduce_window"
        jaxpr = str(jax.make_jaxpr(lambda x, t=train: models.max_pool_2x2(x, "auto", train=t))(
            jnp.zeros((1, 4, 4, 1))))
        assert ("custom_vjp" in jaxpr) == (want == "hybrid")
        assert ("reduce_window_max" in jaxpr) == (want != "reshape")
