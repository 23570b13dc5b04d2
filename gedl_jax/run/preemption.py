"""Preemption: SIGTERM/SIGINT end a run at the next step boundary with a checkpoint.

Clusters (SLURM, Kubernetes, cloud spot VMs) announce a preemption with SIGTERM and kill the job
a grace period later. `install()` (called by the training CLI) turns SIGTERM and SIGINT into a
request; the training loop asks `should_stop(call)` after every compiled call (one step or
several), saves its `last`
checkpoint, and the CLI exits with `EXIT_PREEMPTED`. Started again with the same command, the run
resumes from that checkpoint exactly (the data order, augmentation and dropout draws are
functions of the seed and the step).

Several processes (`jax.distributed`): every host must stop at the *same* step, or the hosts that
go on would wait forever in the next collective. JAX's preemption service (on by default after
`jax.distributed.initialize`) catches SIGTERM on any host and agrees on a step with all others;
`multihost_utils.reached_preemption_sync_point(step)` turns True on every host at that step. So
with more than one process SIGTERM is left to JAX's handler, and SIGINT is forwarded to it as a
SIGTERM to this process.

Before anything polls for the request (`should_stop` after a training call, `requested` between
evaluation batches), a signal cannot wait for a step boundary: the first one comes after loading
the data, restoring a checkpoint and compiling, which can take minutes, and Python runs a signal
handler only between bytecodes, so not while XLA compiles. With `install(prompt=True)` (the
training CLI, single process) a thread reads the signal from `signal.set_wakeup_fd` as it
arrives; if nothing has polled yet, there is nothing of this command to save (the workdir holds
only what earlier commands wrote, each file complete: every file is written to a temporary name
and renamed), so it prints one line and ends the process at once with `EXIT_PREEMPTED`.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

import jax

from gedl_jax.run.startup_signals import EXIT_PREEMPTED

_requested = threading.Event()
_signal_name: list[str] = []
_polled = threading.Event()   # something checks `_requested` at step / batch boundaries now
_announced = threading.Event()   # the line saying what a stop request will do was printed
_announcing = threading.Lock()
# What polls: "training" (`should_stop`: a checkpoint at the next step) or "evaluation"
# (`requested`: the evaluation ends at its next batch).
_polling: list[str] = []

# The line printed as soon as a stop request arrives, by what acts on it.
STOPPING = {"training": "stopping: saving a checkpoint at the next step",
            "evaluation": "stopping: the evaluation ends at its next batch (no result file is "
                          "written for it)"}


class Preempted(Exception):
    """Raised by the training loop after it saved a checkpoint because of a preemption signal."""

    def __init__(self, step: int, workdir: str):
        super().__init__(f"preempted ({signal_name()}): saved a checkpoint at step {step} in "
                         f"{workdir}/checkpoints/last; rerun the same command to resume")
        self.step = step


class EvaluationInterrupted(Exception):
    """SIGTERM/SIGINT during an evaluation: it stops at the next batch; no result file is half
    written (they are written whole, at the end, or not at all).

    `workdirs`: with `trained` (the evaluation at the end of training), the runs whose
    evaluation is left (the interrupted one first), each evaluated by
    `python -m gedl_jax.evaluate --workdir=...`; `evaluated`: those of the same command whose
    results were written. Without `trained` (an evaluation command), the command itself is
    what to run again: its results folder may be --out, or a temporary one."""

    def __init__(self, workdirs: str | list[str], trained: bool, evaluated: tuple = (),
                 untrained: tuple = ()):
        """`untrained`: runs of the same command not trained yet (seeds trained one after
        another): then the command itself is what to run again."""
        workdirs = [workdirs] if isinstance(workdirs, str) else list(workdirs)
        self.workdirs, self.trained, self.evaluated = workdirs, trained, tuple(evaluated)
        if not trained:
            super().__init__(f"interrupted ({signal_name()}) during the evaluation: no result "
                             f"file was written for it. Run the same command again to evaluate")
            return
        if untrained:
            super().__init__(
                f"interrupted ({signal_name()}) during the evaluation of {workdirs[0]}: its "
                f"training is complete and its checkpoints are in {workdirs[0]}/checkpoints; "
                f"no result file was written for it, and {', '.join(map(str, untrained))} "
                f"{'is' if len(untrained) == 1 else 'are'} not trained yet. Run the same "
                f"command again: it evaluates the finished runs from their checkpoints and "
                f"trains the rest")
            return
        checkpoints = (f"{workdirs[0]}/checkpoints" if len(workdirs) == 1 else
                       ", ".join(f"{w}/checkpoints" for w in workdirs))
        done = (f" ({', '.join(f'{w}/eval_results.json' for w in evaluated)} written)"
                if evaluated else "")
        super().__init__(
            f"interrupted ({signal_name()}) during the evaluation: training is complete and "
            f"its checkpoints are in {checkpoints}; no result file was written for "
            f"{'it' if len(workdirs) == 1 else 'these'}{done}. Evaluate with `python -m "
            f"gedl_jax.evaluate {' '.join(f'--workdir={w}' for w in workdirs)}`")


def requested() -> bool:
    """Whether SIGTERM/SIGINT arrived (single process; see `install`). The caller acts on it
    at its next boundary, so a signal from now on waits for that boundary."""
    _poll("evaluation")
    return _requested.is_set()


def _poll(what: str) -> None:
    if not _polled.is_set():
        _polling[:] = [what]
        _polled.set()


def _announce() -> None:
    """Print, once, what the stop request will do (`STOPPING`), as it arrives: the step or
    batch it waits for can take seconds on a loaded machine, with nothing else printed."""
    with _announcing:   # the watcher thread and the handler: one line
        if not _polled.is_set() or _announced.is_set():
            return
        _announced.set()
    sys.stderr.write(STOPPING[_polling[0] if _polling else "training"] + "\n")
    sys.stderr.flush()


def signal_name() -> str:
    """The name of the signal that asked the run to stop (e.g. "SIGTERM"), else "request"."""
    return _signal_name[0] if _signal_name else "request"


def _multi_process() -> bool:
    return jax.process_count() > 1


def _on_signal(signum, frame) -> None:
    del frame
    if not _signal_name:
        _signal_name.append(signal.Signals(signum).name)
    _requested.set()
    _announce()   # where no watcher thread printed it already


def _forward_to_jax(signum, frame) -> None:
    """SIGINT under jax.distributed: let JAX's preemption service (which owns SIGTERM) agree on
    the stopping step with the other hosts."""
    _on_signal(signum, frame)
    os.kill(os.getpid(), signal.SIGTERM)


def install(prompt: bool = False) -> None:
    """Route SIGTERM and SIGINT to a checkpoint-and-stop (main thread only). Call after
    `jax.distributed.initialize`, if any. prompt: a signal that arrives before anything polls
    for it ends the process at once (module docstring; single process only)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if _multi_process():
        signal.signal(signal.SIGINT, _forward_to_jax)
        from jax._src import distributed

        if distributed.global_state.preemption_sync_manager is None:
            # No service, so no handler of JAX's replaced the start-up one
            # (`startup_signals`): SIGTERM ends the process, as Python's default does.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        return
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    if prompt:
        _watch_before_polling()


