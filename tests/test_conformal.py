"""Split conformal sets (gedl_jax.evaluation.conformal): brute force from the definitions on
small arrays (ties included), the finite-sample coverage law over many random
calibration / test splits, and the set-size ordering on a well-specified model."""

import doctest
import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from gedl_jax.evaluation import conformal


# ------------------------------------------------------------------ brute force, from definitions
def brute_score(p, y, method, u=None, randomized=True, lam=0.01, k_reg=1):
    if method == "lac":
        return 1.0 - p[y]
    order = sorted(range(len(p)), key=lambda j: (-p[j], j))  # decreasing p, ties: lower index
    o = order.index(y) + 1
    rho = 0.0
    for j in order[:o - 1]:
        rho += p[j]
    score = rho + (u * p[y] if randomized else p[y])
    if method == "raps":
        score += lam * max(0, o - k_reg)
    return score


def brute_rank(n, alpha: Fraction):
    return math.ceil((n + 1) * (1 - alpha))     # exact rational arithmetic


def tied_probs(rng, n, k):
    """Rows with many exact ties: small integers normalised."""
    w = rng.integers(1, 4, size=(n, k)).astype(np.float64)
    return w / w.sum(1, keepdims=True)


SETTINGS = [("lac", True), ("aps", True), ("aps", False), ("raps", True), ("raps", False)]


@pytest.mark.parametrize("method,randomized", SETTINGS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_against_brute_force(method, randomized, seed):
    rng = np.random.default_rng(seed)
    k = 5
    cal_p = tied_probs(rng, 19, k) if seed % 2 == 0 else rng.dirichlet(np.ones(k), 19)
    cal_y = rng.integers(0, k, 19)
    test_p = tied_probs(rng, 11, k)
    u_cal, u_test = rng.random(19), rng.random(11)
    lam, k_reg = (0.1, 2) if seed == 2 else (0.01, 1)
    kw = dict(randomized=randomized, lam=lam, k_reg=k_reg)
    got = conformal.nonconformity_scores(test_p, method, u_N=u_test, **kw)
    want = np.array([[brute_score(test_p[i], y, method, u_test[i], **kw) for y in range(k)]
                     for i in range(11)])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-15)
    for alpha in ("0.1", "0.25", "0.5"):
        c = conformal.calibrate(cal_p, cal_y, method, float(alpha), u_N=u_cal, **kw)
        cal_scores = sorted(brute_score(cal_p[i], cal_y[i], method, u_cal[i], **kw)
                            for i in range(19))
        r = brute_rank(19, Fraction(alpha))
        assert c.rank == r
        assert c.threshold == pytest.approx(cal_scores[r - 1], abs=1e-15)
        sets = conformal.prediction_sets(c, test_p, u_N=u_test)
        # Ties with the threshold are included (<=); both sides compute the same floats.
        np.testing.assert_array_equal(sets, want <= cal_scores[r - 1])


@pytest.mark.parametrize("n,alpha", [(9, "0.1"), (19, "0.05"), (4, "0.4"), (99, "0.1"),
                                     (50, "0.1"), (7, "0.3"), (1, "0.5"), (3, "0.2"),
                                     (9, "0.7")])  # float: 10 * (1 - 0.7) = 3.0000000000000004
def test_quantile_rank_exact(n, alpha):
    """k = ceil((n+1)(1-alpha)) in exact arithmetic (products that are integers included), the
    k-th smallest score = numpy's inverted-CDF quantile at k/n; +inf when k > n."""
    rng = np.random.default_rng(n)
    s = rng.random(n)
    q, k = conformal.conformal_quantile(s, float(alpha))
    assert k == brute_rank(n, Fraction(alpha))
    if k > n:
        assert q == math.inf
    else:
        assert q == np.sort(s)[k - 1] == np.quantile(s, k / n, method="inverted_cdf")


def test_too_small_calibration_set_gives_every_label():
    c = conformal.calibrate(np.array([[0.5, 0.5]] * 3), np.array([0, 1, 0]), "lac", alpha=0.1)
    assert c.threshold == math.inf and c.rank == 4
    assert conformal.prediction_sets(c, np.array([[0.9, 0.1]])).all()


# ------------------------------------------------------------------ coverage over random splits
ALPHA, N_CAL, N_TEST, N_SPLITS, K = 0.1, 50, 1000, 300, 10
VARIANTS = {"lac": ("lac", True), "aps": ("aps", True), "aps_nonrandomized": ("aps", False),
            "raps": ("raps", True)}


