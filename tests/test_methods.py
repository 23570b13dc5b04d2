"""The non-EDL methods (DUQ, KL-PN, RKL-PN, PostNet, DAEDL, F-EDL) on the method interface.

Most tests build each method around a tiny flax network (a Dense layer, or the identity as the
feature map, so NumPy can recompute the method's quantities independently); the last ones build
every preset from the config with the real backbones, shape-only (`jax.eval_shape`).
"""

from __future__ import annotations

import dataclasses
import json

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized
from scipy import special, stats

from gedl_jax import config as config_lib
from gedl_jax import configs, networks
from gedl_jax import methods as methods_lib
from gedl_jax import networks as models
from gedl_jax.methods import StepContext, daedl, duq, fedl, postnet, prior_networks
from gedl_jax.methods import prior_networks as pn_math

K, B, SHAPE = 3, 12, (4, 4, 1)


class Tiny(nn.Module):
    """A stand-in backbone: "encoder" = the flattened image, "hidden" = a Dense(6) + ReLU (or
    the identity), "logits" = a Dense(num_outputs) (optional spectral norm on the Dense layers)."""

    num_outputs: int = K
    identity_hidden: bool = False
    spectral_norm: bool = False
    dict_output: bool = True

    @nn.compact
    def __call__(self, x, train=False, dropout=None):
        z = x.reshape(x.shape[0], -1)
        out = {"encoder": z}

        def dense(n, name):
            layer = nn.Dense(n, name=name)
            if self.spectral_norm:
                sn = nn.SpectralNorm(layer, name=f"sn_{name}")
                return lambda v: sn(v, update_stats=train)
            return layer

        h = z if self.identity_hidden else nn.relu(dense(6, "hidden")(z))
        out["hidden"] = h
        if self.num_outputs:
            out["logits"] = dense(self.num_outputs, "out")(h)
        return out if self.dict_output else out["logits"]


def _tiny_methods() -> dict[str, methods_lib.Method]:
    def same(model):
        return model, model

    return {
        "duq": duq.DUQ(*same(duq.DUQNet(Tiny(0, identity_hidden=True), duq.RBFHead(K, 0, 0.5))),
                       K, length_scale=0.5, gamma=0.9, gradient_penalty=0.3),
        "kl_pn": prior_networks.KLPriorNetwork(*same(Tiny(dict_output=False)), K,
                                               target_form="smoothed"),
        "rkl_pn": prior_networks.RKLPriorNetwork(*same(Tiny(dict_output=False)), K,
                                                 ood="noise_smoothed", ood_weight=0.5),
        "postnet": postnet.PostNet(*same(postnet.PostNetModel(Tiny(2), K, 2)), K,
                                   class_counts=(40, 50, 10), entropy_weight=1e-2, latent_dim=2,
                                   flow_layers=2),
        "daedl": daedl.DAEDL(*same(Tiny(spectral_norm=True)), K),
        "fedl": fedl.FEDL(*same(fedl.FEDLModel(Tiny(), K, head_hidden=5)), K),
    }


TINY = _tiny_methods()


def _batch(seed=0, n=B):
    rng = np.random.default_rng(seed)
    return (jnp.asarray(rng.uniform(size=(n, *SHAPE)), jnp.float32),
            jnp.asarray(np.arange(n) % K, jnp.int32))


def _state(method, seed=0):
    variables = method.init(jax.random.PRNGKey(seed), SHAPE)
    params = variables.pop("params")
    return params, variables


def _ctx(**kw):
    return StepContext(jnp.int32(0), jax.random.PRNGKey(7), **kw)


# Eager (unjitted) runs of the Dirichlet-based losses dispatch thousands of small ops
# (spectral norm, the Dirichlet KL's series, the flows' scan): jit-only keeps the suite fast.
EAGER_TOO = ("duq", "fedl")


class LossTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.named_parameters(*[(name, name) for name in EAGER_TOO])
    def test_loss_and_gradient_are_finite(self, name):
        self._check_loss(name)

    @chex.variants(with_jit=True)
    @parameterized.named_parameters(*[(name, name) for name in sorted(set(TINY) - set(EAGER_TOO))])
    def test_loss_and_gradient_are_finite_jit_only(self, name):
        self._check_loss(name)

    def _check_loss(self, name):
        method = TINY[name]
        params, model_state = _state(method)
        images, labels = _batch()

        def objective(p):
            out = method.loss(p, model_state, method.init_method_state(), images, labels, _ctx())
            return jnp.mean(out.loss_B), out

        (value, out), grads = self.variant(jax.value_and_grad(objective, has_aux=True))(params)
        chex.assert_shape(out.loss_B, (B,))
        chex.assert_type(out.loss_B, jnp.float32)
        chex.assert_shape(out.logs["correct_B"], (B,))
        chex.assert_tree_all_finite((value, grads, out.loss_B))
        # The new model state has the structure of the old one (the trainer carries it).
        chex.assert_trees_all_equal_structs(out.model_state, model_state)
        assert any(float(jnp.abs(g).max()) > 0 for g in jax.tree_util.tree_leaves(grads))


@pytest.mark.parametrize("name", sorted(TINY))
def test_predictions_have_the_method_s_scores(name):
    method = TINY[name]
    params, model_state = _state(method)
    images, labels = _batch(1)
    variables = {"params": params, **model_state}
    state = method.init_method_state()
    if method.needs_fit:
        state = method.fit(variables, state, [_batch(2, 30), _batch(3, 30)])
    raw = jax.tree_util.tree_map(np.asarray, jax.jit(method.predict)(
        variables, state, images, jax.random.PRNGKey(0)))
    for value in raw.values():
        assert value.shape[0] == B
    pred = method.predictions(raw, np.asarray(labels))
    assert set(pred.scores) == set(method.score_names)
    assert "mp" in pred.scores
    assert ("um" in pred.scores) == (name != "duq")   # DUQ has no precision
    chex.assert_shape(pred.probs, (B, K))
    np.testing.assert_allclose(pred.probs.sum(-1), 1.0, rtol=1e-12)
    np.testing.assert_array_equal(method.predicted_class(raw), pred.probs.argmax(-1))
    assert method.name in method.describe().lower().replace("-", "_") or name == "fedl"
    assert "reading" in method.describe()


# ------------------------------------------------------------------------------------- DUQ
def _duq_reference(x, labels, w, sums, counts, sigma, lam):
    """DUQ's loss on identity features z = x, in float64 NumPy: mean_c BCE + lam * penalty."""
    z = x.reshape(len(x), -1).astype(np.float64)
    n = w.shape[0]
    e = sums / counts[:, None]
    emb = np.einsum("bd,nkd->bkn", z, w)
    diff = emb - e[None]
    kern = np.exp(-np.mean(diff ** 2, -1) / (2 * sigma ** 2))
    grad_z = np.einsum("bk,bkn,nkd->bd", kern, diff, w) * (-1.0 / (n * sigma ** 2))
    penalty = (np.linalg.norm(grad_z, axis=-1) - 1) ** 2
    y = np.eye(w.shape[1])[labels]
    bce = -np.mean(y * np.maximum(np.log(kern), -100)
                   + (1 - y) * np.maximum(np.log1p(-kern), -100), -1)
    return bce + lam * penalty, emb


