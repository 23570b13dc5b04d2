"""gedl_jax.methods.duq in float64 against independent references: the RBF kernel and certainty
against NumPy, the BCE clamped like PyTorch's, log1mexp over its whole range against a series, the
centroid EMA in closed form, and the gradient penalty against central finite differences."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gedl_jax.methods import duq


@pytest.fixture(autouse=True)
def _float64():
    with jax.enable_x64(True), jax.numpy_rank_promotion("raise"):
        yield


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


def test_duq_penalty_gradient_is_finite_at_a_zero_input_gradient():
    g = np.zeros((2, 3))
    g[1] = [0.3, -0.4, 1.2]
    grad = np.asarray(jax.grad(lambda v: jnp.sum(duq.penalty_from_gradients(v)))(g))
    np.testing.assert_array_equal(grad[0], 0.0)   # PyTorch's subgradient of the norm at 0
    norm = np.linalg.norm(g[1])
    np.testing.assert_allclose(grad[1], 2 * (norm - 1) * g[1] / norm, rtol=1e-12)
    np.testing.assert_allclose(duq.penalty_from_gradients(g), [1.0, (norm - 1) ** 2])
