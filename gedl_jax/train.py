"""Training from code (a notebook, a script, a test): the engine's entry points
(`gedl_jax.run.training`), each resolving the config once, checking it before anything is
written and holding its workdir for this process from the first write (`run.lock.holding`).
`python -m gedl_jax.train` is the command line (gedl_jax/commands/train.py, whose docstring
`--help` prints).

    from gedl_jax import configs, train
    config = configs.build_config("mnist", "gedl,quick")
    results = train.train(config, "runs/mnist_gedl_quick")         # every seed of config.seeds
    summary = train.train_and_evaluate(config, "runs/one_seed")   # one seed
"""

from __future__ import annotations

import sys

if __name__ == "__main__":   # `python -m gedl_jax.train`: the command (gedl_jax/commands/train.py)
    from gedl_jax.run import startup_signals   # first: the imports take seconds

    startup_signals.install()
    from gedl_jax.commands import train as command

    sys.exit(command.main())

from gedl_jax.run import training  # noqa: E402
from gedl_jax.run.progress import NonFiniteLossError  # noqa: E402
from gedl_jax.run.rundir import ConfigMismatchError  # noqa: E402

__all__ = ["ConfigMismatchError", "NonFiniteLossError", "run", "train", "train_and_evaluate",
           "train_and_evaluate_vmapped", "train_ensemble"]

train = training.train
train_and_evaluate = training.train_and_evaluate
train_and_evaluate_vmapped = training.train_and_evaluate_vmapped
train_ensemble = training.train_ensemble


def run(config, workdir) -> list[dict]:
    """`train`: one run per seed of config.seeds, or one run in `workdir` (the old name;
    `run` names the package)."""
    return training.train(config, workdir)