def _watch_before_polling() -> None:
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    threading.Thread(target=_watch, args=(read_fd,), name="preemption-watch",
                     daemon=True).start()


def _watch(read_fd: int) -> None:
    """Runs in its own thread: Python's C-level signal handler writes each signal's number to
    the wakeup fd at once, even while the main thread is inside XLA."""
    while True:
        received = os.read(read_fd, 64)
        if not received:
            return
        signals = [s for s in received if s in (signal.SIGTERM, signal.SIGINT)]
        if not signals:
            continue
        if _polled.is_set():   # the loop (or the evaluation) acts at its next boundary
            _announce()        # now, while the main thread may be inside XLA
            continue
        name = signal.Signals(signals[0]).name
        sys.stderr.write(f"preempted ({name}) before the first training step (loading, "
                         f"restoring or compiling): nothing of this command to save (no "
                         f"checkpoint was written; a new workdir holds only its config.json); "
                         f"rerun the same command\n")
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(EXIT_PREEMPTED)


def request() -> None:
    """What a preemption signal does (for library callers and tests)."""
    _requested.set()


def reset() -> None:
    """Forget any stop request (a new run in the same process starts clean)."""
    _requested.clear()
    _signal_name.clear()
    _polled.clear()
    _announced.clear()
    _polling.clear()


def stop_pending() -> bool:
    """Whether a stop was requested in this single-process run (False with several processes,
    whose stop JAX's service agrees on): the loop then runs one step, not a whole call, before
    it stops. Unlike `should_stop`, asking does not mark the loop as polling."""
    return not _multi_process() and _requested.is_set()


def should_stop(call: int) -> bool:
    """True when the loop should checkpoint and stop after its `call`-th training call (a
    count that starts anew with each process and goes up by one per call: JAX's sync point
    agrees on the largest count any host reached plus one). With several processes, True on
    all of them after the same call; call it after every call on every process."""
    _poll("training")
    if _multi_process():
        from jax._src import distributed
        from jax.experimental import multihost_utils

        if distributed.global_state.preemption_sync_manager is None:  # service switched off
            return False
        return bool(multihost_utils.reached_preemption_sync_point(call))
    return _requested.is_set()
