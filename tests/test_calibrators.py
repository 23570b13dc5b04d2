"""Vector / matrix scaling, Dirichlet calibration and isotonic regression
(gedl_jax.evaluation.calibration): the validation NLL never rises, a known miscalibration is
recovered, vector scaling with equal weights is temperature scaling, matrix scaling agrees with
an independent scipy fit of the same objective, isotonic regression with scikit-learn's
IsotonicRegression per class, and the ranking notes of the module docstring hold."""

import numpy as np
import pytest
from scipy import optimize, special
from sklearn.isotonic import IsotonicRegression

from gedl_jax.evaluation import calibration as cal
from gedl_jax.evaluation import metrics


def categorical_data(rng, n, k=4, sigma=2.0):
    """True logits z ~ N(0, sigma^2) (plus a class offset) and labels drawn from softmax(z)."""
    z = rng.normal(scale=sigma, size=(n, k)) + np.linspace(-0.5, 0.5, k)
    p = special.softmax(z, axis=1)
    labels = (rng.random((n, 1)) > np.cumsum(p, axis=1)).sum(axis=1)
    return z, np.minimum(labels, k - 1)


def nll(probs, labels):
    return -np.mean(np.log(probs[np.arange(labels.size), labels]))


@pytest.fixture(scope="module")
def overconfident():
    """Labels from softmax(z); the model reports logits 3 z (overconfident by T = 3)."""
    z, labels = categorical_data(np.random.default_rng(0), 6000)
    return z, labels, 3.0 * z


def test_the_validation_nll_never_rises(overconfident):
    _, labels, logits = overconfident
    rng = np.random.default_rng(1)
    for logits_, labels_ in [(logits, labels), (rng.normal(size=(50, 4)),
                                                rng.integers(0, 4, 50))]:
        probs = special.softmax(logits_, axis=1)
        before = nll(probs, labels_)
        fits = [(cal.fit_vector_scaling(logits_, labels_), lambda f: cal.apply_affine(logits_, f)),
                (cal.fit_matrix_scaling(logits_, labels_), lambda f: cal.apply_affine(logits_, f)),
                (cal.fit_dirichlet_calibration(probs, labels_),
                 lambda f: cal.apply_dirichlet_calibration(probs, f)),
                (cal.fit_isotonic(probs, labels_), lambda f: cal.apply_isotonic(probs, f))]
        for fit, apply in fits:
            assert fit.nll_before == pytest.approx(before, rel=1e-9)
            assert fit.nll_after == pytest.approx(metrics.nll(apply(fit), labels_), rel=1e-9)
            assert fit.nll_after <= fit.nll_before + 1e-12, type(fit).__name__


def test_a_temperature_of_three_is_recovered(overconfident):
    z, labels, logits = overconfident
    truth = special.softmax(z, axis=1)
    vector = cal.fit_vector_scaling(logits, labels)
    np.testing.assert_allclose(np.diag(vector.weight_KxK), 1 / 3, atol=0.03)
    np.testing.assert_allclose(vector.bias_K - vector.bias_K.mean(), 0.0, atol=0.1)
    matrix = cal.fit_matrix_scaling(logits, labels)
    np.testing.assert_allclose(matrix.weight_KxK, np.eye(4) / 3, atol=0.05)
    dirichlet = cal.fit_dirichlet_calibration(special.softmax(logits, axis=1), labels)
    # On log q = 3 z - logsumexp(3 z): W = I / 3 up to a per-column constant (a row shift).
    w = dirichlet.weight_KxK - dirichlet.weight_KxK.mean(axis=0, keepdims=True)
    np.testing.assert_allclose(w, np.eye(4) / 3 - 1 / 12, atol=0.05)
    calibrated = [cal.apply_affine(logits, vector), cal.apply_affine(logits, matrix),
                  cal.apply_dirichlet_calibration(special.softmax(logits, axis=1), dirichlet)]
    for probs in calibrated:
        assert np.mean(np.abs(probs - truth)) < 0.02
    # Isotonic is coarser (a step map per class): it moves most of the way to the truth.
    iso = cal.apply_isotonic(special.softmax(logits, axis=1),
                             cal.fit_isotonic(special.softmax(logits, axis=1), labels))
    before = np.mean(np.abs(special.softmax(logits, axis=1) - truth))
    assert np.mean(np.abs(iso - truth)) < 0.5 * before


