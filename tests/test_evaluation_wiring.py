"""The evaluation beyond the paper's numbers, wired into results, tables, runs and any model:
selective prediction, conformal sets, near/far OOD groups, trapezoidal AUPR, post-hoc
calibration (fitted on validation data only), predictions.npz and `evaluate_model`.

Array-level checks are float64 against direct calls of the public functions; one tiny MNIST run
on generated data (with a generated CIFAR-10 for the far set cifar10_gray28) checks the files a
run writes, that every number of its eval_results.json is recomputed from predictions.npz, and
that `evaluate_model` reproduces it exactly."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from data_fixtures import specs_for, write_cifar10_tar, write_generated_data

from compile_mode import fast_compilation

from gedl_jax import config as config_lib
from gedl_jax import configs, data
from gedl_jax.data import registry
from gedl_jax.evaluation import (
    EvaluationOptions,
    ModelOutputs,
    Predictions,
    calibration,
    categorical_scores,
    conformal,
    evaluate_outputs,
    evaluate_predictions,
    load_predictions,
    metrics,
    ood_aupr,
    selective,
)

# Keys a run adds to the results (its provenance); evaluate_model / a recomputation lacks them.
PROVENANCE = ("variant", "method", "score_captions", "dataset", "seed", "workdir", "plots",
              "numerics",
              # computed from the network's logits and features, not from predictions.npz
              # (tests/test_posthoc_run.py recomputes it from predictions.npz)
              "posthoc")


def _labels(rng, p_NxK, right=0.7):
    """The argmax with probability `right`, else a uniform label: a model that is often right."""
    n, k = p_NxK.shape
    return np.where(rng.random(n) < right, np.argmax(p_NxK, 1), rng.integers(0, k, n))


def _dirichlet(rng, n, k=4, labelled=True, shift=0.0):
    alpha = rng.gamma(1.0, 3.0 + shift, (n, k)) + 1.0
    return ModelOutputs(alpha, 4.0, _labels(rng, alpha) if labelled else None)


def _categorical(rng, n, k=5, labelled=True, scale=2.0):
    z = rng.normal(0, scale, (n, k))
    p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    return Predictions(p, categorical_scores(p), _labels(rng, p) if labelled else None)


@pytest.fixture(scope="module")
def arrays():
    rng = np.random.default_rng(0)
    return {"test": _dirichlet(rng, 300), "validation": _dirichlet(rng, 200),
            "near": _dirichlet(rng, 90, labelled=False, shift=-2.0),
            "far1": _dirichlet(rng, 70, labelled=False, shift=-2.5),
            "far2": _dirichlet(rng, 80, labelled=False, shift=-1.0)}


def _all_options(**fields):
    return EvaluationOptions(ood_groups={"near": "near", "far1": "far", "far2": "far"},
                             aupr_trapezoidal=True, **fields)


def _evaluate(a, options, test=None, validation=None):
    return evaluate_outputs(test or a["test"], {n: a[n] for n in ("near", "far1", "far2")},
                            validation=validation or a["validation"], options=options)


def test_sections_equal_direct_calls(arrays):
    a = arrays
    res = _evaluate(a, _all_options(conformal_alpha=0.2, conformal_seed=3))
    test = a["test"]
    p = test.probs
    correct = np.argmax(p, 1) == test.labels
    from gedl_jax.evaluation import scores as scores_lib
    s = scores_lib.confidence_scores(test.alpha, test.prior_strength)
    for name in res["scores"]:
        assert res["id"]["selective"][name] == selective.selective_metrics(correct, s[name])
    assert res["conformal"]["alpha"] == 0.2 and res["conformal"]["seed"] == 3
    assert res["conformal"]["sets"] == conformal.conformal_metrics(
        a["validation"].probs, a["validation"].labels, p, test.labels, 0.2, seed=3)
    assert set(res["conformal"]["sets"]) == {"lac", "aps", "raps", "aps_nonrandomized"}
    far = res["ood_groups"]["far"]
    assert far["sets"] == ["far1", "far2"] and res["ood_groups"]["near"]["sets"] == ["near"]
    for score in res["scores"]:
        for metric, value in far["detection"][score].items():
            per_set = [res["ood"][n]["detection"][score][metric] for n in ("far1", "far2")]
            assert value == pytest.approx(np.mean(per_set), abs=0)
    ood = scores_lib.confidence_scores(a["far1"].alpha, a["far1"].prior_strength)
    det = res["ood"]["far1"]["detection"]["um"]
    assert det["aupr_in_trapezoidal"] == ood_aupr.aupr_trapezoidal(s["um"], ood["um"], "in")
    assert det["aupr_out_trapezoidal"] == ood_aupr.aupr_trapezoidal(s["um"], ood["um"], "out")
    assert det["aupr_in_trapezoidal"] != det["aupr_in"]   # not average precision


def test_default_options_add_no_optional_section_and_keep_the_paper_numbers(arrays):
    a = arrays
    plain = evaluate_outputs(a["test"], {n: a[n] for n in ("near", "far1")})
    assert set(plain) == {"conventions", "scores", "id", "ood", "evaluation_options"}
    assert "aupr_in_trapezoidal" not in plain["ood"]["near"]["detection"]["mp"]
    full = _evaluate(a, _all_options(calibrate=True, calibrator="evidence_scale"))
    for key in ("accuracy", "nll", "brier", "ece", "misclassification", "uncertainty"):
        assert plain["id"][key] == full["id"][key]
    for name in ("near", "far1"):
        for score, det in plain["ood"][name]["detection"].items():
            assert {k: full["ood"][name]["detection"][score][k] for k in det} == det


def test_calibration_never_reads_test_labels(arrays):
    a = arrays
    rng = np.random.default_rng(1)
    permuted = ModelOutputs(a["test"].alpha, a["test"].prior_strength,
                            rng.permutation(a["test"].labels))
    for calibrator in ("evidence_scale", "temperature"):
        opts = _all_options(calibrate=True, calibrator=calibrator)
        fit = _evaluate(a, opts)["posthoc_calibration"]["fit"]
        assert _evaluate(a, opts, test=permuted)["posthoc_calibration"]["fit"] == fit
        # ... while the validation labels do move it (the check can fail)
        val = a["validation"]
        shuffled = ModelOutputs(val.alpha, val.prior_strength, rng.permutation(val.labels))
        assert _evaluate(a, opts, validation=shuffled)["posthoc_calibration"]["fit"] != fit


def test_temperature_and_evidence_scale_fits_equal_direct_calls(arrays):
    a = arrays
    val, test = a["validation"], a["test"]
    res = _evaluate(a, _all_options(calibrate=True, calibrator="evidence_scale"))
    post = res["posthoc_calibration"]
    direct = calibration.fit_evidence_scale(
        calibration.evidence_from_alpha(val.alpha, val.prior_strength), val.prior_strength,
        val.labels)
    assert post["fit"]["scale"] == direct.scale and post["fit"]["calibrator"] == "evidence_scale"
    alpha = calibration.apply_evidence_scale(
        calibration.evidence_from_alpha(test.alpha, test.prior_strength), test.prior_strength,
        direct)
    after = calibration.calibration_summary(alpha / alpha.sum(1, keepdims=True), test.labels)
    assert post["test"]["after"] == after
    assert post["test"]["before"] == calibration.calibration_summary(test.probs, test.labels)
    assert res["calibrated"]["id"]["nll"] == metrics.nll(alpha / alpha.sum(1, keepdims=True),
                                                         test.labels)
    # the evidence scale keeps the UM ranking (u = 1 / (1 + s E / W)); MP may move
    assert "um" not in post["ood_ranking_changed"]
    for entry in post["ood_ranking"]["um"].values():
        assert entry["auroc_before"] == entry["auroc_after"]
        assert entry["ranking_changed"] is False
    temp = _evaluate(a, _all_options(calibrate=True))["posthoc_calibration"]["fit"]
    fit_t = calibration.fit_temperature(calibration.probs_as_logits(val.probs), val.labels)
    assert temp["temperature"] == fit_t.temperature and temp["calibrator"] == "temperature"


def test_categorical_calibration_recomputes_probability_scores_only():
    rng = np.random.default_rng(2)
    test, val = _categorical(rng, 200, scale=4.0), _categorical(rng, 150, scale=4.0)
    ood = {"o": _categorical(rng, 60, labelled=False)}
    res = evaluate_predictions(test, ood, validation=val,
                               options=EvaluationOptions(calibrate=True))
    t = res["posthoc_calibration"]["fit"]["temperature"]
    assert t > 1.0   # over-confident random logits: softened
    p = calibration.apply_temperature(calibration.probs_as_logits(test.probs), t)
    assert res["calibrated"]["id"]["ece"] == metrics.expected_calibration_error(
        p, test.labels).ece
    assert res["calibrated"]["id"]["accuracy"] == res["id"]["accuracy"]   # argmax kept


def test_options_are_checked():
    with pytest.raises(ValueError, match="conformal_alpha"):
        EvaluationOptions(conformal_alpha=1.0)
    with pytest.raises(ValueError, match="calibrator"):
        EvaluationOptions(calibrator="platt")
    with pytest.raises(ValueError, match="ood_groups"):
        EvaluationOptions(ood_groups={"x": "middle"})
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="validation"):
        evaluate_predictions(_categorical(rng, 10), options=EvaluationOptions(calibrate=True))


@pytest.mark.parametrize("labels,message", [
    ([0, 1, 4], r"labels must lie in \[0, 4\)"),
    ([0, -1, 2], r"labels must lie in \[0, 4\)"),
])
def test_evaluate_model_refuses_labels_outside_the_classes(labels, message):
    from gedl_jax.evaluation import evaluate_model

    x = np.zeros((3, 2), np.float32)
    with pytest.raises(ValueError, match=message):
        evaluate_model(lambda b: jnp.zeros((b.shape[0], 4)), (x, np.asarray(labels)),
                       kind="logits")


def test_evaluate_model_batches_every_kind_like_direct_predictions():
    from gedl_jax.evaluation import evaluate_model

    rng = np.random.default_rng(3)
    w = rng.normal(size=(6, 4)).astype(np.float32)
    x, x_val, x_ood = (rng.normal(size=(n, 6)).astype(np.float32) for n in (50, 23, 17))
    y, y_val = rng.integers(0, 4, 50), rng.integers(0, 4, 23)

    def logits(b):
        return jnp.asarray(b) @ w

    inputs = {"test": x, "validation": x_val, "ood": x_ood}
    ref = {name: np.asarray(logits(v), np.float64) for name, v in inputs.items()}
    got = evaluate_model(logits, (x, y), {"o": x_ood}, kind="logits", validation=(x_val, y_val),
                         batch_size=8)
    u = np.finfo(np.float32).eps / 2
    for name, split in (("test", "test"), ("validation", "validation"), ("ood", "ood/o")):
        z = ref[name]
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        # Batches of 8 against one product of the whole split: the same float32 dot products,
        # which a GPU may sum in another order. Each is within 6u sum_i |x_i w_ik| of the exact
        # one (6 terms), so two of them differ by twice that; a softmax turns a logit error e
        # into a relative probability error of at most 2 max|e|, plus its own rounding.
        dz = 2 * 6 * u * (np.abs(inputs[name]).astype(np.float64) @ np.abs(w))
        rtol = 2 * dz.max(1, keepdims=True) + 16 * u
        assert np.all(np.abs(got.predictions[split].probs - p) <= rtol * p), split
    again = evaluate_predictions(got.predictions["test"], {"o": got.predictions["ood/o"]},
                                 validation=got.predictions["validation"])
    assert json.loads(json.dumps(again)) == json.loads(json.dumps(got.results))
    assert "Selective prediction" in got.table and "Conformal" in got.table

    def alpha(b):
        return {"alpha": jnp.exp(logits(b)) + 1.0, "prior_strength": jnp.full(b.shape[0], 4.0)}

    d = evaluate_model(alpha, (x, y), {"o": x_ood}, kind="dirichlet", batch_size=7)
    np.testing.assert_allclose(d.predictions["test"].alpha, np.exp(ref["test"]) + 1, rtol=1e-5)
    assert d.results["evaluation_options"]["calibrator"] == "evidence_scale"

    def samples(b, key):   # three noisy passes, (M, B, K)
        z = logits(b)[None] + jax.random.normal(key, (3, *logits(b).shape))
        return jax.nn.softmax(z, axis=-1)

    s1 = evaluate_model(samples, (x, y), kind="samples", batch_size=16,
                        key=jax.random.PRNGKey(0))
    s2 = evaluate_model(samples, (x, y), kind="samples", batch_size=16,
                        key=jax.random.PRNGKey(0))
    assert s1.predictions["test"].num_examples == 50 and "neg_mi" in s1.results["scores"]
    assert s1.results == s2.results
    with pytest.raises(ValueError, match="kind"):
        evaluate_model(logits, (x, y), kind="energy")


def test_preflight_obtains_the_source_of_a_derived_ood_set(monkeypatch):
    from gedl_jax.run import experiment

    wanted = []
    monkeypatch.setattr(data, "ensure_available", lambda w, **kw: wanted.extend(w))
    c = configs.build_config("mnist", "gedl")
    config_lib.set_fields(c, ood_datasets=("kmnist", "cifar10_gray28"))
    experiment.obtain_inputs(c)
    assert ("cifar10", "test") in wanted and ("kmnist", "test") in wanted
    assert not any(name == "cifar10_gray28" for name, _ in wanted)


# ------------------------------------------------------------------------------ one tiny run
@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny GEDL run on generated MNIST with near (KMNIST, Fashion-MNIST) and far
    (cifar10_gray28, from a generated CIFAR-10) OOD sets, calibrate=True, trapezoidal AUPR."""
    from gedl_jax.run import training

    root = tmp_path_factory.mktemp("data")
    generated = write_generated_data(root)
    write_cifar10_tar(root / "cifar10" / "cifar-10-binary.tar.gz", n_test=100)
    workdir = tmp_path_factory.mktemp("run")
    with fast_compilation(), generated.registered(), registry.override_file_specs(
            "cifar10", "official", specs_for(root / "cifar10", ["cifar-10-binary.tar.gz"])):
        c = configs.build_config("mnist", "gedl")
        config_lib.set_fields(
            c, data_dir=str(root), cache_dir=str(tmp_path_factory.mktemp("cache")),
            download="never", train_examples=256, val_examples=64, batch_size=32,
            num_epochs=1, log_every_steps=4, eval_batch_size=64, learning_rate=3e-3,
            ood_datasets=("kmnist", "fashion_mnist", "cifar10_gray28"), plots=True,
            calibrate=True, aupr_trapezoidal=True,
            # the precision this suite pins (conftest), so that evaluate_model in the test
            # process computes what the run computed (the run applies its own config's; on a
            # GPU "default" would be TF32)
            matmul_precision="highest")
        training.train_and_evaluate(c, workdir)
        yield workdir, c


