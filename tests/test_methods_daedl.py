"""gedl_jax.methods.daedl in float64 against independent references: the GDA densities against
SciPy, the jitter of a singular covariance, the density normalisation and the scaled Dirichlet,
and the training loss against its literal formula."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from evidential_reference import kl as _kl_reference
from scipy import special, stats

from gedl_jax.methods import daedl


@pytest.fixture(autouse=True)
def _float64():
    with jax.enable_x64(True), jax.numpy_rank_promotion("raise"):
        yield


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