def test_duq_loss_and_centroid_ema_against_numpy():
    method = TINY["duq"]
    params, model_state = _state(method)
    images, labels = _batch(4)
    stats_ = jax.tree_util.tree_map(np.asarray, model_state["duq"]["head"])
    w = np.asarray(params["head"]["weights"], np.float64)
    x = np.asarray(images, np.float64)
    ref_loss, emb = _duq_reference(x, np.asarray(labels), w, stats_["sums_KxN"],
                                   stats_["counts_K"], 0.5, 0.3)
    # Two identical devices: the batch statistics enter the EMA summed over them (ctx.sum).
    out = jax.jit(lambda p: method.loss(p, model_state, {}, images, labels,
                                        _ctx(sum=lambda v: 2 * v)))(params)
    np.testing.assert_allclose(out.loss_B, ref_loss, rtol=2e-4)
    onehot = np.eye(K)[np.asarray(labels)]
    gamma = 0.9
    new = out.model_state["duq"]["head"]
    np.testing.assert_allclose(new["counts_K"],
                               gamma * stats_["counts_K"] + (1 - gamma) * 2 * onehot.sum(0),
                               rtol=1e-6)
    np.testing.assert_allclose(new["sums_KxN"], gamma * stats_["sums_KxN"] + (1 - gamma) * 2
                               * np.einsum("bk,bkn->kn", onehot, emb), rtol=1e-5, atol=1e-6)
    # Predictions: mp = max_c K_c, probs = K / sum K, log-space twin of mp.
    raw = {k: np.asarray(v) for k, v in method.predict({"params": params, **model_state}, {},
                                                         images, None).items()}
    pred = method.predictions(raw)
    kern = np.exp(raw["log_kernel_BxK"].astype(np.float64))
    np.testing.assert_allclose(pred.scores["mp"], kern.max(-1), rtol=1e-12)
    np.testing.assert_allclose(pred.probs, kern / kern.sum(-1, keepdims=True), rtol=1e-12)
    np.testing.assert_allclose(pred.scores["neg_kernel_distance"], np.log(kern.max(-1)),
                               rtol=1e-12)


def test_train_model_runs_inside_shard_map_with_the_mesh_axis():
    """The registered PostNet (its latent BatchNorm averages over the "data" axis) runs its loss
    inside shard_map, as the trainer does, with collectives through the StepContext."""
    mesh = jax.make_mesh((1,), ("data",))
    config = configs.build_config("mnist", "postnet")
    setup = methods_lib.MethodSetup(10, (5,) * 10, (12, 12, 1))
    method = methods_lib.from_config(config, setup)
    variables = method.init(jax.random.PRNGKey(0), (12, 12, 1))
    params = variables.pop("params")
    images = jnp.asarray(np.random.default_rng(0).uniform(size=(8, 12, 12, 1)), jnp.float32)
    labels = jnp.arange(8) % 10

    def step(p, ms, x, y):
        ctx = StepContext(jnp.int32(0), jax.random.PRNGKey(1),
                          mean=lambda v: jax.lax.pmean(v, "data"),
                          sum=lambda v: jax.lax.psum(v, "data"))
        out = method.loss(p, ms, {}, x, y, ctx)
        return ctx.mean(jnp.mean(out.loss_B)), out.model_state

    spec = jax.sharding.PartitionSpec
    images, labels = (jax.device_put(a, jax.sharding.NamedSharding(mesh, spec("data")))
                      for a in (images, labels))
    run = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(spec(), spec(), spec("data"),
                                                           spec("data")),
                                out_specs=(spec(), spec())))
    loss, new_state = run(params, variables, images, labels)
    assert np.isfinite(float(loss))
    chex.assert_trees_all_equal_structs(new_state, variables)


# -------------------------------------------------------------------------------- PostNet
def test_postnet_loss_and_concentration_against_scipy():
    method = TINY["postnet"]
    params, model_state = _state(method)
    images, labels = _batch(5)
    out = jax.jit(lambda p: method.loss(p, model_state, {}, images, labels, _ctx()))(params)
    log_q = np.asarray(jax.jit(lambda p: method.train_model.apply(
        {"params": p, **model_state}, images, train=True,
        mutable=["batch_stats"])[0]["log_q_BxK"])(params), np.float64)
    counts = np.array([40.0, 50.0, 10.0])
    alpha = 1 + counts * np.exp(log_q)
    y = np.asarray(labels)
    ref = np.array([special.digamma(a.sum()) - special.digamma(a[c])
                    - 1e-2 * stats.dirichlet(a).entropy() for a, c in zip(alpha, y)])
    np.testing.assert_allclose(out.loss_B, ref, rtol=1e-4)
    # Host predictions use the training counts N_c; no density at all gives the flat Dir(1).
    pred = method.predictions({"log_q_BxK": np.full((2, K), -1e4)})
    np.testing.assert_allclose(pred.alpha, 1.0)
    np.testing.assert_allclose(pred.scores["um"], np.log(K), rtol=1e-12)
    pred = method.predictions({"log_q_BxK": log_q})
    np.testing.assert_allclose(pred.alpha, alpha, rtol=1e-12)
    np.testing.assert_allclose(pred.scores["um"], np.log(alpha.sum(-1)), rtol=1e-12)
    np.testing.assert_allclose(pred.scores["mp"], (alpha / alpha.sum(-1, keepdims=True)).max(-1),
                               rtol=1e-12)


