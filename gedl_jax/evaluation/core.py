"""Evaluation of Dirichlet outputs on an in-distribution set and OOD sets: the paper's numbers.

Works on plain arrays (``ModelOutputs``: alpha, per-example prior strength W, labels, optional
padding mask); no model code is needed. ``evaluate_outputs`` returns a JSON-serialisable dict
(fractions in [0, 1]; NaN is written as null) whose ``"conventions"`` entry states every choice.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats

from gedl_jax.evaluation import bootstrap as bootstrap_lib
from gedl_jax.evaluation import calibration as calibration_lib
from gedl_jax.evaluation import checks, metrics, sections
from gedl_jax.evaluation import scores as scores_lib

__all__ = ["CALIBRATORS", "CONVENTIONS", "EvaluationOptions", "ModelOutputs", "Predictions",
           "calibrated_predictions", "dirichlet_predictions", "evaluate_outputs",
           "evaluate_predictions", "summarise_measures", "severity_summary",
           "rank_correlations", "ensemble_epistemic_uncertainty"]

# Stated in every result JSON and (abridged) in every table header.
CONVENTIONS: dict[str, str] = {
    "aupr": "AUPR = average precision, step-wise sum_n (R_n - R_{n-1}) P_n over distinct "
            "thresholds (= sklearn.metrics.average_precision_score, ties included); not the "
            "trapezoidal area.",
    "auroc": "AUROC = trapezoidal ROC area (= sklearn.metrics.roc_auc_score); a tie counts 1/2.",
    "positives": "Conf. (misclassification detection): correct predictions are positive. OOD "
                 "'aupr_in' and 'auroc': in-distribution positive (the paper's columns); "
                 "'aupr_out': OOD positive with the negated score.",
    "fpr95": "fpr95 = fraction of OOD examples at or above the first score threshold that keeps "
             ">= 95% of the in-distribution examples (no interpolation).",
    "scores": "Scores are higher = more confident / more in-distribution. MP = max_k p_k, the "
              "max predictive probability (alpha_k/S for a Dirichlet); UM, only for methods with "
              "a precision: -u = -W/S with the per-example prior strength W for the EDL family "
              "(for a constant W this ranks like S, the reference code's alpha0; for GEDL's "
              "adaptive W it does not), log alpha_0 for Prior Networks, PostNet and DAEDL, "
              "log(alpha_0 + tau) for F-EDL; for a Dirichlet neg_mi, neg_differential_entropy, "
              "neg_expected_entropy are negated closed forms (float64); strength = S; "
              "max_alpha = max_k alpha_k. neg_entropy = -H(p); for MC Dropout passes and "
              "ensemble members neg_mi = -(H(mean p) - mean H(p)).",
    "units": "All values are fractions in [0, 1] in this JSON; tables print accuracy and "
             "AUPR/AUROC in %.",
    "ece": "ECE: top-label, confidence = max_k alpha_k/S; 'ece' uses 15 equal-width bins "
           "(lower, upper] on [0, 1] (R-EDL's _ECELoss); 'ece_adaptive' uses 15 equal-mass bins.",
    "ece_direction": "'ece_overconfidence' + 'ece_underconfidence' = 'ece': the part of its sum "
                     "from the bins whose mean confidence is above (below) their accuracy.",
    "ece_classwise": "'ece_classwise' (Kull et al. 2019): the mean over classes k of the 15-bin "
                     "equal-width ECE of p_k against [y = k].",
    "brier": "brier = mean_i sum_k (p_ik - y_ik)^2 (standard multi-class, in [0, 2]); "
             "brier_l2 = mean_i ||p_i - y_i||_2 (un-squared variant of the I-EDL/R-EDL code).",
    "nll": "nll = mean_i -log p_{i,y_i} with p = alpha/S clipped to [eps, 1-eps], natural log.",
    "accuracy": "accuracy = mean [argmax_k alpha_k == y].",
    "masking": "Rows with mask False (padding) are dropped before anything is computed; every "
               "real example is scored exactly once.",
    "selective": "id.selective.<score>: selective prediction on the test set, correct = "
                 "[argmax p == y], accepted = {score >= t}; ties accepted together (one curve "
                 "point per distinct score); risk = 0/1 error rate among the accepted; AURC = "
                 "mean selective risk at coverages 1/N..N/N (step-wise, right endpoint); E-AURC "
                 "= AURC - AURC of an oracle score on the same grid; AUGRC = the same area of "
                 "errors accepted / N; risk_at_coverage_c = risk of the first point with "
                 "coverage >= c (no interpolation); coverage_at_risk_r = largest coverage with "
                 "risk <= r (0 if none). gedl_jax.evaluation.selective.",
    "conformal": "conformal: split conformal sets calibrated on the validation split (never the "
                 "test set), evaluated on the test set: q_hat = the ceil((n+1)(1-alpha))-th "
                 "smallest validation score (+inf when that exceeds n); set = {y : E(x, y) <= "
                 "q_hat}; LAC E = 1 - p_y; APS E = sum of p over the labels ranked before y + u "
                 "p_y; RAPS adds 0.01 (rank(y) - 1)^+; u ~ U(0,1) from numpy default_rng([seed, "
                 "0]) (validation) and ([seed, 1]) (test); aps_nonrandomized uses u = 1; sets may "
                 "be empty. coverage = fraction of test labels in their set. "
                 "gedl_jax.evaluation.conformal.",
    "ood_groups": "ood_groups.<group>.sets: the evaluated OOD sets the ID dataset declares "
                  "'near' or 'far' (gedl_jax.data.OOD_GROUPS, the OpenOOD protocol) or the "
                  "run's config.ood_groups declares so; "
                  "ood_groups.<group>.detection: the unweighted mean over those sets of each "
                  "detection metric (null if any set's value is null).",
    "bootstrap": "bootstrap (only with bootstrap_samples > 0): intervals [low, high] at "
                 "bootstrap_confidence (settings.method: percentile, or basic = the percentile "
                 "bounds reflected about the metric on all examples) and the standard error se "
                 "of each metric over "
                 "bootstrap_samples replicates that draw the test examples and, independently, "
                 "each OOD set's examples with replacement (seeded); undefined = replicates "
                 "where the metric is undefined, left out. gedl_jax.evaluation.bootstrap.",
    "aupr_trapezoidal": "aupr_in_trapezoidal / aupr_out_trapezoidal (only with "
                        "aupr_trapezoidal=True): OpenOOD v1.5's AUPR, the trapezoidal area "
                        "sklearn.metrics.auc(recall, precision) through precision_recall_curve's "
                        "points (incl. (recall 0, precision 1)); not average precision.",
    "posthoc_calibration": "posthoc_calibration (only with calibrate=True): one parameter fitted "
                           "to minimise the validation NLL (never test data): 'temperature' "
                           "p = softmax(log p / T) for categorical outputs; 'evidence_scale' "
                           "alpha = s e + W a with e = alpha - W a for the EDL family (keeps "
                           "the ranking by u = W/S and, for a uniform a, the predicted class). "
                           "Before/after: accuracy, NLL, Brier, 15-bin ECE on validation and "
                           "test. ood_ranking: detection before/after and whether the pooled "
                           "ID+OOD ranks (ties averaged) of a score changed. 'calibrated': the "
                           "whole evaluation of the calibrated predictions (scores that are "
                           "functions of p, or of alpha for the evidence scale, recomputed).",
    "calibrators": "calibrators (only with calibrate=True): temperature scaling, vector scaling, "
                   "Dirichlet calibration (matrix scaling of log p with an off-diagonal and "
                   "bias L2 of 0.01) and one-vs-rest isotonic regression, each fitted on the "
                   "validation split's log predictive probabilities and labels and applied to "
                   "the test set: accuracy, NLL, Brier, 15-bin ECE and SmoothECE (Blasiok and "
                   "Nakkiran 2023, top-label) before and after, and whether each kept every "
                   "test example's predicted class and the order of the examples by max "
                   "probability.",
    "scod": "ood.<set>.scod: selective prediction with OOD inputs in the pool (SCOD): the "
            "test set plus that OOD set ranked by each score, an accepted OOD input counting "
            "as an error; the id.selective metrics over that pool, and num_ood.",
    "validation": "validation: the run's validation split (carved from the training split), "
                  "used only to fit post-hoc calibration and calibrate conformal sets.",
}


@dataclasses.dataclass(frozen=True, eq=False)
class ModelOutputs:
    """Dirichlet outputs of a model on one evaluation set.

    Attributes:
      alpha: (N, K) Dirichlet parameters, > 0.
      prior_strength: (N,) prior strength W of each example (a scalar is broadcast to (N,)).
      labels: (N,) integer class indices, or None (OOD sets without labels in the ID label space).
      mask: optional (N,) bool; False marks padding rows, which are ignored everywhere.
    Arrays are converted to NumPy (float64 / int64 / bool) and validated on construction (real
    rows only: padding rows may hold anything).
    """

    alpha: np.ndarray
    prior_strength: np.ndarray
    labels: np.ndarray | None = None
    mask: np.ndarray | None = None

    def __post_init__(self):
        alpha = checks.matrix(self.alpha, "alpha")
        n = alpha.shape[0]
        w = checks.prior_strength(self.prior_strength, n, "prior_strength")
        mask = checks.mask(self.mask, n, "mask")
        labels = None if self.labels is None else checks.class_labels(
            self.labels, n, alpha.shape[1], "labels", rows=mask)
        checks.dirichlet(alpha if mask is None else alpha[mask], w if mask is None else w[mask])
        object.__setattr__(self, "alpha", alpha.copy())   # the caller's array stays theirs
        object.__setattr__(self, "prior_strength", w)
        object.__setattr__(self, "labels", labels)
        object.__setattr__(self, "mask", mask)

    @property
    def num_classes(self) -> int:
        return int(self.alpha.shape[1])

    @property
    def num_examples(self) -> int:
        """Number of real (unpadded) examples."""
        return int(self.alpha.shape[0] if self.mask is None else self.mask.sum())

    def unpadded(self) -> ModelOutputs:
        """The same outputs with padding rows removed and mask=None."""
        if self.mask is None:
            return self
        m = self.mask
        return ModelOutputs(self.alpha[m], self.prior_strength[m],
                            None if self.labels is None else self.labels[m], None)

    @property
    def probs(self) -> np.ndarray:
        """Projected probabilities alpha / S, (N, K) float64 (padding rows included)."""
        return self.alpha / self.alpha.sum(axis=1, keepdims=True)


def _clean(x: Any) -> Any:
    """NaN/inf -> None and NumPy scalars -> Python, recursively, for strict JSON."""
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    return x


def summarise_measures(outputs: ModelOutputs) -> dict[str, float]:
    """Means over the real examples of u = W/S, mutual information, variance sum, expected
    entropy, max probability, S and log S (used for the corruption-severity study)."""
    out = outputs.unpadded()
    measures = scores_lib.uncertainty_measures(
        out.alpha, out.prior_strength,
        names=("u", "mutual_information", "variance_sum", "expected_entropy", "max_probability",
               "strength", "log_strength"))
    return {name: float(np.mean(v)) for name, v in measures.items()}


@dataclasses.dataclass(frozen=True, eq=False)
class Predictions:
    """What any method predicts on one evaluation set, per example, as float64 NumPy arrays.

    Evaluation, tables and plots work from this alone and never ask which method ran.

    Attributes:
      probs: (N, K) predictive class probabilities (rows sum to 1).
      scores: {name: (N,)} confidence scores, higher = more confident / more in-distribution
        (``scores.SCORE_NAMES``: "mp" for every method; "um" = -W/S only where it has a
        Dirichlet precision; method-specific ones such as "neg_mi").
      labels: (N,) integer class indices, or None (OOD sets).
      alpha, prior_strength: the Dirichlet (N, K) and its prior strength W (N,) where the method
        predicts one (the EDL family, Prior Networks, PostNet, ...), else None; they add the
        Dirichlet uncertainty measures (u, mutual information, ...) to the results.
      mp_is_max_probability: whether "mp" is max_k p_k of `probs`, as the method declares
        (`Method.mp_is_max_probability`): then a calibration that changes p recomputes it;
        False for DUQ, whose "mp" is its kernel certainty max_c K_c, which no calibration of p
        changes.
    """

    probs: np.ndarray
    scores: Mapping[str, np.ndarray]
    labels: np.ndarray | None = None
    alpha: np.ndarray | None = None
    prior_strength: np.ndarray | None = None
    mp_is_max_probability: bool = True

    def __post_init__(self):
        probs = checks.distributions(self.probs, "probs")
        n = probs.shape[0]
        checks.known(self.scores, scores_lib.SCORE_NAMES, "scores")
        scores = {}
        for name, value in self.scores.items():
            value = np.asarray(value, dtype=np.float64)
            if value.shape != (n,) or np.isnan(value).any():
                raise ValueError(f"score {name!r} must be a NaN-free array of shape ({n},), "
                                 f"got shape {value.shape}.")
            scores[name] = value
        labels = None if self.labels is None else checks.class_labels(
            self.labels, n, probs.shape[1], "labels")
        alpha = w = None
        if self.alpha is not None:
            alpha, w = checks.dirichlet(self.alpha, self.prior_strength)
            if alpha.shape != probs.shape:
                raise ValueError(f"alpha has shape {alpha.shape}, probs {probs.shape}.")
        object.__setattr__(self, "probs", probs)
        object.__setattr__(self, "scores", scores)
        object.__setattr__(self, "labels", labels)
        object.__setattr__(self, "alpha", alpha)
        object.__setattr__(self, "prior_strength", w)
        object.__setattr__(self, "mp_is_max_probability", bool(self.mp_is_max_probability))

    @property
    def num_classes(self) -> int:
        return int(self.probs.shape[1])

    @property
    def num_examples(self) -> int:
        return int(self.probs.shape[0])

    @property
    def is_dirichlet(self) -> bool:
        return self.alpha is not None


def dirichlet_predictions(outputs: ModelOutputs,
                          scores: Sequence[str] = scores_lib.DIRICHLET_SCORE_NAMES
                          ) -> Predictions:
    """Predictions of a Dirichlet (padding dropped): probabilities alpha/S and every Dirichlet
    confidence score (``scores.confidence_scores``, float64)."""
    out = outputs.unpadded()
    return Predictions(probs=out.probs,
                       scores=scores_lib.confidence_scores(out.alpha, out.prior_strength, scores),
                       labels=out.labels, alpha=out.alpha, prior_strength=out.prior_strength)


CALIBRATORS: tuple[str, ...] = ("temperature", "evidence_scale")


@dataclasses.dataclass(frozen=True)
class EvaluationOptions:
    """What ``evaluate_predictions`` adds beyond the paper's numbers.

    Attributes:
      conformal_alpha: miscoverage of the conformal sets (needs a validation split).
      conformal_seed: seeds the randomized APS / RAPS scores.
      calibrate: fit post-hoc calibration on the validation split and evaluate the calibrated
        predictions too ("posthoc_calibration", "calibrated").
      calibrator: "temperature" (categorical outputs: softmax, MC Dropout, ensembles, and the
        predictive mean of non-EDL Dirichlets) or "evidence_scale" (the EDL family, alpha =
        e + W a; ``gedl_jax.evaluation.calibration`` says why).
      base_rate: the EDL family's base rate a, (K,), for "evidence_scale"; None = uniform.
      ood_groups: {OOD set: "near" | "far"}; sets not named are in no group.
      aupr_trapezoidal: also OpenOOD's trapezoidal AUPR-in / AUPR-out per OOD set and score.
      bootstrap_samples: > 0: percentile intervals of the metrics over that many replicates of
        the test and OOD examples ("bootstrap"; ``gedl_jax.evaluation.bootstrap``); 0: none.
      bootstrap_confidence: the intervals' level.
      bootstrap_seed: seeds the replicates' draws.
      bootstrap_interval: "percentile" ([q(a/2), q(1 - a/2)] of the replicates) or "basic"
        (reflected about the metric on all examples: corrects a biased metric such as ECE to
        first order; ``gedl_jax.evaluation.bootstrap``).
    """

    conformal_alpha: float = 0.1
    conformal_seed: int = 0
    calibrate: bool = False
    calibrator: str = "temperature"
    base_rate: tuple[float, ...] | None = None
    ood_groups: Mapping[str, str] | None = None
    aupr_trapezoidal: bool = False
    bootstrap_samples: int = 0
    bootstrap_confidence: float = 0.95
    bootstrap_seed: int = 0
    bootstrap_interval: str = "percentile"

    def __post_init__(self):
        checks.open_unit(self.conformal_alpha, "conformal_alpha")
        checks.one_of(self.calibrator, CALIBRATORS, "calibrator")
        if int(self.bootstrap_samples) != self.bootstrap_samples or \
                self.bootstrap_samples < 0 or self.bootstrap_samples == 1:
            raise ValueError(f"bootstrap_samples must be 0 (none) or an integer >= 2, got "
                             f"{self.bootstrap_samples}.")
        checks.open_unit(self.bootstrap_confidence, "bootstrap_confidence")
        checks.one_of(self.bootstrap_interval, bootstrap_lib.INTERVAL_METHODS,
                      "bootstrap_interval")
        for group in (self.ood_groups or {}).values():
            checks.one_of(group, sections.GROUPS, "an ood_groups value")
        if self.base_rate is not None:
            object.__setattr__(self, "base_rate", tuple(float(a) for a in self.base_rate))
        # {} and None mean the same (no groups); one spelling keeps as_dict() comparable
        object.__setattr__(self, "ood_groups", dict(self.ood_groups) if self.ood_groups
                           else None)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready; ``EvaluationOptions(**options.as_dict())`` gives the options back."""
        d = dataclasses.asdict(self)
        d["base_rate"] = None if self.base_rate is None else list(self.base_rate)
        return d


