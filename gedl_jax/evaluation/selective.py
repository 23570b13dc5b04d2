"""Selective prediction (classification with a reject option) for any confidence score.

A model predicts on the examples whose confidence score is high enough and abstains on the rest.
For a threshold t the *accepted set* is {i : score_i >= t}; with N examples in all:

  coverage           = |accepted| / N
  selective risk     = errors among the accepted / |accepted|   (0/1 loss: 1 - selective accuracy)
  generalized risk   = errors among the accepted / N            (Traub et al., 2024)

Conventions (all float64, NumPy only):

* Scores are oriented like every score of ``gedl_jax.evaluation.scores``: **higher = more
  confident**; examples are accepted in decreasing score order.
* **Ties**: examples with equal scores are accepted together (a threshold is a score value, never
  a position), so the risk-coverage curve has one point per *distinct* score, and no quantity
  depends on the order in which tied examples happen to be stored. The same rule as the
  ``_binary_curve`` of the AUPR / AUROC code (and as sklearn's ranking metrics).
* **AURC** (Geifman et al., 2019; the ``calc_aurc_eaurc`` code of Moon et al., 2020): the mean
  of the selective risks at the N coverage points 1/N, 2/N, ..., N/N,
  ``AURC = 1/N sum_{n=1}^{N} risk(n/N)``, where risk(n/N) is the selective risk of the smallest
  accepted set holding at least n examples, i.e. of {i : score_i >= s_(n)} with s_(n) the n-th
  largest score. Without ties this is exactly the mean of the running error rates; with ties
  every coverage point inside a run of tied scores takes the risk of the whole run, i.e. the
  step-wise (right-endpoint) area ``sum_j (c_j - c_{j-1}) risk_j`` over the curve's points
  (c_0 = 0), the same step rule as average precision. (fd-shifts integrates the curve between
  its points instead; TorchUncertainty has used a trapezoidal area over the N points; both differ
  from this by O(1/N) without ties.)
* **E-AURC** = AURC - AURC*, with AURC* the AURC of an oracle score that ranks every correct
  prediction above every error (no ties), computed exactly on the same N-point grid:
  ``AURC* = 1/N sum_{n=N-E+1}^{N} (n - (N - E)) / n`` for E errors. Its continuous limit is the
  closed form ``r + (1 - r) ln(1 - r)``, r = E/N, of Geifman et al. (used by the Moon et al.
  code); the exact value lies within [0, r / (2N)] above it (``oracle_aurc_closed_form``), and
  using the exact one makes the E-AURC of a tie-free oracle score exactly 0 and every E-AURC >= 0
  (a run of ties only raises the risks it spans).
* **AUGRC** (Traub et al., 2024): the mean of the generalized risks at the same N coverage
  points, with the same tie rule, ``AUGRC = 1/N sum_n errors(n/N) / N``. (fd-shifts' trapezoidal
  AUGRC, which starts at (0, 0), is smaller by exactly r / (2N) without ties; its oracle value is
  r^2/2, this one's r^2/2 + r/(2N).)
* **Risk at coverage c**: the selective risk of the smallest accepted set whose coverage is
  >= c (the first curve point at or beyond c; no interpolation).
* **Coverage at risk r**: the largest coverage among the curve points whose selective risk is
  <= r; 0 when no point qualifies (abstaining on everything).

**SCOD** (selective classification with OOD inputs in the pool; Xia & Bouganis, 2022, with
every OOD input weighing as one in-distribution example): the pool is the N in-distribution
test examples plus the M examples of one OOD set, N + M in all, ranked by the same score. An
in-distribution example is an error when it is misclassified; an **OOD example is an error
whenever it is accepted** (no label of the task can be right). Every quantity above is then
computed on the pool (``scod_pool`` builds it; ``scod_metrics``, ``scod_aurc``,
``scod_risk_at_coverage``): coverage = |accepted| / (N + M), selective risk = (misclassified
in-distribution + OOD among the accepted) / |accepted|, ties (across the two sets too) accepted
together. The numbers depend on the pool's mix M / (N + M) (the error rate at full coverage
is (E + M) / (N + M)); with M = 0 they are the in-distribution ones.

>>> import numpy as np
>>> correct = np.array([True, True, False, True])
>>> scores = np.array([0.9, 0.8, 0.7, 0.6])
>>> round(aurc(correct, scores), 6)  # risks 0, 0, 1/3, 1/4 at coverages 1/4 .. 4/4
0.145833
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from gedl_jax.evaluation import checks

__all__ = ["COVERAGE_LEVELS", "RISK_LEVELS", "RiskCoverageCurve", "augrc", "aurc",
           "coverage_at_risk", "e_aurc", "oracle_aurc", "oracle_aurc_closed_form",
           "risk_at_coverage", "risk_coverage_curve", "scod_aurc", "scod_metrics", "scod_pool",
           "scod_risk_at_coverage", "selective_metrics"]

# The working points reported by ``selective_metrics``.
COVERAGE_LEVELS: tuple[float, ...] = (0.8, 0.9, 0.95)
RISK_LEVELS: tuple[float, ...] = (0.01, 0.05)


@dataclasses.dataclass(frozen=True, eq=False)
class RiskCoverageCurve:
    """The risk-coverage curve: one point per distinct score, in decreasing score order.

    Attributes (arrays of length M = number of distinct scores):
      thresholds: the score values t_j, decreasing; point j accepts {i : score_i >= t_j}.
      num_accepted: |accepted set| (int64), increasing, the last one N.
      num_errors: errors among the accepted (int64), non-decreasing.
      num_examples: N.
    """

    thresholds: np.ndarray
    num_accepted: np.ndarray
    num_errors: np.ndarray
    num_examples: int

    @property
    def coverage(self) -> np.ndarray:
        """|accepted| / N, float64."""
        return self.num_accepted / float(self.num_examples)

    @property
    def selective_risk(self) -> np.ndarray:
        """errors among the accepted / |accepted|, float64."""
        return self.num_errors / self.num_accepted.astype(np.float64)

    @property
    def generalized_risk(self) -> np.ndarray:
        """errors among the accepted / N, float64 (Traub et al., 2024)."""
        return self.num_errors / float(self.num_examples)

    @property
    def error_rate(self) -> float:
        """The error rate at full coverage, r = E / N."""
        return float(self.num_errors[-1]) / self.num_examples


def _inputs(correct_N: Any, scores_N: Any) -> tuple[np.ndarray, np.ndarray]:
    """Validated (bool correct, float64 scores) of equal shape (N,), N >= 1, scores NaN-free."""
    correct_N, scores_N = checks.pair(correct_N, scores_N, "correct_N", "scores_N")
    checks.nonempty(correct_N, "correct_N")
    correct_N = checks.binary(correct_N, "correct_N")
    scores_N = checks.real_numbers(scores_N, "scores_N")
    return correct_N, scores_N


def risk_coverage_curve(correct_N: Any, scores_N: Any) -> RiskCoverageCurve:
    """The risk-coverage curve of a confidence score (one point per distinct score).

    Args:
      correct_N: (N,) bool (or 0/1), whether each prediction is correct.
      scores_N: (N,) confidence scores, higher = more confident; tied scores are accepted
        together.

    Returns:
      ``RiskCoverageCurve`` (coverage, selective and generalized risk per point).

    >>> c = risk_coverage_curve([True, False, True], [0.9, 0.5, 0.5])
    >>> c.coverage.tolist(), c.selective_risk.tolist()
    ([0.3333333333333333, 1.0], [0.0, 0.3333333333333333])
    """
    correct_N, scores_N = _inputs(correct_N, scores_N)
    order = np.argsort(-scores_N, kind="stable")
    sorted_scores = scores_N[order]
    # The last position of each run of equal scores (compare, not diff, so +-inf ties work).
    last_of_run = np.r_[np.flatnonzero(sorted_scores[1:] != sorted_scores[:-1]),
                        sorted_scores.size - 1]
    errors = np.cumsum(~correct_N[order], dtype=np.int64)[last_of_run]
    return RiskCoverageCurve(thresholds=sorted_scores[last_of_run],
                             num_accepted=(last_of_run + 1).astype(np.int64),
                             num_errors=errors, num_examples=int(correct_N.size))


def _step_area(curve: RiskCoverageCurve, risk: np.ndarray) -> float:
    """sum_j (c_j - c_{j-1}) risk_j: the mean of `risk` over the N coverage points n/N."""
    width = np.diff(curve.num_accepted, prepend=0)  # examples in each run of tied scores
    return float(np.sum(width * risk) / curve.num_examples)


def aurc(correct_N: Any, scores_N: Any) -> float:
    """Area under the risk-coverage curve, 1/N sum_{n=1}^{N} selective risk at coverage n/N.

    Ties are accepted together (module docstring). Lower is better; in [0, 1].

    >>> aurc([True, False], [0.2, 0.1]), aurc([True, False], [0.1, 0.2])
    (0.25, 0.75)
    """
    curve = risk_coverage_curve(correct_N, scores_N)
    return _step_area(curve, curve.selective_risk)


def augrc(correct_N: Any, scores_N: Any) -> float:
    """Area under the generalized risk-coverage curve (Traub et al., 2024),
    1/N sum_{n=1}^{N} (errors accepted at coverage n/N) / N, ties accepted together.

    >>> augrc([True, False], [0.2, 0.1])
    0.25
    """
    curve = risk_coverage_curve(correct_N, scores_N)
    return _step_area(curve, curve.generalized_risk)


def oracle_aurc(num_errors: int, num_examples: int) -> float:
    """AURC of an oracle score ranking all N - E correct predictions first (no ties), exactly:
    1/N sum_{n=N-E+1}^{N} (n - (N - E)) / n.

    >>> oracle_aurc(1, 2)  # risks 0 and 1/2
    0.25
    """
    n, e = int(num_examples), int(num_errors)
    if n < 1 or not 0 <= e <= n:
        raise ValueError(f"need 0 <= num_errors <= num_examples and num_examples >= 1, got "
                         f"{e} and {n}.")
    correct = n - e
    positions = np.arange(correct + 1, n + 1, dtype=np.float64)
    return float(np.sum((positions - correct) / positions) / n)


def oracle_aurc_closed_form(error_rate: float) -> float:
    """r + (1 - r) ln(1 - r), the continuous-coverage oracle AURC (Geifman et al., 2019); the
    limit N -> infinity of ``oracle_aurc(r N, N)``, which exceeds it by at most r / (2N).

    >>> round(oracle_aurc_closed_form(0.1), 6)
    0.005176
    """
    r = float(error_rate)
    if not 0.0 <= r <= 1.0:
        raise ValueError(f"error_rate must lie in [0, 1], got {r}.")
    return r if r == 1.0 else r + (1.0 - r) * math.log1p(-r)


def e_aurc(correct_N: Any, scores_N: Any) -> float:
    """Excess AURC, AURC - ``oracle_aurc`` (the exact oracle on the same N-point grid): 0 for a
    score that ranks every correct prediction above every error, >= 0 always."""
    curve = risk_coverage_curve(correct_N, scores_N)
    return (_step_area(curve, curve.selective_risk)
            - oracle_aurc(int(curve.num_errors[-1]), curve.num_examples))


def risk_at_coverage(correct_N: Any, scores_N: Any, coverage: float) -> float:
    """Selective risk of the smallest accepted set whose coverage is >= `coverage` (in (0, 1]).

    >>> risk_at_coverage([True, False, True, False], [4, 3, 2, 1], 0.5)
    0.5
    """
    if not 0.0 < coverage <= 1.0:
        raise ValueError(f"coverage must lie in (0, 1], got {coverage}.")
    curve = risk_coverage_curve(correct_N, scores_N)
    j = int(np.argmax(curve.coverage >= coverage))  # the last point has coverage 1
    return float(curve.selective_risk[j])


def coverage_at_risk(correct_N: Any, scores_N: Any, risk: float) -> float:
    """The largest coverage among the curve's points whose selective risk is <= `risk`; 0 if
    there is none.

    >>> coverage_at_risk([True, False, True, True], [4, 3, 2, 1], 0.3)
    1.0
    """
    if not 0.0 <= risk <= 1.0:
        raise ValueError(f"risk must lie in [0, 1], got {risk}.")
    curve = risk_coverage_curve(correct_N, scores_N)
    ok = curve.selective_risk <= risk
    return float(curve.coverage[ok].max()) if ok.any() else 0.0


def _level_key(prefix: str, level: float) -> str:
    return f"{prefix}_{level:g}"


def selective_metrics(correct_N: Any, scores_N: Any,
                      coverages: Sequence[float] = COVERAGE_LEVELS,
                      risks: Sequence[float] = RISK_LEVELS) -> dict[str, float | int]:
    """Every selective-prediction metric of one confidence score, as a flat dict of floats.

    Args:
      correct_N: (N,) bool, whether each prediction is correct (e.g. argmax p == label).
      scores_N: (N,) confidence, higher = more confident (MP, -u, ...).
      coverages: working points for "risk_at_coverage_<c>".
      risks: working points for "coverage_at_risk_<r>".

    Returns:
      {"num_examples", "error_rate", "aurc", "aurc_oracle", "e_aurc", "augrc",
       "risk_at_coverage_0.8", "risk_at_coverage_0.9", "risk_at_coverage_0.95",
       "coverage_at_risk_0.01", "coverage_at_risk_0.05"} (fractions; see the module docstring
      for every definition and the tie rule).

    >>> m = selective_metrics([True, True, False, True], [0.9, 0.8, 0.7, 0.6])
    >>> round(m["aurc"], 6), round(m["e_aurc"], 6), m["coverage_at_risk_0.05"]
    (0.145833, 0.083333, 0.5)
    """
    curve = risk_coverage_curve(correct_N, scores_N)
    risk = curve.selective_risk
    coverage = curve.coverage
    n, e = curve.num_examples, int(curve.num_errors[-1])
    area = _step_area(curve, risk)
    oracle = oracle_aurc(e, n)
    out: dict[str, float | int] = {
        "num_examples": n,
        "error_rate": curve.error_rate,
        "aurc": area,
        "aurc_oracle": oracle,
        "e_aurc": area - oracle,
        "augrc": _step_area(curve, curve.generalized_risk),
    }
    for c in coverages:
        if not 0.0 < c <= 1.0:
            raise ValueError(f"coverage levels must lie in (0, 1], got {c}.")
        out[_level_key("risk_at_coverage", c)] = float(risk[int(np.argmax(coverage >= c))])
    for r in risks:
        if not 0.0 <= r <= 1.0:
            raise ValueError(f"risk levels must lie in [0, 1], got {r}.")
        ok = risk <= r
        out[_level_key("coverage_at_risk", r)] = float(coverage[ok].max()) if ok.any() else 0.0
    return out


# ------------------------------------------------------------------------------------------ SCOD
def scod_pool(correct_N: Any, id_scores_N: Any, ood_scores_M: Any
              ) -> tuple[np.ndarray, np.ndarray]:
    """The SCOD pool (module docstring): (correct (N + M,) bool, scores (N + M,) float64), the
    in-distribution examples first, every OOD example incorrect.

    >>> scod_pool([True, False], [0.9, 0.2], [0.5])
    (array([ True, False, False]), array([0.9, 0.2, 0.5]))
    """
    correct_N, id_scores_N = _inputs(correct_N, id_scores_N)
    ood_scores_M = checks.real_numbers(checks.vector(ood_scores_M, "ood_scores_M"),
                                       "ood_scores_M")
    return (np.concatenate([correct_N, np.zeros(ood_scores_M.size, bool)]),
            np.concatenate([id_scores_N, ood_scores_M]))


def scod_aurc(correct_N: Any, id_scores_N: Any, ood_scores_M: Any) -> float:
    """AURC over the SCOD pool: accepted OOD inputs count as errors (module docstring).

    >>> round(scod_aurc([True, True, False], [0.9, 0.5, 0.3], [0.7]), 6)  # 0, 1/2, 1/3, 2/4
    0.333333
    """
    return aurc(*scod_pool(correct_N, id_scores_N, ood_scores_M))


def scod_risk_at_coverage(correct_N: Any, id_scores_N: Any, ood_scores_M: Any,
                          coverage: float) -> float:
    """Selective risk over the SCOD pool at the first point with pool coverage >= `coverage`.

    >>> scod_risk_at_coverage([True, True, False], [0.9, 0.5, 0.3], [0.7], 0.5)
    0.5
    """
    return risk_at_coverage(*scod_pool(correct_N, id_scores_N, ood_scores_M), coverage)


def scod_metrics(correct_N: Any, id_scores_N: Any, ood_scores_M: Any,
                 coverages: Sequence[float] = COVERAGE_LEVELS,
                 risks: Sequence[float] = RISK_LEVELS) -> dict[str, float | int]:
    """``selective_metrics`` over the SCOD pool of one OOD set, plus "num_ood" = M.
    "aurc_oracle" / "e_aurc" refer to the oracle that accepts every correct in-distribution
    example before any error or OOD input.

    >>> m = scod_metrics([True, True, False], [0.9, 0.5, 0.3], [0.7])
    >>> m["num_examples"], m["num_ood"], m["error_rate"]
    (4, 1, 0.5)
    """
    correct, scores = scod_pool(correct_N, id_scores_N, ood_scores_M)
    out = selective_metrics(correct, scores, coverages, risks)
    out["num_ood"] = int(correct.size - np.asarray(correct_N).size)
    return out
