"""Selective prediction (gedl_jax.evaluation.selective) against float64 brute force written from
the definitions (a loop over thresholds / coverage points), hand-computed examples with ties, and
the closed-form oracle AURC r + (1 - r) ln(1 - r) of Geifman et al."""

import doctest
import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from gedl_jax.evaluation import selective


# ------------------------------------------------------------------ brute force, from definitions
def brute_curve(correct, scores):
    """[(coverage, selective risk, generalized risk)] for each distinct threshold, high to low."""
    n = len(scores)
    out = []
    for t in sorted(set(scores.tolist()), reverse=True):
        accepted = scores >= t
        errors = int(np.sum(accepted & ~correct))
        out.append((accepted.sum() / n, errors / accepted.sum(), errors / n))
    return out


def brute_areas(correct, scores):
    """(AURC, AUGRC): means over the N coverage points n/N of the risk of {s >= s_(n)}."""
    n = len(scores)
    desc = np.sort(scores)[::-1]
    sel, gen = [], []
    for k in range(1, n + 1):
        accepted = scores >= desc[k - 1]   # ties with the k-th largest are accepted together
        errors = np.sum(accepted & ~correct)
        sel.append(errors / accepted.sum())
        gen.append(errors / n)
    return float(np.mean(sel)), float(np.mean(gen))


def brute_oracle_aurc(correct):
    """AURC of the ordering with all correct first, as exact fractions."""
    n, e = len(correct), int(np.sum(~correct))
    ordered = [True] * (n - e) + [False] * e
    errors, total = 0, Fraction(0)
    for k, c in enumerate(ordered, start=1):
        errors += not c
        total += Fraction(errors, k)
    return float(total / n)


def brute_risk_at_coverage(correct, scores, c):
    for cov, risk, _ in brute_curve(correct, scores):
        if cov >= c:
            return risk
    raise AssertionError


def brute_coverage_at_risk(correct, scores, r):
    good = [cov for cov, risk, _ in brute_curve(correct, scores) if risk <= r]
    return max(good) if good else 0.0


def random_case(rng, n, num_levels=None):
    """Scores with many ties when num_levels is small; errors more likely at low scores."""
    if num_levels is None:
        scores = rng.normal(size=n)
    else:
        scores = rng.integers(0, num_levels, size=n).astype(np.float64) / num_levels
    p_correct = 1 / (1 + np.exp(-3 * (scores - scores.mean())))
    correct = rng.random(n) < p_correct
    return correct, scores


CASES = [(n, levels, seed) for n, levels, seed in itertools.product(
    (1, 2, 7, 40, 333), (None, 2, 5, 30), (0, 1, 2))]


@pytest.mark.parametrize("n,levels,seed", CASES)
def test_against_brute_force(n, levels, seed):
    rng = np.random.default_rng(seed + 1000 * n)
    correct, scores = random_case(rng, n, levels)
    m = selective.selective_metrics(correct, scores)
    want_aurc, want_augrc = brute_areas(correct, scores)
    assert m["aurc"] == pytest.approx(want_aurc, abs=1e-12)
    assert m["augrc"] == pytest.approx(want_augrc, abs=1e-12)
    assert m["aurc_oracle"] == pytest.approx(brute_oracle_aurc(correct), abs=1e-12)
    assert m["e_aurc"] == pytest.approx(want_aurc - brute_oracle_aurc(correct), abs=1e-12)
    assert m["e_aurc"] >= -1e-15
    assert m["error_rate"] == pytest.approx(np.mean(~correct), abs=0)
    for c in selective.COVERAGE_LEVELS:
        assert m[f"risk_at_coverage_{c:g}"] == brute_risk_at_coverage(correct, scores, c)
    for r in selective.RISK_LEVELS + (0.0, 0.2, 1.0):
        assert selective.coverage_at_risk(correct, scores, r) == \
            brute_coverage_at_risk(correct, scores, r)
    curve = selective.risk_coverage_curve(correct, scores)
    want = np.array(brute_curve(correct, scores))
    np.testing.assert_allclose(curve.coverage, want[:, 0], rtol=0, atol=1e-15)
    np.testing.assert_allclose(curve.selective_risk, want[:, 1], rtol=0, atol=1e-15)
    np.testing.assert_allclose(curve.generalized_risk, want[:, 2], rtol=0, atol=1e-15)
    assert len(curve.thresholds) == len(set(scores.tolist()))   # one point per distinct score


