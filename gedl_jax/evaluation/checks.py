"""The evaluation's input checks, each written once.

Every module of ``gedl_jax.evaluation`` that takes arrays or settings from its caller checks them
here, so a mistake reads the same wherever it is made. A check returns the value in the form the
evaluation computes with (float64 arrays, int64 labels, bool masks) or raises ValueError with one
line: the argument's name, what it must be, and what it got. An empty set passes the array checks
(`nonempty` is where a caller needs examples).

>>> class_labels([0, 2], 2, 3).dtype.name
'int64'
>>> class_labels(np.zeros(0, np.int64), 0, 3).size   # an empty set passes
0
>>> class_labels([0, 3], 2, 3)
Traceback (most recent call last):
ValueError: labels_N must lie in [0, 3).
>>> matrix(np.ones(3), "features_NxF", min_columns=1)
Traceback (most recent call last):
ValueError: features_NxF must have shape (N, F) with F >= 1, got (3,).
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable
from typing import Any

import numpy as np

__all__ = ["SIMPLEX_ATOL", "binary", "class_labels", "count", "dirichlet", "distributions",
           "finite", "known", "mask", "matrix", "nonempty", "one_of", "open_unit", "pair",
           "positive", "positive_entries", "prior_strength", "probabilities", "real_numbers",
           "stacked_probabilities", "vector"]

# Rows of probabilities must sum to 1 within this tolerance (float32 softmax / alpha/S sums are
# ~1e-6 off).
SIMPLEX_ATOL = 1e-4


# ------------------------------------------------------------------------------------- shapes
def _axes(name: str) -> tuple[str, str]:
    """The axis letters a name spells (`features_NxF`: N, F); (N, K) otherwise."""
    spelled = re.search(r"_([A-Z])x([A-Z])$", name)
    return (spelled.group(1), spelled.group(2)) if spelled else ("N", "K")


def matrix(x: Any, name: str, min_columns: int = 2, *, need_examples: bool = False
           ) -> np.ndarray:
    """`x` as a float64 (N, K) array with K >= `min_columns` (and N >= 1 with
    `need_examples`)."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] < min_columns:
        rows, columns = _axes(name)
        raise ValueError(f"{name} must have shape ({rows}, {columns}) with {columns} >= "
                         f"{min_columns}, got {x.shape}.")
    return nonempty(x, name) if need_examples else x


def vector(x: Any, name: str) -> np.ndarray:
    """`x` as a 1-D array (its dtype kept)."""
    x = np.asarray(x)
    if x.ndim != 1:
        raise ValueError(f"{name} must be 1-D of shape (N,), got shape {x.shape}.")
    return x


def pair(a: Any, b: Any, name_a: str, name_b: str) -> tuple[np.ndarray, np.ndarray]:
    """(a, b) if both are 1-D of the same length (one value per example each; dtypes kept)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.ndim != 1 or b.shape != a.shape:
        raise ValueError(f"{name_a} and {name_b} must be 1-D of equal shape (N,), got {a.shape} "
                         f"and {b.shape}.")
    return a, b


def nonempty(x: np.ndarray, name: str) -> np.ndarray:
    """`x` if it has at least one example (row)."""
    if x.shape[0] == 0:
        raise ValueError(f"{name} has no examples.")
    return x


# ------------------------------------------------------------------------------------- values
def finite(x: np.ndarray, name: str) -> np.ndarray:
    """`x` if every entry is finite."""
    if not np.all(np.isfinite(x)):
        raise ValueError(f"{name} contains NaN or infinite values.")
    return x


def positive_entries(x: np.ndarray, name: str, allow_zero: bool = False) -> np.ndarray:
    """`x` if every entry is finite and > 0 (>= 0 with `allow_zero`)."""
    x = finite(x, name)
    if x.size and (x.min() < 0 if allow_zero else x.min() <= 0):
        raise ValueError(f"{name} must be {'>=' if allow_zero else '>'} 0, got min {x.min()}.")
    return x


def real_numbers(x: Any, name: str) -> np.ndarray:
    """`x` as float64 if it holds real numbers and no NaN (infinities pass: a score may be
    -inf)."""
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.number) or np.issubdtype(x.dtype, np.complexfloating):
        raise ValueError(f"{name} must be real numbers, got dtype {x.dtype}.")
    x = x.astype(np.float64)
    if np.isnan(x).any():
        raise ValueError(f"{name} contains NaN.")
    return x


def binary(x: Any, name: str) -> np.ndarray:
    """`x` as bool if it is boolean or holds only the integers 0 and 1."""
    x = np.asarray(x)
    if x.dtype == np.bool_:
        return x
    if not (np.issubdtype(x.dtype, np.integer) and np.all((x == 0) | (x == 1))):
        raise ValueError(f"{name} must be boolean or hold only 0 and 1.")
    return x.astype(np.bool_)


def probabilities(x: Any, name: str, rows_sum_to_one: bool = True) -> np.ndarray:
    """`x` as float64 if its entries are finite probabilities in [0, 1] and (with
    `rows_sum_to_one`) each row, along the last axis, sums to 1 within ``SIMPLEX_ATOL``."""
    x = finite(np.asarray(x, dtype=np.float64), name)
    if x.size and (x.min() < 0 or x.max() > 1):
        raise ValueError(f"{name} must hold probabilities in [0, 1], got range "
                         f"[{x.min():.6g}, {x.max():.6g}].")
    if rows_sum_to_one and x.size:
        deviation = float(np.abs(x.sum(axis=-1) - 1.0).max())
        if deviation > SIMPLEX_ATOL:
            raise ValueError(f"{name} rows must sum to 1 (max deviation {deviation:.3g} > "
                             f"{SIMPLEX_ATOL}): pass probabilities (alpha / S for a "
                             f"Dirichlet), not logits or alpha.")
    return x


def distributions(x: Any, name: str) -> np.ndarray:
    """`x` as float64 if it is (N, K), K >= 2, each row a predictive distribution
    (`probabilities`)."""
    return probabilities(matrix(x, name), name)


def stacked_probabilities(x: Any, name: str = "probs_MxNxK") -> np.ndarray:
    """`x` as float64 if it is (M, N, K), K >= 2, M predictive distributions (MC Dropout passes,
    ensemble members) over the same N examples (`probabilities`)."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 3 or x.shape[2] < 2:
        raise ValueError(f"{name} must have shape (M, N, K) with K >= 2, got {x.shape}.")
    return probabilities(x, name)


