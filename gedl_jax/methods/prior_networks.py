"""Prior Networks: KL-PN (Malinin & Gales, NeurIPS 2018) and RKL-PN (NeurIPS 2019).

The protocol network's logits give a Dirichlet alpha = exp(logits) (clipped to +-30 in the loss:
float32 exp overflows above ~88.7). Training fits it to Dirichlet targets by KL: KL-PN by the
forward KL(Dir(target) || Dir(alpha)), RKL-PN by the reverse KL(Dir(alpha) || Dir(target))
(the math below). In-distribution targets are sharp on the label; OOD *training*
inputs get the flat Dir(1).

OOD training data is required and is never an evaluation OOD set (KMNIST, Fashion-MNIST, SVHN,
CIFAR-100 test): it is generated in the graph from the step's key (the setting `ood`), one OOD image
per in-distribution image, spanning the batch's pixel range: "noise_uniform" (i.i.d. uniform
pixels) or "noise_smoothed" (Gaussian-blurred uniform noise). As in the official code's loop,
ID and OOD images go through the network in one forward pass, so BatchNorm sees the mixed batch.
The per-example loss pairs each ID example i with OOD example i:
(KL_ID_i + gamma * KL_OOD_i) / c, c = the target concentration (the official
`PriorNetMixedLoss` divides by the largest target concentration), so its batch mean is the
reference's (mean_ID + gamma mean_OOD) / c.

Targets (the setting `target_form`): "pnet" = 1 + c * onehot (the RKL-PN code; (101, 1, ..., 1);
RKL-PN's default), "smoothed" = c * label-smoothed mean (the 2018 paper; (91, 1, ..., 1) for
c = 100, K = 10; KL-PN's default).

Predictions: the Dirichlet alpha = exp(logits) with the flat prior W = K. Scores: "mp" = max
softmax, "um" = log alpha_0 = logsumexp(logits) (log space: same ranking as alpha_0), and the
other Dirichlet scores. Readings (`config.recipe`): "protocol" trains with the common pipeline;
"source" adds the official loop's settings the trainer has (the `:source` modifier sets them:
gradient-norm clip 10, inputs standardised, batch 128); the method's math is the same.

The math (per-example functions, pure and jit/vmap/grad-safe):

Prior Networks: a Dirichlet with alpha = exp(logits), fitted by KL to Dirichlet targets.

KL-PN (Malinin & Gales, "Predictive Uncertainty Estimation via Prior Networks", NeurIPS 2018)
minimises the *forward* KL(Dir(target) || Dir(alpha)); RKL-PN (Malinin & Gales, "Reverse KL-
Divergence Training of Prior Networks", NeurIPS 2019; official code KaosEngineer/PriorNetworks)
the *reverse* KL(Dir(alpha) || Dir(target)). In-distribution targets are sharp on the label, OOD
training examples get the flat Dir(1). Two target readings exist: the 2019 code's
`1 + concentration * onehot` ("pnet": (101, 1, ..., 1) for 100) and the 2018 paper's smoothed mean
times a precision ("smoothed": precision 100, smoothing 0.01 -> (91, 1, ..., 1) for K = 10).

The KL itself is `evidential.dirichlet_kl`, written to stay accurate in float32: the paper's
closed form, with no epsilon (the setting `kl_epsilon = 0`, the default).

The reference code's smoothing epsilon (the setting `kl_epsilon`). The official
`dirichlet_kl_divergence` and `dirichlet_reverse_kl_divergence` (KaosEngineer/PriorNetworks,
prior_networks/priornet/dpn_losses.py; the same functions in its earlier
prior_networks/priornet/losses.py) add epsilon = 1e-8 inside every lgamma and digamma except
the two lgammas of the precision term: for KL(Dir(p) || Dir(q)), P = sum p, Q = sum q,

    lgamma(P) - lgamma(Q) + sum_k [lgamma(q_k + eps) - lgamma(p_k + eps)
                                   + (p_k - q_k) (digamma(p_k + eps) - digamma(P + eps))]

(the forward KL is this with p = target, q = alpha; the reverse one with p = alpha, q = target).
`kl_epsilon > 0` evaluates exactly that, term by term (`smoothed_dirichlet_kl`; in float32 it
cancels like the reference's at large concentrations). The epsilon changes the KL by about
eps / alpha_min relative, alpha_min the smallest concentration: in the reverse KL against
1 + 100 onehot by up to 1.3e-5 (the other classes also at alpha_min) to 3.4e-5 (the others
log-uniform up to e^30) at alpha_min = 1e-3, and 1.7e-3 at alpha_min = 6e-6, a logit of -12
(tests/test_reference_guards.py). With epsilon = 0 the reference's formula is the closed form:
in float64 the two agree to ~2e-9 relative in value and gradient (the accuracy in float64 of
`dirichlet_kl`, which is built for float32).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from gedl_jax.evaluation.core import Predictions
from gedl_jax.evaluation.scores import DIRICHLET_SCORE_NAMES
from gedl_jax.evidential import dirichlet_kl
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
    apply_train,
    build_models,
    check_recipe,
    log_dirichlet_predictions,
)

TARGET_FORMS = ("pnet", "smoothed")
# In-graph OOD training inputs (never the evaluation OOD sets): see `ood_noise`.
OOD_NOISE = ("noise_uniform", "noise_smoothed")
SMOOTHING_SIGMA = 1.0   # pixels, the Gaussian blur of "noise_smoothed"


def concentration_from_logits(logits_BxK: ArrayLike, clip: float = 30.0) -> jax.Array:
    """alpha = exp(logits), the logits clipped to +-clip: exp overflows float32 above ~88.7 and
    lgamma(inf) is NaN, while e^30 ~ 1e13 is already far past any target precision."""
    return jnp.exp(jnp.clip(jnp.asarray(logits_BxK), -clip, clip))


def log_precision(logits_BxK: ArrayLike) -> jax.Array:
    """log alpha_0 = logsumexp(logits): the UM score in log space (same ranking as alpha_0, no
    overflow and no ties from inf)."""
    return jax.nn.logsumexp(jnp.asarray(logits_BxK), axis=-1)


def in_distribution_target(labels_B: ArrayLike, num_classes: int, form: str = "pnet",
                           concentration: float = 100.0, smoothing: float = 0.01) -> jax.Array:
    """Target concentrations (..., K) for labelled in-distribution examples.

    form "pnet": 1 + concentration * onehot (RKL-PN code). form "smoothed": concentration *
    [1 - (K - 1) smoothing on the label, smoothing elsewhere] (the 2018 paper; its total
    precision is `concentration`)."""
    onehot_BxK = jax.nn.one_hot(jnp.asarray(labels_B), num_classes)
    if form == "pnet":
        return 1.0 + concentration * onehot_BxK
    if form == "smoothed":
        mean_BxK = smoothing + (1.0 - num_classes * smoothing) * onehot_BxK
        return concentration * mean_BxK
    raise ValueError(f"form={form!r}; allowed: {TARGET_FORMS}")


def ood_target(shape: tuple[int, ...]) -> jax.Array:
    """The flat Dir(1) target of OOD training examples, shape (..., K)."""
    return jnp.ones(shape)


def smoothed_dirichlet_kl(p_BxK: ArrayLike, q_BxK: ArrayLike, epsilon: float) -> jax.Array:
    """KL(Dir(p) || Dir(q)) with the official Prior Networks code's epsilon placement
    (KaosEngineer/PriorNetworks, prior_networks/priornet/dpn_losses.py,
    `dirichlet_kl_divergence`): + epsilon inside lgamma(p_k), lgamma(q_k), digamma(p_k) and
    digamma(P), none inside the precision term lgamma(P) - lgamma(Q):

        lgamma(P) - lgamma(Q) + sum_k [lgamma(q_k + eps) - lgamma(p_k + eps)
                                       + (p_k - q_k) (digamma(p_k + eps) - digamma(P + eps))].

    Term by term as the reference writes it (jax.scipy.special), so it rounds like the reference
    too: accurate in float64; in float32 its lgamma terms cancel at large concentrations (use
    epsilon = 0, `dirichlet_kl`, for the accurate closed form)."""
    p = jnp.asarray(p_BxK)
    q = jnp.broadcast_to(jnp.asarray(q_BxK, dtype=p.dtype), p.shape)
    p0_B, q0_B = jnp.sum(p, axis=-1), jnp.sum(q, axis=-1)
    precision_term_B = jax.scipy.special.gammaln(p0_B) - jax.scipy.special.gammaln(q0_B)
    digamma_gap_BxK = (jax.scipy.special.digamma(p + epsilon)
                       - jax.scipy.special.digamma(p0_B + epsilon)[..., None])
    concentration_terms_B = jnp.sum(
        jax.scipy.special.gammaln(q + epsilon) - jax.scipy.special.gammaln(p + epsilon)
        + (p - q) * digamma_gap_BxK, axis=-1)
    return precision_term_B + concentration_terms_B


def _kl(p_BxK: ArrayLike, q_BxK: ArrayLike, epsilon: float) -> jax.Array:
    if epsilon == 0.0:
        return dirichlet_kl(p_BxK, q_BxK)
    return smoothed_dirichlet_kl(p_BxK, q_BxK, epsilon)


def forward_kl(alpha_BxK: ArrayLike, target_BxK: ArrayLike, epsilon: float = 0.0) -> jax.Array:
    """KL-PN's per-example loss KL(Dir(target) || Dir(alpha)). epsilon = 0: the closed form
    (`evidential.dirichlet_kl`); epsilon > 0: the official code's smoothed form
    (`smoothed_dirichlet_kl`, whose default there is 1e-8)."""
    return _kl(target_BxK, alpha_BxK, epsilon)


def reverse_kl(alpha_BxK: ArrayLike, target_BxK: ArrayLike, epsilon: float = 0.0) -> jax.Array:
    """RKL-PN's per-example loss KL(Dir(alpha) || Dir(target)); epsilon as in `forward_kl`. The
    reference divides the batch total by the largest target concentration (matters under SGD,
    hardly under Adam): that is the caller's reduction."""
    return _kl(alpha_BxK, target_BxK, epsilon)


