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

from typing import Any

from gedl_jax import config as config_lib
from gedl_jax.config import ResolvedConfig
from gedl_jax.evaluation.posthoc import PosthocOptions
from gedl_jax.methods import daedl, duq, evidential, fedl, laplace, postnet, prior_networks, softmax
from gedl_jax.methods.base import LossOutput, Method, MethodSetup, StepContext
from gedl_jax.methods.common import AXIS, build_models, check_user_network
from gedl_jax.methods.own_loop import EvidentialObjective, ObjectiveState

__all__ = ["AXIS", "METHODS", "EvidentialObjective", "LossOutput", "Method", "MethodSetup",
           "ObjectiveState", "StepContext", "build", "build_models", "check_config", "from_config",
           "evaluated_as", "method_class", "register", "resolved", "settings_for",
           "source_recipes"]

# config.method -> its class (`Method.build(config, setup)` builds it): adding a method is its
# file, one line here and its preset (config.VARIANTS).
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


def source_recipes() -> dict[str, dict[str, dict[str, Any]]]:
    """{method: its `source_recipe`} of every method that has one: what the `source` modifier
    applies (`gedl_jax.configs.build_config` hands it to `config.build_config`)."""
    return {name: cls.source_recipe for name, cls in METHODS.items() if cls.source_recipe}


def settings_for(config: ResolvedConfig) -> dict[str, Any]:
    """The method's own settings of a run (its defaults, `config.method_args` over them,
    checked) after its checks of the config's other fields, before any work: ValueError naming
    the setting, its value and what is allowed. `run.experiment.resolve_config` calls it once,
    where the run's config is resolved, and the config keeps them (`config.method_settings`)."""
    cls = method_class(config)
    if config.recipe == "source" and not cls.source_recipe:
        raise ValueError(f"config.recipe='source' is not available for config.method="
                         f"{config.method!r} (sources exist for {sorted(source_recipes())}); "
                         f"use config.recipe='protocol'")
    cls.check_config(config)
    settings = cls.resolved_settings(config.method_arguments, int(config.num_classes),
                                     config.dataset)
    text = str(config.get("posthoc_scores", "auto") or "none").strip()
    if text not in ("auto", "none"):   # unknown names: one line listing the known ones
        try:
            PosthocOptions(tuple(n.strip() for n in text.split(",") if n.strip()))
        except ValueError as e:
            raise ValueError(f"config.posthoc_scores={text!r}: {e} Or 'auto' / 'none'.") from None
    return settings


def resolved(config) -> ResolvedConfig:
    """`config` resolved with its method's settings (`config.resolve` with `settings_for`; a
    resolved config as it is): how a config comes into the methods."""
    return config_lib.resolve(config, method_settings=settings_for)


def check_config(config) -> None:
    """The method's checks of `config` (its settings and the fields it needs), before any
    work: ValueError naming the setting, its value and what is allowed (`resolved`)."""
    resolved(config)


def from_config(config, setup: MethodSetup) -> Method:
    """The method `config.method` with the config's settings (`config` resolved if it is
    not: `resolved`, then `build`)."""
    return build(resolved(config), setup)


def build(config: ResolvedConfig, setup: MethodSetup) -> Method:
    """The method of a resolved config (what a run builds: its settings are the config's
    `method_settings`)."""
    cls = method_class(config)
    if config_lib.is_user_model(config.model):
        check_user_network(config, cls, setup.num_classes, setup.image_shape)
    return cls.build(config, setup)
