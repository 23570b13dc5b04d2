"""Post-hoc calibration (gedl_jax.evaluation.calibration): a known miscalibration is recovered
from validation data, validation NLL never rises, test ECE / NLL / Brier fall, and the fitted
calibrators keep what the module docstring says they keep (argmax, the ranking by u)."""

import doctest
import inspect

import dataclasses

import numpy as np
import pytest
from scipy import special, stats

from gedl_jax.evaluation import calibration as cal

from gedl_jax.evaluation import metrics as metrics_lib


def categorical_data(rng, n, k=10, sigma=2.0):
    """True logits z ~ N(0, sigma^2) and labels drawn from softmax(z): a calibrated model."""
    z = rng.normal(scale=sigma, size=(n, k))
    p = special.softmax(z, axis=1)
    labels = (rng.random((n, 1)) > np.cumsum(p, axis=1)).sum(axis=1)
    return z, np.minimum(labels, k - 1)


def evidential_data(rng, n, k=5):
    """True evidence e* (EDL: W = K, a = 1/K, alpha = e* + 1) and labels ~ Cat(alpha / S)."""
    e = rng.gamma(0.4, 6.0, size=(n, k)) * rng.gamma(2.0, 1.0, size=(n, 1))
    alpha = e + 1.0
    p = alpha / alpha.sum(1, keepdims=True)
    labels = (rng.random((n, 1)) > np.cumsum(p, axis=1)).sum(axis=1)
    return e, np.minimum(labels, k - 1)


def test_temperature_recovers_a_known_overconfidence():
    rng = np.random.default_rng(0)
    z_val, y_val = categorical_data(rng, 20000)
    z_test, y_test = categorical_data(rng, 20000)
    fit = cal.fit_temperature(3.0 * z_val, y_val)        # logits 3x too sharp
    assert 1.0 / fit.temperature == pytest.approx(1.0 / 3.0, rel=0.05)
    assert fit.nll_after <= fit.nll_before and fit.num_examples == 20000
    assert not fit.at_bound
    before = cal.apply_temperature(3.0 * z_test, 1.0)
    after = cal.apply_temperature(3.0 * z_test, fit)
    s_before, s_after = (cal.calibration_summary(p, y_test) for p in (before, after))
    assert s_after["accuracy"] == s_before["accuracy"]   # T never changes the argmax
    np.testing.assert_array_equal(after.argmax(1), before.argmax(1))
    assert s_after["nll"] < s_before["nll"]
    assert s_after["brier"] < s_before["brier"]
    assert s_after["ece"] < 0.5 * s_before["ece"] and s_after["ece"] < 0.02
    # A calibrated model needs no temperature.
    assert cal.fit_temperature(z_val, y_val).temperature == pytest.approx(1.0, rel=0.05)


def test_temperature_on_probabilities_equals_on_logits():
    """softmax(log p / T) renormalises p^(1/T): the same fit and the same outputs as on the
    logits that produced p."""
    rng = np.random.default_rng(1)
    z, y = categorical_data(rng, 3000, k=4)
    probs = special.softmax(3.0 * z, axis=1)
    fit_logits = cal.fit_temperature(3.0 * z, y)
    fit_probs = cal.fit_temperature(cal.probs_as_logits(probs), y)
    assert fit_probs.temperature == pytest.approx(fit_logits.temperature, rel=1e-6)
    t = fit_probs.temperature
    want = probs ** (1 / t) / np.sum(probs ** (1 / t), axis=1, keepdims=True)
    np.testing.assert_allclose(cal.apply_temperature(cal.probs_as_logits(probs), t), want,
                               rtol=1e-10, atol=1e-300)


