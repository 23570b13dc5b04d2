"""Softmax classifiers: the plain one (deep ensembles' members) and MC Dropout.

`Softmax` trains with softmax cross-entropy and predicts p = softmax(logits): scores "mp" and
"neg_entropy"; it has no Dirichlet precision, so tables show "–" under UM.

`MCDropout` (Gal & Ghahramani, ICML 2016) is the same classifier with dropout kept on at test
time: T passes with fresh dropout masks and frozen batch statistics (BatchNorm uses its running
averages; train-mode statistics would leak the batch composition, worst on OOD batches), the
probabilities (not the logits) averaged. Scores: "mp" and "neg_entropy" of the mean, and
"neg_mi", minus the mutual information between the prediction and the pass (epistemic).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar

import jax
import numpy as np
import optax

from gedl_jax.evaluation.core import Predictions
from gedl_jax.evaluation.scores import categorical_scores, sampled_scores
from gedl_jax.methods.base import (
    LossOutput,
    Method,
    MethodSetup,
    StepContext,
    Variables,
    correct_B,
    softmax_probs,
)
from gedl_jax.methods.common import build_models


@dataclasses.dataclass(frozen=True)
class Softmax(Method):
    """Softmax cross-entropy classifier."""

    posthoc_from_logits: ClassVar[bool] = True
    name: ClassVar[str] = "softmax"
    score_names: ClassVar[tuple[str, ...]] = ("mp", "neg_entropy")

    @classmethod
    def build(cls, config, setup: MethodSetup) -> Softmax:
        """`config.method="softmax"`: cross-entropy on the logits."""
        return cls(*build_models(config), setup.num_classes)

    def loss(self, params, model_state: Variables, method_state, images_BxHxWxC: jax.Array,
             labels_B: jax.Array, ctx: StepContext) -> LossOutput:
        logits_BxK, new_model_state = self.train_model.apply(
            {"params": params, **model_state}, images_BxHxWxC, train=True,
            mutable=list(model_state), rngs={"dropout": ctx.key})
        logits_BxK = logits_BxK.astype(np.float32)
        loss_B = optax.softmax_cross_entropy_with_integer_labels(logits_BxK, labels_B)
        return LossOutput(loss_B, dict(new_model_state), method_state,
                          {"correct_B": correct_B(logits_BxK, labels_B)})

    def predict(self, variables: Variables, method_state, images_BxHxWxC: jax.Array,
                key: jax.Array) -> dict[str, jax.Array]:
        del method_state, key
        logits_BxK = self.eval_model.apply(variables, images_BxHxWxC, train=False)
        return {"probs_BxK": softmax_probs(logits_BxK)}

    def predictions(self, raw: Mapping[str, np.ndarray],
                    labels_N: np.ndarray | None = None) -> Predictions:
        probs_NxK = _renormalised(raw["probs_BxK"])
        return Predictions(probs_NxK, categorical_scores(probs_NxK), labels_N)

    def predicted_class(self, raw: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.argmax(raw["probs_BxK"], axis=-1)


@dataclasses.dataclass(frozen=True)
class MCDropout(Softmax):
    """Softmax classifier scored by `num_samples` dropout passes at test time."""

    num_samples: int = 10
    dropout_rate: float = 0.5

    name: ClassVar[str] = "mc_dropout"
    score_names: ClassVar[tuple[str, ...]] = ("mp", "neg_mi", "neg_entropy")
    run_fields: ClassVar[tuple[str, ...]] = ("num_samples", "dropout_rate")
    needs_dropout_switch: ClassVar[bool] = True

    @classmethod
    def check_config(cls, config) -> None:
        super().check_config(config)
        if config.model == "convnet" and not config.dropout_rate:
            raise ValueError("config.method='mc_dropout' on the ConvNet needs "
                             "config.dropout_rate > 0 (the preset configs/<dataset>.py:"
                             "mc_dropout sets 0.5)")

    @classmethod
    def build(cls, config, setup: MethodSetup) -> MCDropout:
        """`config.method="mc_dropout"`: `config.mc_samples` test passes with dropout on; the
        ConvNet's `config.dropout_rate`, VGG16's own 0.5."""
        return cls(*build_models(config), setup.num_classes,
                   num_samples=int(config.mc_samples),
                   dropout_rate=0.5 if config.model == "vgg16" else float(config.dropout_rate))

    def predict(self, variables: Variables, method_state, images_BxHxWxC: jax.Array,
                key: jax.Array) -> dict[str, jax.Array]:
        del method_state

        def one_pass(pass_key):
            # train=False: BatchNorm's running statistics; dropout=True: masks stay on.
            logits_BxK = self.eval_model.apply(variables, images_BxHxWxC, train=False,
                                               dropout=True, rngs={"dropout": pass_key})
            return softmax_probs(logits_BxK)

        probs_TxBxK = jax.vmap(one_pass)(jax.random.split(key, self.num_samples))
        return {"probs_BxTxK": probs_TxBxK.transpose(1, 0, 2)}

    def predictions(self, raw: Mapping[str, np.ndarray],
                    labels_N: np.ndarray | None = None) -> Predictions:
        probs_TxNxK = _renormalised(np.asarray(raw["probs_BxTxK"]).transpose(1, 0, 2))
        mean_NxK, scores = sampled_scores(probs_TxNxK)
        return Predictions(mean_NxK, scores, labels_N)

    def predicted_class(self, raw: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.argmax(np.asarray(raw["probs_BxTxK"], np.float64).mean(axis=1), axis=-1)

    def describe(self) -> str:
        return f"MC Dropout (p={self.dropout_rate:g}, T={self.num_samples})"


def _renormalised(probs: np.ndarray) -> np.ndarray:
    """float32 softmax rows -> float64 rows that sum to 1 (exactly, up to float64 rounding)."""
    p = np.asarray(probs, dtype=np.float64)
    return p / p.sum(axis=-1, keepdims=True)

