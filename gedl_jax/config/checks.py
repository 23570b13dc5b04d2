"""The config's checks (`check`): every field against its schema and the other fields, before
any work; a ValueError names the field and what is allowed."""

from __future__ import annotations

import math
from typing import Any

import ml_collections

from gedl_jax.config.presets import DATASET_DEFAULTS, method_names
from gedl_jax.config.schema import ALLOWED, LIST_FIELDS
from gedl_jax.config.values import (
    MODEL_SPEC,
    PROTOCOL_MODELS,
    as_written,
    defaults_key,
    is_custom_dataset,
    is_user_model,
    parse_seeds,
)
from gedl_jax.data import registry


def check(c, num_devices: int = 1) -> None:
    """Raise ValueError naming the field and its allowed values before any work starts; `c`
    is a `ResolvedConfig` (its JSON fields and W parsed once, by `resolve`)."""
    for field, item_type in LIST_FIELDS.items():
        value = c.get(field, ())
        if not isinstance(value, tuple) or not all(isinstance(v, item_type) for v in value):
            raise ValueError(f"config.{field}={as_written(value)} must be a tuple of "
                             f"{item_type.__name__} (config.normalize_lists turns \"a,b\" into "
                             f"one)")
    _validate_own(c)
    for field, allowed in {**ALLOWED, "method": method_names()}.items():
        value = c.get(field)
        if value not in allowed and not _own_choice(field, value):
            own = {"model": " or '<importable.module>:<Name>'",
                   "dataset": " or 'npz:<path>', 'tfds:<name>', 'images:<folder>'"
                   }.get(field, "")
            raise ValueError(f"config.{field}={value!r} is not allowed; allowed values: "
                             f"{list(allowed)}{own}")
    for field, value in c.items():
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"config.{field}={value!r} must be a finite number")
    k_from_data = is_custom_dataset(c.dataset) and c.num_classes == 0   # set from the data
    if c.num_classes < 2 and not k_from_data:
        raise ValueError(f"config.num_classes={c.num_classes} must be >= 2")
    positive = ("learning_rate", "batch_size", "num_epochs", "eval_batch_size",
                "eval_every_epochs", "log_every_steps", "steps_per_dispatch", "c_tau", "exp_clip",
                "annealing_epochs", "mc_samples")
    for field in positive:
        if not c[field] > 0:
            raise ValueError(f"config.{field}={c[field]!r} must be > 0")
    non_negative = ("weight_decay", "kl_weight", "fisher_logdet_weight", "red_regularizer_weight",
                    "warmup_epochs", "train_examples", "val_examples", "eval_examples",
                    "checkpoint_every_steps", "checkpoint_interval_seconds",
                    "grad_clip_norm", "c_w")
    for field in non_negative:
        if c[field] < 0:
            raise ValueError(f"config.{field}={c[field]!r} must be >= 0")
    if not 0.0 <= c.dropout_rate < 1.0:
        raise ValueError(f"config.dropout_rate={c.dropout_rate!r} must be in [0, 1)")
    if c.ensemble_size < 0 or c.ensemble_size == 1:
        raise ValueError(f"config.ensemble_size={c.ensemble_size} must be 0 (no ensemble) or "
                         f">= 2 members")
    _validate_evaluation(c)
    if not 0.0 < c.val_fraction < 1.0:
        raise ValueError(f"config.val_fraction={c.val_fraction!r} must be in (0, 1)")
    if c.batch_size % num_devices:
        raise ValueError(f"config.batch_size={c.batch_size} is not divisible by the number of "
                         f"devices ({num_devices}); use a multiple of {num_devices}")
    if c.eval_batch_size % num_devices:
        raise ValueError(f"config.eval_batch_size={c.eval_batch_size} is not divisible by the "
                         f"number of devices ({num_devices})")
    w = c.prior_strength_W
    if c.prior_strength == "fixed" and not w > 0 and not k_from_data:
        raise ValueError(f"config.prior_strength_value={c.prior_strength_value!r} must give W > 0")
    if c.warmup_epochs >= c.num_epochs:
        raise ValueError(f"config.warmup_epochs={c.warmup_epochs} must be < num_epochs="
                         f"{c.num_epochs}")
    seeds = parse_seeds(c)
    for field, values in (("seed", [c.seed]), ("seeds", list(c.seeds))):
        if any(not 0 <= v < 2**32 for v in values):   # a PRNG seed: an unsigned 32-bit int
            raise ValueError(f"config.{field}={as_written(c[field])}: a seed must be in "
                             f"[0, 2**32)")
    if c.dataset in c.get("ood_datasets", ()):
        others = ",".join(o for o in c.ood_datasets if o != c.dataset)
        raise ValueError(f"config.ood_datasets={','.join(c.ood_datasets)!r} lists "
                         f"{c.dataset!r}, the dataset trained on (config.dataset): leave it out "
                         f"(--config.ood_datasets={others}), its test set is not OOD")
    _validate_no_repeats(c)
    if c.vmap_seeds and len(seeds) > 1 and c.base_rate == "label_frequency" \
            and c.split_seed < 0:
        raise ValueError("config.vmap_seeds=True with config.base_rate='label_frequency' needs one "
                         "train split for all seeds (its base rate is compiled into the step): "
                         "set config.split_seed, or config.vmap_seeds=False")
    _validate_distributed(c)
    expected_model = DATASET_DEFAULTS[defaults_key(c.dataset)]["model"]
    if c.model != expected_model:
        # Not an error (a user may try VGG on MNIST) but the input shape must suit the model.
        if c.model == "vgg16" and registry.dataset_family(c.dataset) == "mnist":
            raise ValueError("config.model='vgg16' needs 32x32 RGB input; MNIST-family data is "
                             "28x28x1: use config.model='convnet'")


