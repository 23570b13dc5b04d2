"""Where our numerics differ from the original code, and by how much (docs/baselines.md, "Where we
differ from the original code, and how to get theirs": one test per row of that table).

Each test computes both readings, ours and the original code's, the latter transcribed into
float64 NumPy/SciPy from the public repository the table names (float32 where the original's
float32 arithmetic is the point), and shows the stated difference. Nothing here imports
PyTorch; the transcriptions import nothing from gedl_jax."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy import linalg, special

from gedl_jax import config as config_lib
from gedl_jax import configs, methods
from gedl_jax import evidential as ev
from gedl_jax.methods import MethodSetup, daedl, duq, fedl, postnet, prior_networks
from gedl_jax.run.optimizer import make_optimizer


@pytest.fixture(autouse=True)
def _float64():
    with jax.enable_x64(True), jax.numpy_rank_promotion("raise"):
        yield


_ROWS = 512   # every batched call is padded to this many rows: one compilation per function


def _padded(fn, *arrays, rows=_ROWS):
    """fn(*arrays) for (N, K) arrays, N <= rows, through one padded (rows, K) call."""
    n = arrays[0].shape[0]
    padded = [np.concatenate([a, np.ones((rows - n,) + a.shape[1:], a.dtype)]) for a in arrays]
    return np.asarray(fn(*padded))[:n]


_REVERSE = jax.jit(prior_networks.reverse_kl, static_argnums=2)
_FORWARD = jax.jit(prior_networks.forward_kl, static_argnums=2)
_CLOSED = jax.jit(ev.dirichlet_kl)
_FISHER = jax.jit(ev.fisher_logdet)
_MSE = jax.jit(ev.expected_mse)
_UCE = jax.jit(postnet.uce_loss)
_DAEDL_LOSS = jax.jit(daedl.training_loss)


def _daedl_loss(logits, labels, logit_clip):
    return _padded(lambda x, y: _DAEDL_LOSS(x, y[:, 0].astype(np.int32), 0.05, logit_clip),
                   logits, labels[:, None].astype(np.float64))


def _reverse_kl(alpha, target, epsilon=0.0):
    return _padded(lambda a, t: _REVERSE(a, t, epsilon), alpha, target)


def _forward_kl(alpha, target, epsilon=0.0):
    return _padded(lambda a, t: _FORWARD(a, t, epsilon), alpha, target)


def _closed_kl(alpha, beta):
    return _padded(_CLOSED, alpha, beta)


def _rel(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return np.abs(got - want) / np.abs(want)


# ------------------------------------------------------------------------------ transcriptions
def _pn_reference_kl(alphas, target_alphas, epsilon=1e-8):
    """KaosEngineer/PriorNetworks, prior_networks/priornet/dpn_losses.py,
    `dirichlet_kl_divergence(alphas, target_alphas, epsilon)`: KL(Dir(target) || Dir(alphas)),
    epsilon inside every lgamma/digamma except the precision term's lgammas."""
    precision, target_precision = alphas.sum(-1), target_alphas.sum(-1)
    precision_term = special.gammaln(target_precision) - special.gammaln(precision)
    alphas_term = np.sum(special.gammaln(alphas + epsilon)
                         - special.gammaln(target_alphas + epsilon)
                         + (target_alphas - alphas)
                         * (special.digamma(target_alphas + epsilon)
                            - special.digamma(target_precision + epsilon)[..., None]), -1)
    return precision_term + alphas_term


def _pn_reference_reverse_kl(alphas, target_alphas, epsilon=1e-8):
    """`dirichlet_reverse_kl_divergence`: the same function with the arguments swapped."""
    return _pn_reference_kl(target_alphas, alphas, epsilon)


def _rounding_scale(p, q):
    """Sum of the magnitudes of the terms of the KL(Dir(p) || Dir(q)) closed form (with or
    without the epsilons): its float64 rounding error is a few 1e-16 times this."""
    p0, q0 = p.sum(-1), q.sum(-1)
    return (np.abs(special.gammaln(p0)) + np.abs(special.gammaln(q0))
            + np.sum(np.abs(special.gammaln(p)) + np.abs(special.gammaln(q))
                     + np.abs(p - q) * (np.abs(special.digamma(p))
                                        + np.abs(special.digamma(p0))[..., None]), -1))


def _edl_reference_kl(alphas, target_alphas, epsilon=1e-8):
    """danruod/IEDL code_classical/models/FisherEvidentialN.py and MengyuanChen21/ICLR2024-REDL
    code_classical/models/ModifiedEvidentialN.py, `compute_kl_loss` per example (before its
    batch mean): KL(Dir(alphas) || Dir(target)) with epsilon inside *every* lgamma/digamma and
    each of its two parts replaced by 0 where non-finite. Runs in the inputs' dtype."""
    eps = alphas.dtype.type(epsilon)
    alp0, target_alp0 = alphas.sum(-1), target_alphas.sum(-1)
    with np.errstate(all="ignore"):
        alp0_term = special.gammaln(alp0 + eps) - special.gammaln(target_alp0 + eps)
        alphas_term = np.sum(special.gammaln(target_alphas + eps) - special.gammaln(alphas + eps)
                             + (alphas - target_alphas)
                             * (special.digamma(alphas + eps)
                                - special.digamma(alp0 + eps)[..., None]), -1)
    alp0_term = np.where(np.isfinite(alp0_term), alp0_term, 0)
    alphas_term = np.where(np.isfinite(alphas_term), alphas_term, 0)
    return alp0_term + alphas_term


