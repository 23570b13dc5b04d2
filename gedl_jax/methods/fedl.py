"""F-EDL (Yoon & Kim, "Uncertainty Quantification with the Flexible Dirichlet", NeurIPS 2025).

The network predicts a Flexible Dirichlet FD(alpha, p, tau) = sum_k p_k Dir(alpha + tau e_k):
alpha = exp(g_alpha(f)) (logits clipped to +-30: float32 exp overflows above ~88.7),
p = softmax(g_p(f)), tau = softplus(g_tau(f)) (one scalar per example), f the encoder features
(576-d ConvNet, 512-d VGG16). g_p and g_tau are the reference heads: Dropout -> Dense(d, 256) ->
ReLU -> LayerNorm(256) -> Dense(256, out), no spectral norm.

g_alpha and the encoder (`config.recipe`):
- "protocol": the protocol network itself (the ConvNet's MLP 576 -> 64 -> 64 -> 64 -> K, VGG16's
  classifier with its dropout), no spectral norm: the common backbone every row uses, with
  F-EDL's two extra heads on its encoder features.
- "source": the reference nets, spectral norm on every backbone layer and g_alpha: MNIST's
  ConvNet with MLP 576 -> 64 -> 64 -> K; CIFAR's VGG16 features -> Dropout -> SN-Dense 512 -> 256
  -> ReLU -> BatchNorm(256) -> Dropout -> SN-Dense 256 -> K (dropout p = 0, the reference
  default). The `:source` modifier also sets the reference's optimiser settings the trainer has
  (Adam lr 5e-4, batch 64, no weight decay, inputs standardised).

Loss (`loss`, per example; the reference sums over the batch):
sum_k (y_k - mean_k)^2 + sum_k Var_k + sum_k (y_k - p_k)^2 with the exact FD moments, in float32.

Predictions: probs = the FD mean (prediction argmax); "mp" = max mean; "um" = log(alpha_0 + tau),
the log precision of the FD (our choice among the spec's candidates -EU, alpha_0 + tau,
alpha_0: the FD's own precision, log space); F-EDL's own scores "neg_variance_sum" = -EU and
"neg_expected_gini" = -AU (its uq.py). Not a Dirichlet: no Dirichlet measures.

The math (per-example functions, pure and jit/vmap/grad-safe):

F-EDL (Yoon & Kim, "Uncertainty Quantification with the Flexible Dirichlet", NeurIPS 2025;
TaeseongYoon/F-EDL): the network predicts a Flexible Dirichlet FD(alpha, p, tau), the mixture
sum_k p_k Dir(alpha + tau e_k), with alpha = exp(g_alpha(f)), p = softmax(g_p(f)),
tau = softplus(g_tau(f)) (one scalar per example).

Moments (exact; variance re-derived from E[pi_j^2] of each mixture component), s = alpha_0 + tau:
  mean_k = (alpha_k + tau p_k) / s
  var_k  = mean_k (1 - mean_k) / (s + 1) + tau^2 p_k (1 - p_k) / (s (s + 1)).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar, NamedTuple

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
from gedl_jax.methods.common import (
    AXIS,
    UserBackbone,
    apply_train,
    backbone,
    check_recipe,
    log_softmax64,
)
from gedl_jax.networks import layer_inits


class Moments(NamedTuple):
    mean_BxK: jax.Array
    variance_BxK: jax.Array


def moments(alpha_BxK: ArrayLike, p_BxK: ArrayLike, tau_B: ArrayLike) -> Moments:
    """Mean and per-class variance of FD(alpha, p, tau); tau -> 0 gives Dir(alpha)'s."""
    alpha_BxK, p_BxK = jnp.asarray(alpha_BxK), jnp.asarray(p_BxK)
    tau_Bx1 = jnp.asarray(tau_B)[..., None]
    s_Bx1 = jnp.sum(alpha_BxK, axis=-1, keepdims=True) + tau_Bx1
    mean = (alpha_BxK + tau_Bx1 * p_BxK) / s_Bx1
    variance = (mean * (1.0 - mean) / (s_Bx1 + 1.0)
                + tau_Bx1 ** 2 * p_BxK * (1.0 - p_BxK) / (s_Bx1 * (s_Bx1 + 1.0)))
    return Moments(mean, variance)