def _validate_evaluation(c: ml_collections.ConfigDict) -> None:
    """The evaluation extras' fields (`_evaluation_fields`)."""
    if not 0.0 < c.get("conformal_alpha", 0.1) < 1.0:
        raise ValueError(f"config.conformal_alpha={c.conformal_alpha!r} must be in (0, 1)")
    if not 0.0 < c.get("bootstrap_confidence", 0.95) < 1.0:
        raise ValueError(f"config.bootstrap_confidence={c.bootstrap_confidence!r} must be in "
                         f"(0, 1)")
    if c.get("bootstrap_samples", 0) < 0 or c.get("bootstrap_samples", 0) == 1:
        raise ValueError(f"config.bootstrap_samples={c.bootstrap_samples!r} must be 0 (none) or "
                         f">= 2 (1,000 is usual)")
    try:   # which sets it may name: registry.check_ood_groups, where they are known
        registry.parse_ood_groups(c.get("ood_groups", ()))
    except ValueError as e:
        raise ValueError(f"config.ood_groups: {e}") from None


def _identity(field: str):
    """What makes two items of a list field the same item: an OOD set by the set it names
    (`registry.ood_identity`: real paths), anything else by its value."""
    return registry.ood_identity if field in ("ood_datasets", "extra_ood") else (lambda v: v)


def _repeats(items, identity) -> list[str]:
    """The items of `items` that name one already listed, as written ("x/../a.npz (=
    a.npz)" where the spellings differ)."""
    first: dict[Any, Any] = {}
    repeated = []
    for item in items:
        key = identity(item)
        if key in first:
            same = str(first[key]) == str(item)
            repeated.append(str(item) if same else f"{item} (= {first[key]})")
        else:
            first[key] = item
    return sorted(set(repeated))


def _validate_no_repeats(c: ml_collections.ConfigDict) -> None:
    """A seed or an OOD set listed twice (also under two spellings of one path) would be
    trained or scored twice."""
    for field in LIST_FIELDS:
        items = list(c.get(field, ()))
        repeated = _repeats(items, _identity(field))
        if repeated:
            raise ValueError(f"config.{field}={as_written(items)} lists "
                             f"{', '.join(repeated)} twice: list each once")
    both = _repeats([*c.get("ood_datasets", ()), *c.get("extra_ood", ())],
                    registry.ood_identity)
    if both:
        raise ValueError(f"{', '.join(both)} is in both config.ood_datasets and "
                         f"config.extra_ood: list each OOD set once")


def _validate_distributed(c: ml_collections.ConfigDict) -> None:
    given = [f for f, unset in (("coordinator_address", ""), ("num_processes", 0),
                                ("process_id", -1)) if c.get(f, unset) != unset]
    if given and not c.distributed:
        raise ValueError(f"config.{given[0]} is set but config.distributed=False: add "
                         f"--config.distributed=True to start a multi-process run")
    address = str(c.get("coordinator_address", ""))
    if address:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"config.coordinator_address={address!r} must be 'host:port' "
                             f"(e.g. '10.0.0.1:1234'), the address of process 0")
    num_processes, process_id = int(c.get("num_processes", 0)), int(c.get("process_id", -1))
    if num_processes < 0:
        raise ValueError(f"config.num_processes={num_processes} must be >= 1 (0 = auto-detect)")
    if process_id < -1 or (num_processes and process_id >= num_processes):
        raise ValueError(f"config.process_id={process_id} must be in [0, num_processes="
                         f"{num_processes}) (-1 = auto-detect)")
    if (num_processes > 0) != (process_id >= 0):
        raise ValueError("config.num_processes and config.process_id go together: set both "
                         "(or neither, to auto-detect them from the cluster)")


def _own_choice(field: str, value: Any) -> bool:
    """Values allowed beyond `ALLOWED`: own data and own networks."""
    if field == "dataset":
        return is_custom_dataset(value) or value == "custom"
    return field == "model" and isinstance(value, str) and (
        value == "" or bool(MODEL_SPEC.fullmatch(value)))   # "": from the data (_validate_own)


def _validate_own(c: ml_collections.ConfigDict) -> None:
    """The config-only checks of own data and networks (the network's contract and the arrays
    are checked when they load, before any step)."""
    if c.dataset == "custom":
        raise ValueError("config.dataset='custom' names no data: give --config.dataset="
                         "npz:<path to .npz>, tfds:<prepared TFDS name> or images:<folder>")
    if c.model == "" and not is_custom_dataset(c.dataset):
        raise ValueError("config.model is empty: give --config.model=convnet, vgg16, resnet18, "
                         "mlp or <importable.module>:<Name>")
    if c.model_kwargs and not is_user_model(c.model):
        raise ValueError(f"config.model_kwargs is for own networks (resnet18, mlp, "
                         f"<module>:<Name>); config.model={c.model!r} takes none")
    if c.recipe == "source" and c.model not in PROTOCOL_MODELS:
        raise ValueError(f"config.recipe='source' rebuilds the reference's own networks; "
                         f"config.model={c.model!r} is not one of them: use "
                         f"config.recipe='protocol'")
