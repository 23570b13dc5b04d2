"""Helpers shared by the non-EDL methods (DUQ, Prior Networks, PostNet, DAEDL, F-EDL)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from gedl_jax import networks
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


AXIS = "data"   # the data-parallel mesh axis (gedl_jax.run.sharding.AXIS) BatchNorm averages over


def compute_dtype(config):
    """The dtype of convolutions and matmuls (`config.compute_dtype`)."""
    return jnp.bfloat16 if config.compute_dtype == "bfloat16" else jnp.float32


def build_models(config) -> tuple[nn.Module, nn.Module]:
    """(train_model, eval_model) of the config, as logits: the same architecture and parameters,
    the training one averaging BatchNorm statistics over the data-parallel axis."""
    kwargs = dict(dtype=compute_dtype(config), init=config.init,
                  dropout_rate=float(config.dropout_rate),
                  dropout_placement=config.dropout_placement)
    return (networks.build_model(config.model, config.num_classes, axis_name=AXIS, **kwargs),
            networks.build_model(config.model, config.num_classes, axis_name=None, **kwargs))


def backbone(config, num_outputs: int, *, axis_name: str | None, spectral_norm: bool = False,
             hidden: tuple[int, ...] | None = None, dropout_rate: float | None = None
             ) -> networks.Backbone:
    """The config's protocol network (`config.model`) with feature outputs and the method's
    head width (`num_outputs`; 0 = none)."""
    if dropout_rate is None:   # the protocol: VGG16's classifier dropout, none in the ConvNet
        dropout_rate = 0.5 if config.model == "vgg16" else float(config.dropout_rate)
    return networks.Backbone(arch=config.model, num_outputs=num_outputs, hidden=hidden,
                             spectral_norm=spectral_norm, dropout_rate=dropout_rate,
                             axis_name=axis_name, dtype=compute_dtype(config),
                             param_init=config.init)
