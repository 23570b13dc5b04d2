"""DUQ (van Amersfoort, Smith, Teh, Gal, ICML 2020): an RBF head with moving-average centroids.

Model (`DUQNet`): the protocol backbone without its last layer (feature z = the last hidden
activation: 64-d ConvNet, 512-d VGG16), then per class c an embedding W_c z in R^n (n = d; W of
shape (n, K, d), init N(0, 0.05^2) as the reference CNN) and the kernel
K_c = exp(-||W_c z - e_c||^2 / (2 n sigma^2)) with centroid e_c = m_c / N_c. The centroid
statistics m (K, n) and N (K,) are the flax collection "duq" (no gradient; init N_c = 12,
m_c = 12 * N(0, 1), the reference CNN's), carried in `model_state` beside any "batch_stats".

Loss (the math below): per example the BCE of every K_c against the one-hot label (mean over the
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

The math (per-example functions, pure and jit/vmap/grad-safe):

DUQ (van Amersfoort, Smith, Teh, Gal, "Uncertainty Estimation Using a Single Deep
Deterministic Neural Network", ICML 2020; y0ast/deterministic-uncertainty-quantification).

A feature z in R^d is mapped per class c to an embedding W_c z in R^n; the class kernel is
K_c = exp(-||W_c z - e_c||^2 / (2 n sigma^2)) (the mean over the n embedding coordinates), with
centroids e_c = m_c / N_c kept as exponential moving averages (no gradient). The prediction is
argmax_c K_c, the certainty max_c K_c. Training: binary cross-entropy of every K_c against the
one-hot label plus lambda * (||grad_x sum_c K_c||_2 - 1)^2 (two-sided gradient penalty).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from gedl_jax.evaluation.core import Predictions
from gedl_jax.methods.base import (
    LossOutput,
    Method,
    MethodSetup,
    StepContext,
    Variables,
    bad_setting,
    correct_B,
)
from gedl_jax.methods.common import AXIS, apply_train, backbone, check_recipe, log_softmax64

LOG_CLAMP = -100.0  # PyTorch's binary_cross_entropy clamps each log at -100


def class_embeddings(features_BxD: ArrayLike, weights_NxKxD: ArrayLike) -> jax.Array:
    """W_c z for every class: shape (B, K, N)."""
    return jnp.einsum("bd,nkd->bkn", jnp.asarray(features_BxD), jnp.asarray(weights_NxKxD))


def centroids(sums_KxN: ArrayLike, counts_K: ArrayLike) -> jax.Array:
    """e_c = m_c / N_c."""
    return jnp.asarray(sums_KxN) / jnp.asarray(counts_K)[:, None]


def log_kernel(embeddings_BxKxN: ArrayLike, centroids_KxN: ArrayLike,
               length_scale: float) -> jax.Array:
    """log K_c = -mean_j (W_c z - e_c)_j^2 / (2 sigma^2), shape (B, K); computed in log space so
    the BCE's log(1 - K) never sees a rounded-to-1 kernel."""
    diff = jnp.asarray(embeddings_BxKxN) - jnp.asarray(centroids_KxN)[None]
    return -jnp.mean(diff * diff, axis=-1) / (2.0 * length_scale ** 2)


def certainty(log_kernel_BxK: ArrayLike) -> jax.Array:
    """max_c K_c in (0, 1]: DUQ's confidence (the MP column; higher = more in-distribution)."""
    return jnp.exp(jnp.max(jnp.asarray(log_kernel_BxK), axis=-1))


def log1mexp(x: ArrayLike) -> jax.Array:
    """log(1 - e^x) for x <= 0, stable at both ends (Maechler 2012: log(-expm1(x)) near 0,
    log1p(-exp(x)) below -log 2)."""
    x = jnp.asarray(x)
    near_zero = x > -jnp.log(2.0)
    safe_near = jnp.where(near_zero, x, -1.0)
    safe_far = jnp.where(near_zero, -1.0, x)
    return jnp.where(near_zero, jnp.log(-jnp.expm1(safe_near)), jnp.log1p(-jnp.exp(safe_far)))


