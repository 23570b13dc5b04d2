"""gedl_jax.evaluation: scores (float64 SciPy references; UM = -W/S), evaluate_outputs, padding,
multi-seed tables, plots and bin/report.py."""

import json
import pathlib
import subprocess
import sys
import warnings

import chex
import jax
import numpy as np
import pytest
from scipy import special
from sklearn.metrics import average_precision_score

from gedl_jax import evaluation
from gedl_jax.evaluation import core, metrics, plots, report, scores

REPO = pathlib.Path(__file__).resolve().parents[1]
K = 10
C_W = 0.5


def _adaptive_w(evidence_total):
    """GEDL's adaptive prior strength W = (K + C_w K E) / (1 + K E) (paper Eq. weight_update)."""
    return (K + C_W * K * evidence_total) / (1 + K * evidence_total)


def _gedl_alpha(evidence_NxK):
    w = _adaptive_w(evidence_NxK.sum(1))
    return evidence_NxK + w[:, None] / K, w


def _synthetic(rng, n, concentration, shift=0.0, k=K):
    """Dirichlet outputs: evidence from a Gamma, labels that agree with alpha more often."""
    evidence = rng.gamma(concentration, 1.0, size=(n, k))
    labels = rng.integers(0, k, n)
    evidence[np.arange(n), labels] += rng.gamma(2.0, 2.0 + shift, n)
    alpha, w = _gedl_alpha(evidence)
    return alpha, w, labels


# --------------------------------------------------------------------------------------------
# float64 NumPy / SciPy references
# --------------------------------------------------------------------------------------------
def _ref_measures(alpha, w):
    s = alpha.sum(1)
    p = alpha / s[:, None]
    expected_entropy = -np.sum(p * (special.digamma(alpha + 1)
                                    - special.digamma(s + 1)[:, None]), 1)
    total_entropy = -np.sum(p * np.log(p), 1)
    diff_entropy = (np.sum(special.gammaln(alpha), 1) - special.gammaln(s)
                    + (s - K) * special.digamma(s)
                    - np.sum((alpha - 1) * special.digamma(alpha), 1))
    return {"u": w / s, "mutual_information": total_entropy - expected_entropy,
            "variance_sum": np.sum(p * (1 - p), 1) / (s + 1), "expected_entropy": expected_entropy,
            "differential_entropy": diff_entropy, "max_probability": p.max(1), "strength": s,
            "log_strength": np.log(s)}


def test_uncertainty_measures_match_float64_references():
    rng = np.random.default_rng(0)
    alpha, w, _ = _synthetic(rng, 200, 0.5)
    alpha[:5] *= 1e4   # confident examples: MI ~ (K-1)/(2S) needs float64
    got = scores.uncertainty_measures(alpha, w)
    ref = _ref_measures(alpha, w)
    for name in scores.MEASURE_NAMES:
        np.testing.assert_allclose(got[name], ref[name], rtol=1e-8, atol=1e-12, err_msg=name)
    # Prop. u: MI -> (K-1)/(2S) for large S.
    s = alpha[:5].sum(1)
    np.testing.assert_allclose(got["mutual_information"][:5], (K - 1) / (2 * s), rtol=5e-3)


def test_confidence_scores_are_oriented_and_match_references():
    rng = np.random.default_rng(1)
    alpha, w, _ = _synthetic(rng, 100, 1.0)
    got = scores.confidence_scores(alpha, w)
    ref = _ref_measures(alpha, w)
    assert set(got) == set(scores.DIRICHLET_SCORE_NAMES)
    np.testing.assert_allclose(got["mp"], (alpha / alpha.sum(1, keepdims=True)).max(1), rtol=1e-12)
    np.testing.assert_allclose(got["um"], -w / alpha.sum(1), rtol=1e-12)
    np.testing.assert_allclose(got["max_alpha"], alpha.max(1), rtol=1e-12)
    np.testing.assert_allclose(got["strength"], alpha.sum(1), rtol=1e-12)
    np.testing.assert_allclose(got["neg_mi"], -ref["mutual_information"], rtol=1e-8)
    np.testing.assert_allclose(got["neg_differential_entropy"], -ref["differential_entropy"],
                               rtol=1e-8)
    np.testing.assert_allclose(got["neg_expected_entropy"], -ref["expected_entropy"], rtol=1e-8)
    assert all(v.dtype == np.float64 and v.shape == (100,) for v in got.values())
    sub = scores.confidence_scores(alpha, w, names=("um",))
    assert list(sub) == ["um"]
    with pytest.raises(ValueError, match="unknown scores"):
        scores.confidence_scores(alpha, w, names=("entropy",))


