"""Multi-host start-up: `jax.distributed.initialize` from the config."""

from __future__ import annotations

from typing import Any

import jax


def initialize_distributed(config) -> None:
    """`jax.distributed.initialize` from the config; empty fields are left to JAX, which reads
    JAX_COORDINATOR_ADDRESS and detects SLURM, Open MPI and TPU pods."""
    kwargs: dict[str, Any] = {}
    if config.coordinator_address:
        kwargs["coordinator_address"] = config.coordinator_address
    if config.num_processes:
        kwargs["num_processes"] = int(config.num_processes)
        kwargs["process_id"] = int(config.process_id)
    try:
        jax.distributed.initialize(**kwargs)
    except ValueError as e:  # JAX: "coordinator_address should be defined." and the like
        raise ValueError(f"config.distributed=True but {e} Outside SLURM/Open MPI/TPU, give "
                         f"--config.coordinator_address=HOST:PORT --config.num_processes=N "
                         f"--config.process_id=I on every host") from None
    if jax.process_index() == 0:
        print(f"jax.distributed: process {jax.process_index()} of {jax.process_count()}, "
         f"{jax.local_device_count()} local / {jax.device_count()} global devices")