def test_vector_scaling_with_equal_weights_is_temperature_scaling(overconfident):
    _, labels, logits = overconfident
    t = cal.fit_temperature(logits, labels).temperature
    equal = cal.AffineCalibrationFit(np.eye(4) / t, np.zeros(4), "vector", 0.0, 0.0, 1)
    np.testing.assert_allclose(cal.apply_affine(logits, equal), cal.apply_temperature(logits, t),
                               rtol=1e-12, atol=1e-300)


def test_matrix_scaling_agrees_with_an_independent_scipy_fit():
    rng = np.random.default_rng(2)
    z, labels = categorical_data(rng, 400, k=3)
    logits = z @ np.array([[2.0, 0.5, 0.0], [0.0, 1.5, 0.3], [0.2, 0.0, 2.5]]) + [0.3, 0, -0.3]
    lam, mu, k = 0.3, 0.1, 3

    def objective(theta):   # written from Kull et al. (2019), eq. of ODIR; no gradient given
        w, b = theta[:9].reshape(3, 3), theta[9:]
        log_p = special.log_softmax(logits @ w + b, axis=1)
        off = w[~np.eye(3, dtype=bool)]
        return (-log_p[np.arange(labels.size), labels].mean() + lam / (k * (k - 1)) * off @ off
                + mu / k * b @ b)

    ref = optimize.minimize(objective, np.r_[np.eye(3).ravel(), np.zeros(3)], method="BFGS",
                            options={"gtol": 1e-10})
    fit = cal.fit_matrix_scaling(logits, labels, l2_off_diagonal=lam, l2_bias=mu)
    ours = np.r_[fit.weight_KxK.ravel(), fit.bias_K]
    assert fit.converged
    assert objective(ours) == pytest.approx(ref.fun, abs=1e-9)
    np.testing.assert_allclose(ours, ref.x, atol=1e-4)


def test_isotonic_agrees_with_sklearn_per_class():
    rng = np.random.default_rng(3)
    z, labels = categorical_data(rng, 500, k=3)
    probs = special.softmax(2.0 * z, axis=1)
    probs[:40] = np.round(probs[:40], 1) / np.round(probs[:40], 1).sum(1, keepdims=True)  # ties
    test = special.softmax(rng.normal(scale=4.0, size=(200, 3)), axis=1)
    fit = cal.fit_isotonic(probs, labels)
    mapped = np.stack([IsotonicRegression(out_of_bounds="clip", y_min=0.0, y_max=1.0)
                       .fit(probs[:, k], labels == k).predict(test[:, k]) for k in range(3)],
                      axis=1)
    total = mapped.sum(axis=1, keepdims=True)
    expected = np.where(total > 0, mapped / np.where(total > 0, total, 1.0), 1 / 3)
    np.testing.assert_allclose(cal.apply_isotonic(test, fit), expected, atol=1e-12)


def test_the_ranking_notes_hold():
    # Temperature scaling keeps the argmax, not the order by max probability (K = 3).
    z = np.array([[2.0, 0.0, 0.0], [3.0, 2.9, -100.0]])
    at_1, at_10 = cal.apply_temperature(z, 1.0).max(1), cal.apply_temperature(z, 10.0).max(1)
    assert at_1[0] > at_1[1] and at_10[0] < at_10[1]
    # Vector scaling can change the predicted class.
    fit = cal.AffineCalibrationFit(np.eye(2), np.array([0.0, 2.0]), "vector", 0.0, 0.0, 1)
    assert cal.apply_affine(np.array([[1.0, 0.0]]), fit).argmax() == 1
    # Isotonic regression ties examples that differed.
    q = np.array([[0.9, 0.1], [0.8, 0.2], [0.7, 0.3], [0.6, 0.4]])
    out = cal.apply_isotonic(q, cal.fit_isotonic(q, np.array([0, 0, 1, 0])))
    assert out[0, 0] == out[1, 0] and q[0, 0] != q[1, 0]