def _without_provenance(results):
    return {k: v for k, v in results.items() if k not in PROVENANCE}


def test_run_results_and_table_hold_every_section(run):
    workdir, _ = run
    res = json.loads((workdir / "eval_results.json").read_text())
    assert set(res["id"]["selective"]) == set(res["scores"])
    for method in ("lac", "aps", "raps"):
        assert {"coverage", "mean_set_size"} <= set(res["conformal"]["sets"][method])
    assert res["conformal"]["alpha"] == 0.1 and res["validation"]["num_examples"] == 64
    post = res["posthoc_calibration"]
    assert post["fit"]["calibrator"] == "evidence_scale" and post["fit"]["scale"] > 0
    assert set(post["test"]["before"]) == set(post["test"]["after"]) >= {"nll", "ece", "brier"}
    assert res["ood_groups"]["near"]["sets"] == ["kmnist", "fashion_mnist"]
    assert res["ood_groups"]["far"]["sets"] == ["cifar10_gray28"]
    assert "aupr_in_trapezoidal" in res["ood"]["kmnist"]["detection"]["mp"]
    assert "calibrated" in res and "selective" in res["calibrated"]["id"]
    assert set(res["calibrators"]["after"]) == {"temperature", "vector_scaling", "dirichlet",
                                                "isotonic"}
    assert {"nll", "ece", "smooth_ece", "brier"} <= set(res["calibrators"]["before"])
    table = (workdir / "eval_table.md").read_text()
    assert "Calibrators fitted on the validation split" in table and "| isotonic |" in table
    for text in ("Selective prediction", "Conformal prediction sets", "Near / far OOD",
                 ood_aupr.AUPR_TRAPEZOIDAL_HEADER, "Post-hoc calibration",
                 "gedl (calibrated: evidence_scale)"):
        assert text in table, text
    for plot in ("risk_coverage.png", "smooth_reliability_diagram.png"):
        assert (workdir / plot).stat().st_size > 0
        assert str(workdir / plot) in res["plots"]


