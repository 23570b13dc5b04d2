"""Per-example outputs saved beside the results: ``predictions.npz``, and reading them back.

Every evaluation of a workdir writes ``predictions.npz`` (atomically): for each split, the
arrays every number of ``eval_results.json`` is computed from, float64 as the evaluation used
them. Keys are ``<split>/<field>`` with split "test", "validation" (where evaluated) and
"ood/<name>" for each OOD set, and fields

  labels           (N,) int64 class indices (test, validation; absent for OOD sets)
  probs            (N, K) float64 predictive probabilities
  score/<name>     (N,) float64 each confidence score (higher = more confident; "mp", "um", ...)
  alpha            (N, K) float64 Dirichlet parameters (methods with a Dirichlet only)
  prior_strength   (N,) float64 the prior strength W of each example (idem)
  strength         (N,) float64 S = sum_k alpha_k (idem)
  posthoc/<name>   (N,) float64 each post-hoc OOD score of the network's logits and features
                   (``evaluation.posthoc``: "energy", "neg_mahalanobis", ...; where computed)
  mp_is_max_probability
                   () bool: whether score/mp is max_k probs (``Predictions``; False for DUQ's
                   kernel certainty). A file written before it was recorded is read as the
                   scores show it: mp equal to max_k probs (within 1e-9) where it is.

plus ``meta/splits``, the split names in order. The post-hoc scores are kept apart from the
method's own ``score/<name>``: ``load_predictions`` leaves them out, so recomputing the results
from the file gives the same numbers with or without them; ``load_posthoc_scores`` reads them.
``load_predictions`` gives back the ``Predictions`` of each split, so
``evaluate_predictions(test, ood, validation=..., options=...)`` recomputes the results exactly
(docs/evaluation.md).

>>> import numpy as np, tempfile, pathlib
>>> from gedl_jax.evaluation.core import Predictions
>>> p = Predictions(np.array([[0.75, 0.25]]), {"mp": np.array([0.75])}, np.array([0]))
>>> path = pathlib.Path(tempfile.mkdtemp()) / "predictions.npz"
>>> _ = save_predictions(path, p, {})
>>> loaded = load_predictions(path)
>>> sorted(loaded), loaded["test"].scores["mp"].tolist()
(['test'], [0.75])
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping

import numpy as np

from gedl_jax import files
from gedl_jax.evaluation.core import Predictions

__all__ = ["load_posthoc_scores", "load_predictions", "predictions_arrays", "save_predictions"]


def predictions_arrays(predictions: Mapping[str, Predictions]) -> dict[str, np.ndarray]:
    """{"<split>/<field>": array} of named `Predictions` (the module docstring's layout)."""
    arrays: dict[str, np.ndarray] = {"meta/splits": np.array(list(predictions), dtype=str)}
    for split, p in predictions.items():
        arrays[f"{split}/probs"] = p.probs
        if p.labels is not None:
            arrays[f"{split}/labels"] = p.labels
        for name, score in p.scores.items():
            arrays[f"{split}/score/{name}"] = score
        arrays[f"{split}/mp_is_max_probability"] = np.array(p.mp_is_max_probability)
        if p.is_dirichlet:
            arrays[f"{split}/alpha"] = p.alpha
            arrays[f"{split}/prior_strength"] = p.prior_strength
            arrays[f"{split}/strength"] = p.alpha.sum(axis=1)
    return arrays


def save_predictions(path, test: Predictions, ood: Mapping[str, Predictions],
                     validation: Predictions | None = None,
                     posthoc: Mapping[str, Mapping[str, np.ndarray]] | None = None
                     ) -> pathlib.Path:
    """Writes ``predictions.npz`` at `path` atomically (temporary file, then rename);
    `posthoc`: {split: {score name: (N,) scores}} of splits among the saved ones."""
    splits = {"test": test}
    if validation is not None:
        splits["validation"] = validation
    splits.update({f"ood/{name}": p for name, p in ood.items()})
    arrays = predictions_arrays(splits)
    for split, by_score in (posthoc or {}).items():
        if split not in splits:
            raise ValueError(f"post-hoc scores of {split!r}, a split not saved "
                             f"({sorted(splits)})")
        for name, values in by_score.items():
            values = np.asarray(values, np.float64)
            if values.shape != (len(splits[split].probs),):
                raise ValueError(f"post-hoc score {name!r} of {split!r} has shape "
                                 f"{values.shape}, not ({len(splits[split].probs)},)")
            arrays[f"{split}/posthoc/{name}"] = values

    # a file object: np.savez appends no ".npz" to it
    return files.write_with(path, lambda f: np.savez(f, **arrays))


def load_posthoc_scores(path) -> dict[str, dict[str, np.ndarray]]:
    """{split: {score name: (N,) scores}} of the post-hoc scores in a ``predictions.npz`` ({}
    when it has none)."""
    out: dict[str, dict[str, np.ndarray]] = {}
    with np.load(path, allow_pickle=False) as z:
        for key in z.files:
            split, sep, name = key.partition("/posthoc/")
            if sep:
                out.setdefault(split, {})[name] = z[key]
    return out


def load_predictions(path) -> dict[str, Predictions]:
    """{split: Predictions} of a ``predictions.npz`` ("test", "validation", "ood/<name>"); its
    post-hoc scores are left on disk (`load_posthoc_scores` reads them)."""
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files if "/posthoc/" not in k}
    out = {}
    for split in arrays["meta/splits"].tolist():
        prefix = f"{split}/score/"
        scores = {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}
        recorded = arrays.get(f"{split}/mp_is_max_probability")
        out[split] = Predictions(
            probs=arrays[f"{split}/probs"], scores=scores,
            labels=arrays.get(f"{split}/labels"), alpha=arrays.get(f"{split}/alpha"),
            prior_strength=arrays.get(f"{split}/prior_strength"),
            mp_is_max_probability=(bool(recorded) if recorded is not None else
                                   _mp_is_max_probability(arrays[f"{split}/probs"], scores)))
    return out


def _mp_is_max_probability(probs: np.ndarray, scores: Mapping[str, np.ndarray]) -> bool:
    """What a file written before predictions recorded their MP's meaning says of it: "mp"
    is max_k probs where it equals it (every method's but DUQ's kernel certainty)."""
    return "mp" in scores and bool(np.allclose(scores["mp"], np.max(probs, axis=1), rtol=0.0,
                                               atol=1e-9))
