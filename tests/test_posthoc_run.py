"""The post-hoc OOD scores in a run's evaluation (config.posthoc_scores): a tiny softmax run on
generated data writes the "posthoc" section and every example's scores (predictions.npz),
each number recomputed here from those files; MSP is the softmax's own MP, so its detection
equals the main table's; "none" leaves them out, an unknown name is one error before any
work, and a method without logits gets none."""

import json
import types

import numpy as np
import pytest
from test_train import data_dir, tiny_config  # noqa: F401

from gedl_jax import evaluation, methods, train
from gedl_jax.evaluation import metrics, posthoc
from gedl_jax.run import workdir as run_workdir


@pytest.fixture(scope="module")
def softmax_run(data_dir, tmp_path_factory):  # noqa: F811
    workdir = tmp_path_factory.mktemp("softmax")
    c = tiny_config(data_dir, "softmax", evaluate_at_end=True, eval_examples=60,
                    ood_datasets="kmnist,fashion_mnist", bootstrap_samples=200)
    train.train_and_evaluate(c, workdir)
    return workdir


def test_a_softmax_run_writes_every_posthoc_score_and_its_results(softmax_run):
    res = json.loads((softmax_run / "eval_results.json").read_text())
    section = res["posthoc"]
    assert section["scores"] == list(posthoc.POSTHOC_SCORE_NAMES)
    assert section["settings"]["fitted_on"] == "train" and section["settings"]["knn_k"] == 50
    posthoc_by_split = evaluation.load_posthoc_scores(softmax_run / "predictions.npz")
    assert set(posthoc_by_split) == {"test", "ood/kmnist", "ood/fashion_mnist"}
    saved = {f"{split}/score/{name}": values for split, by_score in posthoc_by_split.items()
             for name, values in by_score.items()}
    predictions = np.load(softmax_run / "predictions.npz")
    # apart from the method's own scores, which they leave as they are
    own = evaluation.load_predictions(softmax_run / "predictions.npz")["test"].scores
    assert set(own) == {"mp", "neg_entropy"}   # the softmax's own (categorical) scores
    labels = predictions["test/labels"]
    probs = predictions["test/probs"]
    for ood in ("kmnist", "fashion_mnist"):
        for score in section["scores"]:
            want = metrics.ood_detection(saved[f"test/score/{score}"],
                                         saved[f"ood/{ood}/score/{score}"])
            assert section["ood"][ood]["detection"][score] == pytest.approx(want), (ood, score)
        # MSP is the softmax's max probability: the main table's MP, to float64 rounding
        np.testing.assert_allclose(saved["test/score/msp"], probs.max(1), rtol=1e-6)
        assert section["ood"][ood]["detection"]["msp"]["auroc"] == pytest.approx(
            res["ood"][ood]["detection"]["mp"]["auroc"], abs=1e-6)
    correct = probs.argmax(1) == labels
    assert section["misclassification"]["energy"] == pytest.approx(
        metrics.misclassification_detection(correct, saved["test/score/energy"]))
    table = (softmax_run / "eval_table.md").read_text()
    assert "Post-hoc OOD scores" in table and "| neg_knn_distance |" in table


