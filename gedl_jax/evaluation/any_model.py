"""Evaluating any model: `evaluate_model` runs a user's predict function (logits,
probabilities, Dirichlet alpha or samples) over every split in padded, jitted batches and
evaluates it with the CLI's protocol (`core.evaluate_predictions`, `report.results_table`).

It reads nothing of a run; the run layer's own batched prediction (a method's compiled predict
step over a sharded split) is `gedl_jax.run.inference.predict_split`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np

from gedl_jax.data import registry
from gedl_jax.evaluation import checks, core, posthoc, report, scores

KINDS: tuple[str, ...] = ("logits", "probs", "dirichlet", "samples", "features_and_logits")


class ModelEvaluation(NamedTuple):
    """What `evaluate_model` returns: the results dict (as the CLI's eval_results.json, less the
    run's provenance keys), the tables (as eval_table.md) and the per-split `Predictions`
    ("test", "validation" where given, "ood/<name>"; `evaluation.saved` writes them)."""

    results: dict[str, Any]
    table: str
    predictions: dict[str, core.Predictions]


def _as_arrays(split, name: str, labelled: bool) -> tuple[np.ndarray, np.ndarray | None]:
    if hasattr(split, "images") and hasattr(split, "labels"):   # a gedl_jax.data.Split
        return split.images, (split.labels if labelled else None)
    if isinstance(split, (tuple, list)):
        if len(split) != 2:
            raise ValueError(f"{name} must be (inputs, labels), got {len(split)} items.")
        return np.asarray(split[0]), (np.asarray(split[1]) if labelled else None)
    if labelled:
        raise ValueError(f"{name} needs labels: pass (inputs, labels) or a data.Split.")
    return np.asarray(split), None


def run_batched(predict_fn: Callable, inputs_N: np.ndarray, batch_size: int,
                key: jax.Array | None = None, jit: bool = True, batch_axis: int = 0) -> Any:
    """`predict_fn` over `inputs_N` in padded batches of `batch_size` (one compilation), every
    example once: its outputs (a pytree of arrays with the batch on `batch_axis`: 1 for
    "samples" (M, B, K)) concatenated with the padding rows dropped, as NumPy. With `key`,
    batch m is `predict_fn(batch, fold_in(key, m))`."""
    fn = jax.jit(predict_fn) if jit else predict_fn
    inputs_N = np.asarray(inputs_N)
    n = len(inputs_N)
    padded = np.zeros((-(-n // batch_size) * batch_size, *inputs_N.shape[1:]), inputs_N.dtype)
    padded[:n] = inputs_N   # the last batch padded with zeros, dropped below
    batches = padded.reshape(-1, batch_size, *inputs_N.shape[1:])
    outs = []
    for m in range(batches.shape[0]):
        args = (batches[m],) if key is None else (batches[m], jax.random.fold_in(key, m))
        outs.append(jax.device_get(fn(*args)))
    keep = np.arange(n)
    return jax.tree.map(lambda *leaves: np.take(np.concatenate(leaves, axis=batch_axis), keep,
                                                axis=batch_axis), *outs)


def _features_and_logits(raw: Any) -> tuple[np.ndarray, np.ndarray]:
    """(features (N, F), logits (N, K)) of a "features_and_logits" output: a pair or a dict."""
    if isinstance(raw, dict) and {"features", "logits"} <= set(raw):
        return np.asarray(raw["features"]), np.asarray(raw["logits"])
    if isinstance(raw, (tuple, list)) and len(raw) == 2:
        return np.asarray(raw[0]), np.asarray(raw[1])
    raise ValueError('kind="features_and_logits" needs predict_fn to return (features, logits) '
                     'or {"features": ..., "logits": ...}.')


def _with_posthoc_scores(options: posthoc.PosthocOptions, kind: str, raw: dict[str, Any],
                         preds: dict[str, core.Predictions], train: tuple[Any, Any] | None,
                         last_layer: Any) -> dict[str, core.Predictions]:
    """`preds` with the post-hoc scores of `options` added to every split's scores. `raw`:
    each split's outputs of predict_fn; `train`: (the training split's outputs, its labels),
    which the feature scores are fitted on."""
    def unpack(r: Any) -> tuple[np.ndarray | None, np.ndarray]:
        return _features_and_logits(r) if kind == "features_and_logits" else (None,
                                                                              np.asarray(r))
    fits = {}
    if train is not None:
        (features, logits), labels = unpack(train[0]), train[1]
        fits = posthoc.fit_posthoc(options, features, labels, logits, last_layer)
    out = {}
    for name, p in preds.items():
        features, logits = unpack(raw[name])
        new = posthoc.posthoc_scores(options, fits, logits, features)
        out[name] = dataclasses.replace(p, scores={**p.scores, **new})
    return out


def _predictions(raw: Any, kind: str, labels: np.ndarray | None,
                 prior_strength: Any) -> core.Predictions:
    if kind == "features_and_logits":
        raw = _features_and_logits(raw)[1]
    if kind in ("logits", "features_and_logits"):
        logits = np.asarray(raw, np.float64)
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        return core.Predictions(probs, scores.categorical_scores(probs), labels)
    if kind == "probs":
        return core.Predictions(raw, scores.categorical_scores(raw), labels)
    if kind == "samples":
        mean, sampled = scores.sampled_scores(raw)
        return core.Predictions(mean, sampled, labels)
    if isinstance(raw, dict):
        alpha = raw.get("alpha", raw.get("alpha_BxK"))
        w = raw.get("prior_strength", raw.get("prior_strength_B", prior_strength))
    else:
        alpha, w = raw, prior_strength
    if w is None:
        w = np.asarray(alpha).shape[1]   # EDL's W = K
    return core.dirichlet_predictions(core.ModelOutputs(alpha, w, labels))


def evaluate_model(predict_fn: Callable, id_data, ood_data: dict[str, Any] | None = None, *,
                   kind: str = "logits", validation=None, batch_size: int = 1024,
                   options: core.EvaluationOptions | None = None, dataset: str | None = None,
                   prior_strength: Any = None, key: jax.Array | None = None,
                   jit: bool = True, posthoc_options: posthoc.PosthocOptions | None = None,
                   train_data=None, last_layer: tuple[Any, Any] | None = None
                   ) -> ModelEvaluation:
    """Evaluates any model with the CLI's protocol: runs `predict_fn` over every split (padded
    batches, jitted once), then `evaluation.evaluate_predictions` and `results_table`.

    Args:
      predict_fn: a batch of inputs (as stored: e.g. uint8 images; normalise inside) -> by
        `kind`: "logits" (B, K); "probs" (B, K); "dirichlet" alpha (B, K), or a dict {"alpha",
        "prior_strength"} (W per example, e.g. GEDL's adaptive W); "samples" (M, B, K)
        probabilities of M passes / members; "features_and_logits" (features (B, F), logits
        (B, K)), a pair or a dict {"features", "logits"}, evaluated as "logits" plus the
        post-hoc feature scores. With `key`, called as predict_fn(batch, key_m).
      id_data: the labelled test set: (inputs, labels) or a `data.Split`.
      ood_data: {name: inputs or Split} (labels unused).
      validation: a labelled validation split (conformal sets, post-hoc calibration).
      batch_size: rows per call (the last batch is padded; padding is dropped).
      options: `EvaluationOptions`; default: the evidence-scale calibrator for "dirichlet", and
        the near/far groups of `dataset`'s OOD sets (`data.ood_group`).
      prior_strength: W of a "dirichlet" predict_fn that returns alpha alone (default K).
      key: the PRNG key of a stochastic predict_fn (batch m gets fold_in(key, m)).
      posthoc_options: the post-hoc OOD scores to add (`evaluation.posthoc.PosthocOptions`;
        default none, so the numbers are the CLI's): logit scores for "logits" and
        "features_and_logits", feature scores ("neg_mahalanobis", "neg_knn_distance", "vim")
        for "features_and_logits" with `train_data`.
      train_data: the labelled training split (inputs, labels) or a `data.Split` that the
        feature scores are fitted on (never the test set).
      last_layer: (weight (F, K), bias (K,)) of a linear last layer, z = f W + b: ViM's.

    Returns:
      ModelEvaluation(results, table, predictions).
    """
    checks.one_of(kind, KINDS, "kind")
    ood_data = dict(ood_data or {})
    if options is None:
        groups = {n: registry.ood_group(dataset, n) for n in ood_data} if dataset else {}
        options = core.EvaluationOptions(
            calibrator="evidence_scale" if kind == "dirichlet" else "temperature",
            ood_groups={n: g for n, g in groups.items() if g is not None})
    posthoc_options = posthoc_options or posthoc.PosthocOptions()
    if posthoc_options.scores and kind not in ("logits", "features_and_logits"):
        raise ValueError(f'post-hoc scores need kind "logits" or "features_and_logits", got '
                         f"{kind!r}.")
    if posthoc_options.needs_features and (kind != "features_and_logits" or train_data is None):
        raise ValueError('the post-hoc feature scores need kind="features_and_logits" and '
                         "train_data.")
    if "vim" in posthoc_options.scores and last_layer is None:
        raise ValueError("vim needs the last linear layer: pass last_layer=(weight_FxK, bias_K).")
    splits = {"test": _as_arrays(id_data, "id_data", True)}
    if validation is not None:
        splits["validation"] = _as_arrays(validation, "validation", True)
    splits.update({f"ood/{n}": _as_arrays(v, n, False) for n, v in ood_data.items()})
    axis = 1 if kind == "samples" else 0
    raw = {name: run_batched(predict_fn, x, batch_size, key, jit, axis)
           for name, (x, y) in splits.items()}
    preds = {name: _predictions(raw[name], kind, y, prior_strength)
             for name, (_, y) in splits.items()}
    if posthoc_options.scores:
        train = None
        if posthoc_options.needs_features:
            x_train, y_train = _as_arrays(train_data, "train_data", True)
            train = (run_batched(predict_fn, x_train, batch_size, key, jit, axis), y_train)
        preds = _with_posthoc_scores(posthoc_options, kind, raw, preds, train, last_layer)
    results = core.evaluate_predictions(
        preds["test"], {n: preds[f"ood/{n}"] for n in ood_data},
        validation=preds.get("validation"), options=options)
    if dataset:
        results["dataset"] = dataset
    return ModelEvaluation(results, report.results_table([results]), preds)
