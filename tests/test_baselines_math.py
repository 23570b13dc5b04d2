"""The baselines' math (gedl_jax.methods) in float64 against independent references: SciPy
closed forms and quadrature, Monte Carlo over numpy's samplers, central finite differences,
`slogdet` of the explicit Jacobian. The references below import nothing from gedl_jax."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, special, stats

from gedl_jax.methods import daedl, duq, fedl, postnet, prior_networks


@pytest.fixture(autouse=True)
def _float64():
    with jax.enable_x64(True), jax.numpy_rank_promotion("raise"):
        yield


def _kl_reference(a, b):
    """KL(Dir(a) || Dir(b)), the textbook closed form in float64."""
    a0, b0 = a.sum(-1), b.sum(-1)
    return (special.gammaln(a0) - special.gammaln(b0)
            + np.sum(special.gammaln(b) - special.gammaln(a)
                     + (a - b) * (special.digamma(a) - special.digamma(a0)[..., None]), -1))


# ------------------------------------------------------------------------------ Prior Networks
def test_prior_network_targets():
    t = np.asarray(prior_networks.in_distribution_target(jnp.array([3, 0]), 10, "pnet", 100.0))
    assert t[0, 3] == 101 and np.all(np.delete(t[0], 3) == 1)
    s = np.asarray(prior_networks.in_distribution_target(jnp.array([3]), 10, "smoothed", 100.0,
                                                         0.01))
    np.testing.assert_allclose(s[0, 3], 91.0) and np.testing.assert_allclose(s.sum(), 100.0)
    np.testing.assert_allclose(np.delete(s[0], 3), 1.0)
    with pytest.raises(ValueError, match="allowed"):
        prior_networks.in_distribution_target(jnp.array([0]), 10, "sharp")


def test_forward_and_reverse_kl_against_the_closed_form_and_quadrature():
    rng = np.random.default_rng(0)
    alpha = 10 ** rng.uniform(-1, 2, (64, 10))
    target = np.asarray(prior_networks.in_distribution_target(rng.integers(0, 10, 64), 10))
    # evidential.dirichlet_kl is built for float32 (Stirling remainders): ~1e-9 relative in x64.
    np.testing.assert_allclose(prior_networks.forward_kl(alpha, target),
                               _kl_reference(target, alpha), rtol=1e-8)
    np.testing.assert_allclose(prior_networks.reverse_kl(alpha, target),
                               _kl_reference(alpha, target), rtol=1e-8)
    np.testing.assert_allclose(prior_networks.forward_kl(alpha, alpha), 0.0, atol=1e-9)
    # K = 2: the KL between two Beta densities, by quadrature.
    a, b = np.array([2.5, 0.7]), np.array([1.3, 4.0])
    p, q = stats.beta(*a), stats.beta(*b)
    quad = integrate.quad(lambda x: p.pdf(x) * (p.logpdf(x) - q.logpdf(x)), 0, 1, limit=200)[0]
    np.testing.assert_allclose(prior_networks.reverse_kl(a, b), quad, rtol=1e-6)
    # Reverse KL = -H(Dir alpha) + ln B(target) - sum (target - 1)(psi(alpha) - psi(alpha_0)).
    a10, t10 = alpha[0], target[0]
    log_beta = special.gammaln(t10).sum() - special.gammaln(t10.sum())
    identity = (-stats.dirichlet(a10).entropy() + log_beta
                - np.sum((t10 - 1) * (special.digamma(a10) - special.digamma(a10.sum()))))
    np.testing.assert_allclose(prior_networks.reverse_kl(a10, t10), identity, rtol=1e-8)


def test_prior_network_scores_are_log_space_and_overflow_free():
    logits = jnp.array([[200.0, 0.0, -5.0], [1.0, 2.0, 3.0]])
    np.testing.assert_allclose(prior_networks.log_precision(logits)[1],
                               np.log(np.exp([1.0, 2.0, 3.0]).sum()), rtol=1e-12)
    assert np.isfinite(prior_networks.log_precision(logits)[0])
    assert np.isfinite(prior_networks.concentration_from_logits(logits)).all()


# ------------------------------------------------------------------------------------- DUQ
def _duq_inputs(seed=0, b=6, d=5, n=4, k=3):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(b, d)), 0.3 * rng.normal(size=(n, k, d)),
            rng.normal(size=(k, n)), rng.integers(0, k, b))


def test_duq_kernel_matches_numpy():
    z, w, e, _ = _duq_inputs()
    emb = np.einsum("bd,nkd->bkn", z, w)
    expected = np.exp(-np.mean((emb - e[None]) ** 2, axis=-1) / (2 * 0.1 ** 2))
    log_k = duq.log_kernel(duq.class_embeddings(z, w), e, 0.1)
    np.testing.assert_allclose(np.exp(log_k), expected, rtol=1e-12)
    np.testing.assert_allclose(duq.certainty(log_k), expected.max(-1), rtol=1e-12)


def test_duq_bce_clamps_like_pytorch():
    log_k = np.array([[0.0, -1e-20, -300.0], [-0.5, -2.0, -50.0]])
    labels = np.array([1, 0])
    got = np.asarray(duq.bce_loss(log_k, labels))
    # Row 0 by hand: class 0 is not the label and K = 1, so log(1 - K) = -inf, clamped at -100;
    # class 1 is the label, log K = -1e-20; class 2 is not, log(1 - e^-300) = -e^-300 ~ 0.
    np.testing.assert_allclose(got[0], (100.0 + 1e-20 + 0.0) / 3, rtol=1e-12)
    k = np.exp(log_k[1])
    ref = -np.mean([np.log(k[0]), np.log1p(-k[1]), np.log1p(-k[2])])
    np.testing.assert_allclose(got[1], ref, rtol=1e-12)


def _log1mexp_reference(x):
    """log(1 - e^x): log(-expm1(x)) near 0; the series -sum_k e^{kx}/k below -log 2."""
    out = np.empty_like(x)
    near = x > -np.log(2)
    out[near] = np.log(-np.expm1(x[near]))
    far = x[~near]
    terms = np.exp(np.outer(far, np.arange(1, 80))) / np.arange(1, 80)
    out[~near] = -terms.sum(-1)
    return out


def test_log1mexp_is_accurate_over_the_whole_range():
    x = -np.logspace(-12, 2.5, 400)
    np.testing.assert_allclose(duq.log1mexp(x), _log1mexp_reference(x), rtol=1e-13)


def test_duq_centroid_ema_after_t_identical_batches():
    z, w, _, labels = _duq_inputs(1)
    emb = np.einsum("bd,nkd->bkn", z, w)
    onehot = np.eye(3)[labels]
    batch_counts, batch_sums = onehot.sum(0), np.einsum("bk,bkn->kn", onehot, emb)
    sums, counts = np.full((3, 4), 12.0) * 0.5, np.full(3, 12.0)
    gamma, t = 0.9, 7
    s, c = jnp.asarray(sums), jnp.asarray(counts)
    for _ in range(t):
        s, c = duq.update_centroid_stats(s, c, emb, labels, gamma)
    np.testing.assert_allclose(c, gamma ** t * counts + (1 - gamma ** t) * batch_counts)
    np.testing.assert_allclose(s, gamma ** t * sums + (1 - gamma ** t) * batch_sums)


def test_duq_gradient_penalty_against_central_finite_differences():
    rng = np.random.default_rng(2)
    a = rng.normal(size=(8, 5))
    _, w, e, _ = _duq_inputs(3)
    x = rng.normal(size=(4, 8))

    def kernel(v):  # a small feature net, then the DUQ head
        return jnp.exp(duq.log_kernel(duq.class_embeddings(jnp.tanh(v @ a), w), e, 0.5))

    got = np.asarray(duq.gradient_penalty(kernel, x))
    h = 1e-6
    for i in range(len(x)):
        g = np.zeros(8)
        for j in range(8):
            up, down = x[i].copy(), x[i].copy()
            up[j] += h
            down[j] -= h
            g[j] = (np.sum(kernel(up[None])) - np.sum(kernel(down[None]))) / (2 * h)
        np.testing.assert_allclose(got[i], (np.linalg.norm(g) - 1) ** 2, rtol=1e-6)


# ---------------------------------------------------------------------------------- PostNet
def _radial_params(seed, k=2, layers=3, dim=6):
    return postnet.init_radial(jax.random.PRNGKey(seed), k, layers, dim)


def test_radial_log_det_equals_slogdet_of_the_jacobian():
    params = _radial_params(0, dim=6)
    z = np.random.default_rng(0).normal(size=(5, 6))
    for layer in range(3):
        z0, a, b = params.z0[0, layer], params.a_raw[0, layer], params.b_raw[0, layer]
        _, logdet = postnet.radial_layer(z, z0, a, b)
        for i in range(len(z)):
            def layer(v, z0=z0, a=a, b=b):
                return postnet.radial_layer(v[None], z0, a, b)[0][0]

            jac = jax.jacfwd(layer)(jnp.asarray(z[i]))
            np.testing.assert_allclose(logdet[i], np.linalg.slogdet(np.asarray(jac))[1],
                                       rtol=1e-9, atol=1e-12)


def test_a_2d_flow_density_integrates_to_one():
    params = _radial_params(1, k=1, layers=4, dim=2)
    # Make the layers strong enough to move mass (beta up to a few units).
    params = params._replace(b_raw=params.b_raw + 2.0, z0=params.z0 * 3)
    grid = np.linspace(-14, 14, 1601)  # trapezoid; the radial kink at z0 limits it to ~1e-5
    xx, yy = np.meshgrid(grid, grid, indexing="ij")
    z = np.stack([xx.ravel(), yy.ravel()], -1)
    density = np.exp(np.asarray(postnet.class_log_densities(z, params))[:, 0])
    total = integrate.trapezoid(integrate.trapezoid(density.reshape(xx.shape), grid), grid)
    np.testing.assert_allclose(total, 1.0, atol=1e-4)


def test_postnet_concentration_log_precision_and_the_empty_density_limit():
    counts = np.array([4800.0, 5200.0, 100.0])
    log_q = np.array([[-3.0, 2.0, -1.0], [-1e4, -1e4, -1e4], [300.0, 0.0, -2.0]])
    alpha = np.asarray(postnet.concentration(log_q, counts))
    np.testing.assert_allclose(alpha[0], 1 + counts * np.exp(log_q[0]), rtol=1e-12)
    np.testing.assert_allclose(alpha[1], 1.0)  # no density: the flat prior Dir(1)
    assert np.isfinite(alpha).all()  # clamped where N q would overflow
    lp = np.asarray(postnet.log_precision(log_q, counts))
    np.testing.assert_allclose(lp[0], np.log(alpha[0].sum()), rtol=1e-12)
    np.testing.assert_allclose(lp[1], np.log(3.0), rtol=1e-12)
    np.testing.assert_allclose(lp[2], 300 + np.log(4800.0), rtol=1e-12)  # exact, unclamped


def test_uce_with_entropy_against_monte_carlo_and_scipy():
    rng = np.random.default_rng(4)
    alpha, label = np.array([3.0, 0.8, 12.0, 1.5]), 2
    samples = rng.dirichlet(alpha, size=1_000_000)
    values = -np.log(samples[:, label])
    mc, se = values.mean(), values.std() / np.sqrt(len(values))
    got = float(postnet.uce_loss(alpha[None], np.array([label]), 0.0)[0])
    assert abs(got - mc) < 3 * se
    weight = 1e-2
    with_entropy = float(postnet.uce_loss(alpha[None], np.array([label]), weight)[0])
    np.testing.assert_allclose(with_entropy, got - weight * stats.dirichlet(alpha).entropy(),
                               rtol=1e-8)


# ------------------------------------------------------------------------------------ DAEDL
def test_gda_log_density_matches_scipy():
    rng = np.random.default_rng(5)
    z = rng.normal(size=(300, 4)) @ rng.normal(size=(4, 4))
    labels = rng.integers(0, 3, 300)
    gda = daedl.fit_gda(z, labels, 3)
    assert np.all(gda.jitter_K == 0.0)
    test = rng.normal(size=(7, 4))
    got = np.asarray(daedl.class_log_densities(test, gda))
    for c in range(3):
        zc = z[labels == c]
        ref = stats.multivariate_normal(zc.mean(0), np.cov(zc, rowvar=False)).logpdf(test)
        np.testing.assert_allclose(got[:, c], ref, rtol=1e-9)
    np.testing.assert_allclose(daedl.density_score(test, gda), special.logsumexp(got, -1),
                               rtol=1e-12)


def test_gda_jitter_rescues_a_rank_deficient_covariance():
    rng = np.random.default_rng(6)
    z = np.zeros((50, 3))
    z[:, :2] = rng.normal(size=(50, 2))  # the third feature is constant: singular covariance
    gda = daedl.fit_gda(z, np.zeros(50, int), 1)
    assert gda.jitter_K[0] > 0
    assert np.isfinite(np.asarray(daedl.class_log_densities(rng.normal(size=(4, 3)), gda))).all()
    with pytest.raises(ValueError, match="class 1 has 0"):
        daedl.fit_gda(z, np.zeros(50, int), 2)


def test_density_normalisation_and_the_scaled_dirichlet():
    train = np.array([-40.0, -10.0, -25.0])
    lo, hi = train.min(), train.max()
    d = np.asarray(daedl.normalized_density(np.array([-40.0, -10.0, -100.0, 5.0, -25.0]), lo, hi))
    np.testing.assert_allclose(d, [0.0, 1.0, 0.0, 1.0, 0.5])
    shifted = daedl.normalized_density(np.array([-25.0]) + 7, lo + 7, hi + 7)
    np.testing.assert_allclose(shifted, [0.5])  # invariant to s + const
    logits = np.array([[2.0, -1.0, 0.5]])
    np.testing.assert_allclose(daedl.scaled_concentration(logits, np.ones(1)),
                               np.exp(logits) + 1e-6)  # d = 1: the exp-EDL model
    np.testing.assert_allclose(daedl.scaled_probabilities(logits, np.zeros(1)), 1 / 3)
    np.testing.assert_allclose(daedl.scaled_log_precision(logits, np.full(1, 0.5)),
                               np.log(np.exp(0.5 * logits).sum()), rtol=1e-12)


# ------------------------------------------------------------------------------------ F-EDL
def _fd_samples(rng, alpha, p, tau, n):
    k = rng.choice(len(p), size=n, p=p)
    out = np.empty((n, len(alpha)))
    for c in range(len(p)):
        idx = np.nonzero(k == c)[0]
        out[idx] = rng.dirichlet(alpha + tau * np.eye(len(p))[c], size=len(idx))
    return out


def test_flexible_dirichlet_moments_and_aleatoric_part_against_monte_carlo():
    rng = np.random.default_rng(7)
    alpha, p, tau = np.array([2.0, 0.5, 4.0, 1.0]), np.array([0.1, 0.6, 0.2, 0.1]), 3.0
    pi = _fd_samples(rng, alpha, p, tau, 1_000_000)
    m = fedl.moments(alpha[None], p[None], np.array([tau]))
    n = len(pi)
    np.testing.assert_array_less(np.abs(m.mean_BxK[0] - pi.mean(0)), 3 * pi.std(0) / np.sqrt(n))
    sq = (pi - pi.mean(0)) ** 2
    np.testing.assert_array_less(np.abs(m.variance_BxK[0] - sq.mean(0)),
                                 3 * sq.std(0) / np.sqrt(n) + 1e-12)
    u = fedl.uncertainties(alpha[None], p[None], np.array([tau]))
    au = 1 - np.sum(pi ** 2, -1)
    assert abs(float(u.aleatoric[0]) - au.mean()) < 3 * au.std() / np.sqrt(n)


def test_flexible_dirichlet_reduces_to_the_dirichlet_and_its_loss():
    alpha, p = np.array([[2.0, 0.5, 4.0]]), np.array([[0.2, 0.3, 0.5]])
    m = fedl.moments(alpha, p, np.zeros(1))
    s = alpha.sum()
    np.testing.assert_allclose(m.mean_BxK, alpha / s)
    np.testing.assert_allclose(m.variance_BxK, alpha * (s - alpha) / (s ** 2 * (s + 1)))
    tau, y = np.array([1.5]), np.array([2])
    m = fedl.moments(alpha, p, tau)
    onehot = np.eye(3)[y]
    ref = (np.sum((onehot - m.mean_BxK) ** 2) + np.sum(m.variance_BxK)
           + np.sum((onehot - p) ** 2))
    np.testing.assert_allclose(fedl.loss(alpha, p, tau, y), [ref], rtol=1e-12)


# -------------------------------------------------------------- additions for gedl_jax.methods
def test_daedl_training_loss_against_the_literal_formula():
    rng = np.random.default_rng(8)
    logits = rng.normal(scale=3.0, size=(16, 5))
    logits[0] = [12.0, -3.0, 0.0, 1.0, 2.0]   # a confident example
    labels = rng.integers(0, 5, 16)
    weight = 0.05
    alpha = np.exp(logits) + 1e-6
    s = alpha.sum(-1, keepdims=True)
    y = np.eye(5)[labels]
    tilde = alpha * (1 - y) + y + 1e-6
    ref = (np.sum((y - alpha / s) ** 2, -1)
           + np.sum(alpha * (s - alpha) / (s ** 2 * (s + 1)), -1)
           + weight * _kl_reference(tilde, np.ones_like(tilde)))
    got = np.asarray(daedl.training_loss(logits, labels, weight))
    np.testing.assert_allclose(got, ref, rtol=1e-8)
    # float32 at a concentration whose alpha_0^2 overflows: still finite (the clip and the
    # p(1 - p)/(alpha_0 + 1) form).
    with jax.enable_x64(False):
        big = daedl.training_loss(jnp.array([[80.0, 0.0, 0.0]], jnp.float32), jnp.array([0]))
        assert np.isfinite(np.asarray(big)).all()


def test_pn_ood_noise_spans_the_batch_range_and_the_smoothed_one_is_a_gaussian_blur():
    from scipy import ndimage

    rng = np.random.default_rng(9)
    images = rng.uniform(0.2, 0.7, size=(6, 9, 9, 2))
    key = jax.random.PRNGKey(3)
    noise = np.asarray(prior_networks.ood_noise(key, images, "noise_uniform"))
    assert noise.shape == images.shape
    lo, hi = images.min(axis=(0, 1, 2)), images.max(axis=(0, 1, 2))
    assert np.all(noise >= lo - 1e-12) and np.all(noise <= hi + 1e-12)
    np.testing.assert_array_equal(noise, prior_networks.ood_noise(key, images, "noise_uniform"))
    # The blur alone against scipy (sigma 1, taps to 2 sigma, edge padding, H and W only).
    u = rng.uniform(size=(2, 9, 9, 2))
    ref = ndimage.gaussian_filter(u, sigma=(0, 1.0, 1.0, 0), mode="nearest", truncate=2.0)
    np.testing.assert_allclose(prior_networks.gaussian_blur(u, 1.0), ref, rtol=1e-12)
    smooth = np.asarray(prior_networks.ood_noise(key, images, "noise_smoothed"))
    for img in (smooth - lo) / (hi - lo):   # each image stretched back to the full range
        np.testing.assert_allclose([img.min(), img.max()], [0.0, 1.0], atol=1e-12)

    def neighbour_corr(x):
        return np.corrcoef(x[:, :, :-1].ravel(), x[:, :, 1:].ravel())[0, 1]

    assert neighbour_corr(smooth) > 0.5 > 0.1 > abs(neighbour_corr(noise))
    with pytest.raises(ValueError, match="allowed"):
        prior_networks.ood_noise(key, images, "kmnist")


def test_postnet_log_concentration_is_exact():
    counts = np.array([4800.0, 12.0])
    log_q = np.array([[-3.0, 2.0], [-800.0, 750.0]])
    got = np.asarray(postnet.log_concentration(log_q, counts))
    np.testing.assert_allclose(got[0], np.log1p(counts * np.exp(log_q[0])), rtol=1e-13)
    np.testing.assert_allclose(got[1], [np.log1p(4800 * np.exp(-800.0)), 750 + np.log(12.0)],
                               rtol=1e-13)


def test_duq_penalty_gradient_is_finite_at_a_zero_input_gradient():
    g = np.zeros((2, 3))
    g[1] = [0.3, -0.4, 1.2]
    grad = np.asarray(jax.grad(lambda v: jnp.sum(duq.penalty_from_gradients(v)))(g))
    np.testing.assert_array_equal(grad[0], 0.0)   # PyTorch's subgradient of the norm at 0
    norm = np.linalg.norm(g[1])
    np.testing.assert_allclose(grad[1], 2 * (norm - 1) * g[1] / norm, rtol=1e-12)
    np.testing.assert_allclose(duq.penalty_from_gradients(g), [1.0, (norm - 1) ** 2])