def _textbook_kl(a, b):
    """KL(Dir(a) || Dir(b)), the closed form as the EDL PyTorch port and RED write it
    (dougbrion/pytorch-classification-uncertainty losses.py `kl_divergence`) and as
    torch.distributions' Dirichlet KL, which DAEDL's train.py calls, evaluates it: lgamma and
    digamma, no epsilon; in the inputs' dtype."""
    a0, b0 = a.sum(-1), b.sum(-1)
    with np.errstate(all="ignore"):
        return (special.gammaln(a0) - special.gammaln(b0)
                + np.sum(special.gammaln(b) - special.gammaln(a)
                         + (a - b) * (special.digamma(a) - special.digamma(a0)[..., None]), -1))


def _kl_to_flat_exact(a):
    """KL(Dir(a) || Dir(1)) in float64 for any concentrations, independent of gedl_jax: the
    classes >= 1e3 and the strength A go through Stirling's series, whose leading parts combine
    analytically (no terms of size A log A), the others through scipy directly:

      (s + n - 1/2) log A - 1/2 sum_big log a_k - s + log(2 pi) (1 - n) / 2
      + r(A) - sum_big r(a_k) + sum_big (a_k - 1) (d(a_k) - d(A))
      + sum_small [-lgamma(a_k) + (a_k - 1) (psi(a_k) - psi(A))] - lgamma(K),

    n the number of big classes, s the small classes' sum, r = lgamma - Stirling's leading
    part, d = psi - log (their asymptotic series; A >= 1e3 is assumed)."""
    a = np.asarray(a, np.float64)
    big = a >= 1e3
    strength = a.sum(-1)
    assert np.all(strength >= 1e3)
    n, s = big.sum(-1), np.where(big, 0.0, a).sum(-1)

    def r(x):
        return 1 / (12 * x) - 1 / (360 * x ** 3) + 1 / (1260 * x ** 5)

    def d(x):
        return -1 / (2 * x) - 1 / (12 * x ** 2) + 1 / (120 * x ** 4) - 1 / (252 * x ** 6)

    safe_big = np.where(big, a, 1e3)
    lead = ((s + n - 0.5) * np.log(strength) - 0.5 * np.sum(np.where(big, np.log(safe_big), 0), -1)
            - s + 0.5 * np.log(2 * np.pi) * (1 - n))
    remainders = (r(strength) - np.sum(np.where(big, r(safe_big), 0), -1)
                  + np.sum(np.where(big, (a - 1) * (d(safe_big) - d(strength)[..., None]), 0), -1))
    safe_small = np.where(big, 1.0, a)
    small = np.sum(np.where(big, 0.0, -special.gammaln(safe_small) + (safe_small - 1)
                            * (special.digamma(safe_small) - special.digamma(strength)[..., None])),
                   -1)
    return lead + remainders + small - special.gammaln(a.shape[-1])


def test_the_exact_kl_reference_agrees_with_the_closed_form_where_that_is_accurate():
    rng = np.random.default_rng(0)
    a = 10 ** rng.uniform(3, 5, (50, 10))
    a[:, 0] = rng.uniform(0.5, 3, 50)                 # one small class in each row
    ones = np.ones_like(a)
    error = np.abs(_kl_to_flat_exact(a) - _textbook_kl(a, ones))
    assert np.all(error <= 16 * np.finfo(np.float64).eps * _rounding_scale(a, ones))


# ----------------------------------------------------------------- Prior Networks: KL epsilon
def _pn_config(method, **fields):
    config = configs.build_config("mnist", method)
    for key, value in fields.items():
        config[key] = value
    config_lib.validate(config)
    return config


def test_pn_kl_epsilon_matches_the_reference_formula_and_zero_is_the_closed_form():
    rng = np.random.default_rng(1)
    alpha = np.exp(rng.uniform(-12.0, 12.0, (64, 10)))
    target = np.asarray(prior_networks.in_distribution_target(rng.integers(0, 10, 64), 10))
    f64 = np.finfo(np.float64).eps
    fwd = _forward_kl(alpha, target, 1e-8)
    want = _pn_reference_kl(alpha, target)
    assert np.all(np.abs(fwd - want) <= 16 * f64 * _rounding_scale(target, alpha))
    rev = _reverse_kl(alpha, target, 1e-8)
    want = _pn_reference_reverse_kl(alpha, target)
    assert np.all(np.abs(rev - want) <= 16 * f64 * _rounding_scale(alpha, target))
    # epsilon = 0 is exactly our closed form.
    np.testing.assert_array_equal(_reverse_kl(alpha, target), _closed_kl(alpha, target))
    np.testing.assert_array_equal(_forward_kl(alpha, target), _closed_kl(target, alpha))
    # ... and the reference formula at epsilon = 0 is the closed form (to the float64 accuracy
    # of dirichlet_kl, which is built for float32).
    smoothed = _padded(jax.jit(lambda a, t: prior_networks.smoothed_dirichlet_kl(a, t, 0.0)),
                       alpha, target)
    np.testing.assert_allclose(smoothed, _closed_kl(alpha, target), rtol=1e-8)
    closed_grad = jax.jit(jax.grad(lambda a: jnp.sum(ev.dirichlet_kl(a, target))))(alpha)
    smoothed_grad = jax.jit(jax.grad(
        lambda a: jnp.sum(prior_networks.smoothed_dirichlet_kl(a, target, 0.0))))(alpha)
    np.testing.assert_allclose(closed_grad, smoothed_grad, rtol=1e-8)