def loss(alpha_BxK: ArrayLike, p_BxK: ArrayLike, tau_B: ArrayLike,
         labels_B: ArrayLike) -> jax.Array:
    """Per example: sum_k (y_k - mean_k)^2 + sum_k var_k + sum_k (y_k - p_k)^2 (the reference
    sums it over the batch)."""
    m = moments(alpha_BxK, p_BxK, tau_B)
    onehot = jax.nn.one_hot(jnp.asarray(labels_B), m.mean_BxK.shape[-1], dtype=m.mean_BxK.dtype)
    return (jnp.sum((onehot - m.mean_BxK) ** 2, axis=-1) + jnp.sum(m.variance_BxK, axis=-1)
            + jnp.sum((onehot - jnp.asarray(p_BxK)) ** 2, axis=-1))


class Uncertainties(NamedTuple):
    total: jax.Array        # TU = 1 - sum_k mean_k^2
    epistemic: jax.Array    # EU = sum_k var_k
    aleatoric: jax.Array    # AU = TU - EU = E[1 - sum_k pi_k^2]


def uncertainties(alpha_BxK: ArrayLike, p_BxK: ArrayLike, tau_B: ArrayLike) -> Uncertainties:
    """F-EDL's decomposition (its uq.py); OOD and confidence scores are -AU and -EU."""
    m = moments(alpha_BxK, p_BxK, tau_B)
    total = 1.0 - jnp.sum(m.mean_BxK ** 2, axis=-1)
    epistemic = jnp.sum(m.variance_BxK, axis=-1)
    return Uncertainties(total, epistemic, total - epistemic)

LOGIT_CLIP = 30.0


def _dense(features: int, fan_in: int, name: str) -> nn.Dense:
    kernel_init, bias_init = layer_inits("torch", fan_in)   # PyTorch Linear default
    return nn.Dense(features, kernel_init=kernel_init, bias_init=bias_init, name=name)


class FDHead(nn.Module):
    """F-EDL's g_p / g_tau: Dropout -> Dense(d, hidden) -> ReLU -> LayerNorm -> Dense(out)."""

    out: int
    hidden: int = 256
    dropout_rate: float = 0.0

    @nn.compact
    def __call__(self, f_BxD: jax.Array, deterministic: bool) -> jax.Array:
        x = nn.Dropout(self.dropout_rate, deterministic=deterministic)(f_BxD)
        x = nn.relu(_dense(self.hidden, x.shape[-1], "dense0")(x))
        x = nn.LayerNorm(epsilon=1e-5, name="norm")(x)
        return _dense(self.out, self.hidden, "dense1")(x)


class SourceVGGAlphaHead(nn.Module):
    """The reference CIFAR g_alpha: Dropout -> SN-Dense 512->256 -> ReLU -> BN -> Dropout ->
    SN-Dense 256->K."""

    num_classes: int
    hidden: int = 256
    dropout_rate: float = 0.0
    axis_name: str | None = None

    @nn.compact
    def __call__(self, f_BxD: jax.Array, train: bool, deterministic: bool) -> jax.Array:
        x = nn.Dropout(self.dropout_rate, deterministic=deterministic)(f_BxD)
        x = nn.SpectralNorm(_dense(self.hidden, x.shape[-1], "dense0"), name="sn_dense0")(
            x, update_stats=train)
        x = nn.BatchNorm(use_running_average=not train, momentum=0.9, epsilon=1e-5,
                         axis_name=self.axis_name, name="bn")(nn.relu(x))
        x = nn.Dropout(self.dropout_rate, deterministic=deterministic)(x)
        return nn.SpectralNorm(_dense(self.num_classes, self.hidden, "dense1"),
                               name="sn_dense1")(x, update_stats=train)


