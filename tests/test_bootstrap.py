"""Bootstrap intervals (`gedl_jax.evaluation.bootstrap`): each replicate's value equals the
metric of `evaluation.metrics` on the explicitly resampled arrays (ties and infinite scores
included); the intervals cover known values at their level on simulated data; they agree with
scipy.stats.bootstrap's percentile intervals; draws are seeded per set; and the section reaches
the results, the tables and the command line."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import warnings
import zlib

import numpy as np
import pytest
from scipy import stats
from training_fixtures import REPO, TINY_FIELDS, subprocess_env, write_tiny_mnist

from gedl_jax import config as config_lib
from gedl_jax import configs, train
from gedl_jax.evaluation import bootstrap, core, metrics, report
from compile_mode import fast_compilation


def _rows(n, samples, seed, stream):
    return np.stack(list(bootstrap.resample_indices(n, samples, seed, stream)))


@pytest.mark.parametrize("ties", [False, True])
def test_each_replicate_is_the_metric_of_the_resampled_arrays(ties):
    rng = np.random.default_rng(3)
    n, m, k = 160, 90, 4
    id_scores = rng.normal(0.8, 1.0, n)
    ood_scores = rng.normal(0.0, 1.0, m)
    if ties:   # few distinct values, ties across the sets, and infinite scores
        id_scores, ood_scores = np.round(id_scores), np.round(ood_scores)
        id_scores[:3], ood_scores[:2] = np.inf, -np.inf
    probs = rng.dirichlet(np.full(k, 0.7), n)
    labels = rng.integers(0, k, n)
    id_draws, ood_draws = _rows(n, 40, 5, "id"), _rows(m, 40, 5, "ood/x")
    detection = bootstrap.detection_replicates(id_scores, ood_scores, id_draws, ood_draws)
    confidence = np.round(probs.max(1), 1) if ties else probs.max(1)
    replicates = bootstrap.id_replicates(probs, labels, {"mp": confidence}, id_draws)
    for b in range(40):
        want = metrics.ood_detection(id_scores[id_draws[b]], ood_scores[ood_draws[b]])
        for key, value in want.items():
            assert detection[key][b] == value, (key, b)
        p, y = probs[id_draws[b]], labels[id_draws[b]]
        calibration = metrics.expected_calibration_error(p, y)
        want_id = {"accuracy": metrics.accuracy(p, y), "nll": metrics.nll(p, y),
                   "brier": metrics.brier_score(p, y), "ece": calibration.ece,
                   "ece_overconfidence": calibration.overconfidence,
                   "ece_underconfidence": calibration.underconfidence,
                   "ece_classwise": metrics.classwise_calibration_error(p, y)}
        assert set(want_id) == set(bootstrap.ID_KEYS)
        for key, value in want_id.items():
            assert replicates[key][b] == pytest.approx(value, rel=1e-12, abs=1e-15), (key, b)
        mis = metrics.misclassification_detection(p.argmax(1) == y, confidence[id_draws[b]])
        for key, value in mis.items():
            assert replicates["misclassification"]["mp"][key][b] == value, (key, b)


def test_intervals_cover_known_values_at_their_level():
    """Scores N(1, 1) in distribution and N(0, 1) out: AUROC = Phi(1 / sqrt 2); predictions
    correct with probability 0.7: accuracy 0.7. Over 120 simulated test sets the 90 % intervals
    must cover both about 90 % of the time (binomial: 108 expected, sd 3.3; a swapped tail or a
    shared draw for both sets falls far outside)."""
    truth_auroc = stats.norm.cdf(1 / np.sqrt(2))
    covered_auroc = covered_accuracy = 0
    rng = np.random.default_rng(11)
    for trial in range(120):
        n, m = 150, 120
        labels = rng.integers(0, 3, n)
        right = rng.random(n) < 0.7
        predicted = np.where(right, labels, (labels + 1 + rng.integers(0, 2, n)) % 3)
        probs = np.full((n, 3), 0.2)
        probs[np.arange(n), predicted] = 0.6
        section = bootstrap.bootstrap_section(
            probs, labels, {"mp": rng.normal(1, 1, n)}, {"x": {"mp": rng.normal(0, 1, m)}},
            ["mp"], samples=300, confidence=0.9, seed=trial)
        a = section["ood"]["x"]["mp"]["auroc"]
        covered_auroc += a["low"] <= truth_auroc <= a["high"]
        c = section["id"]["accuracy"]
        covered_accuracy += c["low"] <= 0.7 <= c["high"]
    assert 96 <= covered_auroc <= 119, covered_auroc
    assert 96 <= covered_accuracy <= 119, covered_accuracy


def test_percentile_intervals_agree_with_scipy():
    rng = np.random.default_rng(2)
    n, m = 400, 300
    id_scores, ood_scores = rng.normal(0.7, 1, n), rng.normal(0, 1, m)
    labels = rng.integers(0, 2, n)
    probs = np.stack([1 - (p := rng.uniform(0.3, 1, n)), p], 1)
    section = bootstrap.bootstrap_section(probs, labels, {"s": id_scores}, {"o": {"s": ood_scores}},
                                          ["s"], samples=4000, confidence=0.95, seed=1)
    correct = (probs.argmax(1) == labels).astype(float)
    want = stats.bootstrap((correct,), np.mean, n_resamples=4000, method="percentile",
                           confidence_level=0.95, random_state=7).confidence_interval
    got = section["id"]["accuracy"]
    assert got["low"] == pytest.approx(want.low, abs=0.006)
    assert got["high"] == pytest.approx(want.high, abs=0.006)

    def auroc(a, b):
        return metrics.auroc(np.r_[np.ones(a.size, bool), np.zeros(b.size, bool)], np.r_[a, b])

    want = stats.bootstrap((id_scores, ood_scores), auroc, n_resamples=2000,
                           method="percentile", paired=False, vectorized=False,
                           random_state=7).confidence_interval
    got = section["ood"]["o"]["s"]["auroc"]
    assert got["low"] == pytest.approx(want.low, abs=0.008)
    assert got["high"] == pytest.approx(want.high, abs=0.008)
    assert got["se"] == pytest.approx((want.high - want.low) / (2 * 1.96), rel=0.15)


def test_basic_intervals_agree_with_scipy_and_reflect_the_percentile_bounds():
    """method="basic": scipy.stats.bootstrap's "basic" interval (2 t - q(1 - a/2), 2 t - q(a/2))
    on accuracy and AUROC, and on the same draws exactly the percentile bounds reflected about
    the metric on all examples, for the method's metrics, the post-hoc scores' and a paired
    difference."""
    rng = np.random.default_rng(3)
    n, m = 400, 300
    id_scores, ood_scores = rng.normal(0.7, 1, n), rng.normal(0, 1, m)
    labels = rng.integers(0, 2, n)
    probs = np.stack([1 - (p := rng.uniform(0.3, 1, n)), p], 1)
    args = (probs, labels, {"s": id_scores}, {"o": {"s": ood_scores}}, ["s"])
    basic = bootstrap.bootstrap_section(*args, samples=4000, seed=1, method="basic")
    percentile = bootstrap.bootstrap_section(*args, samples=4000, seed=1)
    assert basic["settings"]["method"] == "basic"
    correct = (probs.argmax(1) == labels).astype(float)
    want = stats.bootstrap((correct,), np.mean, n_resamples=4000, method="basic",
                           random_state=7).confidence_interval
    got = basic["id"]["accuracy"]
    assert got["low"] == pytest.approx(want.low, abs=0.006)
    assert got["high"] == pytest.approx(want.high, abs=0.006)

    def auroc(a, b):
        return metrics.auroc(np.r_[np.ones(a.size, bool), np.zeros(b.size, bool)], np.r_[a, b])

    want = stats.bootstrap((id_scores, ood_scores), auroc, n_resamples=2000, method="basic",
                           paired=False, vectorized=False, random_state=7).confidence_interval
    got = basic["ood"]["o"]["s"]["auroc"]
    assert got["low"] == pytest.approx(want.low, abs=0.008)
    assert got["high"] == pytest.approx(want.high, abs=0.008)

    def reflected(b, p, point):
        assert b["se"] == p["se"] and b["undefined"] == p["undefined"]
        assert b["low"] == pytest.approx(2 * point - p["high"], abs=1e-12)
        assert b["high"] == pytest.approx(2 * point - p["low"], abs=1e-12)

    ece = metrics.expected_calibration_error(probs, labels).ece
    reflected(basic["id"]["ece"], percentile["id"]["ece"], ece)
    # ECE's replicates are biased upwards: the percentile interval's middle lies above the
    # estimate, and the basic interval below the percentile one
    middle = (percentile["id"]["ece"]["low"] + percentile["id"]["ece"]["high"]) / 2
    assert middle > ece and basic["id"]["ece"]["low"] < percentile["id"]["ece"]["low"]
    reflected(basic["ood"]["o"]["s"]["auroc"], percentile["ood"]["o"]["s"]["auroc"],
              auroc(id_scores, ood_scores))

    posthoc = [bootstrap.score_section(correct.astype(bool), {"s": id_scores},
                                       {"o": {"s": ood_scores}}, ["s"], 500, seed=4,
                                       method=method) for method in ("basic", "percentile")]
    reflected(posthoc[0]["ood"]["o"]["s"]["aupr_in"], posthoc[1]["ood"]["o"]["s"]["aupr_in"],
              metrics.average_precision(np.r_[np.ones(n, bool), np.zeros(m, bool)],
                                        np.r_[id_scores, ood_scores]))

    run_a = {"test": core.Predictions(probs=probs, labels=labels, scores={"mp": id_scores}),
             "ood/o": core.Predictions(probs=probs[:m], labels=None, scores={"mp": ood_scores})}
    run_b = {"test": core.Predictions(probs=probs[:, ::-1], labels=labels,
                                      scores={"mp": -id_scores}),
             "ood/o": core.Predictions(probs=probs[:m], labels=None, scores={"mp": ood_scores})}
    paired = [bootstrap.paired_section(run_a, run_b, ["mp"], 300, seed=2, method=method)
              for method in ("basic", "percentile")]
    b, p = paired[0]["id"]["accuracy"], paired[1]["id"]["accuracy"]
    reflected(b, p, b["difference"])
    with pytest.raises(ValueError, match="interval method must be one of"):
        bootstrap.bootstrap_section(*args, samples=10, method="bca")
    with pytest.raises(ValueError, match="bootstrap_interval must be one of"):
        core.EvaluationOptions(bootstrap_interval="bca")

def test_draws_are_seeded_per_set_and_undefined_replicates_are_counted():
    rng = np.random.default_rng(4)
    n = 30
    labels = rng.integers(0, 2, n)
    probs = np.eye(2)[labels] * 0.8 + 0.1   # every prediction correct
    probs[0] = probs[0][::-1]               # ... but one
    scores = {"mp": probs.max(1)}
    ood_b = {"mp": rng.normal(size=25)}
    a_scores = rng.normal(size=20)
    alone = bootstrap.bootstrap_section(probs, labels, scores, {"a": {"mp": a_scores}}, ["mp"],
                                        samples=200, seed=0)
    with_b = bootstrap.bootstrap_section(probs, labels, scores,
                                         {"b": ood_b, "a": {"mp": a_scores}}, ["mp"],
                                         samples=200, seed=0)
    assert with_b["ood"]["a"] == alone["ood"]["a"] and with_b["id"] == alone["id"]
    other_seed = bootstrap.bootstrap_section(probs, labels, scores, {"a": {"mp": a_scores}},
                                             ["mp"], samples=200, seed=1)
    assert other_seed["ood"]["a"] != alone["ood"]["a"]
    # one misclassified example among 30: about (29/30)^30 = 36 % of replicates draw none
    mis = alone["id"]["misclassification"]["mp"]["auroc"]
    assert 40 <= mis["undefined"] <= 110 and mis["low"] is not None
    assert bootstrap.interval(np.array([np.nan, 0.5, np.nan]), 0.9)["low"] is None


def test_evaluate_predictions_adds_the_section_and_the_table_shows_it():
    rng = np.random.default_rng(6)
    n, m, k = 200, 150, 3
    probs = rng.dirichlet(np.ones(k) * 2, n)
    labels = rng.integers(0, k, n)
    idd = core.Predictions(probs=probs, labels=labels, scores={"mp": probs.max(1)})
    ood_probs = rng.dirichlet(np.ones(k), m)
    ood = {"noise": core.Predictions(probs=ood_probs, labels=None,
                                     scores={"mp": ood_probs.max(1)})}
    plain = core.evaluate_predictions(idd, ood)
    assert "bootstrap" not in plain
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = core.evaluate_predictions(
            idd, ood, options=core.EvaluationOptions(bootstrap_samples=100,
                                                     bootstrap_confidence=0.8))
    section = res["bootstrap"]
    assert section["settings"] == {"samples": 100, "confidence": 0.8, "seed": 0,
                                   "method": "percentile", "ece_bins": 15}
    acc = section["id"]["accuracy"]
    assert acc["low"] <= res["id"]["accuracy"] <= acc["high"]
    assert {k: v for k, v in res.items() if k not in ("bootstrap", "evaluation_options")} == \
        {k: v for k, v in plain.items() if k != "evaluation_options"}
    json.dumps(res)
    text = report.results_table([{**res, "variant": "mine"}])
    assert "Bootstrap intervals of each single run (80% over 100 replicates" in text
    low, high = (section["ood"]["noise"]["mp"]["auroc"][k] * 100 for k in ("low", "high"))
    value = res["ood"]["noise"]["detection"]["mp"]["auroc"] * 100
    assert "| mine | noise | MP |" in text and f"{value:.2f} [{low:.2f}, {high:.2f}]" in text
    # the in-distribution row: the classwise ECE's interval; results written before the ECE's
    # parts and the classwise ECE had intervals show a dash there
    cw = section["id"]["ece_classwise"]
    assert cw["low"] <= res["id"]["ece_classwise"] <= cw["high"]
    assert f"{res['id']['ece_classwise']:.4f} [{cw['low']:.4f}, {cw['high']:.4f}] |" in text
    older = {**res, "variant": "mine", "bootstrap": {**section, "id": {
        k: v for k, v in section["id"].items() if k not in (
            "ece_overconfidence", "ece_underconfidence", "ece_classwise")}}}
    row = next(line for line in report.results_table([older]).splitlines()
               if line.startswith("| mine |") and " [" in line and "| MP |" not in line)
    assert row.endswith("| – | – | – |"), row
    # over several seeds the intervals stay in each run's results
    assert "Bootstrap" not in report.results_table([{**res, "variant": "mine", "seed": s}
                                                    for s in (0, 1)])
    for bad in (1, -3):
        with pytest.raises(ValueError, match="bootstrap_samples"):
            core.EvaluationOptions(bootstrap_samples=bad)
    with pytest.raises(ValueError, match="bootstrap_confidence"):
        core.EvaluationOptions(bootstrap_samples=10, bootstrap_confidence=1.0)


def test_calibrated_predictions_get_their_own_intervals_on_the_same_draws():
    """With calibrate=True the "calibrated" section has its own intervals: the bootstrap of the
    calibrated predictions with the same seed (so the same resamples), not a copy of the
    uncalibrated ones; the table prints them in the calibrated row."""
    rng = np.random.default_rng(8)
    n, m, k = 240, 120, 3
    labels = rng.integers(0, k, n + 100)
    logits = 3 * np.eye(k)[labels] + rng.normal(0, 1.5, (n + 100, k))   # overconfident
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    idd = core.Predictions(probs=probs[:n], labels=labels[:n], scores={"mp": probs[:n].max(1)})
    validation = core.Predictions(probs=probs[n:], labels=labels[n:],
                                  scores={"mp": probs[n:].max(1)})
    ood_probs = rng.dirichlet(np.ones(k) * 0.5, m)
    ood = {"noise": core.Predictions(probs=ood_probs, labels=None,
                                     scores={"mp": ood_probs.max(1)})}
    options = core.EvaluationOptions(bootstrap_samples=60, calibrate=True, bootstrap_seed=3)
    res = core.evaluate_predictions(idd, ood, validation=validation, options=options)
    _, calibrated = core.calibrated_predictions(
        validation, {"test": idd, "ood/noise": ood["noise"]}, options.calibrator,
        options.base_rate)
    expected = bootstrap.bootstrap_section(
        calibrated["test"].probs, labels[:n], calibrated["test"].scores,
        {"noise": calibrated["ood/noise"].scores}, ["mp"], 60, 0.95, 3)
    assert json.loads(json.dumps(res["calibrated"]["bootstrap"])) == \
        json.loads(json.dumps(expected))
    assert res["calibrated"]["bootstrap"]["id"]["nll"] != res["bootstrap"]["id"]["nll"]
    # temperature scaling keeps every prediction, so accuracy's replicates are the same
    assert res["calibrated"]["bootstrap"]["id"]["accuracy"] == res["bootstrap"]["id"]["accuracy"]
    text = report.results_table([{**res, "variant": "mine"}])
    boot = res["calibrated"]["bootstrap"]["id"]["ece"]
    row = next(line for line in text.splitlines()
               if line.startswith("| mine (calibrated: temperature) | ")
               and f"[{boot['low']:.4f}, {boot['high']:.4f}]" in line)
    assert f"{res['calibrated']['id']['ece']:.4f} [" in row


def test_a_run_and_the_evaluate_flag_write_the_intervals(tmp_path):
    data_dir = write_tiny_mnist(tmp_path / "data")
    c = configs.build_config("mnist", "gedl")
    config_lib.set_fields(c, **{**TINY_FIELDS, "num_epochs": 1, "evaluate_at_end": True,
                                   "data_dir": str(data_dir), "cache_dir": str(tmp_path / "c"),
                                   "bootstrap_samples": 30})
    with fast_compilation():
        train.train_and_evaluate(c, tmp_path / "w")
    trained = json.loads((tmp_path / "w" / "eval_results.json").read_text())
    assert trained["bootstrap"]["settings"]["samples"] == 30
    assert "Bootstrap intervals" in (tmp_path / "w" / "eval_table.md").read_text()
    proc = subprocess.run([sys.executable, "-m", "gedl_jax.evaluate",
                           f"--workdir={tmp_path / 'w'}", "--bootstrap_samples=40",
                           "--bootstrap_interval=basic", f"--out={tmp_path / 'again'}"], cwd=REPO,
                          env=subprocess_env(tmp_path / "cli"), capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr
    again = json.loads((tmp_path / "again" / "eval_results.json").read_text())
    assert again["bootstrap"]["settings"]["samples"] == 40
    assert (trained["bootstrap"]["settings"]["method"],
            again["bootstrap"]["settings"]["method"]) == ("percentile", "basic")
    assert "40 replicates, basic method" in (tmp_path / "again" / "eval_table.md").read_text()
    assert again["id"] == trained["id"]   # the same predictions: only the intervals changed
    with pytest.raises(ValueError, match="bootstrap_samples=1 must be 0"):
        config_lib.set_fields(c, bootstrap_samples=1)
        config_lib.validate(c)
    with pytest.raises(ValueError, match="bootstrap_interval='bca' is not allowed"):
        config_lib.set_fields(c, bootstrap_samples=2, bootstrap_interval="bca")
        config_lib.validate(c)


def _predictions(rng, n, m, k, noise):
    """A run's {"test", "ood/far"} Predictions on fixed labels: its scores track the truth
    with `noise`."""
    labels = np.arange(n) % k
    logits = np.eye(k)[labels] * 2 + rng.normal(0, noise, (n, k))
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    ood = rng.dirichlet(np.ones(k), m)
    other = "neg_entropy"   # a second score, of noise
    return {"test": core.Predictions(probs=probs, labels=labels,
                                     scores={"mp": probs.max(1), other: rng.normal(size=n)}),
            "ood/far": core.Predictions(probs=ood, labels=None,
                                        scores={"mp": ood.max(1), other: rng.normal(size=m)})}


def test_paired_differences_are_the_differences_of_the_same_resamples():
    rng = np.random.default_rng(8)
    a, b = _predictions(rng, 120, 80, 3, 1.0), _predictions(rng, 120, 80, 3, 2.5)
    section = bootstrap.paired_section(a, b, ["mp"], samples=60, confidence=0.9, seed=3)
    id_draws, ood_draws = _rows(120, 60, 3, "id"), _rows(80, 60, 3, "ood/far")
    diffs = {"accuracy": [], "auroc": []}
    for b_ in range(60):
        i, o = id_draws[b_], ood_draws[b_]
        diffs["accuracy"].append(
            metrics.accuracy(a["test"].probs[i], a["test"].labels[i])
            - metrics.accuracy(b["test"].probs[i], b["test"].labels[i]))
        diffs["auroc"].append(
            metrics.ood_detection(a["test"].scores["mp"][i], a["ood/far"].scores["mp"][o])["auroc"]
            - metrics.ood_detection(b["test"].scores["mp"][i],
                                    b["ood/far"].scores["mp"][o])["auroc"])
    for key, got in (("accuracy", section["id"]["accuracy"]),
                     ("auroc", section["ood"]["far"]["mp"]["auroc"])):
        want = bootstrap.interval(np.array(diffs[key]), 0.9)
        assert got["low"] == pytest.approx(want["low"], abs=1e-12), key
        assert got["high"] == pytest.approx(want["high"], abs=1e-12), key
        assert got["a_better"] == pytest.approx(np.mean(np.array(diffs[key]) > 0)), key
    acc = section["id"]["accuracy"]
    assert acc["a"] == metrics.accuracy(a["test"].probs, a["test"].labels)
    assert acc["difference"] == pytest.approx(acc["a"] - acc["b"])
    assert section["id"]["ece"]["a_better"] is not None   # lower ECE counts as better
    # so does a lower classwise ECE, or ECE part: "A better" is the fraction with A - B < 0
    for key, metric in (
            ("ece_classwise", metrics.classwise_calibration_error),
            ("ece_underconfidence",
             lambda p, y: metrics.expected_calibration_error(p, y).underconfidence)):
        diff = np.array([metric(a["test"].probs[i], a["test"].labels[i])
                         - metric(b["test"].probs[i], b["test"].labels[i]) for i in id_draws])
        assert section["id"][key]["a_better"] == pytest.approx(np.mean(diff < 0)), key
        assert section["id"][key]["low"] == pytest.approx(
            bootstrap.interval(diff, 0.9)["low"], abs=1e-12), key
    # a run against itself: every difference is 0, never better
    same = bootstrap.paired_section(a, a, ["mp"], samples=30)
    assert same["id"]["accuracy"]["low"] == same["id"]["accuracy"]["high"] == 0.0
    assert same["ood"]["far"]["mp"]["auroc"]["a_better"] == 0.0
    with pytest.raises(ValueError, match="test sets differ"):
        other = dict(b, test=core.Predictions(probs=b["test"].probs[1:],
                                              labels=b["test"].labels[1:], scores={}))
        bootstrap.paired_section(a, other, ["mp"], samples=10)


def test_seeds_are_drawn_with_the_examples_and_averaged():
    """Several runs a side: in each replicate, the runs drawn with replacement (a stream per
    side) are averaged on that replicate's examples, the same examples for every run; the point
    values are the means over the runs."""
    rng = np.random.default_rng(11)
    a = [_predictions(rng, 100, 40, 3, noise) for noise in (0.8, 1.2, 1.6)]
    b = [_predictions(rng, 100, 40, 3, noise) for noise in (1.4, 2.2)]
    section = bootstrap.paired_section(a, b, ["mp"], samples=50, confidence=0.9, seed=5)
    id_draws, ood_draws = _rows(100, 50, 5, "id"), _rows(40, 50, 5, "ood/far")
    runs_a = np.random.default_rng([5, zlib.crc32(b"runs/a")]).integers(0, 3, (50, 3))
    runs_b = np.random.default_rng([5, zlib.crc32(b"runs/b")]).integers(0, 2, (50, 2))

    def accuracy(run, i):
        return metrics.accuracy(run["test"].probs[i], run["test"].labels[i])

    def auroc(run, i, o):
        return metrics.ood_detection(run["test"].scores["mp"][i],
                                     run["ood/far"].scores["mp"][o])["auroc"]

    diffs = {"accuracy": [], "auroc": []}
    for r in range(50):
        i, o = id_draws[r], ood_draws[r]
        diffs["accuracy"].append(np.mean([accuracy(a[k], i) for k in runs_a[r]])
                                 - np.mean([accuracy(b[k], i) for k in runs_b[r]]))
        diffs["auroc"].append(np.mean([auroc(a[k], i, o) for k in runs_a[r]])
                              - np.mean([auroc(b[k], i, o) for k in runs_b[r]]))
    for key, got in (("accuracy", section["id"]["accuracy"]),
                     ("auroc", section["ood"]["far"]["mp"]["auroc"])):
        want = bootstrap.interval(np.array(diffs[key]), 0.9)
        assert (got["low"], got["high"]) == pytest.approx((want["low"], want["high"]),
                                                          abs=1e-12), key
    everything = np.arange(100)
    assert section["id"]["accuracy"]["a"] == pytest.approx(
        np.mean([accuracy(run, everything) for run in a]), abs=1e-15)
    assert section["settings"]["runs"] == [3, 2]
    # one run a side is the plain paired bootstrap, number for number
    assert bootstrap.paired_section([a[0]], [b[0]], ["mp"], samples=50, seed=5) == \
        bootstrap.paired_section(a[0], b[0], ["mp"], samples=50, seed=5)


def test_seed_to_seed_variation_widens_the_interval():
    """Runs whose accuracy moves from seed to seed (each seed flips another share of its
    predictions) against one fixed run: drawing the seeds widens the interval of the
    difference beyond that of any one seed's paired comparison."""
    rng = np.random.default_rng(12)
    base = _predictions(rng, 800, 50, 4, 1.0)
    seeds = []
    for share in (0.0, 0.05, 0.10, 0.15, 0.20):
        probs = base["test"].probs.copy()
        flip = rng.choice(800, int(share * 800), replace=False)
        probs[flip] = probs[flip][:, ::-1]
        seeds.append({**base, "test": core.Predictions(
            probs=probs, labels=base["test"].labels,
            scores={**base["test"].scores, "mp": probs.max(1)})})
    over_seeds = bootstrap.paired_section(seeds, base, ["mp"], samples=400)["id"]["accuracy"]
    widest_single = max(
        (lambda e: e["high"] - e["low"])(
            bootstrap.paired_section(run, base, ["mp"], samples=400)["id"]["accuracy"])
        for run in seeds)
    assert over_seeds["high"] - over_seeds["low"] > 1.5 * widest_single