def bce_loss(log_kernel_BxK: ArrayLike, labels_B: ArrayLike) -> jax.Array:
    """Per-example mean over the K classes of BCE(K_c, onehot_c), each log clamped at -100 as
    PyTorch's binary_cross_entropy does (DUQ's reference loss averages over B * K entries)."""
    log_k = jnp.asarray(log_kernel_BxK)
    onehot = jax.nn.one_hot(jnp.asarray(labels_B), log_k.shape[-1], dtype=log_k.dtype)
    log_p = jnp.maximum(log_k, LOG_CLAMP)
    log_not_p = jnp.maximum(log1mexp(jnp.minimum(log_k, 0.0)), LOG_CLAMP)
    return -jnp.mean(onehot * log_p + (1.0 - onehot) * log_not_p, axis=-1)


def centroid_batch_stats(embeddings_BxKxN: ArrayLike, labels_B: ArrayLike
                         ) -> tuple[jax.Array, jax.Array]:
    """This batch's per-class sums sum_{i in c} W_c z_i (K, N) and counts n_c (K,), without
    gradient (sum them over devices before the EMA step to get the global batch's)."""
    emb = jax.lax.stop_gradient(jnp.asarray(embeddings_BxKxN))
    onehot_BxK = jax.nn.one_hot(jnp.asarray(labels_B), emb.shape[1], dtype=emb.dtype)
    return jnp.einsum("bk,bkn->kn", onehot_BxK, emb), jnp.sum(onehot_BxK, axis=0)


def ema_step(old: ArrayLike, batch_value: ArrayLike, gamma: float) -> jax.Array:
    """gamma * old + (1 - gamma) * batch_value."""
    return gamma * jnp.asarray(old) + (1.0 - gamma) * jnp.asarray(batch_value)


def update_centroid_stats(sums_KxN: ArrayLike, counts_K: ArrayLike,
                          embeddings_BxKxN: ArrayLike, labels_B: ArrayLike, gamma: float
                          ) -> tuple[jax.Array, jax.Array]:
    """One EMA step after an optimiser step: N_c <- gamma N_c + (1 - gamma) n_c(batch),
    m_c <- gamma m_c + (1 - gamma) sum_{i in c} W_c z_i. The embeddings come from the updated
    model in eval mode; the result carries no gradient."""
    batch_sums_KxN, batch_counts_K = centroid_batch_stats(embeddings_BxKxN, labels_B)
    return ema_step(sums_KxN, batch_sums_KxN, gamma), ema_step(counts_K, batch_counts_K, gamma)


def penalty_from_gradients(grads_BxS: ArrayLike) -> jax.Array:
    """(||g_i||_2 - 1)^2 per example, g_i its input gradient (any trailing shape, flattened).

    Where g_i = 0 (every kernel underflowed, or flushed-to-zero squares) the norm's derivative is
    taken as 0, PyTorch's subgradient of `norm` at 0, instead of sqrt's inf * 0 = NaN."""
    g = jnp.asarray(grads_BxS)
    squared_B = jnp.sum(g.reshape(g.shape[0], -1) ** 2, axis=-1)
    positive_B = squared_B > 0
    norms_B = jnp.where(positive_B, jnp.sqrt(jnp.where(positive_B, squared_B, 1.0)), 0.0)
    return (norms_B - 1.0) ** 2


