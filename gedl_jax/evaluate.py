"""Evaluating trained runs from code: `evaluate_workdir` (what `python -m gedl_jax.evaluate
--workdir=DIR` does for each run; the command line is gedl_jax/commands/evaluate.py), and the run
layer's `restore_run`, `predict_outputs` and `corruption_study`, here by the names notebooks use.

    from gedl_jax import evaluate
    results = evaluate.evaluate_workdir("runs/mnist_gedl_quick", extra_ood=("kmnist",))
    outputs = evaluate.predict_outputs("runs/mnist_gedl_quick")   # the best checkpoint's outputs
"""

from __future__ import annotations

import sys

if __name__ == "__main__":   # `python -m gedl_jax.evaluate`: the command (commands/evaluate.py)
    from gedl_jax.commands import evaluate as command

    sys.exit(command.main())

from gedl_jax.run.corruption_study import corruption_study  # noqa: E402
from gedl_jax.run.evaluating import evaluate_workdir  # noqa: E402
from gedl_jax.run.workdir import (  # noqa: E402
    evaluate_run,
    predict_outputs,
    restore_run,
    saved_config,
)

__all__ = ["corruption_study", "evaluate_run", "evaluate_workdir", "predict_outputs",
           "restore_run", "saved_config"]
