"""evaluation.metrics equals scikit-learn (the oracle) and hand-computed values; masks are inert."""

import warnings

import numpy as np
import pytest
from sklearn import metrics as skm

from gedl_jax.evaluation import metrics

RTOL = 1e-12


def _random_probs(rng, n, k, concentration=1.0):
    return rng.dirichlet(np.full(k, concentration), size=n)


def _binary_problem(rng, n, tied):
    """Random labels with both classes; continuous scores, or heavily tied integer scores."""
    y = rng.integers(0, 2, n)
    y[:2] = [0, 1]
    rng.shuffle(y)
    scores = rng.integers(0, 4, n).astype(float) if tied else rng.normal(size=n) + 0.7 * y
    return y.astype(bool), scores


# --------------------------------------------------------------------------------------------
# Classification metrics
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(3))
def test_accuracy_nll_brier_match_sklearn(seed):
    rng = np.random.default_rng(seed)
    k = 10
    probs = _random_probs(rng, 300, k, 0.3)
    labels = rng.integers(0, k, 300)
    assert metrics.accuracy(probs, labels) == pytest.approx(
        skm.accuracy_score(labels, probs.argmax(1)), rel=RTOL)
    assert metrics.nll(probs, labels) == pytest.approx(
        skm.log_loss(labels, probs, labels=range(k)), rel=RTOL)
    assert metrics.brier_score(probs, labels) == pytest.approx(
        skm.brier_score_loss(labels, probs, labels=range(k)), rel=RTOL)
    onehot = np.eye(k)[labels]
    assert metrics.brier_score(probs, labels) == pytest.approx(
        np.mean(np.sum((probs - onehot) ** 2, 1)), rel=RTOL)
    assert metrics.brier_score(probs, labels, squared=False) == pytest.approx(
        np.mean(np.linalg.norm(probs - onehot, axis=1)), rel=RTOL)


def test_nll_clips_zero_probability_like_log_loss():
    probs = np.array([[0.0, 1.0], [0.3, 0.7], [1.0, 0.0]])
    labels = np.array([0, 1, 0])
    assert metrics.nll(probs, labels) == pytest.approx(
        skm.log_loss(labels, probs, labels=[0, 1]), rel=RTOL)
    assert np.isfinite(metrics.nll(probs, labels))


def test_brier_binary_case_matches_sklearn():
    rng = np.random.default_rng(0)
    p1 = rng.uniform(size=200)
    labels = rng.integers(0, 2, 200)
    probs = np.stack([1 - p1, p1], 1)
    # The multi-class sum over both classes is twice sklearn's default (halved) binary Brier.
    assert metrics.brier_score(probs, labels) == pytest.approx(
        skm.brier_score_loss(labels, p1, scale_by_half=False), rel=RTOL)
    assert metrics.brier_score(probs, labels) == pytest.approx(
        2 * skm.brier_score_loss(labels, p1), rel=RTOL)


def test_brier_squared_and_unsquared_differ():
    probs = np.array([[0.5, 0.5], [0.9, 0.1]])
    labels = np.array([0, 1])
    # squared: (0.25+0.25 + 0.81+0.81)/2 = 1.06; L2: (sqrt(.5) + sqrt(1.62))/2
    assert metrics.brier_score(probs, labels) == pytest.approx(1.06, rel=RTOL)
    assert metrics.brier_score(probs, labels, squared=False) == pytest.approx(
        (np.sqrt(0.5) + np.sqrt(1.62)) / 2, rel=RTOL)


# --------------------------------------------------------------------------------------------
# ECE
# --------------------------------------------------------------------------------------------
def _two_class_probs(conf):
    conf = np.asarray(conf, dtype=float)
    return np.stack([conf, 1 - conf], 1)   # predicted class 0 with confidence conf >= 0.5


