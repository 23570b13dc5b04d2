"""DAEDL (Yoon & Kim, "Uncertainty Estimation by Density Aware Evidential Deep Learning",
ICML 2024).

Model: the protocol network with *every* conv and Dense layer spectrally normalised (the reference
nets; `networks.Backbone(spectral_norm=True)`: the feature space must keep distances for the
density to mean anything), VGG16 with its 0.5 classifier dropout, the ConvNet without dropout.
Its outputs are the logits and the density feature z = the encoder output before the MLP
(576-d ConvNet, 512-d VGG16).

Training (`training_loss`): an exp-evidence EDL loss, alpha = exp(logits) + 1e-6
(no +1 prior): squared error + variance + kl_weight * KL(Dir(alpha~) || Dir(1)), kl_weight 0.05
constant. The logits are clipped to +-30 first (the setting `logit_clip`; 0 = no clip, the
reference's loss): the clipped loss is lower by up to a third once logits of other classes than
the true one exceed 30 (see `training_loss`).

After training (`fit`, `needs_fit`): a Gaussian per class (GDA, float64 NumPy fit with the
smallest relative jitter that factorises) on the eval-mode features of the training batches it
is given; its density score s(x) = logsumexp_c log N(z; mu_c, Sigma_c) on those same batches
gives the training range [s_min, s_max]. The method state is the fitted GDA and that range.

Prediction: d = (clip(s, s_min, s_max) - s_min) / (s_max - s_min) in [0, 1] and the
density-scaled logits d * logits: alpha* = exp(d * logits) + 1e-6, p* = softmax(d * logits)
(prediction argmax p*, which is argmax logits: d is floored at 1e-12 so that inputs at or below
the training minimum, d = 0, keep the model's prediction instead of a tie). Scores: "mp" =
max alpha*/alpha*_0 (max p* up to the 1e-6 offsets), "um" = log alpha*_0 = logsumexp(d * logits)
(log space), "log_density" = s(x), and the other
Dirichlet scores of alpha* (W = K * 1e-6, the training prior). Before `fit` the method state
is empty and d = 1 (the plain exp-EDL model, for validation accuracy during training).

The density is evaluated on device in float32 (the Cholesky factors are fitted in float64), the
same function for the training range and for test inputs. Readings (`config.recipe`): "protocol"
trains with the common pipeline; "source" is the reference's settings the trainer has (the
`:source` modifier: Adam lr 1e-3, batch 64, constant rate, no weight decay, CIFAR inputs
standardised); its 0.95^epoch decay and buggy early stop are not reproduced.

The math (per-example functions, pure and jit/vmap/grad-safe):

DAEDL (Yoon & Kim, "Uncertainty Estimation by Density Aware Evidential Deep Learning",
ICML 2024; TaeseongYoon/DAEDL).

After training an exp-evidence EDL model (alpha = exp(logits) + 1e-6, no +1 prior), a
class-conditional Gaussian (GDA) is fitted on penultimate training features. A test input's
density score s(x) = logsumexp_c log N(z; mu_c, Sigma_c) (no class weights) is clipped to the
training range and min-max normalised to d in [0, 1]; the logits are scaled by it:
alpha* = exp(d * logits), p* = softmax(d * logits). d = 0 gives alpha* = 1 and a uniform p*, so
far-from-data inputs get the flat Dirichlet; d = 1 is the plain exp-EDL model.

The fit is one host-side NumPy float64 step (the reference fits in float64, with growing jitter
on the covariance until its Cholesky factorisation succeeds); everything else is jit-able.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, NamedTuple

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
    AXIS,
    apply_train,
    backbone,
    UserBackbone,
    check_recipe,
    log_dirichlet_predictions,
)

# Jitters tried in order until a class covariance factorises, *relative to its mean variance*.
# The reference (TaeseongYoon/DAEDL, density_estimation.py, `gmm_fit`) adds absolute jitters
# 0, the smallest normal double (2.2e-308), 1e-308, 1e-307, ..., 1e-1 to all class covariances at
# once until torch's MultivariateNormal builds (its Cholesky factorisation succeeds). What that
# gives depends on how the covariance is singular (tests/test_reference_guards.py, float64):
# - a feature constant within a class (a dead ReLU unit: an exactly zero row and column) factorises
#   at 2.2e-308 with a pivot of 1.5e-154: an input whose feature differs from the class's value
#   by d gets the log density -2.2e307 d^2 (-inf in float64 once |d| > 2, and for any
#   |d| > 1e-134 once stored in float32, as the reference stores them), one that matches it
#   ~ +350 (the log det includes log 2.2e-308 = -708);
# - fewer samples than dimensions (6 unit-variance samples in 12 dimensions): rounding leaves
#   null-space eigenvalues down to ~ -7e-16, the first jitter that factorises is 1e-15, and the
#   log densities are finite but between -1e15 and -1e16 (pivots ~ 3e-8).
# The relative jitter (the first of these that factorises, 1e-10 in both cases) keeps them
# finite in float32 too: ~ -1e10 off the subspace, O(1) on it.
JITTERS = (0.0, 1e-10, 1e-8, 1e-6, 1e-4, 1e-3, 1e-2, 1e-1)
EPS = 1e-6  # added to alpha in the reference's training parameterisation and scorers


class GDA(NamedTuple):
    """Per-class Gaussians: means (K, D), lower Cholesky factors (K, D, D), the jitter used."""

    means_KxD: np.ndarray
    cholesky_KxDxD: np.ndarray
    jitter_K: np.ndarray


def fit_gda(features_NxD: np.ndarray, labels_N: np.ndarray, num_classes: int) -> GDA:
    """Class means and unbiased covariances (divided by n_c - 1) in float64; each covariance
    gets the smallest jitter * mean(diag) * I of JITTERS that makes it positive definite. Raises
    ValueError naming the class if none does, or if a class has fewer than 2 examples."""
    z = np.asarray(features_NxD, np.float64)
    labels_N = np.asarray(labels_N)
    dim = z.shape[1]
    means, chols, jitters = [], [], []
    for c in range(num_classes):
        zc = z[labels_N == c]
        if len(zc) < 2:
            raise ValueError(f"class {c} has {len(zc)} training feature(s); the GDA needs >= 2")
        mean = zc.mean(axis=0)
        centred = zc - mean
        cov = centred.T @ centred / (len(zc) - 1)
        scale = max(float(np.mean(np.diag(cov))), np.finfo(np.float64).tiny)
        for jitter in JITTERS:
            try:
                chol = np.linalg.cholesky(cov + jitter * scale * np.eye(dim))
            except np.linalg.LinAlgError:
                continue
            if np.all(np.isfinite(chol)):
                break
        else:
            raise ValueError(f"class {c}: the feature covariance is not positive definite even "
                             f"with jitter {JITTERS[-1]}")
        means.append(mean)
        chols.append(chol)
        jitters.append(jitter)
    return GDA(np.stack(means), np.stack(chols), np.asarray(jitters))


def class_log_densities(features_BxD: ArrayLike, gda: GDA) -> jax.Array:
    """log N(z; mu_c, Sigma_c) for every class, shape (B, K), via the Cholesky factors."""
    z = jnp.asarray(features_BxD)
    chol = jnp.asarray(gda.cholesky_KxDxD, z.dtype)
    diff_KxBxD = z[None, :, :] - jnp.asarray(gda.means_KxD, z.dtype)[:, None, :]  # explicit ranks
    solved = jax.vmap(lambda lower, d: jax.scipy.linalg.solve_triangular(lower, d.T, lower=True)
                      )(chol, diff_KxBxD)  # (K, D, B)
    mahalanobis_KxB = jnp.sum(solved ** 2, axis=1)
    log_det_K = 2.0 * jnp.sum(jnp.log(jnp.diagonal(chol, axis1=-2, axis2=-1)), axis=-1)
    dim = z.shape[-1]
    log_n_KxB = -0.5 * (mahalanobis_KxB + log_det_K[:, None] + dim * jnp.log(2.0 * jnp.pi))
    return log_n_KxB.T


def density_score(features_BxD: ArrayLike, gda: GDA) -> jax.Array:
    """s(x) = logsumexp_c log N(z; mu_c, Sigma_c) (log of the unweighted mixture times K)."""
    return jax.nn.logsumexp(class_log_densities(features_BxD, gda), axis=-1)


def normalized_density(score_B: ArrayLike, train_min: float, train_max: float) -> jax.Array:
    """d = (clip(s, min, max) - min) / (max - min) with the training scores' range: in [0, 1]."""
    s = jnp.clip(jnp.asarray(score_B), train_min, train_max)
    return (s - train_min) / (train_max - train_min)