def evaluate_outputs(id_outputs: ModelOutputs,
                     ood_outputs: Mapping[str, ModelOutputs] | None = None,
                     scores: Sequence[str] = scores_lib.DIRICHLET_SCORE_NAMES,
                     num_bins: int = 15, *, validation: ModelOutputs | None = None,
                     options: EvaluationOptions | None = None) -> dict[str, Any]:
    """``evaluate_predictions`` of Dirichlet outputs (see ``dirichlet_predictions``).

    ModelOutputs are EDL-family outputs (alpha = e + W a), so post-hoc calibration defaults to
    the evidence scale here: ``options=EvaluationOptions(calibrate=True,
    calibrator="evidence_scale")``."""
    checks.known(scores, scores_lib.DIRICHLET_SCORE_NAMES, "scores")
    idd = id_outputs.unpadded()
    if idd.labels is None:
        raise ValueError("id_outputs needs labels.")
    if idd.num_examples == 0:
        raise ValueError("id_outputs has no (unmasked) examples.")
    for name, o in (ood_outputs or {}).items():
        if o.num_examples == 0:
            raise ValueError(f"OOD set {name!r} has no (unmasked) examples.")
    return evaluate_predictions(
        dirichlet_predictions(idd, scores),
        {name: dirichlet_predictions(o, scores) for name, o in (ood_outputs or {}).items()},
        num_bins=num_bins,
        validation=None if validation is None else dirichlet_predictions(validation, scores),
        options=options)


