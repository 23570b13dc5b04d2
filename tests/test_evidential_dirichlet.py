"""Dirichlet KL and the Fisher log-determinant against float64 references (closed form, path
integral, Monte Carlo, explicit slogdet), with float32-stability, gradient and jit checks.

Every jitted call uses N = 128 rows (inputs are padded), so each function compiles once per K.
"""

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


def _padded(fn):
    """Calls the jitted fn on inputs padded (by repetition) to N rows; returns the real rows."""
    def call(*arrays):
        n = arrays[0].shape[0]
        assert n <= N
        out = fn(*(np.resize(x, (N,) + x.shape[1:]) for x in arrays))
        return jax.tree.map(lambda o: np.asarray(o)[:n], out)
    return call


_kl = _padded(jax.jit(ev.dirichlet_kl))
_logdet = _padded(jax.jit(ev.fisher_logdet))
_kl_grads = _padded(jax.jit(jax.grad(lambda a, b: jnp.sum(ev.dirichlet_kl(a, b)), argnums=(0, 1))))
_logdet_grad = _padded(jax.jit(jax.grad(lambda a: jnp.sum(ev.fisher_logdet(a)))))


@_padded
@jax.jit
def _naive_kl32(a, b):
    """The textbook closed form in float32, to show what the tolerances below rule out."""
    a0, b0 = jnp.sum(a, -1), jnp.sum(b, -1)
    return (jsp.gammaln(a0) - jsp.gammaln(b0) + jnp.sum(jsp.gammaln(b) - jsp.gammaln(a), -1)
            + jnp.sum((a - b) * (jsp.digamma(a) - jsp.digamma(a0)[..., None]), -1))


def _kl_atol(k, a, b):
    # Absolute floor: below concentration ~3 the Stirling remainders and logs (values up to ~10)
    # are rounded per class pair, ~1e-6 each, plus the float64 reference's own rounding
    # (1e-16 times the size of its terms, which reach S log S ~ 2e9).
    return 2e-6 * (k + 1) + 1e-15 * ref.kl_rounding_scale(a, b)


def _second_order_size(a, b):
    """M2 = (sum_k d_k^2 psi1(a_k) + d_S^2 psi1(A)) / 2, d = b - a (the pieces of d^T I d / 2)."""
    a, d = ref.f64(a), ref.f64(b) - ref.f64(a)
    return 0.5 * (np.sum(d * d * special.polygamma(1, a), -1)
                  + np.sum(d, -1) ** 2 * special.polygamma(1, a.sum(-1)))


# ---------------------------------------------------------------------- special-function kit


def test_special_function_remainders_match_scipy():
    """The Stirling remainders behind every rewrite (`evidential.special`), on x in [1e-4, 1e3]
    (log-spaced, float32 inputs), against float64 SciPy; rtol from their float32 error envelopes
    (measured: r 6e-6 near x ~ 2 where it is a difference of O(1) logs, s 2e-6, the others
    <= 5e-7)."""
    from gedl_jax.evidential import special as d

    x32 = np.logspace(-4, 3, 2000).astype(np.float32)
    x = ref.f64(x32)
    half_log_2pi = 0.5 * np.log(2 * np.pi)
    cases = [
        (d.lgamma_remainder, special.gammaln(x) - ((x - 0.5) * np.log(x) - x + half_log_2pi),
         1.5e-5),
        (d.digamma_minus_log, special.digamma(x) - np.log(x), 1e-6),
        (d.digamma1p_minus_log, special.digamma(x + 1) - np.log(x), 1e-6),
        (d.scaled_trigamma_minus_one, x * special.polygamma(1, x) - 1, 5e-7),
        (lambda t: d.trigamma_parts(t)[1], x * (x * special.polygamma(1, x) - 1) - 0.5, 5e-6),
        (d.reciprocal_minus_trigamma1p, 1 / x - special.polygamma(1, x + 1), 1e-6),
        (d.trigamma, special.polygamma(1, x), 5e-7),
    ]
    for fn, want, rtol in cases:
        ref.assert_close(jax.jit(fn)(x32), want, rtol=rtol, atol=0.0, what=str(fn))


# ------------------------------------------------------------------------------------- KL


