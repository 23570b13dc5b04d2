"""Classification, calibration and detection metrics on plain NumPy arrays (float64 inside).

Every function states its convention in its docstring. The conventions shared by all of them:

* Inputs are arrays (NumPy, JAX or lists); they are converted with ``np.asarray`` and computed in
  float64 on the host. Probabilities are ``probs_NxK`` rows on the simplex; labels are integer
  class indices ``labels_N`` (never one-hot).
* Every function takes an optional keyword-only boolean ``mask_N`` (``False`` marks a padding row;
  ``ood_detection`` takes one per set: ``id_mask_N``, ``ood_mask_M``). Padding rows
  are removed *before* validation and computation, so the result is exactly that of the unpadded
  arrays, whatever the padding rows contain (NaN included).
* Ranking metrics take ``is_positive_N`` (bool or 0/1) and ``scores_N`` where a **higher score
  means more likely positive**. They reproduce scikit-learn exactly, ties included:
  ``average_precision`` is sklearn's ``average_precision_score`` (step-wise sum
  ``sum_n (R_n - R_{n-1}) P_n`` over distinct thresholds, *not* the trapezoidal area under the
  PR curve), ``auroc`` is ``roc_auc_score`` (trapezoidal ROC area, a tie counts one half).
  If the positive or the negative class is empty the metric is undefined: the function warns
  (``RuntimeWarning``) and returns NaN.
* Results are fractions in [0, 1] (tables multiply by 100).

scikit-learn is used only as the test oracle (tests/test_metrics.py); this module is NumPy only.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import numpy as np

from gedl_jax.evaluation import checks

__all__ = [
    "CalibrationResult",
    "accuracy",
    "nll",
    "brier_score",
    "expected_calibration_error",
    "classwise_calibration_error",
    "average_precision",
    "auroc",
    "fpr_at_tpr",
    "misclassification_detection",
    "ood_detection",
    "average_precision_of_curve",
    "auroc_of_curve",
    "fpr_at_tpr_of_curve",
    "equal_width_bins",
    "per_example_terms",
]

# ------------------------------------------------------------------------------------------------
# Input handling
# ------------------------------------------------------------------------------------------------
def _select(mask_N: Any, *arrays: np.ndarray, mask_name: str = "mask_N") -> tuple[np.ndarray, ...]:
    """Returns the rows of every array where mask_N is True (all rows when mask_N is None)."""
    n = arrays[0].shape[0]
    for a in arrays[1:]:
        if a.shape[0] != n:
            raise ValueError(
                f"Inputs disagree on the number of examples: {[x.shape for x in arrays]}.")
    mask_N = checks.mask(mask_N, n, mask_name)
    if mask_N is None:
        return arrays
    return tuple(a[mask_N] for a in arrays)


def _probs_labels(probs_NxK: Any, labels_N: Any, mask_N: Any) -> tuple[np.ndarray, np.ndarray]:
    """Validates (probs, labels), applies the mask; returns float64 probs and int64 labels."""
    probs_NxK = checks.matrix(probs_NxK, "probs_NxK")
    labels_N = checks.vector(labels_N, "labels_N")
    if labels_N.shape[0] != probs_NxK.shape[0]:
        raise ValueError(
            f"probs_NxK has {probs_NxK.shape[0]} rows but labels_N has {labels_N.shape[0]}.")
    probs_NxK, labels_N = _select(mask_N, probs_NxK, labels_N)
    checks.nonempty(labels_N, "labels_N (after masking)")
    labels_N = checks.class_labels(labels_N, labels_N.shape[0], probs_NxK.shape[1])
    return checks.probabilities(probs_NxK, "probs_NxK"), labels_N


def _binary_inputs(is_positive_N: Any, scores_N: Any, mask_N: Any) -> tuple[np.ndarray, np.ndarray]:
    """Validates (is_positive, scores), applies the mask; returns bool labels, float64 scores."""
    is_positive_N, scores_N = checks.pair(is_positive_N, scores_N, "is_positive_N", "scores_N")
    is_positive_N, scores_N = _select(mask_N, is_positive_N, scores_N)
    checks.nonempty(scores_N, "scores_N (after masking)")
    return (checks.binary(is_positive_N, "is_positive_N"),
            checks.real_numbers(scores_N, "scores_N"))


def _binary_curve(is_positive_N: np.ndarray, scores_N: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Cumulative true/false positives at each distinct threshold, from the highest score down.

    Same as sklearn's ``_binary_clf_curve``: tied scores form one threshold, so their order
    never matters. Returns (tps, fps), both of length (number of distinct scores).
    """
    order = np.argsort(-scores_N, kind="stable")
    sorted_scores = scores_N[order]
    sorted_pos = is_positive_N[order]
    # Last index of each run of equal scores (compare, not diff, so that +-inf ties work).
    last_of_run = np.r_[np.flatnonzero(sorted_scores[1:] != sorted_scores[:-1]),
                        sorted_scores.size - 1]
    tps = np.cumsum(sorted_pos, dtype=np.float64)[last_of_run]
    fps = (last_of_run + 1).astype(np.float64) - tps
    return tps, fps