def _check_sets(idd: Predictions, ood_predictions: Mapping[str, Predictions],
                validation: Predictions | None) -> None:
    if idd.labels is None:
        raise ValueError("id_predictions needs labels.")
    if idd.num_examples == 0:
        raise ValueError("id_predictions has no examples.")
    for name, o in ood_predictions.items():
        if o.num_classes != idd.num_classes:
            raise ValueError(f"OOD set {name!r} has K={o.num_classes}, ID has K={idd.num_classes}.")
        if o.num_examples == 0:
            raise ValueError(f"OOD set {name!r} has no examples.")
        if set(o.scores) != set(idd.scores):
            raise ValueError(f"OOD set {name!r} has scores {sorted(o.scores)}, the ID set "
                             f"{sorted(idd.scores)}.")
    if validation is not None and (validation.labels is None or validation.num_examples == 0
                                   or validation.num_classes != idd.num_classes):
        raise ValueError("validation predictions need labels, at least one example and the ID "
                         "set's number of classes.")


def evaluate_predictions(id_predictions: Predictions,
                         ood_predictions: Mapping[str, Predictions] | None = None,
                         num_bins: int = 15, *, validation: Predictions | None = None,
                         options: EvaluationOptions | None = None) -> dict[str, Any]:
    """All metrics of the paper (and more) for one model, as a JSON-serialisable dict.

    Args:
      id_predictions: in-distribution test predictions; labels are required.
      ood_predictions: {name: predictions} of each OOD set (labels optional; if present,
        accuracy on the set is added). Each must carry the same scores as the ID set.
      num_bins: ECE bins (15 as in the paper's reference code).
      validation: predictions on a labelled validation split (never the test set): calibrates
        the conformal sets and fits post-hoc calibration.
      options: ``EvaluationOptions`` (conformal alpha, calibration, near/far groups, trapezoidal
        AUPR); default ``EvaluationOptions()``.

    Every score the predictions carry is evaluated ("mp" and "um" are the paper's columns; a
    method without a Dirichlet precision has no "um", and tables show "–" there). Dirichlet
    predictions also get their uncertainty measures ("uncertainty").

    Returns (fractions in [0, 1]; undefined values such as AUROC with no error are null):
      {"conventions": {...}, "scores": [...],
       "id": {"num_examples", "num_classes", "num_correct", "accuracy", "nll", "brier", "brier_l2",
              "ece", "ece_adaptive", "ece_overconfidence", "ece_underconfidence",
              "ece_classwise",
              "calibration": {"equal_width": CalibrationResult.to_dict(), "adaptive": ...},
              "misclassification": {score: {"aupr", "auroc"}},
              "uncertainty": {measure: mean} (Dirichlet only),
              "selective": {score: selective.selective_metrics(...)}},
       "ood": {name: {"num_examples", "detection": {score: {"aupr_in", "aupr_out", "auroc",
                                                           "fpr95"[, "aupr_in_trapezoidal",
                                                           "aupr_out_trapezoidal"]}},
                      "uncertainty": {measure: mean} (Dirichlet only)[, "accuracy"]}},
       ["ood_groups": {group: {"sets", "detection": {score: {metric: mean}}}}],
       ["validation": {"num_examples", "accuracy"},
        "conformal": {"alpha", "seed", "sets": {method: {"coverage", "mean_set_size", ...}}}],
       ["posthoc_calibration": {...}, "calibrated": {the same sections, calibrated, and their
        "bootstrap" with bootstrap_samples > 0}],
       ["bootstrap": bootstrap.bootstrap_section(...)],
       "evaluation_options": options.as_dict()}
    (bracketed parts: with ood_groups, with a validation split, with calibrate=True, with
    bootstrap_samples > 0).
    """
    ood_predictions = dict(ood_predictions or {})
    options = options or EvaluationOptions()
    idd = id_predictions
    _check_sets(idd, ood_predictions, validation)
    if options.calibrate and validation is None:
        raise ValueError("calibrate=True needs validation predictions (calibration is fitted "
                         "on the validation split, never on the test set).")
    result = _evaluate(idd, ood_predictions, num_bins, validation, options)
    if options.bootstrap_samples:
        result["bootstrap"] = _bootstrap(idd, ood_predictions, result["scores"], num_bins,
                                         options)
    if options.calibrate:
        fit, calibrated = calibrated_predictions(
            validation, {"test": idd, **{f"ood/{k}": v for k, v in ood_predictions.items()}},
            options.calibrator, options.base_rate)
        cal_ood = {k: calibrated[f"ood/{k}"] for k in ood_predictions}
        result["posthoc_calibration"] = _posthoc_summary(
            fit, validation, idd, ood_predictions, calibrated, cal_ood, num_bins)
        result["calibrated"] = _evaluate(calibrated["test"], cal_ood, num_bins,
                                         calibrated["validation"], options)
        result["calibrated"].pop("scores")
        if options.bootstrap_samples:   # the same draws as the uncalibrated intervals'
            result["calibrated"]["bootstrap"] = _bootstrap(
                calibrated["test"], cal_ood,
                [s for s in result["scores"] if s in calibrated["test"].scores], num_bins, options)
        result["calibrators"] = calibration_lib.compare_calibrators(
            validation.probs, validation.labels, idd.probs, idd.labels, num_bins=num_bins)
    result["evaluation_options"] = options.as_dict()
    return _clean({"conventions": dict(CONVENTIONS), **result})