def _blur_axis(x: jax.Array, axis: int, taps: jax.Array) -> jax.Array:
    radius = (taps.shape[0] - 1) // 2
    pad = [(0, 0)] * x.ndim
    pad[axis] = (radius, radius)
    xp = jnp.pad(x, pad, mode="edge")
    n = x.shape[axis]
    return sum(taps[i] * jax.lax.slice_in_dim(xp, i, i + n, axis=axis)
               for i in range(taps.shape[0]))


def gaussian_blur(images_BxHxWxC: ArrayLike, sigma: float = SMOOTHING_SIGMA) -> jax.Array:
    """Separable Gaussian blur over H and W (taps to 2 sigma, normalised; edge padding)."""
    x = jnp.asarray(images_BxHxWxC)
    radius = max(1, int(round(2 * sigma)))
    offsets = jnp.arange(-radius, radius + 1, dtype=x.dtype)
    taps = jnp.exp(-0.5 * (offsets / sigma) ** 2)
    taps = taps / jnp.sum(taps)
    return _blur_axis(_blur_axis(x, 1, taps), 2, taps)


def ood_noise(key: jax.Array, images_BxHxWxC: ArrayLike, kind: str = "noise_uniform"
              ) -> jax.Array:
    """Synthetic OOD training images, one per in-distribution image, drawn from `key`.

    "noise_uniform": i.i.d. uniform pixels (vectors (B, D): uniform per feature);
    "noise_smoothed": the same, Gaussian-blurred
    (sigma = 1 px) and stretched back to the full range per image (spatially correlated
    blobs, closer to natural-image statistics). Either spans each channel's [min, max] over the
    in-distribution batch: U[0, 1] for [0, 1] images, and the same pixels after any input
    standardisation (the method need not know the normalisation)."""
    if kind not in OOD_NOISE:
        raise ValueError(f"kind={kind!r}; allowed: {OOD_NOISE}")
    x = jnp.asarray(images_BxHxWxC)
    if kind == "noise_smoothed" and x.ndim != 4:
        raise ValueError(f"ood='noise_smoothed' blurs images (B, H, W, C); these inputs have "
                         f"shape {x.shape}: use ood='noise_uniform' for vectors")
    # Per channel (images) or per feature (vectors (B, D)): the range over all other axes.
    axes = tuple(range(x.ndim - 1))
    lo_1x1x1xC = jax.lax.stop_gradient(jnp.min(x, axis=axes, keepdims=True))
    hi_1x1x1xC = jax.lax.stop_gradient(jnp.max(x, axis=axes, keepdims=True))
    u = jax.random.uniform(key, x.shape, x.dtype)
    if kind == "noise_smoothed":
        u = gaussian_blur(u)
        u_min = jnp.min(u, axis=(1, 2, 3), keepdims=True)
        u_max = jnp.max(u, axis=(1, 2, 3), keepdims=True)
        u = (u - u_min) / jnp.maximum(u_max - u_min, 1e-12)
    return lo_1x1x1xC + (hi_1x1x1xC - lo_1x1x1xC) * u

