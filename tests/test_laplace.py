"""Last-layer Laplace (gedl_jax.evaluation.laplace) against independent float64 references: the
GGN against finite differences of the NLL's gradient (for a linear last layer under softmax
cross-entropy it is the exact Hessian) and against an explicit sum of Kronecker products, the
logit covariance against J C J^T built with np.kron, the Monte-Carlo predictive against NumPy's
own multivariate-normal sampler, and the prior precision's limits and grid choice."""

import math

import numpy as np
import pytest
from scipy import special

from gedl_jax.evaluation import laplace

F, K = 3, 4


def problem(seed=0, n=30):
    rng = np.random.default_rng(seed)
    phi = rng.normal(size=(n, F))
    w, b = rng.normal(size=(F, K)), rng.normal(size=K)
    labels = rng.integers(0, K, n)
    return phi, w, b, labels


def nll_gradient(theta_flat, phi, labels):
    """d/dTheta of sum_i -log softmax(phi~_i Theta)_{y_i}, row-major, written out by hand."""
    theta = theta_flat.reshape(F + 1, K)
    x = np.concatenate([phi, np.ones((len(phi), 1))], axis=1)
    p = special.softmax(x @ theta, axis=1)
    return (x.T @ (p - np.eye(K)[labels])).reshape(-1)


def test_the_ggn_is_the_hessian_of_the_nll_by_finite_differences():
    phi, w, b, labels = problem()
    theta = np.concatenate([w, b[None]]).reshape(-1)
    h = 1e-5
    numeric = np.stack([(nll_gradient(theta + h * e, phi, labels)
                         - nll_gradient(theta - h * e, phi, labels)) / (2 * h)
                        for e in np.eye(theta.size)], axis=1)
    np.testing.assert_allclose(laplace.last_layer_ggn(phi, w, b), numeric, rtol=1e-6, atol=1e-8)


def test_the_ggn_is_a_sum_of_kronecker_products_in_any_chunking():
    phi, w, b, _ = problem(1)
    x = np.concatenate([phi, np.ones((len(phi), 1))], axis=1)
    p = special.softmax(x @ np.concatenate([w, b[None]]), axis=1)
    want = sum(np.kron(np.outer(xi, xi), np.diag(pi) - np.outer(pi, pi)) for xi, pi in zip(x, p))
    for chunk in (1, 7, 4096):
        np.testing.assert_allclose(laplace.last_layer_ggn(phi, w, b, chunk=chunk), want,
                                   rtol=1e-12, atol=1e-12)


def test_the_logit_distribution_is_j_c_jt():
    phi, w, b, _ = problem(2)
    fit = laplace.fit_last_layer_laplace(phi, w, b, prior_precision=0.5)
    h = laplace.last_layer_ggn(phi, w, b) + 0.5 * np.eye((F + 1) * K)
    np.testing.assert_allclose(fit.covariance_PxP, np.linalg.inv(h), rtol=1e-9, atol=1e-12)
    mean, cov = laplace.logit_distribution(fit, phi[:5])
    for i in range(5):
        j = np.kron(np.append(phi[i], 1.0)[None], np.eye(K))           # K x (F+1)K, row-major
        np.testing.assert_allclose(cov[i], j @ fit.covariance_PxP @ j.T, rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(mean[i], phi[i] @ w + b, rtol=1e-12)


def test_probit_and_monte_carlo_predictives():
    phi, w, b, _ = problem(3)
    fit = laplace.fit_last_layer_laplace(phi, w, b, prior_precision=0.3)
    mean, cov = laplace.logit_distribution(fit, phi[:4])
    probit = laplace.predictive(fit, phi[:4], "probit")
    want = special.softmax(mean / np.sqrt(1 + math.pi / 8 * np.einsum("nkk->nk", cov)), axis=1)
    np.testing.assert_allclose(probit, want, rtol=1e-12)
    mc = laplace.predictive(fit, phi[:4], "mc", num_samples=200_000, seed=1)
    rng = np.random.default_rng(7)
    independent = np.stack([special.softmax(rng.multivariate_normal(mean[i], cov[i], 200_000),
                                            axis=1).mean(0) for i in range(4)])
    np.testing.assert_allclose(mc, independent, atol=5e-3)   # two 200k-sample means
    np.testing.assert_allclose(mc.sum(1), 1.0, rtol=1e-12)
    assert np.array_equal(mc, laplace.predictive(fit, phi[:4], "mc", num_samples=200_000,
                                                 seed=1))   # seeded


def test_the_prior_precision_moves_between_map_and_a_flat_predictive():
    phi, w, b, _ = problem(4)
    map_probs = special.softmax(phi @ w + b, axis=1)
    tight = laplace.predictive(laplace.fit_last_layer_laplace(phi, w, b, 1e10), phi)
    np.testing.assert_allclose(tight, map_probs, atol=1e-8)
    loose = laplace.predictive(laplace.fit_last_layer_laplace(phi, w, b, 1e-3), phi)
    assert loose.max(1).mean() < map_probs.max(1).mean()   # more uncertainty, less confidence


def test_the_grid_choice_minimises_the_validation_nll():
    phi, w, b, labels = problem(5, n=60)
    fit, nlls = laplace.fit_prior_precision(phi[:40], w, b, phi[40:], labels[40:],
                                            grid=(1e-2, 1.0, 1e2))
    assert fit.prior_precision == min(nlls, key=nlls.get)
    again = laplace.fit_last_layer_laplace(phi[:40], w, b, 1.0)
    probs = laplace.predictive(again, phi[40:])
    assert nlls[1.0] == pytest.approx(-np.mean(np.log(probs[np.arange(20), labels[40:]])),
                                      rel=1e-10)


def test_bad_inputs_raise():
    phi, w, b, labels = problem()
    with pytest.raises(ValueError, match="prior_precision"):
        laplace.fit_last_layer_laplace(phi, w, b, 0.0)
    with pytest.raises(ValueError, match="features"):
        laplace.last_layer_ggn(phi[:, :2], w, b)
    with pytest.raises(ValueError, match="shapes"):
        laplace.last_layer_ggn(phi, w, b[:2])
    fit = laplace.fit_last_layer_laplace(phi, w, b, 1.0)
    with pytest.raises(ValueError, match="kind"):
        laplace.predictive(fit, phi, "sampling")
    with pytest.raises(ValueError, match="one label per row"):
        laplace.fit_prior_precision(phi, w, b, phi, labels[:3])