@pytest.mark.parametrize("k", KS)
def test_kl_matches_closed_form_on_log_uniform_inputs(k):
    """Independent alpha, beta log-uniform in [1e-4, 1e6], plus the training regimes (a large
    prediction against GEDL's small prior W/K, and against EDL's Dir(1)). Tolerance: rtol 5e-6
    (~40 ulps: the result sums O(K) terms of a few ulps each; measured <= 1.8e-6) + the floor of
    `_kl_atol`."""
    rng = np.random.default_rng(10 + k)
    a = np.concatenate([ref.log_uniform(rng, (64, k)), ref.log_uniform(rng, (64, k), 1e-2, 1e6)])
    for b in (ref.log_uniform(rng, (N, k)), np.full_like(a, 0.5 / k), np.ones_like(a)):
        ref.assert_close(_kl(a, b), ref.kl(a, b), rtol=5e-6, atol=_kl_atol(k, a, b), what="KL")


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("regime", ["near", "very_near", "scaled"])
def test_kl_small_divergences_against_path_integral(k, regime):
    """beta close to alpha (concentrations 1e-4 .. 1e6), where the closed form cancels to its last
    digits even in float64; the reference is the cancellation-free path integral.

    Tolerance: 4e-6 relative + 32 eps M2 (`_second_order_size`): M2 is the size of the two
    second-order pieces whose difference is the KL (~ d^T I d / 2). Rounding the first-order ratios
    (b_k / a_k etc.) costs a few ulps of M2, so no float32 evaluation can do much better when the
    pieces cancel (d nearly proportional to a); observed <= 13 eps M2. At K = 100 the naive
    float32 closed form is shown to fail the same tolerance.
    """
    rng = np.random.default_rng(100 + k + len(regime))
    a = ref.log_uniform(rng, (N, k))
    if regime == "near":
        b = a * (1.0 + 1e-2 * rng.standard_normal(a.shape))
    elif regime == "very_near":
        b = a * (1.0 + 1e-5 * rng.standard_normal(a.shape))
    else:
        b = a * rng.uniform(0.5, 2.0, size=(N, 1))
    b = b.astype(np.float32)
    want = ref.kl_path_integral(a, b)
    atol = 32 * EPS * _second_order_size(a, b)
    ref.assert_close(_kl(a, b), want, rtol=4e-6, atol=atol, what=f"KL {regime}")
    if k == 100:
        with pytest.raises(AssertionError):
            ref.assert_close(_naive_kl32(a, b), want, rtol=4e-6, atol=atol)


@pytest.mark.parametrize("k", [2, 10])
def test_kl_matches_monte_carlo(k):
    """E_{pi ~ Dir(a)}[log Dir(pi|a) - log Dir(pi|b)] from 20000 numpy samples per example, at
    moderate concentrations (0.5 .. 20, where sampling is well behaved). Tolerance: 5 standard
    errors of the MC mean (+1e-6)."""
    rng = np.random.default_rng(7 + k)
    a = ref.log_uniform(rng, (6, k), 0.5, 20.0)
    b = ref.log_uniform(rng, (6, k), 0.5, 20.0)
    pi = ref.dirichlet_samples(rng, a, 20000)
    mean, se = ref.mc_mean(ref.log_dirichlet_pdf(pi, a) - ref.log_dirichlet_pdf(pi, b))
    ref.assert_close(_kl(a, b), mean, rtol=0.0, atol=5 * se + 1e-6, what="KL vs MC")


@pytest.mark.parametrize("k", KS)
def test_kl_is_zero_at_equality_and_nonnegative(k):
    rng = np.random.default_rng(20 + k)
    a = ref.log_uniform(rng, (N, k))
    a[0] = 1.0
    # Exactly zero at alpha == beta (every term of the rewrite vanishes identically), including
    # KL(Dir(1) || Dir(1)) (row 0), which the float32 closed form gets as ~ -5e-5 at K = 100.
    np.testing.assert_array_equal(_kl(a, a), 0.0)
    # Non-negative up to a floor growing with K, for unrelated, near and scaled pairs.
    pairs = [ref.log_uniform(rng, (N, k)),
             (a * (1 + 1e-4 * rng.standard_normal(a.shape))).astype(np.float32),
             (a * rng.uniform(0.5, 2.0, (N, 1))).astype(np.float32)]
    for b in pairs:
        assert np.min(_kl(a, b)) >= -1e-6 * (k + 1)


def test_kl_stays_accurate_at_huge_concentrations():
    """S up to 1e8 (K = 100, alpha ~ 1e6): lgamma(S) ~ 1.7e9 has a float32 spacing of 128, so the
    closed form is off by ~1e2; the rewrite keeps relative precision."""
    rng = np.random.default_rng(3)
    a = ref.log_uniform(rng, (N, 100), 1e5, 1e6)
    b = (a * (1 + 1e-2 * rng.standard_normal(a.shape))).astype(np.float32)
    want = ref.kl_path_integral(a, b)            # ~ 50 here
    ref.assert_close(_kl(a, b), want, rtol=1e-5, atol=0.0, what="KL at S ~ 1e8")
    assert np.max(np.abs(_naive_kl32(a, b) - want)) > 1.0


