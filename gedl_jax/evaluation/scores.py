"""Confidence scores and uncertainty measures of Dirichlet outputs, as NumPy float64 arrays.

Convention: every *score* is oriented so that **higher = more confident / more in-distribution**;
ranking metrics (AUPR, AUROC, FPR95) take it as given. *Measures* (``uncertainty_measures``) are
uncertainties, higher = more uncertain.

Score names (``SCORE_NAMES``):
  "mp"                        max_k alpha_k / S, the max projected probability (paper's MP).
  "um"                        -u = -W / S, the negative uncertainty mass (paper's UM). For GEDL the
                              prior strength W differs per example, so S = E + W is not monotone in
                              the evidence E and ranking by S would be wrong (K = 10, C_w = 0.5:
                              S = 10, 2.36, 10.59 at E = 0, 1, 10); u = W / S = 1 / (1 + E / W)
                              is. For EDL / I-EDL /
                              R-EDL, W is a constant and -W/S ranks exactly like the reference
                              code's ``alpha0`` = S.
  "max_alpha"                 max_k alpha_k.
  "strength"                  S = sum_k alpha_k (the reference code's ``alpha0``; not a valid UM
                              for GEDL, kept for comparison).
  "neg_mi"                    -I(y; pi), the negative mutual information (distributional unc.).
  "neg_differential_entropy"  -h(Dir(alpha)).
  "neg_expected_entropy"      -E_{Dir(alpha)}[H(Cat(pi))] (negative aleatoric uncertainty).
  "neg_entropy"               -H(p), the negative entropy of the predictive probabilities (any
                              method; ``categorical_scores``).
  "neg_kernel_distance"       DUQ: max_c log K_c = -min_c ||W_c z - e_c||^2 / (2 n sigma^2), its
                              certainty max_c K_c ("mp") in log space (no ties where K underflows).
  "log_density"               DAEDL: the GDA feature log-density s(x) = logsumexp_c log N(z; mu_c,
                              Sigma_c), before its clipping to the training range.
  "neg_variance_sum"          F-EDL: -EU = -sum_k Var[pi_k] of the Flexible Dirichlet (epistemic).
  "neg_expected_gini"         F-EDL: -AU = -E[1 - sum_k pi_k^2] (aleatoric).
  "msp", "max_logit", "energy", "neg_mahalanobis", "neg_knn_distance", "vim"
                              post-hoc scores of a classifier's logits / penultimate features
                              (``gedl_jax.evaluation.posthoc``, which defines them).
"um" of methods whose Dirichlet has alpha = exp(.) (Prior Networks, PostNet, DAEDL) is scored in
log space, log alpha_0 = logsumexp of the log concentrations: their prior strength W is a constant,
so -W/S and log S rank identically, and exp never overflows (float32 overflows above ~88.7).
F-EDL's "um" is log(alpha_0 + tau), the log precision of its Flexible Dirichlet.
For methods that average several predictive distributions (MC Dropout passes, ensemble members),
"neg_mi" is the negative mutual information between the prediction and the pass / member,
H(mean_m p_m) - mean_m H(p_m) (``sampled_scores``).

The closed forms are the exact ones of ``gedl_jax.evidential`` (the reference code adds 1e-6 to
alpha for the differential entropy and 1e-5 inside the log of the total entropy; this changes
no ranking in practice). They are evaluated in float64 (``jax.enable_x64`` locally), because the
mutual information of a confident example, ~(K-1)/(2S), is a difference of two nearly equal
entropies and loses its ranking in float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gedl_jax import evidential as ev
from gedl_jax.evaluation import checks, posthoc

__all__ = ["SCORE_NAMES", "DIRICHLET_SCORE_NAMES", "MEASURE_NAMES", "categorical_scores",
           "check_dirichlet", "confidence_scores", "entropy", "sampled_scores",
           "uncertainty_measures"]

# The scores of a Dirichlet (``confidence_scores``), in table order.
DIRICHLET_SCORE_NAMES: tuple[str, ...] = ("mp", "um", "max_alpha", "strength", "neg_mi",
                                          "neg_differential_entropy", "neg_expected_entropy")
# Every score any method may report, in table order.
SCORE_NAMES: tuple[str, ...] = DIRICHLET_SCORE_NAMES + ("neg_entropy",)
# Method-specific scores (gedl_jax.methods): DUQ's, DAEDL's and F-EDL's own.
SCORE_NAMES += ("neg_kernel_distance", "log_density", "neg_variance_sum", "neg_expected_gini")
# The post-hoc scores of any classifier's logits and features ("neg_entropy" is already above).
SCORE_NAMES += tuple(s for s in posthoc.POSTHOC_SCORE_NAMES if s not in SCORE_NAMES)
MEASURE_NAMES: tuple[str, ...] = ("u", "mutual_information", "variance_sum", "expected_entropy",
                                  "differential_entropy", "max_probability", "strength",
                                  "log_strength")


# The Dirichlet's input check, under the name this module has always exported (`checks.dirichlet`).
check_dirichlet = checks.dirichlet


# Measures are computed in fixed-size chunks so that one compilation per K serves every set size.
_CHUNK = 1024


@jax.jit
def _all_measures(alpha_CxK: jax.Array, w_C: jax.Array) -> dict[str, jax.Array]:
    strength_C = ev.dirichlet_strength(alpha_CxK)
    return {
        "u": ev.uncertainty_mass(alpha_CxK, w_C),
        "mutual_information": ev.mutual_information(alpha_CxK),
        "variance_sum": ev.variance_sum(alpha_CxK),
        "expected_entropy": ev.expected_entropy(alpha_CxK),
        "differential_entropy": ev.differential_entropy(alpha_CxK),
        "max_probability": ev.max_probability(alpha_CxK),
        "strength": strength_C,
        "log_strength": jnp.log(strength_C),
    }


def uncertainty_measures(alpha_NxK: Any, prior_strength_N: Any,
                         names: Sequence[str] = MEASURE_NAMES) -> dict[str, np.ndarray]:
    """Per-example uncertainty measures (higher = more uncertain, except the last three).

    "u" = W / S, "mutual_information", "variance_sum" = sum_k Var[pi_k], "expected_entropy",
    "differential_entropy", "max_probability" = max_k alpha_k / S, "strength" = S,
    "log_strength" = log S. Returns float64 arrays of shape (N,).
    """
    checks.known(names, MEASURE_NAMES, "measures")
    alpha_NxK, prior_strength_N = checks.dirichlet(alpha_NxK, prior_strength_N)
    n = alpha_NxK.shape[0]
    out = {name: np.empty(n, dtype=np.float64) for name in names}
    with jax.enable_x64(True):
        for start in range(0, n, _CHUNK):
            alpha_CxK = alpha_NxK[start:start + _CHUNK]
            w_C = prior_strength_N[start:start + _CHUNK]
            rows = alpha_CxK.shape[0]
            if rows < _CHUNK:   # pad to the fixed chunk shape with harmless rows (alpha = W = 1)
                pad = _CHUNK - rows
                alpha_CxK = np.concatenate([alpha_CxK, np.ones((pad, alpha_CxK.shape[1]))])
                w_C = np.concatenate([w_C, np.ones(pad)])
            measures = _all_measures(alpha_CxK, w_C)
            for name in names:
                out[name][start:start + rows] = np.asarray(measures[name])[:rows]
    return out


def confidence_scores(alpha_NxK: Any, prior_strength_N: Any,
                      names: Sequence[str] = DIRICHLET_SCORE_NAMES) -> dict[str, np.ndarray]:
    """Confidence scores of Dirichlet outputs, higher = more confident / more in-distribution.

    Args:
      alpha_NxK: Dirichlet parameters, > 0.
      prior_strength_N: the prior strength W of each example (GEDL: adaptive, per example;
        EDL: K; R-EDL: lambda K), or a scalar for a fixed W.
      names: which scores to return, from ``DIRICHLET_SCORE_NAMES`` (see the module docstring).

    Returns:
      {name: float64 array of shape (N,)}. "um" is -W/S (= -u), never S.
    """
    checks.known(names, DIRICHLET_SCORE_NAMES, "scores")
    needed = {"mp": "max_probability", "um": "u", "strength": "strength",
              "neg_mi": "mutual_information", "neg_differential_entropy": "differential_entropy",
              "neg_expected_entropy": "expected_entropy"}
    alpha_NxK, prior_strength_N = checks.dirichlet(alpha_NxK, prior_strength_N)
    measures = uncertainty_measures(alpha_NxK, prior_strength_N,
                                    names=sorted({needed[n] for n in names if n in needed}))
    scores = {}
    for name in names:
        if name == "mp":
            scores[name] = measures["max_probability"]
        elif name == "strength":
            scores[name] = measures["strength"]
        elif name == "max_alpha":
            scores[name] = alpha_NxK.max(axis=1)
        else:  # negated uncertainties
            scores[name] = -measures[needed[name]]
    return scores


def entropy(probs_NxK: Any) -> np.ndarray:
    """H(p) = -sum_k p_k log p_k per row (natural log, 0 log 0 = 0), float64."""
    p = np.asarray(probs_NxK, dtype=np.float64)
    return -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=-1)


def categorical_scores(probs_NxK: Any) -> dict[str, np.ndarray]:
    """Scores of a plain predictive distribution: "mp" = max_k p_k, "neg_entropy" = -H(p)."""
    p = checks.distributions(probs_NxK, "probs_NxK")
    return {"mp": p.max(axis=1), "neg_entropy": -entropy(p)}


def sampled_scores(probs_MxNxK: Any) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The mean of M predictive distributions (MC Dropout passes, ensemble members) and its
    scores: "mp" and "neg_entropy" of the mean, and "neg_mi" = -(H(mean_m p_m) - mean_m H(p_m)),
    the negative mutual information between prediction and pass (epistemic; >= 0 before the
    sign, clipped at 0 against rounding). Returns (mean probs (N, K), scores)."""
    p = checks.stacked_probabilities(probs_MxNxK)
    mean_NxK = p.mean(axis=0)
    scores = categorical_scores(mean_NxK)
    scores["neg_mi"] = -np.maximum(entropy(mean_NxK) - entropy(p).mean(axis=0), 0.0)
    return mean_NxK, scores
