"""What older runs wrote, read in this version's spelling: fields added since runs were
published (`LEGACY_DEFAULTS`), and the method settings that were flat fields before
`config.method_args` (`LEGACY_METHOD_FIELDS`, `upgrade_saved`, `legacy_flag_message`)."""

from __future__ import annotations

import json
from typing import Any

import ml_collections

from gedl_jax.config.values import json_object

# Fields added after runs had been published, with the value those earlier runs used. A workdir's
# config.json that lacks such a field is read with this value (to resume or evaluate it).
LEGACY_DEFAULTS: dict[str, Any] = {"init": "torch"}

# Method settings that were flat config fields before `config.method_args`: old field -> (the
# methods that read it, its name in method_args). A saved config.json (an old workdir, a
# pretrained model) is read through `upgrade_saved`; the command line names the new spelling.
LEGACY_METHOD_FIELDS: dict[str, tuple[tuple[str, ...], str]] = {
    "duq_length_scale": (("duq",), "length_scale"),
    "duq_gamma": (("duq",), "gamma"),
    "duq_gradient_penalty": (("duq",), "gradient_penalty"),
    "pn_ood": (("kl_pn", "rkl_pn"), "ood"),
    "pn_ood_weight": (("kl_pn", "rkl_pn"), "ood_weight"),
    "pn_target_form": (("kl_pn", "rkl_pn"), "target_form"),
    "pn_target_concentration": (("kl_pn", "rkl_pn"), "target_concentration"),
    "pn_target_smoothing": (("kl_pn", "rkl_pn"), "target_smoothing"),
    "pn_kl_epsilon": (("kl_pn", "rkl_pn"), "kl_epsilon"),
    "postnet_latent_dim": (("postnet",), "latent_dim"),
    "postnet_flow_layers": (("postnet",), "flow_layers"),
    "postnet_entropy_weight": (("postnet",), "entropy_weight"),
    "daedl_kl_weight": (("daedl",), "kl_weight"),
    "daedl_logit_clip": (("daedl",), "logit_clip"),
    "fedl_head_hidden": (("fedl",), "head_hidden"),
    "fedl_head_dropout": (("fedl",), "head_dropout"),
}


def upgrade_saved(saved: dict[str, Any]) -> dict[str, Any]:
    """A saved config.json's fields in this version's spelling: the old flat method settings
    (`LEGACY_METHOD_FIELDS`) of the run's method move into `method_args` with the values the run
    used (a value also given in method_args wins); those of other methods are dropped."""
    saved = dict(saved)
    flat = {name: saved.pop(name) for name in LEGACY_METHOD_FIELDS if name in saved}
    moved = {LEGACY_METHOD_FIELDS[name][1]: value for name, value in flat.items()
             if saved.get("method") in LEGACY_METHOD_FIELDS[name][0]}
    if moved:
        given = json_object(ml_collections.ConfigDict({"method_args":
                                                       saved.get("method_args", "")}),
                            "method_args")
        saved["method_args"] = json.dumps({**moved, **given}, sort_keys=True)
    return saved


def legacy_flag_message(name: str) -> str | None:
    """The error for an old flat method setting on the command line (`--config.<name>=...`):
    its new spelling; None for any other name."""
    if name not in LEGACY_METHOD_FIELDS:
        return None
    owners, key = LEGACY_METHOD_FIELDS[name]
    return (f"--config.{name} was replaced by config.method_args (the settings of "
            f"config.method={' or '.join(owners)}): use --config.method_args='{{\"{key}\": "
            f"<value>}}'")