def _pn_resolved(*args, **kwargs):
    return methods.resolved(_pn_config(*args, **kwargs))


def test_pn_kl_epsilon_is_a_validated_method_setting_the_builder_passes():
    assert prior_networks.PriorNetwork.settings()["kl_epsilon"] == 0.0
    setup = MethodSetup(10, (5,) * 10, (28, 28, 1))
    method = prior_networks.RKLPriorNetwork.build(
        _pn_resolved("rkl_pn", method_args='{"kl_epsilon": 1e-8}'), setup)
    assert method.kl_epsilon == 1e-8 and "KL epsilon 1e-08" in method.describe()
    assert prior_networks.KLPriorNetwork.build(_pn_resolved("kl_pn"), setup).kl_epsilon == 0.0
    with pytest.raises(ValueError, match=r"method_args: kl_epsilon=-1e-08 .* must be >= 0"):
        prior_networks.RKLPriorNetwork.build(
            _pn_resolved("rkl_pn", method_args='{"kl_epsilon": -1e-8}'), setup)


@pytest.mark.parametrize("alpha_min,documented", [(1e-3, (1.3e-5, 3.4e-5)),
                                                 (6e-6, (1.67e-3, 1.66e-3))])
def test_pn_kl_epsilon_changes_the_reverse_kl_by_about_epsilon_over_alpha_min(alpha_min,
                                                                             documented):
    # (a) every class but one at alpha_min, the other from 1e-3 to e^30 (the logit clip);
    # (b) one class at alpha_min, the others log-uniform up to e^30. Targets 1 + 100 onehot.
    rng = np.random.default_rng(5)
    structured, random = [], []
    for top in np.logspace(-3, 13, 60):
        for label in (0, 1):
            a = np.full(10, alpha_min)
            a[0] = top
            structured.append((a, label))
    for _ in range(200):
        a = np.exp(rng.uniform(np.log(alpha_min), 30.0, 10))
        a[rng.integers(10)] = alpha_min
        random.append((a, rng.integers(10)))
    for rows, want in zip((structured, random), documented):
        alpha = np.array([a for a, _ in rows])
        target = np.asarray(prior_networks.in_distribution_target(
            np.array([label for _, label in rows]), 10))
        ours = _reverse_kl(alpha, target)                   # closed form
        theirs = _reverse_kl(alpha, target, 1e-8)           # the reference's epsilon
        rel = _rel(theirs, ours)
        # Epsilon's effect is measured where float64 resolves it: where the KL's rounding bound
        # (16 ulps of the sum of its terms' magnitudes) is under a tenth of epsilon / alpha_min.
        # Elsewhere the KL is a difference of lgammas near 1e14 (alpha up to e^30), whose
        # rounding moves it by more than epsilon does: two programs (epsilon = 0 and 1e-8,
        # each compiled) fuse them differently on a GPU (an H100 showed 7.2e-5 at such a row).
        rounding = 16 * np.finfo(np.float64).eps * _rounding_scale(alpha, target) / np.abs(ours)
        resolved = rounding < 0.1 * 1e-8 / alpha_min
        assert resolved.sum() >= 25, resolved.sum()   # measured here: 104, 31, 120, 200 rows
        assert 0.5 * 1e-8 / alpha_min < rel[resolved].max() < 5 * 1e-8 / alpha_min
        if jax.default_backend() == "cpu":   # the documented values, over every row: XLA:CPU
            # rounds the two programs' shared lgammas alike, so they cancel there
            np.testing.assert_allclose(rel.max(), want, rtol=0.05)


# ------------------------------------------------------------------ Prior Networks: logit clip
def test_pn_logit_clip_leaves_the_kl_exact_up_to_30_and_saturates_beyond():
    logits = np.array([[29.5, -3.0, 0.0, 1.0, -2.0, 2.0, 0.5, -1.0, 0.0, 0.0]])
    np.testing.assert_allclose(prior_networks.concentration_from_logits(logits), np.exp(logits),
                               rtol=1e-15)
    logits[0, 0] = 35.0                     # the true class; the reference: exp(logits), no clip
    target = np.asarray(prior_networks.in_distribution_target(0, 10))[None]
    ours = np.asarray(prior_networks.concentration_from_logits(logits))
    theirs = np.exp(logits)
    np.testing.assert_allclose(_reverse_kl(ours, target) / _reverse_kl(theirs, target), 0.843,
                               rtol=1e-3)    # RKL-PN's term 16 % lower
    np.testing.assert_allclose(_forward_kl(ours, target) / _forward_kl(theirs, target), 0.0067,
                               rtol=1e-2)    # KL-PN's 99 % lower
    np.testing.assert_array_equal(jax.grad(lambda x: jnp.sum(
        prior_networks.concentration_from_logits(x)))(logits)[0, 0], 0.0)  # and no gradient


# --------------------------------------------------------------------------- DAEDL: jitter
_TINY = np.finfo(np.float64).tiny
_REFERENCE_JITTERS = [0.0, _TINY] + [10.0 ** e for e in range(-308, 0)]


