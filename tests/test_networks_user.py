"""gedl_jax.networks.user: loading a user's network "<module>:<Name>", the NNX adapter, and one
clear error per violation of the contract.

The user package is written into a temporary folder and put on sys.path: a Linen CNN with
BatchNorm and dropout, an NNX CNN, an MLP, and one class per way of breaking the contract.
"""

import sys
import textwrap

import flax.linen
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from compile_mode import fast_compilation

from gedl_jax.networks import user

PKG = "gedl_userpkg"
K = 10
SHAPE = (8, 8, 1)

NETS = '''
import flax.linen as nn
import jax.numpy as jnp
from flax import nnx


class LinenCNN(nn.Module):
    """Conv -> BatchNorm -> ReLU -> pool -> Dropout -> Dense; `features` = the Dense input."""
    num_classes: int
    axis_name: str | None = None

    def setup(self):
        self.conv = nn.Conv(8, (3, 3))
        self.bn = nn.BatchNorm(momentum=0.9, axis_name=self.axis_name)
        self.drop = nn.Dropout(0.5)
        self.head = nn.Dense(self.num_classes)

    def __call__(self, x, train=False):
        return self.head(self.features(x, train))

    def features(self, x, train=False):
        h = nn.relu(self.bn(self.conv(x), use_running_average=not train)).mean(axis=(1, 2))
        return self.drop(h, deterministic=not train)


class NNXCNN(nnx.Module):
    def __init__(self, num_classes, rngs, dropout_rate=0.5):
        self.conv = nnx.Conv(1, 8, (3, 3), rngs=rngs)
        self.bn = nnx.BatchNorm(8, momentum=0.9, rngs=rngs)
        self.drop = nnx.Dropout(dropout_rate, rngs=rngs)
        self.head = nnx.Linear(8, num_classes, rngs=rngs)

    def features(self, x):
        return self.drop(nnx.relu(self.bn(self.conv(x))).mean(axis=(1, 2)))

    def __call__(self, x):
        return self.head(self.features(x))


class NNXSyncCNN(NNXCNN):
    """NNXCNN whose BatchNorm averages over `axis_name` (data-parallel training)."""
    def __init__(self, num_classes, rngs, axis_name=None):
        super().__init__(num_classes, rngs)
        self.bn = nnx.BatchNorm(8, momentum=0.9, axis_name=axis_name, rngs=rngs)


class MLP(nn.Module):
    num_classes: int
    hidden: int = 16

    @nn.compact
    def __call__(self, x, train=False):
        x = nn.relu(nn.Dense(self.hidden)(x.reshape(x.shape[0], -1)))
        return nn.Dense(self.num_classes)(x)


class NNXMLP(nnx.Module):
    def __init__(self, num_classes, rngs):
        self.a = nnx.Linear(64, 16, rngs=rngs)
        self.b = nnx.Linear(16, num_classes, rngs=rngs)

    def __call__(self, x):
        return self.b(nnx.relu(self.a(x.reshape(x.shape[0], -1))))


def not_a_module(num_classes):
    return None


class NoNumClasses(nn.Module):
    classes: int = 10

    @nn.compact
    def __call__(self, x, train=False):
        return nn.Dense(self.classes)(x.reshape(x.shape[0], -1))


class NNXWrongInit(nnx.Module):
    def __init__(self, k, rngs):
        self.a = nnx.Linear(64, k, rngs=rngs)


class NoTrainArgument(nn.Module):
    num_classes: int

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.num_classes)(x.reshape(x.shape[0], -1))


class WrongWidth(MLP):
    @nn.compact
    def __call__(self, x, train=False):
        return nn.Dense(self.num_classes + 1)(x.reshape(x.shape[0], -1))


class NotBatched(MLP):
    @nn.compact
    def __call__(self, x, train=False):
        return nn.Dense(self.num_classes)(x.reshape(-1))


class IntegerOutput(MLP):
    @nn.compact
    def __call__(self, x, train=False):
        return jnp.argmax(nn.Dense(self.num_classes)(x.reshape(x.shape[0], -1)), -1)[:, None] \\
            * jnp.ones((1, self.num_classes), jnp.int32)


class DictOutput(MLP):
    @nn.compact
    def __call__(self, x, train=False):
        return {"logits": nn.Dense(self.num_classes)(x.reshape(x.shape[0], -1))}


class NaNOnZeros(MLP):
    @nn.compact
    def __call__(self, x, train=False):
        x = x.reshape(x.shape[0], -1)
        return nn.Dense(self.num_classes)(x / x.sum(axis=-1, keepdims=True))


class NNXNaNInTraining(nnx.Module):
    def __init__(self, num_classes, rngs):
        self.a = nnx.Linear(64, num_classes, rngs=rngs)
        self.training = False

    def train(self, **kw):
        super().train(**kw)
        self.training = True

    def eval(self, **kw):
        super().eval(**kw)
        self.training = False

    def __call__(self, x):
        y = self.a(x.reshape(x.shape[0], -1))
        return y * jnp.nan if self.training else y


class BadFeatures(MLP):
    def features(self, x, train=False):
        return x          # (B, H, W, C), not (B, F)


class LinenCNNOnePass(LinenCNN):
    """LinenCNN with the optional one-pass method."""
    def features_and_logits(self, x, train=False):
        f = self.features(x, train)
        return f, self.head(f)


class NNXCNNOnePass(NNXCNN):
    def features_and_logits(self, x):
        f = self.features(x)
        return f, self.head(f)


class OnePassOffByOne(LinenCNN):
    def features_and_logits(self, x, train=False):
        f = self.features(x, train)
        return f, self.head(f) + 1.0       # not what __call__ returns


class OnePassSwapped(LinenCNN):
    def features_and_logits(self, x, train=False):
        f = self.features(x, train)
        return self.head(f), f             # (logits, features)


class OnePassNotAPair(LinenCNN):
    def features_and_logits(self, x, train=False):
        return self.features(x, train)
'''


