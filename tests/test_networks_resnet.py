"""gedl_jax.networks.resnet: the CIFAR ResNet-18 of OpenOOD / TorchUncertainty (kuangliu-style).

Shapes and the parameter count come from `jax.eval_shape` (no compilation); the numerical checks
run on 8x8 inputs (the pool is global, so every stage still runs: 8 -> 8, 4, 2, 1) to stay fast.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from multidevice import run_script

from gedl_jax.networks.resnet import ResNet18
from compile_mode import fast_compilation

K = 10


def _shapes(module, x_shape):
    return jax.eval_shape(lambda k: module.init(k, jnp.zeros(x_shape), train=False),
                          jax.random.PRNGKey(0))


def _count(tree) -> int:
    return int(sum(np.prod(leaf.shape) for leaf in jax.tree.leaves(tree)))


@pytest.fixture(scope="module", autouse=True)
def _fast_compile_module():
    """XLA's optimisations mostly off for this module (compiles in seconds, same numbers up to
    float32 rounding), as the `fast_compile` fixture does per test."""
    with fast_compilation():
        yield


@pytest.fixture(scope="module")
def small():
    """Variables of ResNet18(K) for 8x8x3 inputs and a batch of 6 such images."""
    module = ResNet18(num_classes=K)
    variables = jax.jit(lambda k: module.init(k, jnp.zeros((2, 8, 8, 3)), train=False))(
        jax.random.PRNGKey(0))
    x = jax.random.uniform(jax.random.PRNGKey(1), (6, 8, 8, 3))
    return module, variables, x


def test_parameter_count_is_the_standard_cifar_resnet18():
    # The standard CIFAR ResNet-18 count, layer by layer (conv kernels kh*kw*C_in*C_out, no conv
    # bias; each BatchNorm 2*C: scale and bias; batch statistics are not parameters):
    #   stem     3*3*3*64 + 2*64                                          =     1,856
    #   stage 1  2 x (2 * 3*3*64*64 + 2 * 2*64)                           =   147,968
    #   stage 2  (3*3*64*128 + 3*3*128*128 + 2*2*128 + 1*1*64*128 + 2*128)
    #            + (2 * 3*3*128*128 + 2*2*128)                            =   525,568
    #   stage 3  (3*3*128*256 + 3*3*256*256 + 2*2*256 + 128*256 + 2*256)
    #            + (2 * 3*3*256*256 + 2*2*256)                            = 2,099,712
    #   stage 4  (3*3*256*512 + 3*3*512*512 + 2*2*512 + 256*512 + 2*512)
    #            + (2 * 3*3*512*512 + 2*2*512)                            = 8,393,728
    #   head     512*10 + 10                                              =     5,130
    #   total                                                             11,173,962
    # which is what torchsummary prints for kuangliu's ResNet18() (OpenOOD's ResNet18_32x32).
    variables = _shapes(ResNet18(num_classes=K), (1, 32, 32, 3))
    params = variables["params"]
    assert _count(params) == 11_173_962
    assert _count(params["stem"]) == 1_856
    assert sum(_count(params[f"stage1_block{b}"]) for b in (1, 2)) == 147_968
    assert sum(_count(params[f"stage2_block{b}"]) for b in (1, 2)) == 525_568
    assert sum(_count(params[f"stage3_block{b}"]) for b in (1, 2)) == 2_099_712
    assert sum(_count(params[f"stage4_block{b}"]) for b in (1, 2)) == 8_393_728
    assert _count(params["head"]) == 5_130
    # Projection shortcuts exactly where the stride or width changes (stages 2-4, first block).
    with_shortcut = sorted(n for n, p in params.items() if "shortcut" in p)
    assert with_shortcut == ["stage2_block1", "stage3_block1", "stage4_block1"]
    # A running mean and variance per BatchNorm channel: 64 (stem) + 4*64 + (5*128) + (5*256)
    # + (5*512) = 4,800 channels (each first block of stages 2-4 has a third BN, its shortcut's).
    assert _count(variables["batch_stats"]) == 2 * 4_800
    bn_names = {jax.tree_util.keystr(path[:-1]) for path, _ in
                jax.tree_util.tree_leaves_with_path(params) if path[-2].key == "bn"}
    stat_names = {jax.tree_util.keystr(path[:-1]) for path, _ in
                  jax.tree_util.tree_leaves_with_path(variables["batch_stats"])}
    assert bn_names == stat_names and len(bn_names) == 20


def test_output_shapes_dtypes_and_stage_resolutions():
    module = ResNet18(num_classes=K)
    x = jnp.zeros((3, 32, 32, 3))
    variables = _shapes(module, x.shape)
    logits = jax.eval_shape(lambda v: module.apply(v, x, train=False), variables)
    feats = jax.eval_shape(lambda v: module.apply(v, x, train=False, method="features"),
                           variables)
    assert (logits.shape, logits.dtype) == ((3, K), jnp.float32)
    assert (feats.shape, feats.dtype) == ((3, 512), jnp.float32)
    # No max-pool after the 3x3 stride-1 stem: 32 -> 32, 16, 8, 4 across the four stages.
    _, state = jax.eval_shape(lambda v: module.apply(v, x, train=False,
                                                     capture_intermediates=True,
                                                     mutable=["intermediates"]), variables)
    inter = state["intermediates"]
    assert inter["stem"]["__call__"][0].shape == (3, 32, 32, 64)
    for stage, (side, width) in enumerate(((32, 64), (16, 128), (8, 256), (4, 512)), start=1):
        assert inter[f"stage{stage}_block2"]["__call__"][0].shape == (3, side, side, width)
    # bfloat16 compute: parameters and the returned logits stay float32.
    bf16 = ResNet18(num_classes=K, dtype=jnp.bfloat16)
    v16 = _shapes(bf16, x.shape)
    assert {a.dtype for a in jax.tree.leaves(v16)} == {jnp.dtype(jnp.float32)}
    out16 = jax.eval_shape(lambda v: bf16.apply(v, x, train=False), v16)
    assert out16.dtype == jnp.float32


def test_train_uses_and_updates_batch_statistics_eval_uses_the_running_ones(small):
    module, variables, x = small
    # Initial running statistics: mean 0, variance 1 (PyTorch's), BN scale 1 and bias 0.
    stem_stats = variables["batch_stats"]["stem"]["bn"]
    np.testing.assert_array_equal(stem_stats["mean"], 0.0)
    np.testing.assert_array_equal(stem_stats["var"], 1.0)

    logits_train, updated = module.apply(variables, x, train=True, mutable=["batch_stats"])
    assert set(updated) == {"batch_stats"}
    # momentum 0.9 (PyTorch 0.1): running = 0.9 * 0 + 0.1 * the batch mean of the stem conv.
    conv_out = nn.Conv(64, (3, 3), padding=((1, 1), (1, 1)), use_bias=False).apply(
        {"params": variables["params"]["stem"]["conv"]}, x)
    np.testing.assert_allclose(updated["batch_stats"]["stem"]["bn"]["mean"],
                               0.1 * conv_out.mean(axis=(0, 1, 2)), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(updated["batch_stats"]["stem"]["bn"]["var"],
                               0.9 + 0.1 * conv_out.var(axis=(0, 1, 2)), rtol=1e-5)

    # Training mode normalises with the batch: an example's logits depend on the others.
    alone_train, _ = module.apply(variables, x[:3], train=True, mutable=["batch_stats"])
    assert not np.allclose(alone_train, logits_train[:3], atol=1e-4)
    # Evaluation mode uses the running averages: per example, independent of the batch.
    logits_eval = module.apply(variables, x, train=False)
    np.testing.assert_allclose(module.apply(variables, x[:3], train=False), logits_eval[:3],
                               rtol=1e-5, atol=1e-6)
    # Training mode writes the statistics, so it must be told it may (flax refuses otherwise).
    with pytest.raises(Exception, match="batch_stats"):
        module.apply(variables, x, train=True)
    assert np.all(np.isfinite(logits_train)) and np.all(np.isfinite(logits_eval))


def test_batch_statistics_average_over_axis_name(small):
    """With `axis_name`, BatchNorm normalises with the statistics of the whole (global) batch:
    two halves under a named vmap axis equal the full batch on one device (as under shard_map;
    tests/multidevice covers the real devices for VGG16)."""
    _, variables, x = small
    synced = ResNet18(num_classes=K, axis_name="data")

    def half(x_half):
        return synced.apply(variables, x_half, train=True, mutable=["batch_stats"])

    logits_2xB, stats = jax.vmap(half, axis_name="data")(x.reshape(2, 3, *x.shape[1:]))
    full, full_stats = ResNet18(num_classes=K).apply(variables, x, train=True,
                                                     mutable=["batch_stats"])
    np.testing.assert_allclose(logits_2xB.reshape(6, K), full, rtol=2e-4, atol=2e-5)
    for a, b in zip(jax.tree.leaves(stats), jax.tree.leaves(full_stats)):
        np.testing.assert_allclose(a[0], b, rtol=2e-4, atol=2e-6)


def test_features_are_the_head_input(small):
    module, variables, x = small
    feats = module.apply(variables, x, train=False, method="features")
    head = variables["params"]["head"]
    np.testing.assert_allclose(feats @ head["kernel"] + head["bias"][None, :],
                               module.apply(variables, x, train=False), rtol=1e-5, atol=1e-5)
    assert np.all(feats >= 0)   # after the last ReLU and the average pool


def test_jitted_train_step_decreases_the_loss(small):
    module, variables, x = small
    labels = jnp.arange(6) % K
    tx = optax.adam(1e-3)
    params, stats = variables["params"], variables["batch_stats"]
    opt_state = tx.init(params)

    @jax.jit
    def step(params, stats, opt_state):
        def loss_fn(p):
            logits, new = module.apply({"params": p, "batch_stats": stats}, x, train=True,
                                       mutable=["batch_stats"])
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean(), new

        (loss, new), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), new["batch_stats"], opt_state, loss

    history = []
    for _ in range(6):
        params, stats, opt_state, loss = step(params, stats, opt_state)
        history.append(float(loss))
    assert all(np.isfinite(history))
    assert history[-1] < 0.5 * history[0], history


def test_unknown_param_init_is_refused():
    with pytest.raises(ValueError, match="unknown init 'kaiming'; allowed: torch, flax"):
        _shapes(ResNet18(num_classes=K, param_init="kaiming"), (1, 8, 8, 3))


def test_batch_statistics_are_global_under_shard_map():
    """2 fake CPU devices (tests/multidevice/resnet_batchnorm_shard_map.py)."""
    run_script("resnet_batchnorm_shard_map.py", devices=2)
