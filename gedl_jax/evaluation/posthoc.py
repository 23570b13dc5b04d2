"""Post-hoc OOD scores of a trained classifier, from its logits and (where the network exposes
them through ``features_and_logits``) its penultimate features. Float64 NumPy on the host.

Every score is oriented like the others in ``gedl_jax.evaluation.scores``: **higher = more
in-distribution / more confident**, so the ranking metrics take it as given. Scores that need
training statistics come as a pair of pure functions: ``fit_*`` takes arrays of the *training*
split (features, labels, the last layer's weights) and returns a small frozen fit; ``*_score``
takes the fit and any features / logits (test, OOD). Nothing here reads a run.

Score names (``POSTHOC_SCORE_NAMES``) and definitions, for logits z (N, K), features x (N, F):

  "msp"               max_k softmax(z)_k (Hendrycks & Gimpel, 2017); the "mp" of a softmax
                      network.
  "max_logit"         max_k z_k (Hendrycks et al., 2022).
  "energy"            T logsumexp(z / T), the negative free energy (Liu et al., 2020); T = 1 by
                      default.
  "neg_entropy"       -H(softmax(z)) = sum_k p_k log p_k (natural log).
  "neg_mahalanobis"   -min_k (x - mu_k)^T Sigma^+ (x - mu_k) (Lee et al., 2018): class means
                      mu_k and one shared covariance Sigma = 1/N sum_i (x_i - mu_{y_i})(...)^T,
                      both from the training features; Sigma^+ its pseudo-inverse (features after
                      a ReLU are often rank-deficient). The *squared* distance, as the paper's
                      confidence score and sklearn's ``EmpiricalCovariance.mahalanobis``; the
                      square root would rank identically.
  "neg_knn_distance"  -||x/||x|| - x_(k)/||x_(k)||||, the Euclidean distance from the
                      L2-normalised feature to its k-th nearest L2-normalised training feature
                      (Sun et al., 2022; Euclidean on the unit sphere, sqrt(2 - 2 cos), ranks as
                      the cosine distance). Default k = 50, the paper's choice for CIFAR-10 with
                      the full training set (``KNN_DEFAULT_K``).
  "vim"               Virtual-logit matching (Wang et al., 2022), for a network whose last layer
                      is linear, z = x W + b (W of shape (F, K), Flax's kernel layout): origin
                      o = -pinv(W^T) b (the least-squares point with zero logits); principal
                      subspace P = the top-D eigenvectors of the uncentred second moment
                      1/N sum_i (x_i - o)(x_i - o)^T of the training features; residual
                      x_res = (I - P P^T)(x - o); alpha = sum_i max_k z_ik / sum_i ||x_res,i||
                      over the training set; score = logsumexp(z) - alpha ||x_res||, the energy
                      minus the virtual logit. D defaults to the paper's rule
                      (``vim_default_dim``): 1000 if F >= 2048, 512 if F >= 768, else F // 2.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from scipy import special

from gedl_jax.evaluation import checks

__all__ = ["FEATURE_SCORE_NAMES", "KNN_DEFAULT_K", "LOGIT_SCORE_NAMES", "POSTHOC_SCORE_NAMES",
           "KnnFit", "MahalanobisFit", "PosthocOptions", "VimFit", "energy_score", "fit_knn",
           "fit_mahalanobis", "fit_posthoc", "fit_vim", "knn_score", "logit_scores",
           "mahalanobis_score", "max_logit_score", "msp_score", "neg_entropy_score",
           "posthoc_scores", "vim_default_dim", "vim_score"]

# Scores of logits alone, then the scores that also need features (and a training fit).
LOGIT_SCORE_NAMES: tuple[str, ...] = ("msp", "max_logit", "energy", "neg_entropy")
FEATURE_SCORE_NAMES: tuple[str, ...] = ("neg_mahalanobis", "neg_knn_distance", "vim")
POSTHOC_SCORE_NAMES: tuple[str, ...] = LOGIT_SCORE_NAMES + FEATURE_SCORE_NAMES
KNN_DEFAULT_K = 50

_CHUNK = 2048   # rows per block of the pairwise distances (memory: _CHUNK x num_train floats)
# KNN's block of rows: its (rows, num_train) distances are updated in place and partitioned. 512
# rows (200 MB against MNIST's 48k training features) instead of 2048 blocks with temporaries:
# `python -m gedl_jax.evaluate --pretrained=mnist/gedl` took 63 s instead of 85 s on 2 CPU cores.
_KNN_CHUNK = 512
# The sample of each row's columns whose k-th smallest bounds the row's (`_kth_smallest_per_row`):
# at least _KNN_SAMPLE_PER_K x k and _KNN_MIN_SAMPLE columns, so about N / _KNN_SAMPLE_PER_K
# values per row (N / 32 against MNIST: 1.5k of 48k) are left to partition. The evaluation above
# then took 57 s instead of 70 s; its line for the test set's post-hoc scores (10,000 images,
# their network pass and KNN) read 7.0 s and 6.8 s in two runs instead of 9.4 s.
_KNN_SAMPLE_PER_K = 32
_KNN_MIN_SAMPLE = 1024


# ------------------------------------------------------------------------------------- inputs
def _finite_matrix(x: Any, name: str, min_columns: int = 1) -> np.ndarray:
    return checks.finite(checks.matrix(x, name, min_columns, need_examples=True), name)


def _logits(logits_NxK: Any) -> np.ndarray:
    return _finite_matrix(logits_NxK, "logits_NxK", min_columns=2)


def _features(features_NxF: Any, num_features: int | None = None,
              name: str = "features_NxF") -> np.ndarray:
    x = _finite_matrix(features_NxF, name)
    if num_features is not None and x.shape[1] != num_features:
        raise ValueError(f"{name} has {x.shape[1]} features, the fit has {num_features}.")
    return x


# ----------------------------------------------------------------------- scores of the logits
def msp_score(logits_NxK: Any) -> np.ndarray:
    """max_k softmax(z)_k, (N,) float64.

    >>> msp_score(np.array([[np.log(3.0), 0.0]])).round(4).tolist()
    [0.75]
    """
    z = _logits(logits_NxK)
    return np.exp(z.max(axis=1) - special.logsumexp(z, axis=1))


def max_logit_score(logits_NxK: Any) -> np.ndarray:
    """max_k z_k, (N,) float64."""
    return _logits(logits_NxK).max(axis=1)


def energy_score(logits_NxK: Any, temperature: float = 1.0) -> np.ndarray:
    """T logsumexp(z / T), (N,) float64 (the negative free energy; higher = more ID).

    >>> energy_score(np.array([[0.0, 0.0]])).round(4).tolist()
    [0.6931]
    """
    t = checks.positive(temperature, "temperature")
    return t * special.logsumexp(_logits(logits_NxK) / t, axis=1)


def neg_entropy_score(logits_NxK: Any) -> np.ndarray:
    """-H(softmax(z)) = sum_k p_k log p_k, (N,) float64, from log-softmax (no log of 0).

    >>> neg_entropy_score(np.array([[0.0, 0.0]])).round(4).tolist()
    [-0.6931]
    """
    z = _logits(logits_NxK)
    log_p = z - special.logsumexp(z, axis=1, keepdims=True)
    return np.sum(np.exp(log_p) * log_p, axis=1)


def logit_scores(logits_NxK: Any, temperature: float = 1.0) -> dict[str, np.ndarray]:
    """Every score of ``LOGIT_SCORE_NAMES`` ({name: (N,) float64}); `temperature` is energy's."""
    return {"msp": msp_score(logits_NxK), "max_logit": max_logit_score(logits_NxK),
            "energy": energy_score(logits_NxK, temperature),
            "neg_entropy": neg_entropy_score(logits_NxK)}