@pytest.fixture(scope="module", autouse=True)
def user_package(tmp_path_factory):
    root = tmp_path_factory.mktemp("user_code")
    (root / PKG).mkdir()
    (root / PKG / "__init__.py").write_text("")
    (root / PKG / "nets.py").write_text(textwrap.dedent(NETS))
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(root))
        yield root
    for name in [m for m in sys.modules if m == PKG or m.startswith(PKG + ".")]:
        del sys.modules[name]


@pytest.fixture(scope="module", autouse=True)
def _fast_compile_module():
    """XLA's optimisations mostly off for this module (as the `fast_compile` fixture per test)."""
    with fast_compilation():
        yield


def _x(n=4, seed=1):
    return jax.random.uniform(jax.random.PRNGKey(seed), (n, *SHAPE))


# ------------------------------------------------------------------------ the good networks
@pytest.mark.parametrize("name,kind,collections,feature_width", [
    ("LinenCNN", "linen", {"params", "batch_stats"}, 8),
    ("NNXCNN", "nnx", {"params", "batch_stats"}, 8),
    ("MLP", "linen", {"params"}, None),
    ("NNXMLP", "nnx", {"params"}, None),
])
def test_loads_checks_and_runs_linen_and_nnx_alike(name, kind, collections, feature_width):
    net = user.load_network(f"{PKG}.nets:{name}", K, SHAPE,
                            need_features=feature_width is not None)
    assert (net.kind, net.num_classes, net.input_shape) == (kind, K, SHAPE)
    assert net.has_features == (feature_width is not None)
    hash(net)   # hashable: a method holding it stays a valid static jit argument
    variables = net.init(jax.random.PRNGKey(0))
    assert set(variables) == collections
    x = _x()
    logits = net.apply(variables, x, train=False)
    assert (logits.shape, logits.dtype) == ((4, K), jnp.float32)
    # One code path for training: mutable collections and a dropout key, as Linen's apply.
    mutable = sorted(collections - {"params"})
    logits_t, updates = net.apply(variables, x, train=True, mutable=mutable,
                                  rngs={"dropout": jax.random.PRNGKey(5)})
    assert logits_t.shape == (4, K) and set(updates) == set(mutable)
    if feature_width:
        assert net.features(variables, x).shape == (4, feature_width)