def test_every_number_is_recomputed_from_predictions_npz(run):
    workdir, _ = run
    res = json.loads((workdir / "eval_results.json").read_text())
    saved = load_predictions(workdir / "predictions.npz")
    assert sorted(saved) == ["ood/cifar10_gray28", "ood/fashion_mnist", "ood/kmnist", "test",
                             "validation"]
    with np.load(workdir / "predictions.npz") as z:
        np.testing.assert_array_equal(z["test/strength"], z["test/alpha"].sum(1))
        assert {"test/labels", "test/score/um", "validation/prior_strength"} <= set(z.files)
    again = evaluate_predictions(
        saved["test"], {k[4:]: v for k, v in saved.items() if k.startswith("ood/")},
        validation=saved["validation"],
        options=EvaluationOptions(**res["evaluation_options"]))
    assert json.loads(json.dumps(again)) == _without_provenance(res)


def test_posthoc_scores_are_saved_apart_from_the_methods_scores(tmp_path):
    from gedl_jax.evaluation import load_posthoc_scores, save_predictions

    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(3), size=5)
    test = Predictions(probs, {"mp": probs.max(1)}, np.arange(5) % 3)
    ood = Predictions(probs[:2], {"mp": probs[:2].max(1)}, None)
    energy = {"test": {"energy": rng.normal(size=5)}, "ood/a": {"energy": rng.normal(size=2)}}
    path = save_predictions(tmp_path / "p.npz", test, {"a": ood}, posthoc=energy)
    assert sorted(load_predictions(path)["test"].scores) == ["mp"]
    back = load_posthoc_scores(path)
    assert sorted(back) == ["ood/a", "test"]
    np.testing.assert_array_equal(back["ood/a"]["energy"], energy["ood/a"]["energy"])
    with pytest.raises(ValueError, match="shape"):
        save_predictions(tmp_path / "q.npz", test, {}, posthoc={"test": {"e": np.ones(4)}})
    with pytest.raises(ValueError, match="not saved"):
        save_predictions(tmp_path / "q.npz", test, {}, posthoc={"ood/b": {"e": np.ones(2)}})
    assert not (tmp_path / "q.npz").exists()


