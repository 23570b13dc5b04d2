"""Per-example likelihood terms, EDL's masked KL target and RED's regulariser against float64
closed forms and Monte Carlo, with the variant reductions, gradients and jit checks."""

import chex
import evidential_reference as ref
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.scipy import special as jsp
from scipy import special

from gedl_jax import evidential as ev

EPS = ref.F32_EPS
KS = (2, 10, 100)
N = 128


def _inputs(k, seed, low=1e-4, high=1e6):
    """Log-uniform alphas plus confident rows (alpha_y ~ 1e6, the rest ~1e-4), and labels."""
    rng = np.random.default_rng(seed)
    alpha = ref.log_uniform(rng, (N, k), low, high)
    labels = rng.integers(0, k, N).astype(np.int32)
    alpha[:16] = ref.log_uniform(rng, (16, k), 1e-4, 1e-3)
    alpha[np.arange(16), labels[:16]] = ref.log_uniform(rng, (16,), 1e5, 1e6)
    return alpha, labels


@jax.jit
def _objectives(alpha, labels):
    return dict(nll=ev.expected_nll(alpha, labels), log=ev.log_nll(alpha, labels),
                mse=ev.expected_mse(alpha, labels),
                mse_novar=ev.expected_mse(alpha, labels, include_variance=False),
                fisher_mse=ev.fisher_weighted_mse(alpha, labels),
                fisher_var=ev.fisher_weighted_variance(alpha))


def _psi_scale(alpha, labels):
    a = ref.f64(alpha)
    return np.abs(special.digamma(a.sum(-1))) + np.abs(
        special.digamma(np.take_along_axis(a, labels[:, None], -1)[:, 0]))


@pytest.mark.parametrize("k", KS)
def test_objectives_match_closed_forms(k):
    """Tolerances: rtol 1e-6 (each is a short sum of terms exact to a few ulps; measured <= 5e-7)
    plus the float64 reference's own rounding: psi(S) - psi(alpha_y) is computed by subtraction in
    the reference, so it is good to ~4e-15 |psi| absolute only."""
    alpha, labels = _inputs(k, seed=k)
    got = _objectives(alpha, labels)
    ref.assert_close(got["nll"], ref.expected_nll(alpha, labels), rtol=1e-6,
                     atol=4e-15 * (1 + _psi_scale(alpha, labels)), what="expected_nll")
    ref.assert_close(got["log"], ref.log_nll(alpha, labels), rtol=1e-6, atol=1e-15,
                     what="log_nll")
    ref.assert_close(got["mse"], ref.expected_mse(alpha, labels), rtol=1e-6, atol=1e-30,
                     what="expected_mse")
    ref.assert_close(got["mse_novar"], ref.expected_mse(alpha, labels, include_variance=False),
                     rtol=1e-6, atol=1e-30, what="expected_mse without variance")
    ref.assert_close(got["fisher_mse"], ref.fisher_weighted_mse(alpha, labels), rtol=1e-6,
                     atol=1e-30, what="fisher_weighted_mse")
    ref.assert_close(got["fisher_var"], ref.fisher_weighted_variance(alpha), rtol=1e-6,
                     atol=1e-30, what="fisher_weighted_variance")


def test_confident_predictions_keep_relative_precision():
    """alpha_y ~ 1e6 with the rest ~1e-4: psi(S) - psi(alpha_y) ~ 1e-9 and 1 - p_y ~ 1e-9. The
    reference is rest * psi1(alpha_y + rest/2) (midpoint rule, error ~ rest^3 psi3 ~ 1e-30);
    rtol 2e-6. The textbook float32 digamma difference is 0 or pure rounding here."""
    rng = np.random.default_rng(0)
    alpha = ref.log_uniform(rng, (N, 10), 1e-4, 1e-3)
    labels = rng.integers(0, 10, N).astype(np.int32)
    alpha[np.arange(N), labels] = ref.log_uniform(rng, (N,), 1e4, 1e6)
    a64 = ref.f64(alpha)
    a_y = a64[np.arange(N), labels]
    rest = a64.sum(-1) - a_y
    want_nll = rest * special.polygamma(1, a_y + rest / 2)
    got = _objectives(alpha, labels)
    ref.assert_close(got["nll"], want_nll, rtol=2e-6, atol=0.0, what="confident expected_nll")
    ref.assert_close(got["log"], np.log1p(rest / a_y), rtol=2e-6, atol=0.0, what="confident log")
    ref.assert_close(got["mse_novar"], ref.expected_mse(alpha, labels, include_variance=False),
                     rtol=2e-6, atol=0.0, what="confident mse")
    naive = jsp.digamma(jnp.sum(alpha, -1)) - jsp.digamma(alpha[np.arange(N), labels])
    assert np.max(np.abs(np.asarray(naive, np.float64) / want_nll - 1)) > 0.5


