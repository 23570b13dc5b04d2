"""gedl_jax.methods.postnet in float64 against independent references: the radial flow's
log-determinant against `slogdet` of the explicit Jacobian, a 2-d flow density integrating to one,
the concentration and its log, and the UCE loss against Monte Carlo and SciPy's entropy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, stats

from gedl_jax.methods import postnet


@pytest.fixture(autouse=True)
def _float64():
    with jax.enable_x64(True), jax.numpy_rank_promotion("raise"):
        yield


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


def test_postnet_log_concentration_is_exact():
    counts = np.array([4800.0, 12.0])
    log_q = np.array([[-3.0, 2.0], [-800.0, 750.0]])
    got = np.asarray(postnet.log_concentration(log_q, counts))
    np.testing.assert_allclose(got[0], np.log1p(counts * np.exp(log_q[0])), rtol=1e-13)
    np.testing.assert_allclose(got[1], [np.log1p(4800 * np.exp(-800.0)), 750 + np.log(12.0)],
                               rtol=1e-13)
