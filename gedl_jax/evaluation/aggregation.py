"""Mean and spread over runs (seeds) of ``evaluate_outputs`` results: what the tables print.

``aggregate(results)`` turns a list of result dicts (one per seed) into the same tree with every
number replaced by ``{"mean", "std", "n"}`` (std = sample std, ddof=1; None for a single run).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["aggregate"]

_SKIP_KEYS = frozenset({"conventions", "seed"})   # not aggregated


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool,
                                                                                        np.bool_))


def _stats(values: list[Any]) -> dict[str, Any]:
    vals = [float(v) for v in values if _is_number(v) and math.isfinite(float(v))]
    n = len(vals)
    if n == 0:
        return {"mean": None, "std": None, "n": 0}
    return {"mean": float(np.mean(vals)), "std": float(np.std(vals, ddof=1)) if n > 1 else None,
            "n": n}


def _aggregate_nodes(nodes: list[Any]) -> Any:
    dicts = [x for x in nodes if isinstance(x, Mapping)]
    if dicts:
        keys = list(dict.fromkeys(k for d in dicts for k in d))
        out = {}
        for k in keys:
            if k in _SKIP_KEYS:
                continue
            sub = _aggregate_nodes([d[k] for d in dicts if k in d])
            if sub is not None:
                out[k] = sub
        return out or None
    if any(_is_number(x) for x in nodes) or (nodes and all(x is None for x in nodes)):
        return _stats(nodes)
    return None   # strings, lists (per-bin data): not aggregated


def aggregate(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Mean and spread of every number over runs (e.g. seeds) of ``evaluate_outputs`` results.

    Returns the union tree of the inputs where each numeric leaf becomes
    ``{"mean": float | None, "std": float | None, "n": int}``: mean and *sample* standard deviation
    (ddof=1; None when n == 1) over the runs where the leaf is a finite number (null / missing
    entries are left out and ``n`` counts the rest). Strings, lists (per-bin calibration data) and
    the keys "conventions" and "seed" are not aggregated.
    """
    if not results:
        raise ValueError("aggregate() needs at least one result.")
    return _aggregate_nodes(list(results)) or {}