@pytest.mark.parametrize("k", [2, 10])
def test_objectives_match_monte_carlo(k):
    """E[-log pi_y] and E||y - pi||^2 from 20000 Dirichlet samples per example (concentrations
    0.5 .. 20); tolerance 5 standard errors."""
    rng = np.random.default_rng(50 + k)
    alpha = ref.log_uniform(rng, (6, k), 0.5, 20.0)
    labels = rng.integers(0, k, 6).astype(np.int32)
    pi = ref.dirichlet_samples(rng, alpha, 20000)
    pi_y = np.take_along_axis(pi, labels[:, None, None], -1)[..., 0]
    nll_mean, nll_se = ref.mc_mean(-np.log(pi_y))
    sq_mean, sq_se = ref.mc_mean(np.sum((ref.onehot(labels, k)[:, None, :] - pi) ** 2, -1))
    got = _objectives(np.resize(alpha, (N, k)), np.resize(labels, N))
    ref.assert_close(got["nll"][:6], nll_mean, rtol=0.0, atol=5 * nll_se, what="E[-log pi_y]")
    ref.assert_close(got["mse"][:6], sq_mean, rtol=0.0, atol=5 * sq_se, what="E||y - pi||^2")


@jax.jit
def _objective_gradients(alpha, labels):
    return {name: jax.grad(lambda a, f=f: jnp.sum(f(a, labels)))(alpha) for name, f in dict(
        nll=ev.expected_nll, log=ev.log_nll, mse=ev.expected_mse,
        mse_novar=lambda a, y: ev.expected_mse(a, y, include_variance=False),
        fisher_mse=ev.fisher_weighted_mse,
        fisher_var=lambda a, y: ev.fisher_weighted_variance(a)).items()}


def test_gradients_match_reference_derivatives():
    """d/d alpha of each objective at concentrations 1e-3 .. 1e5, including confident rows: against
    complex-step derivatives of the float64 closed forms (tolerance 1e-5 of the row's largest
    entry; measured <= 5e-7), and for the trigamma-weighted terms (scipy's polygamma takes no
    complex input) against their float64 analytic derivatives (tolerance 1e-5 of the summed
    magnitudes of the derivative's pieces, which cancel to ~1e-7 relative on confident rows)."""
    alpha, labels = _inputs(10, seed=6, low=1e-3, high=1e5)
    got = _objective_gradients(alpha, labels)
    complex_refs = dict(nll=ref.expected_nll, log=ref.log_nll, mse=ref.expected_mse,
                        mse_novar=lambda a, y: ref.expected_mse(a, y, include_variance=False))
    for name, fn in complex_refs.items():
        want = ref.complex_step_gradient(lambda a, fn=fn: fn(a, labels), alpha)
        ref.assert_close(got[name], want, rtol=0.0,
                         atol=1e-5 * np.max(np.abs(want), -1, keepdims=True), what=name)
    (mse, mse_size), (var, var_size) = ref.fisher_weighted_gradients(alpha, labels)
    ref.assert_close(got["fisher_mse"], mse, rtol=0.0, atol=1e-5 * mse_size, what="fisher_mse")
    ref.assert_close(got["fisher_var"], var, rtol=0.0, atol=1e-5 * var_size, what="fisher_var")


def test_masked_kl_target_reductions():
    """(4) prior 1 gives Sensoy's (alpha - 1)(1 - y) + 1 = y + (1 - y) alpha; R-EDL's prior lambda
    resets the true class to lambda; the reset entry carries no gradient."""
    k = 10
    rng = np.random.default_rng(1)
    evidence = ref.log_uniform(rng, (N, k), 1e-4, 1e4)
    labels = rng.integers(0, k, N).astype(np.int32)
    alpha = evidence + np.float32(1.0)
    y = ref.onehot(labels, k)
    target = ev.masked_kl_target(alpha, labels, jnp.ones_like(alpha))
    np.testing.assert_array_equal(np.asarray(target, np.float64), y + (1 - y) * ref.f64(alpha))
    np.testing.assert_array_equal(np.asarray(ev.masked_kl_target(alpha, labels, 1.0)),
                                  np.asarray(target))
    lam = np.float32(0.1)
    alpha_r = ev.dirichlet_alpha(evidence, ev.fixed_prior_strength(evidence, lam * k),
                                 ev.uniform_base_rate(k))
    target_r = ev.masked_kl_target(alpha_r, labels, jnp.full_like(alpha_r, lam))
    np.testing.assert_array_equal(np.asarray(target_r)[np.arange(N), labels], lam)
    mask = y.astype(bool)
    np.testing.assert_array_equal(np.asarray(target_r)[~mask], np.asarray(alpha_r)[~mask])
    jac = jax.jacobian(lambda a: ev.masked_kl_target(a, labels[:1], 1.0))(jnp.asarray(alpha[:1]))
    np.testing.assert_array_equal(np.asarray(jac)[0, :, 0, :], np.diag(1.0 - y[0]))


