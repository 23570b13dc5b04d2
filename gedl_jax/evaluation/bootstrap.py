"""Bootstrap confidence intervals of a single run's metrics over its test examples.

A mean ± std over seeds says how much training varies; it says nothing about how much a number
would move on another draw of test examples, which is what a single run (your own network, one
seed) needs. With ``EvaluationOptions(bootstrap_samples=B)`` (``config.bootstrap_samples``,
``evaluate --bootstrap_samples``) the evaluation adds ``results["bootstrap"]``: for each metric a
percentile interval ``[low, high]`` at ``bootstrap_confidence`` (default 0.95) and the
bootstrap standard error ``se`` (the replicates' std, ddof=1), from B replicates in which:

* the in-distribution test examples are drawn n times with replacement (one draw per replicate,
  shared by every metric and OOD set of that replicate);
* each OOD set's examples are drawn m times with replacement, independently of the test set and
  of the other OOD sets (a stream per set, keyed by its name, so adding a set moves no other
  set's interval).

Metrics: accuracy, NLL, Brier, 15-bin equal-width ECE with its over- and underconfident parts,
classwise ECE, and misclassification AUPR / AUROC of each score on the test set; AUPR-in,
AUPR-out, AUROC and FPR95 of each score and OOD set. A replicate in which a metric is undefined
(no misclassified example drawn) is left out of that metric's interval and counted in
``undefined``.

Each replicate's value is the metric of the resampled arrays, as ``gedl_jax.evaluation.metrics``
computes it (ties included): the examples are ranked once, and a replicate counts how often each
tied run of scores was drawn (``tests/test_bootstrap.py`` checks it against the metric functions
on explicitly resampled arrays, and the intervals' coverage on data of known AUROC and accuracy).
The intervals are the percentile method by default (Efron & Tibshirani, 1993, ch. 13): simple
and transformation-respecting, ``[q(a/2), q(1 - a/2)]`` of the replicates. For a metric whose
plug-in estimate is biased, such as any ECE (biased upwards: binning noise only adds to it), the
replicates sit on the biased side of the estimate, and so does the percentile interval.
``method="basic"`` (the reverse percentile interval, ``[2 t - q(1 - a/2), 2 t - q(a/2)]`` with
``t`` the metric on all examples; ``scipy.stats.bootstrap``'s "basic") reflects them about the
estimate, which corrects that bias to first order, at the cost of bounds that can leave the
metric's range (below 0 for an ECE near 0). BCa would need a jackknife pass of n metric
evaluations per metric.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from gedl_jax.evaluation import checks, metrics

__all__ = ["INTERVAL_METHODS", "bootstrap_section", "detection_replicates", "id_replicates",
           "interval", "paired_section", "replicates", "resample_indices", "score_section"]

INTERVAL_METHODS = ("percentile", "basic")

DETECTION_KEYS = ("aupr_in", "aupr_out", "auroc", "fpr95")
ID_KEYS = ("accuracy", "nll", "brier", "ece", "ece_overconfidence", "ece_underconfidence",
           "ece_classwise")


def resample_indices(n: int, samples: int, seed: int, stream: str) -> Iterator[np.ndarray]:
    """`samples` rows of n int32 indices drawn uniformly with replacement from range(n), one row
    at a time (a (samples, n) array of a large test set would not fit), seeded by (seed, the
    CRC-32 of `stream`): the same rows for the same set name and seed."""
    rng = np.random.default_rng([int(seed), zlib.crc32(stream.encode())])
    for _ in range(int(samples)):
        yield rng.integers(0, n, size=n, dtype=np.int32)


class _Ranking:
    """Scores ranked once: each example's run of tied scores, from the highest run down
    (`metrics._binary_curve`'s thresholds)."""

    def __init__(self, scores_N: np.ndarray):
        order = np.argsort(-scores_N, kind="stable")
        ranked = scores_N[order]
        starts = np.r_[True, ranked[1:] != ranked[:-1]]   # compare: +-inf ties work
        self.num_runs = int(starts.sum())
        self.run_N = np.empty(scores_N.size, np.int64)
        self.run_N[order] = np.cumsum(starts) - 1

    def counts(self, positive_runs: np.ndarray, negative_runs: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
        """How many of the given examples (their runs, with repeats) fall in each run, from
        the highest run down, over the runs that hold at least one of them: (positives,
        negatives)."""
        pos = np.bincount(positive_runs, minlength=self.num_runs)
        neg = np.bincount(negative_runs, minlength=self.num_runs)
        drawn = (pos + neg) > 0
        return pos[drawn], neg[drawn]

    def curve(self, positive_runs: np.ndarray, negative_runs: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray]:
        """The (tps, fps) curve of the given examples: their `_binary_curve`."""
        return _curve(*self.counts(positive_runs, negative_runs))


def _curve(pos_R: np.ndarray, neg_R: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return np.cumsum(pos_R, dtype=np.float64), np.cumsum(neg_R, dtype=np.float64)


def _ranking_values(tps: np.ndarray, fps: np.ndarray, keys: Sequence[str]) -> list[float]:
    has_pos, has_neg = tps[-1] > 0, fps[-1] > 0
    out = []
    for key in keys:
        if key == "aupr":
            out.append(metrics.average_precision_of_curve(tps, fps) if has_pos else np.nan)
        elif key == "auroc":
            out.append(metrics.auroc_of_curve(tps, fps) if has_pos and has_neg else np.nan)
        elif key == "fpr95":
            out.append(metrics.fpr_at_tpr_of_curve(tps, fps, 0.95) if has_pos and has_neg
                       else np.nan)
    return out


def detection_replicates(id_scores_N: np.ndarray, ood_scores_M: np.ndarray,
                         id_draws: Iterable[np.ndarray], ood_draws: Iterable[np.ndarray]
                         ) -> dict[str, np.ndarray]:
    """{"aupr_in", "aupr_out", "auroc", "fpr95"}: (B,) values of `metrics.ood_detection` on
    each replicate's resampled test and OOD scores (the b-th row of each of the draws)."""
    id_scores_N = np.asarray(id_scores_N, np.float64)
    ood_scores_M = np.asarray(ood_scores_M, np.float64)
    ranking = _Ranking(np.concatenate([id_scores_N, ood_scores_M]))
    id_runs, ood_runs = ranking.run_N[:id_scores_N.size], ranking.run_N[id_scores_N.size:]
    out = []
    for id_draw, ood_draw in zip(id_draws, ood_draws, strict=True):
        id_R, ood_R = ranking.counts(id_runs[id_draw], ood_runs[ood_draw])
        aupr_in, auroc, fpr95 = _ranking_values(*_curve(id_R, ood_R), ("aupr", "auroc", "fpr95"))
        # OOD positive with the negated score: the same runs, lowest first
        aupr_out = metrics.average_precision_of_curve(*_curve(ood_R[::-1], id_R[::-1]))
        out.append((aupr_in, aupr_out, auroc, fpr95))
    return dict(zip(DETECTION_KEYS, np.asarray(out, np.float64).reshape(-1, 4).T, strict=True))


def id_replicates(probs_NxK: np.ndarray, labels_N: np.ndarray, scores: Mapping[str, Any],
                  draws: Iterable[np.ndarray], num_bins: int = 15) -> dict[str, Any]:
    """(B,) values on each replicate's resampled test examples: "accuracy", "nll", "brier"
    (squared), "ece" (equal-width, `num_bins`) and its parts "ece_overconfidence" and
    "ece_underconfidence", "ece_classwise", and "misclassification": {score: {"aupr",
    "auroc"}} (correct predictions positive), as `metrics` computes them."""
    terms = metrics.per_example_terms(probs_NxK, labels_N)
    conf_N, nll_N, brier_N = terms["confidence"], terms["nll"], terms["squared_error"]
    correct_N = terms["correct"].astype(bool)
    n = conf_N.size
    bin_N = metrics.equal_width_bins(conf_N, num_bins)
    # classwise ECE: every (class, bin) cell of every example's class probabilities, as
    # `metrics.classwise_calibration_error` bins them (index k * num_bins + b)
    probs_NxK = np.asarray(probs_NxK, np.float64)
    k = probs_NxK.shape[1]
    cell_NK = (np.arange(k) * num_bins
               + metrics.equal_width_bins(np.clip(probs_NxK, 0.0, 1.0), num_bins)).ravel()
    onehot_NK = (np.asarray(labels_N)[:, None] == np.arange(k)).astype(np.float64).ravel()
    probs_NK = probs_NxK.ravel()
    ranked = {s: _Ranking(np.asarray(v, np.float64)) for s, v in scores.items()}
    values: dict[str, list[float]] = {k: [] for k in ID_KEYS}
    ranking_values: dict[str, list[list[float]]] = {s: [] for s in scores}
    for draw in draws:
        # each example's multiplicity in the replicate: sums over the draw as weighted sums
        weight_N = np.bincount(draw, minlength=n).astype(np.float64)
        values["accuracy"].append(weight_N @ correct_N / n)
        values["nll"].append(weight_N @ nll_N / n)
        values["brier"].append(weight_N @ brier_N / n)
        count = np.bincount(bin_N, weights=weight_N, minlength=num_bins)
        signed = (np.bincount(bin_N, weights=weight_N * conf_N, minlength=num_bins)
                  - np.bincount(bin_N, weights=weight_N * correct_N, minlength=num_bins)
                  )[count > 0] / n   # (n_b / n)(conf_b - acc_b) of the drawn examples
        values["ece"].append(float(np.sum(np.abs(signed))))
        values["ece_overconfidence"].append(float(np.sum(signed[signed > 0])))
        values["ece_underconfidence"].append(float(np.sum(-signed[signed < 0])))
        weight_NK = np.repeat(weight_N, k)
        values["ece_classwise"].append(float(np.sum(np.abs(
            np.bincount(cell_NK, weights=weight_NK * probs_NK, minlength=k * num_bins)
            - np.bincount(cell_NK, weights=weight_NK * onehot_NK, minlength=k * num_bins)))
            / n / k))
        _misclassification_of_draw(ranked, correct_N, draw, ranking_values)
    out: dict[str, Any] = {k: np.asarray(v, np.float64) for k, v in values.items()}
    out["misclassification"] = _misclassification_arrays(ranking_values)
    return out


def _misclassification_of_draw(ranked: Mapping[str, _Ranking], correct_N: np.ndarray,
                               draw: np.ndarray, out: dict[str, list[list[float]]]) -> None:
    """Append each score's [AUPR, AUROC] of misclassification detection (correct positive) on
    the drawn examples to out[score]."""
    drawn_correct = correct_N[draw]
    for s, ranking in ranked.items():
        runs = ranking.run_N[draw]
        tps, fps = ranking.curve(runs[drawn_correct], runs[~drawn_correct])
        out[s].append(_ranking_values(tps, fps, ("aupr", "auroc")))


def _misclassification_arrays(values: Mapping[str, list[list[float]]]) -> dict[str, Any]:
    return {s: dict(zip(("aupr", "auroc"), np.asarray(v, np.float64).reshape(-1, 2).T,
                        strict=True)) for s, v in values.items()}


def score_section(correct_N: np.ndarray, id_scores: Mapping[str, np.ndarray],
                  ood_scores: Mapping[str, Mapping[str, np.ndarray]],
                  score_names: Sequence[str], samples: int, confidence: float = 0.95,
                  seed: int = 0, method: str = "percentile") -> dict[str, Any]:
    """Intervals of scores that come without predictions of their own (the post-hoc OOD
    scores, results' "posthoc" -> "bootstrap"): {"settings", "misclassification": {score:
    {"aupr", "auroc": interval}}, "ood": {set: {score: {metric: interval}}}}, on the draws
    `bootstrap_section` makes with the same `seed` (the streams "id" and "ood/<set>"), so a
    replicate of these scores and of the method's own draws the same examples.
    `correct_N`: whether each test example's prediction is right."""
    _check(samples, confidence, method)
    correct_N = np.asarray(correct_N, bool)
    n = correct_N.size
    ranked = {s: _Ranking(np.asarray(id_scores[s], np.float64)) for s in score_names}

    def values_of(id_draws, ood_draws):
        mis: dict[str, list[list[float]]] = {s: [] for s in score_names}
        for draw in id_draws():
            _misclassification_of_draw(ranked, correct_N, draw, mis)
        return {"misclassification": _misclassification_arrays(mis),
                "ood": _ood_replicates(id_scores, ood_scores, score_names, id_draws, ood_draws)}

    values = values_of(*_streams(n, samples, seed))
    points = values_of(*_whole(n)) if method == "basic" else None
    return {"settings": _settings(samples, confidence, seed, method=method),
            **_intervals(values, points, confidence, method)}


def interval(values_B: np.ndarray, confidence: float, method: str = "percentile",
             point: float | None = None) -> dict[str, float | int | None]:
    """The interval of the defined replicate values (`method`: "percentile", or "basic", which
    reflects the percentile bounds about `point`, the metric on all examples), their std
    (ddof=1) and how many replicates left the metric undefined (NaN)."""
    values_B = np.asarray(values_B, np.float64)
    defined = values_B[~np.isnan(values_B)]
    undefined = int(values_B.size - defined.size)
    if defined.size < 2 or (method == "basic" and (point is None or np.isnan(point))):
        return {"low": None, "high": None, "se": None, "undefined": undefined}
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(defined, [tail, 1.0 - tail])
    if method == "basic":
        low, high = 2.0 * point - high, 2.0 * point - low
    return {"low": float(low), "high": float(high), "se": float(np.std(defined, ddof=1)),
            "undefined": undefined}


def _intervals(values: Mapping[str, Any], points: Mapping[str, Any] | None, confidence: float,
               method: str) -> dict[str, Any]:
    """`interval` of every replicate array in `values`, about the point at the same place in
    `points` (one-replicate arrays of the metrics on all examples) where `method` needs it."""
    if points is None:
        return _map_leaves(lambda v: interval(v, confidence, method), values)
    return _map_leaves(lambda v, t: interval(v, confidence, method, float(t[0])), values, points)


def _check(samples: int, confidence: float, method: str = "percentile") -> None:
    """The replicates' settings, by the evaluation's shared checks."""
    checks.count(samples, "bootstrap samples", 2)
    checks.open_unit(confidence, "bootstrap confidence")
    checks.one_of(method, INTERVAL_METHODS, "bootstrap interval method")


def _streams(n: int, samples: int, seed: int):
    """The replicates' draws: (the test set's, as a callable that starts the "id" stream
    anew; {set size m, set name} -> that set's "ood/<set>" stream)."""
    return (lambda: resample_indices(n, samples, seed, "id"),
            lambda m, name: resample_indices(m, samples, seed, f"ood/{name}"))


def _whole(n: int):
    """One "draw" of every example once, in order, for each set: the metrics on all examples."""
    return (lambda: iter([np.arange(n)]), lambda m, name: iter([np.arange(m)]))


def replicates(probs_NxK: np.ndarray, labels_N: np.ndarray, id_scores: Mapping[str, np.ndarray],
               ood_scores: Mapping[str, Mapping[str, np.ndarray]], score_names: Sequence[str],
               samples: int, seed: int = 0, num_bins: int = 15) -> dict[str, Any]:
    """Every metric's (samples,) replicate values: {"id": `id_replicates`, "ood": {set:
    {score: `detection_replicates`}}}. Two runs on the same examples get the same draws from
    the same `seed` (a paired comparison: `paired_section`)."""
    n = int(np.asarray(labels_N).size)
    return _replicates_of(probs_NxK, labels_N, id_scores, ood_scores, score_names, num_bins,
                          *_streams(n, samples, seed))


def _replicates_of(probs_NxK, labels_N, id_scores, ood_scores, score_names, num_bins,
                   id_draws, ood_draws) -> dict[str, Any]:
    """`replicates` on the draws `id_draws()` and `ood_draws(m, set)` give (`_streams`,
    `_whole`)."""
    return {"id": id_replicates(probs_NxK, labels_N, {s: id_scores[s] for s in score_names},
                                id_draws(), num_bins),
            "ood": _ood_replicates(id_scores, ood_scores, score_names, id_draws, ood_draws)}


def _ood_replicates(id_scores: Mapping[str, np.ndarray],
                    ood_scores: Mapping[str, Mapping[str, np.ndarray]],
                    score_names: Sequence[str], id_draws, ood_draws) -> dict[str, Any]:
    """{set: {score: `detection_replicates`}} on the draws `id_draws()` of the test examples
    and `ood_draws(m, set)` of each set's m examples."""
    out: dict[str, Any] = {}
    for name, scores in ood_scores.items():
        out[name] = {}
        for s in score_names:   # the same rows for every score: one replicate, every metric
            m = int(np.asarray(scores[s]).size)
            out[name][s] = detection_replicates(id_scores[s], scores[s], id_draws(),
                                                ood_draws(m, name))
    return out


def _map_leaves(fn, *trees):
    """`fn` of the arrays at the same place in `trees` (nested dicts of replicate arrays)."""
    if isinstance(trees[0], Mapping):
        return {k: _map_leaves(fn, *(t[k] for t in trees)) for k in trees[0]}
    return fn(*trees)


def bootstrap_section(probs_NxK: np.ndarray, labels_N: np.ndarray,
                      id_scores: Mapping[str, np.ndarray],
                      ood_scores: Mapping[str, Mapping[str, np.ndarray]],
                      score_names: Sequence[str], samples: int, confidence: float = 0.95,
                      seed: int = 0, num_bins: int = 15, method: str = "percentile"
                      ) -> dict[str, Any]:
    """`results["bootstrap"]` (module docstring): {"settings", "id": {metric: interval,
    "misclassification": {score: {metric: interval}}}, "ood": {set: {score: {metric:
    interval}}}}. `ood_scores`: {set: {score: (M,) scores}}."""
    _check(samples, confidence, method)
    values = replicates(probs_NxK, labels_N, id_scores, ood_scores, score_names, samples, seed,
                        num_bins)
    points = _replicates_of(probs_NxK, labels_N, id_scores, ood_scores, score_names, num_bins,
                            *_whole(int(np.asarray(labels_N).size))) \
        if method == "basic" else None
    return {"settings": _settings(samples, confidence, seed, num_bins, method),
            **_intervals(values, points, confidence, method)}


def _settings(samples: int, confidence: float, seed: int, num_bins: int | None = None,
              method: str = "percentile") -> dict[str, Any]:
    """The settings a section records ("ece_bins" where it has ECEs)."""
    out = {"samples": int(samples), "confidence": float(confidence), "seed": int(seed),
           "method": method}
    return out if num_bins is None else {**out, "ece_bins": int(num_bins)}


def paired_section(a: Mapping[str, Any] | Sequence[Mapping[str, Any]],
                   b: Mapping[str, Any] | Sequence[Mapping[str, Any]],
                   score_names: Sequence[str], samples: int, confidence: float = 0.95,
                   seed: int = 0, num_bins: int = 15, method: str = "percentile"
                   ) -> dict[str, Any]:
    """Two runs, or two methods' runs over seeds, on the same test and OOD examples compared:
    for every metric, the interval (`method`) of the difference A - B over replicates that draw
    the same examples for every run (paired), with "a" and "b" the metric on all examples (the
    mean over a method's runs), "difference" = a - b, and "a_better", the fraction of
    replicates in which A is better (higher, or lower for NLL, Brier, the ECEs and FPR95).

    `a`, `b`: one run, {"test": Predictions, "ood/<set>": Predictions} (`load_predictions` of
    its predictions.npz), or a sequence of them (a method's seeds). With several runs a
    replicate also draws the method's runs with replacement, independently for A and B (a
    stream each), and averages the drawn runs' metrics on that replicate's examples: the
    interval then holds the variation over seeds as well as over examples. With one run per
    side this is the plain paired bootstrap. The OOD sets every run has are compared.
    Raises ValueError when the test sets differ (sizes or labels)."""
    _check(samples, confidence, method)
    runs_a, runs_b = _as_runs(a), _as_runs(b)
    everyone = runs_a + runs_b
    labels = everyone[0]["test"].labels
    for run in everyone:
        if run["test"].labels is None or labels is None or \
                not np.array_equal(run["test"].labels, labels):
            raise ValueError("the runs' test sets differ (sizes or labels): a paired comparison "
                             "needs the same examples in the same order")
    sets = [k[len("ood/"):] for k in everyone[0] if k.startswith("ood/")
            and all(k in run for run in everyone)]
    for name in sets:
        sizes = {run[f"ood/{name}"].num_examples for run in everyone}
        if len(sizes) > 1:
            raise ValueError(f"OOD set {name!r} has {sorted(sizes)} examples in different runs")
    missing = sorted({s for run in everyone for s in score_names if s not in run["test"].scores})
    if missing:
        raise ValueError(f"score(s) {missing} are not in every run (A: "
                         f"{sorted(runs_a[0]['test'].scores)}, B: "
                         f"{sorted(runs_b[0]['test'].scores)})")

    def values(runs, stream):
        return _over_runs([replicates(run["test"].probs, run["test"].labels, run["test"].scores,
                                      {n: run[f"ood/{n}"].scores for n in sets}, score_names,
                                      samples, seed, num_bins) for run in runs],
                          samples, seed, stream)

    full = {"id": np.arange(labels.size)}   # the point values: all examples, once

    def point(runs):
        return _map_leaves(lambda *v: float(np.mean(v)),
                           *(_point(run, sets, score_names, full, num_bins) for run in runs))

    point_a, point_b = point(runs_a), point(runs_b)

    def compare(va, vb, pa, pb, lower_is_better):
        diff = va - vb
        entry = interval(diff, confidence, method, pa - pb)
        defined = ~np.isnan(diff)
        better = (diff < 0) if lower_is_better else (diff > 0)
        entry.update({"a": pa, "b": pb, "difference": pa - pb,
                      "a_better": float(better[defined].mean()) if defined.any() else None})
        return entry

    va, vb = values(runs_a, "runs/a"), values(runs_b, "runs/b")
    out = {"id": {k: compare(va["id"][k], vb["id"][k], point_a["id"][k], point_b["id"][k],
                             k != "accuracy") for k in ID_KEYS},
           "ood": {}}
    out["id"]["misclassification"] = {
        s: {k: compare(va["id"]["misclassification"][s][k], vb["id"]["misclassification"][s][k],
                       point_a["id"]["misclassification"][s][k],
                       point_b["id"]["misclassification"][s][k], False)
            for k in ("aupr", "auroc")} for s in score_names}
    for name in sets:
        out["ood"][name] = {
            s: {k: compare(va["ood"][name][s][k], vb["ood"][name][s][k],
                           point_a["ood"][name][s][k], point_b["ood"][name][s][k],
                           k == "fpr95") for k in DETECTION_KEYS} for s in score_names}
    return {"settings": {**_settings(samples, confidence, seed, num_bins, method), "paired": True,
                         "runs": [len(runs_a), len(runs_b)]},
            **out}


def _as_runs(side: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    runs = [side] if isinstance(side, Mapping) else list(side)
    if not runs:
        raise ValueError("each side of a comparison needs at least one run")
    return runs


def _over_runs(trees: Sequence[Mapping[str, Any]], samples: int, seed: int,
               stream: str) -> dict[str, Any]:
    """A method's replicate values from its runs' (`replicates` of each run, on the same
    example draws): in replicate b, the mean over a draw of the runs with replacement of their
    values at b (a draw per replicate, seeded by (seed, `stream`)); one run's values as they
    are."""
    if len(trees) == 1:
        return dict(trees[0])
    rng = np.random.default_rng([int(seed), zlib.crc32(stream.encode())])
    drawn_BxS = rng.integers(0, len(trees), size=(int(samples), len(trees)))
    columns_B = np.arange(int(samples))[:, None]
    return _map_leaves(lambda *v: np.stack(v)[drawn_BxS, columns_B].mean(axis=1), *trees)


def _point(run, sets, score_names, full, num_bins) -> dict[str, Any]:
    """The metrics of `run` on all its examples, shaped like `replicates`' values (one
    "replicate" drawing every example once)."""
    values = _replicates_of_draws(run, sets, score_names, full, num_bins)
    return _map_leaves(lambda v: float(v[0]), values)


def _replicates_of_draws(run, sets, score_names, draws: Mapping[str, np.ndarray],
                        num_bins: int) -> dict[str, Any]:
    """`replicates` for one given draw of each set (`draws`: {"id": indices, "ood/<set>":
    indices; a set left out is drawn whole, in order})."""
    test = run["test"]
    out: dict[str, Any] = {"id": id_replicates(
        test.probs, test.labels, {s: test.scores[s] for s in score_names}, [draws["id"]],
        num_bins), "ood": {}}
    for name in sets:
        o = run[f"ood/{name}"]
        ood_draw = draws.get(f"ood/{name}", np.arange(o.num_examples))
        out["ood"][name] = {s: detection_replicates(test.scores[s], o.scores[s], [draws["id"]],
                                                    [ood_draw]) for s in score_names}
    return out