class FEDLModel(nn.Module):
    """Encoder + g_alpha (`backbone`, or `alpha_head` on its encoder) + g_p + g_tau."""

    backbone: nn.Module
    num_classes: int = 10
    head_hidden: int = 256
    head_dropout: float = 0.0
    alpha_head: nn.Module | None = None   # None: the backbone's own logits

    @nn.compact
    def __call__(self, images_BxHxWxC: jax.Array, train: bool = False,
                 dropout: bool | None = None) -> dict[str, jax.Array]:
        deterministic = not (train if dropout is None else dropout)
        out = self.backbone(images_BxHxWxC, train=train, dropout=dropout)
        f_BxD = out["encoder"]
        if self.alpha_head is None:
            alpha_logits = out["logits"]
        else:
            alpha_logits = self.alpha_head(f_BxD, train=train, deterministic=deterministic)
        p_logits = FDHead(self.num_classes, self.head_hidden, self.head_dropout, name="g_p")(
            f_BxD, deterministic)
        tau_raw = FDHead(1, self.head_hidden, self.head_dropout, name="g_tau")(
            f_BxD, deterministic)
        return {"log_alpha_BxK": jnp.clip(alpha_logits.astype(jnp.float32), -LOGIT_CLIP,
                                          LOGIT_CLIP),
                "p_logits_BxK": p_logits.astype(jnp.float32),
                "tau_B": jax.nn.softplus(tau_raw[..., 0].astype(jnp.float32))}