def test_evaluate_model_reproduces_the_cli_results(run):
    from gedl_jax.evaluation import evaluate_model
    from gedl_jax.run import experiment, workdir

    path, _ = run
    res = json.loads((path / "eval_results.json").read_text())
    restored = workdir.restore_run(path)
    exp, state = restored.experiment, restored.state
    mean, std = (None if v is None else jnp.asarray(v) for v in exp.normalization)
    key = experiment.predict_key(exp.seed)

    def predict_fn(images):
        return exp.method.predict(state.variables, state.method_state,
                                  data.to_float(images, mean, std), key)

    got = evaluate_model(predict_fn, exp.data.test, exp.data.ood, kind="dirichlet",
                         validation=exp.data.validation, batch_size=exp.config.eval_batch_size,
                         options=workdir.evaluation_options(exp, exp.data.ood),
                         dataset=exp.config.dataset)
    assert json.loads(json.dumps(got.results)) == _without_provenance(res) | {
        "dataset": res["dataset"]}


def test_tables_of_older_results_are_unchanged_and_new_sections_follow(arrays):
    from gedl_jax.evaluation import results_table

    groups = {"near": "near", "far1": "far", "far2": "far"}
    res = dict(_evaluate(arrays, EvaluationOptions(ood_groups=groups)), variant="m")
    older = {k: v for k, v in res.items() if k in ("conventions", "scores", "id", "ood",
                                                   "variant")}
    older["id"] = {k: v for k, v in res["id"].items() if k != "selective"}
    older["ood"] = {o: {k: v for k, v in e.items() if k != "scod"} for o, e in res["ood"].items()}
    old_table, new_table = results_table([older]).rstrip("\n"), results_table([res])
    assert new_table.startswith(old_table + "\n\n")
    for text in ("Selective prediction", "OOD inputs in the pool", "Conformal", "Near / far"):
        assert text not in old_table and text in new_table
    assert "trapezoidal" not in new_table   # only when computed