def test_hand_computed_with_ties():
    # scores  0.9  0.8  0.8  0.8  0.5  0.5
    # correct  T    T    F    T    F    T
    # points: {0.9}: 1/6, risk 0; {>=0.8}: 4/6, risk 1/4; all: 6/6, risk 2/6.
    correct = np.array([True, True, False, True, False, True])
    scores = np.array([0.9, 0.8, 0.8, 0.8, 0.5, 0.5])
    curve = selective.risk_coverage_curve(correct, scores)
    assert curve.num_accepted.tolist() == [1, 4, 6]
    assert curve.num_errors.tolist() == [0, 1, 2]
    assert curve.thresholds.tolist() == [0.9, 0.8, 0.5]
    # AURC: coverage points 1..6 take risks 0, 1/4, 1/4, 1/4, 1/3, 1/3.
    want_aurc = (0 + 3 * 0.25 + 2 / 3) / 6
    assert selective.aurc(correct, scores) == pytest.approx(want_aurc, abs=1e-15)
    # AUGRC: generalized risks 0, 1/6 x3, 2/6 x2.
    assert selective.augrc(correct, scores) == pytest.approx((3 / 6 + 4 / 6) / 6, abs=1e-15)
    # oracle: 4 correct then 2 errors: risks 0,0,0,0,1/5,2/6.
    assert selective.oracle_aurc(2, 6) == pytest.approx((1 / 5 + 2 / 6) / 6, abs=1e-15)
    m = selective.selective_metrics(correct, scores)
    assert m["risk_at_coverage_0.8"] == pytest.approx(1 / 3)   # 4/6 < 0.8: next point, all
    assert selective.risk_at_coverage(correct, scores, 0.5) == 0.25
    assert selective.risk_at_coverage(correct, scores, 1 / 6) == 0.0
    assert selective.coverage_at_risk(correct, scores, 0.25) == pytest.approx(4 / 6)
    assert selective.coverage_at_risk(correct, scores, 0.2) == pytest.approx(1 / 6)
    # The order of tied examples does not matter.
    perm = np.array([0, 3, 2, 1, 5, 4])
    assert selective.selective_metrics(correct[perm], scores[perm]) == m


def test_no_ties_is_the_mean_of_running_error_rates():
    """Without ties AURC is the Geifman / Moon et al. `coverage_risk` mean exactly."""
    rng = np.random.default_rng(3)
    correct, scores = random_case(rng, 500)
    order = np.argsort(-scores)
    running = np.cumsum(~correct[order]) / np.arange(1, 501)
    assert selective.aurc(correct, scores) == pytest.approx(running.mean(), abs=1e-15)


def test_oracle_score_and_anti_oracle():
    rng = np.random.default_rng(4)
    correct = rng.random(300) < 0.8
    oracle_score = correct + rng.random(300) * 0.5      # every correct above every error
    m = selective.selective_metrics(correct, oracle_score)
    assert m["e_aurc"] == pytest.approx(0.0, abs=1e-15)
    assert selective.coverage_at_risk(correct, oracle_score, 0.0) == \
        pytest.approx(np.mean(correct))
    worst = selective.selective_metrics(correct, -oracle_score)
    assert worst["aurc"] > m["aurc"]
    assert selective.risk_at_coverage(correct, -oracle_score, 0.1) == 1.0   # errors come first
    assert worst["coverage_at_risk_0.05"] == 0.0                   # no point qualifies
    # A constant score: one point, both areas equal the error rate r.
    const = selective.selective_metrics(correct, np.zeros(300))
    r = np.mean(~correct)
    assert const["aurc"] == pytest.approx(r) and const["augrc"] == pytest.approx(r)


