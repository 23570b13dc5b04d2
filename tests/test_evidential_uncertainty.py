"""Uncertainty measures against float64 closed forms, Monte Carlo and the paper's asymptotics
(Eqs. dist_uncertainty, dist_MI, dist_var_sum; Appendix propositions expectation and u)."""

import chex
import evidential_reference as ref
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from gedl_jax import evidential as ev

EPS = ref.F32_EPS
KS = (2, 10, 100)
N = 128


@jax.jit
def _measures(alpha):
    return dict(mi=ev.mutual_information(alpha), expected=ev.expected_entropy(alpha),
                predictive=ev.predictive_entropy(alpha),
                differential=ev.differential_entropy(alpha), variance=ev.variance_sum(alpha),
                max_p=ev.max_probability(alpha))


def _alpha(k, seed, high=1e6):
    """Log-uniform alphas in [1e-4, high] with rows of every kind: one dominant class, all large."""
    rng = np.random.default_rng(seed)
    alpha = ref.log_uniform(rng, (N, k), 1e-4, high)
    alpha[:8] = ref.log_uniform(rng, (8, k), 1e-4, 1e-2)
    alpha[:8, 0] = ref.log_uniform(rng, (8,), 1e3, high)
    alpha[8:16] = ref.log_uniform(rng, (8, k), high / 10, high)
    return alpha


@pytest.mark.parametrize("k", KS)
def test_measures_match_closed_forms(k):
    """Concentrations up to 1e4 (S <= 1e6, where the textbook float64 MI = H(p) - E[H] is still
    good to ~1e-16 / 1e-6 relative). Tolerances: rtol 2e-6 (short sums of terms exact to a few
    ulps; measured <= 1e-6) + atol: 1e-15 for the MI reference's own cancellation, and for the
    differential entropy 8 eps times its terms' size K (1 + |log S|) (it crosses zero)."""
    alpha = _alpha(k, seed=k, high=1e4)
    got = _measures(alpha)
    s = ref.f64(alpha).sum(-1)
    ref.assert_close(got["predictive"], ref.predictive_entropy(alpha), rtol=2e-6, atol=1e-30,
                     what="predictive entropy")
    ref.assert_close(got["expected"], ref.expected_entropy(alpha), rtol=2e-6, atol=1e-15,
                     what="expected entropy")
    ref.assert_close(got["mi"], ref.mutual_information(alpha), rtol=2e-6, atol=1e-15,
                     what="mutual information")
    ref.assert_close(got["differential"], ref.differential_entropy(alpha), rtol=2e-6,
                     atol=8 * EPS * k * (1 + np.abs(np.log(s))), what="differential entropy")
    ref.assert_close(got["variance"], ref.variance_sum(alpha), rtol=2e-6, atol=1e-30,
                     what="variance sum")
    ref.assert_close(got["max_p"], ref.f64(alpha).max(-1) / s, rtol=2 * EPS, atol=0,
                     what="max probability")


def test_differential_entropy_matches_scipy_dirichlet():
    rng = np.random.default_rng(11)
    alpha = ref.log_uniform(rng, (N, 10), 1e-2, 1e3)
    want = np.array([scipy.stats.dirichlet(row).entropy() for row in ref.f64(alpha)])
    ref.assert_close(_measures(alpha)["differential"], want, rtol=2e-6,
                     atol=8 * EPS * 10 * (1 + np.abs(np.log(ref.f64(alpha).sum(-1)))))


@pytest.mark.parametrize("k", [2, 10])
def test_expected_entropy_matches_monte_carlo(k):
    """E[-sum_k pi_k log pi_k] from 20000 Dirichlet samples (concentrations 0.5 .. 20); 5 SE."""
    rng = np.random.default_rng(60 + k)
    alpha = ref.log_uniform(rng, (6, k), 0.5, 20.0)
    pi = ref.dirichlet_samples(rng, alpha, 20000)
    mean, se = ref.mc_mean(-np.sum(pi * np.log(pi), -1))
    got = _measures(np.resize(alpha, (N, k)))["expected"][:6]
    ref.assert_close(got, mean, rtol=0.0, atol=5 * se, what="E[H(pi)] vs MC")
    var_mean = np.sum(pi.var(-2, ddof=1), -1)          # sum_k Var[pi_k], sample estimate
    ref.assert_close(_measures(np.resize(alpha, (N, k)))["variance"][:6], var_mean, rtol=0.05,
                     atol=0.0, what="variance sum vs MC")