def _bootstrap(idd: Predictions, ood_predictions: Mapping[str, Predictions],
               score_names: Sequence[str], num_bins: int,
               options: EvaluationOptions) -> dict[str, Any]:
    """The "bootstrap" section of a set of predictions (`bootstrap.bootstrap_section`)."""
    return bootstrap_lib.bootstrap_section(
        idd.probs, idd.labels, idd.scores,
        {name: o.scores for name, o in ood_predictions.items()}, score_names,
        int(options.bootstrap_samples), float(options.bootstrap_confidence),
        int(options.bootstrap_seed), num_bins, options.bootstrap_interval)


def _evaluate(idd: Predictions, ood_predictions: Mapping[str, Predictions], num_bins: int,
              validation: Predictions | None, options: EvaluationOptions) -> dict[str, Any]:
    """The sections of `evaluate_predictions` except calibration (used twice with it)."""
    scores = [s for s in scores_lib.SCORE_NAMES if s in idd.scores]
    probs, labels = idd.probs, idd.labels
    correct = np.argmax(probs, axis=1) == labels
    ece_eq = metrics.expected_calibration_error(probs, labels, num_bins=num_bins,
                                                binning="equal_width")
    ece_ad = metrics.expected_calibration_error(probs, labels, num_bins=num_bins,
                                                binning="adaptive")
    result_id = {
        "num_examples": idd.num_examples,
        "num_classes": idd.num_classes,
        "num_correct": int(correct.sum()),
        "accuracy": metrics.accuracy(probs, labels),
        "nll": metrics.nll(probs, labels),
        "brier": metrics.brier_score(probs, labels, squared=True),
        "brier_l2": metrics.brier_score(probs, labels, squared=False),
        "ece": ece_eq.ece,
        "ece_adaptive": ece_ad.ece,
        "ece_overconfidence": ece_eq.overconfidence,
        "ece_underconfidence": ece_eq.underconfidence,
        "ece_classwise": metrics.classwise_calibration_error(probs, labels, num_bins),
        "calibration": {"equal_width": ece_eq.to_dict(), "adaptive": ece_ad.to_dict()},
        "misclassification": {s: metrics.misclassification_detection(correct, idd.scores[s])
                              for s in scores},
    }
    if idd.is_dirichlet:
        result_id["uncertainty"] = _measures(idd)
    result_id["selective"] = sections.selective_section(correct, idd.scores, scores)
    groups = dict(options.ood_groups or {})
    result_ood = {}
    for name, o in ood_predictions.items():
        entry = {
            "num_examples": o.num_examples,
            "detection": {s: metrics.ood_detection(idd.scores[s], o.scores[s]) for s in scores},
            "scod": sections.scod_section(correct, idd.scores, o.scores, scores),
        }
        if options.aupr_trapezoidal:
            for s in scores:
                entry["detection"][s].update(
                    sections.trapezoidal_detection(idd.scores[s], o.scores[s]))
        if o.is_dirichlet:
            entry["uncertainty"] = _measures(o)
        if o.labels is not None:
            entry["accuracy"] = metrics.accuracy(o.probs, o.labels)
        result_ood[name] = entry
    result = {"scores": list(scores), "id": result_id, "ood": result_ood}
    if groups and any(name in groups for name in result_ood):
        result["ood_groups"] = sections.group_means(_clean(result_ood), groups, scores)
    if validation is not None:
        result["validation"] = {"num_examples": validation.num_examples,
                                "accuracy": metrics.accuracy(validation.probs,
                                                             validation.labels)}
        result["conformal"] = sections.conformal_section(
            validation.probs, validation.labels, probs, labels, options.conformal_alpha,
            options.conformal_seed)
    return result


