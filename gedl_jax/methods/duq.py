"""DUQ (van Amersfoort, Smith, Teh, Gal, ICML 2020): an RBF head with moving-average centroids.

Model (`DUQNet`): the protocol backbone without its last layer (feature z = the last hidden
activation: 64-d ConvNet, 512-d VGG16), then per class c an embedding W_c z in R^n (n = d; W of
shape (n, K, d), init N(0, 0.05^2) as the reference CNN) and the kernel
K_c = exp(-||W_c z - e_c||^2 / (2 n sigma^2)) with centroid e_c = m_c / N_c. The centroid
statistics m (K, n) and N (K,) are the flax collection "duq" (no gradient; init N_c = 12,
m_c = 12 * N(0, 1), the reference CNN's), carried in `model_state` beside any "batch_stats".

Loss (`baselines.duq`): per example the BCE of every K_c against the one-hot label (mean over the
K classes, logs clamped at -100 as PyTorch's), plus lambda_gp * (||grad_x sum_c K_c(x)||_2 - 1)^2,
the two-sided gradient penalty: a gradient with respect to the input inside the loss, on the
same training-mode forward pass (BatchNorm statistics threaded through it).

Centroid update: the reference updates the EMA after each optimiser step from the *updated*
model's eval-mode embeddings. A method's loss runs before the step, so here the EMA step is taken
in the loss from the current parameters' eval-mode embeddings (stop-gradient) of the same batch:
the centroids lag the parameters by one step (gamma = 0.999 averages over ~1000 steps). The batch
sums and counts are summed over devices (`ctx.sum`), so every device holds the global EMA.

Predictions: DUQ has no probabilities and no Dirichlet. Its certainty max_c K_c is the "mp"
column (the spec's choice); `probs` are the normalised kernels K_c / sum_c K_c (for accuracy,
ECE, Brier and NLL; a convention of ours, stated here); "neg_kernel_distance" = max_c log K_c is
the same ranking without underflow ties. No "um" (tables show "-").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from gedl_jax.baselines import duq
from gedl_jax.evaluation.core import Predictions
from gedl_jax.methods.base import LossOutput, Method, StepContext, Variables, correct_B
from gedl_jax.methods.common import apply_train, log_softmax64

COLLECTION = "duq"
INIT_COUNT = 12.0           # N_c at init (reference CNN)
INIT_CENTROID_STD = 1.0     # m_c = INIT_COUNT * N(0, INIT_CENTROID_STD^2) (reference CNN)
INIT_WEIGHT_STD = 0.05      # W ~ N(0, 0.05^2) (reference CNN)


class RBFHead(nn.Module):
    """W_c z for every class and log K_c against the "duq" collection's centroids."""

    num_classes: int
    embedding_dim: int = 0        # n; 0 = the feature dimension d
    length_scale: float = 0.1     # sigma

    @nn.compact
    def __call__(self, features_BxD: jax.Array) -> dict[str, jax.Array]:
        d = features_BxD.shape[-1]
        n = self.embedding_dim or d
        weights = self.param("weights", nn.initializers.normal(INIT_WEIGHT_STD),
                             (n, self.num_classes, d), jnp.float32)
        sums = self.variable(COLLECTION, "sums_KxN", lambda: INIT_COUNT * INIT_CENTROID_STD
                             * jax.random.normal(self.make_rng("params"),
                                                 (self.num_classes, n), jnp.float32))
        counts = self.variable(COLLECTION, "counts_K",
                               lambda: jnp.full((self.num_classes,), INIT_COUNT, jnp.float32))
        emb_BxKxN = duq.class_embeddings(features_BxD.astype(jnp.float32), weights)
        centroids_KxN = jax.lax.stop_gradient(duq.centroids(sums.value, counts.value))
        return {"embeddings_BxKxN": emb_BxKxN,
                "log_kernel_BxK": duq.log_kernel(emb_BxKxN, centroids_KxN, self.length_scale)}