def gradient_penalty(kernel_fn: Callable[[jax.Array], jax.Array],
                     inputs_BxS: ArrayLike) -> jax.Array:
    """Per-example (||d/dx_i sum_c K_c(x_i)||_2 - 1)^2, the gradient taken through `kernel_fn`
    (inputs -> K, shape (B, K)) with respect to each example's flattened input. The gradient of
    the batch total equals every example's own gradient when examples do not interact (eval-mode
    batch norm); with train-mode batch norm it is the reference's quantity too."""
    x = jnp.asarray(inputs_BxS)
    return penalty_from_gradients(jax.grad(lambda v: jnp.sum(kernel_fn(v)))(x))

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
        emb_BxKxN = class_embeddings(features_BxD.astype(jnp.float32), weights)
        centroids_KxN = jax.lax.stop_gradient(centroids(sums.value, counts.value))
        return {"embeddings_BxKxN": emb_BxKxN,
                "log_kernel_BxK": log_kernel(emb_BxKxN, centroids_KxN, self.length_scale)}


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
    mp_is_max_probability: ClassVar[bool] = False   # "mp" is the kernel certainty max_c K_c
    progress_logs: ClassVar[tuple[tuple[str, str, str], ...]] = (("penalty", "gp", ".4f"),)
    run_fields: ClassVar[tuple[str, ...]] = ("recipe",)
    reads_features: ClassVar[bool] = True

    @classmethod
    def check_settings(cls, settings, num_classes: int) -> None:
        if not settings["length_scale"] > 0:
            raise bad_setting("length_scale", settings["length_scale"], "it must be > 0")
        if not 0.0 < settings["gamma"] < 1.0:
            raise bad_setting("gamma", settings["gamma"], "it must be in (0, 1)")
        if not settings["gradient_penalty"] >= 0:
            raise bad_setting("gradient_penalty", settings["gradient_penalty"],
                              "it must be >= 0")

    @classmethod
    def build(cls, config, setup: MethodSetup) -> DUQ:
        """`config.method="duq"`: the protocol backbone's last hidden layer, the RBF head."""
        if check_recipe(config.recipe) == "source":
            raise ValueError("config.recipe='source' is not available for DUQ: use "
                             "config.recipe='protocol' (its reference recipe needs a ResNet-18 or "
                             "a BN CNN and SGD with step decay, not built here)")
        k = setup.num_classes
        settings = config.method_settings
        train_model, eval_model = (
            DUQNet(backbone(config, 0, axis_name=axis, reads=("features",)),
                   RBFHead(k, 0, settings["length_scale"])) for axis in (AXIS, None))
        return cls(train_model, eval_model, k, **settings, recipe=config.recipe)

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
            penalty_B = penalty_from_gradients(grads_x)
        else:
            out, new_state = forward(images_BxHxWxC)
            penalty_B = jnp.zeros(images_BxHxWxC.shape[:1], jnp.float32)
        log_kernel_BxK = out["log_kernel_BxK"]
        loss_B = bce_loss(log_kernel_BxK, labels_B) + self.gradient_penalty * penalty_B

        # Centroid EMA from eval-mode embeddings of this batch (see the module docstring).
        frozen = jax.lax.stop_gradient({"params": params, **model_state})
        emb_BxKxN = self.eval_model.apply(frozen, images_BxHxWxC, train=False)["embeddings_BxKxN"]
        batch_sums_KxN, batch_counts_K = centroid_batch_stats(emb_BxKxN, labels_B)
        stats = model_state[COLLECTION]["head"]
        new_state[COLLECTION] = {"head": {
            "sums_KxN": ema_step(stats["sums_KxN"], ctx.sum(batch_sums_KxN), self.gamma),
            "counts_K": ema_step(stats["counts_K"], ctx.sum(batch_counts_K), self.gamma)}}
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
                           labels_N, mp_is_max_probability=self.mp_is_max_probability)

    def predicted_class(self, raw: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.argmax(raw["log_kernel_BxK"], axis=-1)

    def describe(self) -> str:
        return (f"DUQ (sigma={self.length_scale:g}, gamma={self.gamma:g}, "
                f"lambda_gp={self.gradient_penalty:g}, {self.recipe} reading)")

