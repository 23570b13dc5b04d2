"""Evidence activations: network logits -> non-negative evidence e (paper Sec. 2, Eq. e2alpha).

The paper's experiments use softplus (Appendix, Implementation Details). ReLU is the evidence of
Sensoy et al.'s MSE demo and of RED's MNIST runs; the clamped exponential is the exp evidence of
the EDL PyTorch port (github.com/dougbrion/pytorch-classification-uncertainty, losses.py) and of
RED's CIFAR code (github.com/pandeydeep9/EvidentialResearch2023,
MainCifar10Experiments/utilFiles/losses.py).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike


def softplus_evidence(logits: ArrayLike) -> jax.Array:
    """Evidence e = log(1 + exp(logits)), the GEDL / I-EDL / R-EDL activation.

    `jax.nn.softplus` is computed as logaddexp(x, 0): finite value and gradient for any finite
    logit (e(1e3) = 1e3 with gradient 1, e(-1e3) = 0 with gradient 0).

    Args:
      logits: pre-activation network outputs, any shape.

    Returns:
      Non-negative evidence of the same shape.

    Example:
      >>> print(np.asarray(ev.softplus_evidence(jnp.array([-2.0, 0.0, 3.0]))).round(4))
      [0.1269 0.6931 3.0486]
    """
    return jax.nn.softplus(jnp.asarray(logits))


def relu_evidence(logits: ArrayLike) -> jax.Array:
    """Evidence e = max(0, logits) (Sensoy et al. 2018, MSE loss; RED, `--unc_act relu`).

    Args:
      logits: pre-activation network outputs, any shape.

    Returns:
      Non-negative evidence of the same shape.

    Example:
      >>> print(ev.relu_evidence(jnp.array([-2.0, 0.0, 3.0])))
      [0. 0. 3.]
    """
    return jax.nn.relu(jnp.asarray(logits))


def exp_evidence(logits: ArrayLike, clip: float = 10.0) -> jax.Array:
    """Evidence e = exp(clip(logits, -clip, clip)) (EDL PyTorch port; RED CIFAR code).

    The clamp bounds the evidence by exp(clip) (about 2.2e4 for the default 10) so that
    alpha, S and the losses stay finite; outside the clamp the gradient is 0. Note that
    Sensoy's TF notebook divides the logit by 10 before clamping; that scaling is not applied here
    (scale the logits beforehand to reproduce it).

    Args:
      logits: pre-activation network outputs, any shape.
      clip: the symmetric clamp applied to the logits before the exponential.

    Returns:
      Positive evidence of the same shape.

    Example:
      >>> e = ev.exp_evidence(jnp.array([-1.0, 0.0, 5.0]), clip=2.0)
      >>> print(np.asarray(e).round(4))  # at most e^clip
      [0.3679 1.     7.3891]
    """
    logits = jnp.asarray(logits)
    return jnp.exp(jnp.clip(logits, -clip, clip))


def evidence_from_logits(logits: ArrayLike, activation: str = "softplus",
                         exp_clip: float = 10.0) -> jax.Array:
    """Dispatches on the activation name (a static Python string), a key of `EVIDENCE`.

    Args:
      logits: pre-activation network outputs, any shape.
      activation: one of "softplus", "relu", "exp".
      exp_clip: the clamp of the "exp" activation (ignored by the others).

    Returns:
      Non-negative evidence of the same shape.

    Raises:
      ValueError: for an activation name not in `ACTIVATIONS`.

    Example:
      >>> logits_BxK = jnp.array([[2.0, -1.0, 0.0]])
      >>> print(ev.evidence_from_logits(logits_BxK, 'relu'))
      [[2. 0. 0.]]
      >>> print(np.asarray(ev.evidence_from_logits(logits_BxK, 'softplus')).round(4))
      [[2.1269 0.3133 0.6931]]
    """
    if activation not in EVIDENCE:
        raise ValueError(f"unknown evidence activation {activation!r}; expected one of "
                         f"{ACTIVATIONS}")
    return EVIDENCE[activation](logits, exp_clip)


# config.evidence: the activations by name (the allowed values and the dispatch, one table),
# each called as f(logits, exp_clip).
EVIDENCE: dict[str, Callable[[ArrayLike, float], jax.Array]] = {
    "softplus": lambda logits, clip: softplus_evidence(logits),
    "relu": lambda logits, clip: relu_evidence(logits),
    "exp": lambda logits, clip: exp_evidence(logits, clip=clip),
}
ACTIVATIONS = tuple(EVIDENCE)
