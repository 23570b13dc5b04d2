"""Evaluating any model: `evaluate_model` runs a user's predict function (logits,
probabilities, Dirichlet alpha or samples) over every split in padded, jitted batches and
evaluates it with the CLI's protocol (`core.evaluate_predictions`, `report.results_table`).

It reads nothing of a run; the run layer's own batched prediction (a method's compiled predict
step over a sharded split) is `gedl_jax.run.inference.predict_split`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import numpy as np

from gedl_jax.data import registry
from gedl_jax.evaluation import core, report, scores

KINDS: tuple[str, ...] = ("logits", "probs", "dirichlet", "samples")


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


def _predictions(raw: Any, kind: str, labels: np.ndarray | None,
                 prior_strength: Any) -> core.Predictions:
    if kind == "logits":
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
                   jit: bool = True) -> ModelEvaluation:
    """Evaluates any model with the CLI's protocol: runs `predict_fn` over every split (padded
    batches, jitted once), then `evaluation.evaluate_predictions` and `results_table`.

    Args:
      predict_fn: a batch of inputs (as stored: e.g. uint8 images; normalise inside) -> by
        `kind`: "logits" (B, K); "probs" (B, K); "dirichlet" alpha (B, K), or a dict {"alpha",
        "prior_strength"} (W per example, e.g. GEDL's adaptive W); "samples" (M, B, K)
        probabilities of M passes / members. With `key`, called as predict_fn(batch, key_m).
      id_data: the labelled test set: (inputs, labels) or a `data.Split`.
      ood_data: {name: inputs or Split} (labels unused).
      validation: a labelled validation split (conformal sets, post-hoc calibration).
      batch_size: rows per call (the last batch is padded; padding is dropped).
      options: `EvaluationOptions`; default: the evidence-scale calibrator for "dirichlet", and
        the near/far groups of `dataset`'s OOD sets (`data.ood_group`).
      prior_strength: W of a "dirichlet" predict_fn that returns alpha alone (default K).
      key: the PRNG key of a stochastic predict_fn (batch m gets fold_in(key, m)).

    Returns:
      ModelEvaluation(results, table, predictions).
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}.")
    ood_data = dict(ood_data or {})
    if options is None:
        groups = {n: registry.ood_group(dataset, n) for n in ood_data} if dataset else {}
        options = core.EvaluationOptions(
            calibrator="evidence_scale" if kind == "dirichlet" else "temperature",
            ood_groups={n: g for n, g in groups.items() if g is not None})
    splits = {"test": _as_arrays(id_data, "id_data", True)}
    if validation is not None:
        splits["validation"] = _as_arrays(validation, "validation", True)
    splits.update({f"ood/{n}": _as_arrays(v, n, False) for n, v in ood_data.items()})
    axis = 1 if kind == "samples" else 0
    preds = {name: _predictions(run_batched(predict_fn, x, batch_size, key, jit, axis), kind, y,
                                prior_strength)
             for name, (x, y) in splits.items()}
    results = core.evaluate_predictions(
        preds["test"], {n: preds[f"ood/{n}"] for n in ood_data},
        validation=preds.get("validation"), options=options)
    if dataset:
        results["dataset"] = dataset
    return ModelEvaluation(results, report.results_table([results]), preds)
