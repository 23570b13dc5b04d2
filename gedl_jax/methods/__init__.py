"""Methods: every classifier the toolkit trains and evaluates, behind one interface (`base`).

    method = methods.from_config(config, methods.MethodSetup.from_labels(train_labels, K, shape))

`config.method` names the method; its settings are config fields (docs/architecture.md lists
them). Registered here:

- "evidential": the EDL family (GEDL, EDL, I-EDL, R-EDL, RED, the ablation rows), `evidential`;
- "softmax": a softmax cross-entropy classifier (deep ensembles' members), `softmax`;
- "mc_dropout": MC Dropout, `softmax`;
- "duq": DUQ, `duq`; "kl_pn", "rkl_pn": Prior Networks, `prior_networks`; "postnet": Posterior
  Networks, `postnet`; "daedl": DAEDL, `daedl`; "fedl": F-EDL, `fedl` (`networks`: their
  backbones). Each names its reading (`config.recipe`: "protocol" or "source") in `describe()`.

Deep ensembles are not a method but a way to run any of them (`config.ensemble_size`): members
trained as seeds and scored as one model (`ensemble`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax.numpy as jnp
import numpy as np

from gedl_jax import losses, models
from gedl_jax.methods import daedl as daedl_method
from gedl_jax.methods import duq as duq_method
from gedl_jax.methods import fedl as fedl_method
from gedl_jax.methods import networks
from gedl_jax.methods import postnet as postnet_method
from gedl_jax.methods import prior_networks as pn_method
from gedl_jax.methods.base import LossOutput, Method, StepContext
from gedl_jax.methods.common import check_recipe
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


def _recipe(config) -> str:
    return check_recipe(config.get("recipe", "protocol"))


def _duq(config, setup: MethodSetup) -> Method:
    if _recipe(config) == "source":
        raise ValueError("config.recipe='source' is not available for DUQ: its reference recipe "
                         "needs a ResNet-18 (CIFAR) or a BN CNN (FashionMNIST) and SGD with "
                         "step decay, which this toolkit does not build; use "
                         "config.recipe='protocol'")
    k = setup.num_classes
    sigma = float(config.get("duq_length_scale", 0.1))
    train_model, eval_model = (
        duq_method.DUQNet(networks.backbone(config, 0, axis_name=axis),
                          duq_method.RBFHead(k, 0, sigma)) for axis in (AXIS, None))
    return duq_method.DUQ(train_model, eval_model, k, length_scale=sigma,
                          gamma=float(config.get("duq_gamma", 0.999)),
                          gradient_penalty=float(config.get("duq_gradient_penalty", 0.5)),
                          recipe=_recipe(config))


def _prior_network(cls):
    def build(config, setup: MethodSetup) -> Method:
        return cls(*build_models(config), setup.num_classes,
                   ood=config.get("pn_ood", "noise_uniform"),
                   ood_weight=float(config.get("pn_ood_weight", 1.0)),
                   target_form=config.get("pn_target_form", "pnet"),
                   target_concentration=float(config.get("pn_target_concentration", 100.0)),
                   target_smoothing=float(config.get("pn_target_smoothing", 0.01)),
                   recipe=_recipe(config))
    return build


def _postnet(config, setup: MethodSetup) -> Method:
    latent = int(config.get("postnet_latent_dim", 6))
    layers = int(config.get("postnet_flow_layers", 6))
    train_model, eval_model = (
        postnet_method.PostNetModel(networks.backbone(config, latent, axis_name=axis),
                                    setup.num_classes, layers, axis_name=axis)
        for axis in (AXIS, None))
    return postnet_method.PostNet(train_model, eval_model, setup.num_classes,
                                  class_counts=setup.class_counts,
                                  entropy_weight=float(config.get("postnet_entropy_weight", 1e-6)),
                                  latent_dim=latent, flow_layers=layers, recipe=_recipe(config))


def _daedl(config, setup: MethodSetup) -> Method:
    train_model, eval_model = (networks.backbone(config, setup.num_classes, axis_name=axis,
                                                 spectral_norm=True) for axis in (AXIS, None))
    return daedl_method.DAEDL(train_model, eval_model, setup.num_classes,
                              kl_weight=float(config.get("daedl_kl_weight", 0.05)),
                              recipe=_recipe(config))


def _fedl(config, setup: MethodSetup) -> Method:
    k, recipe = setup.num_classes, _recipe(config)
    hidden = int(config.get("fedl_head_hidden", 256))
    dropout = float(config.get("fedl_head_dropout", 0.0))

    def model(axis):
        if recipe == "protocol":
            return fedl_method.FEDLModel(networks.backbone(config, k, axis_name=axis), k, hidden,
                                         dropout)
        if config.model == "convnet":   # the reference MNIST net: SN, MLP 576 -> 64 -> 64 -> K
            return fedl_method.FEDLModel(
                networks.backbone(config, k, axis_name=axis, spectral_norm=True, hidden=(64, 64),
                                  dropout_rate=0.0), k, hidden, dropout)
        return fedl_method.FEDLModel(   # the reference CIFAR net: SN VGG16 features + its head
            networks.backbone(config, 0, axis_name=axis, spectral_norm=True, hidden=(),
                              dropout_rate=0.0), k, hidden, dropout,
            alpha_head=fedl_method.SourceVGGAlphaHead(k, hidden, dropout, axis_name=axis))

    return fedl_method.FEDL(model(AXIS), model(None), k, recipe=recipe)


METHODS: dict[str, Callable[..., Method]] = {
    "evidential": _evidential,
    "softmax": _softmax,
    "mc_dropout": _mc_dropout,
    "duq": _duq,
    "kl_pn": _prior_network(pn_method.KLPriorNetwork),
    "rkl_pn": _prior_network(pn_method.RKLPriorNetwork),
    "postnet": _postnet,
    "daedl": _daedl,
    "fedl": _fedl,
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