def test_bad_inputs_raise():
    z = np.zeros((4, 3))
    labels = np.array([0, 1, 2, 0])
    with pytest.raises(ValueError, match="labels_N"):
        cal.fit_vector_scaling(z, np.array([0, 1, 3, 0]))
    with pytest.raises(ValueError, match="finite"):
        cal.fit_matrix_scaling(np.full((4, 3), np.nan), labels)
    with pytest.raises(ValueError, match="l2_off_diagonal"):
        cal.fit_matrix_scaling(z, labels, l2_off_diagonal=-1.0)
    with pytest.raises(ValueError, match="probs_NxK"):
        cal.fit_isotonic(np.full((4, 3), 2.0), labels)
    fit = cal.fit_vector_scaling(z, labels)
    with pytest.raises(ValueError, match="classes"):
        cal.apply_affine(np.zeros((2, 4)), fit)
    with pytest.raises(ValueError, match="Dirichlet"):
        cal.apply_dirichlet_calibration(np.full((2, 3), 1 / 3), fit)
    with pytest.raises(ValueError, match="apply_dirichlet_calibration"):
        cal.apply_affine(z, cal.fit_dirichlet_calibration(np.full((4, 3), 1 / 3), labels))


# ------------------------------------------------------------------ the calibrators side by side
def test_compare_calibrators_fits_on_validation_and_recovers_a_known_miscalibration(
        overconfident):
    """Fitted on one half, scored on the other: each parametric calibrator brings the test NLL
    to that of the true probabilities (the model is overconfident by T = 3), and the summary is
    the module's own `calibration_summary` plus the SmoothECE of `smooth_ece`."""
    from gedl_jax.evaluation import smooth_ece

    z, labels, logits = overconfident
    probs = special.softmax(logits, axis=1)
    val, test = slice(0, 3000), slice(3000, None)
    out = cal.compare_calibrators(probs[val], labels[val], probs[test], labels[test])
    assert list(out["after"]) == list(cal.COMPARED_CALIBRATORS)
    truth = nll(special.softmax(z[test], axis=1), labels[test])
    before = out["before"]
    assert before["nll"] == pytest.approx(nll(probs[test], labels[test]), rel=1e-9)
    assert before["ece"] == cal.calibration_summary(probs[test], labels[test])["ece"]
    assert before["ece_classwise"] == metrics.classwise_calibration_error(probs[test],
                                                                         labels[test])
    assert before["smooth_ece"] == smooth_ece.smooth_ece(
        *smooth_ece.top_label_confidences(probs[test], labels[test])).smooth_ece
    for name in ("temperature", "vector_scaling", "dirichlet"):
        assert out["after"][name]["nll"] < truth + 0.01, name
        assert out["after"][name]["smooth_ece"] < 0.5 * before["smooth_ece"], name
        assert out["after"][name]["ece_classwise"] < 0.5 * before["ece_classwise"], name
    assert out["after"]["isotonic"]["nll"] < before["nll"]
    assert out["after"]["temperature"]["keeps_predicted_class"] is True


def test_keeps_flags_follow_the_definition():
    same = np.array([[0.7, 0.3], [0.6, 0.4], [0.9, 0.1]])
    assert cal._same_order(same.max(1), same.max(1) ** 2)        # monotone map: kept
    assert not cal._same_order(np.array([0.7, 0.6]), np.array([0.6, 0.7]))
    assert not cal._same_order(np.array([0.7, 0.7]), np.array([0.6, 0.7]))  # a tie broken
    assert not cal._same_order(np.array([0.6, 0.7]), np.array([0.7, 0.7]))  # a tie made
    with pytest.raises(ValueError, match="unknown calibrator"):
        cal.compare_calibrators(same, [0, 0, 1], same, [0, 1, 0], names=("platt",))


def test_matrix_scaling_of_log_probabilities_is_dirichlet_calibration(overconfident):
    """Why `compare_calibrators` leaves matrix scaling out: on log-probabilities it fits the
    model and penalty of Dirichlet calibration."""
    _, labels, logits = overconfident
    probs = special.softmax(logits[:2000], axis=1)
    out = cal.compare_calibrators(probs, labels[:2000], probs, labels[:2000],
                                  names=("matrix_scaling", "dirichlet"))
    assert out["after"]["matrix_scaling"]["nll"] == pytest.approx(
        out["after"]["dirichlet"]["nll"], rel=1e-4)