def test_postnet_needs_every_class_in_the_training_split():
    with pytest.raises(ValueError, match="every class must occur"):
        dataclasses.replace(TINY["postnet"], class_counts=(40, 0, 10))


# --------------------------------------------------------------------------- Prior Networks
@pytest.mark.parametrize("name", ["kl_pn", "rkl_pn"])
def test_prior_network_loss_against_the_closed_form(name):
    method = TINY[name]
    params, _ = _state(method)
    images, labels = _batch(6)
    out = jax.jit(lambda p: method.loss(p, {}, {}, images, labels, _ctx()))(params)
    noise_key, _ = jax.random.split(_ctx().key)
    noise = pn_math.ood_noise(noise_key, images, method.ood)
    logits = np.asarray(method.eval_model.apply({"params": params},
                                                jnp.concatenate([images, noise])), np.float64)
    alpha_id, alpha_ood = np.exp(logits[:B]), np.exp(logits[B:])
    y = np.eye(K)[np.asarray(labels)]
    if method.target_form == "smoothed":
        target = 100.0 * (0.01 + (1 - K * 0.01) * y)
    else:
        target = 1 + 100.0 * y

    def kl(a, b):   # KL(Dir(a) || Dir(b)), textbook closed form
        a0, b0 = a.sum(-1), b.sum(-1)
        return (special.gammaln(a0) - special.gammaln(b0)
                + np.sum(special.gammaln(b) - special.gammaln(a)
                         + (a - b) * (special.digamma(a) - special.digamma(a0)[:, None]), -1))

    if name == "rkl_pn":   # RKL-PN: KL(Dir(alpha) || Dir(target)); KL-PN the forward one
        kl_id, kl_ood = kl(alpha_id, target), kl(alpha_ood, np.ones_like(alpha_ood))
    else:
        kl_id, kl_ood = kl(target, alpha_id), kl(np.ones_like(alpha_ood), alpha_ood)
    np.testing.assert_allclose(out.logs["kl_id"], kl_id, rtol=1e-4)
    np.testing.assert_allclose(out.logs["kl_ood"], kl_ood, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out.loss_B, (kl_id + method.ood_weight * kl_ood) / 100.0,
                               rtol=1e-4, atol=1e-7)
    pred = method.predictions({"logits_BxK": logits[:B]})
    np.testing.assert_allclose(pred.scores["um"], special.logsumexp(logits[:B], -1), rtol=1e-12)
    np.testing.assert_allclose(pred.probs, special.softmax(logits[:B], -1), rtol=1e-12)


def test_prior_network_rejects_unknown_ood_and_target_choices():
    with pytest.raises(ValueError, match="method_args: ood='fashion_mnist'.*noise_uniform"):
        dataclasses.replace(TINY["kl_pn"], ood="fashion_mnist")
    with pytest.raises(ValueError, match="method_args: target_form='sharp'"):
        dataclasses.replace(TINY["kl_pn"], target_form="sharp")


