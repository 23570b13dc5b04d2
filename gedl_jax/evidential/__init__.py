"""Pure Dirichlet math of evidential deep learning (no Flax, no I/O).

Every function acts on the last axis (the K classes), keeps arbitrary leading batch axes, returns
per-example values (callers reduce) and is jit/vmap/grad-safe. Labels are integer class indices.
See docs/architecture.md and the paper's equations cited in each docstring.

Every public function's docstring ends with a runnable example (checked by
tests/test_doctests.py), written for this namespace:

    >>> import jax.numpy as jnp
    >>> import numpy as np
    >>> from gedl_jax import evidential as ev
    >>> alpha_BxK = ev.dirichlet_alpha(jnp.array([[4.0, 0.0, 1.0]]), 3.0, ev.uniform_base_rate(3))
    >>> print(ev.projected_probability(alpha_BxK), ev.uncertainty_mass(alpha_BxK, 3.0))
    [[0.625 0.125 0.25 ]] [0.375]
"""

from gedl_jax.evidential.activations import (
    ACTIVATIONS,
    evidence_from_logits,
    exp_evidence,
    relu_evidence,
    softplus_evidence,
)
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
    Opinion,
    adaptive_prior_strength,
    base_rate_from_counts,
    dirichlet_alpha,
    dirichlet_strength,
    fixed_prior_strength,
    projected_probability,
    subjective_opinion,
    uncertainty_mass,
    uniform_base_rate,
)
from gedl_jax.evidential.schedules import (
    TAU_FORMS,
    TAU_READINGS,
    TauState,
    edl_annealing,
    gedl_tau,
    tau_accumulate,
    tau_init,
)
from gedl_jax.evidential.uncertainty import (
    differential_entropy,
    expected_entropy,
    max_probability,
    mutual_information,
    mutual_information_asymptote,
    predictive_entropy,
    total_evidence,
    variance_sum,
)

__all__ = [
    "ACTIVATIONS", "evidence_from_logits", "exp_evidence", "relu_evidence", "softplus_evidence",
    "Opinion", "adaptive_prior_strength", "base_rate_from_counts", "dirichlet_alpha",
    "dirichlet_strength", "fixed_prior_strength", "projected_probability", "subjective_opinion",
    "uncertainty_mass", "uniform_base_rate",
    "dirichlet_kl", "fisher_logdet",
    "expected_mse", "expected_nll", "fisher_weighted_mse", "fisher_weighted_variance", "log_nll",
    "masked_kl_target", "red_regularizer",
    "TAU_FORMS", "TAU_READINGS", "TauState", "edl_annealing", "gedl_tau", "tau_accumulate",
    "tau_init",
    "differential_entropy", "expected_entropy", "max_probability", "mutual_information",
    "mutual_information_asymptote", "predictive_entropy", "total_evidence", "variance_sum",
]
