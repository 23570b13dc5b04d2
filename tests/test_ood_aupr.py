"""OpenOOD's trapezoidal AUPR (gedl_jax.evaluation.ood_aupr) equals sklearn.metrics.auc of
sklearn's precision_recall_curve (ties included), agrees with average precision on a separable
case and differs from it by a hand-computed amount otherwise."""

import doctest

import numpy as np
import pytest

from gedl_jax.evaluation import ood_aupr

from gedl_jax.evaluation import metrics as metrics_lib


def test_hand_example_differs_from_average_precision_by_one_24th():
    # ID 0.9, 0.7; OOD 0.8. Thresholds high to low: (R, P) = (1/2, 1), (1/2, 1/2), (1, 2/3).
    # Average precision: 1/2 * 1 + 0 + 1/2 * 2/3 = 5/6.
    # Trapezoid from (0, 1): 1/2 * (1 + 1)/2 + 0 + 1/2 * (1/2 + 2/3)/2 = 1/2 + 7/24 = 19/24.
    id_s, ood_s = np.array([0.9, 0.7]), np.array([0.8])
    ap = metrics_lib.ood_detection(id_s, ood_s)["aupr_in"]
    assert ap == pytest.approx(5 / 6, abs=1e-15)
    trap = ood_aupr.aupr_trapezoidal(id_s, ood_s)
    assert trap == pytest.approx(19 / 24, abs=1e-15)
    assert ap - trap == pytest.approx(1 / 24, abs=1e-15)
    # AUPR-Out: OOD positive, negated scores -0.7 (ID), -0.8 (OOD), -0.9 (ID):
    # (R, P) = (0, 0), (1, 1/2), (1, 1/3). Trapezoid from (0, 1): 0 + 1 * (0 + 1/2)/2 = 1/4;
    # average precision: 1 * 1/2.
    assert ood_aupr.aupr_trapezoidal(id_s, ood_s, positive="out") == pytest.approx(0.25)
    assert metrics_lib.ood_detection(id_s, ood_s)["aupr_out"] == pytest.approx(0.5)


def test_hand_example_tie_at_the_top_starts_from_precision_one():
    # ID 1.0, 0.5; OOD 1.0: the first threshold holds one ID and one OOD: (R, P) = (1/2, 1/2),
    # then (1, 2/3). Trapezoid from sklearn's (0, 1): 1/2 (1 + 1/2)/2 + 1/2 (1/2 + 2/3)/2
    # = 3/8 + 7/24 = 2/3; average precision: 1/2 * 1/2 + 1/2 * 2/3 = 7/12.
    id_s, ood_s = np.array([1.0, 0.5]), np.array([1.0])
    assert ood_aupr.aupr_trapezoidal(id_s, ood_s) == pytest.approx(2 / 3, abs=1e-15)
    assert metrics_lib.ood_detection(id_s, ood_s)["aupr_in"] == pytest.approx(7 / 12, abs=1e-15)
    sk = pytest.importorskip("sklearn.metrics")
    p, r, _ = sk.precision_recall_curve([1, 1, 0], [1.0, 0.5, 1.0])
    assert sk.auc(r, p) == pytest.approx(2 / 3, abs=1e-15)


def test_separable_case_agrees_with_average_precision():
    rng = np.random.default_rng(0)
    id_s, ood_s = rng.random(50) + 2.0, rng.random(70)
    d = ood_aupr.ood_aupr_trapezoidal(id_s, ood_s)
    ap = metrics_lib.ood_detection(id_s, ood_s)
    assert d["aupr_in_trapezoidal"] == ap["aupr_in"] == 1.0
    assert d["aupr_out_trapezoidal"] == ap["aupr_out"] == 1.0


@pytest.mark.parametrize("seed,levels", [(0, None), (1, 4), (2, 20), (3, None)])
def test_equals_sklearn_auc_of_precision_recall_curve(seed, levels):
    sk = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(seed)
    id_s, ood_s = rng.normal(1.0, 1.0, 300), rng.normal(0.0, 1.0, 200)
    if levels:
        id_s, ood_s = np.round(id_s * levels) / levels, np.round(ood_s * levels) / levels
    conf = np.r_[id_s, ood_s]
    ind = np.r_[np.ones(300, int), np.zeros(200, int)]
    # OpenOOD v1.5 metrics.auc(): AUPR-In and AUPR-Out (with 1 - conf).
    p_in, r_in, _ = sk.precision_recall_curve(ind, conf)
    p_out, r_out, _ = sk.precision_recall_curve(1 - ind, 1 - conf)
    got = ood_aupr.ood_aupr_trapezoidal(id_s, ood_s)
    assert got["aupr_in_trapezoidal"] == pytest.approx(sk.auc(r_in, p_in), abs=1e-12)
    assert got["aupr_out_trapezoidal"] == pytest.approx(sk.auc(r_out, p_out), abs=1e-12)
    assert got["aupr_in_trapezoidal"] != pytest.approx(metrics_lib.ood_detection(
        id_s, ood_s)["aupr_in"], abs=1e-6)


def test_header_and_inputs():
    assert ood_aupr.AUPR_TRAPEZOIDAL_HEADER == "AUPR (trapezoidal, OpenOOD)"
    with pytest.raises(ValueError, match="positive"):
        ood_aupr.aupr_trapezoidal([1.0], [0.0], positive="ood")
    with pytest.raises(ValueError, match="NaN"):
        ood_aupr.aupr_trapezoidal([np.nan], [0.0])
    with pytest.raises(ValueError, match="id_scores_N has no examples"):
        ood_aupr.aupr_trapezoidal([], [0.0])
    with pytest.warns(RuntimeWarning, match="undefined"):
        assert np.isnan(ood_aupr.trapezoidal_pr_area(np.array([False, False]), [1.0, 0.0]))


def test_doctests():
    result = doctest.testmod(ood_aupr, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