# ------------------------------------------------------------------------------------ DAEDL
def test_daedl_fit_equals_numpy_and_scipy_and_maps_the_training_range_to_0_1():
    method = dataclasses.replace(TINY["daedl"])
    params, model_state = _state(method)
    variables = {"params": params, **model_state}
    batches = [_batch(10, 40), _batch(11, 40)]
    state = method.fit(variables, {}, batches)
    feats = np.concatenate([np.asarray(x, np.float64).reshape(len(x), -1) for x, _ in batches])
    labels = np.concatenate([np.asarray(y) for _, y in batches])
    logpdf = np.empty((len(feats), K))
    for c in range(K):
        zc = feats[labels == c]
        cov = np.cov(zc, rowvar=False)
        np.testing.assert_allclose(state["means_KxD"][c], zc.mean(0), rtol=1e-6)
        chol = np.asarray(state["cholesky_KxDxD"][c], np.float64)
        np.testing.assert_allclose(chol @ chol.T, cov, rtol=1e-5, atol=1e-7)
        logpdf[:, c] = stats.multivariate_normal(zc.mean(0), cov).logpdf(feats)
    score = special.logsumexp(logpdf, axis=-1)
    np.testing.assert_allclose([state["score_min"], state["score_max"]],
                               [score.min(), score.max()], rtol=1e-4)
    # The training extremes map to d = 0 and d = 1, to the float32 rounding of the scores:
    # `predict` (a batch of 80, its own program) and the fit (two batches of 40) each compute
    # the float64 score to within their own rounding, so d at an extreme is off by at most the
    # sum of the two errors over the score range. The same program on a CPU gives exactly 0
    # and 1; another platform may choose other kernels for the two batch sizes.
    images = jnp.concatenate([x for x, _ in batches])
    raw = method.predict(variables, state, images, None)
    # float32 rounds each class's log-pdf to within the dot-product bound D u |log-pdf| (D
    # features, u = 2**-24), so a score near 0, a sum of terms of up to |log-pdf| in size, is
    # not held to 1e-4 of itself (an H100 put -0.010015 at 1.2e-6 from scipy's -0.010016).
    rounding = feats.shape[1] * 2.0**-24 * np.abs(logpdf).max()
    np.testing.assert_allclose(raw["log_density_B"], score, rtol=1e-4, atol=rounding)
    predict_error = np.max(np.abs(np.asarray(raw["log_density_B"], np.float64) - score))
    fit_error = max(abs(float(state["score_min"]) - score.min()),
                    abs(float(state["score_max"]) - score.max()))
    d_tolerance = (predict_error + fit_error) / (score.max() - score.min())
    assert d_tolerance < 1e-5   # float32 rounding, not a different score
    np.testing.assert_allclose(raw["density_B"][score.argmin()], 0.0, atol=d_tolerance)
    np.testing.assert_allclose(raw["density_B"][score.argmax()], 1.0, atol=d_tolerance)
    # Scores: log alpha*_0 with alpha* = exp(d logits) + 1e-6.
    raw = {k: np.asarray(v) for k, v in raw.items()}
    pred = method.predictions(raw)
    d = np.maximum(raw["density_B"].astype(np.float64), 1e-12)   # d = 0 ties break by logits
    scaled = d[:, None] * raw["logits_BxK"]
    np.testing.assert_allclose(pred.scores["um"], np.log(np.sum(np.exp(scaled) + 1e-6, -1)),
                               rtol=1e-12)
    alpha = np.exp(scaled) + 1e-6
    np.testing.assert_allclose(pred.probs, alpha / alpha.sum(-1, keepdims=True), rtol=1e-12)
    np.testing.assert_array_equal(pred.probs.argmax(-1), raw["logits_BxK"].argmax(-1))
    # d ~ 0: p* uniform (every alpha* within a factor exp(d * logit spread) of the others),
    # the prediction still the logits'
    lowest = score.argmin()
    spread = np.ptp(raw["logits_BxK"][lowest].astype(np.float64))
    np.testing.assert_allclose(pred.probs[lowest], 1 / K,
                               atol=np.expm1(d[lowest] * spread) / K + 1e-11)
    np.testing.assert_allclose(pred.scores["log_density"], raw["log_density_B"], rtol=1e-12)
    # Before the fit: d = 1, the plain exp-EDL model.
    unfitted = method.predict(variables, {}, images, None)
    np.testing.assert_allclose(unfitted["density_B"], 1.0)


