"""Composes the evidential math core into one variant's training loss, from the configuration.

Every variant is the same function with different settings (paper Table unified_edl):

    loss_i = likelihood(alpha_i, y_i)                       # E_q[-log p(y|pi)] or a Gibbs loss
           + (1/tau_t) * KL(Dir(target_i) || Dir(W_i a))     # Eq. elbo; EDL masks the target
           + fisher_c * (-log det I(alpha_i))                # I-EDL
           + red_w * (-stopgrad(u_i) * logit_{i,y})          # RED

with alpha = e + W a (Eq. e2alpha), W fixed or adaptive (Eq. weight_update) and 1/tau from EDL's
annealing or GEDL's accumulated strength (Eq. tau_schedule). W and 1/tau are stop-gradient.
The function returns per-example losses; the caller reduces (and averages across devices).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from gedl_jax.evidential.activations import evidence_from_logits
from gedl_jax.evidential.dirichlet import dirichlet_kl, fisher_logdet
from gedl_jax.evidential.loss_terms import (
    expected_mse,
    expected_nll,
    fisher_weighted_mse,
    fisher_weighted_variance,
    log_nll,
    masked_kl_target,
    red_regularizer,
)
from gedl_jax.evidential.prior import (
    adaptive_prior_strength,
    dirichlet_alpha,
    dirichlet_strength,
    fixed_prior_strength,
    uncertainty_mass,
    uniform_base_rate,
)
from gedl_jax.evidential.schedules import TauState, edl_annealing, gedl_tau, tau_accumulate


@dataclasses.dataclass(frozen=True)
class LossSpec:
    """The static (hashable) part of a variant: everything the loss needs from the config."""

    num_classes: int
    evidence: str = "softplus"
    exp_clip: float = 10.0
    base_rate: tuple[float, ...] | None = None   # None -> uniform 1/K
    prior_strength: str = "adaptive"
    prior_strength_value: float = 10.0
    c_w: float = 0.5
    likelihood: str = "digamma"
    kl_target: str = "all"
    kl_schedule: str = "gedl_tau"
    kl_weight: float = 1.0
    annealing_epochs: float = 10.0
    c_tau: float = 100.0
    tau_reading: str = "epoch"
    tau_form: str = "c_over_sum"
    fisher_logdet_weight: float = 0.0
    red_regularizer_weight: float = 0.0
    warmup_epochs: int = 0



# config.prior_strength: W by name (Eq. weight_update or a constant), f(spec, evidence_BxK).
PRIOR_STRENGTHS: dict[str, Callable[[LossSpec, jax.Array], jax.Array]] = {
    "fixed": lambda spec, evidence_BxK: fixed_prior_strength(evidence_BxK,
                                                             spec.prior_strength_value),
    "adaptive": lambda spec, evidence_BxK: adaptive_prior_strength(evidence_BxK, spec.c_w),
}


class EvidentialOutputs(NamedTuple):
    """The Dirichlet the network predicts for a batch."""

    evidence_BxK: jax.Array
    prior_strength_B: jax.Array
    alpha_BxK: jax.Array


class LossTerms(NamedTuple):
    """Per-example terms (B,) and the scalars of this step, for logging."""

    likelihood_B: jax.Array
    kl_B: jax.Array
    kl_weight: jax.Array
    mean_strength: jax.Array        # global batch mean of S (the tau statistic)
    mean_prior_strength: jax.Array  # global batch mean of W


def base_rate_K(spec: LossSpec) -> jax.Array:
    if spec.base_rate is None:
        return uniform_base_rate(spec.num_classes)
    return jnp.asarray(spec.base_rate, jnp.float32)


def evidential_outputs(spec: LossSpec, logits_BxK: jax.Array) -> EvidentialOutputs:
    """logits -> evidence -> W -> alpha (Eq. e2alpha, weight_update)."""
    logits_BxK = logits_BxK.astype(jnp.float32)
    evidence_BxK = evidence_from_logits(logits_BxK, spec.evidence, exp_clip=spec.exp_clip)
    if spec.prior_strength not in PRIOR_STRENGTHS:
        raise ValueError(f"unknown prior_strength {spec.prior_strength!r}; allowed: "
                         f"{list(PRIOR_STRENGTHS)}")
    w_B = PRIOR_STRENGTHS[spec.prior_strength](spec, evidence_BxK)
    alpha_BxK = dirichlet_alpha(evidence_BxK, w_B, base_rate_K(spec))
    return EvidentialOutputs(evidence_BxK, w_B, alpha_BxK)


# config.likelihood: the data terms by name (the allowed values and the dispatch, one table),
# each f(alpha_BxK, labels_B) -> per-example values.
LIKELIHOODS: dict[str, Callable[[jax.Array, jax.Array], jax.Array]] = {
    "digamma": expected_nll,
    "log": log_nll,
    "mse": lambda alpha_BxK, labels_B: expected_mse(alpha_BxK, labels_B,
                                                    include_variance=True),
    "mse_novar": lambda alpha_BxK, labels_B: expected_mse(alpha_BxK, labels_B,
                                                          include_variance=False),
    "fisher_mse": lambda alpha_BxK, labels_B: (fisher_weighted_mse(alpha_BxK, labels_B)
                                               + fisher_weighted_variance(alpha_BxK)),
}


def _likelihood_B(spec: LossSpec, alpha_BxK: jax.Array, labels_B: jax.Array) -> jax.Array:
    if spec.likelihood not in LIKELIHOODS:
        raise ValueError(f"unknown likelihood {spec.likelihood!r}; allowed: {list(LIKELIHOODS)}")
    return LIKELIHOODS[spec.likelihood](alpha_BxK, labels_B)


# config.kl_target: the Dirichlet the KL pulls toward Dir(W a), by name, as
# f(alpha_BxK, labels_B, prior_alpha_BxK) -> the KL's first argument; None: no KL.
KL_TARGETS: dict[str, Callable[[jax.Array, jax.Array, jax.Array], jax.Array] | None] = {
    "all": lambda alpha_BxK, labels_B, prior_alpha_BxK: alpha_BxK,   # Eq. elbo as derived
    # EDL's "KL only on misleading evidence": the true class is reset to the prior value.
    "masked": masked_kl_target,
    "none": None,
}


def _kl_B(spec: LossSpec, out: EvidentialOutputs, labels_B: jax.Array) -> jax.Array:
    if spec.kl_target not in KL_TARGETS:
        raise ValueError(f"unknown kl_target {spec.kl_target!r}; allowed: {list(KL_TARGETS)}")
    target = KL_TARGETS[spec.kl_target]
    if target is None:
        return jnp.zeros(labels_B.shape, jnp.float32)
    # The prior Dir(W a), per example; W is already stop-gradient.
    a_K = base_rate_K(spec)
    a_1xK = a_K.reshape((1,) * out.prior_strength_B.ndim + a_K.shape)  # no implicit rank promotion
    prior_alpha_BxK = out.prior_strength_B[..., None] * a_1xK
    return dirichlet_kl(target(out.alpha_BxK, labels_B, prior_alpha_BxK), prior_alpha_BxK)


# config.kl_schedule: the KL weight 1/tau_t by name, as f(spec, cumulative strength, epoch).
KL_SCHEDULES: dict[str, Callable[[LossSpec, jax.Array, jax.Array], jax.Array]] = {
    "gedl_tau": lambda spec, cumulative, epoch: 1.0 / gedl_tau(cumulative, spec.c_tau,
                                                               spec.tau_form),
    "edl_anneal": lambda spec, cumulative, epoch: edl_annealing(epoch.astype(jnp.float32),
                                                                spec.annealing_epochs),
    "constant": lambda spec, cumulative, epoch: jnp.float32(1.0),
}


def kl_weight_and_tau_state(spec: LossSpec, tau_state: TauState, mean_strength: jax.Array,
                            evidential_epoch: jax.Array) -> tuple[jax.Array, TauState]:
    """The KL weight 1/tau_t of this step (stop-gradient) and the updated tau accumulator."""
    mean_strength = jax.lax.stop_gradient(mean_strength)
    in_warmup = evidential_epoch < 0
    epoch = jnp.maximum(evidential_epoch, 0)
    new_state, cumulative = tau_accumulate(tau_state, mean_strength, epoch,
                                              reading=spec.tau_reading)
    # During a non-evidential warm-up the accumulator does not move.
    new_state = jax.tree.map(lambda new, old: jnp.where(in_warmup, old, new), new_state,
                             tau_state)
    if spec.kl_schedule not in KL_SCHEDULES:
        raise ValueError(f"unknown kl_schedule {spec.kl_schedule!r}; allowed: "
                         f"{list(KL_SCHEDULES)}")
    weight = KL_SCHEDULES[spec.kl_schedule](spec, cumulative, epoch)
    weight = spec.kl_weight * jnp.asarray(weight, jnp.float32)
    return jax.lax.stop_gradient(weight), new_state


def per_example_loss(
    spec: LossSpec,
    logits_BxK: jax.Array,
    labels_B: jax.Array,
    tau_state: TauState,
    epoch: jax.Array,
    global_mean: Callable[[jax.Array], jax.Array] = lambda x: x,
) -> tuple[jax.Array, TauState, LossTerms]:
    """The variant's loss for each example, the new tau state and the terms for logging.

    `global_mean` averages a per-device scalar over the data-parallel devices (lax.pmean inside
    shard_map), so the tau statistic E[S] is the mean over the *global* batch.
    """
    out = evidential_outputs(spec, logits_BxK)
    strength_B = dirichlet_strength(out.alpha_BxK)
    mean_strength = global_mean(jnp.mean(jax.lax.stop_gradient(strength_B)))
    mean_w = global_mean(jnp.mean(out.prior_strength_B))
    evidential_epoch = epoch - spec.warmup_epochs
    kl_weight, new_tau_state = kl_weight_and_tau_state(spec, tau_state, mean_strength,
                                                       evidential_epoch)
    likelihood_B = _likelihood_B(spec, out.alpha_BxK, labels_B)
    kl_B = _kl_B(spec, out, labels_B)
    loss_B = likelihood_B + kl_weight * kl_B
    if spec.fisher_logdet_weight:
        loss_B = loss_B + spec.fisher_logdet_weight * fisher_logdet(out.alpha_BxK)
    if spec.red_regularizer_weight:
        u_B = uncertainty_mass(out.alpha_BxK, out.prior_strength_B)
        loss_B = loss_B + spec.red_regularizer_weight * red_regularizer(
            logits_BxK.astype(jnp.float32), labels_B, u_B)
    if spec.warmup_epochs:
        # Non-evidential warm-up (paper, CIFAR-100): softmax cross-entropy on the logits.
        ce_B = optax.softmax_cross_entropy_with_integer_labels(
            logits_BxK.astype(jnp.float32), labels_B)
        loss_B = jnp.where(evidential_epoch < 0, ce_B, loss_B)
    terms = LossTerms(likelihood_B, kl_B, kl_weight, mean_strength, mean_w)
    return loss_B, new_tau_state, terms