@pytest.fixture(scope="module")
def split_results():
    """Per split: fresh i.i.d. data from a Dirichlet probability model (p ~ Dir(0.3), y ~ p, the
    model predicting p: well specified); coverage and mean set size of every variant."""
    rng = np.random.default_rng(2024)
    cover = {v: np.empty(N_SPLITS) for v in VARIANTS}
    size = {v: np.empty(N_SPLITS) for v in VARIANTS}
    for i in range(N_SPLITS):
        p = rng.dirichlet(np.full(K, 0.3), N_CAL + N_TEST)
        y = (rng.random((N_CAL + N_TEST, 1)) > np.cumsum(p, axis=1)).sum(1).clip(0, K - 1)
        for v, (method, randomized) in VARIANTS.items():
            c = conformal.calibrate(p[:N_CAL], y[:N_CAL], method, ALPHA, randomized=randomized,
                                    seed=i)
            m = conformal.set_metrics(conformal.prediction_sets(c, p[N_CAL:]), y[N_CAL:])
            cover[v][i], size[v][i] = m["coverage"], m["mean_set_size"]
    return cover, size


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_coverage_follows_the_finite_sample_law(split_results, variant):
    """With continuous scores the coverage given the calibration set is C ~ Beta(l, n + 1 - l),
    l = ceil((n+1)(1-alpha)) (here Beta(46, 5), mean 46/51 = 0.902); the test coverage of a split
    is Binomial(N_TEST, C) / N_TEST, i.e. beta-binomial. Its mean over N_SPLITS splits must lie
    within 4 standard errors of E[C] (so >= 1 - alpha - slack, slack = 4 se - (E[C] - (1 - alpha))
    ~ 0.010), and ~95% of the splits inside the central 95% beta-binomial band."""
    cover, _ = split_results
    c = cover[variant]
    l = math.ceil((N_CAL + 1) * (1 - ALPHA) - 1e-9)
    a, b = l, N_CAL + 1 - l
    beta = stats.beta(a, b)
    # Var of the per-split test coverage: Var(C) + E[C (1 - C)] / N_TEST.
    var = beta.var() + (beta.mean() - beta.var() - beta.mean() ** 2) / N_TEST
    se = math.sqrt(var / N_SPLITS)
    assert abs(c.mean() - beta.mean()) <= 4 * se, (c.mean(), beta.mean(), se)
    assert c.mean() >= 1 - ALPHA - 4 * se
    band = stats.betabinom(N_TEST, a, b)
    lo, hi = band.ppf(0.025) / N_TEST, band.ppf(0.975) / N_TEST
    inside = np.mean((c >= lo) & (c <= hi))
    assert inside >= 0.95 - 3 * math.sqrt(0.95 * 0.05 / N_SPLITS), (inside, lo, hi)


def test_lac_sets_are_smallest_on_a_well_specified_model(split_results):
    """LAC minimises the expected set size at a given coverage when p is the true conditional
    law (Sadinle et al. 2019); the randomized APS beats its non-randomized version."""
    _, size = split_results
    mean = {v: s.mean() for v, s in size.items()}
    assert mean["lac"] < mean["raps"] and mean["lac"] < mean["aps"]
    assert mean["aps"] < mean["aps_nonrandomized"]


def test_conformal_metrics_and_seeding():
    rng = np.random.default_rng(7)
    p = rng.dirichlet(np.full(4, 0.5), 600)
    y = (rng.random((600, 1)) > np.cumsum(p, axis=1)).sum(1).clip(0, 3)
    m = conformal.conformal_metrics(p[:300], y[:300], p[300:], y[300:], alpha=0.2, seed=3)
    assert set(m) == {"lac", "aps", "raps", "aps_nonrandomized"}
    for v in m.values():
        assert set(v) == {"alpha", "threshold", "num_calibration", "coverage", "mean_set_size",
                          "empty_fraction"}
        assert v["num_calibration"] == 300 and v["alpha"] == 0.2
    assert m == conformal.conformal_metrics(p[:300], y[:300], p[300:], y[300:], alpha=0.2,
                                            seed=3)
    c1 = conformal.calibrate(p[:300], y[:300], "aps", 0.2, seed=1)
    c2 = conformal.calibrate(p[:300], y[:300], "aps", 0.2, seed=2)
    assert c1.threshold != c2.threshold                         # the seed drives u
    with pytest.raises(ValueError, match="needs u_N"):
        conformal.nonconformity_scores(p, "raps")
    with pytest.raises(ValueError, match="method must be one of"):
        conformal.calibrate(p, y, "thr")
    with pytest.raises(ValueError, match="alpha"):
        conformal.calibrate(p, y, "lac", alpha=1.0)
    with pytest.raises(ValueError, match="labels_N"):
        conformal.calibrate(p, y.astype(float), "lac")