# --------------------------------------------------------------------------------- Mahalanobis
@dataclasses.dataclass(frozen=True, eq=False)
class MahalanobisFit:
    """Class means (K, F) and the pseudo-inverse (F, F) of the shared training covariance.
    A class absent from the training labels has no mean and is skipped (``class_present``)."""

    means_KxF: np.ndarray
    precision_FxF: np.ndarray
    class_present_K: np.ndarray


def fit_mahalanobis(train_features_NxF: Any, train_labels_N: Any,
                    num_classes: int | None = None) -> MahalanobisFit:
    """Class means and shared covariance Sigma = 1/N sum_i (x_i - mu_{y_i})(x_i - mu_{y_i})^T
    of the **training** features (module docstring); the precision is pinv(Sigma) (symmetric).

    Args:
      train_features_NxF: penultimate features of the training split.
      train_labels_N: their labels.
      num_classes: K (default: max label + 1).
    """
    x = _features(train_features_NxF, name="train_features_NxF")
    k = None if num_classes is None else int(num_classes)
    y = checks.class_labels(train_labels_N, x.shape[0], k, "train_labels_N")
    k = int(y.max()) + 1 if k is None else k
    counts = np.bincount(y, minlength=k)
    sums = np.zeros((k, x.shape[1]))
    np.add.at(sums, y, x)
    present = counts > 0
    means = np.where(present[:, None], sums / np.maximum(counts, 1)[:, None], 0.0)
    centred = x - means[y]
    covariance = centred.T @ centred / x.shape[0]
    return MahalanobisFit(means_KxF=means, precision_FxF=np.linalg.pinv(covariance,
                                                                         hermitian=True),
                          class_present_K=present)


