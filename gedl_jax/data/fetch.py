"""Download and verify the official dataset files into the data folder, from code:

    from gedl_jax.data import fetch
    data_dir = fetch.fetch_datasets(["mnist", "kmnist", "fashion_mnist"])   # -> the data folder

The command line, `python -m gedl_jax.data.fetch mnist kmnist:test`, `--for=cifar10` or
`--list`, is gedl_jax/commands/fetch.py. How files are fetched and verified (official URLs or a
mirror, timeouts, retries, the offline switch): `gedl_jax.data.download`.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":   # `python -m gedl_jax.data.fetch`: the command (commands/fetch.py)
    from gedl_jax.commands import fetch as command

    sys.exit(command.main())

from gedl_jax.data.download import (  # noqa: E402, F401  (the library API, re-exported here)
    DOWNLOAD_MODES,
    ENV_MIRROR,
    ENV_OFFLINE,
    DownloadError,
    default_splits,
    ensure_files,
    fetch_datasets,
    fetch_split,
    list_datasets,
    requests_for_run,
)