def _undefined(metric: str, missing: str) -> float:
    warnings.warn(f"{metric} is undefined without {missing} examples; returning NaN.",
                  RuntimeWarning, stacklevel=3)
    return float("nan")


# ------------------------------------------------------------------------------------------------
# Classification and calibration
# ------------------------------------------------------------------------------------------------
def accuracy(probs_NxK: Any, labels_N: Any, *, mask_N: Any = None) -> float:
    """Top-1 accuracy: mean over examples of [argmax_k p_k == y], a fraction in [0, 1].

    The prediction is ``np.argmax`` (the first maximal class on ties), as in the reference code.
    """
    probs_NxK, labels_N = _probs_labels(probs_NxK, labels_N, mask_N)
    return float(np.mean(np.argmax(probs_NxK, axis=1) == labels_N))


def nll(probs_NxK: Any, labels_N: Any, eps: float = float(np.finfo(np.float64).eps), *,
        mask_N: Any = None) -> float:
    """Mean negative log-likelihood of the true class, -1/N sum_i log p_{i, y_i} (natural log).

    ``p_{i,y_i}`` is clipped to [eps, 1 - eps] before the log, so a zero probability costs
    -log(eps) instead of infinity. With the default eps (float64 machine epsilon) this equals
    ``sklearn.metrics.log_loss(labels, probs, labels=range(K))``.
    """
    return float(np.mean(per_example_terms(probs_NxK, labels_N, eps, mask_N=mask_N)["nll"]))


def per_example_terms(probs_NxK: Any, labels_N: Any,
                      eps: float = float(np.finfo(np.float64).eps), *, mask_N: Any = None
                      ) -> dict[str, np.ndarray]:
    """Each example's share of the mean metrics, (N,) float64 each: "nll" (-log p_{i,y_i},
    clipped as `nll`), "squared_error" (sum_k (p_ik - y_ik)^2, `brier_score`'s term),
    "confidence" (max_k p_ik in [0, 1]) and "correct" ([argmax_k p_ik == y_i]), the last two
    `expected_calibration_error`'s. The bootstrap (`gedl_jax.evaluation.bootstrap`) reweights
    them to score a resample."""
    probs_NxK, labels_N = _probs_labels(probs_NxK, labels_N, mask_N)
    p_true_N = probs_NxK[np.arange(labels_N.size), labels_N]
    onehot_NxK = np.eye(probs_NxK.shape[1], dtype=np.float64)[labels_N]
    return {"nll": -np.log(np.clip(p_true_N, eps, 1.0 - eps)),
            "squared_error": np.sum((probs_NxK - onehot_NxK) ** 2, axis=1),
            "confidence": np.clip(probs_NxK.max(axis=1), 0.0, 1.0),
            "correct": (np.argmax(probs_NxK, axis=1) == labels_N).astype(np.float64)}


