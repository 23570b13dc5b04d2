"""Post-hoc OOD scores (gedl_jax.evaluation.posthoc) against independent float64 references:
scipy's logsumexp and entropy, sklearn's EmpiricalCovariance and NearestNeighbors, and a NumPy
transcription of ViM's formula from its paper; each score ranks hand-made in-distribution data
above far-away data; bad inputs raise."""

import doctest

import numpy as np
import pytest
from scipy import special, stats
from sklearn.covariance import EmpiricalCovariance
from sklearn.metrics import roc_auc_score
from sklearn.neighbors import NearestNeighbors

from gedl_jax.evaluation import posthoc


def test_docstring_examples_run():
    result = doctest.testmod(posthoc, extraglobs={"np": np}, report=True)
    assert result.attempted > 0 and result.failed == 0


def clusters(rng, n, k=4, f=12, spread=0.5, scale=4.0):
    """Features of k Gaussian classes around random centres, their labels, and a linear head
    that classifies them (logits = x W + b)."""
    centres = rng.normal(scale=scale, size=(k, f))
    labels = rng.integers(0, k, size=n)
    x = centres[labels] + spread * rng.normal(size=(n, f))
    w = centres.T / scale
    b = rng.normal(size=k)
    return x, labels, w, b, centres


# ------------------------------------------------------------------------------ logit scores
def test_logit_scores_match_scipy():
    rng = np.random.default_rng(0)
    z = rng.normal(scale=5.0, size=(200, 7))
    p = special.softmax(z, axis=1)
    np.testing.assert_allclose(posthoc.msp_score(z), p.max(axis=1), rtol=1e-12)
    np.testing.assert_array_equal(posthoc.max_logit_score(z), z.max(axis=1))
    np.testing.assert_allclose(posthoc.energy_score(z), special.logsumexp(z, axis=1),
                               rtol=1e-12)
    np.testing.assert_allclose(posthoc.energy_score(z, temperature=3.0),
                               3.0 * special.logsumexp(z / 3.0, axis=1), rtol=1e-12)
    np.testing.assert_allclose(posthoc.neg_entropy_score(z), -stats.entropy(p, axis=1),
                               rtol=1e-10, atol=1e-14)
    scores = posthoc.logit_scores(z, temperature=3.0)
    assert tuple(scores) == posthoc.LOGIT_SCORE_NAMES
    np.testing.assert_array_equal(scores["energy"], posthoc.energy_score(z, 3.0))


def test_logit_scores_of_extreme_logits_are_finite():
    z = np.array([[1000.0, -1000.0, 0.0], [-800.0, -800.0, -800.0]])
    for score in posthoc.logit_scores(z).values():
        assert np.all(np.isfinite(score))
    np.testing.assert_allclose(posthoc.neg_entropy_score(z), [0.0, -np.log(3.0)], atol=1e-12)


# ------------------------------------------------------------------------------- Mahalanobis
def test_mahalanobis_matches_sklearn_empirical_covariance():
    rng = np.random.default_rng(1)
    x, y, _, _, _ = clusters(rng, 600, k=4, f=9)
    test = rng.normal(scale=4.0, size=(50, 9))
    fit = posthoc.fit_mahalanobis(x, y)
    # Reference: sklearn's shared covariance of the class-centred features, its mahalanobis.
    means = np.stack([x[y == c].mean(axis=0) for c in range(4)])
    reference = EmpiricalCovariance(assume_centered=True).fit(x - means[y])
    d2 = np.stack([reference.mahalanobis(test - means[c]) for c in range(4)], axis=1)
    np.testing.assert_allclose(posthoc.mahalanobis_score(fit, test), -d2.min(axis=1),
                               rtol=1e-8)


def test_mahalanobis_handles_rank_deficient_features_and_absent_classes():
    rng = np.random.default_rng(2)
    x, y, _, _, _ = clusters(rng, 300, k=3, f=6)
    x[:, -1] = 0.0                       # a dead ReLU unit: singular covariance
    fit = posthoc.fit_mahalanobis(x, y, num_classes=5)   # classes 3 and 4 never seen
    assert fit.class_present_K.tolist() == [True, True, True, False, False]
    means = np.stack([x[y == c].mean(axis=0) for c in range(3)])
    reference = EmpiricalCovariance(assume_centered=True).fit(x - means[y])
    test = x[:20] + 0.1
    d2 = np.stack([reference.mahalanobis(test - means[c]) for c in range(3)], axis=1)
    np.testing.assert_allclose(posthoc.mahalanobis_score(fit, test), -d2.min(axis=1),
                               rtol=1e-7)


