"""Last-layer Laplace approximation of a softmax classifier, in closed form (float64 NumPy).

A trained network's last layer z = phi W + b (phi: the penultimate features, F of them; Flax's
`Dense` layout, W of shape (F, K)) gets a Gaussian posterior around its trained values
(MacKay 1992; Daxberger et al. 2021, "Laplace Redux", the last-layer case):

- parameters Theta = [W; b], shape (F + 1, K), flattened row-major (index a K + k), with the
  augmented features phi~ = [phi, 1];
- the precision is the generalized Gauss-Newton matrix of the training NLL plus an isotropic
  prior, H = sum_i (phi~_i phi~_i^T) (x) (diag(p_i) - p_i p_i^T) + lambda I. For a layer that is
  linear in its parameters under a softmax cross-entropy the GGN is the exact Hessian, so the
  tests compare it with finite differences of the gradient;
- the covariance C = H^{-1} (a Cholesky solve), of size ((F + 1) K)^2: 650 x 650 for the MNIST
  ConvNet's 64 features, 5,130 x 5,130 for VGG16's 512;
- for an input, the logits are Gaussian with mean mu = phi~ Theta and covariance
  Sigma[k, j] = sum_ab phi~_a phi~_b C[(a, k), (b, j)];
- the predictive is either the probit approximation softmax(mu_k / sqrt(1 + pi/8 Sigma_kk))
  (the "extended probit", Daxberger et al. eq. 13) or the Monte-Carlo mean of softmax(z) over
  z ~ N(mu, Sigma);
- the prior precision lambda is the one of a log-spaced grid that minimises the validation
  NLL of the predictive (Laplace Redux's "CV" choice), never fitted on the test set.
Everything is a function of arrays; the features and the layer come from the trained model.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
from scipy import linalg, special

from gedl_jax.evaluation import checks

PREDICTIVES = ("probit", "mc")
PRIOR_PRECISION_GRID = tuple(float(x) for x in np.logspace(-4, 4, 17))


@dataclasses.dataclass(frozen=True, eq=False)
class LastLayerLaplace:
    """The Gaussian posterior of the last layer: the trained Theta = [W; b] ((F + 1) x K), the
    covariance C ((F + 1) K square, row-major Theta), the prior precision, the training size."""

    theta_AxK: np.ndarray
    covariance_PxP: np.ndarray
    prior_precision: float
    num_train: int

    @property
    def num_classes(self) -> int:
        return self.theta_AxK.shape[1]


def _augmented(features_NxF: Any, num_features: int | None = None) -> np.ndarray:
    x = np.asarray(features_NxF, dtype=np.float64)
    if x.ndim != 2 or not np.all(np.isfinite(x)):
        raise ValueError(f"features_NxF must be a finite (N, F) array, got shape {x.shape}.")
    if num_features is not None and x.shape[1] != num_features:
        raise ValueError(f"features_NxF has {x.shape[1]} features, the layer {num_features}.")
    return np.concatenate([x, np.ones((x.shape[0], 1))], axis=1)


def _theta(weight_FxK: Any, bias_K: Any) -> np.ndarray:
    w, b = np.asarray(weight_FxK, dtype=np.float64), np.asarray(bias_K, dtype=np.float64)
    if w.ndim != 2 or b.shape != (w.shape[1],) or not (np.all(np.isfinite(w))
                                                        and np.all(np.isfinite(b))):
        raise ValueError(f"weight_FxK and bias_K must be finite with shapes (F, K) and (K,), "
                         f"got {w.shape} and {b.shape}.")
    return np.concatenate([w, b[None]], axis=0)


def last_layer_ggn(features_NxF: Any, weight_FxK: Any, bias_K: Any,
                   chunk: int = 4096) -> np.ndarray:
    """The GGN (= Hessian) of the summed softmax NLL with respect to Theta = [W; b], row-major:
    sum_i (phi~_i phi~_i^T) (x) (diag(p_i) - p_i p_i^T), shape ((F + 1) K, (F + 1) K)."""
    theta = _theta(weight_FxK, bias_K)
    phi = _augmented(features_NxF, theta.shape[0] - 1)
    a, k = theta.shape
    ggn = np.zeros((a, k, a, k))
    outer = np.zeros((a * k, a * k))
    for start in range(0, phi.shape[0], chunk):
        x = phi[start:start + chunk]
        p = special.softmax(x @ theta, axis=1)
        # sum_n x_a x_b (p_k delta_kj - p_k p_j): a block-diagonal part per class k, and one
        # matrix product for the outer products (x (x) p)(x (x) p)^T
        for c in range(k):
            ggn[:, c, :, c] += (x * p[:, c:c + 1]).T @ x
        y = (x[:, :, None] * p[:, None, :]).reshape(len(x), a * k)
        outer += y.T @ y
    return ggn.reshape(a * k, a * k) - outer


def fit_last_layer_laplace(train_features_NxF: Any, weight_FxK: Any, bias_K: Any,
                           prior_precision: float) -> LastLayerLaplace:
    """The posterior covariance (GGN + prior_precision I)^-1 around the trained layer."""
    checks.positive(prior_precision, "prior_precision")
    theta = _theta(weight_FxK, bias_K)
    precision = last_layer_ggn(train_features_NxF, weight_FxK, bias_K)
    precision[np.diag_indices_from(precision)] += prior_precision
    factor = linalg.cho_factor(precision, lower=True)
    covariance = linalg.cho_solve(factor, np.eye(precision.shape[0]))
    return LastLayerLaplace(theta_AxK=theta, covariance_PxP=0.5 * (covariance + covariance.T),
                            prior_precision=float(prior_precision),
                            num_train=int(np.asarray(train_features_NxF).shape[0]))


def logit_distribution(fit: LastLayerLaplace, features_NxF: Any
                       ) -> tuple[np.ndarray, np.ndarray]:
    """(mean mu (N, K), covariance Sigma (N, K, K)) of the logits under the posterior."""
    phi = _augmented(features_NxF, fit.theta_AxK.shape[0] - 1)
    a, k = fit.theta_AxK.shape
    c = fit.covariance_PxP.reshape(a, k, a, k)
    mean = phi @ fit.theta_AxK
    cov = np.empty((phi.shape[0], k, k))
    c_AxKAK = c.reshape(a, k * a * k)
    for start in range(0, phi.shape[0], 1024):   # phi C phi per example, by matrix products
        x = phi[start:start + 1024]
        left = (x @ c_AxKAK).reshape(len(x), k, a, k)
        cov[start:start + len(x)] = np.einsum("nkbj,nb->nkj", left, x)
    return mean, 0.5 * (cov + np.swapaxes(cov, 1, 2))


def predictive(fit: LastLayerLaplace, features_NxF: Any, kind: str = "probit",
               num_samples: int = 1000, seed: int = 0) -> np.ndarray:
    """Predictive class probabilities (N, K): "probit" (softmax(mu / sqrt(1 + pi/8 diag
    Sigma))) or "mc" (the mean softmax over `num_samples` draws of the logits, seeded)."""
    checks.one_of(kind, PREDICTIVES, "kind")
    mean, cov = logit_distribution(fit, features_NxF)
    if kind == "probit":
        scale = np.sqrt(1.0 + math.pi / 8.0 * np.einsum("nkk->nk", cov))
        return special.softmax(mean / scale, axis=1)
    checks.count(num_samples, "num_samples", 1)
    rng = np.random.default_rng(seed)
    # Sigma = L L^T per example (a tiny jitter where the posterior is flat in some direction)
    jitter = 1e-12 * np.eye(fit.num_classes)
    chol = np.linalg.cholesky(cov + jitter)
    eps = rng.standard_normal((num_samples, *mean.shape))
    logits = mean[None] + np.einsum("nkj,snj->snk", chol, eps)
    return special.softmax(logits, axis=2).mean(axis=0)


def _nll(probs_NxK: np.ndarray, labels_N: np.ndarray) -> float:
    rows = np.arange(labels_N.size)
    return float(-np.mean(np.log(np.clip(probs_NxK[rows, labels_N], 1e-12, 1.0))))


def fit_prior_precision(train_features_NxF: Any, weight_FxK: Any, bias_K: Any,
                        val_features_MxF: Any, val_labels_M: Any,
                        grid: tuple[float, ...] = PRIOR_PRECISION_GRID, kind: str = "probit",
                        num_samples: int = 1000, ggn_PxP: Any = None,
                        ) -> tuple[LastLayerLaplace, dict[float, float]]:
    """The fit whose prior precision, of `grid`, gives the lowest validation NLL of the
    `kind` predictive (`num_samples` draws for "mc"); also {prior precision: validation NLL}
    for every grid point. `ggn_PxP`: the training GGN computed elsewhere (the same matrix as
    `last_layer_ggn`'s, e.g. by laplax), else computed here."""
    labels = np.asarray(val_labels_M).astype(np.int64).reshape(-1)
    if labels.size != np.asarray(val_features_MxF).shape[0]:
        raise ValueError("val_labels_M must have one label per row of val_features_MxF.")
    theta = _theta(weight_FxK, bias_K)
    if ggn_PxP is None:
        ggn = last_layer_ggn(train_features_NxF, weight_FxK, bias_K)
    else:
        ggn = np.array(ggn_PxP, dtype=np.float64)
        if ggn.shape != (theta.size, theta.size):
            raise ValueError(f"ggn_PxP has shape {ggn.shape}, not ({theta.size}, {theta.size})")
    best, nlls = None, {}
    n = int(np.asarray(train_features_NxF).shape[0])
    for lam in grid:
        precision = ggn.copy()
        precision[np.diag_indices_from(precision)] += lam
        covariance = linalg.cho_solve(linalg.cho_factor(precision, lower=True),
                                      np.eye(precision.shape[0]))
        fit = LastLayerLaplace(theta, 0.5 * (covariance + covariance.T), float(lam), n)
        nlls[float(lam)] = _nll(predictive(fit, val_features_MxF, kind, num_samples), labels)
        if best is None or nlls[float(lam)] < nlls[best.prior_precision]:
            best = fit
    return best, nlls