def calibrated_predictions(validation: Predictions, predictions: Mapping[str, Predictions],
                           calibrator: str = "temperature",
                           base_rate: Sequence[float] | None = None
                           ) -> tuple[dict[str, Any], dict[str, Predictions]]:
    """Fits `calibrator` on `validation` (its labels; nothing else is looked at) and applies it.

    Returns (the fit as a dict, {"validation": ..., **{name: ...}} calibrated predictions).
    "temperature": p -> softmax(log p / T) (``calibration.fit_temperature`` on
    ``probs_as_logits``); the scores that are functions of p ("mp" where the predictions'
    ``mp_is_max_probability``, "neg_entropy") are recomputed, the others (a Dirichlet's "um",
    an ensemble's "neg_mi", DUQ's kernel scores) kept. "evidence_scale"
    (Dirichlet predictions of the EDL family only): e = alpha - W a, alpha -> s e + W a
    (``calibration.fit_evidence_scale``); every Dirichlet score is recomputed from the new alpha.
    """
    if calibrator == "temperature":
        logits = calibration_lib.probs_as_logits(validation.probs)
        fit = calibration_lib.fit_temperature(logits, validation.labels)

        def apply(p: Predictions) -> Predictions:
            probs = calibration_lib.apply_temperature(
                calibration_lib.probs_as_logits(p.probs), fit)
            new = scores_lib.categorical_scores(probs)
            # "mp" is max_k p_k where the method says so (not DUQ's kernel certainty)
            recomputed = {"neg_entropy"} | ({"mp"} if p.mp_is_max_probability else set())
            return dataclasses.replace(p, probs=probs, scores={
                s: new[s] if s in recomputed else v for s, v in p.scores.items()})
    elif calibrator == "evidence_scale":
        if not validation.is_dirichlet:
            raise ValueError("calibrator='evidence_scale' needs Dirichlet predictions (alpha, W).")
        fit = calibration_lib.fit_evidence_scale(
            calibration_lib.evidence_from_alpha(validation.alpha, validation.prior_strength,
                                                base_rate),
            validation.prior_strength, validation.labels, base_rate)

        def apply(p: Predictions) -> Predictions:
            alpha = calibration_lib.apply_evidence_scale(
                calibration_lib.evidence_from_alpha(p.alpha, p.prior_strength, base_rate),
                p.prior_strength, fit, base_rate)
            dirichlet = [s for s in p.scores if s in scores_lib.DIRICHLET_SCORE_NAMES]
            new = scores_lib.confidence_scores(alpha, p.prior_strength, dirichlet)
            return dataclasses.replace(p, probs=alpha / alpha.sum(axis=1, keepdims=True),
                                       scores={**p.scores, **new}, alpha=alpha)
    else:
        checks.one_of(calibrator, CALIBRATORS, "calibrator")
    out = {"validation": apply(validation)}
    out.update({name: apply(p) for name, p in predictions.items()})
    return {"calibrator": calibrator, **dataclasses.asdict(fit)}, out


