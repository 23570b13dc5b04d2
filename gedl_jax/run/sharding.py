"""Device placement: the 1-D "data" mesh and the two layouts every run uses.

The whole training split lives on the devices, replicated (`put_replicated`); each step lays its
global batch out over the "data" axis inside the jitted program (`batch_sharding`). Evaluation
batches are placed batch-sharded from the host (`put_batched`). This is the only placement API.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

AXIS = "data"


def make_mesh(devices: list | None = None) -> jax.sharding.Mesh:
    """A 1-D mesh over all devices (of all processes), axis "data"."""
    devices = jax.devices() if devices is None else devices
    return jax.sharding.Mesh(np.asarray(devices), (AXIS,),
                             axis_types=(jax.sharding.AxisType.Auto,))


def replicated(mesh) -> NamedSharding:
    """The sharding that puts a whole copy of an array on every device of `mesh`."""
    return NamedSharding(mesh, P())


def batch_sharding(mesh, leading: int = 0) -> NamedSharding:
    """Axis `leading` (the batch: 0, or 1 behind a seed axis) split over "data"."""
    return NamedSharding(mesh, P(*([None] * leading), AXIS))


def put_replicated(mesh, array: np.ndarray) -> jax.Array:
    """Host array -> one global array replicated on every device (works multi-process too,
    where every process holds the same host data)."""
    return jax.make_array_from_callback(array.shape, replicated(mesh),
                                        lambda index: array[index])


def put_batched(mesh, array: np.ndarray) -> jax.Array:
    """(M, B, ...) host array -> global array with the batch axis (1) over "data"."""
    return jax.make_array_from_callback(array.shape, batch_sharding(mesh, leading=1),
                                        lambda index: array[index])