@pytest.mark.parametrize("k", [2, 10])
def test_kl_gradients_match_complex_step_derivatives(k):
    """dKL/dalpha and dKL/dbeta (the custom JVP) against complex-step derivatives of the float64
    closed form, for unrelated and near pairs (concentrations 1e-3 .. 1e5). Tolerance 1e-5 of the
    row's largest gradient entry (float32 rounding of O(1)-conditioned sums; measured ~1e-6)."""
    rng = np.random.default_rng(4 + k)
    a = ref.log_uniform(rng, (N, k), 1e-3, 1e5)
    b = ref.log_uniform(rng, (N, k), 1e-3, 1e5)
    b[:48] = (a[:48] * (1 + 1e-2 * rng.standard_normal((48, k)))).astype(np.float32)
    ga, gb = _kl_grads(a, b)
    want_a = ref.complex_step_gradient(lambda x: ref.kl(x, b), a)
    want_b = ref.complex_step_gradient(lambda x: ref.kl(a, x), b)
    for got, want, what in ((ga, want_a, "dKL/dalpha"), (gb, want_b, "dKL/dbeta")):
        row_scale = np.max(np.abs(want), -1, keepdims=True)
        ref.assert_close(got, want, rtol=0.0, atol=1e-5 * row_scale, what=what)


@pytest.mark.parametrize("k", KS)
def test_kl_finite_values_and_gradients_at_extremes(k):
    values = np.array([1e-4, 1.0, 1e6], np.float32)
    grid = np.stack(np.meshgrid(values, values, values, indexing="ij"), -1).reshape(-1, 3)
    a = np.repeat(grid[:, :1], k, axis=1)
    a[:, -1] = grid[:, 1]
    b = np.repeat(grid[:, 2:], k, axis=1)
    ga, gb = _kl_grads(a, b)
    assert np.all(np.isfinite(ga)) and np.all(np.isfinite(gb))
    ref.assert_close(_kl(a, b), ref.kl(a, b), rtol=1e-5, atol=_kl_atol(k, a, b),
                     what="KL at extremes")


# ------------------------------------------------------------------------- Fisher log-det


def _logdet_atol(a):
    # -log det sums K values log psi1(alpha_k) of size up to ~20, each correct to an ulp or two
    # (measured <= 1.8 eps times this sum).
    return 4 * EPS * np.sum(np.abs(np.log(ref.f64(a))) + 1.0, -1)


@pytest.mark.parametrize("k", KS)
def test_fisher_logdet_matches_explicit_slogdet(k):
    """Against numpy.linalg.slogdet of the explicit K x K matrix diag(psi1) - psi1(S) 11^T, for
    concentrations in [1e-2, 1e3] (where that matrix is well enough conditioned in float64)."""
    rng = np.random.default_rng(30 + k)
    a = ref.log_uniform(rng, (N, k), 1e-2, 1e3)
    ref.assert_close(_logdet(a), ref.fisher_neg_logdet_explicit(a), rtol=1e-6,
                     atol=_logdet_atol(a), what="-logdet vs slogdet")


@pytest.mark.parametrize("k", KS)
def test_fisher_logdet_matches_determinant_lemma_on_full_range(k):
    """Concentrations log-uniform in [1e-4, 1e6], and one dominant class with tiny others (where
    1 - x is ~ 1e-4 .. 1e-10), against the determinant lemma in float64 (1 - x >= 1e-10 keeps
    >= 6 digits there). Tolerance: rtol 1e-6 + `_logdet_atol` + 1e-5 (log of a ~1e-10 factor
    known to ~1e-5 relative)."""
    rng = np.random.default_rng(40 + k)
    dominant = ref.log_uniform(rng, (64, k), 1e-4, 1e-3)
    dominant[:, 0] = ref.log_uniform(rng, (64,), 1.0, 1e6)
    a = np.concatenate([ref.log_uniform(rng, (64, k)), dominant])
    ref.assert_close(_logdet(a), ref.fisher_neg_logdet_lemma(a), rtol=1e-6,
                     atol=_logdet_atol(a) + 1e-5, what="-logdet vs lemma")