class DUQNet(nn.Module):
    """Backbone features -> RBF head."""

    backbone: nn.Module
    head: RBFHead

    def __call__(self, images_BxHxWxC: jax.Array, train: bool = False,
                 dropout: bool | None = None) -> dict[str, jax.Array]:
        features_BxD = self.backbone(images_BxHxWxC, train=train, dropout=dropout)["hidden"]
        return self.head(features_BxD)


@dataclasses.dataclass(frozen=True)
class DUQ(Method):
    """DUQ with length scale `length_scale`, EMA rate `gamma`, penalty weight `gradient_penalty`."""

    length_scale: float = 0.1
    gamma: float = 0.999
    gradient_penalty: float = 0.5
    recipe: str = "protocol"

    name: ClassVar[str] = "duq"
    score_names: ClassVar[tuple[str, ...]] = ("mp", "neg_kernel_distance")
    progress_logs: ClassVar[tuple[tuple[str, str, str], ...]] = (("penalty", "gp", ".4f"),)

    def loss(self, params, model_state: Variables, method_state, images_BxHxWxC: jax.Array,
             labels_B: jax.Array, ctx: StepContext) -> LossOutput:
        others = [c for c in model_state if c != COLLECTION]   # batch_stats, spectral stats

        def forward(x):
            return apply_train(self.train_model, params, model_state, x, ctx.key, mutable=others)

        if self.gradient_penalty:
            def kernel_sum(x):
                out, new_state = forward(x)
                return jnp.sum(jnp.exp(out["log_kernel_BxK"])), (out, new_state)

            grads_x, (out, new_state) = jax.grad(kernel_sum, has_aux=True)(images_BxHxWxC)
            penalty_B = duq.penalty_from_gradients(grads_x)
        else:
            out, new_state = forward(images_BxHxWxC)
            penalty_B = jnp.zeros(images_BxHxWxC.shape[:1], jnp.float32)
        log_kernel_BxK = out["log_kernel_BxK"]
        loss_B = duq.bce_loss(log_kernel_BxK, labels_B) + self.gradient_penalty * penalty_B

        # Centroid EMA from eval-mode embeddings of this batch (see the module docstring).
        frozen = jax.lax.stop_gradient({"params": params, **model_state})
        emb_BxKxN = self.eval_model.apply(frozen, images_BxHxWxC, train=False)["embeddings_BxKxN"]
        batch_sums_KxN, batch_counts_K = duq.centroid_batch_stats(emb_BxKxN, labels_B)
        stats = model_state[COLLECTION]["head"]
        new_state[COLLECTION] = {"head": {
            "sums_KxN": duq.ema_step(stats["sums_KxN"], ctx.sum(batch_sums_KxN), self.gamma),
            "counts_K": duq.ema_step(stats["counts_K"], ctx.sum(batch_counts_K), self.gamma)}}
        logs = {"correct_B": correct_B(log_kernel_BxK, labels_B), "penalty": penalty_B}
        return LossOutput(loss_B, new_state, method_state, logs)

    def predict(self, variables: Variables, method_state, images_BxHxWxC: jax.Array,
                key: jax.Array) -> dict[str, jax.Array]:
        del method_state, key
        out = self.eval_model.apply(variables, images_BxHxWxC, train=False)
        return {"log_kernel_BxK": out["log_kernel_BxK"]}

    def predictions(self, raw: Mapping[str, np.ndarray],
                    labels_N: np.ndarray | None = None) -> Predictions:
        log_k = np.asarray(raw["log_kernel_BxK"], np.float64)
        log_p, _ = log_softmax64(log_k)
        probs = np.exp(log_p)
        probs = probs / probs.sum(axis=-1, keepdims=True)
        max_log_k = log_k.max(axis=-1)
        return Predictions(probs, {"mp": np.exp(max_log_k), "neg_kernel_distance": max_log_k},
                           labels_N)

    def predicted_class(self, raw: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.argmax(raw["log_kernel_BxK"], axis=-1)

    def describe(self) -> str:
        return (f"DUQ (sigma={self.length_scale:g}, gamma={self.gamma:g}, "
                f"lambda_gp={self.gradient_penalty:g}, {self.recipe} reading)")