def _daedl_reference_fit(features, labels, num_classes):
    """TaeseongYoon/DAEDL, density_estimation.py, `gmm_fit`: class means and covariances
    (divided by n_c - 1), then the first absolute jitter of [0, tiny, 1e-308, ..., 1e-1] with
    which torch's MultivariateNormal builds, i.e. every class's Cholesky factorisation
    succeeds (LAPACK potrf, as numpy's). Returns (jitter, means, Cholesky factors)."""
    means = np.stack([features[labels == c].mean(0) for c in range(num_classes)])
    covs = np.stack([(features[labels == c] - means[c]).T @ (features[labels == c] - means[c])
                     / (np.sum(labels == c) - 1) for c in range(num_classes)])
    eye = np.eye(features.shape[1])
    for jitter in _REFERENCE_JITTERS:
        try:
            return jitter, means, np.linalg.cholesky(covs + jitter * eye)
        except np.linalg.LinAlgError:
            continue
    raise AssertionError("no jitter factorised")


def _daedl_reference_log_prob(z, means, chols):
    """torch MultivariateNormal.log_prob: -(D log 2 pi + |L^-1 (z - mu)|^2) / 2 - sum log diag L,
    per class, (N, K); float64 (`gmm_evaluate` then stores it as float32)."""
    out = []
    for mu, chol in zip(means, chols):
        with np.errstate(over="ignore"):
            m = np.sum(linalg.solve_triangular(chol, (z - mu).T, lower=True) ** 2, 0)
            out.append(-0.5 * (z.shape[1] * np.log(2 * np.pi) + m)
                       - np.sum(np.log(np.diag(chol))))
    return np.stack(out, -1)


def test_daedl_reference_jitter_on_a_constant_feature_gives_minus_inf_densities():
    # A feature constant within the class (a dead ReLU unit): an exactly singular covariance.
    rng = np.random.default_rng(3)
    z = rng.normal(size=(50, 4))
    z[:, 3] = 0.0
    labels = np.zeros(50, int)
    jitter, means, chols = _daedl_reference_fit(z, labels, 1)
    assert jitter == _TINY                                        # 2.2e-308
    np.testing.assert_allclose(np.diag(chols[0]).min(), np.sqrt(_TINY), rtol=1e-12)  # 1.5e-154
    test = rng.normal(size=(6, 4))
    test[:, 3] = [0.0, 1e-3, 1e-100, 1.5, 2.5, -3.0]              # deviation d on the dead unit
    theirs = _daedl_reference_log_prob(test, means, chols)[:, 0]
    assert 340 < theirs[0] < 360                                   # on the subspace: ~ +350
    np.testing.assert_allclose(theirs[1:4], -0.5 * test[1:4, 3] ** 2 / _TINY, rtol=1e-6)
    assert np.all(np.isneginf(theirs[4:]))                         # float64 -inf once |d| > 2
    with np.errstate(over="ignore"):
        stored = theirs.astype(np.float32)                         # gmm_evaluate's float32 store
    assert np.all(np.isneginf(stored[1:])) and np.isfinite(stored[0])
    # Ours: the relative jitter 1e-10 * mean variance; finite, also in float32 as on device.
    gda = daedl.fit_gda(z, labels, 1)
    assert gda.jitter_K[0] == 1e-10
    for dtype in (np.float64, np.float32):
        ours = np.asarray(daedl.class_log_densities(test.astype(dtype), gda))[:, 0]
        assert np.all(np.isfinite(ours))
        assert 0 < ours[0] < 20 and ours[2] > -20 and -1e12 < ours[-1] < -1e9


@pytest.mark.parametrize("seed", range(5))
def test_daedl_reference_jitter_with_fewer_samples_than_dimensions_stays_finite(seed):
    # 6 samples in 12 dimensions: rank 5, but rounding makes the null space slightly indefinite.
    rng = np.random.default_rng(seed)
    z, test = rng.normal(size=(6, 12)), rng.normal(size=(5, 12))
    labels = np.zeros(6, int)
    jitter, means, chols = _daedl_reference_fit(z, labels, 1)
    assert jitter == 1e-15
    theirs = _daedl_reference_log_prob(test, means, chols)[:, 0]
    assert np.all(np.isfinite(theirs.astype(np.float32)))
    assert np.all((theirs > -1e16) & (theirs < -1e15 * 0.5))
    gda = daedl.fit_gda(z, labels, 1)
    assert gda.jitter_K[0] == 1e-10
    ours = np.asarray(daedl.class_log_densities(test, gda))[:, 0]
    assert np.all((ours > -1e12) & (ours < -1e9))


# ---------------------------------------------------------------------- DAEDL: logit clip
def _daedl_exact_loss(logits, labels, kl_weight=0.05):
    """TaeseongYoon/DAEDL, train.py, per example (it sums over the batch), unclipped, float64;
    the KL term by the exact reference above (the closed form cancels at these sizes)."""
    alpha = np.exp(logits) + 1e-6
    y = np.eye(logits.shape[-1])[labels]
    s = alpha.sum(-1, keepdims=True)
    tilde = alpha * (1 - y) + y + 1e-6
    return (np.sum((y - alpha / s) ** 2, -1) + np.sum(alpha * (s - alpha) / (s ** 2 * (s + 1)), -1)
            + kl_weight * _kl_to_flat_exact(tilde))