def test_fisher_logdet_at_large_concentrations():
    """All alpha = c for c up to 1e6 and K = 100 (S = 1e8): 1 - x ~ (K - 1) / (2S) ~ 5e-7 is at the
    float32 rounding level, so log1p(-x) is wrong by O(1); the rewrite stays within float32
    precision."""
    c = np.array([1e2, 1e3, 1e4, 1e5, 1e6], np.float32)
    a = np.repeat(c[:, None], 100, axis=1)
    want = ref.fisher_neg_logdet_lemma(a)
    ref.assert_close(_logdet(a), want, rtol=1e-6, atol=_logdet_atol(a), what="-logdet large S")
    # Leading order: -log det ~ K log c - log((K - 1) / (2 K c)) + O(1/c).
    lead = 100 * np.log(ref.f64(c)) - np.log(99.0 / (2 * 100 * ref.f64(c)))
    np.testing.assert_allclose(want, lead, rtol=2e-2)
    t = jsp.polygamma(1, jnp.asarray(a))
    naive = -(jnp.sum(jnp.log(t), -1) + jnp.log1p(-jsp.polygamma(1, jnp.sum(jnp.asarray(a), -1))
                                                 * jnp.sum(1 / t, -1)))
    if jax.default_backend() == "cpu":   # XLA:CPU's float32 polygamma; a GPU's is more exact
        assert np.max(np.abs(np.asarray(naive, np.float64) - want)) > 0.5   # ours: < 2e-3


def test_fisher_logdet_gradient_matches_finite_differences():
    """Against central differences of the float64 lemma (relative step 1e-6) at concentrations
    0.05 .. 1e4; tolerance rtol 1e-4 + atol 1e-4."""
    rng = np.random.default_rng(5)
    a = ref.log_uniform(rng, (N, 10), 0.05, 1e4)
    grad = _logdet_grad(a)
    a64 = ref.f64(a)
    fd = np.zeros_like(a64)
    for j in range(10):
        step = np.zeros_like(a64)
        step[:, j] = 1e-6 * a64[:, j]
        fd[:, j] = (ref.fisher_neg_logdet_lemma(a64 + step)
                    - ref.fisher_neg_logdet_lemma(a64 - step)) / (2 * step[:, j])
    ref.assert_close(grad, fd, rtol=1e-4, atol=1e-4, what="d(-logdet)/dalpha")


@pytest.mark.parametrize("k", KS)
def test_fisher_logdet_finite_values_and_gradients_at_extremes(k):
    values = np.array([1e-4, 1.0, 1e6], np.float32)
    a = np.stack([np.full(k, v, np.float32) for v in values]
                 + [np.where(np.arange(k) == 0, hi, lo).astype(np.float32)
                    for hi in values for lo in values])
    out = _logdet(a)
    assert np.all(np.isfinite(out)) and np.all(np.isfinite(_logdet_grad(a)))
    ref.assert_close(out, ref.fisher_neg_logdet_lemma(a), rtol=1e-6,
                     atol=_logdet_atol(a) + 1e-5, what="-logdet at extremes")


# ------------------------------------------------------------------------------ jit / traces


class JitTest(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    def test_kl_and_logdet_with_and_without_jit(self):
        rng = np.random.default_rng(6)
        a, b = ref.log_uniform(rng, (N, 10)), ref.log_uniform(rng, (N, 10))
        kl = self.variant(ev.dirichlet_kl)(a, b)
        logdet = self.variant(ev.fisher_logdet)(a)
        ref.assert_close(kl, ref.kl(a, b), rtol=1e-5, atol=_kl_atol(10, a, b))
        ref.assert_close(logdet, ref.fisher_neg_logdet_lemma(a), rtol=1e-6,
                         atol=_logdet_atol(a) + 1e-5)
        ref.assert_close(kl, _kl(a, b), rtol=4 * EPS, atol=1e-6)
        ref.assert_close(logdet, _logdet(a), rtol=4 * EPS, atol=1e-6)

    def test_no_retrace_for_new_values(self):
        @jax.jit
        @chex.assert_max_traces(n=1)
        def both(a, b):
            return ev.dirichlet_kl(a, b), ev.fisher_logdet(a)

        rng = np.random.default_rng(8)
        for _ in range(3):
            both(ref.log_uniform(rng, (4, 10)), ref.log_uniform(rng, (4, 10)))

    def test_vmap_and_leading_dims(self):
        rng = np.random.default_rng(9)
        a, b = ref.log_uniform(rng, (3, 4, 10)), ref.log_uniform(rng, (3, 4, 10))
        kl = jax.jit(ev.dirichlet_kl)(a, b)
        self.assertEqual(kl.shape, (3, 4))
        chex.assert_trees_all_close(jax.jit(jax.vmap(ev.dirichlet_kl))(a, b), kl, rtol=4 * EPS)
        ref.assert_close(kl, ref.kl(a, b), rtol=1e-5, atol=_kl_atol(10, a, b))
