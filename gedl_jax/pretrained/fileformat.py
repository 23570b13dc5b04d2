"""The pretrained-model file: one msgpack file (`flax.serialization`) with the weights and what
they need besides.

Top-level map, in this order:
    "format"        "gedl-jax-pretrained"
    "version"       1
    "metadata"      a JSON text (sorted keys): the run's resolved config ("config"), its committed
                    evaluation ("eval_results"), the method's setup from the training split
                    ("setup": num_classes, class_counts, image_shape), the input normalisation
                    ("normalization": [mean, std] or null) and where the weights come from
                    ("source": the checkpoint's step, epoch and validation accuracy) and the
                    weights' own checksum ("weights_sha256", `weights_sha256`; files exported
                    before it have none: their registry entry carries it)
    "variables"     the flax variables the model applies ({"params": ..., "batch_stats": ...})
    "method_state"  the method's state after training (and after its fit, e.g. DAEDL's
                    Gaussians), as a flax state dict

Arrays are stored as raw little-endian bytes with their shape and dtype, so a restored array is
bit-identical to the checkpoint's. Every map is written with sorted keys, so the same weights and
metadata always give the same bytes (and the same sha256).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import numpy as np
from flax import serialization

FORMAT = "gedl-jax-pretrained"
VERSION = 1


class PretrainedFormatError(ValueError):
    """The file is not a gedl-jax pretrained model (or a newer version of the format)."""


def _sorted_numpy(tree: Any) -> Any:
    """Nested maps with sorted string keys and NumPy leaves (deterministic msgpack bytes)."""
    if isinstance(tree, dict):
        return {str(k): _sorted_numpy(tree[k]) for k in sorted(tree, key=str)}
    if isinstance(tree, (list, tuple)):
        return {str(i): _sorted_numpy(v) for i, v in enumerate(tree)}
    return np.asarray(tree)


def to_bytes(metadata: dict[str, Any], variables: Any, method_state: Any) -> bytes:
    """The file's bytes. `method_state` may be any flax-serialisable pytree (a struct dataclass
    becomes a map of its fields)."""
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "metadata": json.dumps(metadata, sort_keys=True, allow_nan=True),
        "variables": _sorted_numpy(serialization.to_state_dict(variables)),
        "method_state": _sorted_numpy(serialization.to_state_dict(method_state)),
    }
    return serialization.msgpack_serialize(payload)


def weights_sha256(variables: Any, method_state: Any) -> str:
    """sha256 of the weights as the file stores them (the variables and the method state, in
    their canonical bytes): the same for the trained state and for what a file restores. A file
    whose weights were changed after export no longer matches the number recorded at export,
    even when its own sha256 was registered again, so the results it carries are not taken for
    those of other weights."""
    canonical = {"variables": _sorted_numpy(serialization.to_state_dict(variables)),
                 "method_state": _sorted_numpy(serialization.to_state_dict(method_state))}
    return hashlib.sha256(serialization.msgpack_serialize(canonical)).hexdigest()


def from_bytes(blob: bytes, origin: str) -> tuple[dict[str, Any], dict, dict]:
    """(metadata, variables, method_state state dict) of a file's bytes."""
    try:
        payload = serialization.msgpack_restore(blob)
    except Exception as e:  # noqa: BLE001 (msgpack raises several kinds on foreign bytes)
        raise PretrainedFormatError(f"{origin} is not a gedl-jax pretrained model file "
                                    f"({type(e).__name__})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise PretrainedFormatError(f"{origin} is not a gedl-jax pretrained model file")
    if payload.get("version") != VERSION:
        raise PretrainedFormatError(
            f"{origin} is format version {payload.get('version')}; this gedl-jax reads version "
            f"{VERSION}: use the gedl-jax release that wrote it, or a newer one")
    return (json.loads(payload["metadata"]), payload["variables"],
            payload.get("method_state") or {})


def write(path: str | os.PathLike, metadata: dict[str, Any], variables: Any,
          method_state: Any) -> bytes:
    """Write the file (atomically) and return its bytes."""
    from gedl_jax import files

    blob = to_bytes(metadata, variables, method_state)
    files.write_with(path, lambda f: f.write(blob))
    return blob