def scaled_concentration(logits_BxK: ArrayLike, density_B: ArrayLike) -> jax.Array:
    """alpha* = exp(d * logits) + 1e-6 (the reference's scorers add 1e-6)."""
    return jnp.exp(jnp.asarray(density_B)[..., None] * jnp.asarray(logits_BxK)) + EPS


def scaled_probabilities(logits_BxK: ArrayLike, density_B: ArrayLike) -> jax.Array:
    """p* = softmax(d * logits): MP is max p*."""
    return jax.nn.softmax(jnp.asarray(density_B)[..., None] * jnp.asarray(logits_BxK), axis=-1)


def scaled_log_precision(logits_BxK: ArrayLike, density_B: ArrayLike) -> jax.Array:
    """log sum_c exp(d * logit_c): the UM score alpha*_0 in log space (same ranking up to the
    1e-6 offsets, no overflow)."""
    return jax.nn.logsumexp(jnp.asarray(density_B)[..., None] * jnp.asarray(logits_BxK),
                            axis=-1)


def training_loss(logits_BxK: ArrayLike, labels_B: ArrayLike, kl_weight: float = 0.05,
                  logit_clip: float = 30.0) -> jax.Array:
    """DAEDL's per-example training loss (its train.py sums it over the batch), with
    alpha = exp(logits) + 1e-6 (no +1 prior), p = alpha / alpha_0:

      sum_k (y_k - p_k)^2 + sum_k alpha_k (alpha_0 - alpha_k) / (alpha_0^2 (alpha_0 + 1))
        + kl_weight * KL(Dir(alpha~ + 1e-6) || Dir(1)),   alpha~ = alpha (1 - y) + y.

    The variance term is evaluated as sum_k p_k (1 - p_k) / (alpha_0 + 1) (the same value; alpha_0^2
    overflows float32 from alpha_0 ~ 1.8e19). The logits are clipped to +-logit_clip first
    (the setting `logit_clip`, default 30; the reference does not clip, and logit_clip = inf,
    config value 0, is its loss: float32 exp overflows above ~88.7). The clip changes the loss
    wherever a logit other than the true class's exceeds it: with every logit uniform in [30, 40]
    (K = 10) the clipped loss is 3-33 % (median 26 %) below the exact one
    (tests/test_reference_guards.py); logits at or below the clip, or only the true class's
    above it, give the exact loss (to 1e-12)."""
    logits = jnp.clip(jnp.asarray(logits_BxK), -logit_clip, logit_clip)
    alpha_BxK = jnp.exp(logits) + EPS
    onehot_BxK = jax.nn.one_hot(jnp.asarray(labels_B), alpha_BxK.shape[-1], dtype=alpha_BxK.dtype)
    strength_Bx1 = jnp.sum(alpha_BxK, axis=-1, keepdims=True)
    p_BxK = alpha_BxK / strength_Bx1
    squared_error_B = jnp.sum((onehot_BxK - p_BxK) ** 2, axis=-1)
    variance_B = jnp.sum(p_BxK * (1.0 - p_BxK), axis=-1) / (strength_Bx1[..., 0] + 1.0)
    tilde_BxK = alpha_BxK * (1.0 - onehot_BxK) + onehot_BxK + EPS
    kl_B = dirichlet_kl(tilde_BxK, jnp.ones_like(tilde_BxK))
    return squared_error_B + variance_B + kl_weight * kl_B

