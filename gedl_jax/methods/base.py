"""The method interface: what a method declares, and all the trainer and evaluation ask of it.

A method (the EDL family, a softmax classifier, MC Dropout, DUQ, Prior Networks, PostNet, ...) is
a frozen, hashable dataclass built from the config (`gedl_jax.methods.from_config`). It declares

- its **models**: `train_model` (batch statistics averaged over the "data" mesh axis) and
  `eval_model` (the same parameters, no collectives), Flax modules mapping float images
  `images_BxHxWxC` to the method's head output;
- its **state beyond the parameters**: the model's mutable collections (`model_state`, e.g.
  {"batch_stats": ...}) and a pytree of its own (`method_state`: GEDL's tau accumulator, DUQ's
  centroid averages), both carried in the `TrainState` and checkpointed;
- its **per-example training loss** with auxiliary outputs (`loss` -> `LossOutput`), pure and
  jit/vmap/shard_map-safe: collectives only through the `StepContext`;
- an optional **fit after training** (`fit`: a density on features), run before evaluation;
- a **predictor**: `predict` (on device, jitted by the caller) returns per-example raw outputs,
  and `predictions` (on the host, float64) turns them into `evaluation.Predictions`: class
  probabilities and a named set of confidence scores ("mp"; "um" where the method has a
  Dirichlet precision; method-specific ones).

Evaluation, tables and plots work from `Predictions` alone. Adding a method means writing one
subclass and registering it (docs/architecture.md has a worked example).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from gedl_jax import networks
from gedl_jax.config import ResolvedConfig
from gedl_jax.networks import user
from gedl_jax.evaluation.core import Predictions

PyTree = Any
Variables = dict[str, Any]   # flax variables: {"params": ..., "batch_stats": ..., ...}


@dataclasses.dataclass(frozen=True)
class MethodSetup:
    """What a method may need from the run's data besides the config: the training split's
    per-class counts (label-frequency base rates, PostNet's N_c) and the image shape."""

    num_classes: int
    class_counts: tuple[int, ...]
    image_shape: tuple[int, ...]

    @classmethod
    def from_labels(cls, labels_N: np.ndarray, num_classes: int,
                    image_shape: tuple[int, ...]) -> MethodSetup:
        counts = np.bincount(np.asarray(labels_N), minlength=num_classes)
        return cls(int(num_classes), tuple(int(c) for c in counts), tuple(image_shape))

    def label_frequencies(self) -> tuple[float, ...]:
        """Each class's share of the training labels (sums to 1): the label-frequency base rate."""
        counts = np.asarray(self.class_counts, np.float64)
        return tuple(float(x) for x in counts / counts.sum())


@dataclasses.dataclass(frozen=True)
class StepContext:
    """What a training step hands the loss besides parameters, state and batch.

    Attributes:
      epoch: int32 scalar, the epoch of this step (schedules read it).
      key: this step's random key on this device (dropout masks, noise): different per device
        and per step, the same on a resumed run.
      mean: global mean over the data-parallel devices of a per-device value (`lax.pmean`
        inside `shard_map`; the identity on one device outside it).
      sum: global sum over the data-parallel devices (`lax.psum`).
    """

    epoch: jax.Array
    key: jax.Array
    mean: Callable[[Any], Any] = lambda x: x
    sum: Callable[[Any], Any] = lambda x: x


class LossOutput(NamedTuple):
    """A method's training loss on one (per-device) batch.

    loss_B: per-example loss (B,); the step differentiates its global mean.
    model_state: the updated mutable model collections ({} when there are none).
    method_state: the updated method state (the old one when nothing changes).
    logs: values to log; a (B,) array is averaged over the global batch, a scalar is logged as it
      is (it must already be global, e.g. through `StepContext.mean`). "correct_B" (1.0 where the
      prediction is right) is required: the loop logs it as "accuracy".
    """

    loss_B: jax.Array
    model_state: Variables
    method_state: PyTree
    logs: Mapping[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class Method:
    """Base class: a softmax-free skeleton that subclasses fill in (see the module docstring).

    Subclasses set `name` and `score_names`, hold their static settings as dataclass fields
    (hashable: tuples, not lists) and override `loss`, `predict` and `predictions`; `init`,
    `init_method_state`, `fit` and `predicted_class` have defaults that suit most methods.
    """

    train_model: nn.Module
    eval_model: nn.Module
    num_classes: int

    name: ClassVar[str] = "method"
    # The confidence scores `predictions` returns (names from evaluation.SCORE_NAMES).
    score_names: ClassVar[tuple[str, ...]] = ("mp",)
    # What a score means for this method where tables need saying it (recorded in the results
    # as "score_captions"; the table caption reads them): {"um": "-u = -W/S"}.
    score_captions: ClassVar[Mapping[str, str]] = {}
    # Whether its "mp" score is max_k p_k of its predictive probabilities (carried in its
    # `Predictions`, so a post-hoc calibration of p recomputes it); DUQ's is its kernel
    # certainty max_c K_c instead.
    mp_is_max_probability: ClassVar[bool] = True
    # Whether `fit` must run after training before the method can predict.
    needs_fit: ClassVar[bool] = False
    # The method whose training this one is (its checkpoints are this method's, before `fit`):
    # `gedl_jax.evaluate --as_method` evaluates such a run as this method. None: its own.
    trains_as: ClassVar[str | None] = None
    # Train-step log entries printed on the progress line besides loss and accuracy:
    # (log name, label, format spec).
    progress_logs: ClassVar[tuple[tuple[str, str, str], ...]] = ()
    # Dataclass fields the builder fills from the run (the data's class counts, config.recipe,
    # config.mc_samples, ...): every other field of a subclass is one of its own settings, set
    # by `config.method_args` and defaulting to the field's default (`settings`).
    run_fields: ClassVar[tuple[str, ...]] = ()
    # Whether it reads a user network's `features` (besides, or instead of, its logits).
    reads_features: ClassVar[bool] = False
    # Whether it needs a user network's test-time `dropout` switch (MC Dropout).
    needs_dropout_switch: ClassVar[bool] = False
    # The `source` modifier's recipe (`configs/mnist.py:postnet,source`): the original
    # repository's training settings that this toolkit's trainer has, per dataset family
    # ("mnist": MNIST / Fashion-MNIST, "cifar": CIFAR-10 / CIFAR-100); config.recipe="source"
    # is set with them. What a reference does beyond these fields (SGD, step decays, its model
    # selection) is not reproduced; the method's module docstring says what its "source"
    # reading changes in the model itself. {}: no source reading.
    source_recipe: ClassVar[dict[str, dict[str, Any]]] = {}
    # The post-hoc calibrator of `config.calibrate` (evaluation.calibration): "temperature"
    # (scaled logits) or "evidence_scale" (alpha = c e + W a, the EDL family).
    calibrator: ClassVar[str] = "temperature"
    # Whether its prediction is a function of its network's K logits (a softmax, the EDL
    # family's evidence), so the post-hoc OOD scores of those logits, and of the features
    # before the last layer, apply to it (`posthoc_outputs`, config.posthoc_scores).
    posthoc_from_logits: ClassVar[bool] = False

    # --- settings --------------------------------------------------------------------------
    @classmethod
    def settings(cls) -> dict[str, Any]:
        """The method's own settings with their defaults (its dataclass fields beyond the
        models, K and `run_fields`); a default of None is resolved by `fill_defaults`."""
        skip = {f.name for f in dataclasses.fields(Method)} | set(cls.run_fields)
        return {f.name: f.default for f in dataclasses.fields(cls) if f.name not in skip}

    @classmethod
    def fill_defaults(cls, settings: dict[str, Any], num_classes: int,
                      dataset: str) -> dict[str, Any]:
        """The settings with every default of None replaced by its rule (from K or the
        dataset); a method with such a default overrides this and documents the rule."""
        del num_classes, dataset
        return settings

    @classmethod
    def check_settings(cls, settings: Mapping[str, Any], num_classes: int) -> None:
        """Raise ValueError (`bad_setting`) for a setting whose value is not allowed."""
        del settings, num_classes

    @classmethod
    def resolved_settings(cls, given: Mapping[str, Any], num_classes: int,
                          dataset: str) -> dict[str, Any]:
        """The settings of a run: the defaults, `given` over them (`config.method_args`
        parsed; known names only, converted to the field's type), `fill_defaults`, then
        `check_settings`. A run resolves them once, where its config is resolved
        (`config.method_settings`)."""
        defaults = cls.settings()
        unknown = sorted(set(given) - set(defaults))
        if unknown:
            raise ValueError(f"config.method_args names {', '.join(map(repr, unknown))}, not a "
                             f"setting of config.method={cls.name!r}; its settings (with "
                             f"their defaults): {json.dumps(defaults)}")
        types = {f.name: f.type if isinstance(f.type, str) else getattr(f.type, "__name__",
                                                                          str(f.type))
                 for f in dataclasses.fields(cls)}
        settings = {**defaults, **{k: _typed(k, v, types[k]) for k, v in given.items()}}
        settings = cls.fill_defaults(settings, num_classes, str(dataset))
        cls.check_settings(settings, num_classes)
        return settings

    @classmethod
    def check_config(cls, config: ResolvedConfig) -> None:
        """Before any work: the config fields the method needs beyond its own settings
        (ValueError)."""
        del config

    @classmethod
    def output_width(cls, config, num_classes: int) -> int:
        """The width of the network output the method reads (a user network is built for it)."""
        del config
        return num_classes

    @classmethod
    def build(cls, config: ResolvedConfig, setup: MethodSetup) -> Method:
        """The method of a run: its models from `config`, its settings
        `config.method_settings` (resolved once, with the config). Every method implements
        it."""
        raise NotImplementedError

    @property
    def base_rate(self) -> tuple[float, ...] | None:
        """The base rate a of a Dirichlet method's prior, which the evidence-scale calibrator
        keeps (None: uniform 1/K, or none)."""
        return None

    def __post_init__(self):
        self.check_settings({name: getattr(self, name) for name in self.settings()},
                            self.num_classes)

    # --- state -----------------------------------------------------------------------------
    def init(self, key: jax.Array, image_shape: tuple[int, ...]) -> Variables:
        """The model's variables for images of `image_shape` (H, W, C)."""
        return dict(self.eval_model.init({"params": key, "dropout": key},
                                         jnp.zeros((1, *image_shape), jnp.float32), train=False))

    def init_method_state(self) -> PyTree:
        """The method's state beyond the model variables (checkpointed, donated each step)."""
        return {}

    # --- training --------------------------------------------------------------------------
    def loss(self, params: PyTree, model_state: Variables, method_state: PyTree,
             images_BxHxWxC: jax.Array, labels_B: jax.Array, ctx: StepContext) -> LossOutput:
        """The per-example training loss on one (per-device) batch, the updated model and method
        state and the values to log (`LossOutput`); `ctx` gives the epoch, the key and the
        cross-device mean and sum. Every method implements it."""
        raise NotImplementedError

    def fit(self, variables: Variables, method_state: PyTree,
            batches: Iterable[tuple[jax.Array, jax.Array]],
            validation_batches: Iterable[tuple[jax.Array, jax.Array]] = ()) -> PyTree:
        """After training (`needs_fit`): fit what the method needs on the training split (a
        feature density, ...), given its batches `(images_BxHxWxC float, labels_B)`, and
        choose what it chooses on the validation split's batches (a prior precision); returns
        the method state `predict` uses. Deterministic, so evaluation can rerun it."""
        del variables, batches, validation_batches
        return method_state

    def fit_summary(self, method_state: PyTree) -> dict[str, float]:
        """What `fit` chose, for the results ("fit"): {} when there is nothing to say."""
        del method_state
        return {}

    # --- prediction ------------------------------------------------------------------------
    def predict(self, variables: Variables, method_state: PyTree, images_BxHxWxC: jax.Array,
                key: jax.Array) -> dict[str, jax.Array]:
        """Per-example raw outputs on device (every array has the batch as its leading axis),
        e.g. {"alpha_BxK", "prior_strength_B"} or {"probs_BxTxK"}. `key` draws any randomness
        (MC Dropout's masks); deterministic methods ignore it."""
        raise NotImplementedError

    def predictions(self, raw: Mapping[str, np.ndarray],
                    labels_N: np.ndarray | None = None) -> Predictions:
        """Host side: raw outputs of N examples (NumPy) -> `Predictions` (float64 scores)."""
        raise NotImplementedError

    def predicted_class(self, raw: Mapping[str, np.ndarray]) -> np.ndarray:
        """argmax of the predictive probabilities (validation accuracy); cheap, no scores."""
        return np.argmax(self.predictions(raw).probs, axis=-1)

    def posthoc_outputs(self, variables: Variables, images_BxHxWxC: jax.Array,
                        with_features: bool = True) -> dict[str, jax.Array]:
        """What the post-hoc OOD scores read (`posthoc_from_logits` methods): "logits_BxK" of
        `eval_model` in evaluation mode and, with `with_features`, "features_BxF": for a
        protocol network the output of its last hidden layer (the input of the final Dense
        layer), for a user network (resnet18, mlp, <module>:<Name>) its `features_and_logits`
        or `features` (`networks.user.feature_reader`; none when it has neither)."""
        model = self.eval_model
        if isinstance(model, networks.Backbone):
            out = model.clone(output="features").apply(variables, images_BxHxWxC, train=False)
            return {"features_BxF": out["hidden"], "logits_BxK": out["logits"]}
        reader = user.feature_reader(model) if with_features else None
        if reader == "features_and_logits":
            f, logits = model.apply(variables, images_BxHxWxC, train=False, method=reader)
            return {"features_BxF": f.astype(jnp.float32),
                    "logits_BxK": logits.astype(jnp.float32)}
        logits = model.apply(variables, images_BxHxWxC, train=False).astype(jnp.float32)
        if reader == "features":
            f = model.apply(variables, images_BxHxWxC, train=False, method=reader)
            return {"features_BxF": f.astype(jnp.float32), "logits_BxK": logits}
        return {"logits_BxK": logits}

    def linear_head_candidates(self, variables: Variables
                               ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Every (kernel (F, K), bias (K,)) pair of a user network's parameters, in the order
        of the parameter tree, for `evaluation.posthoc.linear_head` to pick the one that
        computes the logits from the features (ViM's last layer); [] for a protocol network
        (`last_layer` knows its layer)."""
        if isinstance(self.eval_model, networks.Backbone):
            return []
        found = []

        def visit(tree):
            if not isinstance(tree, Mapping):
                return
            kernel, bias = tree.get("kernel"), tree.get("bias")
            if (kernel is not None and bias is not None and np.ndim(kernel) == 2
                    and np.ndim(bias) == 1 and np.shape(kernel)[1] == np.shape(bias)[0]):
                found.append((np.asarray(kernel, np.float64), np.asarray(bias, np.float64)))
            for value in tree.values():
                visit(value)

        visit(variables.get("params", {}))
        return found

    def last_layer(self, variables: Variables) -> tuple[np.ndarray, np.ndarray] | None:
        """(kernel (F, K), bias (K,)) of a protocol network's final Dense layer (ViM's), or
        None (a user network: `linear_head_candidates`; or a layer wrapped so that it has no
        plain kernel)."""
        model = self.eval_model
        if not isinstance(model, networks.Backbone):
            return None
        layers = [k for k in variables["params"] if k.startswith("dense")]
        last = variables["params"][max(layers, key=lambda k: int(k[len("dense"):]))]
        if "kernel" not in last or "bias" not in last:
            return None
        return np.asarray(last["kernel"], np.float64), np.asarray(last["bias"], np.float64)

    def describe(self) -> str:
        """One line for logs and result files."""
        return self.name


def bad_setting(name: str, value: Any, allowed: str) -> ValueError:
    """The error of a method setting outside its allowed values."""
    return ValueError(f"config.method_args: {name}={value!r} is not allowed; {allowed}")


def _typed(name: str, value: Any, annotation: str) -> Any:
    """A method_args value as its dataclass field's type (JSON gives 1 for 1.0)."""
    if value is None and "None" in annotation:
        return value
    try:
        if annotation.startswith("float"):
            if isinstance(value, bool):
                raise TypeError
            return float(value)
        if annotation.startswith("int"):
            if isinstance(value, bool) or float(value) != int(value):
                raise TypeError
            return int(value)
    except (TypeError, ValueError):
        raise bad_setting(name, value, f"it must be a number ({annotation})") from None
    if annotation.startswith("str") and not isinstance(value, str):
        raise bad_setting(name, value, "it must be a string")
    return value


def softmax_probs(logits_BxK: jax.Array) -> jax.Array:
    return jax.nn.softmax(logits_BxK.astype(jnp.float32), axis=-1)


def correct_B(logits_or_probs_BxK: jax.Array, labels_B: jax.Array) -> jax.Array:
    return (jnp.argmax(logits_or_probs_BxK, -1) == labels_B).astype(jnp.float32)
