"""SCOD (selective classification with OOD inputs in the pool, gedl_jax.evaluation.selective):
hand-made pools with answers worked out by hand, ties across the two sets, and the
in-distribution numbers when the OOD set is empty."""

import numpy as np
import pytest

from gedl_jax.evaluation import selective


def test_a_hand_made_pool():
    # Pool by decreasing score: 0.9 ID right, 0.7 OOD, 0.5 ID right, 0.3 ID wrong, 0.1 OOD.
    correct, id_scores, ood_scores = [True, True, False], [0.9, 0.5, 0.3], [0.7, 0.1]
    # Selective risks at coverages 1/5 .. 5/5: 0/1, 1/2, 1/3, 2/4, 3/5.
    risks = [0.0, 1 / 2, 1 / 3, 2 / 4, 3 / 5]
    assert selective.scod_aurc(correct, id_scores, ood_scores) == pytest.approx(
        np.mean(risks), abs=1e-15)
    assert selective.scod_risk_at_coverage(correct, id_scores, ood_scores, 0.4) == 0.5
    assert selective.scod_risk_at_coverage(correct, id_scores, ood_scores, 0.41) == \
        pytest.approx(1 / 3)
    m = selective.scod_metrics(correct, id_scores, ood_scores, coverages=(0.6,), risks=(0.0,))
    assert m["num_examples"] == 5 and m["num_ood"] == 2
    assert m["error_rate"] == pytest.approx(3 / 5)
    assert m["risk_at_coverage_0.6"] == pytest.approx(1 / 3)
    assert m["coverage_at_risk_0"] == pytest.approx(1 / 5)
    # Oracle: both right ID examples first, then three errors: 0, 0, 1/3, 2/4, 3/5.
    assert m["aurc_oracle"] == pytest.approx((1 / 3 + 2 / 4 + 3 / 5) / 5)
    assert m["e_aurc"] == pytest.approx(m["aurc"] - m["aurc_oracle"])


def test_an_ood_input_tied_with_an_id_example_is_accepted_with_it():
    # Scores 0.8 (ID right) and 0.8 (OOD) tie: one point at coverage 2/3 with risk 1/2;
    # then the ID error at 0.2: risk 2/3. AURC = (1/2 + 1/2 + 2/3) / 3 (the tied run counts
    # its risk at each of its coverages), whatever the order of the tied pair.
    expected = (0.5 + 0.5 + 2 / 3) / 3
    assert selective.scod_aurc([True, False], [0.8, 0.2], [0.8]) == pytest.approx(expected)
    assert selective.scod_aurc([False, True], [0.2, 0.8], [0.8]) == pytest.approx(expected)


def test_a_detector_that_rejects_every_ood_input_first_keeps_the_id_risks():
    rng = np.random.default_rng(0)
    correct = rng.random(100) < 0.8
    id_scores = rng.random(100) + 1.0
    ood_scores = rng.random(40)        # all below every ID score
    pool = selective.scod_metrics(correct, id_scores, ood_scores)
    alone = selective.selective_metrics(correct, id_scores)
    # Up to coverage 100/140 the pool's risks are the ID ones; beyond, the OOD inputs add
    # errors one by one: risk(n) = (E + n - 100) / n for n = 101 .. 140.
    e = int((~correct).sum())
    tail = sum((e + n - 100) / n for n in range(101, 141))
    assert pool["aurc"] == pytest.approx((alone["aurc"] * 100 + tail) / 140, abs=1e-12)


def test_without_ood_inputs_it_is_the_in_distribution_aurc():
    rng = np.random.default_rng(1)
    correct = rng.random(200) < 0.7
    scores = np.round(rng.random(200), 2)     # with ties
    assert selective.scod_aurc(correct, scores, []) == selective.aurc(correct, scores)
    pool = selective.scod_metrics(correct, scores, np.array([]))
    assert pool.pop("num_ood") == 0
    assert pool == selective.selective_metrics(correct, scores)


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="ood_scores_M"):
        selective.scod_aurc([True], [0.5], np.zeros((2, 2)))
    with pytest.raises(ValueError, match="NaN"):
        selective.scod_aurc([True], [0.5], [np.nan])
    with pytest.raises(ValueError, match="equal shape"):
        selective.scod_aurc([True, False], [0.5], [0.1])


def test_the_evaluation_reports_scod_for_every_score_and_ood_set():
    """`evaluate_predictions` puts each OOD set's SCOD metrics beside its detection, for every
    score, computed from the same predictions as `scod_metrics` over that pool; the results
    table shows them."""
    from gedl_jax.evaluation import evaluate_predictions, results_table
    from gedl_jax.evaluation.core import Predictions
    from gedl_jax.evaluation.sections import SCOD_COVERAGES

    rng = np.random.default_rng(4)

    def predictions(n, labelled):
        p = rng.dirichlet(np.ones(3), n)
        return Predictions(probs=p, labels=rng.integers(0, 3, n) if labelled else None,
                           scores={"mp": p.max(1), "neg_entropy": (p * np.log(p)).sum(1)})

    idd, ood = predictions(60, True), {"far": predictions(40, False)}
    res = evaluate_predictions(idd, ood)
    correct = idd.probs.argmax(1) == idd.labels
    for s in ("mp", "neg_entropy"):
        assert res["ood"]["far"]["scod"][s] == pytest.approx(selective.scod_metrics(
            correct, idd.scores[s], ood["far"].scores[s], SCOD_COVERAGES))
    assert res["ood"]["far"]["scod"]["mp"]["num_ood"] == 40
    table = results_table([dict(res, variant="m")], extra=True)
    assert "OOD inputs in the pool (SCOD)" in table and "| m | far | MP |" in table