def test_ece_hand_computed():
    conf = [0.9] * 4 + [0.55] * 4 + [1.0] * 2
    correct = [1, 1, 1, 0] + [1, 0, 1, 0] + [1, 1]
    labels = np.where(np.array(correct) == 1, 0, 1)
    r = metrics.expected_calibration_error(_two_class_probs(conf), labels)
    # bins: 0.9 in (13/15, 14/15] acc .75; 0.55 in (8/15, 9/15] acc .5; 1.0 in (14/15, 1] acc 1.
    assert r.ece == pytest.approx(0.4 * 0.15 + 0.4 * 0.05 + 0.2 * 0.0, abs=1e-15)
    expected_counts = np.zeros(15, int)
    expected_counts[[13, 8, 14]] = [4, 4, 2]
    np.testing.assert_array_equal(r.bin_count, expected_counts)
    np.testing.assert_allclose(r.bin_accuracy[[13, 8, 14]], [0.75, 0.5, 1.0])
    np.testing.assert_allclose(r.bin_confidence[[13, 8, 14]], [0.9, 0.55, 1.0])
    assert np.isnan(r.bin_accuracy[0]) and np.isnan(r.bin_confidence[0])
    np.testing.assert_allclose(r.bin_lower, np.arange(15) / 15, atol=1e-15)
    np.testing.assert_allclose(r.bin_upper, np.arange(1, 16) / 15, atol=1e-15)
    assert r.num_examples == 10
    d = r.to_dict()
    assert d["ece"] == r.ece and d["bin_count"][13] == 4 and d["bin_accuracy"][0] is None


def test_ece_bins_are_lower_open_upper_closed():
    edges = np.linspace(0, 1, 16)
    conf = np.array([edges[10], edges[10] + 1e-9])   # exactly on the edge 10/15, then just above
    r = metrics.expected_calibration_error(_two_class_probs(conf), np.array([0, 0]))
    assert r.bin_count[9] == 1 and r.bin_count[10] == 1


def test_ece_adaptive_hand_computed():
    conf = [0.55, 0.6, 0.7, 0.8, 0.9, 0.95, 0.96, 0.97, 0.99, 1.0]
    correct = [0, 1, 0, 1, 1, 1, 1, 1, 1, 1]
    labels = np.where(np.array(correct) == 1, 0, 1)
    order = np.random.default_rng(0).permutation(10)   # input order must not matter
    r = metrics.expected_calibration_error(_two_class_probs(conf)[order], labels[order],
                                           num_bins=2, binning="adaptive")
    # equal-mass bins: the 5 lowest (mean conf .71, acc .6) and the 5 highest (.974, 1.0)
    assert r.ece == pytest.approx(0.5 * abs(0.71 - 0.6) + 0.5 * abs(0.974 - 1.0), abs=1e-12)
    np.testing.assert_array_equal(r.bin_count, [5, 5])
    np.testing.assert_allclose(r.bin_lower, [0.55, 0.95])
    np.testing.assert_allclose(r.bin_upper, [0.9, 1.0])


def test_ece_directions_hand_computed():
    # bin (13/15, 14/15]: conf .9, acc .5 (over by .4); bin (8/15, 9/15]: conf .55, acc 1 (under
    # by .45); bin (14/15, 1]: conf 1, acc 1 (neither)
    conf = [0.9] * 4 + [0.55] * 2 + [1.0] * 4
    correct = [1, 0, 1, 0] + [1, 1] + [1] * 4
    labels = np.where(np.array(correct) == 1, 0, 1)
    r = metrics.expected_calibration_error(_two_class_probs(conf), labels)
    assert r.overconfidence == pytest.approx(0.4 * 0.4, abs=1e-15)
    assert r.underconfidence == pytest.approx(0.2 * 0.45, abs=1e-15)
    assert r.ece == pytest.approx(0.16 + 0.09, abs=1e-15)
    d = r.to_dict()
    assert (d["overconfidence"], d["underconfidence"]) == (r.overconfidence, r.underconfidence)


