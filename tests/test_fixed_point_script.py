"""studies/gedl_convergence/fixed_point.py: the closed-form minimiser of GEDL's objective.

The claim: E[-log pi_y] + (1/tau) KL(Dir(alpha) || Dir(W a)) equals
(1/tau) [KL(Dir(alpha) || Dir(W a + tau e_y)) - log Z], so its one minimiser is the tempered
posterior Dir(W a + tau e_y). Checked three ways: the library's per-example loss against that
identity in float64 SciPy; a numerical minimisation of the float64 objective (scipy's
L-BFGS-B on the evidence, with GEDL's stop-gradient W updated to its fixed point) against the
script's closed form; and the script's report on a log whose numbers are known.
"""

import json
import math

import jax.numpy as jnp
import numpy as np
import pytest
from scipy import optimize, special

import evidential_reference as ref
from gedl_jax import configs
from gedl_jax.evidential import loss as loss_lib
from gedl_jax.evidential import schedules
from studies.gedl_convergence import fixed_point




def _log_beta(beta):
    return np.sum(special.gammaln(beta), -1) - special.gammaln(np.sum(beta, -1))


def _reference_objective(evidence_K, label, w, a_K, tau):
    """Float64: the digamma NLL plus (1/tau) KL to Dir(W a), W held fixed (stop-gradient)."""
    alpha = evidence_K + w * a_K
    return float(ref.expected_nll(alpha[None], np.array([label]))[0]
                 + ref.kl(alpha[None], (w * a_K)[None])[0] / tau)


@pytest.mark.parametrize("tau", [1.0, 1.7, 10.0])
def test_the_library_loss_is_the_kl_to_the_tempered_posterior_up_to_a_constant(tau):
    num_classes, batch = 10, 64
    rng = np.random.default_rng(int(tau * 10))
    logits_BxK = jnp.asarray(rng.normal(0.0, 3.0, (batch, num_classes)), jnp.float32)
    labels_B = jnp.asarray(rng.integers(0, num_classes, batch))
    spec = loss_lib.LossSpec(num_classes=num_classes, kl_schedule="constant",
                             kl_weight=1.0 / tau)
    loss_B, _, terms = loss_lib.per_example_loss(spec, logits_BxK, labels_B,
                                                 schedules.tau_init(), jnp.int32(0))
    out = loss_lib.evidential_outputs(spec, logits_BxK)
    alpha_BxK = ref.f64(out.alpha_BxK)
    w_B = ref.f64(out.prior_strength_B)
    a_K = np.full(num_classes, 1.0 / num_classes)
    y_BxK = ref.onehot(np.asarray(labels_B), num_classes)
    prior_BxK = w_B[:, None] * a_K
    log_z_B = _log_beta(prior_BxK + tau * y_BxK) - _log_beta(prior_BxK)
    want_B = (ref.kl(alpha_BxK, prior_BxK + tau * y_BxK) - log_z_B) / tau
    # The library's loss is float32; its terms are O(10), so a few float32 ulps of them.
    ref.assert_close(loss_B, want_B, rtol=2e-5, atol=2e-5 * (1 + np.abs(log_z_B) / tau),
                     what="library loss vs (KL to the tempered posterior - log Z) / tau")
    assert np.isclose(float(terms.kl_weight), 1.0 / tau, rtol=1e-6)
    # The script's log Z is the same number.
    script_log_z = [fixed_point.log_normaliser(w, 1.0 / num_classes, tau) for w in w_B]
    np.testing.assert_allclose(script_log_z, log_z_B, rtol=1e-12, atol=1e-12)


def _minimise(label, num_classes, tau, *, c_w=None, fixed_w=None, base_rate=None):
    """Minimise the float64 objective over evidence >= 0. With the adaptive W, alternate: W from
    the current evidence total (stop-gradient, Eq. weight_update), then the evidence for that W,
    until W stops moving."""
    a_K = (np.full(num_classes, 1.0 / num_classes) if base_rate is None
           else np.asarray(base_rate, np.float64))
    evidence = np.full(num_classes, 0.5)
    w = fixed_w
    for _ in range(100):
        if c_w is not None:
            w = c_w + (num_classes - c_w) / (1.0 + num_classes * evidence.sum())
        result = optimize.minimize(
            _reference_objective, evidence, args=(label, w, a_K, tau), method="L-BFGS-B",
            bounds=[(0.0, None)] * num_classes,
            options={"ftol": 1e-15, "gtol": 1e-12, "maxiter": 10_000})
        moved = np.max(np.abs(result.x - evidence))
        evidence = result.x
        if c_w is None or moved < 1e-10:
            break
    return evidence, w, _reference_objective(evidence, label, w, a_K, tau)