@pytest.mark.parametrize("name", ["LinenCNN", "NNXCNN"])
def test_batchnorm_and_dropout_follow_train_and_eval(name):
    net = user.load_network(f"{PKG}.nets:{name}", K, SHAPE, need_features=True)
    variables = net.init(jax.random.PRNGKey(0))
    x = _x(6)
    # Eval: running statistics, no dropout: per example, deterministic.
    eval_all = net.apply(variables, x, train=False)
    np.testing.assert_allclose(net.apply(variables, x[:2], train=False), eval_all[:2],
                               rtol=1e-5, atol=1e-6)

    def train(key, batch=x):
        return net.apply(variables, batch, train=True, mutable=["batch_stats"],
                         rngs={"dropout": jax.random.PRNGKey(key)})

    (a, stats_a), (b, _), (a_again, _) = train(1), train(2), train(1)
    np.testing.assert_array_equal(a, a_again)          # the dropout key decides the mask
    assert not np.allclose(a, b)                        # ... and a new key draws a new one
    assert not np.allclose(a, eval_all)
    # Train: the batch statistics update with momentum 0.9 (both kinds keep "conv" {kernel, bias}
    # and "bn" {mean, var}): running = 0.9 * (0, 1) + 0.1 * the batch's (mean, biased var).
    conv = flax.linen.Conv(8, (3, 3)).apply({"params": variables["params"]["conv"]}, x)
    bn = stats_a["batch_stats"]["bn"]
    np.testing.assert_allclose(bn["mean"], 0.1 * conv.mean(axis=(0, 1, 2)), rtol=1e-4,
                               atol=1e-7)
    np.testing.assert_allclose(bn["var"], 0.9 + 0.1 * conv.var(axis=(0, 1, 2)), rtol=1e-4)
    # Features: dropout applied in training only.
    h_eval = net.features(variables, x)
    assert h_eval.shape == (6, 8)
    h_train, _ = net.features(variables, x, train=True, mutable=["batch_stats"],
                              rngs={"dropout": jax.random.PRNGKey(1)})
    assert int(np.sum(np.asarray(h_train) == 0)) > int(np.sum(np.asarray(h_eval) == 0)) + 10


def test_nnx_adapter_computes_what_the_nnx_module_computes():
    """Variables taken from an NNX module built directly give the adapter that module's outputs
    and its batch-statistics update (dropout off, so the two draw nothing)."""
    from gedl_userpkg.nets import NNXCNN

    module = NNXCNN(K, nnx.Rngs(3), dropout_rate=0.0)
    variables = {"params": nnx.to_pure_dict(nnx.state(module, nnx.Param)),
                 "batch_stats": nnx.to_pure_dict(nnx.state(module, nnx.BatchStat))}
    net = user.load_network(f"{PKG}.nets:NNXCNN", K, SHAPE, dropout_rate=0.0)
    x = _x(5)
    module.eval()
    np.testing.assert_allclose(net.apply(variables, x, train=False), module(x), rtol=1e-6)
    module.train()
    direct = module(x)   # updates the module's BatchStat variables in place
    logits, updates = net.apply(variables, x, train=True, mutable=["batch_stats"])
    np.testing.assert_allclose(logits, direct, rtol=1e-6)
    for got, want in zip(jax.tree.leaves(updates["batch_stats"]),
                         jax.tree.leaves(nnx.to_pure_dict(nnx.state(module, nnx.BatchStat)))):
        np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("name", ["LinenCNN", "NNXCNN"])
def test_one_jitted_train_step_for_both_kinds(name):
    net = user.load_network(f"{PKG}.nets:{name}", K, SHAPE)
    variables = net.init(jax.random.PRNGKey(0))
    params, stats = variables["params"], {"batch_stats": variables["batch_stats"]}
    rng = np.random.default_rng(0)
    labels = jnp.asarray(np.arange(32) % K)
    # Class k: brightness (k + 1) / K plus noise (a signal global pooling keeps).
    x = jnp.asarray((np.arange(32) % K + 1)[:, None, None, None] / K
                    + rng.normal(0, 0.02, (32, *SHAPE)), jnp.float32)
    tx = optax.adam(3e-2)
    opt_state = tx.init(params)

    @jax.jit
    def step(params, stats, opt_state, key):
        def loss_fn(p):
            logits, new = net.apply({"params": p, **stats}, x, train=True,
                                    mutable=list(stats), rngs={"dropout": key})
            return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean(), new

        (loss, new), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), dict(new), opt_state, loss

    history = []
    for i in range(40):
        params, stats, opt_state, loss = step(params, stats, opt_state, jax.random.PRNGKey(i))
        history.append(float(loss))
    assert np.mean(history[-5:]) < 0.8 * np.mean(history[:5]), history


