"""The installed commands, `[project.scripts]` in pyproject.toml: each runs its command's `main`
(this package's modules) and exits with its status.

    gedl-train     gedl_jax/commands/train.py     (python -m gedl_jax.train, bin/train)
    gedl-evaluate  gedl_jax/commands/evaluate.py  (python -m gedl_jax.evaluate)
    gedl-fetch     gedl_jax/commands/fetch.py     (python -m gedl_jax.data.fetch)
    gedl-report    gedl_jax/commands/report.py    (python bin/report.py)
    gedl-compare   gedl_jax/commands/compare.py   (python bin/compare_runs.py)

A launcher imports its command only when called, so that `gedl-train` takes SIGTERM and SIGINT
over (run/startup_signals.py) before the seconds of imports, as `python -m gedl_jax.train` does:
a preempted start exits 75, not 143 or with a traceback.
"""

from __future__ import annotations

__all__ = ["compare", "evaluate", "fetch", "report", "train"]


def train() -> int:
    """gedl-train."""
    from gedl_jax.run import startup_signals

    startup_signals.install()
    from gedl_jax.commands import train as command

    return command.main()


def evaluate() -> int:
    """gedl-evaluate."""
    from gedl_jax.commands import evaluate as command

    return command.main()


def fetch() -> int:
    """gedl-fetch."""
    from gedl_jax.commands import fetch as command

    return command.main()


def report() -> int:
    """gedl-report."""
    from gedl_jax.commands import report as command

    return command.main()


def compare() -> int:
    """gedl-compare."""
    from gedl_jax.commands import compare as command

    return command.main()