def test_red_regularizer_value_and_gradient():
    """(5) -stopgrad(u) o_y on the raw logit: gradient -u on the true-class logit, 0 elsewhere,
    also when u is computed from the same logits (its own gradient is cut)."""
    k = 10
    rng = np.random.default_rng(2)
    logits = rng.normal(0, 3, (N, k)).astype(np.float32)
    logits[:8] = -1e3                                  # ReLU zero-evidence region
    labels = rng.integers(0, k, N).astype(np.int32)

    def red_total(x):
        evidence = ev.relu_evidence(x)
        w = ev.fixed_prior_strength(evidence, float(k))
        alpha = ev.dirichlet_alpha(evidence, w, ev.uniform_base_rate(k))
        return jnp.sum(ev.red_regularizer(x, labels, ev.uncertainty_mass(alpha, w)))

    grad = np.asarray(jax.jit(jax.grad(red_total))(logits), np.float64)
    s = np.maximum(ref.f64(logits), 0).sum(-1) + k
    u = k / s
    want = -u[:, None] * ref.onehot(labels, k)
    np.testing.assert_allclose(grad, want, rtol=2 * EPS, atol=0)
    np.testing.assert_allclose(grad[:8][ref.onehot(labels[:8], k) > 0], -1.0, rtol=2 * EPS)
    value = ev.red_regularizer(logits, labels, u.astype(np.float32))
    np.testing.assert_allclose(np.asarray(value, np.float64),
                               -u * ref.f64(logits)[np.arange(N), labels], rtol=2 * EPS)


def test_out_of_range_labels_give_nan_not_a_wrong_class():
    alpha = np.full((3, 4), 2.0, np.float32)
    labels = np.array([0, -1, 4], np.int32)
    for name, value in _objectives(np.resize(alpha, (N, 4)), np.resize(labels, N)).items():
        if name == "fisher_var":
            continue                                   # no label involved
        value = np.asarray(value)[:3]
        assert np.isfinite(value[0]) and np.all(np.isnan(value[1:])), (name, value)
    red = np.asarray(ev.red_regularizer(alpha, labels, np.ones(3, np.float32)))
    assert np.isfinite(red[0]) and np.all(np.isnan(red[1:]))


@jax.jit
def _all_terms_and_gradients(evidence, w, labels):
    """Every per-example term of every variant at alpha = e + W a, and d(sum of terms)/d e."""
    k = evidence.shape[-1]

    def total(e):
        a_k = ev.uniform_base_rate(k)
        alpha = ev.dirichlet_alpha(e, w, a_k)
        prior = w[..., None] * jnp.broadcast_to(a_k, alpha.shape)
        terms = jnp.stack([
            ev.expected_nll(alpha, labels), ev.log_nll(alpha, labels),
            ev.expected_mse(alpha, labels), ev.fisher_weighted_mse(alpha, labels),
            ev.fisher_weighted_variance(alpha), ev.fisher_logdet(alpha),
            ev.dirichlet_kl(alpha, prior),
            ev.dirichlet_kl(ev.masked_kl_target(alpha, labels, prior), prior)])
        return jnp.sum(terms), terms

    (_, terms), grad = jax.value_and_grad(total, has_aux=True)(evidence)
    return terms, grad


