"""Each variant's loss equals an independent float64 NumPy/SciPy transcription of its formula."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized
from scipy import special

from gedl_jax import config as config_lib
from gedl_jax import configs
from gedl_jax import evidential as ev
from gedl_jax.evidential import loss as losses
from gedl_jax.methods.evidential import spec_from_config

K = 10
B = 32


def _softplus(x):
    return np.logaddexp(0.0, x)


def _kl(a, b):
    a0, b0 = a.sum(-1), b.sum(-1)
    return (special.gammaln(a0) - special.gammaln(b0)
            + np.sum(special.gammaln(b) - special.gammaln(a), -1)
            + np.sum((a - b) * (special.digamma(a) - special.digamma(a0)[:, None]), -1))


def _fisher_neg_logdet(alpha):
    out = []
    for a in alpha:
        s = a.sum()
        fim = np.diag(special.polygamma(1, a)) - special.polygamma(1, s) * np.ones((len(a),) * 2)
        sign, logdet = np.linalg.slogdet(fim)
        assert sign > 0
        out.append(-logdet)
    return np.array(out)


def reference_loss(config, logits, labels, epoch):
    """The variant's per-example loss, written from the paper and the variants' reference code,
    in float64."""
    logits = logits.astype(np.float64)
    y = np.eye(K)[labels]
    if config.evidence == "softplus":
        e = _softplus(logits)
    elif config.evidence == "exp":
        e = np.exp(np.clip(logits, -config.exp_clip, config.exp_clip))
    else:
        e = np.maximum(logits, 0)
    total = e.sum(-1)
    if config.prior_strength == "adaptive":  # Eq. weight_update
        w = (K + config.c_w * K * total) / (1 + K * total)
    else:
        w = np.full(len(e), config_lib.resolve(config).prior_strength_W)
    alpha = e + w[:, None] / K
    s = alpha.sum(-1)
    p = alpha / s[:, None]
    var = alpha * (s[:, None] - alpha) / (s[:, None] ** 2 * (s[:, None] + 1))
    trigamma = special.polygamma(1, alpha)
    lik = {
        "digamma": special.digamma(s) - special.digamma(alpha[np.arange(B), labels]),
        "log": np.log(s) - np.log(alpha[np.arange(B), labels]),
        "mse": np.sum((y - p) ** 2 + var, -1),
        "mse_novar": np.sum((y - p) ** 2, -1),
        "fisher_mse": np.sum((y - p) ** 2 * trigamma + var * trigamma, -1),
    }[config.likelihood]
    prior = np.repeat(w[:, None] / K, K, axis=1)
    target = alpha if config.kl_target == "all" else y * prior + (1 - y) * alpha
    kl = _kl(target, prior)
    if config.kl_schedule == "edl_anneal":
        weight = min(1.0, epoch / 10.0)
    else:  # first step of a fresh GEDL accumulator: sum_{i<=t} E[S] = this batch's mean S
        weight = 1.0 / max(1.0, config.c_tau / s.mean())
    loss = lik + weight * kl
    loss = loss + config.fisher_logdet_weight * _fisher_neg_logdet(alpha)
    u = w / s
    loss = loss - config.red_regularizer_weight * u * logits[np.arange(B), labels]
    return loss


@pytest.mark.parametrize("variant", sorted(config_lib.VARIANTS))
@pytest.mark.parametrize("dataset", ["mnist", "cifar10"])
def test_variant_loss_matches_reference(variant, dataset):
    config = configs.build_config(dataset, variant)
    spec = spec_from_config(config)
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, size=(B, K)).astype(np.float32)
    labels = rng.integers(0, K, size=B)
    epoch = 3
    loss_B, _, terms = jax.jit(lambda lg, lb: losses.per_example_loss(
        spec, lg, lb, ev.tau_init(), jnp.int32(epoch)))(logits, labels)
    expected = reference_loss(config, logits, labels, epoch)
    np.testing.assert_allclose(np.asarray(loss_B), expected, rtol=2e-4, atol=2e-5)


def test_variants_differ_in_the_documented_fields():
    gedl = configs.build_config("mnist", "gedl")
    edl = configs.build_config("mnist", "edl")
    redl = configs.build_config("mnist", "redl")
    assert gedl.prior_strength == "adaptive" and edl.prior_strength == "fixed"
    assert config_lib.resolve(edl).prior_strength_W == 10.0
    assert config_lib.resolve(redl).prior_strength_W == pytest.approx(1.0)  # W = lambda K
    assert gedl.kl_target == "all" and edl.kl_target == "masked"


def test_gedl_with_fixed_w_and_annealing_is_edl_digamma_objective():
    """GEDL with W = K and EDL's annealing, masked KL: Sensoy's Eq. 4 objective."""
    config = configs.build_config("mnist", "ablation_base")
    spec = spec_from_config(config)
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 2, size=(B, K)).astype(np.float32)
    labels = rng.integers(0, K, size=B)
    loss_B, _, _ = losses.per_example_loss(spec, logits, labels, ev.tau_init(), jnp.int32(5))
    e = _softplus(logits.astype(np.float64))
    alpha = e + 1.0
    s = alpha.sum(-1)
    y = np.eye(K)[labels]
    alpha_tilde = (alpha - 1) * (1 - y) + 1  # Sensoy's masked target
    expected = (special.digamma(s) - special.digamma(alpha[np.arange(B), labels])
                + 0.5 * _kl(alpha_tilde, np.ones_like(alpha)))
    np.testing.assert_allclose(np.asarray(loss_B), expected, rtol=2e-4, atol=2e-5)


def test_warmup_uses_cross_entropy_and_freezes_tau():
    config = configs.build_config("cifar100", "gedl")
    assert config.warmup_epochs == 5
    spec = spec_from_config(config)
    logits = jnp.asarray(np.random.default_rng(2).normal(size=(4, 100)), jnp.float32)
    labels = jnp.array([0, 5, 7, 99])
    state = ev.tau_init()
    loss_B, new_state, _ = losses.per_example_loss(spec, logits, labels, state, jnp.int32(2))
    ce = -jax.nn.log_softmax(logits)[jnp.arange(4), labels]
    np.testing.assert_allclose(loss_B, ce, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(new_state), jax.tree.leaves(state)):
        np.testing.assert_array_equal(a, b)
    loss_B, new_state, _ = losses.per_example_loss(spec, logits, labels, state, jnp.int32(5))
    assert not np.allclose(loss_B, ce)
    assert float(new_state.step_sum) > 0


def test_prior_strength_and_kl_weight_have_no_gradient():
    config = configs.build_config("mnist", "gedl")
    spec = spec_from_config(config)
    logits = jnp.asarray(np.random.default_rng(3).normal(size=(8, K)), jnp.float32)
    labels = jnp.arange(8) % K

    def kl_only(lg):
        out = losses.evidential_outputs(spec, lg)
        return jnp.sum(out.prior_strength_B)

    np.testing.assert_array_equal(jax.grad(kl_only)(logits), 0.0)
    weight_grad = jax.grad(lambda lg: losses.per_example_loss(
        spec, lg, labels, ev.tau_init(), jnp.int32(0))[2].kl_weight)(logits)
    np.testing.assert_array_equal(weight_grad, 0.0)


@pytest.mark.parametrize("variant", sorted(config_lib.VARIANTS))
def test_loss_has_no_implicit_rank_promotion(variant):
    """A (B,) vs (B, K) broadcasting slip would raise here instead of silently broadcasting."""
    spec = spec_from_config(configs.build_config("mnist", variant))
    with jax.numpy_rank_promotion("raise"):
        loss_B, _, _ = losses.per_example_loss(spec, jnp.ones((4, K)), jnp.arange(4),
                                               ev.tau_init(), jnp.int32(1))
    assert loss_B.shape == (4,)


# ---------------------------------------------------------------------------------- chex checks
class LossChexTest(chex.TestCase):
    """per_example_loss under jit and without: the float64 reference, shapes and dtypes of
    everything it returns, finite gradients at extreme logits, and one trace for every epoch
    and batch of the same shape (the epoch is traced, not baked into the program)."""

    @chex.variants(with_jit=True, without_jit=True)
    # digamma + tau; exp evidence + RED regulariser (every variant under jit:
    # test_variant_loss_matches_reference; eager op-by-op dispatch costs seconds per variant).
    @parameterized.parameters("gedl", "red")
    def test_loss_matches_reference_with_shapes_and_dtypes(self, variant):
        config = configs.build_config("mnist", variant)
        spec = spec_from_config(config)
        rng = np.random.default_rng(4)
        logits = rng.normal(0, 3, size=(B, K)).astype(np.float32)
        labels = rng.integers(0, K, size=B).astype(np.int32)

        @self.variant
        def loss_fn(lg, lb, tau, epoch):
            return losses.per_example_loss(spec, lg, lb, tau, epoch)

        loss_B, tau, terms = loss_fn(logits, labels, ev.tau_init(), jnp.int32(3))
        chex.assert_shape([loss_B, terms.likelihood_B, terms.kl_B], (B,))
        chex.assert_shape([terms.kl_weight, terms.mean_strength, terms.mean_prior_strength], ())
        chex.assert_type([loss_B, terms.likelihood_B, terms.kl_B, terms.kl_weight], jnp.float32)
        chex.assert_trees_all_equal_shapes_and_dtypes(tau, ev.tau_init())
        chex.assert_tree_all_finite((loss_B, tau, terms))
        np.testing.assert_allclose(np.asarray(loss_B), reference_loss(config, logits, labels, 3),
                                   rtol=2e-4, atol=2e-5)

    @chex.variants(with_jit=True)
    @parameterized.parameters("gedl", "edl", "iedl", "redl", "red")
    def test_gradients_are_finite_at_extreme_logits(self, variant):
        spec = spec_from_config(configs.build_config("mnist", variant))
        logits = jnp.array([[200.0, -200.0] + [0.0] * (K - 2),   # exp(200) overflows float32
                            [-200.0] * K,
                            [1e-3] * K,
                            [90.0] * K], jnp.float32)
        labels = jnp.array([0, 3, 9, 1], jnp.int32)

        @self.variant
        def grad_fn(lg):
            return jax.grad(lambda x: jnp.mean(losses.per_example_loss(
                spec, x, labels, ev.tau_init(), jnp.int32(4))[0]))(lg)

        grads = grad_fn(logits)
        chex.assert_shape(grads, (4, K))
        chex.assert_type(grads, jnp.float32)
        chex.assert_tree_all_finite(grads)

    def test_one_trace_for_every_epoch_and_batch(self):
        spec = spec_from_config(configs.build_config("mnist", "gedl"))

        @jax.jit
        @chex.assert_max_traces(n=1)
        def step(lg, lb, tau, epoch):
            loss_B, tau, _ = losses.per_example_loss(spec, lg, lb, tau, epoch)
            return jnp.mean(loss_B), tau

        rng = np.random.default_rng(5)
        tau = ev.tau_init()
        for epoch in range(4):
            logits = jnp.asarray(rng.normal(size=(B, K)), jnp.float32)
            labels = jnp.asarray(rng.integers(0, K, size=B), jnp.int32)
            _, tau = step(logits, labels, tau, jnp.int32(epoch))
        assert int(tau.epoch) == 3
