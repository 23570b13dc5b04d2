"""Prior strength, base rate, alpha = e + W a and the subjective opinion (paper Eqs. e2alpha,
compute_opinion, opinion2prob, weight_update; W = K for EDL and I-EDL, W = lambda K for R-EDL)."""

import chex
import evidential_reference as ref
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gedl_jax import evidential as ev

EPS = ref.F32_EPS


def _evidence(shape, seed=0):
    rng = np.random.default_rng(seed)
    e = ref.log_uniform(rng, shape, 1e-4, 1e4)
    e[..., 0] = 0.0                      # a zero-evidence class
    return e


def test_uniform_base_rate():
    a = ev.uniform_base_rate(10)
    assert a.shape == (10,) and a.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(a), 0.1, rtol=EPS)
    assert float(jnp.sum(a)) == pytest.approx(1.0, abs=4 * EPS)
    with pytest.raises(ValueError):
        ev.uniform_base_rate(0)


def test_base_rate_from_counts():
    counts = np.array([5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949])
    a = ev.base_rate_from_counts(counts)
    np.testing.assert_allclose(np.asarray(a, np.float64), counts / counts.sum(), rtol=4 * EPS)
    assert a.dtype == jnp.float32
    # Traced counts are accepted (no validation possible there).
    np.testing.assert_allclose(np.asarray(jax.jit(ev.base_rate_from_counts)(counts)),
                               np.asarray(a), rtol=EPS)
    for bad in ([1, 0, 2], [1.0, -1.0, 3.0], [1.0, np.nan], [], [[1, 2]]):
        with pytest.raises(ValueError):
            ev.base_rate_from_counts(np.asarray(bad))


def test_adaptive_prior_strength_endpoints_and_monotonicity():
    k, c_w = 10, 0.5
    total = np.concatenate([[0.0], np.logspace(-6, 30, 300)]).astype(np.float32)
    evidence = np.zeros((total.size, k), np.float32)
    evidence[:, 3] = total
    w = np.asarray(ev.adaptive_prior_strength(evidence, c_w), np.float64)
    want = (k + c_w * k * total.astype(np.float64)) / (1.0 + k * total.astype(np.float64))
    np.testing.assert_allclose(w, want, rtol=4 * EPS)           # Eq. weight_update
    assert w[0] == k                                            # W(E = 0) = K exactly
    assert w[-1] == pytest.approx(c_w, rel=EPS)                 # W -> C_w (E = 1e30: no inf/inf)
    assert np.all(np.diff(w) <= 0)                              # monotone for C_w < K
    # C_w > K makes W increase towards C_w instead.
    w_up = np.asarray(ev.adaptive_prior_strength(evidence, 30.0))
    assert w_up[0] == k and np.all(np.diff(w_up) >= 0) and w_up[-1] == pytest.approx(30.0)


def test_adaptive_prior_table_from_variants_9_3():
    """K = 10, C_w = 0.5: E = 0, 1, 10 -> S = 10, 2.36, 10.59 and u = 1, 0.577, 0.056."""
    k, c_w = 10, 0.5
    evidence = np.zeros((3, k), np.float32)
    evidence[:, 0] = [0.0, 1.0, 10.0]
    w = ev.adaptive_prior_strength(evidence, c_w)
    alpha = ev.dirichlet_alpha(evidence, w, ev.uniform_base_rate(k))
    s = np.asarray(ev.dirichlet_strength(alpha), np.float64)
    u = np.asarray(ev.uncertainty_mass(alpha, w), np.float64)
    e = np.array([0.0, 1.0, 10.0])
    w64 = (k + c_w * k * e) / (1 + k * e)
    np.testing.assert_allclose(s, e + w64, rtol=4 * EPS)
    np.testing.assert_allclose(u, w64 / (e + w64), rtol=4 * EPS)
    np.testing.assert_allclose(s, [10.0, 2.36, 10.59], atol=5e-3)   # the table's rounding
    np.testing.assert_allclose(u, [1.0, 0.577, 0.056], atol=5e-4)
    assert s[1] < s[0] < s[2]          # S is not monotone in E ...
    assert u[0] > u[1] > u[2]          # ... but u = W / S is


