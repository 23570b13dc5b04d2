"""Methods: every classifier the toolkit trains and evaluates, behind one interface (`base`).

    method = methods.from_config(config, methods.MethodSetup.from_labels(train_labels, K, shape))

`config.method` names the method; its settings are config fields (docs/architecture.md lists
them). Registered here:

- "evidential": the EDL family (GEDL, EDL, I-EDL, R-EDL, RED, the ablation rows), `evidential`;
- "softmax": a softmax cross-entropy classifier (deep ensembles' members), `softmax`;
- "mc_dropout": MC Dropout, `softmax`.

Deep ensembles are not a method but a way to run any of them (`config.ensemble_size`): members
trained as seeds and scored as one model (`ensemble`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax.numpy as jnp
import numpy as np

from gedl_jax import losses, models
from gedl_jax.methods.base import LossOutput, Method, StepContext
from gedl_jax.methods.evidential import Evidential
from gedl_jax.methods.softmax import MCDropout, Softmax

__all__ = ["METHODS", "LossOutput", "Method", "MethodSetup", "StepContext", "build_models",
           "from_config", "register"]

AXIS = "data"   # the data-parallel mesh axis (gedl_jax.sharding.AXIS) BatchNorm averages over


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
        counts = np.asarray(self.class_counts, np.float64)
        return tuple(float(x) for x in counts / counts.sum())


def build_models(config) -> tuple:
    """(train_model, eval_model) of the config: the same architecture and parameters, the
    training one averaging BatchNorm statistics over the data-parallel axis."""
    dtype = jnp.bfloat16 if config.compute_dtype == "bfloat16" else jnp.float32
    kwargs = dict(dtype=dtype, init=config.get("init", "torch"),   # pre-`init` config.json
                  dropout_rate=float(config.get("dropout_rate", 0.0)),
                  dropout_placement=config.get("dropout_placement", "dense"))
    return (models.build_model(config.model, config.num_classes, axis_name=AXIS, **kwargs),
            models.build_model(config.model, config.num_classes, axis_name=None, **kwargs))


def _evidential(config, setup: MethodSetup) -> Method:
    base_rate = setup.label_frequencies() if config.base_rate == "label_frequency" else None
    return Evidential(*build_models(config), setup.num_classes,
                      spec=losses.LossSpec.from_config(config, base_rate=base_rate))


def _softmax(config, setup: MethodSetup) -> Method:
    return Softmax(*build_models(config), setup.num_classes)


def _mc_dropout(config, setup: MethodSetup) -> Method:
    return MCDropout(*build_models(config), setup.num_classes,
                     num_samples=int(config.mc_samples),
                     dropout_rate=float(config.dropout_rate) if config.model == "convnet"
                     else 0.5)


METHODS: dict[str, Callable[..., Method]] = {
    "evidential": _evidential,
    "softmax": _softmax,
    "mc_dropout": _mc_dropout,
}


def register(name: str, builder: Callable[..., Method]) -> None:
    """Make `config.method=name` build `builder(config, setup)`."""
    METHODS[name] = builder


def from_config(config, setup: MethodSetup) -> Method:
    """The method `config.method` with the config's settings."""
    name = config.get("method", "evidential")
    if name not in METHODS:
        raise ValueError(f"config.method={name!r} is not known; allowed: {sorted(METHODS)}")
    return METHODS[name](config, setup)
