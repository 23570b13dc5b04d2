"""Deprecated: the configuration moved to the package `gedl_jax.config` (one schema, presets,
resolution and validation in modules of their own) and the `source` recipes to the methods.
This module keeps the old names in 0.1.0, with a DeprecationWarning; 0.2.0 removes it:

- `build_config` is `gedl_jax.configs.build_config` (the presets with the methods' recipes);
- `validate_config` is `gedl_jax.config.validate`;
- `check_ood_groups(config, names)` / `add_ood_groups` are `gedl_jax.data`'s, taking
  `config.ood_groups`;
- `SOURCE_RECIPES` is `gedl_jax.methods.source_recipes()` (each method's `source_recipe`);
- everything else is `gedl_jax.config.<name>`.
"""

from __future__ import annotations

import warnings
from typing import Any

warnings.warn("gedl_jax.configuration is deprecated (removed in 0.2.0): use gedl_jax.config "
              "(and gedl_jax.configs.build_config for the presets)", DeprecationWarning,
              stacklevel=2)

from gedl_jax import config as _config  # noqa: E402
from gedl_jax.config import *  # noqa: E402,F401,F403
from gedl_jax.configs import build_config  # noqa: E402,F401

validate_config = _config.validate


def check_ood_groups(c, ood_names) -> dict[str, str]:
    """Deprecated: `gedl_jax.data.check_ood_groups(config.ood_groups, ood_names)`."""
    from gedl_jax import data

    return data.check_ood_groups(c.get("ood_groups", ()), ood_names)


def add_ood_groups(entries, added) -> tuple[str, ...]:
    """Deprecated: `gedl_jax.data.add_ood_groups`."""
    from gedl_jax import data

    return data.add_ood_groups(entries, added)


def __getattr__(name: str) -> Any:
    if name == "SOURCE_RECIPES":
        from gedl_jax import methods

        return methods.source_recipes()
    raise AttributeError(f"module 'gedl_jax.configuration' has no attribute {name!r}")