@pytest.mark.parametrize("strength_fn", ["adaptive", "fixed"])
def test_prior_strength_has_zero_gradient(strength_fn):
    e = jnp.asarray(_evidence((4, 10)))

    def total_w(evidence):
        if strength_fn == "adaptive":
            return jnp.sum(ev.adaptive_prior_strength(evidence, 0.5))
        return jnp.sum(ev.fixed_prior_strength(evidence, 10.0))

    grad = jax.grad(total_w)(e)
    np.testing.assert_array_equal(np.asarray(grad), 0.0)
    # ... while alpha = e + W a still has d alpha_k / d e_j = delta_kj (W is stop-gradient).
    def alpha_of(x):
        w = ev.adaptive_prior_strength(x[None], 0.5)
        return ev.dirichlet_alpha(x[None], w, ev.uniform_base_rate(10))[0]

    jac = jax.jacobian(alpha_of)(e[1])
    np.testing.assert_array_equal(np.asarray(jac), np.eye(10))


def test_fixed_prior_strength_broadcasts():
    e = _evidence((2, 3, 7))
    w = ev.fixed_prior_strength(e, 3.5)
    assert w.shape == (2, 3) and w.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(w), 3.5)


def test_edl_reduction_alpha_is_evidence_plus_one():
    """Variant reduction (1): W = K with the uniform base rate gives alpha = e + 1 exactly."""
    for k in (2, 10, 100):
        e = _evidence((64, k), seed=k)
        w = ev.fixed_prior_strength(e, float(k))
        alpha = ev.dirichlet_alpha(e, w, ev.uniform_base_rate(k))
        want = (e.astype(np.float64) + 1.0).astype(np.float32)   # the float32 sum e + 1
        np.testing.assert_array_equal(np.asarray(alpha), want)


@pytest.mark.parametrize("lam", [0.1, 0.8, 1.0])
def test_redl_reduction_lambda_maps_to_w_lambda_k(lam):
    """Variant reduction (2): R-EDL's alpha = e + lambda is W = lambda K (uniform base rate)."""
    k = 10
    e = _evidence((64, k), seed=3)
    alpha = ev.dirichlet_alpha(e, ev.fixed_prior_strength(e, lam * k), ev.uniform_base_rate(k))
    np.testing.assert_allclose(np.asarray(alpha, np.float64), e.astype(np.float64) + lam,
                               rtol=2 * EPS, atol=2 * EPS * lam)


def test_opinion_identities():
    """b = e/S, u = W/S; sum b + u = 1 and b + u a = alpha / S (Eqs. compute_opinion, opinion2prob),
    for a non-uniform base rate and the adaptive W."""
    k = 10
    e = _evidence((128, k), seed=1)
    a = ev.base_rate_from_counts(np.arange(1, k + 1))
    w = ev.adaptive_prior_strength(e, 0.5)
    op = ev.subjective_opinion(e, w, a)
    assert isinstance(op, ev.Opinion)
    assert op.belief_BxK.shape == (128, k) and op.uncertainty_B.shape == (128,)
    e64 = e.astype(np.float64)
    w64 = np.asarray(w, np.float64)
    s64 = e64.sum(-1) + w64
    np.testing.assert_allclose(np.asarray(op.belief_BxK, np.float64), e64 / s64[:, None],
                               rtol=8 * EPS, atol=1e-30)
    np.testing.assert_allclose(np.asarray(op.uncertainty_B, np.float64), w64 / s64, rtol=8 * EPS)
    total = np.asarray(jnp.sum(op.belief_BxK, -1) + op.uncertainty_B, np.float64)
    np.testing.assert_allclose(total, 1.0, atol=k * 2 * EPS)
    alpha = ev.dirichlet_alpha(e, w, a)
    p = ev.projected_probability(alpha)
    np.testing.assert_allclose(np.asarray(op.belief_BxK)
                               + np.asarray(op.uncertainty_B)[:, None] * np.asarray(a),
                               np.asarray(p), rtol=8 * EPS, atol=8 * EPS)
    np.testing.assert_allclose(np.asarray(jnp.sum(p, -1)), 1.0, atol=k * 2 * EPS)
    np.testing.assert_allclose(np.asarray(ev.uncertainty_mass(alpha, w)),
                               np.asarray(op.uncertainty_B), rtol=4 * EPS)