# ------------------------------------------------------------------------------------ F-EDL
def test_fedl_predictions_against_numpy():
    rng = np.random.default_rng(12)
    raw = {"log_alpha_BxK": rng.normal(size=(5, K)).astype(np.float32),
           "p_logits_BxK": rng.normal(size=(5, K)).astype(np.float32),
           "tau_B": rng.uniform(0.1, 3, 5).astype(np.float32)}
    pred = TINY["fedl"].predictions(raw, np.arange(5) % K)
    alpha = np.exp(raw["log_alpha_BxK"].astype(np.float64))
    p = special.softmax(raw["p_logits_BxK"].astype(np.float64), -1)
    tau = raw["tau_B"].astype(np.float64)[:, None]
    s = alpha.sum(-1, keepdims=True) + tau
    mean = (alpha + tau * p) / s
    var = mean * (1 - mean) / (s + 1) + tau ** 2 * p * (1 - p) / (s * (s + 1))
    np.testing.assert_allclose(pred.probs, mean, rtol=1e-12)
    np.testing.assert_allclose(pred.scores["mp"], mean.max(-1), rtol=1e-12)
    np.testing.assert_allclose(pred.scores["um"], np.log(s[:, 0]), rtol=1e-12)
    np.testing.assert_allclose(pred.scores["neg_variance_sum"], -var.sum(-1), rtol=1e-12)
    np.testing.assert_allclose(pred.scores["neg_expected_gini"],
                               -(1 - np.sum(mean ** 2, -1) - var.sum(-1)), rtol=1e-12)


# ------------------------------------------------------------------- backbones and presets
def test_backbone_without_spectral_norm_is_the_protocol_convnet():
    images = jnp.asarray(np.random.default_rng(13).uniform(size=(2, 12, 12, 1)), jnp.float32)
    reference = models.ConvNet(num_classes=10)
    params = reference.init(jax.random.PRNGKey(0), images)
    out = networks.Backbone("convnet", 10).apply(params, images)
    np.testing.assert_allclose(out["logits"], reference.apply(params, images), rtol=1e-6)
    chex.assert_shape((out["encoder"], out["hidden"]), [(2, 64), (2, 64)])
    vgg = jax.eval_shape(lambda: models.VGG16(num_classes=10).init(
        jax.random.PRNGKey(0), jnp.zeros((1, 32, 32, 3)), train=False))
    ours = jax.eval_shape(lambda: networks.Backbone("vgg16", 10, dropout_rate=0.5).init(
        jax.random.PRNGKey(0), jnp.zeros((1, 32, 32, 3)), train=False))
    chex.assert_trees_all_equal_shapes_and_dtypes(ours, vgg)


def test_spectral_norm_bounds_the_layers_singular_value():
    layer = networks.Backbone("convnet", 10, spectral_norm=True)
    images = jnp.asarray(np.random.default_rng(14).uniform(size=(2, 12, 12, 1)), jnp.float32)
    variables = layer.init(jax.random.PRNGKey(0), images)
    state = {"batch_stats": variables["batch_stats"]}
    step = jax.jit(lambda st: layer.apply({"params": variables["params"], **st}, images,
                                          train=True, mutable=["batch_stats"])[1])
    for _ in range(30):   # power iterations converge over training steps
        state = step(state)
    kernel = np.asarray(variables["params"]["dense0"]["kernel"])
    sigma = np.linalg.svd(kernel, compute_uv=False)[0]
    np.testing.assert_allclose(state["batch_stats"]["sn_dense0"]["dense0/kernel/sigma"], sigma,
                               rtol=1e-3)


@pytest.mark.parametrize("dataset,shape", [("mnist", (28, 28, 1)), ("cifar10", (32, 32, 3))])
@pytest.mark.parametrize("name", ["duq", "kl_pn", "rkl_pn", "postnet", "daedl", "fedl"])
def test_every_preset_builds_its_method_with_the_protocol_backbone(dataset, shape, name):
    config = configs.build_config(dataset, name)
    config_lib.validate(config)
    setup = methods_lib.MethodSetup(10, (4800,) * 10, shape)
    method = methods_lib.from_config(config, setup)
    assert method.name == name and "protocol reading" in method.describe()
    variables = jax.eval_shape(lambda: method.init(jax.random.PRNGKey(0), shape))
    params = variables["params"]
    if name == "duq":
        feature = 64 if dataset == "mnist" else 512
        assert params["head"]["weights"].shape == (feature, 10, feature)
        assert variables["duq"]["head"]["counts_K"].shape == (10,)
    if name == "postnet":
        last = "dense3" if dataset == "mnist" else "dense2"
        assert params["encoder"][last]["kernel"].shape[-1] == 6
        assert params["z0"].shape == (10, 6, 6)
    if name == "daedl":
        assert any(k.startswith("sn_") for k in variables["batch_stats"])
    if name == "fedl":
        assert {"g_p", "g_tau", "backbone"} <= set(params)