LOGIT_CLIP = 30.0


@dataclasses.dataclass(frozen=True)
class PriorNetwork(Method):
    """A Prior Network; `reverse` picks RKL-PN's reverse KL (the subclasses fix it)."""

    ood: str = "noise_uniform"          # OOD *training* inputs, made in the graph (`ood_noise`);
                                        # never an evaluation OOD set
    ood_weight: float = 1.0             # gamma, the weight of the OOD KL term
    target_form: str = "pnet"           # the ID target (`in_distribution_target`)
    target_concentration: float = 100.0  # c (the loss is divided by it)
    target_smoothing: float | None = None  # label smoothing of the "smoothed" target; None:
                                        # 0.01 for K <= 10 (the 2018 paper), else 0.1 / K (0.01
                                        # = 1/K would make a K = 100 target flat)
    kl_epsilon: float = 0.0             # epsilon inside the KL as the official code places it
                                        # (its value: 1e-8); 0 = the closed form
    recipe: str = "protocol"

    reverse: ClassVar[bool] = False
    score_names: ClassVar[tuple[str, ...]] = DIRICHLET_SCORE_NAMES
    progress_logs: ClassVar[tuple[tuple[str, str, str], ...]] = (
        ("kl_id", "kl_id", ".3f"), ("kl_ood", "kl_ood", ".3f"))
    run_fields: ClassVar[tuple[str, ...]] = ("recipe",)
    # KaosEngineer/PriorNetworks: gradient-norm clip 10, inputs standardised, batch 128.
    source_recipe: ClassVar[dict[str, dict[str, Any]]] = {
        "mnist": dict(grad_clip_norm=10.0, normalize=True, batch_size=128),
        "cifar": dict(grad_clip_norm=10.0, normalize=True, batch_size=128)}
    score_captions: ClassVar[Mapping[str, str]] = {
        "um": "log alpha_0 (a constant W: ranks as -W/S)"}

    @classmethod
    def fill_defaults(cls, settings, num_classes: int, dataset: str):
        if settings["target_smoothing"] is None:
            smoothing = 0.01 if num_classes <= 10 else 0.1 / num_classes
            settings = {**settings, "target_smoothing": smoothing}
        return settings

    @classmethod
    def check_settings(cls, settings, num_classes: int) -> None:
        if settings["ood"] not in OOD_NOISE:
            raise bad_setting("ood", settings["ood"], f"allowed values: {list(OOD_NOISE)}")
        if settings["target_form"] not in TARGET_FORMS:
            raise bad_setting("target_form", settings["target_form"],
                              f"allowed values: {list(TARGET_FORMS)}")
        for name in ("ood_weight", "kl_epsilon"):
            if not settings[name] >= 0.0:
                raise bad_setting(name, settings[name], "it must be >= 0")
        if not settings["target_concentration"] > 0:
            raise bad_setting("target_concentration", settings["target_concentration"],
                              "it must be > 0")
        smoothing = settings["target_smoothing"]
        if settings["target_form"] == "smoothed" and smoothing is not None and num_classes \
                and not 0.0 <= smoothing < 1.0 / num_classes:
            raise bad_setting("target_smoothing", smoothing,
                              f"it must be in [0, 1/K) = [0, {1.0 / num_classes:g}) so the "
                              f"label keeps the largest target")

    def __post_init__(self):
        if self.target_smoothing is None:   # built directly: the rule of `fill_defaults`
            filled = self.fill_defaults({"target_smoothing": None}, self.num_classes, "")
            object.__setattr__(self, "target_smoothing", filled["target_smoothing"])
        super().__post_init__()

    @classmethod
    def build(cls, config, setup: MethodSetup) -> PriorNetwork:
        """`config.method="kl_pn"` (forward KL) or "rkl_pn" (reverse KL) to the Dirichlet
        targets."""
        settings = config.method_settings
        if settings["ood"] == "noise_smoothed" and len(setup.image_shape) != 3:
            raise ValueError(f"config.method_args: ood='noise_smoothed' blurs images (H, W, C); "
                             f"the inputs have shape {setup.image_shape}: use "
                             f"ood='noise_uniform' (per-feature uniform noise) for vectors")
        return cls(*build_models(config), setup.num_classes, **settings,
                   recipe=check_recipe(config.recipe))

    def _kl(self, alpha_BxK: jax.Array, target_BxK: jax.Array) -> jax.Array:
        kl = reverse_kl if self.reverse else forward_kl
        return kl(alpha_BxK, target_BxK, self.kl_epsilon)

    def loss(self, params, model_state: Variables, method_state, images_BxHxWxC: jax.Array,
             labels_B: jax.Array, ctx: StepContext) -> LossOutput:
        noise_key, dropout_key = jax.random.split(ctx.key)
        ood_BxHxWxC = ood_noise(noise_key, images_BxHxWxC, self.ood)
        both = jnp.concatenate([images_BxHxWxC, ood_BxHxWxC.astype(images_BxHxWxC.dtype)])
        logits_2BxK, new_model_state = apply_train(self.train_model, params, model_state, both,
                                                   dropout_key)
        batch = images_BxHxWxC.shape[0]
        logits_BxK, ood_logits_BxK = logits_2BxK[:batch], logits_2BxK[batch:]
        target_BxK = in_distribution_target(labels_B, self.num_classes, self.target_form,
                                               self.target_concentration,
                                               self.target_smoothing)
        kl_id_B = self._kl(concentration_from_logits(logits_BxK, LOGIT_CLIP), target_BxK)
        kl_ood_B = self._kl(concentration_from_logits(ood_logits_BxK, LOGIT_CLIP),
                            ood_target(ood_logits_BxK.shape))
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
        epsilon = f", KL epsilon {self.kl_epsilon:g}" if self.kl_epsilon else ""
        return (f"{kind}, OOD training data {self.ood} (weight {self.ood_weight:g}), targets "
                f"{self.target_form} c={self.target_concentration:g}{epsilon}, {self.recipe} "
                f"reading")


@dataclasses.dataclass(frozen=True)
class KLPriorNetwork(PriorNetwork):
    target_form: str = "smoothed"       # the 2018 paper's label-smoothed targets

    name: ClassVar[str] = "kl_pn"
    reverse: ClassVar[bool] = False


@dataclasses.dataclass(frozen=True)
class RKLPriorNetwork(PriorNetwork):
    name: ClassVar[str] = "rkl_pn"
    reverse: ClassVar[bool] = True

