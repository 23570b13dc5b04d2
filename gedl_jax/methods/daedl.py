"""DAEDL (Yoon & Kim, "Uncertainty Estimation by Density Aware Evidential Deep Learning",
ICML 2024).

Model: the protocol network with *every* conv and Dense layer spectrally normalised (the reference
nets; `networks.Backbone(spectral_norm=True)`: the feature space must keep distances for the
density to mean anything), VGG16 with its 0.5 classifier dropout, the ConvNet without dropout.
Its outputs are the logits and the density feature z = the encoder output before the MLP
(576-d ConvNet, 512-d VGG16).

Training (`baselines.daedl.training_loss`): an exp-evidence EDL loss, alpha = exp(logits) + 1e-6
(no +1 prior): squared error + variance + kl_weight * KL(Dir(alpha~) || Dir(1)), kl_weight 0.05
constant.

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
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from gedl_jax.baselines import daedl
from gedl_jax.evaluation.core import Predictions
from gedl_jax.evaluation.scores import DIRICHLET_SCORE_NAMES
from gedl_jax.methods.base import LossOutput, Method, StepContext, Variables, correct_B
from gedl_jax.methods.common import apply_train, log_dirichlet_predictions

LOGIT_CLIP = 30.0
MIN_DENSITY = 1e-12   # floor of d in the host scores: ties at d = 0 break by the logits


def _gda(state) -> daedl.GDA:
    return daedl.GDA(state["means_KxD"], state["cholesky_KxDxD"], None)


@dataclasses.dataclass(frozen=True)
class DAEDL(Method):
    """DAEDL with KL weight `kl_weight`."""

    kl_weight: float = 0.05
    recipe: str = "protocol"

    name: ClassVar[str] = "daedl"
    score_names: ClassVar[tuple[str, ...]] = DIRICHLET_SCORE_NAMES + ("log_density",)
    needs_fit: ClassVar[bool] = True

    def loss(self, params, model_state: Variables, method_state, images_BxHxWxC: jax.Array,
             labels_B: jax.Array, ctx: StepContext) -> LossOutput:
        out, new_state = apply_train(self.train_model, params, model_state, images_BxHxWxC,
                                     ctx.key)
        logits_BxK = out["logits"]
        loss_B = daedl.training_loss(logits_BxK, labels_B, self.kl_weight, LOGIT_CLIP)
        return LossOutput(loss_B, new_state, method_state,
                          {"correct_B": correct_B(logits_BxK, labels_B)})

    def features(self, variables: Variables, images_BxHxWxC: jax.Array) -> jax.Array:
        """The density feature z (eval mode): the encoder output before the MLP."""
        return self.eval_model.apply(variables, images_BxHxWxC, train=False)["encoder"]

    def fit(self, variables: Variables, method_state,
            batches: Iterable[tuple[jax.Array, jax.Array]]) -> dict[str, jax.Array]:
        features_fn = jax.jit(self.features)
        feats, labels = [], []
        for images, labels_B in batches:
            feats.append(np.asarray(features_fn(variables, images)))
            labels.append(np.asarray(labels_B))
        features_NxD = np.concatenate(feats)
        labels_N = np.concatenate(labels)
        gda = daedl.fit_gda(features_NxD, labels_N, self.num_classes)
        state = {"means_KxD": jnp.asarray(gda.means_KxD, jnp.float32),
                 "cholesky_KxDxD": jnp.asarray(gda.cholesky_KxDxD, jnp.float32)}
        score_fn = jax.jit(lambda z, s: daedl.density_score(z, _gda(s)))
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
        s_B = daedl.density_score(out["encoder"], _gda(method_state))
        d_B = daedl.normalized_density(s_B, method_state["score_min"], method_state["score_max"])
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
        log_alpha = np.logaddexp(scaled, np.log(daedl.EPS))
        return log_dirichlet_predictions(log_alpha, self.num_classes * daedl.EPS, labels_N,
                                         extra_scores={"log_density": log_density})

    def predicted_class(self, raw: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.argmax(raw["logits_BxK"], axis=-1)   # = argmax p* (see `predictions`)

    def describe(self) -> str:
        return f"DAEDL (spectral norm, KL weight {self.kl_weight:g}, {self.recipe} reading)"