# --------------------------------------------------------------------------------------- KNN
@pytest.mark.parametrize("k", [1, 5, 50])
def test_knn_matches_sklearn_nearest_neighbors(k):
    rng = np.random.default_rng(3)
    train = rng.normal(size=(400, 8))
    test = rng.normal(size=(60, 8)) + 0.5
    fit = posthoc.fit_knn(train, k=k)
    unit = train / np.linalg.norm(train, axis=1, keepdims=True)
    reference = NearestNeighbors(n_neighbors=k).fit(unit)
    dist, _ = reference.kneighbors(test / np.linalg.norm(test, axis=1, keepdims=True))
    np.testing.assert_allclose(posthoc.knn_score(fit, test), -dist[:, -1], rtol=1e-7,
                               atol=1e-7)


@pytest.mark.parametrize("columns, k", [(40, 1), (40, 40), (3000, 1), (3000, 50),
                                         (5000, 50), (5000, 156), (70_000, 3)])
@pytest.mark.parametrize("kind", ["continuous", "ties", "ascending", "descending"])
def test_kth_smallest_per_row_is_the_full_partitions(columns, k, kind):
    """The pre-filtered selection KNN uses gives what partitioning each whole row gives, with
    ties, rows sorted either way (the strided sample then holds each row's extremes or none of
    them) and sizes on both sides of the sample's threshold (N < 2 x the sample: whole rows)."""
    rng = np.random.default_rng(columns + k)
    values = rng.normal(size=(7, columns))
    if kind == "ties":
        values = rng.integers(0, 5, size=(7, columns)).astype(np.float64)
    elif kind == "ascending":
        values.sort(axis=1)
    elif kind == "descending":
        values = -np.sort(values, axis=1)
    expected = np.sort(values, axis=1)[:, k - 1]
    np.testing.assert_array_equal(posthoc._kth_smallest_per_row(values.copy(), k), expected)


def test_knn_default_k_is_the_papers():
    assert posthoc.KNN_DEFAULT_K == 50
    assert posthoc.fit_knn(np.ones((60, 3))).k == 50


# --------------------------------------------------------------------------------------- ViM
def vim_reference(train_x, train_z, w_FxK, b, test_x, test_z, dim):
    """ViM as written in Wang et al. (2022), Sec. 3 and Alg. 1, with their official code's
    steps: origin o = -(W^T)^+ b; principal space from the eigen-decomposition of the
    covariance of the training features centred at o (EmpiricalCovariance, assume_centered);
    the null space NS = eigenvectors beyond the D largest eigenvalues; virtual logit
    alpha ||(x - o) NS||, alpha = mean max-logit / mean residual norm on the training set;
    score = logsumexp(logits) - virtual logit."""
    u = -np.linalg.pinv(w_FxK.T) @ b
    cov = EmpiricalCovariance(assume_centered=True).fit(train_x - u).covariance_
    eig_vals, eigen_vectors = np.linalg.eig(cov)
    ns = np.ascontiguousarray(eigen_vectors.T[np.argsort(eig_vals * -1)[dim:]].T).real
    vlogit_train = np.linalg.norm((train_x - u) @ ns, axis=-1)
    alpha = train_z.max(axis=-1).mean() / vlogit_train.mean()
    vlogit = np.linalg.norm((test_x - u) @ ns, axis=-1) * alpha
    return special.logsumexp(test_z, axis=-1) - vlogit


@pytest.mark.parametrize("dim", [None, 3])
def test_vim_matches_the_papers_formula(dim):
    rng = np.random.default_rng(4)
    x, y, w, b, _ = clusters(rng, 500, k=4, f=10)
    z = x @ w + b
    test_x = rng.normal(scale=3.0, size=(40, 10))
    test_z = test_x @ w + b
    fit = posthoc.fit_vim(x, z, w, b, principal_dim=dim)
    assert fit.principal_dim == (5 if dim is None else dim)   # default: F // 2 below F = 768
    expected = vim_reference(x, z, w, b, test_x, test_z, fit.principal_dim)
    np.testing.assert_allclose(posthoc.vim_score(fit, test_x, test_z), expected, rtol=1e-8,
                               atol=1e-8)