def test_temperature_nll_is_minimal_against_a_dense_scan():
    rng = np.random.default_rng(2)
    z, y = categorical_data(rng, 500, k=3)
    fit = cal.fit_temperature(1.7 * z, y)
    ts = np.exp(np.linspace(np.log(0.2), np.log(20), 4001))
    nlls = [-np.mean(np.log(cal.apply_temperature(1.7 * z, t)[np.arange(500), y])) for t in ts]
    assert fit.nll_after <= min(nlls) + 1e-12
    assert fit.nll_after == pytest.approx(
        -np.mean(np.log(cal.apply_temperature(1.7 * z, fit)[np.arange(500), y])), abs=1e-14)


def test_evidence_scale_recovers_a_known_overconfidence():
    rng = np.random.default_rng(3)
    k = 5
    e_val, y_val = evidential_data(rng, 20000, k)
    e_test, y_test = evidential_data(rng, 20000, k)
    fit = cal.fit_evidence_scale(3.0 * e_val, k, y_val)  # evidence 3x too large
    assert fit.scale == pytest.approx(1.0 / 3.0, rel=0.1)
    assert fit.nll_after <= fit.nll_before and not fit.at_bound
    before = cal.apply_evidence_scale(3.0 * e_test, k, 1.0)
    after = cal.apply_evidence_scale(3.0 * e_test, k, fit)
    np.testing.assert_allclose(before, 3.0 * e_test + 1.0)
    s_before, s_after = (cal.calibration_summary(a / a.sum(1, keepdims=True), y_test)
                         for a in (before, after))
    assert s_after["nll"] < s_before["nll"] and s_after["ece"] < 0.5 * s_before["ece"]
    assert s_after["brier"] < s_before["brier"]
    # argmax (uniform base rate) and the ranking by u = W / S are preserved exactly.
    np.testing.assert_array_equal(after.argmax(1), (3.0 * e_test).argmax(1))
    u_before, u_after = k / before.sum(1), k / after.sum(1)
    np.testing.assert_array_equal(stats.rankdata(u_before), stats.rankdata(u_after))
    assert np.all(u_after >= u_before)   # s < 1 raises every uncertainty mass


def test_evidence_scale_with_per_example_prior_strength():
    """GEDL-like: W differs per example; the fit uses each example's own W."""
    rng = np.random.default_rng(4)
    e, y = evidential_data(rng, 5000, 4)
    w = rng.uniform(1.0, 8.0, size=5000)
    fit = cal.fit_evidence_scale(e, w, y)
    s = np.exp(np.linspace(np.log(1e-2), np.log(1e2), 2001))
    rows = np.arange(5000)

    def nll(x):
        alpha = x * e + w[:, None] / 4
        return -np.mean(np.log(alpha[rows, y] / alpha.sum(1)))

    assert fit.nll_after <= min(nll(x) for x in s) + 1e-12
    alpha = cal.apply_evidence_scale(e, w, fit)
    u = w / alpha.sum(1)
    np.testing.assert_array_equal(stats.rankdata(u), stats.rankdata(w / (e.sum(1) + w)))


def test_evidence_scale_finds_a_large_scale_and_says_when_the_prior_is_best_dropped():
    """Evidence tiny beside W (a network trained under a strong prior) needs s in the
    thousands, which the default search reaches; where every validation example is right, the
    NLL falls all the way to p = e / sum e, and the warning says so."""
    e = 1e-4 * np.array([[9.0, 0.0], [0.0, 9.0], [9.0, 0.0], [9.0, 0.0]])
    fit = cal.fit_evidence_scale(e, 2.0, np.array([0, 1, 0, 1]))   # p = 3/4 at s = 2/9 * 1e4
    assert fit.scale == pytest.approx(2e4 / 9, rel=1e-6) and not fit.at_bound
    with pytest.warns(RuntimeWarning, match="prior's weight goes to 0"):
        at_top = cal.fit_evidence_scale(e[:2] + 1e-6, 2.0, np.array([0, 1]))
    assert at_top.at_bound and at_top.scale == pytest.approx(1e6)
    with pytest.warns(RuntimeWarning, match=r"bound \[0.001, 1000\]: the validation NLL"):
        cal.fit_evidence_scale(e, 2.0, np.array([0, 1, 0, 1]), bounds=(1e-3, 1e3))
    with pytest.warns(RuntimeWarning, match=r"bound \[1, 1000\]; widen"):   # at the lower one
        cal.fit_evidence_scale(e * 1e4, 2.0, np.array([0, 1, 0, 1]), bounds=(1.0, 1e3))