def test_doctests():
    result = doctest.testmod(conformal, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


# ------------------------------------------------------------------ MAPIE as an oracle
class _GivenProbabilities:
    """A fitted scikit-learn classifier whose predict_proba returns the given probabilities
    of the examples whose indices X holds: how MAPIE is handed a model's outputs."""

    _estimator_type = "classifier"

    def __init__(self, probs_NxK):
        self.probs_NxK = np.asarray(probs_NxK, np.float64)
        self.classes_ = np.arange(self.probs_NxK.shape[1])

    def fit(self, X, y):   # MAPIE's prefit mode never calls it
        return self

    def predict_proba(self, X):
        return self.probs_NxK[np.asarray(X, int).ravel()]

    def predict(self, X):
        return self.predict_proba(X).argmax(axis=1)

    def get_params(self, deep=True):
        return {"probs_NxK": self.probs_NxK}

    def __sklearn_tags__(self):
        from sklearn.utils import ClassifierTags, Tags, TargetTags
        return Tags(estimator_type="classifier", target_tags=TargetTags(required=True),
                    classifier_tags=ClassifierTags())


def _mapie_sets(probs_NxK, labels, n_cal, alpha, score, seed=None, **params):
    """MAPIE 1.6's split-conformal sets of the examples after the first n_cal, calibrated on
    the first n_cal."""
    from mapie.classification import SplitConformalClassifier
    index = np.arange(len(probs_NxK)).reshape(-1, 1)
    mapie = SplitConformalClassifier(_GivenProbabilities(probs_NxK), confidence_level=1 - alpha,
                                     conformity_score=score, prefit=True, random_state=seed)
    mapie.conformalize(index[:n_cal], labels[:n_cal])
    _, sets = mapie.predict_set(index[n_cal:], conformity_score_params=params)
    return sets[:, :, 0]


def _random_split(seed, n=2000, k=10):
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.full(k, 0.3), n)
    labels = np.array([rng.choice(k, p=p) for p in probs])   # a calibrated model
    return probs, labels, n // 2


@pytest.mark.parametrize("seed", range(5))
def test_lac_sets_are_mapies(seed):
    """LAC: E = 1 - p_y, q_hat the ceil((n + 1)(1 - alpha))-th smallest calibration score
    (MAPIE 1.6's "lower" quantile at that level): the same sets on random splits."""
    probs, labels, n_cal = _random_split(seed)
    for alpha in (0.05, 0.1, 0.2):
        ours = conformal.prediction_sets(
            conformal.calibrate(probs[:n_cal], labels[:n_cal], "lac", alpha), probs[n_cal:])
        np.testing.assert_array_equal(ours, _mapie_sets(probs, labels, n_cal, alpha, "lac"))


@pytest.mark.parametrize("seed", range(3))
def test_randomized_aps_is_mapies_randomized_sets_with_u_as_one_minus_its_draws(seed):
    """The randomized APS score rho(y) + u p_y (Romano et al. 2020) is MAPIE's
    `include_last_label="randomized"` with u = 1 - U: MAPIE scores calibration examples as
    cumsum(y) - U p_y and keeps a set's last label when its V = (cumsum - q_hat) / p_last is at
    most U. Fed MAPIE's own draws (a fresh RandomState(seed) for the calibration scores and
    again for the test sets), the sets are the same."""
    probs, labels, n_cal = _random_split(seed)
    n_test = len(probs) - n_cal
    u_cal = 1 - np.random.RandomState(seed).uniform(size=n_cal)
    u_test = 1 - np.random.RandomState(seed).uniform(size=n_test)
    for alpha in (0.05, 0.1, 0.2):
        calibration = conformal.calibrate(probs[:n_cal], labels[:n_cal], "aps", alpha,
                                          u_N=u_cal)
        ours = conformal.prediction_sets(calibration, probs[n_cal:], u_N=u_test)
        theirs = _mapie_sets(probs, labels, n_cal, alpha, "aps", seed=seed,
                             include_last_label="randomized")
        np.testing.assert_array_equal(ours, theirs)


def test_aps_includes_the_crossing_label_only_at_random():
    """The convention, pinned: with u = 0 every label up to and including the first whose
    cumulative mass reaches q_hat is in the set (MAPIE's `include_last_label=True` sets for that
    threshold); with u = 1 (`randomized=False`) that crossing label is left out (its
    `include_last_label=False`) unless its cumulative mass is q_hat exactly."""
    probs = np.array([[0.5, 0.3, 0.2]])
    calibration = conformal.ConformalCalibration(method="aps", alpha=0.1, threshold=0.6,
                                                 num_calibration=9, rank=9)
    # sorted masses 0.5, 0.3, 0.2; cumulative 0.5, 0.8, 1.0: label 1 crosses 0.6
    assert conformal.prediction_sets(calibration, probs, u_N=np.zeros(1)).tolist() == \
        [[True, True, False]]
    assert conformal.prediction_sets(calibration, probs, u_N=np.ones(1)).tolist() == \
        [[True, False, False]]
    fixed = conformal.ConformalCalibration(method="aps", alpha=0.1, threshold=0.6,
                                           num_calibration=9, rank=9, randomized=False)
    assert conformal.prediction_sets(fixed, probs).tolist() == [[True, False, False]]