@pytest.mark.parametrize("binning", ["equal_width", "adaptive"])
@pytest.mark.parametrize("seed", range(3))
def test_ece_directions_against_a_loop_over_bins(binning, seed):
    """Over- and underconfidence against a plain loop over the bins' members; they add up to
    the ECE, and a sharper (softer) copy of the predictions moves ECE into the over (under)
    part."""
    rng = np.random.default_rng(seed)
    n, k, num_bins = 3_000, 5, 10
    probs = _random_probs(rng, n, k, concentration=0.4)
    # labels drawn from the predictions: calibrated but for sampling noise, gaps of both signs
    labels = (rng.uniform(size=(n, 1)) > np.cumsum(probs, 1)).sum(1).clip(0, k - 1)
    r = metrics.expected_calibration_error(probs, labels, num_bins=num_bins, binning=binning)
    conf, correct = probs.max(1), probs.argmax(1) == labels
    if binning == "equal_width":
        members = [(conf > b / num_bins) & (conf <= (b + 1) / num_bins) for b in range(num_bins)]
    else:
        order = np.argsort(conf, kind="stable")
        members = [np.isin(np.arange(n), part) for part in np.array_split(order, num_bins)]
    gaps = [m.sum() / n * (conf[m].mean() - correct[m].mean()) for m in members if m.any()]
    assert r.overconfidence == pytest.approx(sum(g for g in gaps if g > 0), rel=1e-12)
    assert r.underconfidence == pytest.approx(-sum(g for g in gaps if g < 0), rel=1e-12)
    assert r.overconfidence + r.underconfidence == pytest.approx(r.ece, rel=1e-12)
    assert r.overconfidence > 0 and r.underconfidence > 0

    def tempered(t):
        logits_NxK = np.log(probs) / t
        e = np.exp(logits_NxK - logits_NxK.max(1, keepdims=True))
        return e / e.sum(1, keepdims=True)
    # random labels: accuracy about 1/k in every bin, far below every bin's confidence
    sharp = metrics.expected_calibration_error(tempered(0.5), rng.integers(0, k, n),
                                               num_bins=num_bins, binning=binning)
    assert sharp.underconfidence == 0.0 and sharp.overconfidence == pytest.approx(sharp.ece)
    # every prediction right: accuracy 1 in every bin, above every bin's confidence
    soft = metrics.expected_calibration_error(tempered(3.0), probs.argmax(1),
                                              num_bins=num_bins, binning=binning)
    assert soft.overconfidence == 0.0 and soft.underconfidence == pytest.approx(soft.ece)
    assert soft.ece > 0.1


@pytest.mark.parametrize("seed", range(3))
def test_classwise_ece_against_a_loop_over_classes_and_bins(seed):
    rng = np.random.default_rng(seed)
    n, k, num_bins = 2_000, 4, 10
    probs = _random_probs(rng, n, k, concentration=0.6)
    probs[:5] = np.eye(k)[rng.integers(0, k, 5)]   # exact 0s and 1s: the first and last bins
    labels = rng.integers(0, k, n)
    expected = 0.0
    for c in range(k):
        p, y = probs[:, c], (labels == c).astype(float)
        for b in range(num_bins):
            lower, upper = b / num_bins, (b + 1) / num_bins
            members = ((p > lower) | (b == 0)) & (p <= upper)
            if members.any():
                expected += members.sum() / n * abs(p[members].mean() - y[members].mean())
    got = metrics.classwise_calibration_error(probs, labels, num_bins=num_bins)
    assert got == pytest.approx(expected / k, rel=1e-12)
    # the mask drops rows; labels drawn from the predictions themselves are nearly calibrated
    mask = np.arange(n) >= 5
    assert metrics.classwise_calibration_error(probs, labels, num_bins, mask_N=mask) == \
        pytest.approx(metrics.classwise_calibration_error(probs[5:], labels[5:], num_bins))
    drawn = (rng.uniform(size=(n, 1)) > np.cumsum(probs, 1)).sum(1).clip(0, k - 1)
    assert metrics.classwise_calibration_error(probs, drawn, num_bins) < 0.3 * got
    with pytest.raises(ValueError, match="num_bins"):
        metrics.classwise_calibration_error(probs, labels, num_bins=0)


