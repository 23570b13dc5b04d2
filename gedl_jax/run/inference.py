"""Running a method's predictor over a whole split: padded batches, every example once.

`predict_split` runs a method's compiled predict step (the CLI's evaluation). Any user function
is evaluated by `gedl_jax.evaluation.evaluate_model` (evaluation/any_model.py), re-exported here
for the old name `gedl_jax.evaluation.inference` (one release)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gedl_jax import data
from gedl_jax.evaluation.any_model import (  # noqa: F401  (re-exported for the old name)
    KINDS,
    ModelEvaluation,
    evaluate_model,
    run_batched,
)
from gedl_jax.run.sharding import put_batched


def predict_split(predict_step: Callable, variables: Any, method_state: Any, mesh,
                  split: data.Split, batch_size: int,
                  key: jax.Array | None = None,
                  on_batch: Callable[[int, int], None] | None = None,
                  keep_output: Callable[[str], bool] | None = None) -> dict[str, np.ndarray]:
    """The raw outputs of `predict_step` (`steps.make_predict_step`) for every example of
    `split`, each exactly once, as NumPy arrays with N leading rows (those whose name
    `keep_output` accepts: `PendingPredictions.fetch`).

    The split is padded to whole batches (`data.pad_for_eval`); padding rows are dropped by the
    mask before anything is returned. Batch m draws its randomness (MC Dropout's masks) from
    `fold_in(key, m)`, so a prediction is reproducible.
    """
    return dispatch_predictions(predict_step, variables, method_state, mesh, split,
                                batch_size, key, on_batch).fetch(keep_output)


@dataclasses.dataclass
class PendingPredictions:
    """A split's predictions dispatched to the devices and not yet fetched: `fetch()` waits for
    them and returns what `predict_split` returns (the training loop validates an epoch's
    state while the next epoch's steps are queued behind it)."""

    batches: list[dict[str, jax.Array]]
    keep: np.ndarray

    def fetch(self, keep_output: Callable[[str], bool] | None = None
              ) -> dict[str, np.ndarray]:
        """Wait for every batch; the outputs of the split's real rows, as NumPy arrays: those
        whose name `keep_output` accepts (default all; the others are neither joined nor
        copied to the host)."""
        joined = {name: jnp.concatenate([b[name] for b in self.batches])
                  for name in self.batches[0] if keep_output is None or keep_output(name)}
        return {name: np.asarray(value)[self.keep]
                for name, value in jax.device_get(joined).items()}


@dataclasses.dataclass(frozen=True)
class ResidentSplit:
    """A split's images padded to whole batches and put on the devices once (`put_split`),
    for a split predicted again and again (the validation split at every epoch end)."""

    images_dev: jax.Array   # M x B x H x W x C, the batch axis over "data"
    keep: np.ndarray        # M * B: False on padding rows


def put_split(mesh, split: data.Split, batch_size: int) -> ResidentSplit:
    """`split`'s images padded to whole batches of `batch_size` and put on `mesh`'s devices."""
    images, _, mask = data.pad_for_eval(split.images, split.labels, batch_size)
    return ResidentSplit(put_batched(mesh, images), mask.reshape(-1))


def dispatch_predictions(predict_step: Callable, variables: Any, method_state: Any, mesh,
                         split: data.Split | ResidentSplit, batch_size: int,
                         key: jax.Array | None = None,
                         on_batch: Callable[[int, int], None] | None = None
                         ) -> PendingPredictions:
    """`predict_split` without the wait: every batch dispatched (with `on_batch`, waited for
    one by one), the outputs left on the devices. `split` may be resident already
    (`put_split` with the same `batch_size`)."""
    key = jax.random.PRNGKey(0) if key is None else key
    resident = split if isinstance(split, ResidentSplit) else put_split(mesh, split, batch_size)
    images_dev = resident.images_dev
    batches = []
    for m in range(images_dev.shape[0]):
        batches.append(predict_step(variables, method_state, images_dev[m],
                                    jax.random.fold_in(key, m)))
        if on_batch is not None:   # progress / interruption: wait for the batch first
            jax.block_until_ready(batches[-1])
            on_batch(m + 1, images_dev.shape[0])
    return PendingPredictions(batches, resident.keep)


def training_batches(split: data.Split, batch_size: int, mean=None, std=None):
    """(float images, labels) batches of `split` in order, for `Method.fit` after training."""
    for start in range(0, len(split), batch_size):
        images = jnp.asarray(split.images[start:start + batch_size])
        yield data.to_float(images, None if mean is None else jnp.asarray(mean),
                            None if std is None else jnp.asarray(std)), \
            jnp.asarray(split.labels[start:start + batch_size].astype(np.int32))