@dataclasses.dataclass(frozen=True)
class FEDL(Method):
    """F-EDL (Flexible Dirichlet heads)."""

    head_hidden: int = 256       # hidden width of the g_p and g_tau heads
    head_dropout: float = 0.0    # dropout before the heads (the reference's p_drop 0)
    recipe: str = "protocol"

    name: ClassVar[str] = "fedl"
    # TaeseongYoon/F-EDL: Adam lr 5e-4, no weight decay, batch 64, 100 epochs, standardised.
    source_recipe: ClassVar[dict[str, dict[str, Any]]] = {
        "mnist": dict(learning_rate=5e-4, batch_size=64, lr_schedule="constant",
                      weight_decay=0.0, num_epochs=100, normalize=True),
        "cifar": dict(learning_rate=5e-4, batch_size=64, lr_schedule="constant",
                      weight_decay=0.0, num_epochs=100, normalize=True)}
    score_names: ClassVar[tuple[str, ...]] = ("mp", "um", "neg_variance_sum", "neg_expected_gini")
    progress_logs: ClassVar[tuple[tuple[str, str, str], ...]] = (("mean_tau", "tau", ".3f"),)
    run_fields: ClassVar[tuple[str, ...]] = ("recipe",)
    reads_features: ClassVar[bool] = True
    score_captions: ClassVar[Mapping[str, str]] = {"um": "log(alpha_0 + tau)"}

    @classmethod
    def check_settings(cls, settings, num_classes: int) -> None:
        if not settings["head_hidden"] > 0:
            raise bad_setting("head_hidden", settings["head_hidden"], "it must be > 0")
        if not 0.0 <= settings["head_dropout"] < 1.0:
            raise bad_setting("head_dropout", settings["head_dropout"], "it must be in [0, 1)")

    @classmethod
    def build(cls, config, setup: MethodSetup) -> FEDL:
        """`config.method="fedl"`: the protocol backbone with F-EDL's heads
        (`recipe="source"`: the reference's spectrally normalised nets)."""
        k, recipe = setup.num_classes, check_recipe(config.recipe)
        settings = config.method_settings
        hidden, dropout = settings["head_hidden"], settings["head_dropout"]

        def model(axis):
            if recipe == "protocol":
                return FEDLModel(backbone(config, k, axis_name=axis), k, hidden, dropout)
            if config.model == "convnet":   # the reference MNIST net: SN, MLP 576-64-64-K
                return FEDLModel(backbone(config, k, axis_name=axis, spectral_norm=True,
                                          hidden=(64, 64), dropout_rate=0.0), k, hidden, dropout)
            return FEDLModel(   # the reference CIFAR net: SN VGG16 features + its head
                backbone(config, 0, axis_name=axis, spectral_norm=True, hidden=(),
                         dropout_rate=0.0),
                k, hidden, dropout,
                alpha_head=SourceVGGAlphaHead(k, hidden, dropout, axis_name=axis))

        return cls(model(AXIS), model(None), k, **settings, recipe=recipe)

    def loss(self, params, model_state: Variables, method_state, images_BxHxWxC: jax.Array,
             labels_B: jax.Array, ctx: StepContext) -> LossOutput:
        out, new_state = apply_train(self.train_model, params, model_state, images_BxHxWxC,
                                     ctx.key)
        alpha_BxK = jnp.exp(out["log_alpha_BxK"])
        p_BxK = jax.nn.softmax(out["p_logits_BxK"], axis=-1)
        loss_B = loss(alpha_BxK, p_BxK, out["tau_B"], labels_B)
        mean_BxK = moments(alpha_BxK, p_BxK, out["tau_B"]).mean_BxK
        return LossOutput(loss_B, new_state, method_state,
                          {"correct_B": correct_B(mean_BxK, labels_B), "mean_tau": out["tau_B"]})

    def predict(self, variables: Variables, method_state, images_BxHxWxC: jax.Array,
                key: jax.Array) -> dict[str, jax.Array]:
        del method_state, key
        return dict(self.eval_model.apply(variables, images_BxHxWxC, train=False))

    def _moments(self, raw: Mapping[str, np.ndarray]):
        log_alpha = np.asarray(raw["log_alpha_BxK"], np.float64)
        log_p, _ = log_softmax64(raw["p_logits_BxK"])
        tau = np.asarray(raw["tau_B"], np.float64)
        with jax.enable_x64(True):
            alpha, p = jnp.exp(jnp.asarray(log_alpha)), jnp.exp(jnp.asarray(log_p))
            m = moments(alpha, p, tau)
            u = uncertainties(alpha, p, tau)
            return (np.asarray(m.mean_BxK), np.asarray(u.epistemic), np.asarray(u.aleatoric),
                    log_alpha, tau)

    def predictions(self, raw: Mapping[str, np.ndarray],
                    labels_N: np.ndarray | None = None) -> Predictions:
        mean, epistemic, aleatoric, log_alpha, tau = self._moments(raw)
        probs = mean / mean.sum(axis=-1, keepdims=True)
        _, log_alpha0 = log_softmax64(log_alpha)
        log_precision = np.logaddexp(log_alpha0, np.log(np.maximum(tau, 1e-300)))
        return Predictions(probs, {"mp": probs.max(axis=-1), "um": log_precision,
                                   "neg_variance_sum": -epistemic,
                                   "neg_expected_gini": -aleatoric}, labels_N)

    def predicted_class(self, raw: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.argmax(self._moments(raw)[0], axis=-1)

    def describe(self) -> str:
        arch = ("protocol backbone, no spectral norm" if self.recipe == "protocol"
                else "reference backbone with spectral norm")
        if isinstance(self.eval_model.backbone, UserBackbone):
            arch = ("your network: g_alpha its logits, g_p and g_tau on its `features`; no "
                    "spectral norm (it cannot be imposed on a user network)")
        return (f"F-EDL (Flexible Dirichlet heads; {arch}; UM = log(alpha_0 + tau); "
                f"{self.recipe} reading)")

