"""SIGTERM and SIGINT while a command line starts: the seconds of imports before
`preemption.install` takes the signals over.

Python's defaults would end such a command with status 143 and no message (SIGTERM), or with a
KeyboardInterrupt traceback (SIGINT), where a scheduler's requeue rule or a user expects the
preempted status. `install()` makes either signal end the process at once with
`EXIT_PREEMPTED` and one line that says to rerun: nothing of the command has run yet, so there
is nothing to save. This module imports nothing heavy, so a command installs it first
(`gedl_jax/commands/train.py`; `gedl_jax/train.py` run as `python -m gedl_jax.train`).
"""

from __future__ import annotations

import os
import signal

# Exit status of a run that stopped for a preemption signal (after saving its checkpoint, once
# training has started): EX_TEMPFAIL of sysexits.h ("temporary failure, retry"), distinct from
# 0 (finished), 1 (crash) and 2 (bad input). Rerun the same command (e.g. SLURM --requeue).
EXIT_PREEMPTED = 75


def _stop(signum, frame) -> None:
    del frame
    os.write(2, f"preempted ({signal.Signals(signum).name}) while the command was starting, "
                f"before any training: nothing to save; rerun the same command\n".encode())
    os._exit(EXIT_PREEMPTED)


def install() -> None:
    """SIGTERM and SIGINT end the process at once with `EXIT_PREEMPTED` and one line on
    stderr, until `preemption.install` replaces these handlers."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _stop)