def test_documented_non_preservations():
    # A non-uniform base rate: the evidence scale can change the predicted class.
    e, w, a = np.array([[1.0, 0.0]]), 2.0, np.array([0.2, 0.8])
    assert cal.apply_evidence_scale(e, w, 1.0, a).argmax() == 1
    assert cal.apply_evidence_scale(e, w, 10.0, a).argmax() == 0
    # A temperature on pre-activation logits (exp activation) reorders examples by E.
    z = np.array([[2.0, 2.0], [3.0, 0.0]])
    e1, e4 = np.exp(z).sum(1), np.exp(z / 4).sum(1)
    assert e1[0] < e1[1] and e4[0] > e4[1]


def test_fit_reads_validation_only_and_apply_takes_no_labels():
    fit_params = list(inspect.signature(cal.fit_temperature).parameters)
    assert fit_params == ["logits_NxK", "labels_N", "bounds"]
    assert list(inspect.signature(cal.fit_evidence_scale).parameters) == \
        ["evidence_NxK", "prior_strength_N", "labels_N", "base_rate_K", "bounds"]
    for apply in (cal.apply_temperature, cal.apply_evidence_scale):
        assert not any("label" in p for p in inspect.signature(apply).parameters)
    # The fit is a frozen value: applying it to other data cannot change it.
    rng = np.random.default_rng(5)
    z, y = categorical_data(rng, 300, k=3)
    fit = cal.fit_temperature(z, y)
    cal.apply_temperature(rng.normal(size=(50, 3)), fit)
    assert fit == cal.fit_temperature(z, y)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fit.temperature = 2.0


def test_summary_agrees_with_gedl_metrics():
    rng = np.random.default_rng(6)
    z, y = categorical_data(rng, 2000, k=6)
    p = special.softmax(2.5 * z, axis=1)
    s = cal.calibration_summary(p, y)
    assert s["nll"] == pytest.approx(metrics_lib.nll(p, y), abs=1e-12)
    assert s["brier"] == pytest.approx(metrics_lib.brier_score(p, y), abs=1e-12)
    assert s["ece"] == pytest.approx(metrics_lib.expected_calibration_error(p, y).ece, abs=1e-12)
    assert s["accuracy"] == pytest.approx(metrics_lib.accuracy(p, y), abs=0)


def test_bounds_warning_and_input_checks():
    with pytest.warns(RuntimeWarning, match="bound"):
        fit = cal.fit_temperature(np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([0, 1]))
    assert fit.at_bound and fit.temperature == pytest.approx(0.01)
    with pytest.raises(ValueError, match="finite"):
        cal.fit_temperature(np.array([[-np.inf, 0.0]]), np.array([0]))
    with pytest.raises(ValueError, match="labels_N"):
        cal.fit_temperature(np.zeros((2, 2)), np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match="> 0"):
        cal.apply_temperature(np.zeros((1, 2)), 0.0)
    with pytest.raises(ValueError, match="evidence_NxK"):
        cal.fit_evidence_scale(-np.ones((1, 2)), 2.0, np.array([0]))
    with pytest.raises(ValueError, match="base_rate_K"):
        cal.apply_evidence_scale(np.ones((1, 2)), 2.0, 1.0, np.array([0.5, 0.6]))
    alpha = cal.apply_evidence_scale(np.array([[3.0, 0.5, 0.0]]), np.array([1.5]), 1.0)
    np.testing.assert_allclose(cal.evidence_from_alpha(alpha, np.array([1.5])),
                               [[3.0, 0.5, 0.0]], atol=1e-15)


def test_doctests():
    result = doctest.testmod(cal, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