def test_daedl_logit_clip_lowers_the_loss_by_3_to_33_percent_for_logits_in_30_40():
    rng = np.random.default_rng(4)
    logits, labels = rng.uniform(30.0, 40.0, (500, 10)), rng.integers(0, 10, 500)
    exact = _daedl_exact_loss(logits, labels)
    unclipped = _daedl_loss(logits, labels, np.inf)
    np.testing.assert_allclose(unclipped, exact, rtol=1e-9)        # logit_clip = inf is exact
    clipped = _daedl_loss(logits, labels, 30.0)                    # the default
    change = (clipped - exact) / exact
    assert np.all(change < 0)                                       # documented: 3-33 % lower,
    np.testing.assert_allclose(np.percentile(change, [0, 50, 100]),  # median 26 %
                               [-0.33, -0.26, -0.03], atol=0.01)
    # The closed form (DAEDL's torch.distributions KL) is no reference here even in float64:
    # lgamma(~1e17) rounds by ~1e3, and its KL is off by a median 325 (the exact KL is ~200).
    y = np.eye(10)[labels]
    tilde = (np.exp(logits) + 1e-6) * (1 - y) + y + 1e-6
    error = np.abs(_textbook_kl(tilde, np.ones_like(tilde)) - _kl_to_flat_exact(tilde))
    assert np.median(error) > 100
    # Only the true class above the clip: the loss is unchanged.
    low = rng.uniform(-5.0, 5.0, (200, 10))
    low[np.arange(200), labels[:200]] = rng.uniform(30.0, 40.0, 200)
    np.testing.assert_allclose(_daedl_loss(low, labels[:200], 30.0),
                               _daedl_loss(low, labels[:200], np.inf), rtol=1e-12)


def test_daedl_logit_clip_is_a_method_setting_zero_meaning_none():
    c = configs.build_config("mnist", "daedl")
    assert daedl.DAEDL.settings()["logit_clip"] == 30.0
    setup = MethodSetup(10, (5,) * 10, (28, 28, 1))
    assert daedl.DAEDL.build(methods.resolved(c), setup).logit_clip == 30.0
    c.method_args = '{"logit_clip": 0}'
    method = daedl.DAEDL.build(methods.resolved(c), setup)
    assert method.logit_clip == np.inf and "logits unclipped" in method.describe()
    c.method_args = '{"logit_clip": -1.0}'
    with pytest.raises(ValueError, match=r"method_args: logit_clip=-1.0 .* must be >= 0"):
        methods.check_config(c)


# ------------------------------------------------- DAEDL: scores, normalisation, sanitising
def _daedl_method():
    return daedl.DAEDL.build(methods.resolved(configs.build_config("mnist", "daedl")),
                             MethodSetup(10, (5,) * 10, (28, 28, 1)))


def test_daedl_alpha0_score_in_log_space_ranks_like_the_reference_without_overflow_ties():
    # TaeseongYoon/DAEDL, ood_detection.py, `alpha0_density`: sum_k (1e-6 + exp(d * logit_k)) in
    # float32 (the network's dtype). Ours: "um" = log alpha*_0, float64, log space.
    rng = np.random.default_rng(6)
    logits = rng.normal(scale=60.0, size=(200, 10)).astype(np.float32)
    density = rng.uniform(0.0, 1.0, 200).astype(np.float32)
    with np.errstate(over="ignore"):
        theirs = np.sum(np.float32(1e-6) + np.exp(logits * density[:, None]), -1)
    method = _daedl_method()
    ours = method.predictions({"logits_BxK": logits, "density_B": density,
                               "log_density_B": np.zeros(200)}).scores["um"]
    finite = np.isfinite(theirs)
    assert np.sum(~finite) == 24                          # float32 exp overflows past 88.7
    np.testing.assert_allclose(np.exp(ours[finite]), theirs[finite], rtol=1e-5)
    assert np.array_equal(np.argsort(ours[finite]), np.argsort(theirs[finite], kind="stable"))
    assert len(np.unique(ours[~finite])) == np.sum(~finite)  # no ties where theirs is inf


def test_daedl_non_finite_densities_and_the_normalisation_range():
    # TaeseongYoon/DAEDL, ood_detection.py: `check` = torch.nan_to_num on the float32 log
    # densities (NaN -> 0, -inf -> -3.4e38), then clip to the training [min, max] (both sides;
    # conf_calibration.py clips only below). Ours: NaN and -inf rank lowest (d = 0).
    train_min, train_max = -400.0, -100.0
    log_density = np.array([np.nan, -np.inf, -250.0, -50.0], np.float32)
    cleaned = np.nan_to_num(log_density)
    assert cleaned[0] == 0.0 and cleaned[1] == np.finfo(np.float32).min
    theirs_ood = (np.clip(cleaned, train_min, train_max) - train_min) / (train_max - train_min)
    np.testing.assert_allclose(theirs_ood, [1.0, 0.0, 0.5, 1.0])   # NaN: fully in-distribution
    theirs_calibration = (np.maximum(cleaned, train_min) - train_min) / (train_max - train_min)
    np.testing.assert_allclose(theirs_calibration, [4 / 3, 0.0, 0.5, 7 / 6])   # d > 1
    ours = np.nan_to_num(np.asarray(daedl.normalized_density(log_density.astype(np.float64),
                                                             train_min, train_max)), nan=0.0)
    np.testing.assert_allclose(ours, [0.0, 0.0, 0.5, 1.0])
    logits = np.tile(np.array([1.0, 3.0, 2.0], np.float32), (4, 1))
    pred = _daedl_method().predictions({"logits_BxK": np.pad(logits, ((0, 0), (0, 7))),
                                        "density_B": ours, "log_density_B": log_density})
    assert np.all(pred.scores["log_density"][:2] < -1e300)       # NaN and -inf rank lowest
    # d = 0 (floored at 1e-12): p* uniform to 1e-11, the prediction still argmax of the logits
    # (the reference's p* = softmax(0) ties and argmax picks the first class).
    np.testing.assert_allclose(pred.probs[0], 0.1, atol=1e-11)
    assert np.argmax(pred.probs[0]) == 1 and np.argmax(np.full(10, 0.1)) == 0