@pytest.mark.parametrize("binning", ["equal_width", "adaptive"])
def test_ece_near_zero_when_calibrated_and_large_when_not(binning):
    rng = np.random.default_rng(0)
    n, k = 200_000, 10
    conf = rng.uniform(0.1, 1.0, n)
    probs = np.repeat(((1 - conf) / (k - 1))[:, None], k, 1)
    predicted = rng.integers(0, k, n)
    probs[np.arange(n), predicted] = conf
    correct = rng.uniform(size=n) < conf          # labels drawn from the stated confidence
    labels = np.where(correct, predicted, (predicted + 1 + rng.integers(0, k - 1, n)) % k)
    r = metrics.expected_calibration_error(probs, labels, binning=binning)
    assert r.ece < 0.005
    overconfident = metrics.expected_calibration_error(probs, np.where(
        rng.uniform(size=n) < conf ** 2, predicted, (predicted + 1) % k), binning=binning)
    assert overconfident.ece > 0.1


# --------------------------------------------------------------------------------------------
# Ranking metrics vs sklearn
# --------------------------------------------------------------------------------------------
def _sk_fpr_at_tpr(y, s, tpr=0.95):
    fpr, tpr_curve, _ = skm.roc_curve(y, s, drop_intermediate=False)
    return fpr[tpr_curve >= tpr].min()


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("seed", range(10))
def test_ranking_metrics_match_sklearn(seed, tied):
    rng = np.random.default_rng(seed)
    y, s = _binary_problem(rng, int(rng.integers(5, 400)), tied)
    assert metrics.average_precision(y, s) == pytest.approx(
        skm.average_precision_score(y, s), rel=RTOL)
    assert metrics.auroc(y, s) == pytest.approx(skm.roc_auc_score(y, s), rel=RTOL)
    assert metrics.fpr_at_tpr(y, s) == pytest.approx(_sk_fpr_at_tpr(y, s), rel=RTOL)
    assert metrics.fpr_at_tpr(y, s, tpr=0.5) == pytest.approx(_sk_fpr_at_tpr(y, s, 0.5),
                                                              rel=RTOL)


def test_average_precision_is_stepwise_not_trapezoidal():
    y = np.array([1, 0, 1, 0, 0, 1])
    s = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4])
    ap = metrics.average_precision(y, s)
    # step-wise: (1/3)(1) + (1/3)(2/3) + (1/3)(1/2)
    assert ap == pytest.approx((1 + 2 / 3 + 1 / 2) / 3, rel=RTOL)
    precision, recall, _ = skm.precision_recall_curve(y, s)
    assert abs(ap - skm.auc(recall, precision)) > 1e-3


def test_ties_all_equal_scores():
    y = np.array([1, 0, 1, 1, 0, 0, 0, 1, 1, 0])
    s = np.ones(10)
    assert metrics.average_precision(y, s) == pytest.approx(0.5)
    assert metrics.auroc(y, s) == pytest.approx(0.5)
    assert metrics.fpr_at_tpr(y, s) == pytest.approx(1.0)


def test_infinite_scores_tie_correctly():
    y = np.array([1, 0, 1, 0])
    s = np.array([np.inf, np.inf, 0.0, -np.inf])
    assert metrics.auroc(y, s) == pytest.approx(skm.roc_auc_score(y, np.array([9, 9, 0, -9])))
    assert metrics.average_precision(y, s) == pytest.approx(
        skm.average_precision_score(y, np.array([9, 9, 0, -9])))


def test_fpr_at_tpr_hand_computed():
    # Sorted by score: + + - + - - + - ...; 4 positives, TPR >= 0.75 first at the 4th example.
    y = np.array([1, 1, 0, 1, 0, 0, 1, 0])
    s = np.arange(8, 0, -1).astype(float)
    assert metrics.fpr_at_tpr(y, s, tpr=0.75) == pytest.approx(1 / 4)
    assert metrics.fpr_at_tpr(y, s, tpr=0.95) == pytest.approx(3 / 4)


def test_perfect_separation_gives_one():
    y = np.array([1] * 20 + [0] * 30, bool)
    s = np.r_[np.linspace(5, 6, 20), np.linspace(0, 1, 30)]
    assert metrics.average_precision(y, s) == 1.0
    assert metrics.auroc(y, s) == 1.0
    assert metrics.fpr_at_tpr(y, s) == 0.0
    assert metrics.auroc(y, -s) == 0.0
    assert metrics.misclassification_detection(y, s) == {"aupr": 1.0, "auroc": 1.0}
    r = metrics.ood_detection(s[:20], s[20:])
    assert r == {"aupr_in": 1.0, "aupr_out": 1.0, "auroc": 1.0, "fpr95": 0.0}


