"""Training from code (a notebook, a script, a test): the entry points of the command line
`python -m gedl_jax.train` (gedl_jax/commands/train.py, whose docstring `--help` prints), each
holding its workdir for this process from the first write (`run.lock.holding`).

    from gedl_jax import configuration, train
    config = configuration.build_config("mnist", "gedl,quick")
    results = train.run(config, "runs/mnist_gedl_quick")          # every seed of config.seeds
    summary = train.train_and_evaluate(config, "runs/one_seed")   # one seed
"""

from __future__ import annotations

import sys

if __name__ == "__main__":   # `python -m gedl_jax.train`: the command (gedl_jax/commands/train.py)
    from gedl_jax.run import startup_signals   # first: the imports take seconds

    startup_signals.install()
    from gedl_jax.commands import train as command

    sys.exit(command.main())

from gedl_jax.run import experiment, lock, numerics, training  # noqa: E402
from gedl_jax.run.progress import NonFiniteLossError  # noqa: E402
from gedl_jax.run.rundir import ConfigMismatchError  # noqa: E402

__all__ = ["ConfigMismatchError", "NonFiniteLossError", "run", "train_and_evaluate",
           "train_and_evaluate_vmapped", "train_ensemble"]


def run(config, workdir) -> list[dict]:
    """`training.run` (one run per seed of config.seeds, or one run in `workdir`) with the whole
    config checked first (every list field without repeats, every field in range: nothing is
    trained or written before that) and `workdir` held by this process from its first write
    (`lock.holding`)."""
    import jax

    # the GPU flags before the device count below starts the backend (run/numerics.py)
    numerics.configure_process(bool(config.get("deterministic", True)), workdir)
    config = experiment.resolve_config(config, jax.device_count())
    with lock.holding(workdir, create=False):
        return training.run(config, workdir)


def train_and_evaluate(config, workdir, *, stop_after_steps: int | None = None) -> dict:
    """`training.train_and_evaluate` (one seed into `workdir`) with `workdir` held by this
    process from its first write (`lock.holding`)."""
    with lock.holding(workdir, create=False):
        return training.train_and_evaluate(config, workdir, stop_after_steps=stop_after_steps)


def train_and_evaluate_vmapped(config, workdir, seeds: list[int], *,
                               stop_after_steps: int | None = None) -> list[dict]:
    """`training.train_and_evaluate_vmapped` (seeds together, into workdir/seed_<s>) with
    `workdir` held by this process from its first write (`lock.holding`)."""
    with lock.holding(workdir, create=False):
        return training.train_and_evaluate_vmapped(config, workdir, seeds,
                                                   stop_after_steps=stop_after_steps)


def train_ensemble(config, workdir) -> dict:
    """`training.train_ensemble` (a deep ensemble into `workdir`) with `workdir` held by this
    process from its first write (`lock.holding`)."""
    with lock.holding(workdir, create=False):
        return training.train_ensemble(config, workdir)