def test_the_posthoc_scores_get_bootstrap_intervals_on_the_methods_draws(softmax_run):
    """With bootstrap_samples, the post-hoc scores get intervals too ("posthoc" ->
    "bootstrap"), each the percentile interval of the metric on explicitly resampled saved
    scores, drawn as the method's own scores are drawn: MSP, the softmax's own MP, gets MP's
    interval."""
    from gedl_jax.evaluation import bootstrap, report

    res = json.loads((softmax_run / "eval_results.json").read_text())
    boot = res["posthoc"]["bootstrap"]
    assert boot["settings"] == {"samples": 200, "confidence": 0.95, "seed": 0,
                                "method": "percentile"}
    saved = evaluation.load_posthoc_scores(softmax_run / "predictions.npz")
    labels = np.load(softmax_run / "predictions.npz")["test/labels"]
    probs = np.load(softmax_run / "predictions.npz")["test/probs"]
    n = labels.size
    id_draws = list(bootstrap.resample_indices(n, 200, 0, "id"))
    for ood in ("kmnist", "fashion_mnist"):
        m = saved[f"ood/{ood}"]["energy"].size
        ood_draws = list(bootstrap.resample_indices(m, 200, 0, f"ood/{ood}"))
        for score in ("energy", "neg_mahalanobis"):
            values = [metrics.ood_detection(saved["test"][score][i],
                                            saved[f"ood/{ood}"][score][o])["auroc"]
                      for i, o in zip(id_draws, ood_draws, strict=True)]
            want = bootstrap.interval(np.array(values), 0.95)
            got = boot["ood"][ood][score]["auroc"]
            assert (got["low"], got["high"]) == pytest.approx((want["low"], want["high"]),
                                                              abs=1e-12), (ood, score)
        for k in ("aupr_in", "auroc"):
            assert boot["ood"][ood]["msp"][k]["low"] == pytest.approx(
                res["bootstrap"]["ood"][ood]["mp"][k]["low"], abs=1e-6), (ood, k)
    correct = probs.argmax(1) == labels
    values = [metrics.misclassification_detection(correct[i], saved["test"]["energy"][i])["aupr"]
              for i in id_draws]
    assert boot["misclassification"]["energy"]["aupr"]["high"] == pytest.approx(
        bootstrap.interval(np.array(values), 0.95)["high"], abs=1e-12)
    table = report.results_table([res])
    energy = res["posthoc"]["ood"]["kmnist"]["detection"]["energy"]["auroc"] * 100
    low = boot["ood"]["kmnist"]["energy"]["auroc"]["low"] * 100
    row = next(line for line in table.splitlines()
               if "| kmnist | energy |" in line and " [" in line)
    assert f"| {energy:.2f} [{low:.2f}, " in row


def test_one_pass_gives_the_predictions_and_posthoc_outputs_of_two(softmax_run):
    """The evaluation's predictor adds the post-hoc outputs to the predictions in one program
    (one network pass): bit for bit the predictor without them, and the post-hoc outputs of
    `method.posthoc_outputs` compiled alone."""
    import jax

    from gedl_jax import data
    from gedl_jax.run import inference, numerics, steps, workdir

    run = workdir.restore_run(softmax_run)
    exp, state = run.experiment, run.state
    split = exp.data.test

    def outputs(step):
        return inference.predict_split(step, state.variables, state.method_state, run.mesh,
                                       split, exp.config.eval_batch_size, jax.random.PRNGKey(0))

    both = outputs(steps.make_predict_step(exp.method, run.mesh, with_posthoc=True))
    raw, post = steps.split_posthoc(both)
    alone = outputs(steps.make_predict_step(exp.method, run.mesh))
    posthoc_alone = outputs(jax.jit(lambda v, m, x, k: exp.method.posthoc_outputs(
        v, data.to_float(x))))
    assert set(raw) == set(alone) and set(post) == {"features_BxF", "logits_BxK"}
    for name in alone:
        np.testing.assert_array_equal(raw[name], alone[name], err_msg=name)
    for name in post:
        np.testing.assert_array_equal(post[name], posthoc_alone[name], err_msg=name)
    # the written scores come from those outputs, computed under the run's products as the
    # evaluation computed them (the suite's are float32, "highest"; a GPU run's "default" is
    # TF32, whose logits differ from float32 ones in the fourth digit)
    with numerics.precision(exp.config):
        _, evaluated = steps.split_posthoc(outputs(steps.make_predict_step(
            exp.method, run.mesh, with_posthoc=True)))
    saved = evaluation.load_posthoc_scores(softmax_run / "predictions.npz")["test"]
    np.testing.assert_array_equal(saved["energy"],
                                  posthoc.energy_score(evaluated["logits_BxK"]))


