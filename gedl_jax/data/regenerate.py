"""Regenerate CIFAR-10-C from the CIFAR-10 test split into the data folder, from code:

    from gedl_jax.data import regenerate
    regenerate.regenerate_cifar10c(data_dir, corruptions=["snow", "pixelate"])

The command line, `python -m gedl_jax.data.regenerate --data_dir=D --corruptions=snow,brightness
--seed=0`, is gedl_jax/commands/regenerate.py. The pipeline is `gedl_jax.data.regeneration`.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":   # `python -m gedl_jax.data.regenerate`: commands/regenerate.py
    from gedl_jax.commands import regenerate as command

    sys.exit(command.main())

from gedl_jax.data.regeneration import (  # noqa: E402, F401  (the library API, re-exported here)
    NOT_REGENERABLE,
    PROVENANCE_FILE,
    REGENERABLE,
    REGENERATED_FOLDER,
    RELEASE_SUBFOLDER,
    describe_source,
    library_versions,
    read_provenance,
    regenerate_cifar10c,
    regenerated_folder,
)

__all__ = ["NOT_REGENERABLE", "PROVENANCE_FILE", "REGENERABLE", "REGENERATED_FOLDER",
           "RELEASE_SUBFOLDER", "describe_source", "library_versions", "read_provenance",
           "regenerate_cifar10c", "regenerated_folder"]
