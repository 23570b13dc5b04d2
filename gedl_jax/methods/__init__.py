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

from collections.abc import Callable

from gedl_jax import configuration
from gedl_jax.methods import daedl, duq, evidential, fedl, postnet, prior_networks, softmax
from gedl_jax.methods.base import LossOutput, Method, MethodSetup, StepContext
from gedl_jax.methods.common import AXIS, build_models, check_user_network
from gedl_jax.methods.objective import EvidentialObjective, ObjectiveState

__all__ = ["AXIS", "METHODS", "EvidentialObjective", "LossOutput", "Method", "MethodSetup",
           "ObjectiveState", "StepContext", "build_models", "from_config", "register"]

# config.method -> builder(config, setup): adding a method is its file and one line here.
METHODS: dict[str, Callable[..., Method]] = {
    "evidential": evidential.build,
    "softmax": softmax.build_softmax,
    "mc_dropout": softmax.build_mc_dropout,
    "duq": duq.build,
    "kl_pn": prior_networks.build_kl_pn,
    "rkl_pn": prior_networks.build_rkl_pn,
    "postnet": postnet.build,
    "daedl": daedl.build,
    "fedl": fedl.build,
}


def register(name: str, builder: Callable[..., Method]) -> None:
    """Make `config.method=name` build `builder(config, setup)`."""
    METHODS[name] = builder


def from_config(config, setup: MethodSetup) -> Method:
    """The method `config.method` with the config's settings."""
    name = config.method
    if name not in METHODS:
        raise ValueError(f"config.method={name!r} is not known; allowed: {sorted(METHODS)}")
    if configuration.is_user_model(config.model):
        check_user_network(config, setup.num_classes, setup.image_shape)
    return METHODS[name](config, setup)