@pytest.mark.parametrize("activation", ev.ACTIVATIONS)
def test_finite_gradients_through_every_activation_at_extremes(activation):
    """Logits of +-1e3 (and 0, +-30) through each activation, the adaptive and the fixed prior,
    into every objective, the KL (masked and GEDL's) and the Fisher term, plus RED's regulariser:
    values and gradients with respect to the logits are finite. (alpha = e + W a has
    d alpha / d e = I with W stop-gradient, so d/d logits = d/d e * activation'.)"""
    k = 10
    rng = np.random.default_rng(3)
    logits = rng.choice(np.array([-1e3, -30.0, 0.0, 30.0, 1e3], np.float32), size=(N, k))
    labels = rng.integers(0, k, N).astype(np.int32)
    evidence, vjp = jax.vjp(lambda x: ev.evidence_from_logits(x, activation), jnp.asarray(logits))
    for w in (ev.adaptive_prior_strength(evidence, 0.5), ev.fixed_prior_strength(evidence, 10.0)):
        terms, grad_e = _all_terms_and_gradients(evidence, w, labels)
        (grad_logits,) = vjp(grad_e)
        assert np.all(np.isfinite(np.asarray(terms))), activation
        assert np.all(np.isfinite(np.asarray(grad_logits))), activation
        alpha = ev.dirichlet_alpha(evidence, w, ev.uniform_base_rate(k))
        red_grad = jax.grad(lambda x: jnp.sum(ev.red_regularizer(
            x, labels, ev.uncertainty_mass(alpha, w))))(jnp.asarray(logits))
        assert np.all(np.isfinite(np.asarray(red_grad)))


class ObjectivesJitTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_with_and_without_jit(self):
        alpha, labels = _inputs(10, seed=4)
        fn = self.variant(lambda a, y: dict(
            nll=ev.expected_nll(a, y), log=ev.log_nll(a, y), mse=ev.expected_mse(a, y),
            fisher_mse=ev.fisher_weighted_mse(a, y), fisher_var=ev.fisher_weighted_variance(a),
            red=ev.red_regularizer(a, y, jnp.ones(a.shape[:-1])),
            masked=ev.masked_kl_target(a, y, 1.0)))
        out = fn(alpha, labels)
        jitted = _objectives(alpha, labels)
        np.testing.assert_array_equal(np.asarray(out["masked"]),
                                      np.asarray(ev.masked_kl_target(alpha, labels, 1.0)))
        for name in ("nll", "log", "mse", "fisher_mse", "fisher_var"):
            chex.assert_trees_all_close(out[name], jitted[name], rtol=4 * EPS, atol=1e-30)

    def test_leading_batch_dims_and_no_retrace(self):
        alpha, labels = _inputs(10, seed=5)

        @jax.jit
        @chex.assert_max_traces(n=1)
        def nll(a, y):
            return ev.expected_nll(a, y)

        out = nll(alpha.reshape(8, 16, 10), labels.reshape(8, 16))
        self.assertEqual(out.shape, (8, 16))
        nll(alpha[::-1].reshape(8, 16, 10), labels[::-1].reshape(8, 16))
        chex.assert_trees_all_close(out.reshape(N), _objectives(alpha, labels)["nll"],
                                    rtol=4 * EPS)


@pytest.mark.parametrize("k", KS)
def test_fisher_weighted_objective_has_a_degenerate_minimum_at_infinite_evidence(k):
    """I-EDL's data term alone is minimised by inflating every class's evidence: for
    alpha = a * 1, p = 1/K and psi1(a) = 1/a + O(1/a^2), so a * (Fisher MSE + variance) tends to
    (1 - 1/K)^2 + (K - 1)/K^2 = (K - 1)/K, i.e. the loss falls like 1/a whatever the label.
    This is why I-EDL needs its KL term (or its -log det FIM term) from the first step: with the
    KL annealed from 0 and no log-det term, training drives S up and accuracy to chance
    (docs/results/mnist_medium/README.md)."""
    a = np.array([1e2, 1e3, 1e4, 1e5])
    alpha = np.repeat(a[:, None], k, axis=1).astype(np.float32)
    labels = np.zeros(len(a), np.int32)
    total = np.asarray(ev.fisher_weighted_mse(alpha, labels)
                       + ev.fisher_weighted_variance(alpha), np.float64)
    # float64 reference: the same sum with scipy's trigamma.
    reference = ref.fisher_weighted_mse(alpha.astype(np.float64), labels) \
        + ref.fisher_weighted_variance(alpha.astype(np.float64))
    np.testing.assert_allclose(total, reference, rtol=1e-5)
    assert np.all(np.diff(total) < 0), total                     # strictly decreasing in a
    np.testing.assert_allclose(a * total, (k - 1) / k, rtol=2e-2)  # the 1/a law
    # So a correct, confident prediction (alpha_y = 1000, the others 100) loses to a uniform
    # one with more evidence (alpha = 1e5 * 1).
    confident = alpha[:1].copy()
    confident[0, 0] *= 10.0
    confident_loss = np.asarray(ev.fisher_weighted_mse(confident, labels[:1])
                                + ev.fisher_weighted_variance(confident))[0]
    assert total[-1] < confident_loss
