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

from gedl_jax import metrics
from gedl_jax.evaluation import scores as scores_lib

__all__ = ["CONVENTIONS", "ModelOutputs", "evaluate_outputs", "summarise_measures",
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
    "scores": "Scores are higher = more confident / more in-distribution. MP = max_k alpha_k/S; "
              "UM = -u = -W/S with the per-example prior strength W (for a constant W this ranks "
              "like S, the reference code's alpha0; for GEDL's adaptive W it does not); "
              "neg_mi, neg_differential_entropy, neg_expected_entropy are negated closed forms "
              "(float64); strength = S; max_alpha = max_k alpha_k.",
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
        labels = None
        if self.labels is not None:
            labels = np.asarray(self.labels)
            if labels.shape != (n,) or not np.issubdtype(labels.dtype, np.integer):
                raise ValueError(f"labels must be integer class indices of shape ({n},), got "
                                 f"dtype {labels.dtype} and shape {labels.shape}.")
            labels = labels.astype(np.int64)
        real = slice(None) if mask is None else mask
        scores_lib.check_dirichlet(alpha[real], w[real])
        if labels is not None and labels[real].size and (
                labels[real].min() < 0 or labels[real].max() >= alpha.shape[1]):
            raise ValueError(f"labels must lie in [0, {alpha.shape[1]}).")
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


def evaluate_outputs(id_outputs: ModelOutputs,
                     ood_outputs: Mapping[str, ModelOutputs] | None = None,
                     scores: Sequence[str] = scores_lib.SCORE_NAMES,
                     num_bins: int = 15) -> dict[str, Any]:
    """All metrics of the paper (and more) for one model, as a JSON-serialisable dict.

    Args:
      id_outputs: in-distribution test outputs; labels are required.
      ood_outputs: {name: outputs} of each OOD set (labels optional; if present, accuracy on the
        set is added).
      scores: the confidence scores to evaluate (``scores.SCORE_NAMES``); "mp" and "um" are the
        paper's columns.
      num_bins: ECE bins (15 as in the paper's reference code).

    Returns (fractions in [0, 1]; undefined values such as AUROC with no error are null):
      {"conventions": {...}, "scores": [...],
       "id": {"num_examples", "num_classes", "num_correct", "accuracy", "nll", "brier", "brier_l2",
              "ece", "ece_adaptive",
              "calibration": {"equal_width": CalibrationResult.to_dict(), "adaptive": ...},
              "misclassification": {score: {"aupr", "auroc"}},
              "uncertainty": {measure: mean}},
       "ood": {name: {"num_examples", "detection": {score: {"aupr_in", "aupr_out", "auroc",
                                                           "fpr95"}},
                      "uncertainty": {measure: mean}[, "accuracy"]}}}
    """
    ood_outputs = dict(ood_outputs or {})
    unknown = set(scores) - set(scores_lib.SCORE_NAMES)
    if unknown:
        raise ValueError(f"Unknown scores {sorted(unknown)}; known: {scores_lib.SCORE_NAMES}.")
    idd = id_outputs.unpadded()
    if idd.labels is None:
        raise ValueError("id_outputs needs labels.")
    if idd.num_examples == 0:
        raise ValueError("id_outputs has no (unmasked) examples.")
    for name, o in ood_outputs.items():
        if o.num_classes != idd.num_classes:
            raise ValueError(f"OOD set {name!r} has K={o.num_classes}, ID has K={idd.num_classes}.")

    probs, labels = idd.probs, idd.labels
    correct = np.argmax(probs, axis=1) == labels
    ece_eq = metrics.expected_calibration_error(probs, labels, num_bins=num_bins,
                                                binning="equal_width")
    ece_ad = metrics.expected_calibration_error(probs, labels, num_bins=num_bins,
                                                binning="adaptive")
    id_scores = scores_lib.confidence_scores(idd.alpha, idd.prior_strength, names=scores)
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
        "misclassification": {s: metrics.misclassification_detection(correct, id_scores[s])
                              for s in scores},
        "uncertainty": summarise_measures(idd),
    }
    result_ood = {}
    for name, outputs in ood_outputs.items():
        o = outputs.unpadded()
        if o.num_examples == 0:
            raise ValueError(f"OOD set {name!r} has no (unmasked) examples.")
        o_scores = scores_lib.confidence_scores(o.alpha, o.prior_strength, names=scores)
        entry = {
            "num_examples": o.num_examples,
            "detection": {s: metrics.ood_detection(id_scores[s], o_scores[s]) for s in scores},
            "uncertainty": summarise_measures(o),
        }
        if o.labels is not None:
            entry["accuracy"] = metrics.accuracy(o.probs, o.labels)
        result_ood[name] = entry
    return _clean({"conventions": dict(CONVENTIONS), "scores": list(scores),
                   "id": result_id, "ood": result_ood})


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
