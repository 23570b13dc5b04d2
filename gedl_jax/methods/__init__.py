"""Methods: every classifier the toolkit trains and evaluates, behind one interface (`base`).

    method = methods.from_config(config, methods.MethodSetup.from_labels(train_labels, K, shape))

`config.method` names the method; its own settings are its dataclass's fields, set by
`config.method_args` (a JSON object; the EDL family's are the config's prior, posterior and
objective fields). Registered here:

- "evidential": the EDL family (GEDL, EDL, I-EDL, R-EDL, RED, the ablation rows), `evidential`;
- "softmax": a softmax cross-entropy classifier (deep ensembles' members), `softmax`;
- "mc_dropout": MC Dropout, `softmax`;
- "duq": DUQ, `duq`; "kl_pn", "rkl_pn": Prior Networks, `prior_networks`; "postnet": Posterior
  Networks, `postnet`; "daedl": DAEDL, `daedl`; "fedl": F-EDL, `fedl` (`networks`: their
  backbones); "laplace": a softmax classifier with a last-layer Laplace posterior, `laplace`.
  Each names its reading (`config.recipe`: "protocol" or "source") in `describe()`.

Deep ensembles are not a method but a way to run any of them (`config.ensemble_size`): members
trained as seeds and scored as one model (`ensemble`).
"""

from __future__ import annotations

from gedl_jax import configuration
from gedl_jax.evaluation.posthoc import PosthocOptions
from gedl_jax.methods import daedl, duq, evidential, fedl, laplace, postnet, prior_networks, softmax
from gedl_jax.methods.base import LossOutput, Method, MethodSetup, StepContext
from gedl_jax.methods.common import AXIS, build_models, check_user_network
from gedl_jax.methods.own_loop import EvidentialObjective, ObjectiveState

__all__ = ["AXIS", "METHODS", "EvidentialObjective", "LossOutput", "Method", "MethodSetup",
           "ObjectiveState", "StepContext", "build_models", "check_config", "from_config",
           "evaluated_as", "method_class", "register"]

# config.method -> its class (`Method.build(config, setup)` builds it): adding a method is its
# file, one line here and its preset (configuration.VARIANTS).
METHODS: dict[str, type[Method]] = {
    "evidential": evidential.Evidential,
    "softmax": softmax.Softmax,
    "mc_dropout": softmax.MCDropout,
    "duq": duq.DUQ,
    "kl_pn": prior_networks.KLPriorNetwork,
    "rkl_pn": prior_networks.RKLPriorNetwork,
    "postnet": postnet.PostNet,
    "daedl": daedl.DAEDL,
    "fedl": fedl.FEDL,
    "laplace": laplace.LastLayerLaplace,
}


def register(name: str, method: type[Method]) -> None:
    """Make `config.method=name` build `method.build(config, setup)`."""
    METHODS[name] = method


def method_class(config) -> type[Method]:
    """The class of `config.method`."""
    name = config.method
    if name not in METHODS:
        raise ValueError(f"config.method={name!r} is not known; allowed: {sorted(METHODS)}")
    return METHODS[name]


def evaluated_as(name: str, trained_method: str) -> dict[str, str]:
    """The config fields that evaluate a run of `trained_method` as the method `name`, whose
    training that run's is (`Method.trains_as`: a softmax run as "laplace"), its own settings
    at their defaults; ValueError when `name` trains otherwise."""
    if name not in METHODS:
        raise ValueError(f"--as_method={name!r} is not a method; allowed: {sorted(METHODS)}")
    if METHODS[name].trains_as != trained_method:
        allowed = sorted(n for n, cls in METHODS.items() if cls.trains_as == trained_method)
        raise ValueError(f"--as_method={name}: a run of config.method={trained_method!r} "
                         f"is not a {name} run before its fit; a {trained_method} run can be "
                         f"evaluated as: {allowed or 'no other method'}")
    return {"method": name, "variant": name, "method_args": ""}


def check_config(config) -> None:
    """The method's own checks of the config (its `method_args`, the fields it needs), before
    any work: ValueError naming the setting, its value and what is allowed."""
    method_class(config).check_config(config)
    text = str(config.get("posthoc_scores", "auto") or "none").strip()
    if text not in ("auto", "none"):   # unknown names: one line listing the known ones
        try:
            PosthocOptions(tuple(n.strip() for n in text.split(",") if n.strip()))
        except ValueError as e:
            raise ValueError(f"config.posthoc_scores={text!r}: {e} Or 'auto' / 'none'.") from None


def from_config(config, setup: MethodSetup) -> Method:
    """The method `config.method` with the config's settings."""
    cls = method_class(config)
    if configuration.is_user_model(config.model):
        check_user_network(config, cls, setup.num_classes, setup.image_shape)
    return cls.build(config, setup)