def test_source_modifier_sets_the_reading_and_the_reference_settings():
    c = configs.build_config("cifar10", "postnet,source")
    config_lib.validate(c)
    assert (c.recipe, c.learning_rate, c.batch_size, c.variant) == ("source", 2.5e-4, 64,
                                                                    "postnet_source")
    c = configs.build_config("mnist", "fedl,source,quick")
    assert c.recipe == "source" and c.normalize and c.num_epochs == 2
    method = methods_lib.from_config(c, methods_lib.MethodSetup(10, (9,) * 10, (28, 28, 1)))
    assert "source reading" in method.describe()
    variables = jax.eval_shape(lambda: method.init(jax.random.PRNGKey(0), (28, 28, 1)))
    assert variables["params"]["backbone"]["dense2"]["kernel"].shape == (64, 10)  # MLP [64, 64]
    c = configs.build_config("cifar10", "fedl,source")
    method = methods_lib.from_config(c, methods_lib.MethodSetup(10, (9,) * 10, (32, 32, 3)))
    variables = jax.eval_shape(lambda: method.init(jax.random.PRNGKey(0), (32, 32, 3)))
    head = variables["params"]["alpha_head"]   # SN 512 -> 256 -> BN -> SN 256 -> K
    assert head["dense0"]["kernel"].shape == (512, 256) and "bn" in head
    assert "sn_conv12" in variables["batch_stats"]["backbone"]
    with pytest.raises(ValueError, match="no recipe for config.method='duq'"):
        configs.build_config("mnist", "duq,source")
    c = configs.build_config("mnist", "duq")
    c.recipe = "source"
    with pytest.raises(ValueError, match="recipe='source' is not available"):
        methods_lib.check_config(c)


def test_bad_recipe_names_the_field():
    config = configs.build_config("mnist", "kl_pn")
    config.recipe = "sauce"
    with pytest.raises(ValueError, match=r"config.recipe=.*'protocol', 'source'"):
        config_lib.validate(config)


@pytest.mark.parametrize("preset,args,match", [
    ("kl_pn", {"ood": "kmnist"}, r"method_args: ood='kmnist' .*noise_uniform"),
    ("kl_pn", {"target_form": "sharp"}, r"method_args: target_form='sharp'"),
    ("duq", {"gamma": 1.0}, r"method_args: gamma=1.0 .*must be in \(0, 1\)"),
    ("duq", {"length_scale": 0.0}, r"method_args: length_scale=0.0 .*must be > 0"),
    ("duq", {"length_scale": "wide"}, r"method_args: length_scale='wide' .*must be a number"),
    ("kl_pn", {"target_smoothing": 0.2},
     r"method_args: target_smoothing=0.2 .*must be in \[0, 1/K\)"),
    ("postnet", {"entropy_weight": -1e-6}, r"method_args: entropy_weight=-1e-06"),
    ("postnet", {"latent_dim": 2.5}, r"method_args: latent_dim=2.5 .*must be a number \(int\)"),
    ("fedl", {"head_dropout": 1.0}, r"method_args: head_dropout=1.0 .*\[0, 1\)"),
    ("duq", {"ood": "noise_uniform"}, r"names 'ood', not a setting of config.method='duq'.*"
                                      r"length_scale"),
    ("gedl", {"c_tau": 10}, r"names 'c_tau', not a setting of config.method='evidential'"),
])
def test_bad_method_args_name_the_setting_the_value_and_what_is_allowed(preset, args, match):
    config = configs.build_config("mnist", preset)
    config.method_args = json.dumps(args)
    config_lib.validate(config)   # the method's own settings are the method's
    with pytest.raises(ValueError, match=match):
        methods_lib.check_config(config)
    with pytest.raises(ValueError, match=match):
        methods_lib.from_config(config, methods_lib.MethodSetup(10, (5,) * 10, (28, 28, 1)))


def test_method_args_must_be_a_json_object():
    config = configs.build_config("mnist", "duq")
    config.method_args = "length_scale=0.2"
    with pytest.raises(ValueError, match=r"config.method_args=.* is not JSON"):
        config_lib.validate(config)