@pytest.mark.filterwarnings("ignore:AUROC is undefined:RuntimeWarning")  # all ID correct
def test_gedl_um_ranks_by_minus_u_not_by_strength():
    # K=10, C_w=0.5, total evidence E = 0, 1, 10: S = 10, 2.36, 10.59 is not monotone in E,
    # u = W/S = 1, 0.577, 0.056 is.
    evidence = np.zeros((3, K))
    evidence[:, 0] = [0.0, 1.0, 10.0]
    alpha, w = _gedl_alpha(evidence)
    s = alpha.sum(1)
    np.testing.assert_allclose(s, [10.0, 2.3636, 10.594], atol=1e-3)
    np.testing.assert_allclose(w / s, [1.0, 0.577, 0.0561], atol=1e-3)
    got = scores.confidence_scores(alpha, w)
    np.testing.assert_array_equal(np.argsort(got["um"]), [0, 1, 2])      # more evidence, higher
    assert not np.array_equal(np.argsort(got["strength"]), [0, 1, 2])    # S disagrees

    # OOD: in-distribution examples with E = 1 and 10, OOD examples with E = 0. -u separates them
    # perfectly; S = 2.36 < 10 puts the E = 1 examples below the OOD ones.
    id_out = core.ModelOutputs(alpha[[1, 2, 1, 2]], w[[1, 2, 1, 2]], labels=np.zeros(4, int))
    ood_out = core.ModelOutputs(alpha[[0, 0, 0]], w[[0, 0, 0]])
    res = core.evaluate_outputs(id_out, {"ood": ood_out}, scores=("um", "strength"))
    assert res["ood"]["ood"]["detection"]["um"]["auroc"] == 1.0
    assert res["ood"]["ood"]["detection"]["um"]["aupr_in"] == 1.0
    assert res["ood"]["ood"]["detection"]["strength"]["auroc"] == 0.5


def test_constant_w_um_ranks_like_strength():
    # For EDL / I-EDL / R-EDL (constant W) -W/S ranks exactly like the reference code's S.
    rng = np.random.default_rng(2)
    alpha = rng.gamma(1.0, 3.0, size=(300, K)) + 1.0
    got = scores.confidence_scores(alpha, float(K))
    id_s, ood_s = got["um"][:200], got["um"][200:]
    st = got["strength"]
    assert metrics.ood_detection(id_s, ood_s) == metrics.ood_detection(st[:200], st[200:])


def test_scores_validate_inputs():
    with pytest.raises(ValueError, match="> 0"):
        scores.confidence_scores(np.array([[1.0, 0.0]]), np.array([1.0]))
    with pytest.raises(ValueError, match="NaN"):
        scores.confidence_scores(np.array([[1.0, np.nan]]), np.array([1.0]))
    with pytest.raises(ValueError, match="prior_strength_N"):
        scores.confidence_scores(np.ones((3, 2)), np.ones(2))
    with pytest.raises(ValueError, match=r"\(N, K\)"):
        scores.confidence_scores(np.ones(3), np.ones(3))


# --------------------------------------------------------------------------------------------
# evaluate_outputs
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def synthetic_outputs():
    rng = np.random.default_rng(3)
    alpha, w, labels = _synthetic(rng, 400, 0.6, shift=1.0)
    id_out = core.ModelOutputs(alpha, w, labels)
    ood = {}
    for name, conc in (("near", 0.8), ("far", 2.0)):
        a, ww, _ = _synthetic(rng, 150, conc, shift=-1.5)
        ood[name] = core.ModelOutputs(a, ww)
    return id_out, ood


def test_evaluate_outputs_numbers_and_json(synthetic_outputs):
    id_out, ood = synthetic_outputs
    res = core.evaluate_outputs(id_out, ood)
    text = json.dumps(res, allow_nan=False)            # strict JSON
    assert json.loads(text) == res
    probs, labels = id_out.probs, id_out.labels
    r = res["id"]
    assert r["num_examples"] == 400 and r["num_classes"] == K
    assert r["accuracy"] == metrics.accuracy(probs, labels)
    assert r["nll"] == metrics.nll(probs, labels)
    assert r["brier"] == metrics.brier_score(probs, labels)
    assert r["brier_l2"] == metrics.brier_score(probs, labels, squared=False)
    assert r["ece"] == metrics.expected_calibration_error(probs, labels).ece
    assert r["ece_adaptive"] == metrics.expected_calibration_error(
        probs, labels, binning="adaptive").ece
    equal_width = metrics.expected_calibration_error(probs, labels)
    assert (r["ece_overconfidence"], r["ece_underconfidence"]) == (
        equal_width.overconfidence, equal_width.underconfidence)
    assert r["ece_classwise"] == metrics.classwise_calibration_error(probs, labels)
    assert r["calibration"]["equal_width"]["num_bins"] == 15
    assert sum(r["calibration"]["adaptive"]["bin_count"]) == 400
    correct = probs.argmax(1) == labels
    assert r["num_correct"] == int(correct.sum())
    s_id = scores.confidence_scores(id_out.alpha, id_out.prior_strength)
    for name in scores.DIRICHLET_SCORE_NAMES:
        assert r["misclassification"][name] == metrics.misclassification_detection(
            correct, s_id[name])
        for set_name, o in ood.items():
            s_ood = scores.confidence_scores(o.alpha, o.prior_strength)[name]
            assert res["ood"][set_name]["detection"][name] == metrics.ood_detection(
                s_id[name], s_ood)
    assert res["ood"]["far"]["num_examples"] == 150
    assert res["id"]["uncertainty"]["u"] == pytest.approx(
        np.mean(id_out.prior_strength / id_out.alpha.sum(1)))
    for key in ("aupr", "auroc", "positives", "scores", "units", "ece", "brier"):
        assert key in res["conventions"]
    assert "-W/S" in res["conventions"]["scores"]
    assert "(lower, upper]" in res["conventions"]["ece"]
    assert 0.5 < r["accuracy"] < 1.0   # a non-degenerate synthetic set