def test_no_evidence_gives_the_base_rate():
    """b = 0 and u = 1: the prediction collapses to the base rate (paper Sec. 3.1)."""
    a = ev.base_rate_from_counts(np.array([1.0, 2.0, 7.0]))
    e = np.zeros((2, 3), np.float32)
    for w in (ev.adaptive_prior_strength(e, 0.5), ev.fixed_prior_strength(e, 2.0)):
        alpha = ev.dirichlet_alpha(e, w, a)
        np.testing.assert_allclose(np.asarray(ev.projected_probability(alpha)),
                                   np.broadcast_to(np.asarray(a), (2, 3)), rtol=4 * EPS)
        np.testing.assert_allclose(np.asarray(ev.uncertainty_mass(alpha, w)), 1.0, rtol=4 * EPS)


def test_leading_batch_shapes_and_vmap():
    e = _evidence((3, 5, 10), seed=2)
    a = ev.uniform_base_rate(10)
    w = ev.adaptive_prior_strength(e, 0.5)
    alpha = ev.dirichlet_alpha(e, w, a)
    assert w.shape == (3, 5) and alpha.shape == (3, 5, 10)
    vmapped = jax.vmap(lambda x: ev.dirichlet_alpha(x, ev.adaptive_prior_strength(x, 0.5), a))(e)
    np.testing.assert_array_equal(np.asarray(vmapped), np.asarray(alpha))
    jitted = jax.jit(lambda x: ev.dirichlet_alpha(x, ev.adaptive_prior_strength(x, 0.5), a))(e)
    np.testing.assert_allclose(np.asarray(jitted), np.asarray(alpha), rtol=2 * EPS)


class PriorChexTest(chex.TestCase):
    """evidence -> W -> alpha -> (p, u, opinion) under jit and without, against float64 NumPy,
    with the shapes and dtypes of every output; one trace for any C_w and base rate."""

    @chex.variants(with_jit=True, without_jit=True)
    def test_prior_pipeline_matches_float64(self):
        e = _evidence((4, 6, 10), seed=3).astype(np.float32)
        counts = np.arange(1, 11, dtype=np.float32)

        @self.variant
        def pipeline(e, counts, c_w):
            a = ev.base_rate_from_counts(counts)
            w = ev.adaptive_prior_strength(e, c_w)
            alpha = ev.dirichlet_alpha(e, w, a)
            return (w, alpha, ev.projected_probability(alpha), ev.uncertainty_mass(alpha, w),
                    ev.subjective_opinion(e, w, a))

        w, alpha, p, u, opinion = pipeline(e, counts, jnp.float32(0.5))
        chex.assert_shape([w, u, opinion.uncertainty_B], (4, 6))
        chex.assert_shape([alpha, p, opinion.belief_BxK], (4, 6, 10))
        chex.assert_type([w, alpha, p, u, *opinion], jnp.float32)
        chex.assert_tree_all_finite((w, alpha, p, u, opinion))
        e64, a64 = e.astype(np.float64), counts.astype(np.float64) / counts.sum()
        total = e64.sum(-1)
        w64 = (10 + 0.5 * 10 * total) / (1 + 10 * total)            # Eq. weight_update
        alpha64 = e64 + w64[..., None] * a64                          # Eq. e2alpha
        s64 = alpha64.sum(-1)
        for got, want in [(w, w64), (alpha, alpha64), (p, alpha64 / s64[..., None]),
                          (u, w64 / s64), (opinion.belief_BxK, e64 / s64[..., None]),
                          (opinion.uncertainty_B, w64 / s64)]:
            np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=8 * EPS,
                                       atol=1e-30)

    def test_one_trace_for_any_c_w_and_base_rate(self):
        @jax.jit
        @chex.assert_max_traces(n=1)
        def alpha_fn(e, c_w, a):
            return ev.dirichlet_alpha(e, ev.adaptive_prior_strength(e, c_w), a)

        e = jnp.asarray(_evidence((8, 10)), jnp.float32)
        for c_w, counts in [(0.5, np.ones(10)), (2.0, np.arange(1.0, 11.0)), (10.0, np.ones(10))]:
            alpha = alpha_fn(e, jnp.float32(c_w), ev.base_rate_from_counts(counts))
            chex.assert_shape(alpha, (8, 10))
            # The class without evidence holds the prior W a_0, with this call's C_w and a.
            total = np.asarray(e, np.float64).sum(-1)
            w64 = (10 + c_w * 10 * total) / (1 + 10 * total)
            np.testing.assert_allclose(np.asarray(alpha[:, 0]), w64 * counts[0] / counts.sum(),
                                       rtol=8 * EPS)