def _fixed_mean_rows(k, seed, concentration):
    """alpha = S p for S = 1e2 .. 1e8 (13 values) at one fixed p, padded to N rows."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(k, concentration))
    p = np.maximum(p, 0.2 / k)
    p /= p.sum()
    alpha = (np.logspace(2, 8, 13)[:, None] * p[None, :]).astype(np.float32)
    s = ref.f64(alpha).sum(-1)
    return np.resize(alpha, (N, k)), s, ref.f64(alpha) / s[:, None]


@pytest.mark.parametrize("k", KS)
def test_mutual_information_asymptotics_at_large_strength(k):
    """Eq. dist_MI: MI = (K - 1)/(2S) + O(S^-2), for S = 1e2 .. 1e8 at fixed p. The next order is
    -(sum_k 1/p_k - 1)/(12 S^2) (from psi(x + 1) = log x + 1/(2x) - 1/(12 x^2) + ...), so
    MI 2S/(K - 1) = 1 - (sum 1/p_k - 1)/(6 S (K - 1)) + O(S^-3): checked to 2e-6 + 10 O(S^-2).
    The float32 difference H(p) - E[H], even of two accurate entropies, is off by > 1e-3 (relative)
    at S >= 3e6 and is shown to fail."""
    alpha, s, p64 = _fixed_mean_rows(k, 70 + k, 5.0)
    got = _measures(alpha)
    second = (np.sum(1.0 / p64, -1) - 1.0) / (6.0 * s * (k - 1))
    ratio = np.asarray(got["mi"], np.float64)[:13] * 2 * s / (k - 1)
    ref.assert_close(ratio, 1.0 - second, rtol=0.0,
                     atol=2e-6 + 10 * (np.sum(1 / p64, -1) / s) ** 2, what="MI 2S/(K-1)")
    assert np.all(np.abs(ratio - 1.0) <= 2 * second + 2e-6)           # -> 1 as S grows
    textbook = np.asarray(got["predictive"] - got["expected"], np.float64)[:13]
    assert np.max(np.abs(textbook[-4:] * 2 * s[-4:] / (k - 1) - 1.0)) > 1e-3


@pytest.mark.parametrize("k", KS)
def test_mutual_information_asymptote_is_the_leading_term(k):
    """(K - 1)/(2S) against the float64 closed form of S, and as MI's limit: S (MI - asymptote)
    -> 0 like 1/S (the O(S^-2) remainder of Eq. dist_MI), for S = 1e2 .. 1e8."""
    alpha, s, _ = _fixed_mean_rows(k, 90 + k, 3.0)
    got = np.asarray(ev.mutual_information_asymptote(alpha), np.float64)[:13]
    np.testing.assert_allclose(got, (k - 1) / (2 * s), rtol=4 * EPS)
    mi = ref.mutual_information(alpha)[:13]
    scaled_gap = s * np.abs(mi - (k - 1) / (2 * s))
    assert np.all(scaled_gap[1:] <= scaled_gap[:-1] * 1.0001)         # shrinks as S grows
    assert scaled_gap[-1] < 1e-4 * scaled_gap[0]


@pytest.mark.parametrize("k", KS)
def test_variance_sum_asymptotics(k):
    """Eq. dist_var_sum: sum_k Var[pi_k] (S + 1) = sum_k p_k (1 - p_k) exactly, so variance
    sum * S = O(1), for S up to 1e8."""
    alpha, s, p64 = _fixed_mean_rows(k, 80 + k, 2.0)
    got = np.asarray(_measures(alpha)["variance"], np.float64)[:13]
    np.testing.assert_allclose(got * (s + 1), np.sum(p64 * (1 - p64), -1), rtol=4e-6)
    assert np.all(got * s <= 1.0)


@pytest.mark.parametrize("k", KS)
def test_entropy_decomposition_and_bounds(k):
    """H(p) = MI + E[H], 0 <= MI <= H(p) <= log K, E[H] >= 0, 1/K <= max p <= 1."""
    got = {name: np.asarray(v, np.float64) for name, v in _measures(_alpha(k, seed=90 + k)).items()}
    np.testing.assert_allclose(got["mi"] + got["expected"], got["predictive"], rtol=4e-6,
                               atol=1e-12)
    assert np.all(got["mi"] >= 0) and np.all(got["expected"] >= 0)
    assert np.all(got["mi"] <= got["predictive"] * (1 + 4e-6))
    assert np.all(got["predictive"] <= np.log(k) * (1 + 2 * EPS))
    assert np.all(got["max_p"] >= 1 / k * (1 - 2 * EPS)) and np.all(got["max_p"] <= 1)


@jax.jit
def _measure_gradients(alpha):
    return {name: jax.grad(lambda a, f=f: jnp.sum(f(a)))(alpha) for name, f in dict(
        mi=ev.mutual_information, expected=ev.expected_entropy,
        predictive=ev.predictive_entropy, differential=ev.differential_entropy,
        variance=ev.variance_sum).items()}


def test_gradients_match_complex_step_derivatives():
    """d/d alpha of each measure against complex-step derivatives of the float64 closed forms
    (exact even where H(p) - E[H] cancels), concentrations up to 1e5 with dominant-class rows.
    Tolerance 1e-5 of the row's largest entry (measured <= 3.2e-6, for the MI at S ~ 1e6)."""
    alpha = _alpha(10, seed=12, high=1e5)
    got = _measure_gradients(alpha)
    for name, fn in dict(mi=ref.mutual_information, expected=ref.expected_entropy,
                         predictive=ref.predictive_entropy, differential=ref.differential_entropy,
                         variance=ref.variance_sum).items():
        want = ref.complex_step_gradient(fn, alpha)
        ref.assert_close(got[name], want, rtol=0.0,
                         atol=1e-5 * np.max(np.abs(want), -1, keepdims=True), what=name)


