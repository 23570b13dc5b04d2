"""Reading the values of the config's text fields: list fields from comma-separated text, the
JSON objects (`method_args`, `model_kwargs`), the prior strength ('K', '0.1K'), and what a
dataset or model name says (your own data, your own network)."""

from __future__ import annotations

import json
import re
from typing import Any

import ml_collections

from gedl_jax.config.schema import LIST_FIELDS
from gedl_jax.data import registry

# `config.model` beyond the protocol networks: "resnet18", "mlp" or "<importable.module>:<Name>"
# (gedl_jax.networks.user); `config.dataset` / an OOD set: "npz:<path>", "tfds:<name>" or
# "images:<folder>".
PROTOCOL_MODELS = ("convnet", "vgg16")   # networks.Backbone; every other model is a user network
DATA_PREFIXES = registry.OWN_DATA_PREFIXES
MODEL_SPEC = re.compile(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*")


def is_custom_dataset(name: Any) -> bool:
    """Whether a dataset name is your own data ("npz:<path>", "tfds:<name>", "images:<folder>")."""
    return str(name).startswith(DATA_PREFIXES)


def defaults_key(dataset: str) -> str:
    """The `presets.DATASET_DEFAULTS` entry of a dataset: "custom" for npz:/tfds:/images: data."""
    return "custom" if is_custom_dataset(dataset) else dataset


def is_user_model(model: str) -> bool:
    """Whether `config.model` is loaded by `networks.user.load_network` (not the protocol
    ConvNet / VGG16)."""
    return model not in PROTOCOL_MODELS


def as_written(value: Any) -> str:
    """A list field's value as the command line writes it ("1,x", not "('1,x',)")."""
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value)
    return str(value)


def as_tuple(field: str, value: Any) -> tuple:
    """A list field's value as the tuple the config holds: a tuple or list, or comma-separated
    text (the command line's `--config.seeds=0,1,2`, which ml_collections passes on as the
    tuple ("0,1,2",) for a tuple of strings); empty items are dropped, seeds become ints."""
    items = value.split(",") if isinstance(value, str) else list(value)
    parts = [p for item in items
             for p in (item.split(",") if isinstance(item, str) else [item])]
    parts = [p.strip() if isinstance(p, str) else p for p in parts]
    parts = [p for p in parts if p != ""]
    if LIST_FIELDS[field] is int:
        try:
            return tuple(int(p) for p in parts)
        except (TypeError, ValueError):
            raise ValueError(f"config.{field}={as_written(value)} must be a list of integers, "
                             f"e.g. --config.{field}=0,1,2") from None
    return tuple(str(p) for p in parts)


def normalize_lists(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Every list field of `c` as a tuple of its items (`as_tuple`), in place; called once, where
    a config comes in from the command line or a saved config.json."""
    for field in LIST_FIELDS:
        if field in c:
            c[field] = as_tuple(field, c[field])
    return c


def set_fields(c: ml_collections.ConfigDict, **fields: Any) -> ml_collections.ConfigDict:
    """Set `fields` on `c` in place (list fields also from comma-separated text) and return it:
    `set_fields(config, ood_datasets="kmnist", num_epochs=3)`."""
    for key, value in fields.items():
        c[key] = as_tuple(key, value) if key in LIST_FIELDS else value
    return c


def parse_seeds(c: ml_collections.ConfigDict) -> list[int]:
    """The seeds of a run: `config.seeds`, else the one `config.seed`."""
    return list(as_tuple("seeds", c.seeds)) or [int(c.seed)]


def parse_list(value: Any) -> list[str]:
    """The items of a list field of names: ("a", "b") or "a, b,c" -> ["a", "b", "c"]; "" -> []."""
    return list(as_tuple("ood_datasets", value))


def json_object(c: ml_collections.ConfigDict, field: str) -> dict[str, Any]:
    """A JSON-object field (`method_args`, `model_kwargs`) as a dict, lists as tuples; {} when
    empty. The method checks `method_args`' names and values (`Method.resolved_settings`)."""
    what, example = {"method_args": ("the method's settings", '{"length_scale": 0.2}'),
                     "model_kwargs": ("constructor keywords", '{"width": 64}')}[field]
    text = str(c.get(field, "") or "").strip()
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as e:
        raise ValueError(f"config.{field}={text!r} is not JSON ({e}); give an object, "
                         f"e.g. '{example}'") from None
    if not isinstance(value, dict):
        raise ValueError(f"config.{field}={text!r} must be a JSON object of {what}, "
                         f"e.g. '{example}'")
    # JSON lists as tuples: a module's fields must be hashable (e.g. MLP's hidden=(64, 64))
    return {k: tuple(v) if isinstance(v, list) else v for k, v in value.items()}


def prior_strength(value: Any, num_classes: int) -> float:
    """`prior_strength_value` as a number: 'K' -> K, '0.1K' -> 0.1 K, numbers as they are.

    >>> prior_strength("0.1K", 10), prior_strength("K", 10), prior_strength(2, 10)
    (1.0, 10.0, 2.0)
    """
    if isinstance(value, (int, float)):
        return float(value)
    text = str(value).strip()
    try:
        if text.endswith("K"):
            factor = text[:-1].strip()
            return (float(factor) if factor else 1.0) * num_classes
        return float(text)
    except ValueError:
        raise ValueError(f"config.prior_strength_value={value!r} must be a number, 'K' or "
                         f"'<factor>K' (e.g. '0.1K' for R-EDL's lambda = 0.1)") from None
