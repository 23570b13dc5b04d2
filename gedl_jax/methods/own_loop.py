"""The EDL family's training loss for your own loop: an explicitly stateful, pure objective.

    obj = EvidentialObjective.gedl(num_classes=10, steps_per_epoch=len(x_train) // batch)
    state = obj.init()                                            # a pytree: carry it
    loss, state, metrics = obj(logits_BxK, labels_B, state)       # inside your jitted step

`loss` is the batch mean of the variant's per-example loss
(`gedl_jax.evidential.loss.per_example_loss`, paper Table unified_edl):

    loss_i = likelihood(alpha_i, y_i) + (1/tau_t) KL(Dir(target_i) || Dir(W_i a))   (Eq. elbo)
             [+ fisher_c (-log det I(alpha_i))]  [+ red_w (-stopgrad(u_i) logit_{i,y})]

with alpha = e + W a (Eq. e2alpha), W fixed or adaptive (Eq. weight_update) and the KL weight
1/tau from EDL's annealing or GEDL's accumulated strength (Eq. tau_schedule). It is exactly the
scalar the built-in trainer differentiates (`gedl_jax.run.steps`: the global mean of
`Evidential.loss`'s per-example losses), and `state` is what that trainer carries for it: the
step counter, from which the epoch of the schedules is `step // steps_per_epoch` (the trainer's
`state.step // steps_per_epoch`, counted before the step), and GEDL's tau accumulator
(`TauState`). No math is re-implemented here: the objective only threads that state.

The objective is a static pytree (no leaves; hashable), so it may be closed over or passed to
`jax.jit`; the call is pure, so it can be `vmap`ped (e.g. over seeds, with a leading state axis)
and used inside `shard_map`: with `axis_name` set, the batch-mean strength behind tau, the mean
prior strength, the loss and the metrics are averaged over that mesh axis (`lax.pmean`), so every
device holds the same state and the loss is the global-batch mean (the trainer's convention: under
`shard_map` differentiate this replicated loss). Outside such a context leave `axis_name` None.

The built-in trainer also keeps the old state when a step is non-finite (`steps.py`: parameters,
optimiser state and tau accumulator unchanged, only the step counter advances); a loop that wants
the same guard selects `jnp.where(finite, new, old)` over the state itself.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from gedl_jax import config as config_lib
from gedl_jax.evidential import loss as losses
from gedl_jax.evidential import schedules
from gedl_jax.methods.evidential import spec_from_config

# The LossSpec settings a variant constructor accepts as keywords (num_classes and base_rate are
# arguments of their own).
SETTINGS = tuple(f.name for f in dataclasses.fields(losses.LossSpec)
                 if f.name not in ("num_classes", "base_rate"))
PROTOCOLS = tuple(config_lib.DATASET_DEFAULTS)   # the dataset-dependent settings' source
EDL_FAMILY = tuple(name for name, fields in config_lib.VARIANTS.items()
                   if fields.get("method", "evidential") == "evidential")


class ObjectiveState(NamedTuple):
    """What the objective carries between steps (a pytree of scalars; checkpoint it).

    Attributes:
      step: int32, the number of steps taken (the trainer's `TrainState.step`).
      tau: GEDL's accumulator of batch-mean Dirichlet strengths (`schedules.TauState`); unused
        but carried by the variants without the gedl_tau schedule.
    """

    step: jax.Array
    tau: schedules.TauState


@dataclasses.dataclass(frozen=True)
class EvidentialObjective:
    """The loss of one EDL-family variant, `(logits, labels, state) -> (loss, state, metrics)`.

    Attributes:
      spec: the variant's settings (`gedl_jax.evidential.loss.LossSpec`).
      steps_per_epoch: steps per epoch of your loop (the schedules count epochs:
        epoch = step // steps_per_epoch).
      axis_name: the data-parallel mesh axis inside `shard_map` (or a named `vmap` axis), over
        which batch means are averaged; None on one device.
      check_labels: a label outside [0, K) raises ValueError instead of giving a NaN loss: at
        once for concrete labels; inside `jax.jit` when the step runs (a host callback of the
        batch's smallest and largest label, reported as a JaxRuntimeError naming them). A loop
        whose labels are known good may turn it off: `dataclasses.replace(obj,
        check_labels=False)`.

    Example:
      >>> obj = EvidentialObjective.gedl(num_classes=3, steps_per_epoch=2)
      >>> state = obj.init()
      >>> logits_BxK = jnp.array([[2.0, 0.0, -1.0], [0.0, 3.0, 0.0]])
      >>> loss, state, metrics = obj(logits_BxK, jnp.array([0, 1]), state)
      >>> print(int(state.step), int(state.tau.epoch_count), round(float(loss), 4))
      1 1 0.6029
    """

    spec: losses.LossSpec
    steps_per_epoch: int
    axis_name: str | None = None
    check_labels: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.spec, losses.LossSpec):
            raise TypeError(f"spec must be a gedl_jax.evidential.loss.LossSpec, got "
                            f"{type(self.spec).__name__}")
        if isinstance(self.steps_per_epoch, bool) or not isinstance(
                self.steps_per_epoch, (int, np.integer)) or self.steps_per_epoch < 1:
            raise ValueError(f"steps_per_epoch must be a positive integer, got "
                             f"{self.steps_per_epoch!r}")
        object.__setattr__(self, "steps_per_epoch", int(self.steps_per_epoch))

    # --- constructors ----------------------------------------------------------------------
    @classmethod
    def from_spec(cls, spec: losses.LossSpec, steps_per_epoch: int,
                  axis_name: str | None = None) -> EvidentialObjective:
        """The objective of an explicit `LossSpec` (every setting spelled out)."""
        return cls(spec, steps_per_epoch, axis_name)

    @classmethod
    def from_config(cls, config, steps_per_epoch: int,
                    base_rate: Sequence[float] | None = None,
                    axis_name: str | None = None) -> EvidentialObjective:
        """The objective of a run config (`gedl_jax.config`; resolved here if it is not), as
        the trainer builds its loss: `methods.evidential.spec_from_config(config, base_rate)`.
        `base_rate`: the label frequencies when config.base_rate == "label_frequency" (the
        trainer's `MethodSetup.label_frequencies()`), else None (uniform)."""
        return cls(spec_from_config(
            config, base_rate=None if base_rate is None else tuple(map(float, base_rate))),
            steps_per_epoch, axis_name)

    @classmethod
    def variant(cls, name: str, num_classes: int, steps_per_epoch: int, *,
                protocol: str = "mnist", base_rate: Sequence[float] | None = None,
                axis_name: str | None = None, **settings: Any) -> EvidentialObjective:
        """A named variant of the EDL family with the toolkit's settings, optionally changed.

        The settings are the preset's (`config.VARIANTS[name]`, the same the CLI's
        `--config=configs/<dataset>.py:<name>` uses) with the few dataset-dependent values taken
        from `protocol`'s defaults (I-EDL's Fisher weight 0.005 on the MNIST family / 0.05 on
        CIFAR; RED's exp clip 80 / 10; CIFAR-100's 5 warm-up epochs), validated like a run's.

        Args:
          name: "gedl", "edl", "iedl", "redl", "red" or an ablation row ("ablation_base",
            "ablation_kl_all", "ablation_kl_all_tau", "ablation_full").
          num_classes: K.
          steps_per_epoch: steps per epoch of your loop.
          protocol: "mnist", "fashion_mnist", "cifar10" or "cifar100" (see above).
          base_rate: a (K,) base rate a (e.g. the training label frequencies); None = uniform.
          axis_name: see the class docstring.
          **settings: any `LossSpec` setting to override, e.g. c_tau=50.0,
            tau_reading="step", prior_strength_value="0.5K" (strings "K"/"<f>K" allowed).

        Returns:
          The objective.

        Raises:
          ValueError: an unknown variant or protocol, or an invalid setting value.
          TypeError: an unknown setting name.
        """
        if name not in EDL_FAMILY:
            raise ValueError(f"{name!r} is not an EDL-family variant; choose one of "
                             f"{list(EDL_FAMILY)}")
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol={protocol!r} is not known; choose one of "
                             f"{list(PROTOCOLS)}")
        unknown = sorted(set(settings) - set(SETTINGS))
        if unknown:
            raise TypeError(f"unknown setting(s) {unknown}; the settings are {list(SETTINGS)}")
        config = config_lib.build_config(protocol, name)
        config.num_classes = int(num_classes)
        for key, value in settings.items():
            if key == "prior_strength_value" and isinstance(value, (int, float, np.number)):
                value = repr(float(value))   # the field also takes "K" / "<f>K": a string
            try:
                config[key] = value
            except TypeError as e:
                raise TypeError(f"setting {key}={value!r}: {e}") from None
        config = config_lib.resolve(config)   # checked like a run's
        if base_rate is not None:
            base_rate = _checked_base_rate(base_rate, int(num_classes))
        return cls.from_config(config, steps_per_epoch, base_rate, axis_name)

    @classmethod
    def gedl(cls, num_classes: int, steps_per_epoch: int, **kwargs: Any) -> EvidentialObjective:
        """GEDL: adaptive W (Eq. weight_update, C_w = 0.5), KL to Dir(W a) on all examples
        weighted by 1/tau, tau = max(1, C_tau / sum E[S]) (Eq. tau_schedule, C_tau = 100),
        digamma NLL. Keywords as `variant`."""
        return cls.variant("gedl", num_classes, steps_per_epoch, **kwargs)

    @classmethod
    def edl(cls, num_classes: int, steps_per_epoch: int, **kwargs: Any) -> EvidentialObjective:
        """EDL (I-EDL/R-EDL protocol): MSE with variance, W = K, masked KL annealed
        min(1, epoch/10). Keywords as `variant`."""
        return cls.variant("edl", num_classes, steps_per_epoch, **kwargs)

    @classmethod
    def iedl(cls, num_classes: int, steps_per_epoch: int, **kwargs: Any) -> EvidentialObjective:
        """I-EDL: Fisher-weighted MSE and variance + fisher_c (-log det I(alpha)), masked KL
        annealed (fisher_c from `protocol`). Keywords as `variant`."""
        return cls.variant("iedl", num_classes, steps_per_epoch, **kwargs)

    @classmethod
    def redl(cls, num_classes: int, steps_per_epoch: int, **kwargs: Any) -> EvidentialObjective:
        """R-EDL: W = 0.1 K, MSE without the variance term, masked KL annealed. Keywords as
        `variant`."""
        return cls.variant("redl", num_classes, steps_per_epoch, **kwargs)

    @classmethod
    def red(cls, num_classes: int, steps_per_epoch: int, **kwargs: Any) -> EvidentialObjective:
        """RED: exp evidence, EDL's MSE + annealed masked KL + -stopgrad(u) logit_y. Keywords as
        `variant`."""
        return cls.variant("red", num_classes, steps_per_epoch, **kwargs)

    # --- state and loss --------------------------------------------------------------------
    @property
    def num_classes(self) -> int:
        return self.spec.num_classes

    def init(self) -> ObjectiveState:
        """The state before the first step: step 0 and an empty tau accumulator."""
        return ObjectiveState(step=jnp.zeros((), jnp.int32), tau=schedules.tau_init())

    def epoch(self, state: ObjectiveState) -> jax.Array:
        """The 0-based epoch of the next step, as the trainer derives it:
        step // steps_per_epoch."""
        return state.step // self.steps_per_epoch

    def _mean(self, x: jax.Array) -> jax.Array:
        return x if self.axis_name is None else jax.lax.pmean(x, self.axis_name)

    def __call__(self, logits_BxK: jax.Array, labels_B: jax.Array, state: ObjectiveState
                 ) -> tuple[jax.Array, ObjectiveState, dict[str, jax.Array]]:
        """One step's loss, the next state and metrics.

        Args:
          logits_BxK: the network's logits for this (per-device) batch, shape (B, K).
          labels_B: integer labels in [0, K), shape (B,).
          state: from `init()` or the previous call.

        Returns:
          (loss, new_state, metrics): the (global) batch-mean loss, a float32 scalar to
          differentiate; the state after this step; and scalars to log: "loss", "accuracy"
          (of argmax logits), "likelihood", "kl" (batch means of the per-example terms),
          "kl_weight" (1/tau_t), "mean_strength" (E[S], tau's statistic),
          "mean_prior_strength" (E[W]) and "epoch" (the epoch of this step).

        Raises:
          ValueError: (at trace time) logits not (B, K) or labels not (B,) integers; a label
            outside [0, K) (`check_labels`: at once when eager; under `jax.jit` the step raises
            a JaxRuntimeError carrying this ValueError's message).
        """
        logits_BxK = jnp.asarray(logits_BxK)
        labels_B = jnp.asarray(labels_B)
        if logits_BxK.ndim != 2 or logits_BxK.shape[-1] != self.num_classes:
            raise ValueError(f"logits_BxK must have shape (B, {self.num_classes}), got "
                             f"{logits_BxK.shape}")
        if labels_B.shape != logits_BxK.shape[:1] or not jnp.issubdtype(labels_B.dtype,
                                                                        jnp.integer):
            raise ValueError(f"labels_B must be {logits_BxK.shape[0]} integer labels, got "
                             f"{labels_B.shape} {labels_B.dtype}")
        if self.check_labels:
            _check_labels(labels_B, self.num_classes)
        epoch = self.epoch(state)
        loss_B, new_tau, terms = losses.per_example_loss(
            self.spec, logits_BxK, labels_B, state.tau, epoch, global_mean=self._mean)
        loss = self._mean(jnp.mean(loss_B))   # the trainer's pmean(mean(loss_B))
        correct_B = (jnp.argmax(logits_BxK, -1) == labels_B).astype(jnp.float32)
        metrics = {"loss": loss, "accuracy": self._mean(jnp.mean(correct_B)),
                   "likelihood": self._mean(jnp.mean(terms.likelihood_B)),
                   "kl": self._mean(jnp.mean(terms.kl_B)), "kl_weight": terms.kl_weight,
                   "mean_strength": terms.mean_strength,
                   "mean_prior_strength": terms.mean_prior_strength, "epoch": epoch}
        return loss, ObjectiveState(step=state.step + 1, tau=new_tau), metrics

    # --- prediction ------------------------------------------------------------------------
    def dirichlet(self, logits_BxK: jax.Array) -> losses.EvidentialOutputs:
        """The predicted Dirichlet (evidence_BxK, prior_strength_B = W, alpha_BxK), as the
        built-in evaluation computes it; probabilities are `ev.projected_probability(alpha)`,
        the uncertainty mass `ev.uncertainty_mass(alpha, W)` = W / S."""
        return losses.evidential_outputs(self.spec, logits_BxK)


def _check_labels(labels_B: jax.Array, num_classes: int) -> None:
    if labels_B.size == 0:
        return
    if isinstance(labels_B, jax.core.Tracer):   # under jit / vmap / grad: when the step runs
        jax.debug.callback(functools.partial(_raise_outside_range, num_classes=num_classes),
                           jnp.min(labels_B), jnp.max(labels_B))
    else:   # concrete (also a constant closed over by a jitted function)
        labels = np.asarray(labels_B)
        _raise_outside_range(labels.min(), labels.max(), num_classes)


def _raise_outside_range(lowest, highest, num_classes: int) -> None:
    lowest, highest = int(np.min(lowest)), int(np.max(highest))
    if lowest < 0 or highest >= num_classes:
        raise ValueError(f"labels_B must be class indices in [0, {num_classes}), got labels from "
                         f"{lowest} to {highest}: set num_classes to the number of classes; "
                         f"mask padding out (no -1 labels)")


def _checked_base_rate(base_rate: Sequence[float], num_classes: int) -> tuple[float, ...]:
    a = np.asarray(base_rate, np.float64)
    if a.shape != (num_classes,) or not np.all(np.isfinite(a)) or not np.all(a > 0) \
            or abs(a.sum() - 1.0) > 1e-6:
        raise ValueError(f"base_rate must be {num_classes} positive values summing to 1 (e.g. "
                         f"the training label frequencies), got {np.asarray(base_rate)}")
    return tuple(float(x) for x in a)


jax.tree_util.register_static(EvidentialObjective)

__all__ = ["EDL_FAMILY", "EvidentialObjective", "ObjectiveState", "PROTOCOLS", "SETTINGS"]

