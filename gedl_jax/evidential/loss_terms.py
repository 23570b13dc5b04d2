"""Per-example likelihood terms and regularisers of the EDL family (paper Eq. elbo; Appendix
propositions closed-form and MSE-loss; for EDL, I-EDL, R-EDL and RED the public reference code,
named where a function follows it).

Every function returns one value per example (shape = the leading batch shape); callers reduce.
Labels are integer class indices in [0, K) of shape (...) (never one-hot). An out-of-range label
(e.g. -1 used as padding) yields NaN, so it cannot silently train on a wrong class: mask padded
examples with `jnp.where`, not by multiplying.

Numerics: the complement S - alpha_k is formed without cancellation (`complement_sum`), so
1 - p_y, log(S / alpha_y) and psi(S) - psi(alpha_y) keep float32 relative precision for confident
predictions (alpha_y = S (1 - 1e-7)) where the textbook expressions round to 0; p and 1 - p are
written so that their derivatives keep it too (`stable_probabilities`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

from gedl_jax.evidential.special import (
    complement_sum,
    digamma_minus_log_diff,
    stable_probabilities,
    trigamma,
)


def _take_label(x_BxK: jax.Array, labels_B: jax.Array) -> jax.Array:
    """x[..., y]; NaN for a label outside [0, K) (negative labels are not wrapped)."""
    labels_B = jnp.asarray(labels_B)
    return jnp.take_along_axis(x_BxK, labels_B[..., None], axis=-1, mode="fill",
                               wrap_negative_indices=False)[..., 0]


def _label_mask(labels_B: ArrayLike, num_classes: int) -> jax.Array:
    """One-hot boolean mask (..., K) of the labels (all False for an out-of-range label)."""
    return jax.nn.one_hot(jnp.asarray(labels_B), num_classes, dtype=jnp.bool_)


def expected_nll(alpha_BxK: ArrayLike, labels_B: ArrayLike) -> jax.Array:
    """E_{pi ~ Dir(alpha)}[-log pi_y] = psi(S) - psi(alpha_y) (Appendix proposition closed-form).

    The data term of GEDL's Eq. elbo (the paper's E[-log pi_y], not log S - log alpha_y);
    Sensoy's "Eq. 4" and PostNet's UCE.
    Evaluated as log1p((S - alpha_y) / alpha_y) + [d(S) - d(alpha_y)], d(x) = psi(x) - log x, with
    the complement summed over the other classes and d(S) - d(alpha_y) integrated when
    alpha_y ~ S, so a confident prediction's tiny loss is not lost to cancellation.

    Args:
      alpha_BxK: concentrations, shape (..., K).
      labels_B: integer labels, shape (...).

    Returns:
      Per-example loss, shape (...), >= 0.

    Example:
      >>> alpha_BxK = jnp.array([[5.0, 1.0, 2.0], [5.0, 1.0, 2.0]])
      >>> print(np.asarray(ev.expected_nll(alpha_BxK, jnp.array([0, 1]))).round(4))
      [0.5095 2.5929]
    """
    alpha_BxK = jnp.asarray(alpha_BxK)
    strength_B = jnp.sum(alpha_BxK, axis=-1)
    alpha_y_B = _take_label(alpha_BxK, labels_B)
    rest_y_B = _take_label(complement_sum(alpha_BxK), labels_B)
    return (jnp.log1p(rest_y_B / alpha_y_B)
            + digamma_minus_log_diff(alpha_y_B, rest_y_B, strength_B))


def log_nll(alpha_BxK: ArrayLike, labels_B: ArrayLike) -> jax.Array:
    """-log E[pi_y] = log S - log alpha_y (Sensoy et al. "Eq. 3"; not GEDL's term, variants 9.10).

    Evaluated as log1p((S - alpha_y) / alpha_y).

    Args:
      alpha_BxK: concentrations, shape (..., K).
      labels_B: integer labels, shape (...).

    Returns:
      Per-example loss, shape (...), >= 0.

    Example:
      >>> alpha_BxK = jnp.array([[5.0, 1.0, 2.0], [5.0, 1.0, 2.0]])
      >>> print(np.asarray(ev.log_nll(alpha_BxK, jnp.array([0, 1]))).round(4))  # log(8/5), log(8)
      [0.47   2.0794]
    """
    alpha_BxK = jnp.asarray(alpha_BxK)
    alpha_y_B = _take_label(alpha_BxK, labels_B)
    rest_y_B = _take_label(complement_sum(alpha_BxK), labels_B)
    return jnp.log1p(rest_y_B / alpha_y_B)


def _squared_error_and_variance(alpha_BxK: jax.Array, labels_B: ArrayLike):
    """Per-class (y_k - p_k)**2 and Var[pi_k] = p_k (1 - p_k) / (S + 1), both (..., K)."""
    strength_B, p_BxK, one_minus_p_BxK, _ = stable_probabilities(alpha_BxK)
    is_label_BxK = _label_mask(labels_B, alpha_BxK.shape[-1])
    # 1 - p_y comes from the complement sum; NaN for an out-of-range label.
    labels_B = jnp.asarray(labels_B)
    label_ok_B = (labels_B >= 0) & (labels_B < alpha_BxK.shape[-1])
    residual_BxK = jnp.where(is_label_BxK, one_minus_p_BxK, p_BxK)
    residual_BxK = jnp.where(label_ok_B[..., None], residual_BxK, jnp.nan)
    variance_BxK = p_BxK * one_minus_p_BxK / (strength_B + 1.0)[..., None]
    return residual_BxK * residual_BxK, variance_BxK


def expected_mse(alpha_BxK: ArrayLike, labels_B: ArrayLike,
                 include_variance: bool = True) -> jax.Array:
    """E_{pi ~ Dir(alpha)} ||y - pi||^2 (Appendix proposition MSE-loss):

        sum_k (y_k - p_k)^2 + sum_k alpha_k (S - alpha_k) / (S^2 (S + 1)).

    EDL's MSE loss (Sensoy et al. "Eq. 5"; Appendix proposition MSE-loss). R-EDL drops the
    variance term (`include_variance=False`; github.com/MengyuanChen21/ICLR2024-REDL,
    code_classical/models/ModifiedEvidentialN.py).

    Args:
      alpha_BxK: concentrations, shape (..., K).
      labels_B: integer labels, shape (...).
      include_variance: a static Python bool; add sum_k Var[pi_k].

    Returns:
      Per-example loss, shape (...), >= 0.

    Example:
      >>> alpha_BxK = jnp.array([[5.0, 1.0, 2.0]])
      >>> print(np.asarray(ev.expected_mse(alpha_BxK, jnp.array([0]))).round(4))
      [0.2778]
      >>> no_var_B = ev.expected_mse(alpha_BxK, jnp.array([0]), include_variance=False)
      >>> print(np.asarray(no_var_B).round(4))  # R-EDL's form
      [0.2188]
    """
    squared_BxK, variance_BxK = _squared_error_and_variance(jnp.asarray(alpha_BxK), labels_B)
    loss_B = jnp.sum(squared_BxK, axis=-1)
    if include_variance:
        loss_B = loss_B + jnp.sum(variance_BxK, axis=-1)
    return loss_B


def fisher_weighted_mse(alpha_BxK: ArrayLike, labels_B: ArrayLike) -> jax.Array:
    """I-EDL's Fisher-weighted squared error sum_k (y_k - p_k)^2 psi1(alpha_k).

    As in github.com/danruod/IEDL, code_classical/models/FisherEvidentialN.py.

    Args:
      alpha_BxK: concentrations, shape (..., K).
      labels_B: integer labels, shape (...).

    Returns:
      Per-example loss, shape (...), >= 0.

    Example:
      >>> alpha_BxK = jnp.array([[5.0, 1.0, 2.0]])
      >>> print(np.asarray(ev.fisher_weighted_mse(alpha_BxK, jnp.array([0]))).round(4))
      [0.0971]
    """
    alpha_BxK = jnp.asarray(alpha_BxK)
    squared_BxK, _ = _squared_error_and_variance(alpha_BxK, labels_B)
    return jnp.sum(squared_BxK * trigamma(alpha_BxK), axis=-1)


def fisher_weighted_variance(alpha_BxK: ArrayLike) -> jax.Array:
    """I-EDL's Fisher-weighted variance sum_k alpha_k (S - alpha_k) / (S^2 (S + 1)) psi1(alpha_k)
    (github.com/danruod/IEDL, code_classical/models/FisherEvidentialN.py).

    Args:
      alpha_BxK: concentrations, shape (..., K).

    Returns:
      Per-example value, shape (...), >= 0.

    Example:
      >>> print(np.asarray(ev.fisher_weighted_variance(jnp.array([[5.0, 1.0, 2.0]]))).round(4))
      [0.0392]
    """
    alpha_BxK = jnp.asarray(alpha_BxK)
    strength_B, p_BxK, one_minus_p_BxK, _ = stable_probabilities(alpha_BxK)
    variance_BxK = p_BxK * one_minus_p_BxK / (strength_B + 1.0)[..., None]
    return jnp.sum(variance_BxK * trigamma(alpha_BxK), axis=-1)


def masked_kl_target(alpha_BxK: ArrayLike, labels_B: ArrayLike,
                     prior_alpha_BxK: ArrayLike) -> jax.Array:
    """alpha~ = y * prior_alpha + (1 - y) * alpha: the true class reset to its prior value.

    EDL's "KL only on misleading evidence" (Sensoy et al.; the same in the I-EDL and R-EDL
    reference code): every example gets a KL term, on alpha~; no example is selected. With
    prior_alpha = 1 this is Sensoy's (alpha - 1)(1 - y) + 1; R-EDL resets to lambda
    (prior_alpha = lambda). The reset class gets no gradient. An
    out-of-range label resets nothing.

    Args:
      alpha_BxK: concentrations, shape (..., K).
      labels_B: integer labels, shape (...).
      prior_alpha_BxK: the prior concentrations, broadcastable to (..., K) (a scalar works).

    Returns:
      alpha~_BxK, shape (..., K).

    Example:
      >>> alpha_BxK = jnp.array([[5.0, 1.0, 2.0]])
      >>> print(ev.masked_kl_target(alpha_BxK, jnp.array([0]), jnp.ones((1, 3))))
      [[1. 1. 2.]]
    """
    alpha_BxK = jnp.asarray(alpha_BxK)
    prior_BxK = jnp.broadcast_to(jnp.asarray(prior_alpha_BxK, dtype=alpha_BxK.dtype),
                                 alpha_BxK.shape)
    return jnp.where(_label_mask(labels_B, alpha_BxK.shape[-1]), prior_BxK, alpha_BxK)


def red_regularizer(logits_BxK: ArrayLike, labels_B: ArrayLike,
                    uncertainty_B: ArrayLike) -> jax.Array:
    """RED's correct-evidence regulariser -stop_gradient(u) * o_y (Pandey & Yu 2023).

    On the raw pre-activation logit o_y of the ground-truth class, for every example (not only
    correctly classified ones), with u = W / S under stop-gradient and coefficient 1, as RED's code
    (github.com/pandeydeep9/EvidentialResearch2023, MainMnistExperiment/losses.py) applies it.
    Its gradient is -u on the true-class logit and 0 elsewhere, even where ReLU evidence is 0.

    Args:
      logits_BxK: pre-activation network outputs, shape (..., K).
      labels_B: integer labels, shape (...).
      uncertainty_B: the uncertainty mass u, shape (...).

    Returns:
      Per-example regulariser, shape (...).

    Example:
      >>> logits_BxK = jnp.array([[2.0, 0.0, -1.0]])
      >>> print(ev.red_regularizer(logits_BxK, jnp.array([0]), jnp.array([0.25])))  # -u * logit_y
      [-0.5]
    """
    logit_y_B = _take_label(jnp.asarray(logits_BxK), labels_B)
    return -jax.lax.stop_gradient(jnp.asarray(uncertainty_B)) * logit_y_B