def test_evaluate_outputs_padding_never_changes_a_result(synthetic_outputs):
    id_out, ood = synthetic_outputs
    rng = np.random.default_rng(4)

    def pad(o, n_pad, with_labels):
        n = o.num_examples
        mask = np.zeros(n + n_pad, bool)
        mask[rng.choice(n + n_pad, size=n, replace=False)] = True
        alpha = np.full((n + n_pad, K), np.nan)
        alpha[mask] = o.alpha
        w = np.full(n + n_pad, -3.0)
        w[mask] = o.prior_strength
        labels = None
        if with_labels:
            labels = np.full(n + n_pad, 12345)
            labels[mask] = o.labels
        return core.ModelOutputs(alpha, w, labels, mask)

    padded_id = pad(id_out, 37, True)
    assert padded_id.num_examples == id_out.num_examples
    padded = core.evaluate_outputs(padded_id, {k: pad(v, 11, False) for k, v in ood.items()})
    assert padded == core.evaluate_outputs(id_out, ood)


def test_evaluate_outputs_undefined_metrics_become_null():
    alpha = np.array([[5.0, 1.0], [1.0, 6.0], [7.0, 1.0]])
    out = core.ModelOutputs(alpha, 2.0, labels=np.array([0, 1, 0]))   # all correct
    with pytest.warns(RuntimeWarning):
        res = core.evaluate_outputs(out, {}, scores=("mp",))
    assert res["id"]["misclassification"]["mp"]["auroc"] is None
    assert res["id"]["misclassification"]["mp"]["aupr"] == 1.0
    json.dumps(res, allow_nan=False)


def test_model_outputs_validation():
    with pytest.raises(ValueError, match="labels"):
        core.ModelOutputs(np.ones((3, 2)), np.ones(3), labels=np.array([0, 1, 2]))
    with pytest.raises(ValueError, match="labels"):
        core.ModelOutputs(np.ones((3, 2)), np.ones(3), labels=np.eye(2)[[0, 1, 0]])
    with pytest.raises(ValueError, match="mask"):
        core.ModelOutputs(np.ones((3, 2)), np.ones(3), mask=np.array([1, 0, 1]))
    with pytest.raises(ValueError, match="prior_strength"):
        core.ModelOutputs(np.ones((3, 2)), np.ones(4))
    with pytest.raises(ValueError, match="> 0"):
        core.ModelOutputs(np.zeros((3, 2)), np.ones(3))
    with pytest.raises(ValueError, match="labels"):
        core.evaluate_outputs(core.ModelOutputs(np.ones((3, 2)), 1.0), {})
    o = core.ModelOutputs(np.ones((3, 2)), 2.0)
    np.testing.assert_array_equal(o.prior_strength, [2.0, 2.0, 2.0])


def test_ensemble_epistemic_uncertainty():
    rng = np.random.default_rng(5)
    p = rng.dirichlet(np.ones(4), size=6)
    same = np.stack([p, p, p])
    np.testing.assert_allclose(core.ensemble_epistemic_uncertainty(same), 0.0, atol=1e-12)
    onehots = np.stack([np.eye(4)[[0, 1]], np.eye(4)[[1, 1]]])   # disagree on example 0 only
    np.testing.assert_allclose(core.ensemble_epistemic_uncertainty(onehots), [np.log(2), 0.0],
                               atol=1e-12)
    members = rng.dirichlet(np.ones(4), size=(5, 6))
    mean = members.mean(0)
    ref = (-np.sum(mean * np.log(mean), -1)
           + np.mean(np.sum(members * np.log(members), -1), 0))
    np.testing.assert_allclose(core.ensemble_epistemic_uncertainty(members), ref, rtol=1e-12)
    with pytest.raises(ValueError):
        core.ensemble_epistemic_uncertainty(p)


def test_rank_correlations_and_severity_summary():
    rng = np.random.default_rng(6)
    p = rng.dirichlet(np.ones(K))
    strengths = rng.uniform(2, 500, 300)
    alpha = strengths[:, None] * p[None]
    rho = core.rank_correlations(alpha, float(K))
    for name in ("u", "mutual_information", "variance_sum"):
        assert rho[name] == pytest.approx(-1.0), name
    outs = {sev: core.ModelOutputs(alpha / (1 + sev), float(K)) for sev in range(3)}
    summary = core.severity_summary(outs)
    us = [summary[sev]["u"] for sev in range(3)]
    assert us[0] < us[1] < us[2]