@pytest.mark.parametrize("tied", [False, True])
def test_ood_detection_conventions_match_sklearn(tied):
    rng = np.random.default_rng(7)
    id_s = rng.integers(0, 5, 300).astype(float) if tied else rng.normal(1, 1, 300)
    ood_s = rng.integers(0, 4, 200).astype(float) if tied else rng.normal(0, 1, 200)
    r = metrics.ood_detection(id_s, ood_s)
    s = np.r_[id_s, ood_s]
    is_id = np.r_[np.ones(300), np.zeros(200)]
    assert r["aupr_in"] == pytest.approx(skm.average_precision_score(is_id, s), rel=RTOL)
    assert r["aupr_out"] == pytest.approx(skm.average_precision_score(1 - is_id, -s), rel=RTOL)
    assert r["auroc"] == pytest.approx(skm.roc_auc_score(is_id, s), rel=RTOL)
    assert r["auroc"] == pytest.approx(skm.roc_auc_score(1 - is_id, -s), rel=RTOL)
    assert r["fpr95"] == pytest.approx(_sk_fpr_at_tpr(is_id, s), rel=RTOL)
    assert r["aupr_in"] != pytest.approx(r["aupr_out"], rel=1e-3)


def test_misclassification_detection_correct_is_positive():
    rng = np.random.default_rng(3)
    correct = rng.uniform(size=500) < 0.8
    conf = rng.normal(size=500) + correct
    r = metrics.misclassification_detection(correct, conf)
    assert r["aupr"] == pytest.approx(skm.average_precision_score(correct, conf), rel=RTOL)
    assert r["auroc"] == pytest.approx(skm.roc_auc_score(correct, conf), rel=RTOL)
    assert r["aupr"] != pytest.approx(skm.average_precision_score(~correct, -conf), rel=1e-3)


