"""The boundary: a config is resolved once, where a run starts (or a workdir is restored), into a
`ResolvedConfig`, the one config type the run engine and the methods read.

`resolve` copies the config (the caller's is left as it is), normalises its list fields, sets
the fields your own data decides, parses its text fields once (the JSON objects `method_args`
and `model_kwargs`, the prior strength 'K' / '0.1K'), checks every field (`checks.check`),
resolves the method's own settings once (a function the caller passes: the methods are above
this package) and freezes the result. Copies for one seed or one ensemble member keep all of it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_collections

from gedl_jax.config import checks as checks_lib
from gedl_jax.config.values import json_object, normalize_lists, prior_strength, set_fields


class ResolvedConfig(ml_collections.FrozenConfigDict):
    """A run's config as `resolve` returns it: read-only (setting a field raises
    AttributeError), so nothing below the run's entry point changes or resolves it again. Its
    text fields that hold values are parsed once, when it is made (`method_arguments`,
    `model_arguments`, `prior_strength_W`), and it carries the method's resolved settings
    (`method_settings`)."""

    def __init__(self, c: ml_collections.ConfigDict, parsed: dict[str, Any] | None = None):
        super().__init__(c)
        # Not fields (config.json and the field list stay as they are): plain attributes of this
        # object, set past FrozenConfigDict's refusal of new attributes.
        object.__setattr__(self, "_parsed", dict(parsed) if parsed is not None else {
            "method_args": json_object(self, "method_args"),
            "model_kwargs": json_object(self, "model_kwargs"),
            "prior_strength": prior_strength(self.prior_strength_value, self.num_classes)})

    @property
    def method_arguments(self) -> dict[str, Any]:
        """`method_args` parsed (a new dict each time, so no reader can change another's)."""
        return dict(self._parsed["method_args"])

    @property
    def model_arguments(self) -> dict[str, Any]:
        """`model_kwargs` parsed (a new dict each time)."""
        return dict(self._parsed["model_kwargs"])

    @property
    def prior_strength_W(self) -> float:
        """The prior strength W as a number ('K' and '0.1K' resolved)."""
        return self._parsed["prior_strength"]

    @property
    def method_settings(self) -> dict[str, Any]:
        """The method's own settings (its defaults, `method_args` over them, checked), resolved
        once by `resolve` (a new dict each time)."""
        if "method_settings" not in self._parsed:
            raise ValueError("this config was resolved without its method's settings: resolve "
                             "it with gedl_jax.run.experiment.resolve_config (as a run does)")
        return dict(self._parsed["method_settings"])

    def replaced(self, **fields: Any) -> ResolvedConfig:
        """A copy with `fields` changed (a seed, an ensemble's members) and everything parsed and
        resolved kept: such changes leave the method, its settings and every check as they are,
        so nothing is parsed, resolved or validated again."""
        return ResolvedConfig(set_fields(self.as_configdict(), **fields), self._parsed)


MethodSettings = Callable[[ResolvedConfig], dict[str, Any]]


OwnData = Callable[[ml_collections.ConfigDict], dict[str, Any]]


def resolve(c: ml_collections.ConfigDict, num_devices: int = 1,
            own_data: OwnData | None = None,
            method_settings: MethodSettings | None = None) -> ResolvedConfig:
    """The config a run reads, resolved once where it starts: a copy of `c` (left as it is) with
    its list fields as tuples, the fields your own data decides set (`own_data(c)`:
    num_classes, model), its text fields parsed, checked (`checks.check`), the method's
    settings resolved by `method_settings` (the methods' `settings_for`) and frozen. A
    `ResolvedConfig` is returned as it is (the only place that asks which type a config is)."""
    if isinstance(c, ResolvedConfig):
        return c
    copy = (c.as_configdict() if isinstance(c, ml_collections.FrozenConfigDict)
            else c.copy_and_resolve_references())
    normalize_lists(copy)
    resolved = ResolvedConfig(set_fields(copy, **(own_data(copy) if own_data else {})))
    checks_lib.check(resolved, num_devices)
    if method_settings is not None:
        resolved._parsed["method_settings"] = method_settings(resolved)
    return resolved


def validate(c: ml_collections.ConfigDict, num_devices: int = 1) -> None:
    """Raise ValueError for a bad config before any work (what `resolve` checks), leaving `c`
    as it is: for a command line or a notebook that checks a config before it runs."""
    resolve(c, num_devices)


def with_seed(c: ResolvedConfig, seed: int) -> ResolvedConfig:
    """The config of one seed of a several-seed run (`seeds` cleared)."""
    return c.replaced(seed=int(seed), seeds=())


def ensemble_member_config(c: ResolvedConfig) -> ResolvedConfig:
    """The config of a deep ensemble's members: the same method and settings, no ensemble, no
    evaluation of its own (the ensemble is evaluated as one model)."""
    return c.replaced(ensemble_size=0, seeds=(), evaluate_at_end=False, plots=False)
