"""gedl_jax.methods.fedl (the flexible Dirichlet of F-EDL) in float64 against independent
references: its moments and aleatoric part against Monte Carlo over numpy's samplers, and its
reduction to the Dirichlet and the Dirichlet's loss."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from gedl_jax.methods import fedl


@pytest.fixture(autouse=True)
def _float64():
    with jax.enable_x64(True), jax.numpy_rank_promotion("raise"):
        yield


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