# ---------------------------------------------------------------- variance term, all EDL codes
def test_variance_term_rewrite_equals_the_reference_and_survives_float32_overflow():
    # alpha (S - alpha) / (S^2 (S + 1)) (every EDL code's MSE loss; DAEDL's train.py) evaluated
    # as p (1 - p) / (S + 1): the same value; S^2 overflows float32 from S ~ 1.8e19.
    def theirs(alpha):
        s = alpha.sum(-1, keepdims=True)
        with np.errstate(all="ignore"):
            return np.sum(alpha * (s - alpha) / ((s ** 2) * (s + 1)), -1)

    rng = np.random.default_rng(7)
    alpha = np.exp(rng.uniform(-5, 12, (64, 10)))
    labels = rng.integers(0, 10, 64)
    y = np.eye(10)[labels]
    squared = np.sum((y - alpha / alpha.sum(-1, keepdims=True)) ** 2, -1)
    np.testing.assert_allclose(_MSE(alpha, labels), squared + theirs(alpha), rtol=1e-13)
    big = np.array([[46.0, 46.0, 0.0]])          # e^46 ~ 9.5e19: RED's exp clip is 80
    alpha32 = np.exp(big).astype(np.float32)
    assert np.isnan(theirs(alpha32)[0])          # inf / inf: the reference's loss is NaN
    exact = theirs(np.exp(big))[0]
    with jax.enable_x64(False):
        ours = np.asarray(_MSE(jnp.asarray(alpha32), jnp.array([0])))[0]
        ours_daedl = np.asarray(_DAEDL_LOSS(jnp.asarray(big, jnp.float32), jnp.array([0]), 0.05,
                                            np.inf))[0]
    np.testing.assert_allclose(ours, 0.25 + 0.25 + exact, rtol=1e-6)
    np.testing.assert_allclose(ours_daedl, _daedl_exact_loss(big, np.array([0])), rtol=1e-5)


# ------------------------------------------------------------------- EDL family: the KL
def test_edl_kl_epsilon_of_iedl_and_redl_is_below_float32_resolution():
    rng = np.random.default_rng(8)
    evidence = np.exp(rng.uniform(-12.0, 8.0, (500, 10)))
    labels = rng.integers(0, 10, 500)
    for lam, documented in ((1.0, 2e-8), (0.1, 2e-7)):     # EDL / I-EDL; R-EDL's lambda
        tilde = evidence * (1 - np.eye(10)[labels]) + lam
        target = np.full_like(tilde, lam)
        theirs = _edl_reference_kl(tilde, target)
        without = _edl_reference_kl(tilde, target, 0.0)
        effect = _rel(theirs, without).max()
        assert documented / 10 < effect < documented
        np.testing.assert_allclose(_closed_kl(tilde, target), without, rtol=5e-8)


def test_edl_kl_non_finite_masking_only_acts_past_float32_lgamma_overflow():
    # Below ~4e36 (float32; 2.5e305 in float64) the masks never fire; past it the reference's
    # terms are inf and zeroed, ours stays finite and exact.
    alpha = np.array([[1e30, 1.0, 2.0], [1e37, 1.0, 2.0]], np.float32)
    flat = np.ones_like(alpha)
    theirs = _edl_reference_kl(alpha, flat)
    with np.errstate(all="ignore"):
        unmasked = special.gammaln(alpha.sum(-1)) - special.gammaln(np.float32(3.0))
    assert np.isfinite(unmasked[0]) and np.isinf(unmasked[1]) and theirs[1] == 0.0
    with jax.enable_x64(False):
        ours = np.asarray(_CLOSED(jnp.asarray(alpha), jnp.asarray(flat)))
    np.testing.assert_allclose(ours, _kl_to_flat_exact(alpha.astype(np.float64)), rtol=1e-6)


@pytest.mark.parametrize("strength,theirs_error", [(1e4, 3.4e-4), (1e6, 1.1e-2), (1e8, 1.0)])
def test_edl_kl_in_float32_the_textbook_form_cancels_and_ours_does_not(strength, theirs_error):
    # The closed form as the EDL PyTorch port, RED, I-EDL and R-EDL write it, in float32 (their
    # dtype), loses digits at large S; the rewrite in evidential.dirichlet_kl does not.
    alpha = np.array([[strength, 1.0, 1.0, 2.0, 1.0]])
    flat = np.ones_like(alpha)
    exact = _kl_to_flat_exact(alpha)
    theirs = _textbook_kl(alpha.astype(np.float32), flat.astype(np.float32))
    np.testing.assert_allclose(_rel(theirs, exact), theirs_error, rtol=0.1)
    with jax.enable_x64(False):
        ours = np.asarray(_CLOSED(jnp.asarray(alpha, jnp.float32), jnp.asarray(flat, jnp.float32)))
    assert _rel(ours, exact).max() < 2e-7


