"""gedl_jax.methods.prior_networks in float64 against independent references: the targets, the
forward and reverse KL against the closed form and quadrature, the log-space scores, and the OOD
noise (the blur against scipy's Gaussian filter). The references import nothing from gedl_jax."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from evidential_reference import kl as _kl_reference
from scipy import integrate, special, stats

from gedl_jax.methods import prior_networks


@pytest.fixture(autouse=True)
def _float64():
    with jax.enable_x64(True), jax.numpy_rank_promotion("raise"):
        yield


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
