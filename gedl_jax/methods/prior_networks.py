"""Prior Networks: KL-PN (Malinin & Gales, NeurIPS 2018) and RKL-PN (NeurIPS 2019).

The protocol network's logits give a Dirichlet alpha = exp(logits) (clipped to +-30 in the loss:
float32 exp overflows above ~88.7). Training fits it to Dirichlet targets by KL: KL-PN by the
forward KL(Dir(target) || Dir(alpha)), RKL-PN by the reverse KL(Dir(alpha) || Dir(target))
(`baselines.prior_networks`). In-distribution targets are sharp on the label; OOD *training*
inputs get the flat Dir(1).

OOD training data is required and is never an evaluation OOD set (KMNIST, Fashion-MNIST, SVHN,
CIFAR-100 test): it is generated in the graph from the step's key (`config.pn_ood`), one OOD image
per in-distribution image, spanning the batch's pixel range: "noise_uniform" (i.i.d. uniform
pixels) or "noise_smoothed" (Gaussian-blurred uniform noise). As in the official code's loop,
ID and OOD images go through the network in one forward pass, so BatchNorm sees the mixed batch.
The per-example loss pairs each ID example i with OOD example i:
(KL_ID_i + gamma * KL_OOD_i) / c, c = the target concentration (the official
`PriorNetMixedLoss` divides by the largest target concentration), so its batch mean is the
reference's (mean_ID + gamma mean_OOD) / c.

Targets (`config.pn_target_form`): "pnet" = 1 + c * onehot (the RKL-PN code; (101, 1, ..., 1)),
"smoothed" = c * label-smoothed mean (the 2018 paper; (91, 1, ..., 1) for c = 100, K = 10).

Predictions: the Dirichlet alpha = exp(logits) with the flat prior W = K. Scores: "mp" = max
softmax, "um" = log alpha_0 = logsumexp(logits) (log space: same ranking as alpha_0), and the
other Dirichlet scores. Readings (`config.recipe`): "protocol" trains with the common pipeline;
"source" adds the official loop's settings the trainer has (the `:source` modifier sets them:
gradient-norm clip 10, inputs standardised, batch 128); the method's math is the same.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from gedl_jax.baselines import prior_networks as pn
from gedl_jax.evaluation.core import Predictions
from gedl_jax.evaluation.scores import DIRICHLET_SCORE_NAMES
from gedl_jax.methods.base import LossOutput, Method, StepContext, Variables, correct_B
from gedl_jax.methods.common import apply_train, log_dirichlet_predictions

LOGIT_CLIP = 30.0


@dataclasses.dataclass(frozen=True)
class PriorNetwork(Method):
    """A Prior Network; `reverse` picks RKL-PN's reverse KL (the subclasses fix it)."""

    ood: str = "noise_uniform"
    ood_weight: float = 1.0
    target_form: str = "pnet"
    target_concentration: float = 100.0
    target_smoothing: float = 0.01
    recipe: str = "protocol"

    reverse: ClassVar[bool] = False
    score_names: ClassVar[tuple[str, ...]] = DIRICHLET_SCORE_NAMES
    progress_logs: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("kl_id", "kl_id", ".3f"), ("kl_ood", "kl_ood", ".3f"))

    def __post_init__(self):
        if self.ood not in pn.OOD_NOISE:
            raise ValueError(f"config.pn_ood={self.ood!r} is not allowed; allowed values: "
                             f"{list(pn.OOD_NOISE)}")
        if self.target_form not in pn.TARGET_FORMS:
            raise ValueError(f"config.pn_target_form={self.target_form!r} is not allowed; "
                             f"allowed values: {list(pn.TARGET_FORMS)}")

    def _kl(self, alpha_BxK: jax.Array, target_BxK: jax.Array) -> jax.Array:
        return (pn.reverse_kl if self.reverse else pn.forward_kl)(alpha_BxK, target_BxK)

    def loss(self, params, model_state: Variables, method_state, images_BxHxWxC: jax.Array,
             labels_B: jax.Array, ctx: StepContext) -> LossOutput:
        noise_key, dropout_key = jax.random.split(ctx.key)
        ood_BxHxWxC = pn.ood_noise(noise_key, images_BxHxWxC, self.ood)
        both = jnp.concatenate([images_BxHxWxC, ood_BxHxWxC.astype(images_BxHxWxC.dtype)])
        logits_2BxK, new_model_state = apply_train(self.train_model, params, model_state, both,
                                                   dropout_key)
        batch = images_BxHxWxC.shape[0]
        logits_BxK, ood_logits_BxK = logits_2BxK[:batch], logits_2BxK[batch:]
        target_BxK = pn.in_distribution_target(labels_B, self.num_classes, self.target_form,
                                               self.target_concentration,
                                               self.target_smoothing)
        kl_id_B = self._kl(pn.concentration_from_logits(logits_BxK, LOGIT_CLIP), target_BxK)
        kl_ood_B = self._kl(pn.concentration_from_logits(ood_logits_BxK, LOGIT_CLIP),
                            pn.ood_target(ood_logits_BxK.shape))
        loss_B = (kl_id_B + self.ood_weight * kl_ood_B) / self.target_concentration
        logs = {"correct_B": correct_B(logits_BxK, labels_B), "kl_id": kl_id_B,
                "kl_ood": kl_ood_B}
        return LossOutput(loss_B, new_model_state, method_state, logs)

    def predict(self, variables: Variables, method_state, images_BxHxWxC: jax.Array,
                key: jax.Array) -> dict[str, jax.Array]:
        del method_state, key
        return {"logits_BxK": self.eval_model.apply(variables, images_BxHxWxC, train=False)}

    def predictions(self, raw: Mapping[str, np.ndarray],
                    labels_N: np.ndarray | None = None) -> Predictions:
        # alpha = exp(logits): log alpha is the logits themselves; W = K (the flat Dir(1)).
        return log_dirichlet_predictions(raw["logits_BxK"], self.num_classes, labels_N)

    def predicted_class(self, raw: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.argmax(raw["logits_BxK"], axis=-1)

    def describe(self) -> str:
        kind = "RKL-PN (reverse KL)" if self.reverse else "KL-PN (forward KL)"
        return (f"{kind}, OOD training data {self.ood} (weight {self.ood_weight:g}), targets "
                f"{self.target_form} c={self.target_concentration:g}, {self.recipe} reading")


@dataclasses.dataclass(frozen=True)
class KLPriorNetwork(PriorNetwork):
    name: ClassVar[str] = "kl_pn"
    reverse: ClassVar[bool] = False


@dataclasses.dataclass(frozen=True)
class RKLPriorNetwork(PriorNetwork):
    name: ClassVar[str] = "rkl_pn"
    reverse: ClassVar[bool] = True