# --------------------------------------------------------------------------------------------
# Reports
# --------------------------------------------------------------------------------------------
def _fake_result(acc, conf_mp, ood, variant=None, seed=None, dataset="mnist", ece=0.05):
    res = {"conventions": {"aupr": "average precision"}, "scores": ["mp", "um"],
           "id": {"num_examples": 100, "accuracy": acc, "nll": 0.3, "brier": 0.1,
                  "brier_l2": 0.2, "ece": ece, "ece_adaptive": ece + 0.01,
                  "ece_overconfidence": 0.75 * ece, "ece_underconfidence": 0.25 * ece,
                  "calibration": {"equal_width": {"bin_count": [1, 2], "binning": "equal_width"}},
                  "misclassification": {"mp": {"aupr": conf_mp, "auroc": 0.9},
                                        "um": {"aupr": conf_mp - 0.01, "auroc": None}}},
           "ood": {name: {"num_examples": 50,
                          "detection": {"mp": {"aupr_in": mp, "aupr_out": 0.8, "auroc": 0.85,
                                               "fpr95": 0.3},
                                        "um": {"aupr_in": um, "aupr_out": 0.7, "auroc": 0.8,
                                               "fpr95": 0.4}}}
                   for name, (mp, um) in ood.items()}}
    for key, value in (("variant", variant), ("seed", seed), ("dataset", dataset)):
        if value is not None:
            res[key] = value
    return res


def _three_seeds(variant="gedl"):
    return [_fake_result(acc, 0.99, {"KMNIST": (mp, 0.97), "FMNIST": (0.9, None if i else 0.8)},
                         variant=variant, seed=i, ece=e)
            for i, (acc, mp, e) in enumerate([(0.90, 0.95, 0.04), (0.92, 0.96, 0.05),
                                               (0.94, 0.97, 0.06)])]


def test_aggregate_mean_and_sample_std():
    agg = report.aggregate(_three_seeds())
    acc = agg["id"]["accuracy"]
    assert acc["mean"] == pytest.approx(0.92) and acc["n"] == 3
    assert acc["std"] == pytest.approx(0.02)            # ddof=1: sqrt((.02^2 + 0 + .02^2)/2)
    um = agg["ood"]["FMNIST"]["detection"]["um"]["aupr_in"]
    assert um == {"mean": 0.8, "std": None, "n": 1}      # nulls are left out
    assert agg["id"]["misclassification"]["um"]["auroc"] == {"mean": None, "std": None, "n": 0}
    assert "conventions" not in agg and "seed" not in agg and "variant" not in agg
    assert "calibration" not in agg["id"]     # only lists and strings below it
    with pytest.raises(ValueError):
        report.aggregate([])


