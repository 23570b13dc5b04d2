r"""Train an evidential classifier.

    gedl-train [--config=NAME[:VARIANT[,MODIFIER...]]] [--config.FIELD=VALUE ...] [--workdir=DIR]

(`python -m gedl_jax.train` is the same command; `bin/train` in a clone. Without --config it
trains configs/mnist.py, the main job.)


Config syntax (ml_collections), from any directory:
  (no --config)                             the main job: configs/mnist.py, as bin/train runs it;
                                            --config.FIELD=... and --workdir=... change it
  --config=mnist                            GEDL on MNIST, the paper's settings
  --config=mnist:edl                        a variant (gedl, edl, iedl, redl, red, ablation_*)
  --config=mnist:gedl,quick                 a variant, shrunk to a few-minute run
  --config.c_w=0.7 --config.seeds=0,1,2     override any field (--helpfull lists them all)
  --config=configs/mnist.py:gedl            the same by path (gedl_jax/configs/mnist.py)
  --config=my_config.py:ARG                 your own config file (a get_config(arg) function)

Before any training, every input (ID splits, OOD sets) is obtained: files missing from the data
folder are downloaded and verified (config.download, config.data_mirror; $GEDL_OFFLINE=1 turns
downloads off), or all of them are named in one error. The default workdir is
runs/<dataset>_<variant>[_quick]. The run writes into the workdir: config.json,
checkpoints/{last,best}, metrics.jsonl, tensorboard/, and at the end eval_results.json,
eval_table.md and plots; while it runs it holds `.gedl_jax.lock` there (a second run on the same
workdir stops at once, exit 2, naming the first). Started again with the same command, a killed
run continues from its last checkpoint and ends with the same parameters as an uninterrupted
run.

Exit status (gedl_jax/commands/cli.py, docs/robustness.md): 0 finished; 2 bad input (config,
data, workdir; one `error:` line says what to fix; --debug or GEDL_DEBUG=1 adds the traceback);
3 the run diverged (non-finite loss) or ended at chance accuracy (--config.allow_chance=True
when intended); 74 a file could not be written (disk full): the previous checkpoint is intact,
free space and rerun the same command; 75 preempted: SIGTERM or SIGINT arrived, the run saved a
checkpoint at the next step boundary and stopped, or stopped at once before training began
(rerun the same command to resume); 1 a crash.
"""

from __future__ import annotations

import pathlib
import sys

if __name__ == "__main__":   # first: the imports below take seconds (run/startup_signals.py)
    from gedl_jax.run import startup_signals

    startup_signals.install()

from gedl_jax import config as config_lib  # noqa: E402
from gedl_jax import configs, data  # noqa: E402
from gedl_jax.commands import cli  # noqa: E402
from gedl_jax.run import heartbeat, numerics, preemption, training  # noqa: E402
from gedl_jax.run.distributed import initialize_distributed  # noqa: E402
from gedl_jax.run.heartbeat import log  # noqa: E402
from gedl_jax.run.progress import NonFiniteLossError  # noqa: E402
from gedl_jax.run.rundir import ConfigMismatchError  # noqa: E402

__all__ = ["MAIN_JOB_CONFIG", "main", "presets_help", "results_line", "with_default_config"]


def presets_help() -> str:
    """The presets --help lists: every config name, variant and modifier of
    --config=<name>:<variant>[,<modifier>...]."""
    return (f"Presets (--config=<name>:<variant>[,<modifier>...]; names: "
            f"{', '.join(configs.config_names())}):\n"
            f"  variants:  {', '.join(sorted(config_lib.VARIANTS))}\n"
            f"  modifiers: {', '.join(config_lib.MODIFIERS)} (quick: 2 epochs on 6,400 "
            f"training images, a smoke run: ending at chance level only warns)\n\n"
            f"Config fields by group (--config.FIELD=VALUE; --helpfull or --fields lists each "
            f"with its type, default, allowed values and doc):\n{config_lib.groups_text()}")


# The main job's config (README, Quick start): what a command line without --config= trains, so
# `--config.learning_rate=0.003` or `--workdir=DIR` alone change the main job.
MAIN_JOB_CONFIG = "configs/mnist.py"