@pytest.mark.parametrize("tau", [1.0, 1.5, 4.0])
def test_the_numerical_minimiser_is_the_closed_form_with_the_adaptive_prior(tau):
    num_classes, label = 10, 3
    evidence, w, value = _minimise(label, num_classes, tau, c_w=0.5)
    want = fixed_point.optimum(tau, num_classes, c_w=0.5)
    others = np.delete(evidence, label)
    assert np.max(others) < 1e-6, others
    assert math.isclose(evidence[label], want.evidence_y, rel_tol=1e-5)
    assert math.isclose(w, want.prior_strength, rel_tol=1e-5)
    assert math.isclose(evidence.sum() + w, want.strength, rel_tol=1e-5)
    assert math.isclose(value, want.loss, rel_tol=1e-7)


def test_the_numerical_minimiser_with_a_fixed_prior_and_a_skewed_base_rate():
    num_classes, label, tau = 4, 2, 2.5
    base_rate = np.array([0.1, 0.2, 0.3, 0.4])
    evidence, w, value = _minimise(label, num_classes, tau, fixed_w=4.0, base_rate=base_rate)
    want = fixed_point.optimum(tau, num_classes, prior_strength=4.0,
                               base_rate_y=base_rate[label])
    assert np.max(np.delete(evidence, label)) < 1e-6
    assert math.isclose(evidence[label], tau, rel_tol=1e-5)
    assert math.isclose(value, want.loss, rel_tol=1e-7)
    assert math.isclose(want.max_probability, (4.0 * 0.3 + tau) / (4.0 + tau), rel_tol=1e-12)


@pytest.mark.parametrize("num_classes", [2, 10, 100])
def test_at_tau_one_the_minimum_is_log_k_whatever_w(num_classes):
    # Z = E_prior[pi_y] = a_y at tau = 1, so the minimum is -log a_y = log K (uniform a).
    for kwargs in ({"c_w": 0.5}, {"c_w": 3.0}, {"prior_strength": float(num_classes)}):
        got = fixed_point.optimum(1.0, num_classes, **kwargs)
        assert math.isclose(got.loss, math.log(num_classes), rel_tol=1e-12)
    paper = fixed_point.optimum(1.0, 10, c_w=0.5)   # the paper's MNIST setting
    assert math.isclose(paper.prior_strength, 0.5 + 9.5 / 11)
    assert math.isclose(paper.strength, 1.5 + 9.5 / 11)
    assert math.isclose(paper.uncertainty, paper.prior_strength / paper.strength)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="tau must be"):
        fixed_point.optimum(0.0, 10, c_w=0.5)
    with pytest.raises(ValueError, match="exactly one"):
        fixed_point.optimum(1.0, 10)


def _gedl_config(**overrides) -> dict:
    """The config.json a GEDL run writes (the real config's fields, so a rename fails here)."""
    config = configs.build_config("mnist", "gedl")
    config.update(overrides)
    return json.loads(config.to_json_best_effort())