def test_mc_dropout_keeps_dropout_on_with_frozen_statistics():
    nnx_net = user.load_network(f"{PKG}.nets:NNXCNN", K, SHAPE)
    assert nnx_net.mc_dropout                       # the adapter provides it for NNX
    variables = nnx_net.init(jax.random.PRNGKey(0))
    x = _x(6)

    def mc(key):
        return nnx_net.apply(variables, x, train=False, dropout=True,
                             rngs={"dropout": jax.random.PRNGKey(key)})

    assert not np.allclose(mc(1), mc(2))            # fresh masks per key
    np.testing.assert_array_equal(mc(1), mc(1))
    np.testing.assert_allclose(nnx_net.apply(variables, x, train=False, dropout=False),
                               nnx_net.apply(variables, x, train=False), rtol=1e-6)
    # Frozen statistics: BatchNorm keeps the running averages (with dropout rate 0 the MC pass is
    # the eval pass) and nothing is updated.
    no_drop = user.load_network(f"{PKG}.nets:NNXCNN", K, SHAPE, dropout_rate=0.0)
    out, updates = no_drop.apply(variables, x, train=False, dropout=True, mutable=["batch_stats"],
                                 rngs={"dropout": jax.random.PRNGKey(1)})
    np.testing.assert_allclose(out, no_drop.apply(variables, x, train=False), rtol=1e-6)
    for got, want in zip(jax.tree.leaves(updates), jax.tree.leaves(variables["batch_stats"])):
        np.testing.assert_array_equal(got, want)
    mlp = user.load_network("mlp", K, SHAPE, dropout_rate=0.5)
    assert mlp.mc_dropout
    v = mlp.init(jax.random.PRNGKey(0))
    a = mlp.apply(v, x, dropout=True, rngs={"dropout": jax.random.PRNGKey(1)})
    assert not np.allclose(a, mlp.apply(v, x))
    linen = user.load_network(f"{PKG}.nets:LinenCNN", K, SHAPE)
    assert not linen.mc_dropout
    with pytest.raises(ValueError, match=r"LinenCNN': MC Dropout needs `__call__\(x, "
                                         r"train=..., dropout=...\)`"):
        linen.apply(linen.init(jax.random.PRNGKey(0)), x, dropout=True)


def test_builtin_names_and_constructor_keywords():
    resnet = user.build("resnet18", K)
    assert type(resnet.module).__name__ == "ResNet18" and resnet.has_features
    mlp = user.load_network("mlp", 3, (12,), need_features=True, hidden=(32,))
    assert mlp.module.hidden == (32,)
    assert mlp.features(mlp.init(jax.random.PRNGKey(0)), jnp.ones((2, 12))).shape == (2, 32)