def with_default_config(argv: list[str]) -> list[str]:
    """`argv` with `--config=MAIN_JOB_CONFIG` after the program name when it names no config
    (`--config.FIELD=...` overrides are not one)."""
    if any(a == "--config" or a.startswith("--config=") for a in argv[1:]):
        return argv
    return [*argv[:1], f"--config={MAIN_JOB_CONFIG}", *argv[1:]]


def main(argv=None) -> int:
    """The command line `python -m gedl_jax.train` (module docstring); returns the exit
    status."""
    from absl import flags

    given = list(sys.argv if argv is None else argv)
    argv = with_default_config(given)
    defaulted = len(argv) > len(given)
    flags_ = flags.FLAGS
    configs.define_config_flag("config", f"Experiment config: a name (mnist, cifar10, ...; "
                               f"--help lists them) or a config file (see gedl_jax/configs/). "
                               f"Default: {MAIN_JOB_CONFIG}, the main job.")
    flags.DEFINE_string("workdir", None, "Output folder (checkpoints, logs, results); default "
                        "runs/<dataset>_<variant>[_quick].")
    flags.DEFINE_bool("debug", False, "Show the traceback of an error (also GEDL_DEBUG=1).")
    flags.mark_flags_as_required(["config"])

    def body() -> int:
        config = config_lib.normalize_lists(flags_.config)
        workdir = flags_.workdir or str(pathlib.Path("runs") / config.run_name)
        # XLA reads its flags when the backend starts: before anything asks jax for a device.
        numerics.configure_process(bool(config.deterministic), workdir)
        if config.distributed:
            config_lib.validate(config)  # before waiting for the other hosts
            initialize_distributed(config)
        if defaulted:
            log(f"config: {MAIN_JOB_CONFIG} (the main job; --config=... to choose another)")
        if not flags_.workdir:
            log(f"workdir: {workdir} (the default for this config; --workdir=DIR to choose)")
        preemption.install(prompt=True)   # a signal while compiling acts at once
        with heartbeat.compilations_announced():
            results = training.train(config, workdir)
        status = _exit_status(config, results)
        log(results_line(workdir, results))
        return status

    return cli.run(body, argv, doc=__doc__, help_extra=presets_help(), codes=[
        ((preemption.Preempted, preemption.EvaluationInterrupted), cli.EXIT_INTERRUPTED),
        ((NonFiniteLossError,), cli.EXIT_DIVERGED),
        ((ConfigMismatchError, data.DataError), cli.EXIT_BAD_INPUT),
    ], renamed=config_lib.legacy_flag_message,
        help_full=f"Every config field:\n\n{config_lib.help_text()}")


def results_line(workdir, results: list[dict]) -> str:
    """The last line of a training command: where its results (or, without an evaluation, its
    checkpoints) are."""
    evaluated = [pathlib.Path(r["workdir"]) / "eval_results.json" for r in results
                 if "evaluation" in r]
    if not evaluated:
        return (f"checkpoints in {workdir} (no evaluation: "
                f"{cli.command_name('python -m gedl_jax.evaluate')} --workdir=... scores a run)")
    combined = (f"; the {len(evaluated)} seeds' table: {pathlib.Path(workdir) / 'eval_table.md'}"
                if len(evaluated) > 1 else "")
    return f"results: {', '.join(map(str, evaluated))}{combined}"


def _exit_status(config, results) -> int:
    """0, or 3 when a run ended at chance accuracy (and config.allow_chance is off)."""
    at_chance = [m for m in _chance_messages(results) if m]
    for message in at_chance:   # the option that lets such a run end well, where it is not set
        print(f"warning: {message}" if config.allow_chance else
              f"error: {message}, or --config.allow_chance=True if this is intended",
              file=sys.stderr, flush=True)
    return cli.EXIT_DIVERGED if at_chance and not config.allow_chance else cli.EXIT_OK


def _chance_messages(results):
    for r in results if isinstance(results, list) else [results]:
        yield r.get("at_chance")
        yield from _chance_messages(r.get("members", []))


if __name__ == "__main__":
    sys.exit(main())
