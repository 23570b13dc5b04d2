"""Helpers shared by the non-EDL methods (DUQ, Prior Networks, PostNet, DAEDL, F-EDL)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from gedl_jax import config as config_lib
from gedl_jax import networks
from gedl_jax.networks import user
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
    if config_lib.is_user_model(config.model):
        return (user_network(config, config.num_classes, axis_name=AXIS).module,
                user_network(config, config.num_classes, axis_name=None).module)
    kwargs = dict(dtype=compute_dtype(config), init=config.init,
                  dropout_rate=float(config.dropout_rate),
                  dropout_placement=config.dropout_placement)
    return (networks.build_model(config.model, config.num_classes, axis_name=AXIS, **kwargs),
            networks.build_model(config.model, config.num_classes, axis_name=None, **kwargs))


def backbone(config, num_outputs: int, *, axis_name: str | None, spectral_norm: bool = False,
             hidden: tuple[int, ...] | None = None, dropout_rate: float | None = None,
             reads: tuple[str, ...] = ("features", "logits")) -> nn.Module:
    """The config's protocol network (`config.model`) with feature outputs and the method's
    head width (`num_outputs`; 0 = none). A user network (`config.model` "resnet18", "mlp" or
    "<module>:<Name>") comes as a `UserBackbone` giving what the method `reads` ("features":
    its `features` method, as "encoder" and "hidden"; "logits": its output, built with
    num_classes = `num_outputs`); `spectral_norm`, `hidden` and `dropout_rate` shape only the
    protocol networks (a user network is taken as it is)."""
    if config_lib.is_user_model(config.model):
        net = user_network(config, num_outputs or config.num_classes, axis_name=axis_name)
        return UserBackbone(net.module, with_features="features" in reads,
                            with_logits="logits" in reads and bool(num_outputs),
                            pass_dropout=net.mc_dropout,
                            one_pass=net.has_features_and_logits)
    if dropout_rate is None:   # the protocol: VGG16's classifier dropout, none in the ConvNet
        dropout_rate = 0.5 if config.model == "vgg16" else float(config.dropout_rate)
    return networks.Backbone(arch=config.model, num_outputs=num_outputs, hidden=hidden,
                             spectral_norm=spectral_norm, dropout_rate=dropout_rate,
                             axis_name=axis_name, dtype=compute_dtype(config),
                             param_init=config.init)


# ---------------------------------------------------------------------- user networks
# What a method reads from a user network: its logits (K outputs, or the method's
# `output_width`: PostNet's latent z), its `features` (`Method.reads_features`), MC Dropout's
# `dropout` switch (`Method.needs_dropout_switch`).


def user_network(config, num_outputs: int, *, axis_name: str | None,
                 input_shape: tuple[int, ...] | None = None,
                 need_features: bool = False) -> user.Network:
    """`config.model` loaded by `networks.user.load_network` for `num_outputs` classes (and,
    given `input_shape`, checked against the contract), with the config's settings the class
    takes (`dtype` from compute_dtype, `param_init` from init, `dropout_rate` when > 0) and
    `config.model_kwargs`."""
    cls = user.resolve(config.model)
    try:
        user.kind_of(cls)
    except ValueError as e:
        raise ValueError(f"network {config.model!r}: {e}") from None
    offered = {"param_init": config.init}
    if config.compute_dtype != "float32":
        offered["dtype"] = compute_dtype(config)
    if config.dropout_rate > 0:
        offered["dropout_rate"] = float(config.dropout_rate)
    kwargs = {k: v for k, v in offered.items() if user.accepts(cls, k)}
    kwargs.update(config.model_arguments)
    return user.load_network(config.model, num_outputs, input_shape,
                             need_features=need_features, axis_name=axis_name, **kwargs)


def check_user_network(config, method, num_classes: int, input_shape: tuple[int, ...]) -> None:
    """Before any step: the user network `config.model` meets the contract for `method` (a
    `Method` subclass; one-line ValueError otherwise): built for data-parallel training, its
    outputs checked on a batch of zeros, `features` where the method reads them, the `dropout`
    switch where it needs one (MC Dropout)."""
    net = user_network(config, method.output_width(config, int(num_classes)), axis_name=AXIS,
                       input_shape=tuple(input_shape), need_features=method.reads_features)
    if method.needs_dropout_switch and not net.mc_dropout:
        raise ValueError(f"network {config.model!r}: MC Dropout needs dropout switched on at "
                         f"test time, i.e. `__call__(x, train=..., dropout=None)` (a keyword "
                         f"turning its dropout layers on), which this class lacks")


class UserBackbone(nn.Module):
    """A user network (`networks.user`) in the form the feature-reading methods take from
    `networks.Backbone`: {"encoder", "hidden"} = its `features(x, train)` (when
    `with_features`), "logits" = its output (when `with_logits`). With both, a network with
    `features_and_logits` (`one_pass`) runs once per call; another runs twice (its batch
    statistics then move twice per training step, and the passes draw different dropout
    masks). MC Dropout's `dropout` switch reaches the logits' pass alone, so with it the
    network also runs twice."""

    net: nn.Module
    with_features: bool = True
    with_logits: bool = True
    pass_dropout: bool = False
    one_pass: bool = False

    @nn.compact
    def __call__(self, images_BxHxWxC: jax.Array, train: bool = False,
                 dropout: bool | None = None) -> dict[str, jax.Array]:
        switched = self.pass_dropout and dropout is not None
        if self.with_features and self.with_logits and self.one_pass and not switched:
            f, logits = self.net.features_and_logits(images_BxHxWxC, train=train)
            f = f.astype(jnp.float32)
            return {"encoder": f, "hidden": f, "logits": logits.astype(jnp.float32)}
        out = {}
        if self.with_features:
            f = self.net.features(images_BxHxWxC, train=train).astype(jnp.float32)
            out.update(encoder=f, hidden=f)
        if self.with_logits:
            kw = {"dropout": dropout} if switched else {}
            out["logits"] = self.net(images_BxHxWxC, train=train, **kw).astype(jnp.float32)
        return out
