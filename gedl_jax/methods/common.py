"""Helpers shared by the non-EDL methods (DUQ, Prior Networks, PostNet, DAEDL, F-EDL)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from gedl_jax.evaluation.core import Predictions
from gedl_jax.evaluation.scores import DIRICHLET_SCORE_NAMES, confidence_scores

# log alpha is capped here before exp for the Dirichlet measures (float64 overflows at ~709.8;
# K e^600 stays finite). The scores "mp" and "um" never exponentiate it.
LOG_ALPHA_CAP = 600.0

RECIPES = ("protocol", "source")


def apply_train(model: nn.Module, params, model_state: Mapping[str, Any], images_BxHxWxC,
                key: jax.Array, mutable: list[str] | None = None):
    """`model` in training mode (batch statistics, dropout from `key`): (outputs, new state of
    the `mutable` collections, default all of `model_state`)."""
    mutable = list(model_state) if mutable is None else mutable
    out, new_state = model.apply({"params": params, **model_state}, images_BxHxWxC, train=True,
                                 mutable=mutable, rngs={"dropout": key})
    return out, dict(new_state)


def log_softmax64(log_x_NxK: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(log_x - logsumexp(log_x), logsumexp(log_x)) per row, float64."""
    log_x = np.asarray(log_x_NxK, np.float64)
    top = log_x.max(axis=-1, keepdims=True)
    lse = top + np.log(np.sum(np.exp(log_x - top), axis=-1, keepdims=True))
    return log_x - lse, lse[..., 0]


def log_dirichlet_predictions(log_alpha_NxK: np.ndarray, prior_strength: float,
                              labels_N: np.ndarray | None,
                              extra_scores: Mapping[str, np.ndarray] | None = None
                              ) -> Predictions:
    """Predictions of a Dirichlet given in log space (alpha = exp(log_alpha)), float64.

    probs = alpha / alpha_0 and "mp" = max probs, computed as a softmax of log alpha; "um" =
    log alpha_0 = logsumexp(log alpha) (ranks like -W/S for the constant `prior_strength` W, never
    overflows); the other Dirichlet scores and measures from alpha = exp(min(log alpha, 600))."""
    log_p, log_strength = log_softmax64(log_alpha_NxK)
    probs = np.exp(log_p)
    probs = probs / probs.sum(axis=-1, keepdims=True)
    alpha = np.exp(np.minimum(np.asarray(log_alpha_NxK, np.float64), LOG_ALPHA_CAP))
    w = np.full(alpha.shape[0], float(prior_strength))
    rest = [n for n in DIRICHLET_SCORE_NAMES if n not in ("mp", "um")]
    scores = {"mp": probs.max(axis=-1), "um": log_strength}
    scores.update(confidence_scores(alpha, w, rest))
    scores.update(extra_scores or {})
    return Predictions(probs, scores, labels_N, alpha=alpha, prior_strength=w)


def check_recipe(recipe: str) -> str:
    if recipe not in RECIPES:
        raise ValueError(f"config.recipe={recipe!r} is not allowed; allowed values: "
                         f"{list(RECIPES)}")
    return recipe