# ------------------------------------------------------------------------- labels and masks
def class_labels(labels: Any, n: int, num_classes: int | None, name: str = "labels_N",
                 rows: Any = None) -> np.ndarray:
    """`labels` as int64 if they are integer class indices of shape (n,) in [0, num_classes)
    (num_classes None: >= 0), checked on `rows` (a bool mask; default all)."""
    labels = np.asarray(labels)
    if labels.shape != (n,) or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"{name} must be integer class indices of shape ({n},), got dtype "
                         f"{labels.dtype} and shape {labels.shape}.")
    checked = labels if rows is None else labels[rows]
    if checked.size and checked.min() < 0:
        raise ValueError(f"{name} must be >= 0." if num_classes is None
                         else f"{name} must lie in [0, {num_classes}).")
    if checked.size and num_classes is not None and checked.max() >= num_classes:
        raise ValueError(f"{name} must lie in [0, {num_classes}).")
    return labels.astype(np.int64)


def mask(mask_N: Any, n: int, name: str = "mask_N") -> np.ndarray | None:
    """`mask_N` if it is a boolean array of shape (n,) (None passes: no mask)."""
    if mask_N is None:
        return None
    mask_N = np.asarray(mask_N)
    if mask_N.dtype != np.bool_ or mask_N.shape != (n,):
        raise ValueError(f"{name} must be a boolean array of shape ({n},), got dtype "
                         f"{mask_N.dtype} and shape {mask_N.shape}.")
    return mask_N


# -------------------------------------------------------------------------------- Dirichlets
def prior_strength(w: Any, n: int, name: str = "prior_strength_N") -> np.ndarray:
    """`w` as a float64 (n,) array (a scalar: a fixed W, broadcast); its values unchecked."""
    w = np.asarray(w, dtype=np.float64)
    if w.ndim == 0:
        w = np.full(n, float(w))
    if w.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},) or be a scalar, got {w.shape}.")
    return w


def dirichlet(alpha_NxK: Any, prior_strength_N: Any) -> tuple[np.ndarray, np.ndarray]:
    """(alpha, W) as float64 if alpha is (N, K), K >= 2, finite and > 0 and W (N,) or a scalar
    (broadcast), finite and > 0."""
    alpha = positive_entries(matrix(alpha_NxK, "alpha_NxK"), "alpha_NxK")
    w = prior_strength(prior_strength_N, alpha.shape[0])
    return alpha, positive_entries(w, "prior_strength_N")


# ---------------------------------------------------------------------------------- settings
def positive(value: Any, name: str) -> float:
    """`value` as a float if it is finite and > 0."""
    x = float(value)
    if not (math.isfinite(x) and x > 0):
        raise ValueError(f"{name} must be finite and > 0, got {value}.")
    return x


def open_unit(value: Any, name: str) -> float:
    """`value` as a float if it lies in (0, 1) (a miscoverage, a confidence level)."""
    x = float(value)
    if not 0.0 < x < 1.0:
        raise ValueError(f"{name} must lie in (0, 1), got {value}.")
    return x


def count(value: Any, name: str, minimum: int) -> int:
    """`value` as an int if it is an integer >= `minimum`."""
    if isinstance(value, bool) or int(value) != value or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value}.")
    return int(value)


def one_of(value: Any, allowed: Collection[Any], name: str) -> Any:
    """`value` if it is one of `allowed`."""
    if value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}.")
    return value


def known(names: Iterable[str], allowed: Collection[str], what: str) -> None:
    """Nothing if every one of `names` is in `allowed` (`what`: "scores", "measures", ...)."""
    unknown = sorted(set(names) - set(allowed))
    if unknown:
        raise ValueError(f"unknown {what} {unknown}; known: {list(allowed)}.")