def _posthoc_summary(fit: dict[str, Any], validation: Predictions, idd: Predictions,
                     ood: Mapping[str, Predictions], calibrated: Mapping[str, Predictions],
                     cal_ood: Mapping[str, Predictions], num_bins: int) -> dict[str, Any]:
    """Fitted values, calibration before/after on validation and test, OOD ranking changes."""
    def summary(p: Predictions) -> dict[str, float]:
        return calibration_lib.calibration_summary(p.probs, p.labels, num_bins)

    scores = [s for s in scores_lib.SCORE_NAMES if s in idd.scores]
    ranking = sections.ranking_changes(
        idd.scores, {k: v.scores for k, v in ood.items()}, calibrated["test"].scores,
        {k: v.scores for k, v in cal_ood.items()}, scores)
    return {"fit": fit,
            "validation": {"before": summary(validation),
                           "after": summary(calibrated["validation"])},
            "test": {"before": summary(idd), "after": summary(calibrated["test"])},
            "ood_ranking": ranking,
            "ood_ranking_changed": sorted(s for s in scores
                                          if any(v["ranking_changed"]
                                                 for v in ranking[s].values()))}


def _measures(predictions: Predictions) -> dict[str, float]:
    return summarise_measures(ModelOutputs(predictions.alpha, predictions.prior_strength))