@pytest.mark.parametrize("strength,theirs_error", [(1e5, 2.2e-5), (1e7, 1.2e-2), (1e8, np.inf)])
def test_fisher_logdet_in_float32_the_direct_form_fails_at_large_strength(strength,
                                                                          theirs_error):
    # danruod/IEDL FisherEvidentialN.py `compute_fisher_mse`: -[sum log psi1(alpha) +
    # log(1 - psi1(S) sum 1/psi1(alpha))], float32; ours the three-way rewrite.
    alpha = np.array([[strength, 1.0, 2.0, 1.0, 1.5]])
    fisher = (np.diag(special.polygamma(1, alpha[0]))
              - special.polygamma(1, alpha.sum()))
    exact = -np.linalg.slogdet(fisher)[1]
    a32 = alpha.astype(np.float32)
    trigamma = special.polygamma(1, a32).astype(np.float32)
    trigamma0 = special.polygamma(1, a32.sum(-1, keepdims=True)).astype(np.float32)
    with np.errstate(all="ignore"):
        theirs = -(np.log(trigamma).sum(-1)
                   + np.log(np.float32(1) - (trigamma0 / trigamma).sum(-1)))
    np.testing.assert_allclose(_rel(theirs, exact), theirs_error, rtol=0.1)
    with jax.enable_x64(False):
        ours = np.asarray(_FISHER(jnp.asarray(a32)))
    assert _rel(ours, exact).max() < 2e-7


# ------------------------------------------------------------------ EDL family: evidence
def test_sensoy_exp_evidence_divides_the_logit_by_ten():
    # muratsensoy/muratsensoy.github.io uncertainty.ipynb: exp(clip(logits / 10, -10, 10)).
    logits = np.array([-150.0, -20.0, 0.0, 5.0, 20.0, 150.0])
    theirs = np.exp(np.clip(logits / 10, -10, 10))
    ours = np.asarray(ev.exp_evidence(logits, clip=10.0))
    np.testing.assert_allclose(ours[4] / theirs[4], np.exp(8.0))            # e^10 vs e^2
    np.testing.assert_allclose(ev.exp_evidence(logits / 10, clip=10.0), theirs, rtol=1e-15)


def test_red_exp_evidence_clip_80_on_mnist_10_on_cifar():
    # pandeydeep9/EvidentialResearch2023: MainMnistExperiment/losses.py exp(o), unclamped;
    # MainCifar10Experiments/utilFiles/losses.py exp(clamp(o, -10, 10)).
    assert configs.build_config("mnist", "red").exp_clip == 80.0
    assert configs.build_config("cifar10", "red").exp_clip == 10.0
    logits = np.array([-100.0, -5.0, 0.0, 40.0, 79.9, 90.0])
    ours = np.asarray(ev.exp_evidence(logits, clip=80.0))
    np.testing.assert_allclose(ours[1:5], np.exp(logits[1:5]), rtol=1e-14)
    with np.errstate(over="ignore"):
        theirs32 = np.exp(logits.astype(np.float32))
    assert np.isinf(theirs32[-1]) and ours[-1] == np.exp(80.0)   # float32 exp overflows at 88.7
    assert ours[0] == np.exp(-80.0)                              # theirs e^-100: ~0 either way
    np.testing.assert_allclose(ev.exp_evidence(logits, clip=10.0),
                               np.exp(np.clip(logits, -10, 10)), rtol=1e-15)


def test_red_preset_uses_the_mse_loss_where_the_red_code_defaults_to_log():
    # pandeydeep9/EvidentialResearch2023 get_args.py: --unc_type default "log", i.e.
    # sum_k y_k (log S - log alpha_k); our "red" preset: EDL's MSE (likelihood="mse").
    assert configs.build_config("mnist", "red").likelihood == "mse"
    alpha, labels = np.array([[5.0, 1.0, 2.0], [1.5, 30.0, 1.0]]), np.array([0, 2])
    y = np.eye(3)[labels]
    s = alpha.sum(-1, keepdims=True)
    theirs = np.sum(y * (np.log(s) - np.log(alpha)), -1)
    np.testing.assert_allclose(ev.log_nll(alpha, labels), theirs, rtol=1e-14)   # likelihood=log
    mse = np.asarray(ev.expected_mse(alpha, labels))
    np.testing.assert_allclose(mse, [0.2778, 1.7979], atol=1e-4)
    np.testing.assert_allclose(theirs, [0.4700, 3.4812], atol=1e-4)


