"""Posterior Networks (Charpentier, Zuegner, Guennemann, NeurIPS 2020).

Model (`PostNetModel`): the protocol network with a `latent_dim`-wide last layer (ConvNet
... 64 -> 6; VGG16 ... 512 -> 512 -> 6, as the reference's encoders with output_dim = latent_dim),
a BatchNorm over the latent (batch statistics in training, as the reference's BatchNorm1d), and
one normalising flow per class: `flow_layers` radial layers with a standard normal base
(`baselines.postnet`). Its output is log q_c(z) for every class.

The Dirichlet: alpha_c = 1 + N_c q_c(z), N_c the class count of the *training split*
(`MethodSetup.class_counts`). Training is float32 (x64 is off in the train step), so the
pseudo-count is carried in log space, log N_c + log q_c, and clamped at 80 before the exp (the
reference runs in float64; e^80 keeps alpha_0 finite in float32 and far past any target).

Loss (UCE, joint mode; the reference sums it over the batch): psi(alpha_0) - psi(alpha_y) -
entropy_weight * H(Dir(alpha)) (1e-6 MNIST, 1e-5 CIFAR-10); `evidential`'s entropy is the
cancellation-free form, so it stays accurate at large alpha in float32.

Predictions (host, float64, unclamped): log alpha_c = softplus(log N_c + log q_c); probs =
alpha / alpha_0; "mp" = max probs, "um" = log alpha_0 (logsumexp of log alpha_c), the prior
strength W = K (the flat Dir(1) prior), and the other Dirichlet scores.
Readings (`config.recipe`): "protocol" trains with the common pipeline; "source" is the
reference's optimiser settings the trainer has (the `:source` modifier: Adam lr 1e-4 MNIST /
2.5e-4 CIFAR-10, batch 64, constant rate, no weight decay); its lowest-validation-loss model
selection and early stop are the trainer's and are not reproduced.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from gedl_jax.baselines import postnet
from gedl_jax.evaluation.core import Predictions
from gedl_jax.evaluation.scores import DIRICHLET_SCORE_NAMES
from gedl_jax.methods.base import LossOutput, Method, StepContext, Variables, correct_B
from gedl_jax.methods.common import apply_train, log_dirichlet_predictions


def _uniform(bound: float):
    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, minval=-bound, maxval=bound)
    return init


class PostNetModel(nn.Module):
    """Encoder (latent z) -> BatchNorm -> per-class radial flows; returns {"log_q_BxK"}."""

    encoder: nn.Module            # a `networks.Backbone` with num_outputs = latent_dim
    num_classes: int = 10
    flow_layers: int = 6
    axis_name: str | None = None

    @nn.compact
    def __call__(self, images_BxHxWxC: jax.Array, train: bool = False,
                 dropout: bool | None = None) -> dict[str, jax.Array]:
        z_BxD = self.encoder(images_BxHxWxC, train=train, dropout=dropout)["logits"]
        z_BxD = nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5,
                             axis_name=self.axis_name, name="latent_bn")(z_BxD)
        dim = z_BxD.shape[-1]
        bound = 1.0 / float(np.sqrt(dim))   # Pyro's Radial init U(+-1/sqrt(d))
        shape = (self.num_classes, self.flow_layers)
        flows = postnet.RadialParams(self.param("z0", _uniform(bound), (*shape, dim)),
                                     self.param("a_raw", _uniform(bound), shape),
                                     self.param("b_raw", _uniform(bound), shape))
        return {"log_q_BxK": postnet.class_log_densities(z_BxD.astype(jnp.float32), flows)}


@dataclasses.dataclass(frozen=True)
class PostNet(Method):
    """Posterior Network with training class counts `class_counts` (N_c)."""

    class_counts: tuple[int, ...] = ()
    entropy_weight: float = 1e-6
    latent_dim: int = 6
    flow_layers: int = 6
    recipe: str = "protocol"

    name: ClassVar[str] = "postnet"
    score_names: ClassVar[tuple[str, ...]] = DIRICHLET_SCORE_NAMES
    progress_logs: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("mean_log_precision", "log_S", ".2f"),)

    def __post_init__(self):
        if len(self.class_counts) != self.num_classes or min(self.class_counts) < 1:
            raise ValueError(f"PostNet needs a positive training count for each of the "
                             f"{self.num_classes} classes (N_c), got {self.class_counts}: every "
                             f"class must occur in the training split")

    def loss(self, params, model_state: Variables, method_state, images_BxHxWxC: jax.Array,
             labels_B: jax.Array, ctx: StepContext) -> LossOutput:
        out, new_state = apply_train(self.train_model, params, model_state, images_BxHxWxC,
                                     ctx.key)
        counts_K = jnp.asarray(self.class_counts, jnp.float32)
        alpha_BxK = postnet.concentration(out["log_q_BxK"], counts_K)
        loss_B = postnet.uce_loss(alpha_BxK, labels_B, self.entropy_weight)
        logs = {"correct_B": correct_B(alpha_BxK, labels_B),
                "mean_log_precision": postnet.log_precision(out["log_q_BxK"], counts_K)}
        return LossOutput(loss_B, new_state, method_state, logs)

    def predict(self, variables: Variables, method_state, images_BxHxWxC: jax.Array,
                key: jax.Array) -> dict[str, jax.Array]:
        del method_state, key
        return {"log_q_BxK": self.eval_model.apply(variables, images_BxHxWxC,
                                                   train=False)["log_q_BxK"]}

    def log_alpha(self, raw: Mapping[str, np.ndarray]) -> np.ndarray:
        """log alpha_c = softplus(log N_c + log q_c), float64, unclamped."""
        x = np.asarray(raw["log_q_BxK"], np.float64) + np.log(np.asarray(self.class_counts,
                                                                          np.float64))
        return np.logaddexp(0.0, x)

    def predictions(self, raw: Mapping[str, np.ndarray],
                    labels_N: np.ndarray | None = None) -> Predictions:
        return log_dirichlet_predictions(self.log_alpha(raw), self.num_classes, labels_N)

    def predicted_class(self, raw: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.argmax(self.log_alpha(raw), axis=-1)

    def describe(self) -> str:
        return (f"PostNet (latent {self.latent_dim}, {self.flow_layers} radial layers per class, "
                f"entropy weight {self.entropy_weight:g}, {self.recipe} reading)")
