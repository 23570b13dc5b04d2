"""Last-layer Laplace: a softmax classifier with a Gaussian posterior over its last layer.

Training is the plain softmax classifier's (`softmax.Softmax`: cross-entropy, the same network,
steps and draws; the validation during training predicts as it, before any fit), so a softmax
run's checkpoint is a Laplace run's checkpoint (`trains_as = "softmax"`:
`python -m gedl_jax.evaluate --workdir=<softmax run> --as_method=laplace`).
After training (`fit`) the last Dense layer Theta = [W; b] gets the posterior
N(Theta_MAP, (GGN + lambda I)^-1) of `evaluation.laplace` (closed form, float64 NumPy: the GGN of
the training split's NLL, the prior precision lambda of a log-spaced grid that minimises the
validation NLL of the predictive). At test time the logits of an input are Gaussian,
z ~ N(mu, Sigma) with mu the network's logits and Sigma[k, j] = phi~ C_(k, j) phi~ (phi~ = the
penultimate features with a trailing 1), and the prediction is

- "probit" (default): softmax(mu_k / sqrt(1 + pi/8 Sigma_kk)), the extended probit
  approximation (Daxberger et al., "Laplace Redux", NeurIPS 2021, eq. 13); or
- "mc": the mean of softmax(z) over `num_samples` draws of z (seeded by the run's predict key).

`curvature`: who computes the GGN. "closed_form" (default): `evaluation.laplace.last_layer_ggn`,
one pass of matrix products over the training features. "laplax": the laplax library's full GGN
(`laplax.api.laplace`, curvature "full", cross-entropy), in float64; it is the same matrix (a
test compares them to float64 rounding) and takes about 10x as long at MNIST's size on a 2-core
CPU (`python -m studies.laplace_vs_laplax`), so it is the option, not the default. laplax is
not a dependency of the package (the dev extra has it): `pip install laplax` for it.

Scores: "mp" and "neg_entropy" of the predictive, as the softmax classifier's. The last layer is
a protocol network's final Dense layer (the ConvNet's or VGG16's, on the features before it), or
on a user network (resnet18, mlp, <module>:<Name>, whose `features` method is checked before
the first step) the kernel and bias pair with which its training features give its training
logits, z = f W + b (`evaluation.posthoc.linear_head`); a network without one is refused at
the fit, in one line.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from gedl_jax.evaluation import laplace, posthoc
from gedl_jax.methods.base import MethodSetup, PyTree, Variables, bad_setting, softmax_probs
from gedl_jax.methods.common import build_models
from gedl_jax.methods.softmax import Softmax

_HIGHEST = jax.lax.Precision.HIGHEST
CURVATURES = ("closed_form", "laplax")


def laplax_last_layer_ggn(features_NxF, weight_FxK, bias_K) -> np.ndarray:
    """The GGN of the summed softmax NLL of z = phi W + b with respect to [W; b] (row-major,
    as `evaluation.laplace.last_layer_ggn`), computed by laplax in float64 (its parameters as
    {"W", "b"}: laplax flattens them in that order, W row-major, then b)."""
    try:
        from laplax.api import laplace as laplax_laplace
        from loguru import logger
    except ImportError as e:
        raise ImportError(f"method_args curvature='laplax' needs the laplax package ({e}): "
                          f"pip install laplax, or use curvature='closed_form' (the same "
                          f"matrix, computed without it)") from None
    logger.disable("laplax")   # its debug lines would go to stderr

    def logits(input, params):   # laplax calls it with the keywords `input` and `params`
        return input @ params["W"] + params["b"]

    labels_N = np.zeros(len(features_NxF), np.int64)   # the GGN does not read the labels
    enable_x64 = (jax.enable_x64 if hasattr(jax, "enable_x64")
                  else jax.experimental.enable_x64)   # older jax
    with enable_x64(True):
        params = {"W": jnp.asarray(weight_FxK, jnp.float64),
                  "b": jnp.asarray(bias_K, jnp.float64)}
        _, ggn = laplax_laplace(logits, params,
                                {"input": jnp.asarray(features_NxF, jnp.float64),
                                 "target": jnp.asarray(labels_N)},
                                loss_fn="cross_entropy", curv_type="full", curv_mv_jit=True)
        return np.asarray(ggn, np.float64)


def logit_covariance(features_BxF: jax.Array, covariance_AxKxAxK: jax.Array) -> jax.Array:
    """Sigma (B, K, K) of the logits: phi~ C phi~ per example, phi~ = [phi, 1]."""
    phi_BxA = _augmented(features_BxF)
    return jnp.einsum("na,akbj,nb->nkj", phi_BxA, covariance_AxKxAxK, phi_BxA,
                      precision=_HIGHEST)


def logit_variances(features_BxF: jax.Array, covariance_AxKxAxK: jax.Array) -> jax.Array:
    """diag Sigma (B, K), without forming the (B, K, K) covariance."""
    phi_BxA = _augmented(features_BxF)
    blocks_KxAxA = jnp.einsum("akbk->kab", covariance_AxKxAxK)
    return jnp.einsum("na,kab,nb->nk", phi_BxA, blocks_KxAxA, phi_BxA, precision=_HIGHEST)


def probit_predictive(logits_BxK: jax.Array, variances_BxK: jax.Array) -> jax.Array:
    """softmax(mu / sqrt(1 + pi/8 var)) (Laplace Redux eq. 13)."""
    return softmax_probs(logits_BxK / jnp.sqrt(1.0 + math.pi / 8.0 * variances_BxK))


def mc_predictive(logits_BxK: jax.Array, covariance_BxKxK: jax.Array, key: jax.Array,
                  num_samples: int) -> jax.Array:
    """The mean softmax over `num_samples` draws z = mu + L eps (Sigma = L L^T, a jitter of
    1e-6 of the mean variance where Sigma is singular in float32)."""
    k = logits_BxK.shape[-1]
    scale_B = jnp.trace(covariance_BxKxK, axis1=1, axis2=2) / k
    jitter = (1e-6 * scale_B + 1e-30)[:, None, None] * jnp.eye(k)[None]
    chol_BxKxK = jnp.linalg.cholesky(covariance_BxKxK + jitter)
    eps_SxBxK = jax.random.normal(key, (num_samples, *logits_BxK.shape), jnp.float32)
    draws_SxBxK = logits_BxK[None] + jnp.einsum("nkj,snj->snk", chol_BxKxK, eps_SxBxK,
                                                precision=_HIGHEST)
    return jnp.mean(jax.nn.softmax(draws_SxBxK, axis=-1), axis=0)


def _augmented(features_BxF: jax.Array) -> jax.Array:
    x = features_BxF.astype(jnp.float32)
    return jnp.concatenate([x, jnp.ones((x.shape[0], 1), x.dtype)], axis=1)


@dataclasses.dataclass(frozen=True)
class LastLayerLaplace(Softmax):
    """Softmax training; a last-layer Laplace posterior fitted after it (see the module)."""

    predictive: str = "probit"   # "probit" or "mc"
    num_samples: int = 100       # draws of the logits for "mc"
    curvature: str = "closed_form"   # who computes the GGN: "closed_form" or "laplax"

    name: ClassVar[str] = "laplace"
    needs_fit: ClassVar[bool] = True
    trains_as: ClassVar[str | None] = "softmax"
    # its prediction is not a function of the logits alone; the post-hoc scores of the same
    # network are the softmax run's
    posthoc_from_logits: ClassVar[bool] = False
    # the penultimate features: a protocol network's, or a user network's `features` method
    # (its contract checked before the first step)
    reads_features: ClassVar[bool] = True

    @classmethod
    def check_settings(cls, settings, num_classes: int) -> None:
        if settings["predictive"] not in laplace.PREDICTIVES:
            raise bad_setting("predictive", settings["predictive"],
                              f"allowed: {list(laplace.PREDICTIVES)}")
        if not settings["num_samples"] >= 1:
            raise bad_setting("num_samples", settings["num_samples"], "it must be >= 1")
        if settings["curvature"] not in CURVATURES:
            raise bad_setting("curvature", settings["curvature"],
                              f"allowed: {list(CURVATURES)}")

    @classmethod
    def build(cls, config, setup: MethodSetup) -> LastLayerLaplace:
        """`config.method="laplace"`: the softmax classifier's network and training."""
        settings = config.method_settings
        return cls(*build_models(config), setup.num_classes, **settings)

    def fit(self, variables: Variables, method_state: PyTree,
            batches: Iterable[tuple[jax.Array, jax.Array]],
            validation_batches: Iterable[tuple[jax.Array, jax.Array]] = ()) -> PyTree:
        """The posterior of the last layer: the GGN on `batches` (the training split), the
        prior precision on `validation_batches`. Deterministic (float64 on the host)."""
        del method_state
        outputs = jax.jit(lambda v, x: self.posthoc_outputs(v, x))

        def collect(pairs):
            out = [(outputs(variables, x), np.asarray(y)) for x, y in pairs]
            if not out:
                return None, None, None
            return tuple(np.concatenate([np.asarray(o[k], np.float64) for o, _ in out])
                         for k in ("features_BxF", "logits_BxK")) + (
                np.concatenate([y for _, y in out]),)

        train_NxF, train_logits_NxK, _ = collect(batches)
        val_MxF, _, val_labels_M = collect(validation_batches)
        if train_NxF is None or val_MxF is None:
            raise ValueError("config.method='laplace' fits its posterior on the training split "
                             "and its prior precision on the validation split: both must be "
                             "non-empty (config.val_fraction > 0)")
        # a protocol network's final Dense layer; a user network's kernel and bias pair that
        # computes its logits from its features
        last = self.last_layer(variables)
        if last is None:
            last = posthoc.linear_head(self.linear_head_candidates(variables), train_NxF,
                                       train_logits_NxK)
        if last is None:
            raise ValueError("config.method='laplace' needs a last layer that computes the "
                             "logits from the features, z = f W + b (a Dense kernel and bias); "
                             "no layer of this network does")
        ggn = laplax_last_layer_ggn(train_NxF, *last) if self.curvature == "laplax" else None
        fit, nlls = laplace.fit_prior_precision(train_NxF, *last, val_MxF, val_labels_M,
                                                kind=self.predictive,
                                                num_samples=self.num_samples, ggn_PxP=ggn)
        a, k = fit.theta_AxK.shape
        return {"covariance_AxKxAxK": jnp.asarray(fit.covariance_PxP.reshape(a, k, a, k),
                                                  jnp.float32),
                "prior_precision": jnp.asarray(fit.prior_precision, jnp.float32),
                "validation_nll": jnp.asarray(nlls[fit.prior_precision], jnp.float32)}

    def fit_summary(self, method_state: PyTree) -> dict[str, float]:
        if "prior_precision" not in method_state:
            return {}
        return {name: float(method_state[name]) for name in ("prior_precision",
                                                             "validation_nll")}

    def predict(self, variables: Variables, method_state, images_BxHxWxC: jax.Array,
                key: jax.Array) -> dict[str, jax.Array]:
        if "covariance_AxKxAxK" not in method_state:
            # before the fit (validation during training): the softmax classifier's
            # prediction, so the training, its best checkpoint included, is the softmax run's
            return super().predict(variables, method_state, images_BxHxWxC, key)
        out = self.posthoc_outputs(variables, images_BxHxWxC)
        logits_BxK = out["logits_BxK"].astype(jnp.float32)
        cov = method_state["covariance_AxKxAxK"]
        if self.predictive == "probit":
            probs = probit_predictive(logits_BxK, logit_variances(out["features_BxF"], cov))
        else:
            probs = mc_predictive(logits_BxK, logit_covariance(out["features_BxF"], cov), key,
                                  self.num_samples)
        return {"probs_BxK": probs}

    def describe(self) -> str:
        how = "probit" if self.predictive == "probit" else f"MC, T={self.num_samples}"
        by = ", GGN by laplax" if self.curvature == "laplax" else ""
        return f"last-layer Laplace ({how}{by})"
