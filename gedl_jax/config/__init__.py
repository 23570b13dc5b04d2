"""The experiment configuration, around one schema.

- `fields` / `schema`: every field once (default, type, allowed values, doc, group, list-ness,
  resume-safety) and its views (`FIELDS`, `ALLOWED`, `LIST_FIELDS`, `RESUME_SAFE_FIELDS`,
  `help_text`);
- `presets`: each dataset's protocol settings, the variants (`VARIANTS`) and modifiers, the
  configs they make (`default_config`, `build_config`);
- `values`: reading the text fields (lists, JSON objects, 'K'), what a name says;
- `checks`: the checks; `resolution`: the boundary, `ResolvedConfig`, the one config type the run
  engine and the methods read;
- `legacy`: what older runs wrote, in this version's spelling.

Imports nothing of gedl_jax above the data registry and the evidential math (whose tables give
the allowed values of the options it dispatches on).

    from gedl_jax import config
    c = config.build_config("mnist", "edl")          # a preset (its `source` recipes:
    c.learning_rate = 3e-4                           #   gedl_jax.configs.build_config)
    print(config.help_text("posterior"))             # every field of a group, with its doc
"""

from gedl_jax.config.fields import Field, PerDataset
from gedl_jax.config.legacy import (
    LEGACY_DEFAULTS,
    LEGACY_METHOD_FIELDS,
    legacy_flag_message,
    upgrade_saved,
)
from gedl_jax.config.presets import (
    DATASET_DEFAULTS,
    DEFAULT_METHOD,
    ENSEMBLE_PRESET,
    ENSEMBLE_SIZE,
    MODIFIERS,
    PER_DATASET,
    VARIANTS,
    apply_quick,
    apply_source,
    apply_variant,
    build_config,
    default_config,
    method_names,
)
from gedl_jax.config.resolution import (
    ResolvedConfig,
    ensemble_member_config,
    resolve,
    validate,
    with_seed,
)
from gedl_jax.config.schema import (
    ALLOWED,
    FIELDS,
    GROUPS,
    LIST_FIELDS,
    RESUME_SAFE_FIELDS,
    fields_by_group,
    groups_text,
    help_text,
)
from gedl_jax.config.values import (
    DATA_PREFIXES,
    PROTOCOL_MODELS,
    as_tuple,
    as_written,
    defaults_key,
    is_custom_dataset,
    is_user_model,
    json_object,
    normalize_lists,
    parse_list,
    parse_seeds,
    prior_strength,
    set_fields,
)

__all__ = [
    "ALLOWED", "DATASET_DEFAULTS", "DATA_PREFIXES", "DEFAULT_METHOD", "ENSEMBLE_PRESET",
    "ENSEMBLE_SIZE", "FIELDS", "GROUPS", "LEGACY_DEFAULTS", "LEGACY_METHOD_FIELDS",
    "LIST_FIELDS", "MODIFIERS", "PER_DATASET", "PROTOCOL_MODELS", "RESUME_SAFE_FIELDS",
    "VARIANTS", "Field", "PerDataset", "ResolvedConfig", "apply_quick", "apply_source",
    "apply_variant", "as_tuple", "as_written", "build_config", "default_config",
    "defaults_key", "ensemble_member_config", "fields_by_group", "groups_text", "help_text",
    "is_custom_dataset", "is_user_model", "json_object", "legacy_flag_message", "method_names",
    "normalize_lists", "parse_list", "parse_seeds", "prior_strength", "resolve",
    "set_fields", "upgrade_saved", "validate", "with_seed",
]