def test_axis_name_reaches_the_classes_that_take_it():
    synced = user.build(f"{PKG}.nets:LinenCNN", K, axis_name="data")
    assert synced.syncs_batch_stats and synced.module.axis_name == "data"
    assert not user.build(f"{PKG}.nets:LinenCNN", K).syncs_batch_stats
    # NNXCNN takes no axis_name: built without one; checked, it is refused for data-parallel
    # training (its statistics would differ per device; shard_map refuses them even on one).
    plain = user.build(f"{PKG}.nets:NNXCNN", K, axis_name="data")
    assert not plain.syncs_batch_stats and "axis_name" not in plain.module.kwargs
    with pytest.raises(ValueError, match=rf"network '{PKG}.nets:NNXCNN': updates "
                                         r"\['batch_stats'\] in training but its constructor "
                                         r"takes no `axis_name`.*add an `axis_name: str \| None = "
                                         r"None` parameter and pass it to every BatchNorm"):
        user.load_network(f"{PKG}.nets:NNXCNN", K, SHAPE, axis_name="data")
    # Networks without training state need none; synchronised ones are checked under the axis.
    assert not user.load_network(f"{PKG}.nets:NNXMLP", K, SHAPE, axis_name="data") \
        .syncs_batch_stats
    for name in ("LinenCNN", "NNXSyncCNN"):
        checked = user.load_network(f"{PKG}.nets:{name}", K, SHAPE, axis_name="data",
                                    need_features=True)
        assert checked.syncs_batch_stats and checked.axis_name == "data"
    # Under a named axis (as inside shard_map) the synchronised BatchNorm uses the statistics of
    # the whole batch: each half's update equals the full batch's on one device.
    variables = synced.init(jax.random.PRNGKey(0), SHAPE)
    x = _x(6)
    key = jax.random.PRNGKey(0)
    _, halves = jax.vmap(lambda h: synced.apply(variables, h, train=True, rngs={"dropout": key},
                                                mutable=["batch_stats"]),
                         axis_name="data")(x.reshape(2, 3, *SHAPE))
    _, full = user.build(f"{PKG}.nets:LinenCNN", K).apply(
        variables, x, train=True, rngs={"dropout": key}, mutable=["batch_stats"])
    for got, want in zip(jax.tree.leaves(halves), jax.tree.leaves(full)):
        np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(got[1], want, rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("spec,message", [
    ("gedl_nosuchpkg.nets:Foo",
     r"cannot import 'gedl_nosuchpkg.nets:Foo': ModuleNotFoundError: No module named "
     r"'gedl_nosuchpkg'"),
    (f"{PKG}.nets:Missing",
     rf"cannot import '{PKG}.nets:Missing': AttributeError: module '{PKG}.nets' has no "
     r"attribute 'Missing'"),
    ("resnet99", r"network 'resnet99' is neither a built-in \(resnet18, mlp\) nor "
                 r"'<importable.module>:<Name>'"),
    (f"{PKG}.nets:not_a_module",
     rf"network '{PKG}.nets:not_a_module': a function is neither a flax.linen.Module nor a "
     r"flax.nnx.Module subclass"),
    (f"{PKG}.nets:NoNumClasses",
     rf"network '{PKG}.nets:NoNumClasses': cannot construct NoNumClasses\(num_classes=10\): "
     r"TypeError: .*num_classes.*; a Linen network is constructed as Name\(num_classes=K\)"),
    (f"{PKG}.nets:NNXWrongInit",
     rf"network '{PKG}.nets:NNXWrongInit': cannot construct NNXWrongInit\(num_classes=10, "
     r"rngs=nnx.Rngs\(0\)\): TypeError: .*; an NNX network is constructed as "
     r"Name\(num_classes=K, rngs=nnx.Rngs\(seed\)\)"),
    (f"{PKG}.nets:NoTrainArgument",
     rf"network '{PKG}.nets:NoTrainArgument': init on a batch of zeros \(2, 8, 8, 1\) "
     r"\(calling module\(x, train=...\)\) failed: TypeError: .*train"),
    (f"{PKG}.nets:WrongWidth",
     rf"network '{PKG}.nets:WrongWidth': logits \(eval\) returned shape \(2, 11\) for a batch "
     r"of 2; expected \(2, 10\)"),
    (f"{PKG}.nets:NotBatched",
     r"logits \(eval\) returned shape \(10,\) for a batch of 2; expected \(2, 10\)"),
    (f"{PKG}.nets:IntegerOutput",
     r"logits \(eval\) returned dtype int32; expected floating values"),
    (f"{PKG}.nets:DictOutput",
     r"logits \(eval\) returned a dict; expected one floating array of shape \(2, 10\)"),
    (f"{PKG}.nets:NaNOnZeros",
     rf"network '{PKG}.nets:NaNOnZeros': logits \(eval\) are not finite on a batch of zeros "
     r"\(2, 8, 8, 1\): 20 of 20 values are NaN or inf"),
    (f"{PKG}.nets:NNXNaNInTraining",
     r"logits \(train\) are not finite on a batch of zeros"),
])
def test_each_violation_is_one_clear_error(spec, message):
    with pytest.raises(ValueError, match=message) as info:
        user.load_network(spec, K, SHAPE)
    assert "\n" not in str(info.value)


def test_missing_or_malformed_features_when_a_method_needs_them():
    message = (rf"network '{PKG}.nets:MLP': this method needs the network's features, but the "
               r"linen class has no `features` method; expected a method `features\(x, "
               r"train=bool\)` returning the penultimate features \(B, F\)")
    with pytest.raises(ValueError, match=message):
        user.load_network(f"{PKG}.nets:MLP", K, SHAPE, need_features=True)
    with pytest.raises(ValueError, match="NNXMLP.*nnx class has no `features` method"):
        user.load_network(f"{PKG}.nets:NNXMLP", K, SHAPE, need_features=True)
    net = user.load_network(f"{PKG}.nets:MLP", K, SHAPE)   # fine for logit-only methods
    with pytest.raises(ValueError, match="DUQ needs the network's features"):
        net.require_features("DUQ")
    with pytest.raises(ValueError, match=r"features \(eval\) returned shape \(2, 8, 8, 1\) for "
                                         r"a batch of 2; expected \(2, F\)"):
        user.load_network(f"{PKG}.nets:BadFeatures", K, SHAPE, need_features=True)
    # Without need_features the malformed `features` is never called.
    assert user.load_network(f"{PKG}.nets:BadFeatures", K, SHAPE).has_features


def test_runs_in_the_builtin_method_and_train_step():
    """The loaded module (here the NNX adapter; a Linen class is used as it is) drops into the
    EDL method and the trainer's shard_map step unchanged (train_model with the data axis,
    eval_model without), and predicts."""
    name = "NNXSyncCNN"
    from gedl_jax import config as config_lib
    from gedl_jax import configs
    from gedl_jax.methods.evidential import Evidential, spec_from_config
    from gedl_jax.run import sharding, steps

    spec = spec_from_config(config_lib.resolve(configs.build_config("mnist", "gedl")))
    train_net = user.load_network(f"{PKG}.nets:{name}", K, SHAPE, axis_name=sharding.AXIS)
    eval_net = user.load_network(f"{PKG}.nets:{name}", K, SHAPE)
    method = Evidential(train_net.module, eval_net.module, K, spec=spec)
    mesh = sharding.make_mesh(jax.devices()[:1])
    settings = steps.StepSettings(steps_per_epoch=2, batch_size=8, augment=False,
                                  normalize_mean=None, normalize_std=None)
    tx = optax.adam(1e-3)
    state = jax.device_put(steps.init_train_state(method, tx, jax.random.PRNGKey(0), SHAPE),
                           sharding.replicated(mesh))
    assert list(state.model_state) == ["batch_stats"]
    keys = {"augment": jax.random.PRNGKey(1), "dropout": jax.random.PRNGKey(2)}
    step = steps.make_train_step(method, tx, mesh, settings, keys)
    rng = np.random.default_rng(0)
    images = sharding.put_replicated(mesh, rng.integers(0, 256, (16, *SHAPE), dtype=np.uint8))
    labels = sharding.put_replicated(mesh, (np.arange(16) % K).astype(np.int32))
    order = jax.device_put(jnp.arange(16, dtype=jnp.int32), sharding.replicated(mesh))
    before = jax.device_get(state.model_state)
    for _ in range(3):
        state, metrics = step(state, images, labels, order)
    assert int(metrics["nonfinite"]) == 0 and np.isfinite(float(metrics["loss"]))
    moved = jax.tree.map(lambda a, b: not np.allclose(a, b), before,
                         jax.device_get(state.model_state))
    assert all(jax.tree.leaves(moved))                 # the batch statistics were updated
    raw = steps.make_predict_step(method, mesh)(state.variables, state.method_state,
                                                np.asarray(images)[:4], jax.random.PRNGKey(0))
    assert raw["alpha_BxK"].shape == (4, K) and bool(jnp.all(raw["alpha_BxK"] > 0))


@pytest.mark.parametrize("name", ["LinenCNN", "NNXCNN"])
def test_as_a_submodule_calling_features_and_logits(name):
    """Composite methods (DUQ, PostNet, F-EDL) hold the network as a Linen submodule and call
    both `features` and `__call__`: the variables nest under the submodule, and init's outputs
    are those of the stored variables."""
    class Parent(flax.linen.Module):
        backbone: flax.linen.Module

        @flax.linen.compact
        def __call__(self, x, train=False):
            f = self.backbone.features(x, train=train)
            return f, self.backbone(x, train=train) + flax.linen.Dense(K)(f)

    parent = Parent(user.build(f"{PKG}.nets:{name}", K).module)
    x = _x()
    rngs = {"params": jax.random.PRNGKey(0), "dropout": jax.random.PRNGKey(1)}
    out, variables = parent.init_with_output(rngs, x)
    assert sorted(variables["params"]) == ["Dense_0", "backbone"]
    assert list(variables["batch_stats"]) == ["backbone"]
    for got, want in zip(parent.apply(variables, x), out):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    (_, logits), updates = parent.apply(variables, x, train=True, mutable=["batch_stats"],
                                        rngs={"dropout": jax.random.PRNGKey(2)})
    assert logits.shape == (4, K) and list(updates["batch_stats"]) == ["backbone"]


# ------------------------------------------------------------- features and logits in one pass
@pytest.mark.parametrize("spec", [f"{PKG}.nets:LinenCNNOnePass", f"{PKG}.nets:NNXCNNOnePass",
                                  "mlp", "resnet18"])
def test_one_pass_gives_what_the_separate_calls_give(spec):
    shape = (8, 8, 3) if spec == "resnet18" else SHAPE
    net = user.load_network(spec, K, shape, need_features=True)
    assert net.has_features_and_logits
    variables = net.init(jax.random.PRNGKey(0))
    x = jax.random.uniform(jax.random.PRNGKey(1), (4, *shape))
    f, logits = net.features_and_logits(variables, x)
    np.testing.assert_allclose(f, net.features(variables, x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(logits, net.apply(variables, x), rtol=1e-5, atol=1e-6)
    assert (f.dtype, logits.dtype, logits.shape) == (jnp.float32, jnp.float32, (4, K))


def test_without_one_pass_the_network_says_so():
    net = user.load_network(f"{PKG}.nets:LinenCNN", K, SHAPE, need_features=True)
    assert not net.has_features_and_logits
    with pytest.raises(ValueError, match="has no `features_and_logits` method"):
        net.features_and_logits(net.init(jax.random.PRNGKey(0)), _x())


@pytest.mark.parametrize("name,message", [
    ("OnePassOffByOne", r"features_and_logits returned logits other than the separate call's "
                        r"\(values up to 1 apart on a random batch in eval mode\)"),
    ("OnePassSwapped", r"features_and_logits's logits returned shape \(2, 8\) for a batch of "
                       r"2; expected \(2, 10\)"),
    ("OnePassNotAPair", r"features_and_logits returned a .*; `features_and_logits\(x, "
                        r"train=bool\)` must return the tuple"),
])
def test_a_wrong_one_pass_method_is_one_clear_error(name, message):
    with pytest.raises(ValueError, match=message) as info:
        user.load_network(f"{PKG}.nets:{name}", K, SHAPE, need_features=True)
    assert "\n" not in str(info.value) and f"network '{PKG}.nets:{name}'" in str(info.value)
    # Only the methods that read features check it.
    assert user.load_network(f"{PKG}.nets:{name}", K, SHAPE).has_features_and_logits


@pytest.mark.parametrize("kind", ["Linen", "NNX"])
@pytest.mark.parametrize("one_pass", [True, False])
def test_the_feature_methods_backbone_runs_a_one_pass_network_once(one_pass, kind):
    """DAEDL's and F-EDL's view of a user network (features and logits): with
    `features_and_logits` one forward pass per training step, so BatchNorm's running statistics
    take one momentum step and the logits are the head of the very features returned (one
    dropout mask); without it two passes, two momentum steps and two masks."""
    from gedl_jax.methods.common import UserBackbone

    name = f"{kind}CNNOnePass" if one_pass else f"{kind}CNN"
    net = user.load_network(f"{PKG}.nets:{name}", K, SHAPE, need_features=True)
    backbone = UserBackbone(net.module, one_pass=net.has_features_and_logits)
    x = _x(6)
    variables = backbone.init({"params": jax.random.PRNGKey(0),
                               "dropout": jax.random.PRNGKey(0)}, x)
    out, updates = backbone.apply(variables, x, train=True, mutable=["batch_stats"],
                                  rngs={"dropout": jax.random.PRNGKey(3)})
    conv = flax.linen.Conv(8, (3, 3)).apply(
        {"params": variables["params"]["net"]["conv"]}, x)
    momentum_steps = 1 if one_pass else 2
    bn = updates["batch_stats"]["net"]["bn"]
    np.testing.assert_allclose(bn["mean"], (1 - 0.9 ** momentum_steps)
                               * conv.mean(axis=(0, 1, 2)), rtol=1e-4, atol=1e-7)
    head = variables["params"]["net"]["head"]
    logits_of_features = (np.asarray(out["encoder"]) @ np.asarray(head["kernel"])
                          + np.asarray(head["bias"]))
    assert np.allclose(out["logits"], logits_of_features, rtol=1e-5, atol=1e-5) == one_pass