def mahalanobis_score(fit: MahalanobisFit, features_NxF: Any) -> np.ndarray:
    """-min_k (x - mu_k)^T Sigma^+ (x - mu_k), (N,) float64 (higher = closer to a class)."""
    x = _features(features_NxF, fit.means_KxF.shape[1])
    means = fit.means_KxF[fit.class_present_K]
    # (x - mu)^T P (x - mu) = x^T P x - 2 x^T P mu + mu^T P mu, blockwise over examples.
    p_mu = means @ fit.precision_FxF                                      # (K, F)
    mu_p_mu = np.einsum("kf,kf->k", p_mu, means)
    out = np.empty(x.shape[0])
    for start in range(0, x.shape[0], _CHUNK):
        xb = x[start:start + _CHUNK]
        x_p_x = np.einsum("nf,fg,ng->n", xb, fit.precision_FxF, xb)
        d2 = x_p_x[:, None] - 2.0 * xb @ p_mu.T + mu_p_mu[None, :]
        out[start:start + _CHUNK] = -np.maximum(d2, 0.0).min(axis=1)
    return out


# ------------------------------------------------------------------------------------------ KNN
@dataclasses.dataclass(frozen=True, eq=False)
class KnnFit:
    """The L2-normalised training features (N, F) and k. Memory: N x F float64 (MNIST's 50k
    training examples with 128 features: 51 MB)."""

    normalised_train_NxF: np.ndarray
    k: int


