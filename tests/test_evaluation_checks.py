"""The evaluation's input checks live in one module (gedl_jax/evaluation/checks.py): the same
mistake reads the same in every module that takes the input, and a copy that drifted (the
labels check of calibration.py, which did not guard an empty set) cannot drift again."""

import numpy as np
import pytest

from gedl_jax.evaluation import calibration, checks, conformal, core, metrics, posthoc, scores


def test_an_empty_set_passes_the_labels_check_of_calibration_and_conformal(monkeypatch):
    """calibration.py's copy of the labels check called labels.min() on an empty set (numpy's
    "zero-size array to reduction operation minimum" error); conformal.py's guarded it. Both
    modules now call the one check, which guards it: an empty set gets its caller's one-line
    error."""
    empty = checks.class_labels(np.zeros(0, np.int64), 0, 3)
    assert empty.dtype == np.int64 and empty.shape == (0,)
    checked = []
    original = checks.class_labels
    monkeypatch.setattr(checks, "class_labels",
                        lambda labels, *a, **k: checked.append(len(labels)) or original(
                            labels, *a, **k))
    probs, labels = np.array([[0.7, 0.3], [0.4, 0.6], [0.8, 0.2]]), np.array([0, 1, 1])
    calibration.fit_isotonic(probs, labels)
    conformal.calibrate(probs, labels, "lac", 0.5)
    assert checked == [3, 3]
    with pytest.raises(ValueError, match=r"^probs_NxK has no examples\.$"):
        calibration.fit_isotonic(probs[:0], labels[:0])
    with pytest.raises(ValueError, match=r"^the calibration split's probs_NxK has no examples"):
        conformal.calibrate(probs[:0], labels[:0], "lac", 0.5)
    assert checked == [3, 3, 0]   # conformal checks the empty labels, then refuses the set


@pytest.mark.parametrize("call", [
    lambda p, y: metrics.accuracy(p, y),
    lambda p, y: calibration.calibration_summary(p, y),
    lambda p, y: calibration.fit_isotonic(p, y),
    lambda p, y: conformal.calibrate(p, y),
    lambda p, y: posthoc.fit_mahalanobis(p, y, num_classes=2),
], ids=["metrics", "calibration", "isotonic", "conformal", "posthoc"])
def test_a_label_out_of_range_reads_the_same_everywhere(call):
    with pytest.raises(ValueError) as error:
        call(np.full((3, 2), 0.5), np.array([0, 1, 2]))
    assert str(error.value) in ("labels_N must lie in [0, 2).",
                                "train_labels_N must lie in [0, 2).")


@pytest.mark.parametrize("call", [
    metrics.nll, lambda p, y: calibration.calibration_summary(p, y),
    lambda p, y: conformal.calibrate(p, y), lambda p, y: scores.categorical_scores(p),
    lambda p, y: core.Predictions(p, {}, y),
], ids=["metrics", "calibration", "conformal", "scores", "predictions"])
def test_rows_that_do_not_sum_to_one_read_the_same_everywhere(call):
    with pytest.raises(ValueError,
                       match=r"^probs(_NxK)? rows must sum to 1 \(max deviation 0.4 > 0.0001\): "
                             r"pass probabilities \(alpha / S for a Dirichlet\), not logits or "
                             r"alpha\.$"):
        call(np.full((3, 2), 0.3), np.array([0, 1, 0]))


def test_settings_read_the_same_everywhere():
    for call, name in [(lambda: conformal.calibrate(np.full((3, 2), 0.5), [0, 1, 0], alpha=1.0),
                        "alpha"),
                       (lambda: core.EvaluationOptions(conformal_alpha=1.0), "conformal_alpha"),
                       (lambda: core.EvaluationOptions(bootstrap_confidence=1.0),
                        "bootstrap_confidence")]:
        with pytest.raises(ValueError, match=rf"^{name} must lie in \(0, 1\), got 1.0\.$"):
            call()
    for call, name in [(lambda: calibration.apply_temperature(np.zeros((1, 2)), 0.0),
                        "temperature"),
                       (lambda: posthoc.energy_score(np.zeros((1, 2)), 0.0), "temperature")]:
        with pytest.raises(ValueError, match=rf"^{name} must be finite and > 0, got 0.0\.$"):
            call()