def test_results_table_markdown_numbers_and_header():
    text = report.results_table([{**r, "score_captions": {"um": "-u = -W/S"}}
                                 for r in _three_seeds()])
    lines = text.splitlines()
    header = next(line for line in lines if line.startswith("| Method"))
    assert header.split(" | ")[1:3] == ["Acc (mnist)", "Conf.MP"]
    assert "mnist→KMNIST MP" in header and "mnist→FMNIST UM" in header
    assert header.index("KMNIST MP") < header.index("KMNIST UM") < header.index("FMNIST MP")
    row = next(line for line in lines if line.startswith("| gedl |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:5] == ["gedl", "92.00 ± 2.00", "99.00 ± 0.00", "96.00 ± 1.00", "97.00 ± 0.00"]
    assert cells[5:] == ["90.00 ± 0.00", "80.00 (n=1)"]   # one finite seed: mean only
    assert "3 seeds" in text and "ddof=1" in text and "-W/S" in text
    assert "in-distribution positive" in text and "average precision" in text
    calib = next(line for line in lines if line.startswith("| gedl | 0.3000"))
    cells = [c.strip() for c in calib.strip("|").split("|")]
    # ECE as a fraction, like the paper; then its overconfident and underconfident parts
    assert cells[4:7] == ["0.0500 ± 0.0100", "0.0375 ± 0.0075", "0.0125 ± 0.0025"]
    older = {**_fake_result(0.8, 0.9, {}), "variant": "old"}
    for key in ("ece_overconfidence", "ece_underconfidence"):
        del older["id"][key]
    old_row = next(line for line in report.results_table([older]).splitlines()
                   if line.startswith("| old | 0.3000"))
    assert [c.strip() for c in old_row.strip("|").split("|")][4:7] == ["0.0500", "–", "–"]
    assert "15 equal-width bins" in text


def test_results_table_several_methods_latex_and_ood_order():
    results = {"EDL": [_fake_result(0.8, 0.9, {"SVHN": (0.7, 0.71)})] * 2,
               "GEDL_ours": _three_seeds()}
    text = report.results_table(results, fmt="latex", ood_names=["KMNIST", "SVHN"], extra=False)
    assert r"\toprule" in text and r"\bottomrule" in text
    assert r"\multicolumn{2}{c}{mnist$\rightarrow$KMNIST}" in text
    assert r"GEDL\_ours & 92.00$\pm$2.00 & 99.00$\pm$0.00 & 96.00$\pm$1.00" in text
    assert r"EDL & 80.00$\pm$0.00 & 90.00$\pm$0.00 & -- & -- & 70.00$\pm$0.00" in text
    assert "FMNIST" not in text
    assert "seeds per method: EDL 2, GEDL_ours 3" in text
    assert text.count(r"\begin{tabular}") == 1
    assert report.results_table(results).count("| Method") == 3   # main, calibration, detail
    with pytest.raises(ValueError):
        report.results_table(results, fmt="html")


def test_the_um_caption_is_each_methods_own_recorded_words():
    """The caption says what UM is per row from the results' score_captions (written by each
    method), groups rows that share one, and names rows whose results predate them."""
    runs = {"gedl": [{**r, "score_captions": {"um": "-u = -W/S"}} for r in _three_seeds()],
            "edl": [{**_fake_result(0.8, 0.9, {}), "score_captions": {"um": "-u = -W/S"}}],
            "duq": [{**_fake_result(0.8, 0.9, {}), "score_captions": {}}],
            "old": [_fake_result(0.8, 0.9, {})]}
    text = report.results_table(runs, extra=False)
    assert ("UM = the method's precision score: -u = -W/S (gedl, edl); – for a method without "
            "one (duq); not recorded (old).") in text


def test_results_table_splits_a_mixed_list_by_variant():
    mixed = _three_seeds("gedl") + [_fake_result(0.5, 0.5, {"KMNIST": (0.5, 0.5)}, variant="edl")]
    text = report.results_table(mixed, extra=False)
    assert "| gedl | 92.00 ± 2.00 |" in text and "| edl | 50.00 |" in text


def test_main_table_values_are_the_main_table_numbers(tmp_path):
    results = {"EDL": [_fake_result(0.8, 0.9, {"SVHN": (0.7, 0.71)})] * 2,
               "GEDL_ours": _three_seeds()}
    columns, values = report.main_table_values(results, ood_names=["KMNIST", "SVHN"])
    assert columns == ["Acc", "Conf.MP", "KMNIST MP", "KMNIST UM", "SVHN MP", "SVHN UM"]
    assert list(values) == ["EDL", "GEDL_ours"]
    np.testing.assert_allclose([m for m, _ in values["GEDL_ours"][:3]], [92.0, 99.0, 96.0])
    np.testing.assert_allclose([s for _, s in values["GEDL_ours"][:3]], [2.0, 0.0, 1.0],
                               atol=1e-9)
    assert values["EDL"][2] == (None, None) and values["EDL"][0] == (80.0, 0.0)
    assert values["GEDL_ours"][4] == (None, None)
    single = report.main_table_values([_fake_result(0.9, 0.99, {"A": (0.8, 0.7)}, variant="x")])
    assert single == (["Acc", "Conf.MP", "A MP", "A UM"],
                      {"x": [(90.0, None), (99.0, None), (80.0, None), (70.0, None)]})
    _assert_png(plots.method_comparison(results, tmp_path / "methods.png",
                                        ood_names=["KMNIST", "SVHN"]))
    _assert_png(plots.method_comparison([_fake_result(0.9, 0.99, {"A": (0.8, 0.7)})],
                                        tmp_path / "one.png"))
    with pytest.raises(ValueError, match="at least one result"):
        plots.method_comparison({"empty": []}, tmp_path / "none.png")


def test_results_table_single_run_has_no_spread():
    text = report.results_table([_fake_result(0.9, 0.99, {"A": (0.8, 0.7)}, variant="solo")])
    assert "| solo | 90.00 | 99.00 | 80.00 | 70.00 |" in text and "1 seed" in text


def _write_runs(root):
    for i, r in enumerate(_three_seeds(variant=None)):          # named by folder, seed subfolder
        path = root / "gedl" / f"seed{i}" / "eval_results.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(r))
    for i, acc in enumerate([0.8, 0.84]):                       # named by folder suffix
        path = root / f"edl_seed{i}" / "eval_results.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(_fake_result(acc, 0.9, {"KMNIST": (0.6, 0.5)})))
    named = root / "misc" / "x" / "eval_results.json"           # named by its "variant" key
    named.parent.mkdir(parents=True)
    named.write_text(json.dumps(_fake_result(0.5, 0.5, {"KMNIST": (0.5, 0.5)},
                                             variant="redl", dataset="cifar10")))


def test_load_runs_groups_by_dataset_and_method(tmp_path):
    _write_runs(tmp_path)
    grouped = report.load_runs(tmp_path)
    assert set(grouped) == {"mnist", "cifar10"}
    assert {k: len(v) for k, v in grouped["mnist"].items()} == {"edl": 2, "gedl": 3}
    assert list(grouped["cifar10"]) == ["redl"]


def test_bin_report_subprocess(tmp_path):
    _write_runs(tmp_path / "runs")
    out_file, json_file = tmp_path / "table.md", tmp_path / "agg.json"
    proc = subprocess.run([sys.executable, str(REPO / "bin" / "report.py"), str(tmp_path / "runs"),
                           "--out", str(out_file), "--json", str(json_file)],
                          capture_output=True, text=True, check=True, cwd=tmp_path)
    assert "## mnist" in proc.stdout and "## cifar10" in proc.stdout
    assert "| gedl | 92.00 ± 2.00 | 99.00 ± 0.00 | 96.00 ± 1.00 |" in proc.stdout
    edl = next(line for line in proc.stdout.splitlines() if line.startswith("| edl |"))
    assert edl.startswith("| edl | 82.00 ± 2.83 |")     # std(80, 84, ddof=1) = 2.828
    assert out_file.read_text() == proc.stdout
    agg = json.loads(json_file.read_text())
    assert agg["mnist"]["gedl"]["id"]["accuracy"]["mean"] == pytest.approx(0.92)
    latex = subprocess.run([sys.executable, str(REPO / "bin" / "report.py"),
                            str(tmp_path / "runs"), "--latex", "--no_extra"],
                           capture_output=True, text=True, check=True)
    assert latex.stdout.count(r"\begin{tabular}") == 2 and r"$\pm$" in latex.stdout
    empty = tmp_path / "empty"
    empty.mkdir()
    failed = subprocess.run([sys.executable, str(REPO / "bin" / "report.py"), str(empty)],
                            capture_output=True, text=True)
    assert failed.returncode == 2 and "error: no eval_results.json under" in failed.stderr


# --------------------------------------------------------------------------------------------
# Plots
# --------------------------------------------------------------------------------------------
def _assert_png(path):
    path = pathlib.Path(path)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000


def test_the_uncertainty_study_of_a_collapsed_model_plots_without_a_warning(tmp_path):
    """A model collapsed to the prior (alpha = 1 everywhere: S = K) has constant measures: the
    legend's rho is nan, and no SciPy warning interrupts the evaluation's output."""
    alpha = np.ones((50, 10), np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _assert_png(plots.distributional_uncertainty_study(alpha, np.float32(10.0),
                                                           tmp_path / "collapsed.png"))
    assert np.isnan(plots._spearman(np.ones(5), np.arange(5.0)))
    rng = np.random.default_rng(0)
    x = rng.normal(size=20)
    np.testing.assert_allclose(plots._spearman(x, x ** 3), 1.0)
    np.testing.assert_allclose(plots._spearman(x, -x), -1.0)


def test_plots_write_pngs(tmp_path, synthetic_outputs):
    id_out, ood = synthetic_outputs
    for binning in ("equal_width", "adaptive"):
        cal = metrics.expected_calibration_error(id_out.probs, id_out.labels, binning=binning)
        path = plots.reliability_diagram(cal, tmp_path / f"rel_{binning}.png")
        assert path == tmp_path / f"rel_{binning}.png"
        _assert_png(path)
    s_id = scores.confidence_scores(id_out.alpha, id_out.prior_strength)["um"]
    s_ood = {k: scores.confidence_scores(o.alpha, o.prior_strength)["um"] for k, o in ood.items()}
    _assert_png(plots.score_histograms(s_id, s_ood, tmp_path / "sub" / "hist.png", "um"))
    mask = np.ones(id_out.num_examples, bool)
    mask[::7] = False
    _assert_png(plots.distributional_uncertainty_study(
        id_out.alpha, id_out.prior_strength, tmp_path / "dist.png", mask_N=mask, max_points=100))
    _assert_png(plots.uncertainty_against_strength(
        id_out.alpha, id_out.prior_strength, tmp_path / "strength.png", max_points=100))
    with pytest.raises(ValueError, match="alpha_NxK"):
        plots.uncertainty_against_strength(-id_out.alpha, id_out.prior_strength,
                                           tmp_path / "bad_alpha.png")
    per_sev = core.severity_summary({sev: core.ModelOutputs(id_out.alpha / (1 + sev),
                                                            id_out.prior_strength)
                                     for sev in range(6)})
    _assert_png(plots.corruption_severity_study(per_sev, tmp_path / "sev.png",
                                                ensemble_epistemic=[0.1, 0.1, 0.2, 0.2, 0.3, 0.3]))
    _assert_png(plots.corruption_severity_study(per_sev, tmp_path / "sev_raw.png",
                                                ensemble_epistemic={s: 0.1 for s in range(6)},
                                                normalize=False))
    with pytest.raises(ValueError):
        plots.corruption_severity_study(per_sev, tmp_path / "bad.png", ensemble_epistemic=[0.1])


# ------------------------------------------------------------------ methods without a Dirichlet
def test_categorical_and_sampled_scores_against_scipy():
    from scipy import stats as scipy_stats

    rng = np.random.default_rng(0)
    probs_MxNxK = rng.dirichlet(np.ones(4), size=(6, 50))
    probs_MxNxK[0, 0] = [1.0, 0.0, 0.0, 0.0]          # 0 log 0 = 0
    single = scores.categorical_scores(probs_MxNxK[1])
    np.testing.assert_allclose(single["mp"], probs_MxNxK[1].max(-1))
    np.testing.assert_allclose(-single["neg_entropy"], scipy_stats.entropy(probs_MxNxK[1], axis=-1))
    mean, sampled = scores.sampled_scores(probs_MxNxK)
    np.testing.assert_allclose(mean, probs_MxNxK.mean(0))
    mi = (scipy_stats.entropy(probs_MxNxK.mean(0), axis=-1)
          - scipy_stats.entropy(probs_MxNxK, axis=-1).mean(0))
    np.testing.assert_allclose(-sampled["neg_mi"], mi, atol=1e-12)
    assert (mi > 0).all()
    same = scores.sampled_scores(np.repeat(probs_MxNxK[:1], 3, axis=0))[1]
    np.testing.assert_allclose(same["neg_mi"], 0.0, atol=1e-12)   # agreeing passes: no MI
    with pytest.raises(ValueError, match="probabilities"):
        scores.categorical_scores(probs_MxNxK[1] * 2)


def test_predictions_validate_their_inputs():
    p = np.full((3, 2), 0.5)
    mp = np.full(3, 0.5)
    with pytest.raises(ValueError, match="unknown score"):
        evaluation.Predictions(p, {"confidence": mp})
    with pytest.raises(ValueError, match="shape"):
        evaluation.Predictions(p, {"mp": mp[:2]})
    with pytest.raises(ValueError, match=r"probs must hold probabilities in \[0, 1\]"):
        evaluation.Predictions(p * 3, {"mp": mp})
    with pytest.raises(ValueError, match="probs rows must sum to 1 .*not logits or alpha"):
        evaluation.Predictions(p * 0.5, {"mp": mp})
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 2\)"):
        evaluation.Predictions(p, {"mp": mp}, labels=np.array([0, 1, 2]))


def test_non_dirichlet_predictions_are_evaluated_without_um_and_print_a_dash():
    rng = np.random.default_rng(1)
    probs = rng.dirichlet(np.ones(3) * 0.3, size=200)
    labels = np.where(rng.random(200) < 0.7, probs.argmax(-1), rng.integers(0, 3, 200))
    ood = rng.dirichlet(np.ones(3) * 3.0, size=100)
    pred = evaluation.Predictions(probs, scores.categorical_scores(probs), labels)
    results = evaluation.evaluate_predictions(
        pred, {"far": evaluation.Predictions(ood, scores.categorical_scores(ood))})
    assert results["scores"] == ["mp", "neg_entropy"]
    assert "uncertainty" not in results["id"] and "uncertainty" not in results["ood"]["far"]
    correct = probs.argmax(-1) == labels
    assert results["id"]["misclassification"]["mp"]["aupr"] == pytest.approx(
        average_precision_score(correct, probs.max(-1)))
    assert results["id"]["accuracy"] == pytest.approx(correct.mean())
    table = evaluation.results_table([dict(results, variant="softmax", dataset="toy")])
    row = next(line for line in table.splitlines() if line.startswith("| softmax |"))
    cells = [c.strip() for c in row.split("|")[1:-1]]   # method, Acc, Conf.MP, far MP, far UM
    assert cells[4] == "–" and cells[3] != "–"


def test_dirichlet_predictions_evaluate_exactly_as_model_outputs():
    rng = np.random.default_rng(2)
    alpha = rng.gamma(2.0, 2.0, size=(120, 4)) + 0.1
    w = rng.uniform(0.5, 2.0, 120)
    labels = rng.integers(0, 4, 120)
    ood_alpha = rng.gamma(1.0, 1.0, size=(60, 4)) + 0.1
    outputs = evaluation.ModelOutputs(alpha, w, labels)
    ood = evaluation.ModelOutputs(ood_alpha, np.ones(60))
    via_outputs = evaluation.evaluate_outputs(outputs, {"o": ood})
    via_predictions = evaluation.evaluate_predictions(
        evaluation.dirichlet_predictions(outputs), {"o": evaluation.dirichlet_predictions(ood)})
    assert via_outputs == via_predictions
    np.testing.assert_allclose(evaluation.dirichlet_predictions(outputs).probs,
                               alpha / alpha.sum(-1, keepdims=True))


# ---------------------------------------------------------------------- chex: shapes and traces
def test_uncertainty_measures_compile_once_for_any_number_of_examples(monkeypatch):
    """The jitted measures run on fixed-size padded chunks: one trace for N = 3, 1500 (two
    chunks, the last padded) and 1024; every measure (N,) float64, finite, and u = W / S."""
    counted = jax.jit(chex.assert_max_traces(scores._all_measures.__wrapped__, n=1))
    monkeypatch.setattr(scores, "_all_measures", counted)
    rng = np.random.default_rng(0)
    for n in (3, 1500, 1024):
        alpha = rng.uniform(0.5, 50.0, (n, 10))
        w = rng.uniform(0.5, 10.0, n)
        out = scores.uncertainty_measures(alpha, w)
        assert sorted(out) == sorted(scores.MEASURE_NAMES)
        chex.assert_shape(list(out.values()), (n,))
        chex.assert_type(list(out.values()), np.float64)
        chex.assert_tree_all_finite(out)
        np.testing.assert_allclose(out["u"], w / alpha.sum(1), rtol=1e-13)
        np.testing.assert_allclose(out["max_probability"], alpha.max(1) / alpha.sum(1),
                                   rtol=1e-13)


def test_score_shapes_and_dtypes():
    rng = np.random.default_rng(1)
    alpha = rng.uniform(0.5, 50.0, (7, 4))
    dirichlet = scores.confidence_scores(alpha, np.full(7, 4.0))
    assert sorted(dirichlet) == sorted(scores.DIRICHLET_SCORE_NAMES)
    probs_MxNxK = rng.dirichlet(np.ones(4), size=(3, 7))
    mean_NxK, sampled = scores.sampled_scores(probs_MxNxK)
    categorical = scores.categorical_scores(mean_NxK)
    chex.assert_shape(mean_NxK, (7, 4))
    for out in (dirichlet, sampled, categorical):
        chex.assert_shape(list(out.values()), (7,))
        chex.assert_type(list(out.values()), np.float64)
        chex.assert_tree_all_finite(out)
    chex.assert_trees_all_close(mean_NxK, probs_MxNxK.mean(0), rtol=1e-15)
    chex.assert_trees_all_close({k: sampled[k] for k in categorical}, categorical, rtol=1e-15)
    assert np.all(sampled["neg_mi"] <= 0)


def test_results_table_names_what_each_row_ran():
    """Every table says each row's reading and, for a Prior Network, its OOD training data: the
    results' recorded `method` description, once per distinct text."""
    pn = [dict(_fake_result(0.9, 0.9, {"KMNIST": (0.9, 0.9)}, variant="kl_pn", seed=s),
               method="KL-PN (forward KL), OOD training data noise_uniform, protocol reading")
          for s in range(2)]
    old = [_fake_result(0.8, 0.9, {"KMNIST": (0.7, 0.7)}, variant="edl")]   # no "method" key
    text = report.results_table({"kl_pn": pn, "edl": old}, extra=False)
    assert text.count("OOD training data noise_uniform, protocol reading") == 1
    assert "- kl_pn: KL-PN (forward KL)" in text and "- edl:" not in text
    latex = report.results_table({"kl_pn": pn}, fmt="latex", extra=False)
    assert r"% kl\_pn: KL-PN (forward KL), OOD training data noise\_uniform" in latex
    assert "Rows:" not in report.results_table({"edl": old}, extra=False)


def test_temperature_scaling_recomputes_mp_as_the_predictions_declare_it(tmp_path):
    """Whether "mp" is max_k p_k is what the method declares (`Predictions.mp_is_max_probability`,
    from `Method.mp_is_max_probability`), not a guess from the numbers: a score declared to be
    something else (DUQ's kernel certainty) is kept even where it happens to equal max_k p_k, a
    declared max probability is recomputed; predictions.npz keeps the declaration, and a file
    written before it did is read as its numbers show."""
    from gedl_jax.evaluation import saved

    rng = np.random.default_rng(3)
    labels = rng.integers(0, 3, 300)
    logits = 2 * np.eye(3)[labels] + rng.normal(0, 1.5, (300, 3))
    probs = special.softmax(3 * logits, axis=1)          # overconfident: T > 1 changes p
    for declared in (True, False):
        val, test = (core.Predictions(p, {"mp": p.max(1)}, y, mp_is_max_probability=declared)
                     for p, y in ((probs[:150], labels[:150]), (probs[150:], labels[150:])))
        _, cal = core.calibrated_predictions(val, {"test": test}, "temperature")
        assert cal["test"].mp_is_max_probability is declared
        assert not np.allclose(cal["test"].probs, test.probs)
        np.testing.assert_array_equal(cal["test"].scores["mp"], cal["test"].probs.max(1)
                                      if declared else test.scores["mp"])
        saved.save_predictions(tmp_path / f"{declared}.npz", test, {}, val)
        loaded = saved.load_predictions(tmp_path / f"{declared}.npz")
        assert [p.mp_is_max_probability for p in loaded.values()] == [declared] * 2
    # a file from before the declaration: the numbers say it (mp = max_k p_k here)
    with np.load(tmp_path / "False.npz") as z:
        older = {k: z[k] for k in z.files if not k.endswith("/mp_is_max_probability")}
    np.savez(tmp_path / "older.npz", **older)
    assert all(p.mp_is_max_probability for p in saved.load_predictions(
        tmp_path / "older.npz").values())