def test_undefined_ranking_metrics_warn_and_return_nan():
    with pytest.warns(RuntimeWarning, match="undefined"):
        assert np.isnan(metrics.auroc(np.ones(5, bool), np.arange(5.0)))
    with pytest.warns(RuntimeWarning, match="undefined"):
        assert np.isnan(metrics.average_precision(np.zeros(5, bool), np.arange(5.0)))
    with pytest.warns(RuntimeWarning, match="undefined"):
        assert np.isnan(metrics.fpr_at_tpr(np.zeros(5, bool), np.arange(5.0)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert metrics.average_precision(np.ones(5, bool), np.arange(5.0)) == 1.0


# --------------------------------------------------------------------------------------------
# Padding + mask never changes a result
# --------------------------------------------------------------------------------------------
def _padding_mask(rng, n_real, n_pad):
    """A mask with n_pad False rows interleaved at random among n_real True rows."""
    mask = np.zeros(n_real + n_pad, bool)
    mask[rng.choice(n_real + n_pad, size=n_real, replace=False)] = True
    return mask


def _pad(x, mask, fill):
    """x placed at the True rows of mask (in order), `fill` in the padding rows."""
    out = np.full((mask.size,) + x.shape[1:], fill, dtype=np.result_type(x, type(fill)))
    out[mask] = x
    return out


@pytest.mark.parametrize("fill", [np.nan, 7.0])
def test_padding_with_mask_never_changes_a_result(fill):
    rng = np.random.default_rng(11)
    n, k = 257, 5
    probs = _random_probs(rng, n, k, 0.5)
    labels = rng.integers(0, k, n)
    mask = _padding_mask(rng, n, 13)
    pp = _pad(probs, mask, fill)
    lp = _pad(labels, mask, 99 if np.isnan(fill) else 0)
    for fn in (metrics.accuracy, metrics.nll, metrics.brier_score):
        assert fn(pp, lp, mask_N=mask) == fn(probs, labels)
    assert metrics.brier_score(pp, lp, squared=False, mask_N=mask) == metrics.brier_score(
        probs, labels, squared=False)
    for binning in ("equal_width", "adaptive"):
        a = metrics.expected_calibration_error(pp, lp, binning=binning, mask_N=mask)
        b = metrics.expected_calibration_error(probs, labels, binning=binning)
        assert a.ece == b.ece
        for field in ("bin_lower", "bin_upper", "bin_confidence", "bin_accuracy", "bin_count"):
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field))

    y, s = _binary_problem(rng, n, tied=True)
    mask = _padding_mask(rng, n, 40)
    y_pad, s_pad = _pad(y, mask, True), _pad(s, mask, fill)
    for fn in (metrics.average_precision, metrics.auroc, metrics.fpr_at_tpr):
        assert fn(y_pad, s_pad, mask_N=mask) == fn(y, s)
    assert metrics.misclassification_detection(y_pad, s_pad, mask_N=mask) == \
        metrics.misclassification_detection(y, s)
    id_s, ood_s = s[y], s[~y]
    id_mask, ood_mask = _padding_mask(rng, id_s.size, 9), _padding_mask(rng, ood_s.size, 31)
    padded = metrics.ood_detection(_pad(id_s, id_mask, fill), _pad(ood_s, ood_mask, fill),
                                   id_mask_N=id_mask, ood_mask_M=ood_mask)
    assert padded == metrics.ood_detection(id_s, ood_s)


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("probs, labels, match", [
    (np.full((3, 2), 0.5), np.array([0, 1]), "rows"),
    (np.full((3, 2), 0.5), np.array([0, 1, 2]), r"\[0, 2\)"),
    (np.full((3, 2), 0.5), np.eye(2)[[0, 1, 0]], "1-D"),
    (np.full((3, 2), 0.5), np.array([0.0, 1.0, 0.0]), "integer"),
    (np.array([[0.5, 0.5], [np.nan, 0.5], [0.5, 0.5]]), np.array([0, 1, 0]), "NaN"),
    (np.array([[2.0, 1.0], [0.5, 0.5], [0.5, 0.5]]), np.array([0, 1, 0]), r"\[0, 1\]"),
    (np.array([[0.3, 0.3], [0.5, 0.5], [0.5, 0.5]]), np.array([0, 1, 0]), "sum to 1"),
    (np.full(3, 0.5), np.array([0, 1, 0]), r"\(N, K\)"),
])
def test_invalid_probabilities_raise(probs, labels, match):
    with pytest.raises(ValueError, match=match):
        metrics.nll(probs, labels)


def test_invalid_ranking_inputs_raise():
    with pytest.raises(ValueError, match="shape"):
        metrics.auroc(np.array([1, 0, 1]), np.array([0.1, 0.2]))
    with pytest.raises(ValueError, match="NaN"):
        metrics.average_precision(np.array([1, 0]), np.array([np.nan, 0.2]))
    with pytest.raises(ValueError, match="0 and 1"):
        metrics.auroc(np.array([2, 0]), np.array([0.1, 0.2]))
    with pytest.raises(ValueError, match="boolean"):
        metrics.auroc(np.array([1, 0]), np.array([0.1, 0.2]), mask_N=np.array([1, 1]))
    with pytest.raises(ValueError, match="shape"):
        metrics.auroc(np.array([1, 0]), np.array([0.1, 0.2]), mask_N=np.array([True]))
    with pytest.raises(ValueError, match="has no examples"):
        metrics.auroc(np.array([1, 0]), np.array([0.1, 0.2]), mask_N=np.array([False, False]))
    with pytest.raises(ValueError, match="tpr"):
        metrics.fpr_at_tpr(np.array([1, 0]), np.array([0.1, 0.2]), tpr=0.0)
    with pytest.raises(ValueError, match="binning"):
        metrics.expected_calibration_error(np.full((2, 2), 0.5), np.array([0, 1]), binning="x")
    with pytest.raises(ValueError, match="at least one"):
        metrics.ood_detection(np.array([1.0]), np.array([]))
