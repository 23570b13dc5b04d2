r"""Train an evidential classifier.

    python -m gedl_jax.train --config=configs/mnist.py [--workdir=DIR]


Config syntax (ml_collections):
  --config=configs/mnist.py                 GEDL on MNIST, the paper's settings
  --config=configs/mnist.py:edl             a variant (gedl, edl, iedl, redl, red, ablation_*)
  --config=configs/mnist.py:gedl,quick      a variant, shrunk to a few-minute run
  --config.c_w=0.7 --config.seeds=0,1,2     override any field (see gedl_jax/configuration.py)

Before any training, every input (ID splits, OOD sets) is obtained: files missing from the data
folder are downloaded and verified (config.download, config.data_mirror; $GEDL_OFFLINE=1 turns
downloads off), or all of them are named in one error. The default workdir is
runs/<dataset>_<variant>[_quick]. The run writes into the workdir: config.json,
checkpoints/{last,best}, metrics.jsonl, tensorboard/, and at the end eval_results.json,
eval_table.md and plots. Started again with the same command, a killed run continues from its
last checkpoint and ends with the same parameters as an uninterrupted run.

Exit status: 0 finished; 2 bad input (config, data, workdir; the message says what to fix);
75 preempted: SIGTERM or SIGINT arrived, the run saved a checkpoint at the next step boundary and
stopped (rerun the same command to resume; `gedl_jax.run.preemption.EXIT_PREEMPTED`); 1 anything
else.
"""

from __future__ import annotations

import pathlib
import sys

from gedl_jax import configuration, data
from gedl_jax.run import preemption
from gedl_jax.run.distributed import initialize_distributed
from gedl_jax.run.progress import NonFiniteLossError
from gedl_jax.run.rundir import ConfigMismatchError
from gedl_jax.run.training import (
    run,
    train_and_evaluate,
    train_and_evaluate_vmapped,
    train_ensemble,
)

__all__ = ["ConfigMismatchError", "NonFiniteLossError", "main", "run", "train_and_evaluate",
           "train_and_evaluate_vmapped", "train_ensemble"]


def _log(msg: str) -> None:
    import jax  # noqa: PLC0415

    if jax.process_index() == 0:
        print(msg, flush=True)


def main(argv=None) -> int:
    from absl import app, flags  # noqa: PLC0415
    from ml_collections import config_flags  # noqa: PLC0415

    flags_ = flags.FLAGS
    config_flags.DEFINE_config_file("config", None, "Experiment config file (see configs/).",
                                    lock_config=True)
    flags.DEFINE_string("workdir", None, "Output folder (checkpoints, logs, results); default "
                        "runs/<dataset>_<variant>[_quick].")
    flags.mark_flags_as_required(["config"])

    def _main(_argv):
        from absl import logging as absl_logging  # noqa: PLC0415
        absl_logging.set_verbosity(absl_logging.WARNING)  # Orbax logs every save at INFO
        if len(_argv) > 1:
            raise app.UsageError(f"unexpected arguments: {_argv[1:]}")
        config = configuration.normalize_lists(flags_.config)
        try:
            if config.distributed:
                configuration.validate_config(config)  # before waiting for the other hosts
                initialize_distributed(config)
            workdir = flags_.workdir
            if not workdir:
                workdir = str(pathlib.Path("runs") / config.run_name)
                _log(f"workdir: {workdir} (the default for this config; --workdir=DIR to choose)")
            preemption.install()
            run(config, workdir)
        except preemption.Preempted as e:
            print(f"{e}", file=sys.stderr, flush=True)
            return preemption.EXIT_PREEMPTED
        except (ValueError, NonFiniteLossError, data.DataError) as e:
            print(f"error: {e}", file=sys.stderr, flush=True)
            return 2
        return 0

    try:
        app.run(_main, argv=argv)
    except SystemExit as e:
        return int(e.code or 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
