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

from gedl_jax.evaluation import metrics
from gedl_jax.evaluation import scores as scores_lib

__all__ = ["CONVENTIONS", "ModelOutputs", "Predictions", "dirichlet_predictions",
           "evaluate_outputs", "evaluate_predictions", "summarise_measures",
           "severity_summary", "rank_correlations", "ensemble_epistemic_uncertainty"]

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
    "brier": "brier = mean_i sum_k (p_ik - y_ik)^2 (standard multi-class, in [0, 2]); "
             "brier_l2 = mean_i ||p_i - y_i||_2 (un-squared variant of the I-EDL/R-EDL code).",
    "nll": "nll = mean_i -log p_{i,y_i} with p = alpha/S clipped to [eps, 1-eps], natural log.",
    "accuracy": "accuracy = mean [argmax_k alpha_k == y].",
    "masking": "Rows with mask False (padding) are dropped before anything is computed; every "
               "real example is scored exactly once.",
}


def _checked_labels(labels, n: int, num_classes: int, real=slice(None)) -> np.ndarray | None:
    """Integer class indices of shape (n,) in [0, K) (checked on the `real` rows), as int64."""
    if labels is None:
        return None
    labels = np.asarray(labels)
    if labels.shape != (n,) or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be integer class indices of shape ({n},), got "
                         f"dtype {labels.dtype} and shape {labels.shape}.")
    if labels[real].size and (labels[real].min() < 0 or labels[real].max() >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes}).")
    return labels.astype(np.int64)


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
        alpha = np.asarray(self.alpha)
        if alpha.ndim != 2:
            raise ValueError(f"alpha must have shape (N, K), got {alpha.shape}.")
        n = alpha.shape[0]
        w = np.asarray(self.prior_strength, dtype=np.float64)
        if w.ndim == 0:
            w = np.full(n, float(w))
        if w.shape != (n,):
            raise ValueError(f"prior_strength must have shape ({n},) or be a scalar, "
                             f"got {w.shape}.")
        mask = None if self.mask is None else np.asarray(self.mask)
        if mask is not None and (mask.dtype != np.bool_ or mask.shape != (n,)):
            raise ValueError(f"mask must be a bool array of shape ({n},), got dtype "
                             f"{mask.dtype} and shape {mask.shape}.")
        real = slice(None) if mask is None else mask
        labels = _checked_labels(self.labels, n, alpha.shape[1], real)
        scores_lib.check_dirichlet(alpha[real], w[real])
        object.__setattr__(self, "alpha", alpha.astype(np.float64))
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
    """

    probs: np.ndarray
    scores: Mapping[str, np.ndarray]
    labels: np.ndarray | None = None
    alpha: np.ndarray | None = None
    prior_strength: np.ndarray | None = None

    def __post_init__(self):
        probs = np.asarray(self.probs, dtype=np.float64)
        if probs.ndim != 2 or probs.shape[1] < 2:
            raise ValueError(f"probs must have shape (N, K) with K >= 2, got {probs.shape}.")
        if not np.all(np.isfinite(probs)) or (probs.size and (
                probs.min() < 0 or np.abs(probs.sum(1) - 1).max() > 1e-4)):
            raise ValueError("probs rows must be finite probabilities summing to 1.")
        n = probs.shape[0]
        scores = {}
        for name, value in self.scores.items():
            if name not in scores_lib.SCORE_NAMES:
                raise ValueError(f"unknown score {name!r}; known: {scores_lib.SCORE_NAMES}.")
            value = np.asarray(value, dtype=np.float64)
            if value.shape != (n,) or np.isnan(value).any():
                raise ValueError(f"score {name!r} must be a NaN-free array of shape ({n},), "
                                 f"got shape {value.shape}.")
            scores[name] = value
        labels = _checked_labels(self.labels, n, probs.shape[1])
        alpha = w = None
        if self.alpha is not None:
            alpha, w = scores_lib.check_dirichlet(self.alpha, self.prior_strength)
            if alpha.shape != probs.shape:
                raise ValueError(f"alpha has shape {alpha.shape}, probs {probs.shape}.")
        object.__setattr__(self, "probs", probs)
        object.__setattr__(self, "scores", scores)
        object.__setattr__(self, "labels", labels)
        object.__setattr__(self, "alpha", alpha)
        object.__setattr__(self, "prior_strength", w)

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


def evaluate_outputs(id_outputs: ModelOutputs,
                     ood_outputs: Mapping[str, ModelOutputs] | None = None,
                     scores: Sequence[str] = scores_lib.DIRICHLET_SCORE_NAMES,
                     num_bins: int = 15) -> dict[str, Any]:
    """``evaluate_predictions`` of Dirichlet outputs (see ``dirichlet_predictions``)."""
    unknown = set(scores) - set(scores_lib.DIRICHLET_SCORE_NAMES)
    if unknown:
        raise ValueError(f"Unknown scores {sorted(unknown)}; known: "
                         f"{scores_lib.DIRICHLET_SCORE_NAMES}.")
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
        num_bins=num_bins)


def evaluate_predictions(id_predictions: Predictions,
                         ood_predictions: Mapping[str, Predictions] | None = None,
                         num_bins: int = 15) -> dict[str, Any]:
    """All metrics of the paper (and more) for one model, as a JSON-serialisable dict.

    Args:
      id_predictions: in-distribution test predictions; labels are required.
      ood_predictions: {name: predictions} of each OOD set (labels optional; if present,
        accuracy on the set is added). Each must carry the same scores as the ID set.
      num_bins: ECE bins (15 as in the paper's reference code).

    Every score the predictions carry is evaluated ("mp" and "um" are the paper's columns; a
    method without a Dirichlet precision has no "um", and tables show "–" there). Dirichlet
    predictions also get their uncertainty measures ("uncertainty").

    Returns (fractions in [0, 1]; undefined values such as AUROC with no error are null):
      {"conventions": {...}, "scores": [...],
       "id": {"num_examples", "num_classes", "num_correct", "accuracy", "nll", "brier", "brier_l2",
              "ece", "ece_adaptive",
              "calibration": {"equal_width": CalibrationResult.to_dict(), "adaptive": ...},
              "misclassification": {score: {"aupr", "auroc"}},
              "uncertainty": {measure: mean} (Dirichlet only)},
       "ood": {name: {"num_examples", "detection": {score: {"aupr_in", "aupr_out", "auroc",
                                                           "fpr95"}},
                      "uncertainty": {measure: mean} (Dirichlet only)[, "accuracy"]}}}
    """
    ood_predictions = dict(ood_predictions or {})
    idd = id_predictions
    if idd.labels is None:
        raise ValueError("id_predictions needs labels.")
    if idd.num_examples == 0:
        raise ValueError("id_predictions has no examples.")
    scores = [s for s in scores_lib.SCORE_NAMES if s in idd.scores]
    for name, o in ood_predictions.items():
        if o.num_classes != idd.num_classes:
            raise ValueError(f"OOD set {name!r} has K={o.num_classes}, ID has K={idd.num_classes}.")
        if o.num_examples == 0:
            raise ValueError(f"OOD set {name!r} has no examples.")
        if set(o.scores) != set(idd.scores):
            raise ValueError(f"OOD set {name!r} has scores {sorted(o.scores)}, the ID set "
                             f"{sorted(idd.scores)}.")

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
        "calibration": {"equal_width": ece_eq.to_dict(), "adaptive": ece_ad.to_dict()},
        "misclassification": {s: metrics.misclassification_detection(correct, idd.scores[s])
                              for s in scores},
    }
    if idd.is_dirichlet:
        result_id["uncertainty"] = _measures(idd)
    result_ood = {}
    for name, o in ood_predictions.items():
        entry = {
            "num_examples": o.num_examples,
            "detection": {s: metrics.ood_detection(idd.scores[s], o.scores[s]) for s in scores},
        }
        if o.is_dirichlet:
            entry["uncertainty"] = _measures(o)
        if o.labels is not None:
            entry["accuracy"] = metrics.accuracy(o.probs, o.labels)
        result_ood[name] = entry
    return _clean({"conventions": dict(CONVENTIONS), "scores": list(scores),
                   "id": result_id, "ood": result_ood})


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
    p = np.asarray(probs_MxNxK, dtype=np.float64)
    if p.ndim != 3 or p.shape[2] < 2:
        raise ValueError(f"probs_MxNxK must have shape (M, N, K) with K >= 2, got {p.shape}.")
    if not np.all(np.isfinite(p)) or p.min() < 0 or np.abs(p.sum(-1) - 1).max() > 1e-4:
        raise ValueError("probs_MxNxK rows must be finite probabilities summing to 1.")

    def entropy(q):
        return -np.sum(np.where(q > 0, q * np.log(np.where(q > 0, q, 1.0)), 0.0), axis=-1)

    return np.maximum(entropy(p.mean(axis=0)) - entropy(p).mean(axis=0), 0.0)