# ------------------------------------------------------------------- batch sum versus mean
def test_batch_sum_and_mean_give_the_same_adam_steps_without_weight_decay():
    # DAEDL train.py, PostNet's UCE_loss and F-EDL train.py sum the loss over the batch; we
    # average (run/steps.py). Our Adam (run/optimizer.py) is invariant to the scale up to its
    # epsilon; coupled L2 weight decay is not.
    rng = np.random.default_rng(9)
    x, target = rng.normal(size=(64, 5)), rng.normal(size=64)

    def per_example(w):
        return (x @ w - target) ** 2

    def run(reduce, optimizer):
        def step(carry, _):
            w, state = carry
            grads = jax.grad(lambda v: reduce(per_example(v)))(w)
            updates, state = optimizer.update(grads, state, w)
            return (optax.apply_updates(w, updates), state), None

        w0 = jnp.zeros(5)
        (w, _), _ = jax.lax.scan(step, (w0, optimizer.init(w0)), None, length=20)
        return np.asarray(w)

    source = configs.build_config("cifar10", "daedl,source")   # Adam 1e-3, no decay
    adam = make_optimizer(source, 20)
    np.testing.assert_allclose(run(jnp.sum, adam), run(jnp.mean, adam), rtol=2e-6)
    protocol = configs.build_config("cifar10", "daedl")         # L2 weight decay 5e-4
    protocol.weight_decay, protocol.learning_rate = 5.0, 1e-2          # visible on a toy
    with_decay = make_optimizer(protocol, 20)
    assert _rel(run(jnp.sum, with_decay), run(jnp.mean, with_decay)).max() > 0.01


# --------------------------------------------------------------------------------- DUQ
def test_duq_bce_both_clamp_at_minus_100_but_pytorch_forms_one_minus_k_in_float32():
    # y0ast/deterministic-uncertainty-quantification train_duq_fm.py: F.binary_cross_entropy
    # on the float32 kernel K: each log clamped at -100, log(1 - K) from K itself. Ours:
    # log(1 - K) = log1mexp(log K), the same clamp.
    log_k = np.array([[-1e-9, -2e-8, -0.5], [-1e-3, -2.0, -300.0]])
    labels = np.array([2, 2])
    y = np.eye(3)[labels]
    k32 = np.exp(log_k).astype(np.float32)
    with np.errstate(divide="ignore"):
        theirs = -np.mean(y * np.maximum(np.log(k32), -100)
                          + (1 - y) * np.maximum(np.log1p(-k32), -100), -1)
    ours = np.asarray(duq.bce_loss(log_k, labels))
    exact = -np.mean(y * log_k + (1 - y) * np.log(-np.expm1(log_k)), -1)
    # K within 6e-8 of 1: float32 rounds it to 1, log(1 - K) = -inf -> -100.
    np.testing.assert_allclose(ours[0], exact[0], rtol=1e-12)                  # 12.8
    np.testing.assert_allclose(theirs[0], (100 + 100 + 0.5) / 3, rtol=1e-6)    # 66.8
    # Elsewhere the two agree to float32 rounding, the clamp included (log K = -300 -> -100).
    np.testing.assert_allclose(ours[1], (-np.log(-np.expm1(-1e-3)) - np.log(-np.expm1(-2.0))
                                         + 100) / 3, rtol=1e-12)
    np.testing.assert_allclose(theirs[1], ours[1], rtol=1e-5)


# -------------------------------------------------------------------- PostNet and F-EDL
def test_postnet_log_pseudo_count_clamp_at_80():
    # sharpenb/Posterior-Network PosteriorNetwork.py: alpha_c = 1 + N_c exp(log q_c), float64,
    # unclamped. Ours (float32 training): log N_c + log q_c clamped at 80.
    counts = np.array([6000.0, 6000.0, 6000.0])
    log_q = np.array([[70.0, 60.0, 0.0], [85.0, 82.0, 0.0]]) - np.log(6000.0)
    theirs = 1 + counts * np.exp(log_q)
    ours = np.asarray(postnet.concentration(log_q, counts))
    np.testing.assert_allclose(ours[0], theirs[0], rtol=1e-13)
    np.testing.assert_allclose(ours[1, :2], 1 + np.exp(80.0), rtol=1e-13)
    labels = np.array([0, 0])
    np.testing.assert_allclose(_UCE(theirs, labels, 0.0)[1], np.log1p(np.exp(-3.0)),
                               rtol=1e-9)                     # 0.049
    np.testing.assert_allclose(_UCE(ours, labels, 0.0)[1], np.log(2.0),
                               rtol=1e-9)                     # 0.693: the ratio is lost
    np.testing.assert_allclose(postnet.concentration(log_q, counts, np.inf), theirs, rtol=1e-13)


def test_fedl_logit_clip_at_30():
    # TaeseongYoon/F-EDL models.py: alpha = exp(g_alpha(f)), unclipped. Ours: clip +-30.
    logits = np.array([[35.0, 32.0, 0.0, 1.0, -2.0]])
    p, tau = np.full((1, 5), 0.2), np.array([1.0])
    theirs = fedl.loss(np.exp(logits), p, tau, np.array([0]))
    ours = fedl.loss(np.exp(np.clip(logits, -fedl.LOGIT_CLIP, fedl.LOGIT_CLIP)), p, tau,
                     np.array([0]))
    np.testing.assert_allclose([ours[0], theirs[0]], [1.3, 0.804], atol=1e-3)
    low = np.array([[29.0, 3.0, 0.0, 1.0, -2.0]])
    np.testing.assert_allclose(fedl.loss(np.exp(np.clip(low, -30, 30)), p, tau, np.array([0])),
                               fedl.loss(np.exp(low), p, tau, np.array([0])), rtol=1e-15)