def _normalise(x: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    if np.any(norm == 0):
        raise ValueError("a feature vector is all zeros; it has no direction to normalise.")
    return x / norm


def fit_knn(train_features_NxF: Any, k: int = KNN_DEFAULT_K) -> KnnFit:
    """Normalises the **training** features for ``knn_score`` (k-th neighbour, k >= 1)."""
    x = _features(train_features_NxF, name="train_features_NxF")
    if int(k) != k or not 1 <= k <= x.shape[0]:
        raise ValueError(f"k must be an integer in [1, {x.shape[0]}] (the training size), "
                         f"got {k}.")
    return KnnFit(normalised_train_NxF=_normalise(x), k=int(k))


def knn_score(fit: KnnFit, features_NxF: Any) -> np.ndarray:
    """-(Euclidean distance from the normalised feature to its k-th nearest normalised training
    feature), (N,) float64. The training set itself is not excluded (score training features
    with k + 1 to skip each one's own zero distance)."""
    train = fit.normalised_train_NxF
    x = _normalise(_features(features_NxF, train.shape[1]))
    out = np.empty(x.shape[0])
    for start in range(0, x.shape[0], _KNN_CHUNK):
        # ||a - b||^2 = 2 - 2 a.b on the unit sphere, in place (no block-sized temporaries).
        d2 = x[start:start + _KNN_CHUNK] @ train.T
        d2 *= -2.0
        d2 += 2.0
        np.maximum(d2, 0.0, out=d2)
        out[start:start + _KNN_CHUNK] = -np.sqrt(_kth_smallest_per_row(d2, fit.k))
    return out


def _kth_smallest_per_row(values_RxN: np.ndarray, k: int) -> np.ndarray:
    """The k-th smallest value of each row (R,), exactly ``np.partition(values_RxN, k - 1,
    axis=1)[:, k - 1]`` (1 <= k <= N; no NaN), which it may reorder in place.

    Partitioning every full row was most of the KNN score's time (MNIST: 48k columns per row).
    Instead, the k-th smallest of a strided sample of each row's columns bounds the row's k-th
    smallest from above (a subset's k smallest are k values of the row), so the row's k-th
    smallest is the k-th smallest of its values at or below that bound: a few times k values
    per row instead of N, the same value whatever the sample (exactness does not depend on it,
    only the speed)."""
    rows, n = values_RxN.shape
    stride = n // max(_KNN_SAMPLE_PER_K * k, _KNN_MIN_SAMPLE)
    if stride < 2:   # the sample would be most of the row: partition the row itself
        values_RxN.partition(k - 1, axis=1)
        return values_RxN[:, k - 1].copy()
    sample_RxM = values_RxN[:, ::stride].copy()
    sample_RxM.partition(k - 1, axis=1)
    bound_R = sample_RxM[:, k - 1]
    kept_RxN = values_RxN <= bound_R[:, None]
    kept_values = values_RxN[kept_RxN]   # row by row, as the row-major mask orders them
    ends_R = np.cumsum(np.count_nonzero(kept_RxN, axis=1))
    out_R = np.empty(rows, values_RxN.dtype)
    start = 0
    for r, end in enumerate(ends_R):
        row_kept = kept_values[start:end]
        row_kept.partition(k - 1)
        out_R[r] = row_kept[k - 1]
        start = end
    return out_R


# ------------------------------------------------------------------------------------------ ViM
@dataclasses.dataclass(frozen=True, eq=False)
class VimFit:
    """origin (F,), the orthonormal basis (F, F - D) of the residual space, alpha, D."""

    origin_F: np.ndarray
    residual_basis_FxR: np.ndarray
    alpha: float
    principal_dim: int


def vim_default_dim(num_features: int) -> int:
    """The paper's principal dimension D: 1000 if F >= 2048, 512 if F >= 768, else F // 2.

    >>> vim_default_dim(2048), vim_default_dim(768), vim_default_dim(128)
    (1000, 512, 64)
    """
    f = int(num_features)
    return 1000 if f >= 2048 else 512 if f >= 768 else f // 2


def fit_vim(train_features_NxF: Any, train_logits_NxK: Any, weight_FxK: Any, bias_K: Any,
            principal_dim: int | None = None) -> VimFit:
    """ViM's origin, residual space and alpha from the **training** features and logits and the
    last linear layer z = x W + b (module docstring).

    Args:
      train_features_NxF, train_logits_NxK: the training split's features and logits.
      weight_FxK, bias_K: the last layer (Flax ``Dense`` kernel and bias).
      principal_dim: D, in [1, F - 1]; None = ``vim_default_dim(F)``.
    """
    x = _features(train_features_NxF, name="train_features_NxF")
    z = _logits(train_logits_NxK)
    if z.shape[0] != x.shape[0]:
        raise ValueError(f"train_features_NxF has {x.shape[0]} rows, train_logits_NxK "
                         f"{z.shape[0]}.")
    w = _finite_matrix(weight_FxK, "weight_FxK", min_columns=2)
    b = np.asarray(bias_K, dtype=np.float64)
    f, k = x.shape[1], z.shape[1]
    if w.shape != (f, k) or b.shape != (k,) or not np.all(np.isfinite(b)):
        raise ValueError(f"weight_FxK and bias_K must have shapes ({f}, {k}) and ({k},) and be "
                         f"finite, got {w.shape} and {b.shape}.")
    d = vim_default_dim(f) if principal_dim is None else principal_dim
    if int(d) != d or not 1 <= d < f:
        raise ValueError(f"principal_dim must be an integer in [1, {f - 1}], got {d}.")
    d = int(d)
    origin = -np.linalg.pinv(w.T) @ b
    centred = x - origin
    _, eigenvectors = np.linalg.eigh(centred.T @ centred / x.shape[0])   # ascending eigenvalues
    residual_basis = eigenvectors[:, :f - d]                              # all but the top D
    residual_norm = np.linalg.norm(centred @ residual_basis, axis=1)
    total = residual_norm.sum()
    if total <= 0:
        raise ValueError("the training features have no residual beyond the principal space "
                         f"(D = {d}); choose a smaller principal_dim.")
    return VimFit(origin_F=origin, residual_basis_FxR=residual_basis,
                  alpha=float(z.max(axis=1).sum() / total), principal_dim=d)


def vim_score(fit: VimFit, features_NxF: Any, logits_NxK: Any) -> np.ndarray:
    """logsumexp(z) - alpha ||x_res||, (N,) float64 (higher = more in-distribution)."""
    x = _features(features_NxF, fit.origin_F.shape[0])
    z = _logits(logits_NxK)
    if z.shape[0] != x.shape[0]:
        raise ValueError(f"features_NxF has {x.shape[0]} rows, logits_NxK {z.shape[0]}.")
    residual_norm = np.linalg.norm((x - fit.origin_F) @ fit.residual_basis_FxR, axis=1)
    return special.logsumexp(z, axis=1) - fit.alpha * residual_norm


# ------------------------------------------------------------------------- several at once
@dataclasses.dataclass(frozen=True)
class PosthocOptions:
    """Which post-hoc scores to compute and their settings.

    scores: names from ``POSTHOC_SCORE_NAMES`` (default: none); temperature: energy's T;
    knn_k: KNN's k; vim_dim: ViM's D (None = ``vim_default_dim``)."""

    scores: tuple[str, ...] = ()
    temperature: float = 1.0
    knn_k: int = KNN_DEFAULT_K
    vim_dim: int | None = None

    def __post_init__(self):
        object.__setattr__(self, "scores", tuple(self.scores))
        checks.known(self.scores, POSTHOC_SCORE_NAMES, "post-hoc scores")

    @property
    def needs_features(self) -> bool:
        """Whether a score needs penultimate features (and a fit on the training split)."""
        return any(s in FEATURE_SCORE_NAMES for s in self.scores)


# A candidate reproduces the logits when |f W + b - z| <= this x (|f| |W| + |b|) everywhere: far
# above float32's and TF32's rounding (2^-24, 2^-11 a product) and bfloat16's (2^-8), and far
# below what a layer that does not compute the logits misses by.
_HEAD_RELATIVE_TOLERANCE = 2.0 ** -6


def linear_head(candidates, features_NxF: Any, logits_NxK: Any
                ) -> tuple[np.ndarray, np.ndarray] | None:
    """The first (weight_FxK, bias_K) among `candidates` (a user network's kernel and bias
    pairs, `Method.linear_head_candidates`) with which the features give the logits,
    z = f W + b, on these examples (the training split's): ViM's last layer where the network
    does not name it. None when no candidate does (a head that is not one linear layer on
    the features): ViM is then left out."""
    f, z = _finite_matrix(features_NxF, "features_NxF"), _logits(logits_NxK)
    for weight, bias in candidates:
        w, b = np.asarray(weight, np.float64), np.asarray(bias, np.float64)
        if w.shape != (f.shape[1], z.shape[1]) or b.shape != (z.shape[1],):
            continue
        bound = _HEAD_RELATIVE_TOLERANCE * (np.abs(f) @ np.abs(w) + np.abs(b)) + 1e-6
        if np.all(np.abs(f @ w + b - z) <= bound):
            return w, b
    return None


def fit_posthoc(options: PosthocOptions, train_features_NxF: Any = None,
                train_labels_N: Any = None, train_logits_NxK: Any = None,
                last_layer: tuple[Any, Any] | None = None) -> dict[str, Any]:
    """The training-split fits the feature scores of `options` need ({score: fit}; empty for
    logit scores alone). `last_layer` = (weight_FxK, bias_K) is ViM's."""
    fits: dict[str, Any] = {}
    if not options.needs_features:
        return fits
    if train_features_NxF is None:
        raise ValueError(f"the scores {[s for s in options.scores if s in FEATURE_SCORE_NAMES]} "
                         "need the training split's features.")
    if "neg_mahalanobis" in options.scores:
        if train_labels_N is None:
            raise ValueError("neg_mahalanobis needs the training split's labels.")
        k = None if train_logits_NxK is None else np.asarray(train_logits_NxK).shape[1]
        fits["neg_mahalanobis"] = fit_mahalanobis(train_features_NxF, train_labels_N, k)
    if "neg_knn_distance" in options.scores:
        fits["neg_knn_distance"] = fit_knn(train_features_NxF, options.knn_k)
    if "vim" in options.scores:
        if last_layer is None or train_logits_NxK is None:
            raise ValueError("vim needs the last linear layer (weight_FxK, bias_K) and the "
                             "training split's logits.")
        fits["vim"] = fit_vim(train_features_NxF, train_logits_NxK, *last_layer,
                              principal_dim=options.vim_dim)
    return fits


def posthoc_scores(options: PosthocOptions, fits: dict[str, Any], logits_NxK: Any,
                   features_NxF: Any = None) -> dict[str, np.ndarray]:
    """{score: (N,) float64} for every score of `options`, with the fits of ``fit_posthoc``.

    >>> posthoc_scores(PosthocOptions(("max_logit", "energy")), {}, np.zeros((1, 2)))
    {'max_logit': array([0.]), 'energy': array([0.69314718])}
    """
    by_logits = {"msp": msp_score, "max_logit": max_logit_score,
                 "energy": lambda z: energy_score(z, options.temperature),
                 "neg_entropy": neg_entropy_score}
    out: dict[str, np.ndarray] = {}
    for name in options.scores:
        if name in by_logits:
            out[name] = by_logits[name](logits_NxK)
            continue
        if features_NxF is None or name not in fits:
            raise ValueError(f"{name} needs features and its training fit (fit_posthoc).")
        if name == "neg_mahalanobis":
            out[name] = mahalanobis_score(fits[name], features_NxF)
        elif name == "neg_knn_distance":
            out[name] = knn_score(fits[name], features_NxF)
        else:
            out[name] = vim_score(fits[name], features_NxF, logits_NxK)
    return out