def severity_summary(outputs_by_severity: Mapping[Any, ModelOutputs]
                     ) -> dict[Any, dict[str, float]]:
    """{severity: summarise_measures(outputs)}: the input of ``plots.corruption_severity_study``.

    Severity 0 is conventionally the clean test set, 1..5 the CIFAR-10-C levels.
    """
    return {sev: summarise_measures(o) for sev, o in outputs_by_severity.items()}


def rank_correlations(alpha_NxK: Any, prior_strength_N: Any,
                      measures: Sequence[str] = ("u", "mutual_information", "variance_sum")
                      ) -> dict[str, float]:
    """Spearman rank correlation of each uncertainty measure with log S (ties: average ranks).

    The paper's claim (Fig. uncertainty, top row) is that u = W/S, the mutual information and the
    variance sum all decrease monotonically in log S, i.e. correlations near -1.
    """
    m = scores_lib.uncertainty_measures(alpha_NxK, prior_strength_N,
                                        names=tuple(measures) + ("log_strength",))
    return {name: float(stats.spearmanr(m[name], m["log_strength"]).statistic)
            for name in measures}


def ensemble_epistemic_uncertainty(probs_MxNxK: Any) -> np.ndarray:
    """Epistemic uncertainty of an ensemble of M models: the mutual information between the
    prediction and the ensemble member, H(mean_m p_m) - mean_m H(p_m) (natural log, 0 log 0 = 0).

    Args:
      probs_MxNxK: predictive probabilities (e.g. alpha/S) of M members on N examples.
    Returns:
      (N,) float64, >= 0 (clipped at 0 against rounding).
    """
    p = checks.stacked_probabilities(probs_MxNxK)

    def entropy(q):
        return -np.sum(np.where(q > 0, q * np.log(np.where(q > 0, q, 1.0)), 0.0), axis=-1)

    return np.maximum(entropy(p.mean(axis=0)) - entropy(p).mean(axis=0), 0.0)