def _write_run(path, config, kl_weights, off_by=0.0, accuracies=None):
    """A log whose every epoch's training S is the closed form's (times 1 + off_by)."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    rows = []
    for epoch, kl_weight in enumerate(kl_weights, start=1):
        step = 10 * epoch
        opt = fixed_point.optimum_for(config, 1.0 / kl_weight)
        rows += [{"step": step - 5, "split": "train", "kl_weight": kl_weight,
                  "mean_strength": 99.0, "mean_prior_strength": 0.0, "loss": 0.0},
                 {"step": step, "split": "train", "kl_weight": kl_weight,
                  "mean_strength": opt.strength * (1 + off_by),
                  "mean_prior_strength": opt.prior_strength, "loss": opt.loss},
                 {"step": step, "split": "validation",
                  "accuracy": 0.9 if accuracies is None else accuracies[epoch - 1]},
                 {"step": step, "split": "epoch_eval", "test_strength": opt.strength}]
    (path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


def test_report_of_a_run_at_its_optimum(tmp_path, capsys):
    run = tmp_path / "runs" / "gedl" / "seed_0"
    _write_run(run, _gedl_config(), [0.25, 0.5, 1.0, 1.0])
    out = tmp_path / "fixed_point.md"
    assert fixed_point.main([str(run), f"--out={out}"]) == 0
    text = out.read_text()
    assert text.rstrip("\n") == capsys.readouterr().out.rstrip("\n")
    assert "### runs/gedl/seed_0" in text                 # no machine path in the report
    assert "| 3 | 1.000 | 2.364 | 2.364 | 2.364 | 1.3636 | 1.3636 | 2.3026 | 2.3026 |" in text
    assert "| 1 | 0.250 | 4.732 | 4.732 |" in text        # tau = 4: W* = 0.5 + 9.5 / 41
    assert "over the last 2 epochs: 0.00%" in text
    assert "1/tau = 1 from epoch 3 to the end" in text and "u* = 0.5769" in text


def test_report_measures_the_gap(tmp_path, capsys):
    run = tmp_path / "r"
    _write_run(run, _gedl_config(), [0.5, 1.0], off_by=0.05)
    assert fixed_point.main([str(run)]) == 0
    assert "over the last 1 epochs: 5.00%" in capsys.readouterr().out


def test_fixed_prior_strength_is_read_from_the_config(tmp_path):
    config = _gedl_config(prior_strength="fixed", prior_strength_value="0.1K")
    assert math.isclose(fixed_point.optimum_for(config, 2.0).prior_strength, 1.0)
    config = _gedl_config(prior_strength="fixed", prior_strength_value="K")
    assert math.isclose(fixed_point.optimum_for(config, 2.0).strength, 12.0)


@pytest.mark.parametrize("overrides, message", [
    ({"kl_target": "masked"}, "no finite optimum"),
    ({"likelihood": "mse"}, "needs 'digamma'"),
    ({"red_regularizer_weight": 1.0}, "an extra term"),
])
def test_runs_the_closed_form_is_not_about_are_refused(tmp_path, capsys, overrides, message):
    run = tmp_path / "r"
    _write_run(run, _gedl_config(), [1.0])
    (run / "config.json").write_text(json.dumps(_gedl_config(**overrides)))
    assert fixed_point.main([str(run)]) == 2
    assert message in capsys.readouterr().err


def test_a_folder_without_a_log_is_named(tmp_path, capsys):
    assert fixed_point.main([str(tmp_path)]) == 2
    assert "config.json is missing" in capsys.readouterr().err



def test_the_evaluated_checkpoint_is_the_first_best_validation_epoch(tmp_path, capsys):
    run = tmp_path / "r"
    config = _gedl_config()
    _write_run(run, config, [0.25, 0.5, 1.0, 1.0], accuracies=[0.9, 0.95, 0.95, 0.94])
    # A resumed run logs epoch 2's end again: its last rows count.
    with open(run / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 20, "split": "train", "kl_weight": 0.5, "mean_strength": 3.0,
                            "mean_prior_strength": 1.0, "loss": 1.0}) + "\n")
    at_2 = fixed_point.optimum_for(config, 2.0)
    (run / "eval_results.json").write_text(json.dumps(
        {"id": {"accuracy": 0.99, "ece": 0.25, "uncertainty": {"strength": 3.5}}}))
    assert fixed_point.main([str(run)]) == 0
    out = capsys.readouterr().out
    assert "| 2 | 0.500 | 3.000 |" in out
    assert (f"Evaluated checkpoint: epoch 2 (1/tau = 0.500). Test-set mean S: S* = "
            f"{at_2.strength:.3f}, measured 3.500. ECE: |accuracy 0.9900 - max probability at the "
            f"optimum {at_2.max_probability:.4f}| = {0.99 - at_2.max_probability:.4f}, "
            f"measured 0.2500.") in out


def _library_schedule(config, start_sum, epochs):
    """The library's own tau accumulator and tau, fed each epoch the strength that is the
    optimum's at that epoch's tau (found by iterating, the epoch's state not yet advanced)."""
    c_tau, form = float(config["c_tau"]), config["tau_form"]
    state, _ = schedules.tau_accumulate(schedules.tau_init(), start_sum, epoch=0)
    weights = []
    for epoch in range(1, epochs + 1):
        strength = 10.0
        for _ in range(60):
            _, cumulative = schedules.tau_accumulate(state, strength, epoch=epoch)
            tau = float(schedules.gedl_tau(cumulative, c_tau, form))
            strength = fixed_point.optimum_for(config, tau).strength
        state, _ = schedules.tau_accumulate(state, strength, epoch=epoch)
        weights.append(1.0 / tau)
    return weights


@pytest.mark.parametrize("form, c_tau, start_sum", [("c_over_sum", 100.0, 30.0),
                                                    ("c_over_sum", 1000.0, 100.0),
                                                    ("sum_over_c", 100.0, 60.0)])
def test_the_predicted_schedule_is_the_librarys_schedule_at_the_optimum(form, c_tau,
                                                                        start_sum):
    config = _gedl_config(c_tau=c_tau, tau_form=form)
    predicted = fixed_point.predicted_schedule(config, 5, start_sum, 45)
    assert [t for t, _, _ in predicted] == list(range(6, 46))
    want = _library_schedule(config, start_sum, 40)
    np.testing.assert_allclose([w for _, w, _ in predicted], want, rtol=2e-5)
    for _, weight, strength in predicted:   # each epoch's S is the optimum's at its tau
        assert math.isclose(strength, fixed_point.optimum_for(config, 1 / weight).strength)
    weights = [w for _, w, _ in predicted]
    if form == "c_over_sum" and c_tau == 100.0:   # rises to 1 and stays
        assert weights[0] < 1.0 and weights[-1] == 1.0
    if form == "sum_over_c":                       # 1 until the sum passes C_tau, then falls
        assert weights[0] == 1.0 and weights[-1] < 1.0


def test_a_schedule_already_at_one_stays_there():
    config = _gedl_config()
    assert fixed_point.predicted_schedule(config, 40, 150.0, 42) == [
        (41, 1.0, fixed_point.optimum_for(config, 1.0).strength),
        (42, 1.0, fixed_point.optimum_for(config, 1.0).strength)]


def test_the_starting_sum_is_read_back_from_the_log():
    rows = [fixed_point.EpochRow(e, w, s, 0.0, 0.0, None, None)
            for e, w, s in ((1, 0.25, 9.0), (2, 0.5, 5.0), (3, 1.0, 2.5))]
    over = _gedl_config()
    under = _gedl_config(tau_form="sum_over_c")
    assert math.isclose(fixed_point.starting_sum(over, rows, 2), 100.0 * 0.5)
    assert math.isclose(fixed_point.starting_sum(under, rows, 2), 100.0 / 0.5)
    # tau at its floor: the sum is not in the weight, so the log's strengths are summed
    assert math.isclose(fixed_point.starting_sum(under, rows, 3), 9.0 + 5.0 + 2.5)


@pytest.mark.parametrize("overrides", [{"tau_reading": "step"}, {"warmup_epochs": 1},
                                       {"kl_schedule": "edl_anneal"}, {"kl_weight": 0.5}])
def test_the_schedule_is_predicted_for_the_epoch_reading_only(overrides):
    with pytest.raises(ValueError, match="predicted for"):
        fixed_point.predicted_schedule(_gedl_config(**overrides), 5, 30.0, 10)


def test_report_with_a_predicted_schedule(tmp_path, capsys):
    run = tmp_path / "r"
    config = _gedl_config()
    weights = [w for _, w, _ in fixed_point.predicted_schedule(config, 0, 5.0, 40)]
    _write_run(run, config, weights)
    assert fixed_point.main([str(run), "--predict_from=2", "--predict_to=60"]) == 0
    out = capsys.readouterr().out
    assert "The schedule predicted from epoch 2's logged 1/tau alone:" in out
    assert "Largest |1/tau predicted - logged| over the 38 logged epochs after epoch 2: 0.0000." \
        in out
    first_one = next(t for t, w in enumerate(weights, start=1) if w >= 1.0)
    assert f"The weight reaches 1 at epoch {first_one} and stays there." in out
    assert "| 60 | 1.000 |  | 2.364 |  |" in out
    assert "At epoch 60: 1/tau 1.000, S* 2.364, max probability 0.481." in out
    step_run = tmp_path / "s"
    _write_run(step_run, _gedl_config(tau_reading="step"), [1.0])
    assert fixed_point.main([str(step_run), "--predict_from=1"]) == 0
    assert "(No predicted schedule: the schedule is predicted for" in capsys.readouterr().out


def test_epochs_without_the_kl_are_left_out_and_a_log_without_epochs_is_named(tmp_path,
                                                                              capsys):
    config = _gedl_config(kl_schedule="edl_anneal")
    run = tmp_path / "anneal"
    _write_run(run, config, [0.5, 1.0])
    lines = (run / "metrics.jsonl").read_text().splitlines()
    # EDL's annealing: weight 0 in the first epoch
    first = [json.loads(x) for x in lines[:4]]
    for row in first:
        if row["split"] == "train":
            row["kl_weight"] = 0.0
    (run / "metrics.jsonl").write_text("\n".join([json.dumps(r) for r in first] + lines[4:]))
    assert fixed_point.main([str(run)]) == 0
    out = capsys.readouterr().out
    assert "\n| 2 | 1.000 |" in out and "\n| 1 | " not in out   # epoch rows start lines
    no_epochs = tmp_path / "no_epochs"
    _write_run(no_epochs, config, [1.0])
    lines = [x for x in (no_epochs / "metrics.jsonl").read_text().splitlines()
             if '"validation"' not in x]
    (no_epochs / "metrics.jsonl").write_text("\n".join(lines))
    assert fixed_point.main([str(no_epochs)]) == 2
    assert "no validation rows" in capsys.readouterr().err
    sparse = tmp_path / "sparse"
    _write_run(sparse, _gedl_config(eval_every_epochs=2), [1.0])
    assert fixed_point.main([str(sparse)]) == 2
    assert "eval_every_epochs=2" in capsys.readouterr().err


def test_the_other_form_of_the_schedule_is_predicted_from_the_logged_strengths(tmp_path,
                                                                                capsys):
    """`--predict_form=sum_over_c` on a run of the printed form: the inverse reading's schedule
    from the strength the log sums to, with the evaluated epoch's optimum."""
    run = tmp_path / "r"
    config = _gedl_config()
    weights = [w for _, w, _ in fixed_point.predicted_schedule(config, 0, 5.0, 30)]
    _write_run(run, config, weights, accuracies=[0.5 + 0.01 * e for e in range(30)])
    (run / "eval_results.json").write_text(json.dumps({"id": {"accuracy": 0.8, "ece": 0.3}}))
    assert fixed_point.main([str(run), "--predict_from=1", "--predict_to=300",
                             "--predict_form=sum_over_c"]) == 0
    out = capsys.readouterr().out
    logged_s1 = fixed_point.optimum(1.0 / weights[0], 10, c_w=0.5).strength
    assert f"tau_form=sum_over_c (not this run's), predicted from the strength the log sums " \
           f"to by epoch 1 ({logged_s1:.2f})" in out
    want = fixed_point.predicted_schedule({**config, "tau_form": "sum_over_c"}, 1, logged_s1,
                                          300)
    at_30, at_300 = want[28], want[-1]
    assert at_30[0] == 30 and f"| 30 | {at_30[1]:.3f} |  | {at_30[2]:.3f} |  |" in out
    assert at_300[1] < 0.5   # sum / C_tau passes 2 well before epoch 300
    p30 = fixed_point.optimum(1.0 / at_30[1], 10, c_w=0.5).max_probability
    assert (f"At epoch 30 (this run's evaluated checkpoint): 1/tau {at_30[1]:.3f}, S* "
            f"{at_30[2]:.3f}, max probability {p30:.3f}.") in out
