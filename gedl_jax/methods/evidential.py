"""The EDL family as one method: GEDL, EDL, I-EDL, R-EDL, RED and the ablation rows.

Every variant is the same loss with other settings (`gedl_jax.evidential.loss.LossSpec`, built
from the config's fields by `spec_from_config`; paper Table unified_edl): the network's logits
give evidence, the prior strength W and alpha = e + W a (Eq. e2alpha, weight_update); the loss
is the variant's likelihood term plus the KL to Dir(W a) weighted by 1/tau (Eq. elbo,
tau_schedule) and the I-EDL / RED terms. The method state is GEDL's tau accumulator.
Predictions are the Dirichlet: probabilities alpha/S and every Dirichlet score ("mp",
"um" = -W/S, ...), computed in float64 on the host.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar

import jax
import numpy as np

from gedl_jax import config as config_lib
from gedl_jax import evidential as ev
from gedl_jax.evaluation.core import ModelOutputs, Predictions, dirichlet_predictions
from gedl_jax.evaluation.scores import DIRICHLET_SCORE_NAMES
from gedl_jax.evidential import loss as losses
from gedl_jax.methods.base import (
    LossOutput,
    Method,
    MethodSetup,
    StepContext,
    Variables,
    correct_B,
)
from gedl_jax.methods.common import build_models


@dataclasses.dataclass(frozen=True)
class Evidential(Method):
    """An evidential classifier whose variant is `spec` (see `losses.LossSpec`)."""

    spec: losses.LossSpec = None  # type: ignore[assignment]   (always given by from_config)

    posthoc_from_logits: ClassVar[bool] = True
    name: ClassVar[str] = "evidential"
    score_names: ClassVar[tuple[str, ...]] = DIRICHLET_SCORE_NAMES
    progress_logs: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("kl_weight", "kl_w", ".3f"), ("mean_prior_strength", "W", ".3f"),
        ("mean_strength", "S", ".1f"))
    # Its settings are the config's top-level EDL fields (the paper's prior, posterior and
    # objective choices, which every preset and study names), not method_args.
    run_fields: ClassVar[tuple[str, ...]] = ("spec",)
    score_captions: ClassVar[Mapping[str, str]] = {"um": "-u = -W/S"}
    calibrator: ClassVar[str] = "evidence_scale"

    @property
    def base_rate(self) -> tuple[float, ...] | None:
        return self.spec.base_rate

    @classmethod
    def build(cls, config, setup: MethodSetup) -> Evidential:
        """`config.method="evidential"`: the variant the config's fields describe."""
        base_rate = setup.label_frequencies() if config.base_rate == "label_frequency" else None
        return cls(*build_models(config), setup.num_classes,
                   spec=spec_from_config(config, base_rate=base_rate))

    def init_method_state(self) -> ev.TauState:
        return ev.tau_init()

    def loss(self, params, model_state: Variables, method_state: ev.TauState,
             images_BxHxWxC: jax.Array, labels_B: jax.Array, ctx: StepContext) -> LossOutput:
        logits_BxK, new_model_state = self.train_model.apply(
            {"params": params, **model_state}, images_BxHxWxC, train=True,
            mutable=list(model_state), rngs={"dropout": ctx.key})
        loss_B, new_tau, terms = losses.per_example_loss(
            self.spec, logits_BxK, labels_B, method_state, ctx.epoch, global_mean=ctx.mean)
        logs = {"correct_B": correct_B(logits_BxK, labels_B),
                "likelihood": terms.likelihood_B, "kl": terms.kl_B,
                "kl_weight": terms.kl_weight, "mean_strength": terms.mean_strength,
                "mean_prior_strength": terms.mean_prior_strength}
        return LossOutput(loss_B, dict(new_model_state), new_tau, logs)

    def predict(self, variables: Variables, method_state, images_BxHxWxC: jax.Array,
                key: jax.Array) -> dict[str, jax.Array]:
        del method_state, key
        logits_BxK = self.eval_model.apply(variables, images_BxHxWxC, train=False)
        out = losses.evidential_outputs(self.spec, logits_BxK)
        return {"alpha_BxK": out.alpha_BxK, "prior_strength_B": out.prior_strength_B}

    def predictions(self, raw: Mapping[str, np.ndarray],
                    labels_N: np.ndarray | None = None) -> Predictions:
        return dirichlet_predictions(ModelOutputs(raw["alpha_BxK"], raw["prior_strength_B"],
                                                  labels_N))

    def predicted_class(self, raw: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.argmax(raw["alpha_BxK"], axis=-1)

    def describe(self) -> str:
        s = self.spec
        w = "adaptive W" if s.prior_strength == "adaptive" else f"W={s.prior_strength_value:g}"
        return (f"evidential ({s.evidence} evidence, {w}, {s.likelihood} likelihood, KL "
                f"{s.kl_target}/{s.kl_schedule})")


def spec_from_config(config, base_rate: tuple[float, ...] | None = None) -> losses.LossSpec:
    """The variant's `LossSpec` from the config's fields of the same names (docs:
    gedl_jax/config/fields.py); W as a number (`prior_strength_value` may be 'K' or '0.1K',
    resolved with the config)."""
    config = config_lib.resolve(config)   # a user's config (a run's is resolved already)
    derived = {"num_classes": int(config.num_classes), "base_rate": base_rate,
               "prior_strength_value": config.prior_strength_W}
    kinds = {"float": float, "int": int}
    return losses.LossSpec(**derived, **{
        f.name: kinds.get(str(f.type), lambda v: v)(config[f.name])
        for f in dataclasses.fields(losses.LossSpec) if f.name not in derived})
