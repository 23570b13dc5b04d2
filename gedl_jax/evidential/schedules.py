"""KL-weight schedules: EDL's linear annealing and GEDL's accumulated-strength temperature.

The KL weight of Eq. elbo is 1/tau. EDL anneals it as min(1, t/10) over 0-based epochs, as the
PyTorch reference code of EDL, I-EDL, R-EDL and RED counts them (0 throughout the first epoch;
Sensoy et al.'s TensorFlow notebook counts iterations instead). GEDL sets
tau_t = max(1, C_tau / sum_{i<=t} E[S(x_i)]) (Eq. tau_schedule, with the Appendix's max(1, .)),
E[S] approximated by the mini-batch mean of the Dirichlet strength. Whether the sum has one term
per iteration (the literal reading of that mini-batch mean) or per epoch is ambiguous in the
paper, so both readings are implemented; see `tau_accumulate`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.typing import ArrayLike

TAU_READINGS = ("epoch", "step", "completed_epochs")
# How tau follows from the accumulated strength: "c_over_sum" is Eq. tau_schedule as printed,
# tau = C_tau / sum (the KL weight 1/tau grows as strength accumulates, like EDL's annealing);
# "sum_over_c" is the inverse, tau = sum / C_tau, the reading of tau as an effective sample size
# that grows with the evidence seen (the KL weight decays once the sum passes C_tau).
TAU_FORMS = ("c_over_sum", "sum_over_c")

# Floor of the accumulated strength in `gedl_tau`: far below any real batch-mean strength (S >= W
# > 0), so it only matters before the first step, where it makes tau huge but finite.
_MIN_CUMULATIVE_STRENGTH = 1e-30


def edl_annealing(epoch: ArrayLike, annealing_epochs: ArrayLike = 10.0) -> jax.Array:
    """EDL's KL weight min(1, epoch / annealing_epochs), clipped below at 0.

    `epoch` is the 0-based epoch index (weight 0 through epoch 0, 1 from epoch `annealing_epochs`
    on, as in the PyTorch reference code), or a fractional epoch (step / steps_per_epoch) for
    Sensoy's per-iteration ramp. Traced values are fine (jit-safe).

    Args:
      epoch: 0-based epoch, integer or float scalar (or array).
      annealing_epochs: epochs to reach weight 1 (> 0).

    Returns:
      The KL weight, float32, in [0, 1].

    Example:
      >>> print(ev.edl_annealing(jnp.arange(0, 16, 5)))
      [0.  0.5 1.  1. ]
    """
    epoch = jnp.asarray(epoch)
    if not jnp.issubdtype(epoch.dtype, jnp.floating):
        epoch = epoch.astype(jnp.float32)
    return jnp.clip(epoch / jnp.asarray(annealing_epochs, epoch.dtype), 0.0, 1.0)


class TauState(NamedTuple):
    """Accumulator of the batch-mean Dirichlet strengths behind GEDL's tau (a pytree of scalars).

    Attributes:
      epoch: int32, the epoch of the last accumulated step.
      completed_sum: float32, sum over finished epochs of each epoch's mean batch strength.
      epoch_sum: float32, sum of the batch-mean strengths seen so far in the current epoch.
      epoch_count: int32, number of steps seen so far in the current epoch.
      step_sum: float32, sum of every batch-mean strength seen (one term per step).
    """

    epoch: jax.Array
    completed_sum: jax.Array
    epoch_sum: jax.Array
    epoch_count: jax.Array
    step_sum: jax.Array


def tau_init() -> TauState:
    """The empty accumulator (epoch 0, all sums 0).

    Example:
      >>> state = ev.tau_init()
      >>> print(int(state.epoch), float(state.completed_sum))
      0 0.0
    """
    return TauState(epoch=jnp.zeros((), jnp.int32), completed_sum=jnp.zeros((), jnp.float32),
                    epoch_sum=jnp.zeros((), jnp.float32), epoch_count=jnp.zeros((), jnp.int32),
                    step_sum=jnp.zeros((), jnp.float32))


def tau_accumulate(state: TauState, batch_mean_strength: ArrayLike, epoch: ArrayLike,
                   reading: str = "epoch") -> tuple[TauState, jax.Array]:
    """Adds one step's batch-mean strength and returns sum_{i<=t} E[S(x_i)] (Eq. tau_schedule).

    Call once per training step with the batch mean of S (already averaged over devices; it is
    put under stop_gradient here too) and the current 0-based epoch (a traced int is fine). When
    `epoch` is larger than `state.epoch`, the finished epoch's mean strength (its sum over its
    step count, if it had steps) moves into `completed_sum` and the running sums restart; an
    `epoch` that is not larger is treated as the current epoch. Then the batch mean is added.

    Readings of the paper's sum; in both the current term is included, so 1/tau > 0 at t = 0:

    * "epoch" (default): one term per epoch, the current epoch's term being the running mean of
      its batch strengths so far: completed_sum + epoch_sum / epoch_count. With S ~ K = 10 and
      C_tau = 100 the weight is min(1, (t + 1)/10) in epoch t.
    * "step": one term per iteration, the literal mini-batch reading: step_sum. With S ~ 7.6 at
      initialisation and C_tau = 100 the weight reaches 1 at the 14th step.
    * "completed_epochs": one term per *finished* epoch (completed_sum), so tau is fixed within
      an epoch and the current epoch is not counted: the KL weight is ~0 through epoch 0, as in
      EDL's min(1, epoch/10) (`gedl_tau` floors an empty sum at 1e-30).

    Args:
      state: the accumulator (`tau_init()` at the start of training).
      batch_mean_strength: scalar mean of S over the (global) batch.
      epoch: scalar 0-based epoch index of this step.
      reading: "epoch" or "step" (a static Python string).

    Returns:
      (new_state, cumulative_strength) with cumulative_strength a float32 scalar.

    Raises:
      ValueError: for a reading not in `TAU_READINGS`.

    Example:
      >>> state = ev.tau_init()
      >>> state, total = ev.tau_accumulate(state, 12.0, epoch=0)
      >>> state, total = ev.tau_accumulate(state, 14.0, epoch=0)
      >>> print(float(total))  # the epoch reading: mean strength of epoch 0 so far
      13.0
      >>> state, total = ev.tau_accumulate(state, 20.0, epoch=1)
      >>> print(float(total))  # epoch 0's mean (13) + epoch 1's so far (20)
      33.0
    """
    if reading not in TAU_READINGS:
        raise ValueError(f"unknown tau reading {reading!r}; expected one of {TAU_READINGS}")
    strength = jax.lax.stop_gradient(jnp.asarray(batch_mean_strength, jnp.float32))
    epoch = jnp.asarray(epoch).astype(jnp.int32)

    new_epoch = epoch > state.epoch
    finished_mean = jnp.where(state.epoch_count > 0,
                              state.epoch_sum / jnp.maximum(state.epoch_count, 1), 0.0)
    completed_sum = jnp.where(new_epoch, state.completed_sum + finished_mean, state.completed_sum)
    epoch_sum = jnp.where(new_epoch, 0.0, state.epoch_sum) + strength
    epoch_count = jnp.where(new_epoch, 0, state.epoch_count) + 1
    new_state = TauState(epoch=jnp.maximum(state.epoch, epoch),
                         completed_sum=completed_sum.astype(jnp.float32),
                         epoch_sum=epoch_sum.astype(jnp.float32),
                         epoch_count=epoch_count.astype(jnp.int32),
                         step_sum=(state.step_sum + strength).astype(jnp.float32))
    if reading == "epoch":
        cumulative = new_state.completed_sum + new_state.epoch_sum / new_state.epoch_count
    elif reading == "completed_epochs":
        cumulative = new_state.completed_sum
    else:
        cumulative = new_state.step_sum
    return new_state, cumulative


def gedl_tau(cumulative_strength: ArrayLike, c_tau: ArrayLike,
             form: str = "c_over_sum") -> jax.Array:
    """GEDL's temperature tau = max(1, C_tau / sum_{i<=t} E[S(x_i)]) (Eq. tau_schedule + Appendix).

    The KL weight is 1/tau, in (0, 1]. The accumulated strength is floored at 1e-30 (so an empty
    accumulator gives a huge tau, not a division by zero) and tau is capped at the largest
    float32, so both tau and 1/tau are always finite. Stop-gradient (paper, Appendix).

    With `form="sum_over_c"` (see `TAU_FORMS`) tau = max(1, sum / C_tau) instead.

    Args:
      cumulative_strength: the second output of `tau_accumulate`.
      c_tau: the constant C_tau (> 0; 100 in the paper).
      form: "c_over_sum" (Eq. tau_schedule, default) or "sum_over_c" (a static string).

    Returns:
      tau, float32 scalar (or array), >= 1.

    Example:
      >>> print(ev.gedl_tau(jnp.array([10.0, 50.0, 400.0]), c_tau=100.0))  # max(1, C_tau / sum)
      [10.  2.  1.]
    """
    if form not in TAU_FORMS:
        raise ValueError(f"unknown tau form {form!r}; expected one of {TAU_FORMS}")
    cumulative = jnp.maximum(jnp.asarray(cumulative_strength, jnp.float32),
                             _MIN_CUMULATIVE_STRENGTH)
    c_tau = jnp.asarray(c_tau, jnp.float32)
    tau = c_tau / cumulative if form == "c_over_sum" else cumulative / c_tau
    tau = jnp.clip(tau, 1.0, jnp.finfo(jnp.float32).max)
    return jax.lax.stop_gradient(tau)
