"""Posterior Networks (Charpentier, Zuegner, Guennemann, NeurIPS 2020).

Model (`PostNetModel`): the protocol network with a `latent_dim`-wide last layer (ConvNet
... 64 -> 6; VGG16 ... 512 -> 512 -> 6, as the reference's encoders with output_dim = latent_dim),
a BatchNorm over the latent (batch statistics in training, as the reference's BatchNorm1d), and
one normalising flow per class: `flow_layers` radial layers with a standard normal base
(the math below). Its output is log q_c(z) for every class.

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

The math (per-example functions, pure and jit/vmap/grad-safe):

Posterior Networks (Charpentier, Zuegner, Guennemann, NeurIPS 2020; sharpenb/Posterior-Network).

An encoder maps x to a latent z in R^d (d = 6), and one normalising flow per class c gives a
density q_c(z); the Dirichlet is alpha_c = 1 + N_c q_c(z), with N_c the class count of the
training split. Each flow is a stack of radial layers (Rezende & Mohamed 2015, as in Pyro's
`Radial`) applied to z, with a standard normal base: log q_c(z) = log N(f_c(z); 0, I) + sum of the
layers' log |det J|. Loss (joint mode): UCE psi(alpha_0) - psi(alpha_y) minus reg * H(Dir(alpha)).

Numerics: log q reaches hundreds in float32 training, so alpha is carried as
log(alpha_c - 1) = log N_c + log q_c and clamped before the exp (the reference runs in float64);
the UM score is log alpha_0 = logsumexp_c softplus(log N_c + log q_c), exact and overflow-free.
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

from gedl_jax.data import registry
from gedl_jax.evaluation.core import Predictions
from gedl_jax.evaluation.scores import DIRICHLET_SCORE_NAMES
from gedl_jax.evidential import differential_entropy, expected_nll
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
    apply_train,
    backbone,
    check_recipe,
    log_dirichlet_predictions,
)

LOG_PSEUDO_COUNT_CLAMP = 80.0  # e^80 ~ 5.5e34: finite in float32 even summed over 100 classes


class RadialParams(NamedTuple):
    """One radial layer (leading axes stack layers and classes): z0 (..., D), a', b' (...)."""

    z0: jax.Array
    a_raw: jax.Array
    b_raw: jax.Array


def init_radial(key: jax.Array, num_classes: int, num_layers: int, dim: int) -> RadialParams:
    """Uniform(-1/sqrt(d), 1/sqrt(d)) for every parameter, as Pyro's Radial; shapes
    (K, L, D), (K, L), (K, L)."""
    bound = 1.0 / jnp.sqrt(dim)
    k1, k2, k3 = jax.random.split(key, 3)
    shape = (num_classes, num_layers)
    return RadialParams(jax.random.uniform(k1, (*shape, dim), minval=-bound, maxval=bound),
                        jax.random.uniform(k2, shape, minval=-bound, maxval=bound),
                        jax.random.uniform(k3, shape, minval=-bound, maxval=bound))


def radial_layer(z_BxD: ArrayLike, z0_D: ArrayLike, a_raw: ArrayLike, b_raw: ArrayLike
                 ) -> tuple[jax.Array, jax.Array]:
    """f(z) = z + beta h (z - z0), h = 1 / (a + r), r = ||z - z0||, with a = softplus(a') and
    beta = -a + softplus(b') >= -a (so f is invertible). Returns (f(z), log |det df/dz|):
    (d - 1) log(1 + beta h) + log(1 + beta h - beta r h^2) (the Jacobian is
    (1 + beta h) I + beta h'(r) (z - z0)(z - z0)^T / r with h' = -h^2)."""
    z_BxD = jnp.asarray(z_BxD)
    dim = z_BxD.shape[-1]
    a = jax.nn.softplus(jnp.asarray(a_raw))
    beta = -a + jax.nn.softplus(jnp.asarray(b_raw))
    diff_BxD = z_BxD - jnp.broadcast_to(jnp.asarray(z0_D), z_BxD.shape)
    r_B = jnp.sqrt(jnp.sum(diff_BxD ** 2, axis=-1))
    h_B = 1.0 / (a + r_B)
    out = z_BxD + (beta * h_B)[..., None] * diff_BxD
    logdet = (dim - 1) * jnp.log1p(beta * h_B) + jnp.log1p(beta * h_B - beta * r_B * h_B ** 2)
    return out, logdet


def flow_log_density(z_BxD: ArrayLike, layers: RadialParams) -> jax.Array:
    """log q(z) of one flow (layers stacked on the leading axis of `layers`), shape (B,)."""
    z_BxD = jnp.asarray(z_BxD)

    def step(carry, layer):
        z, total = carry
        z, logdet = radial_layer(z, *layer)
        return (z, total + logdet), None

    # The initial log-det total derives from z (not jnp.zeros), so inside shard_map it varies
    # over the data axis as the carry does.
    (u_BxD, logdet_B), _ = jax.lax.scan(step, (z_BxD, jnp.zeros_like(z_BxD[..., 0])), layers)
    dim = z_BxD.shape[-1]
    log_base = -0.5 * jnp.sum(u_BxD ** 2, axis=-1) - 0.5 * dim * jnp.log(2.0 * jnp.pi)
    return log_base + logdet_B


def class_log_densities(z_BxD: ArrayLike, flows: RadialParams) -> jax.Array:
    """log q_c(z) for every class's flow (`flows` stacked (K, L, ...)), shape (B, K)."""
    return jax.vmap(lambda layers: flow_log_density(z_BxD, layers), out_axes=-1)(flows)


def log_pseudo_counts(log_q_BxK: ArrayLike, class_counts_K: ArrayLike) -> jax.Array:
    """log(alpha_c - 1) = log N_c + log q_c(z)."""
    log_q_BxK = jnp.asarray(log_q_BxK)
    return log_q_BxK + jnp.broadcast_to(jnp.log(jnp.asarray(class_counts_K)), log_q_BxK.shape)


def concentration(log_q_BxK: ArrayLike, class_counts_K: ArrayLike,
                  clamp: float = LOG_PSEUDO_COUNT_CLAMP) -> jax.Array:
    """alpha_c = 1 + N_c q_c(z), the pseudo-count's log clamped at `clamp` (float32 safety)."""
    return 1.0 + jnp.exp(jnp.minimum(log_pseudo_counts(log_q_BxK, class_counts_K), clamp))


def log_concentration(log_q_BxK: ArrayLike, class_counts_K: ArrayLike) -> jax.Array:
    """log alpha_c = log(1 + N_c q_c(z)) = softplus(log N_c + log q_c), exact and unclamped."""
    return jax.nn.softplus(log_pseudo_counts(log_q_BxK, class_counts_K))


def log_precision(log_q_BxK: ArrayLike, class_counts_K: ArrayLike) -> jax.Array:
    """log alpha_0 = logsumexp_c log alpha_c, log alpha_c = softplus(log N_c + log q_c): the UM
    score without overflow (exact, unclamped)."""
    return jax.nn.logsumexp(log_concentration(log_q_BxK, class_counts_K), axis=-1)


def uce_loss(alpha_BxK: ArrayLike, labels_B: ArrayLike, entropy_weight: float) -> jax.Array:
    """Per example: psi(alpha_0) - psi(alpha_y) - entropy_weight * H(Dir(alpha)) (the reference
    sums it over the batch; weight 1e-6 on MNIST, 1e-5 on CIFAR-10)."""
    return expected_nll(alpha_BxK, labels_B) - entropy_weight * differential_entropy(alpha_BxK)

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
        flows = RadialParams(self.param("z0", _uniform(bound), (*shape, dim)),
                                     self.param("a_raw", _uniform(bound), shape),
                                     self.param("b_raw", _uniform(bound), shape))
        return {"log_q_BxK": class_log_densities(z_BxD.astype(jnp.float32), flows)}


@dataclasses.dataclass(frozen=True)
class PostNet(Method):
    """Posterior Network with training class counts `class_counts` (N_c)."""

    class_counts: tuple[int, ...] = ()
    entropy_weight: float | None = None   # weight of -H(Dir(alpha)) in the UCE loss; None: the
                                          # reference's per dataset, 1e-5 on CIFAR, else 1e-6
    latent_dim: int = 6                   # the latent z's dimension
    flow_layers: int = 6                  # radial layers per class flow
    recipe: str = "protocol"

    name: ClassVar[str] = "postnet"
    score_names: ClassVar[tuple[str, ...]] = DIRICHLET_SCORE_NAMES
    progress_logs: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("mean_log_precision", "log_S", ".2f"),)
    run_fields: ClassVar[tuple[str, ...]] = ("class_counts", "recipe")
    # sharpenb/Posterior-Network: Adam lr 1e-4 / 2.5e-4, batch 64, <= 200 epochs.
    source_recipe: ClassVar[dict[str, dict[str, Any]]] = {
        "mnist": dict(learning_rate=1e-4, batch_size=64, lr_schedule="constant",
                      weight_decay=0.0, num_epochs=200),
        "cifar": dict(learning_rate=2.5e-4, batch_size=64, lr_schedule="constant",
                      weight_decay=0.0, num_epochs=200)}
    score_captions: ClassVar[Mapping[str, str]] = {
        "um": "log alpha_0 (a constant W: ranks as -W/S)"}

    @classmethod
    def fill_defaults(cls, settings, num_classes: int, dataset: str):
        if settings["entropy_weight"] is None:
            weight = 1e-5 if registry.dataset_family(dataset) == "cifar" else 1e-6
            settings = {**settings, "entropy_weight": weight}
        return settings

    @classmethod
    def check_settings(cls, settings, num_classes: int) -> None:
        for name in ("latent_dim", "flow_layers"):
            if not settings[name] > 0:
                raise bad_setting(name, settings[name], "it must be > 0")
        weight = settings["entropy_weight"]
        if weight is not None and not weight >= 0:
            raise bad_setting("entropy_weight", weight, "it must be >= 0")

    @classmethod
    def output_width(cls, config, num_classes: int) -> int:
        return int(config.method_settings["latent_dim"])   # the latent z

    @classmethod
    def build(cls, config, setup: MethodSetup) -> PostNet:
        """`config.method="postnet"`: the protocol backbone to a latent z, one flow per class."""
        settings = config.method_settings
        train_model, eval_model = (
            PostNetModel(backbone(config, settings["latent_dim"], axis_name=axis,
                                  reads=("logits",)),
                         setup.num_classes, settings["flow_layers"], axis_name=axis)
            for axis in (AXIS, None))
        return cls(train_model, eval_model, setup.num_classes, class_counts=setup.class_counts,
                   **settings, recipe=check_recipe(config.recipe))

    def __post_init__(self):
        if len(self.class_counts) != self.num_classes or min(self.class_counts) < 1:
            raise ValueError(f"PostNet needs a positive training count for each of the "
                             f"{self.num_classes} classes (N_c), got {self.class_counts}: every "
                             f"class must occur in the training split")
        if self.entropy_weight is None:   # built directly: the rule of `fill_defaults`
            filled = self.fill_defaults({"entropy_weight": None}, self.num_classes, "")
            object.__setattr__(self, "entropy_weight", filled["entropy_weight"])
        super().__post_init__()

    def loss(self, params, model_state: Variables, method_state, images_BxHxWxC: jax.Array,
             labels_B: jax.Array, ctx: StepContext) -> LossOutput:
        out, new_state = apply_train(self.train_model, params, model_state, images_BxHxWxC,
                                     ctx.key)
        counts_K = jnp.asarray(self.class_counts, jnp.float32)
        alpha_BxK = concentration(out["log_q_BxK"], counts_K)
        loss_B = uce_loss(alpha_BxK, labels_B, self.entropy_weight)
        logs = {"correct_B": correct_B(alpha_BxK, labels_B),
                "mean_log_precision": log_precision(out["log_q_BxK"], counts_K)}
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