def test_pairing_narrows_the_interval_of_a_shared_difficulty():
    """Two runs that share most of their per-example behaviour (B = A with a few predictions
    changed): the paired interval of the accuracy difference is far narrower than the two
    runs' separate intervals, which is what pairing is for."""
    rng = np.random.default_rng(9)
    a = _predictions(rng, 600, 50, 4, 1.5)
    probs = a["test"].probs.copy()
    flip = rng.choice(600, 12, replace=False)
    probs[flip] = probs[flip][:, ::-1]
    b = {**a, "test": core.Predictions(probs=probs, labels=a["test"].labels,
                                       scores={**a["test"].scores, "mp": probs.max(1)})}
    paired = bootstrap.paired_section(a, b, ["mp"], samples=400)["id"]["accuracy"]
    alone = bootstrap.bootstrap_section(a["test"].probs, a["test"].labels, a["test"].scores, {},
                                        ["mp"], samples=400)["id"]["accuracy"]
    assert (paired["high"] - paired["low"]) < 0.3 * (alone["high"] - alone["low"])


def test_compare_runs_reads_two_evaluated_folders_and_prints_one_table(tmp_path, capsys):
    from gedl_jax.commands import compare as command
    from gedl_jax.evaluation import compare, saved

    rng = np.random.default_rng(10)
    for name, noise in (("gedl", 0.8), ("edl", 2.0)):
        run = _predictions(rng, 150, 60, 3, noise)
        (tmp_path / name).mkdir()
        saved.save_predictions(tmp_path / name / "predictions.npz", run["test"],
                               {"far": run["ood/far"]})
        (tmp_path / name / "eval_results.json").write_text(json.dumps({"variant": name}))
    out = tmp_path / "cmp.json"
    assert command.main([str(tmp_path / "gedl"), str(tmp_path / "edl"), "--bootstrap_samples=200",
                         f"--out={out}"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("> Paired bootstrap: A = gedl") and "B = edl" in text
    assert "| Acc | test | – |" in text and "| AUROC | far | mp |" in text
    numbers = json.loads(out.read_text())
    assert numbers["settings"]["samples"] == 200 and numbers["settings"]["paired"]
    assert list(numbers["ood"]["far"]) == ["mp"]   # neg_entropy is not a default score
    assert command.main([str(tmp_path / "gedl"), str(tmp_path / "nowhere")]) == 2
    assert "no predictions.npz" in capsys.readouterr().err
    assert command.main([str(tmp_path / "gedl"), str(tmp_path / "edl"), "--scores=um"]) == 2
    assert "score(s) ['um'] are not in every run" in capsys.readouterr().err
    # the post-hoc scores an evaluation saved can be compared too (by name, beside MP)
    energies = {}
    for name in ("gedl", "edl"):
        loaded = saved.load_predictions(tmp_path / name / "predictions.npz")
        energies[name] = {split: {"energy": rng.normal(size=loaded[split].num_examples)}
                          for split in ("test", "ood/far")}
        saved.save_predictions(tmp_path / name / "predictions.npz", loaded["test"],
                               {"far": loaded["ood/far"]}, posthoc=energies[name])
    both = compare.compare_runs(tmp_path / "gedl", tmp_path / "edl", bootstrap_samples=50,
                                scores=["mp", "energy"])
    assert "| AUROC | far | energy |" in compare.paired_table(both)
    assert both["ood"]["far"]["energy"]["auroc"]["a"] == pytest.approx(metrics.ood_detection(
        energies["gedl"]["test"]["energy"], energies["gedl"]["ood/far"]["energy"])["auroc"])
    assert list(compare.compare_runs(tmp_path / "gedl", tmp_path / "edl", bootstrap_samples=10)
                ["ood"]["far"]) == ["mp"]   # not a default
    assert command.main([str(tmp_path / "gedl"), str(tmp_path / "edl"), "--bootstrap_samples=50",
                         "--bootstrap_interval=basic"]) == 0
    assert "95% basic interval over 50 replicates" in capsys.readouterr().out


def test_compare_runs_takes_a_folder_of_seeds_or_runs_joined_by_commas(tmp_path, capsys):
    from gedl_jax.commands import compare as command
    from gedl_jax.evaluation import compare, saved

    rng = np.random.default_rng(13)
    for folder, noises in (("gedl5", (0.8, 0.9, 1.0)), ("edl", (2.0, 2.2))):
        for s, noise in enumerate(noises):
            run = _predictions(rng, 150, 60, 3, noise)
            where = tmp_path / folder / f"seed_{s}"
            where.mkdir(parents=True)
            saved.save_predictions(where / "predictions.npz", run["test"],
                                   {"far": run["ood/far"]})
            (where / "eval_results.json").write_text(json.dumps({"variant": folder[:4]}))
    (tmp_path / "gedl5" / "seed_10").mkdir()   # not a run (no predictions): not counted
    assert compare.run_paths(tmp_path / "gedl5") == [tmp_path / "gedl5" / f"seed_{s}"
                                                     for s in range(3)]
    edl = f"{tmp_path / 'edl' / 'seed_0'},{tmp_path / 'edl' / 'seed_1'}"
    out = tmp_path / "cmp.json"
    assert command.main([str(tmp_path / "gedl5"), edl, "--bootstrap_samples=100",
                         f"--out={out}"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"> Paired bootstrap: A = gedl ({tmp_path / 'gedl5'}, 3 runs)")
    assert f"B = edl ({edl}, 2 runs)" in text
    assert "draws each side's runs with replacement" in text
    numbers = json.loads(out.read_text())
    assert numbers["settings"]["runs"] == [3, 2] and len(numbers["b"]["runs"]) == 2
    # the same as the library call on the loaded runs
    runs = [saved.load_predictions(pathlib.Path(p) / "predictions.npz")
            for p in numbers["a"]["runs"] + numbers["b"]["runs"]]
    again = bootstrap.paired_section(runs[:3], runs[3:], ["mp"], samples=100)
    assert numbers["id"] == json.loads(json.dumps(again["id"]))
    one = compare.compare_runs(tmp_path / "gedl5" / "seed_0", tmp_path / "edl" / "seed_0",
                               bootstrap_samples=20)
    assert one["a"]["name"] == "gedl" and "draws each side's runs" not in \
        compare.paired_table(one)


def _dirichlet_split(rng, labels, k, sharpness, prior_strength=2.0, wrong=0.2):
    """Dirichlet predictions (alpha = W/K + evidence) whose evidence tracks `labels` (None: an
    OOD set, evidence of noise), wrongly for a fifth of the examples; `sharpness` scales the
    evidence, so a fit can undo it (the fitted scale lies inside its bounds)."""
    from gedl_jax.evaluation import scores as scores_lib

    n = k * 40 if labels is None else labels.size
    evidence = rng.gamma(1.0, 1.0, (n, k))
    if labels is not None:
        favoured = np.where(rng.random(n) < wrong, rng.integers(0, k, n), labels)
        evidence[np.arange(n), favoured] += rng.gamma(3.0, 20.0, n)
    w = np.full(n, prior_strength)
    alpha = w[:, None] / k + sharpness * evidence
    return core.Predictions(probs=alpha / alpha.sum(1, keepdims=True), labels=labels,
                            scores=scores_lib.confidence_scores(alpha, w, ("mp", "um")),
                            alpha=alpha, prior_strength=w)


def _categorical_split(rng, labels, k, temperature):
    from gedl_jax.evaluation import scores as scores_lib

    n = k * 40 if labels is None else labels.size
    logits = rng.normal(0, 1, (n, k))
    if labels is not None:
        logits[np.arange(n), labels] += 1.5
    z = logits / temperature
    probs = np.exp(z - z.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    return core.Predictions(probs=probs, labels=labels,
                            scores=scores_lib.categorical_scores(probs))


def test_compare_runs_calibrated_compares_each_runs_calibrated_predictions(tmp_path, capsys):
    """--calibrate fits each run's own calibrator (its evaluation's) on the validation
    predictions its predictions.npz holds and compares what it makes of the test and OOD sets:
    the same numbers as the paired bootstrap of `core.calibrated_predictions`' outputs."""
    from gedl_jax.commands import compare as command
    from gedl_jax.evaluation import compare, saved

    rng = np.random.default_rng(21)
    k = 4
    test_labels, val_labels = np.arange(200) % k, np.arange(160) % k
    made = {"gedl": (lambda y: _dirichlet_split(rng, y, k, 0.05), "evidence_scale"),
            "softmax": (lambda y: _categorical_split(rng, y, k, 0.3), "temperature")}
    runs = {}
    for name, (split, calibrator) in made.items():
        runs[name] = {"test": split(test_labels), "ood/far": split(None),
                      "validation": split(val_labels)}
        (tmp_path / name).mkdir()
        saved.save_predictions(tmp_path / name / "predictions.npz", runs[name]["test"],
                               {"far": runs[name]["ood/far"]}, runs[name]["validation"])
        (tmp_path / name / "eval_results.json").write_text(json.dumps(
            {"variant": name, "evaluation_options": {"calibrator": calibrator,
                                                     "base_rate": None}}))
    out = tmp_path / "cmp.json"
    args = [str(tmp_path / "gedl"), str(tmp_path / "softmax"), "--bootstrap_samples=80",
            "--scores=mp"]
    assert command.main(args + ["--calibrate", f"--out={out}"]) == 0
    text = capsys.readouterr().out
    assert "Calibrated predictions" in text
    assert "(A: evidence scaling; B: temperature scaling)" in text
    numbers = json.loads(out.read_text())
    assert numbers["settings"]["calibrated"] is True
    assert [f["calibrator"] for f in numbers["a"]["calibration"]] == ["evidence_scale"]
    assert [f["calibrator"] for f in numbers["b"]["calibration"]] == ["temperature"]

    def calibrated(name, calibrator):
        loaded = saved.load_predictions(tmp_path / name / "predictions.npz")
        _, out_ = core.calibrated_predictions(
            loaded["validation"], {s: p for s, p in loaded.items() if s != "validation"},
            calibrator)
        return {s: p for s, p in out_.items() if s != "validation"}

    a, b = calibrated("gedl", "evidence_scale"), calibrated("softmax", "temperature")
    want = bootstrap.paired_section(a, b, ["mp"], samples=80)
    assert {k_: numbers[k_] for k_ in ("id", "ood")} == json.loads(json.dumps(
        {k_: want[k_] for k_ in ("id", "ood")}))
    # the fits undid the sharpening: both calibrated NLLs are below the uncalibrated ones
    plain = compare.compare_runs(tmp_path / "gedl", tmp_path / "softmax", bootstrap_samples=20,
                                 scores=["mp"])
    assert numbers["id"]["nll"]["a"] < plain["id"]["nll"]["a"]
    assert numbers["id"]["nll"]["b"] < plain["id"]["nll"]["b"]
    assert numbers["id"]["nll"]["a"] == pytest.approx(metrics.nll(a["test"].probs,
                                                                  test_labels), rel=1e-12)

    # evidence never on a wrong class: the fit's optimum is the prior's weight going to 0,
    # on the scale's bound; the warning names the run
    never_wrong = {s_: _dirichlet_split(rng, y, k, 0.05, wrong=0.0) for s_, y in
                   (("test", test_labels), ("ood/far", None), ("validation", val_labels))}
    (tmp_path / "sure").mkdir()
    saved.save_predictions(tmp_path / "sure" / "predictions.npz", never_wrong["test"],
                           {"far": never_wrong["ood/far"]}, never_wrong["validation"])
    with pytest.warns(RuntimeWarning, match=f"^{tmp_path / 'sure'}: the fitted evidence scale"):
        on_bound = compare.compare_runs(tmp_path / "sure", tmp_path / "gedl", bootstrap_samples=10,
                                        scores=["mp"], calibrate=True,
                                        calibrator="evidence_scale")
    assert on_bound["a"]["calibration"][0]["at_bound"]
    assert "1 of 1 fit(s) on the search bound" in compare.paired_table(on_bound)

    # a saved post-hoc score keeps its value under --calibrate, also where a calibrator
    # recomputes the method's own score of that name (temperature scaling's neg_entropy)
    loaded = saved.load_predictions(tmp_path / "gedl" / "predictions.npz")
    entropy = {s_: rng.normal(size=loaded[s_].num_examples) for s_ in ("test", "ood/far")}
    saved.save_predictions(tmp_path / "gedl" / "predictions.npz", loaded["test"],
                           {"far": loaded["ood/far"]}, loaded["validation"],
                           posthoc={s_: {"neg_entropy": v} for s_, v in entropy.items()})
    kept = compare.compare_runs(tmp_path / "gedl", tmp_path / "gedl", bootstrap_samples=10,
                                scores=["neg_entropy"], calibrate=True,
                                calibrator="temperature")
    assert kept["ood"]["far"]["neg_entropy"]["auroc"]["a"] == pytest.approx(
        metrics.ood_detection(entropy["test"], entropy["ood/far"])["auroc"])

    # --calibrator for every run; evidence scaling needs Dirichlet predictions
    assert command.main(args + ["--calibrate", "--calibrator=temperature"]) == 0
    assert "(A: temperature scaling; B: temperature scaling)" in capsys.readouterr().out
    assert command.main(args + ["--calibrate", "--calibrator=evidence_scale"]) == 2
    assert "needs Dirichlet predictions" in capsys.readouterr().err
    assert command.main(args + ["--calibrator=temperature"]) == 2
    assert "add --calibrate" in capsys.readouterr().err
    # a run saved without validation predictions: one line saying how to get them
    saved.save_predictions(tmp_path / "softmax" / "predictions.npz", runs["softmax"]["test"],
                           {"far": runs["softmax"]["ood/far"]})
    assert command.main(args + ["--calibrate"]) == 2
    assert "holds no validation predictions" in capsys.readouterr().err


def test_compare_runs_reads_its_retired_keywords_for_one_release(tmp_path):
    """samples, confidence, seed, calibrated and interval, compare_runs' keywords before they
    took the package's names (bootstrap_samples, ..., calibrate), give the same comparison with
    a DeprecationWarning naming the new keyword; an unknown keyword is still a TypeError."""
    from gedl_jax.evaluation import compare, saved

    rng = np.random.default_rng(11)
    for name, noise in (("gedl", 0.8), ("edl", 2.0)):
        run = _predictions(rng, 80, 40, 3, noise)
        (tmp_path / name).mkdir()
        saved.save_predictions(tmp_path / name / "predictions.npz", run["test"],
                               {"far": run["ood/far"]})
    preds = (tmp_path / "gedl", tmp_path / "edl")
    new = compare.compare_runs(*preds, bootstrap_samples=30, bootstrap_confidence=0.9,
                               bootstrap_seed=4, bootstrap_interval="basic")
    with pytest.warns(DeprecationWarning) as caught:
        old = compare.compare_runs(*preds, samples=30, confidence=0.9, seed=4,
                                   interval="basic", calibrated=False)
    assert old == new
    assert sorted(str(w.message) for w in caught) == [
        f"compare_runs({o}=...) is now {n}=...; the old name goes in 0.2.0"
        for o, n in sorted(compare.RETIRED_KEYWORDS.items())]
    with pytest.raises(TypeError, match="unexpected keyword argument 'sample'"):
        compare.compare_runs(*preds, sample=30)