@pytest.mark.parametrize("k", KS)
def test_finite_values_and_gradients_at_extremes(k):
    values = np.array([1e-4, 1.0, 1e6], np.float32)
    alpha = np.stack([np.full(k, v, np.float32) for v in values]
                     + [np.where(np.arange(k) == 0, hi, lo).astype(np.float32)
                        for hi in values for lo in values])
    alpha = np.resize(alpha, (N, k))
    got = _measures(alpha)
    assert all(np.all(np.isfinite(np.asarray(v))) for v in got.values())
    grads = _measure_gradients(alpha)
    assert all(np.all(np.isfinite(np.asarray(g))) for g in grads.values())


def test_total_evidence_and_u_ranking_under_adaptive_prior():
    """The GEDL scores: u = W/S decreases with E while S does not (K = 10, C_w = 0.5)."""
    e = np.zeros((3, 10), np.float32)
    e[:, 2] = [0.0, 1.0, 10.0]
    np.testing.assert_array_equal(np.asarray(ev.total_evidence(e)), [0.0, 1.0, 10.0])
    w = ev.adaptive_prior_strength(e, 0.5)
    alpha = ev.dirichlet_alpha(e, w, ev.uniform_base_rate(10))
    u = np.asarray(ev.uncertainty_mass(alpha, w))
    assert u[0] > u[1] > u[2]


class UncertaintyJitTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_with_and_without_jit(self):
        alpha = _alpha(10, seed=5)
        fn = self.variant(lambda a: dict(
            mi=ev.mutual_information(a), expected=ev.expected_entropy(a),
            predictive=ev.predictive_entropy(a), differential=ev.differential_entropy(a),
            variance=ev.variance_sum(a), max_p=ev.max_probability(a)))
        out, jitted = fn(alpha), _measures(alpha)
        for name in jitted:
            chex.assert_trees_all_close(out[name], jitted[name], rtol=4 * EPS, atol=1e-30)

    def test_no_retrace_and_leading_dims(self):
        @jax.jit
        @chex.assert_max_traces(n=1)
        def mi(a):
            return ev.mutual_information(a)

        alpha = _alpha(10, seed=6)
        out = mi(alpha.reshape(4, 32, 10))
        mi(alpha[::-1].reshape(4, 32, 10))
        self.assertEqual(out.shape, (4, 32))
        chex.assert_trees_all_close(out.reshape(N), _measures(alpha)["mi"], rtol=4 * EPS)