LOGIT_CLIP = 30.0
MIN_DENSITY = 1e-12   # floor of d in the host scores: ties at d = 0 break by the logits


def _gda(state) -> GDA:
    return GDA(state["means_KxD"], state["cholesky_KxDxD"], None)


@dataclasses.dataclass(frozen=True)
class DAEDL(Method):
    """DAEDL with KL weight `kl_weight`."""

    kl_weight: float = 0.05        # weight of its KL(Dir(alpha~) || Dir(1)) term
    logit_clip: float = LOGIT_CLIP  # training logits clipped to +-this before exp; 0 = no clip
                                   # (the reference's; float32 exp overflows above ~88.7)
    recipe: str = "protocol"

    name: ClassVar[str] = "daedl"
    score_names: ClassVar[tuple[str, ...]] = DIRICHLET_SCORE_NAMES + ("log_density",)
    needs_fit: ClassVar[bool] = True
    run_fields: ClassVar[tuple[str, ...]] = ("recipe",)
    # TaeseongYoon/DAEDL: Adam lr 1e-3, batch 64, 100 epochs; CIFAR inputs standardised.
    source_recipe: ClassVar[dict[str, dict[str, Any]]] = {
        "mnist": dict(learning_rate=1e-3, batch_size=64, lr_schedule="constant",
                      weight_decay=0.0, num_epochs=100, normalize=False),
        "cifar": dict(learning_rate=1e-3, batch_size=64, lr_schedule="constant",
                      weight_decay=0.0, num_epochs=100, normalize=True)}
    reads_features: ClassVar[bool] = True
    score_captions: ClassVar[Mapping[str, str]] = {
        "um": "log alpha_0 (a constant W: ranks as -W/S)"}

    @classmethod
    def check_settings(cls, settings, num_classes: int) -> None:
        for name in ("kl_weight", "logit_clip"):
            if not settings[name] >= 0:
                raise bad_setting(name, settings[name], "it must be >= 0")

    @classmethod
    def build(cls, config, setup: MethodSetup) -> DAEDL:
        """`config.method="daedl"`: the spectrally normalised protocol backbone."""
        settings = config.method_settings
        train_model, eval_model = (backbone(config, setup.num_classes, axis_name=axis,
                                            spectral_norm=True) for axis in (AXIS, None))
        clip = settings.pop("logit_clip")
        return cls(train_model, eval_model, setup.num_classes, **settings,
                   logit_clip=clip if clip > 0 else float("inf"),   # 0: no clip
                   recipe=check_recipe(config.recipe))

    def loss(self, params, model_state: Variables, method_state, images_BxHxWxC: jax.Array,
             labels_B: jax.Array, ctx: StepContext) -> LossOutput:
        out, new_state = apply_train(self.train_model, params, model_state, images_BxHxWxC,
                                     ctx.key)
        logits_BxK = out["logits"]
        loss_B = training_loss(logits_BxK, labels_B, self.kl_weight, self.logit_clip)
        return LossOutput(loss_B, new_state, method_state,
                          {"correct_B": correct_B(logits_BxK, labels_B)})

    def features(self, variables: Variables, images_BxHxWxC: jax.Array) -> jax.Array:
        """The density feature z (eval mode): the encoder output before the MLP."""
        return self.eval_model.apply(variables, images_BxHxWxC, train=False)["encoder"]

    def fit(self, variables: Variables, method_state,
            batches: Iterable[tuple[jax.Array, jax.Array]],
            validation_batches: Iterable[tuple[jax.Array, jax.Array]] = ()
            ) -> dict[str, jax.Array]:
        del validation_batches   # nothing is chosen on it
        features_fn = jax.jit(self.features)
        feats, labels = [], []
        for images, labels_B in batches:
            feats.append(np.asarray(features_fn(variables, images)))
            labels.append(np.asarray(labels_B))
        features_NxD = np.concatenate(feats)
        labels_N = np.concatenate(labels)
        gda = fit_gda(features_NxD, labels_N, self.num_classes)
        state = {"means_KxD": jnp.asarray(gda.means_KxD, jnp.float32),
                 "cholesky_KxDxD": jnp.asarray(gda.cholesky_KxDxD, jnp.float32)}
        score_fn = jax.jit(lambda z, s: density_score(z, _gda(s)))
        scores = np.concatenate([np.asarray(score_fn(f, state)) for f in feats])
        finite = scores[np.isfinite(scores)]
        if finite.size == 0 or finite.max() <= finite.min():
            raise ValueError("DAEDL: the training density scores have no range (all equal or "
                             "non-finite); the features may have collapsed")
        state["score_min"] = jnp.asarray(finite.min(), jnp.float32)
        state["score_max"] = jnp.asarray(finite.max(), jnp.float32)
        return state

    def predict(self, variables: Variables, method_state, images_BxHxWxC: jax.Array,
                key: jax.Array) -> dict[str, jax.Array]:
        del key
        out = self.eval_model.apply(variables, images_BxHxWxC, train=False)
        logits_BxK = out["logits"]
        if not method_state:   # not fitted yet: d = 1, the plain exp-EDL model
            ones_B = jnp.ones(logits_BxK.shape[:1], jnp.float32)
            return {"logits_BxK": logits_BxK, "density_B": ones_B, "log_density_B": 0 * ones_B}
        s_B = density_score(out["encoder"], _gda(method_state))
        d_B = normalized_density(s_B, method_state["score_min"], method_state["score_max"])
        return {"logits_BxK": logits_BxK, "density_B": d_B, "log_density_B": s_B}

    def predictions(self, raw: Mapping[str, np.ndarray],
                    labels_N: np.ndarray | None = None) -> Predictions:
        # d = 0 (a density at or below the training minimum) makes every class tie; flooring d
        # at 1e-12 keeps p* uniform to 1e-11 but its argmax that of the logits, the model's
        # prediction (d > 0 never changes the argmax), instead of class 0 by tie order.
        density_B = np.maximum(np.nan_to_num(np.asarray(raw["density_B"], np.float64),
                                             nan=0.0), MIN_DENSITY)
        scaled = density_B[:, None] * np.asarray(raw["logits_BxK"], np.float64)
        # A density that underflowed to -inf (or NaN) ranks below every finite one.
        log_density = np.asarray(raw["log_density_B"], np.float64)
        log_density = np.where(np.isnan(log_density) | np.isneginf(log_density),
                               -np.finfo(np.float64).max, log_density)
        # alpha* = exp(d logits) + 1e-6: in log space, logaddexp(d logits, log 1e-6).
        log_alpha = np.logaddexp(scaled, np.log(EPS))
        return log_dirichlet_predictions(log_alpha, self.num_classes * EPS, labels_N,
                                         extra_scores={"log_density": log_density})

    def predicted_class(self, raw: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.argmax(raw["logits_BxK"], axis=-1)   # = argmax p* (see `predictions`)

    def describe(self) -> str:
        clip = (f"logits clipped to +-{self.logit_clip:g}" if np.isfinite(self.logit_clip)
                else "logits unclipped")
        if isinstance(self.eval_model, UserBackbone):   # a user network is taken as it is
            return (f"DAEDL (your network, without spectral norm: it cannot be imposed on a "
                    f"user network; KL weight {self.kl_weight:g}, {clip}; features = its "
                    f"`features`)")
        return (f"DAEDL (spectral norm, KL weight {self.kl_weight:g}, {clip}, {self.recipe} "
                f"reading)")