def brier_score(probs_NxK: Any, labels_N: Any, squared: bool = True, *,
                mask_N: Any = None) -> float:
    """Multi-class Brier score against the one-hot label y (lower is better).

    squared=True (default, the standard form): 1/N sum_i sum_k (p_ik - y_ik)^2, in [0, 2].
        This is the multi-class form of Brier (1950), the one DAEDL and most calibration papers
        use; it equals ``sklearn.metrics.brier_score_loss(labels, probs, labels=range(K))`` and,
        for K = 2, ``brier_score_loss(labels, probs[:, 1], scale_by_half=False)``, i.e. twice
        sklearn's default binary value.
    squared=False: 1/N sum_i ||p_i - y_i||_2, the mean L2 *norm*, in [0, sqrt(2)]. This is the
        non-standard variant of the I-EDL / R-EDL reference code (``metrics.brier_score``),
        offered only to compare with numbers produced by that code.
    """
    sq_err_N = per_example_terms(probs_NxK, labels_N, mask_N=mask_N)["squared_error"]
    return float(np.mean(sq_err_N if squared else np.sqrt(sq_err_N)))


@dataclasses.dataclass(frozen=True, eq=False)
class CalibrationResult:
    """Expected calibration error with its per-bin data (arrays of length num_bins).

    Attributes:
      ece: sum_b (n_b / N) |conf_b - acc_b|, a fraction in [0, 1].
      overconfidence, underconfidence: the ECE's two directions, the sum over the bins whose
        mean confidence is above (below) their accuracy of (n_b / N) |conf_b - acc_b|; they add
        up to `ece`. A reliability diagram's bars below (above) the diagonal.
      bin_lower, bin_upper: the bin edges. Equal-width bins are (lower, upper]; adaptive bins hold
        the min and max confidence of their members (NaN for an empty bin).
      bin_confidence: mean confidence (max probability) in each bin; NaN for an empty bin.
      bin_accuracy: accuracy in each bin; NaN for an empty bin.
      bin_count: number of examples in each bin (int).
      binning: "equal_width" or "adaptive".
    """

    ece: float
    overconfidence: float
    underconfidence: float
    bin_lower: np.ndarray
    bin_upper: np.ndarray
    bin_confidence: np.ndarray
    bin_accuracy: np.ndarray
    bin_count: np.ndarray
    binning: str

    @property
    def num_examples(self) -> int:
        return int(self.bin_count.sum())

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form; NaN (empty bins) becomes None."""
        def floats(a: np.ndarray) -> list[float | None]:
            return [None if np.isnan(v) else float(v) for v in a]
        return {
            "ece": float(self.ece),
            "overconfidence": float(self.overconfidence),
            "underconfidence": float(self.underconfidence),
            "binning": self.binning,
            "num_bins": int(self.bin_count.size),
            "bin_lower": floats(self.bin_lower),
            "bin_upper": floats(self.bin_upper),
            "bin_confidence": floats(self.bin_confidence),
            "bin_accuracy": floats(self.bin_accuracy),
            "bin_count": [int(c) for c in self.bin_count],
        }


def equal_width_bins(conf_N: np.ndarray, num_bins: int) -> np.ndarray:
    """The equal-width bin of each confidence in [0, 1]: bin b is (b/num_bins, (b+1)/num_bins],
    and a confidence of exactly 0 goes to bin 0 (`expected_calibration_error`)."""
    edges = np.linspace(0.0, 1.0, num_bins + 1)
    # side="left": conf in (edges[b], edges[b+1]] -> b + 1, hence (lower, upper] bins.
    return np.clip(np.searchsorted(edges, conf_N, side="left") - 1, 0, num_bins - 1)


def expected_calibration_error(probs_NxK: Any, labels_N: Any, num_bins: int = 15,
                               binning: str = "equal_width", *, mask_N: Any = None
                               ) -> CalibrationResult:
    """Top-label expected calibration error (Guo et al., 2017) with per-bin data.

    Confidence = max_k p_k, prediction = argmax_k p_k, correct = (prediction == label).
    ECE = sum_b (n_b / N) |mean confidence_b - accuracy_b| over non-empty bins, split into its
    overconfident bins' part (confidence above accuracy) and its underconfident bins' part.

    binning="equal_width" (default, the paper's and R-EDL's ``_ECELoss``): ``num_bins`` bins of
        equal width on [0, 1], each the interval (lower, upper]; a confidence of exactly 0 (which
        a max probability >= 1/K never has) goes to the first bin.
    binning="adaptive": equal-mass bins. Examples are sorted by confidence (stable sort) and split
        into ``num_bins`` consecutive groups whose sizes differ by at most one (np.array_split);
        tied confidences may straddle two bins. Bin edges are the groups' min and max confidence.
    """
    checks.one_of(binning, ("equal_width", "adaptive"), "binning")
    num_bins = checks.count(num_bins, "num_bins", 1)
    terms = per_example_terms(probs_NxK, labels_N, mask_N=mask_N)
    conf_N, correct_N = terms["confidence"], terms["correct"]
    n = conf_N.size

    if binning == "equal_width":
        edges = np.linspace(0.0, 1.0, num_bins + 1)
        bin_N = equal_width_bins(conf_N, num_bins)
        lower, upper = edges[:-1].copy(), edges[1:].copy()
    else:
        order = np.argsort(conf_N, kind="stable")
        bin_N = np.empty(n, dtype=np.int64)
        for b, members in enumerate(np.array_split(order, num_bins)):
            bin_N[members] = b
        lower = np.full(num_bins, np.nan)
        upper = np.full(num_bins, np.nan)

    count = np.bincount(bin_N, minlength=num_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_conf = np.bincount(bin_N, weights=conf_N, minlength=num_bins) / count
        mean_acc = np.bincount(bin_N, weights=correct_N, minlength=num_bins) / count
    if binning == "adaptive":
        for b in np.flatnonzero(count):
            lower[b] = conf_N[bin_N == b].min()
            upper[b] = conf_N[bin_N == b].max()
    nonempty = count > 0
    weighted_gap = count[nonempty] / n * (mean_conf[nonempty] - mean_acc[nonempty])
    return CalibrationResult(ece=float(np.sum(np.abs(weighted_gap))),
                             overconfidence=float(np.sum(weighted_gap[weighted_gap > 0])),
                             underconfidence=float(np.sum(-weighted_gap[weighted_gap < 0])),
                             bin_lower=lower, bin_upper=upper, bin_confidence=mean_conf,
                             bin_accuracy=mean_acc, bin_count=count.astype(np.int64),
                             binning=binning)


def classwise_calibration_error(probs_NxK: Any, labels_N: Any, num_bins: int = 15, *,
                                mask_N: Any = None) -> float:
    """Classwise ECE (Kull et al., 2019, "Beyond temperature scaling", the metric Dirichlet
    calibration is judged by): the calibration of every class's probability, not only the top
    label's,

        (1/K) sum_k sum_b (n_bk / N) |mean_{i in B_bk} p_ik - mean_{i in B_bk} [y_i = k]|,

    where B_bk holds the examples whose p_ik falls in the equal-width bin b ((lower, upper], as
    `expected_calibration_error`; a probability of exactly 0 goes to the first bin).

    >>> classwise_calibration_error(np.array([[0.75, 0.25], [0.75, 0.25]]), np.array([0, 1]))
    0.25
    """
    num_bins = checks.count(num_bins, "num_bins", 1)
    probs_NxK, labels_N = _probs_labels(probs_NxK, labels_N, mask_N)
    n, k = probs_NxK.shape
    onehot_NxK = np.eye(k, dtype=np.float64)[labels_N]
    # one bincount over (class, bin) pairs: index k * num_bins + b
    cell_NxK = (np.arange(k) * num_bins
                + equal_width_bins(np.clip(probs_NxK, 0.0, 1.0), num_bins)).ravel()
    size = k * num_bins
    gap = np.abs(np.bincount(cell_NxK, weights=probs_NxK.ravel(), minlength=size)
                 - np.bincount(cell_NxK, weights=onehot_NxK.ravel(), minlength=size))
    return float(np.sum(gap) / n / k)


# ------------------------------------------------------------------------------------------------
# Ranking metrics
# ------------------------------------------------------------------------------------------------
def average_precision(is_positive_N: Any, scores_N: Any, *, mask_N: Any = None) -> float:
    """Average precision (the "AUPR" of the paper and of the I-EDL / R-EDL code).

    AP = sum_n (R_n - R_{n-1}) P_n over the distinct score thresholds from high to low (R_{-1} = 0),
    where P_n, R_n are precision and recall of "score >= threshold_n". Step-wise, not the
    trapezoidal area; equal to ``sklearn.metrics.average_precision_score`` including ties.
    Higher score = more likely positive. Without positives: NaN and a warning.
    """
    is_positive_N, scores_N = _binary_inputs(is_positive_N, scores_N, mask_N)
    if not is_positive_N.any():
        return _undefined("Average precision", "positive")
    return average_precision_of_curve(*_binary_curve(is_positive_N, scores_N))


def average_precision_of_curve(tps: np.ndarray, fps: np.ndarray) -> float:
    """`average_precision` from the cumulative true/false positive counts at each distinct
    threshold, highest first (`_binary_curve`; each point with some example at its threshold,
    and some positive)."""
    precision = tps / (tps + fps)
    # sum_n (R_n - R_{n-1}) P_n with the recall steps as integer counts, divided once at the end
    # (so that e.g. perfect separation gives exactly 1.0).
    return float(np.sum(np.diff(tps, prepend=0.0) * precision) / tps[-1])


def auroc(is_positive_N: Any, scores_N: Any, *, mask_N: Any = None) -> float:
    """Area under the ROC curve (trapezoidal over the distinct thresholds).

    Equals ``sklearn.metrics.roc_auc_score`` and the Mann-Whitney probability
    P(score_pos > score_neg) + 0.5 P(score_pos == score_neg). Higher score = more likely positive.
    Without positives or without negatives: NaN and a warning.
    """
    is_positive_N, scores_N = _binary_inputs(is_positive_N, scores_N, mask_N)
    if not is_positive_N.any():
        return _undefined("AUROC", "positive")
    if is_positive_N.all():
        return _undefined("AUROC", "negative")
    return auroc_of_curve(*_binary_curve(is_positive_N, scores_N))


def auroc_of_curve(tps: np.ndarray, fps: np.ndarray) -> float:
    """`auroc` from a `_binary_curve` (`average_precision_of_curve`; positives and negatives)."""
    # Trapezoids on the integer count grid (exact in float64 below 2**53), one division at the end.
    tps, fps = np.r_[0.0, tps], np.r_[0.0, fps]
    twice_area = np.sum(np.diff(fps) * (tps[1:] + tps[:-1]))
    return float(twice_area / (2.0 * tps[-1] * fps[-1]))


def fpr_at_tpr(is_positive_N: Any, scores_N: Any, tpr: float = 0.95, *,
               mask_N: Any = None) -> float:
    """False-positive rate at the first threshold whose true-positive rate reaches ``tpr``.

    Precisely: over all thresholds t (the distinct scores, plus +inf), with the rule
    "positive iff score >= t", returns min{ FPR(t) : TPR(t) >= tpr }. No interpolation. This is
    ``fpr[tpr_curve >= tpr].min()`` for ``sklearn.metrics.roc_curve(..., drop_intermediate=False)``.
    (With sklearn's default drop_intermediate=True the dropped collinear points can make that
    expression larger; the value here is the exact one.) Higher score = more likely positive.
    Without positives or without negatives: NaN and a warning.
    """
    if not 0.0 < tpr <= 1.0:
        raise ValueError(f"tpr must lie in (0, 1], got {tpr}.")
    is_positive_N, scores_N = _binary_inputs(is_positive_N, scores_N, mask_N)
    if not is_positive_N.any():
        return _undefined("FPR at TPR", "positive")
    if is_positive_N.all():
        return _undefined("FPR at TPR", "negative")
    return fpr_at_tpr_of_curve(*_binary_curve(is_positive_N, scores_N), tpr)


def fpr_at_tpr_of_curve(tps: np.ndarray, fps: np.ndarray, tpr: float = 0.95) -> float:
    """`fpr_at_tpr` from a `_binary_curve` (`average_precision_of_curve`; positives and
    negatives)."""
    tpr_curve = tps / tps[-1]
    fpr_curve = fps / fps[-1]
    # FPR is non-decreasing along the curve, so the first index reaching tpr has the minimum.
    return float(fpr_curve[np.argmax(tpr_curve >= tpr)])


def misclassification_detection(correct_N: Any, confidence_N: Any, *, mask_N: Any = None
                                ) -> dict[str, float]:
    """Misclassification detection, the paper's "Conf." columns.

    Positive class = correctly classified example; ``confidence_N`` higher = more likely correct
    (e.g. max projected probability, or -u). Returns ``{"aupr": average precision,
    "auroc": AUROC}``, both fractions. NaN (with a warning) when all or no predictions are correct.
    """
    correct_N, confidence_N = checks.pair(correct_N, confidence_N, "correct_N", "confidence_N")
    correct_N, confidence_N = _binary_inputs(correct_N, confidence_N, mask_N)
    return {"aupr": average_precision(correct_N, confidence_N),
            "auroc": auroc(correct_N, confidence_N)}


def ood_detection(id_scores_N: Any, ood_scores_M: Any, *, id_mask_N: Any = None,
                  ood_mask_M: Any = None) -> dict[str, float]:
    """Out-of-distribution detection from a score where higher = more in-distribution.

    Returns fractions:
      aupr_in:  average precision with in-distribution positive and the score as given (the
                paper's OOD columns, as in the I-EDL / R-EDL code);
      aupr_out: average precision with OOD positive and the negated score (the convention of
                uncertainty-baselines / torch-uncertainty);
      auroc:    AUROC with in-distribution positive (the same with OOD positive and negated score);
      fpr95:    fraction of OOD examples accepted at the first threshold that accepts >= 95% of the
                in-distribution examples (``fpr_at_tpr`` with ID positive, tpr=0.95).
    ``id_mask_N`` and ``ood_mask_M`` remove padding rows of each set.
    """
    id_scores_N = checks.vector(id_scores_N, "id_scores_N")
    ood_scores_M = checks.vector(ood_scores_M, "ood_scores_M")
    (id_scores_N,) = _select(id_mask_N, id_scores_N, mask_name="id_mask_N")
    (ood_scores_M,) = _select(ood_mask_M, ood_scores_M, mask_name="ood_mask_M")
    if id_scores_N.size == 0 or ood_scores_M.size == 0:
        raise ValueError("ood_detection needs at least one in-distribution and one OOD example "
                         f"(after masking), got {id_scores_N.size} and {ood_scores_M.size}.")
    scores = np.concatenate([id_scores_N, ood_scores_M])
    is_id = np.concatenate([np.ones(id_scores_N.size, bool), np.zeros(ood_scores_M.size, bool)])
    is_id, scores = _binary_inputs(is_id, scores, None)
    return {"aupr_in": average_precision(is_id, scores),
            "aupr_out": average_precision(~is_id, -scores),
            "auroc": auroc(is_id, scores),
            "fpr95": fpr_at_tpr(is_id, scores, 0.95)}