@pytest.mark.parametrize("n", [1, 2, 3, 10, 101, 1000, 12345])
def test_oracle_aurc_closed_form_identity(n):
    """The exact N-point oracle AURC is r + (1-r) ln(1-r) (Geifman et al. 2019) up to
    0 <= exact - closed <= r / (2N); it converges to the closed form."""
    for e in sorted({0, 1, n // 7, n // 3, n // 2, n - 1, n}):
        r = e / n
        exact = selective.oracle_aurc(e, n)
        closed = selective.oracle_aurc_closed_form(r)
        assert -1e-15 <= exact - closed <= r / (2 * n) + 1e-15, (n, e, exact, closed)
    assert selective.oracle_aurc_closed_form(0.0) == 0.0
    assert selective.oracle_aurc_closed_form(1.0) == 1.0


def test_published_closed_form_values():
    """Values of r + (1 - r) ln(1 - r) at the error rates of common CIFAR-10 models
    (independent arithmetic with math.log)."""
    for r in (0.05, 0.1, 0.25):
        assert selective.oracle_aurc_closed_form(r) == pytest.approx(r + (1 - r) * math.log(1 - r),
                                                                      rel=1e-14)
    # 5% error: 0.05 + 0.95 ln 0.95 = 0.00127137...
    assert selective.oracle_aurc_closed_form(0.05) == pytest.approx(0.00127137, abs=1e-8)


def test_augrc_oracle_and_trapezoid_relation():
    """Tie-free: AUGRC(oracle) = E(E+1)/(2N^2) = r^2/2 + r/(2N) (fd-shifts' trapezoidal oracle is
    r^2/2), and the trapezoid from (0, 0) is AUGRC - r/(2N) for any tie-free score."""
    rng = np.random.default_rng(5)
    n = 400
    correct = rng.random(n) < 0.7
    e = int(np.sum(~correct))
    r = e / n
    oracle_score = correct + rng.random(n) * 0.5
    assert selective.augrc(correct, oracle_score) == pytest.approx(e * (e + 1) / (2 * n * n))
    scores = rng.normal(size=n)
    curve = selective.risk_coverage_curve(correct, scores)
    cov = np.r_[0.0, curve.coverage]
    gen = np.r_[0.0, curve.generalized_risk]
    trapezoid = float(np.sum(np.diff(cov) * (gen[1:] + gen[:-1]) / 2))
    assert selective.augrc(correct, scores) - trapezoid == pytest.approx(r / (2 * n), abs=1e-15)


def test_all_correct_all_wrong_and_inputs():
    assert selective.selective_metrics([True, True], [1.0, 0.0])["aurc"] == 0.0
    all_wrong = selective.selective_metrics([0, 0, 0], [3, 2, 1])
    assert all_wrong["aurc"] == 1.0 and all_wrong["e_aurc"] == 0.0
    assert all_wrong["coverage_at_risk_0.05"] == 0.0
    inf_ties = selective.risk_coverage_curve([True, False, True], [np.inf, np.inf, -np.inf])
    assert inf_ties.num_accepted.tolist() == [2, 3]
    with pytest.raises(ValueError, match="NaN"):
        selective.aurc([True], [np.nan])
    with pytest.raises(ValueError, match="0 and 1"):
        selective.aurc([2], [0.0])
    with pytest.raises(ValueError, match="equal shape"):
        selective.aurc([True, False], [0.0])
    with pytest.raises(ValueError, match="has no examples"):
        selective.aurc([], [])
    with pytest.raises(ValueError, match="coverage"):
        selective.risk_at_coverage([True], [1.0], 0.0)


def test_doctests():
    result = doctest.testmod(selective, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