def test_vim_default_dim_follows_the_paper():
    assert [posthoc.vim_default_dim(f) for f in (4096, 2048, 2047, 768, 767, 10)] == [
        1000, 1000, 512, 512, 383, 5]


# -------------------------------------------------------------------------------- orientation
def test_every_score_ranks_in_distribution_above_far_away_data():
    rng = np.random.default_rng(5)
    x, y, w, b, centres = clusters(rng, 800, k=4, f=12)
    id_x = centres[rng.integers(0, 4, size=200)] + 0.5 * rng.normal(size=(200, 12))
    # OOD: between the classes (low logit margins), and off the span of the class centres
    # (a residual for ViM): the centres' mean plus a push orthogonal to every centre.
    q, _ = np.linalg.qr(np.c_[centres.T, rng.normal(size=(12, 1))])
    ood_x = (centres.mean(axis=0) + 3.0 * q[:, 4] + 0.5 * rng.normal(size=(200, 12)))
    ood_z, id_z = ood_x @ w + b, id_x @ w + b
    scores = {name: (s(id_z), s(ood_z)) for name, s in [
        ("msp", posthoc.msp_score), ("max_logit", posthoc.max_logit_score),
        ("energy", posthoc.energy_score), ("neg_entropy", posthoc.neg_entropy_score)]}
    maha = posthoc.fit_mahalanobis(x, y)
    scores["neg_mahalanobis"] = (posthoc.mahalanobis_score(maha, id_x),
                                 posthoc.mahalanobis_score(maha, ood_x))
    knn = posthoc.fit_knn(x, k=10)
    scores["neg_knn_distance"] = (posthoc.knn_score(knn, id_x), posthoc.knn_score(knn, ood_x))
    vim = posthoc.fit_vim(x, x @ w + b, w, b)
    scores["vim"] = (posthoc.vim_score(vim, id_x, id_z), posthoc.vim_score(vim, ood_x, ood_z))
    assert set(scores) == set(posthoc.POSTHOC_SCORE_NAMES)
    for name, (id_s, ood_s) in scores.items():
        auroc = roc_auc_score(np.r_[np.ones(200), np.zeros(200)], np.r_[id_s, ood_s])
        assert auroc > 0.9, (name, auroc)


# ---------------------------------------------------------------------------------- bad input
def test_bad_inputs_raise():
    rng = np.random.default_rng(6)
    x, y, w, b, _ = clusters(rng, 100, k=3, f=6)
    with pytest.raises(ValueError, match="logits_NxK"):
        posthoc.msp_score(np.zeros(5))
    with pytest.raises(ValueError, match="NaN"):
        posthoc.energy_score(np.array([[0.0, np.nan]]))
    with pytest.raises(ValueError, match="temperature"):
        posthoc.energy_score(np.zeros((2, 2)), temperature=0.0)
    with pytest.raises(ValueError, match="labels_N"):
        posthoc.fit_mahalanobis(x, y.astype(float))
    with pytest.raises(ValueError, match="features"):
        posthoc.mahalanobis_score(posthoc.fit_mahalanobis(x, y), x[:, :5])
    with pytest.raises(ValueError, match="k must"):
        posthoc.fit_knn(x, k=101)
    with pytest.raises(ValueError, match="all zeros"):
        posthoc.knn_score(posthoc.fit_knn(x, k=3), np.zeros((1, 6)))
    with pytest.raises(ValueError, match="principal_dim"):
        posthoc.fit_vim(x, x @ w + b, w, b, principal_dim=6)
    with pytest.raises(ValueError, match="weight_FxK"):
        posthoc.fit_vim(x, x @ w + b, w.T, b)
    with pytest.raises(ValueError, match="rows"):
        posthoc.vim_score(posthoc.fit_vim(x, x @ w + b, w, b), x, (x @ w + b)[:5])