def test_predict_fetches_no_posthoc_output_and_gives_the_evaluations_predictions(
        softmax_run, monkeypatch):
    """`workdir.predict` (validation, the corruption study, a notebook) runs the evaluation's
    program but leaves the post-hoc outputs on the device: the same predictions, no features
    copied to the host unused."""
    from gedl_jax.run import inference, steps, workdir

    run = workdir.restore_run(softmax_run)
    fetched = []
    real = inference.PendingPredictions.fetch

    def recording(self, keep_output=None):
        out = real(self, keep_output)
        fetched.append(sorted(out))
        return out

    monkeypatch.setattr(inference.PendingPredictions, "fetch", recording)
    split = run.experiment.data.test
    plain = workdir.predict(run, split)
    with_posthoc, outputs = workdir._predict_with_posthoc(run, split)
    assert not any(k.startswith(steps.POSTHOC_PREFIX) for k in fetched[0]), fetched[0]
    assert any(k.startswith(steps.POSTHOC_PREFIX) for k in fetched[1]), fetched[1]
    assert set(outputs) == {"features_BxF", "logits_BxK"}
    np.testing.assert_array_equal(plain.probs, with_posthoc.probs)
    assert set(plain.scores) == set(with_posthoc.scores)
    for name in plain.scores:
        np.testing.assert_array_equal(plain.scores[name], with_posthoc.scores[name])
    saved = evaluation.load_predictions(softmax_run / "predictions.npz")["test"]
    np.testing.assert_array_equal(plain.probs, saved.probs)


def test_none_leaves_them_out_and_a_method_without_logits_gets_none(data_dir, tmp_path):  # noqa: F811
    c = tiny_config(data_dir, "softmax", evaluate_at_end=True, eval_examples=40,
                    ood_datasets="kmnist", num_epochs=1, posthoc_scores="none")
    train.train_and_evaluate(c, tmp_path / "none")
    assert "posthoc" not in json.loads((tmp_path / "none" / "eval_results.json").read_text())
    assert evaluation.load_posthoc_scores(tmp_path / "none" / "predictions.npz") == {}
    duq = tiny_config(data_dir, "duq", evaluate_at_end=True, eval_examples=40,
                      ood_datasets="kmnist", num_epochs=1)
    train.train_and_evaluate(duq, tmp_path / "duq")
    assert "posthoc" not in json.loads((tmp_path / "duq" / "eval_results.json").read_text())


def test_an_unknown_score_is_refused_before_any_work(data_dir):  # noqa: F811
    c = tiny_config(data_dir, "softmax", posthoc_scores="msp,odin")
    with pytest.raises(ValueError, match="config.posthoc_scores='msp,odin'.*odin"):
        methods.check_config(c)


@pytest.mark.parametrize("num_train, knn", [(posthoc.KNN_DEFAULT_K - 1, False),
                                            (posthoc.KNN_DEFAULT_K, True)])
@pytest.mark.parametrize("asked", ["auto", "energy,neg_knn_distance"])
def test_knn_is_left_out_when_the_training_split_is_smaller_than_k(monkeypatch, capsys,
                                                                   num_train, knn, asked):
    """KNN's k-th nearest training feature needs k training examples: a smaller training split
    (a tiny own dataset) leaves the score out with a line saying so, before the evaluation,
    instead of failing after the training; the other scores stay."""
    monkeypatch.setattr(run_workdir, "posthoc_features", lambda exp: True)
    exp = types.SimpleNamespace(
        config={"posthoc_scores": asked},
        method=types.SimpleNamespace(posthoc_from_logits=True),
        data=types.SimpleNamespace(train=np.zeros(num_train)))
    names = run_workdir.posthoc_names(exp)
    assert ("neg_knn_distance" in names) is knn
    assert "energy" in names
    if asked == "auto":
        assert set(names) | {"neg_knn_distance"} == set(posthoc.POSTHOC_SCORE_NAMES)
    said = capsys.readouterr().out
    assert ("neg_knn_distance left out" in said) is not knn, said
