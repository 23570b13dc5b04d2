"""The training loop: one seed, several seeds (one after another or vmapped), deep ensembles.

`train_and_evaluate(config, workdir)` trains one seed into `workdir` (resuming from its last
checkpoint), keeps the best-validation and last checkpoints, and evaluates the best one
(`run.workdir`). The loop is flat: one loop over steps, where epoch ends (validation,
checkpoint), mid-epoch checkpoints and preemption are events at step boundaries;
`programs.SeedProgram` hides single versus vmapped seeds.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import errno
import pathlib
import time
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from gedl_jax import config as config_lib
from gedl_jax.config import ResolvedConfig
from gedl_jax import data, files
from gedl_jax.evaluation.core import evaluate_predictions
from gedl_jax.run import (
    checkpointing,
    experiment,
    inference,
    lock,
    numerics,
    optimizer,
    preemption,
    programs,
    rundir,
    sharding,
    steps,
    tracking,
)
from gedl_jax.run import ensemble as ensemble_eval
from gedl_jax.run import workdir as workdir_eval
from gedl_jax.run.heartbeat import log
from gedl_jax.run.progress import MetricsBuffer, NonFiniteLossError
from gedl_jax.run.rundir import ConfigMismatchError

__all__ = ["ConfigMismatchError", "NonFiniteLossError", "SeedRun", "epoch_eval_summary",
           "headline_numbers", "train", "train_and_evaluate", "train_and_evaluate_vmapped",
           "train_ensemble"]


@dataclasses.dataclass
class SeedRun:
    """One seed's experiment, its workdir and its loop bookkeeping."""

    experiment: experiment.Experiment
    workdir: pathlib.Path
    ckpt: checkpointing.RunCheckpoints | None = None
    writer: rundir.MetricsWriter | None = None
    parent: Any = None   # the tracker run this seed's nests under (`tracking.MlflowRun.open`)
    tracker: tracking.MlflowRun | None = None
    best_accuracy: float = -1.0
    best_step: int = -1

    @property
    def config(self):
        return self.experiment.config

    @property
    def seed(self) -> int:
        return self.experiment.seed

    def meta(self, step: int, steps_per_epoch: int) -> dict[str, Any]:
        """The JSON saved beside a checkpoint of `step`: best validation accuracy and its step,
        epoch, variant and seed."""
        return {"best_val_accuracy": self.best_accuracy, "best_step": self.best_step,
                "epoch": step // steps_per_epoch, "variant": self.config.variant,
                "seed": self.seed}


def _resolved(config, workdir) -> ResolvedConfig:
    """The process set up for a run in `workdir` (`numerics.configure_process`: XLA's flags,
    before anything starts jax's backend) and `config` resolved: what every public entry of
    the engine does first, once."""
    numerics.configure_process(bool(config.get("deterministic", True)), workdir)
    resolved = experiment.resolve_config(config, jax.device_count())
    tracking.check_available(resolved)
    return resolved


def train_and_evaluate(config, workdir: str | pathlib.Path, *,
                       stop_after_steps: int | None = None) -> dict[str, Any]:
    """Train one seed into `workdir` (resuming if it holds a checkpoint), then evaluate.

    `stop_after_steps` ends the loop early as if the process had been killed after that many
    steps (tests of resumption); checkpoints written before that point stay.
    """
    config = _resolved(config, workdir)
    with lock.holding(workdir, create=False):
        return _train_one(config, workdir, stop_after_steps)


def _train_one(config: ResolvedConfig, workdir: str | pathlib.Path,
               stop_after_steps: int | None = None, parent=None) -> dict[str, Any]:
    run_ = SeedRun(experiment.Experiment.from_config(config), pathlib.Path(workdir),
                   parent=parent)
    return _train_seeds([run_], stop_after_steps=stop_after_steps)[0]


def train_and_evaluate_vmapped(config, workdir: str | pathlib.Path, seeds: list[int], *,
                               stop_after_steps: int | None = None) -> list[dict[str, Any]]:
    """Train `seeds` together in one program (`vmap` over a seed axis), into workdir/seed_<s>.

    Each seed directory ends up with what `train_and_evaluate` writes for that seed alone
    (config, checkpoints, logs, evaluation), and seed s follows the same data order,
    augmentation and dropout draws as its sequential run: the parameters agree to float32
    rounding (the batched convolutions may sum in another order), not bit for bit, which is why
    `vmap_seeds` is part of the recorded config. Killed and restarted, it resumes from the
    newest checkpoint step that every seed saved.
    """
    config = _resolved(config, workdir)
    with lock.holding(workdir, create=False):
        return _train_vmapped(config, workdir, seeds, stop_after_steps)


def _train_vmapped(config: ResolvedConfig, workdir: str | pathlib.Path, seeds: list[int],
                   stop_after_steps: int | None = None, parent=None) -> list[dict[str, Any]]:
    official = experiment.OfficialData.load(config)
    runs = []
    for seed in seeds:
        seeded = config_lib.with_seed(config, seed)
        runs.append(SeedRun(experiment.Experiment.from_config(
            seeded, official.for_seed(seeded, seed)), pathlib.Path(workdir) / f"seed_{seed}",
            parent=parent))
    return _train_seeds(runs, stop_after_steps=stop_after_steps, pool=official.train)


def _build_program(runs: list[SeedRun], tx, mesh, settings: steps.StepSettings,
                   pool: data.Split | None) -> programs.SeedProgram:
    method = runs[0].experiment.method  # the fields that shape the program are shared
    max_steps = steps_per_call(runs[0].config)
    if pool is None:
        return programs.single(method, tx, mesh, settings, runs[0].seed,
                               runs[0].experiment.data.train, max_steps)
    return programs.vmapped(method, tx, mesh, settings, [r.seed for r in runs],
                            np.stack([r.experiment.data.train_index for r in runs]), pool,
                            [r.experiment.normalization for r in runs], max_steps)


def steps_per_call(config) -> int:
    """Train steps per compiled call: `config.steps_per_dispatch` on an accelerator, 1 on a
    CPU. XLA:CPU compiles a convolution's gradient inside a device-side loop with its generic
    loop emitter instead of its convolution library (seconds per ConvNet step instead of a
    tenth of one, and another summation order), while on a CPU launching a step costs nothing
    next to running it; one call per step is the same program as before the device loop."""
    return 1 if jax.default_backend() == "cpu" else int(config.steps_per_dispatch)


def _restore(runs: list[SeedRun], program: programs.SeedProgram, mesh,
             steps_per_epoch: int) -> None:
    """Continue from the newest step that every seed saved complete and that restores, if any:
    its `last` checkpoint, else its `best` one (a `last` save that failed on a full disk
    leaves the `best` of that epoch end; `RunCheckpoints.resume_source`). A newer one that
    does not restore (damaged) is named in one line and set aside as `<step>.damaged`; when
    none restores, the run stops with nothing renamed."""
    seed_abstract = checkpointing.abstract_like(
        jax.eval_shape(lambda s: program.member(s, 0), program.state), sharding.replicated(mesh))
    common_steps = set.intersection(*(r.ckpt.resumable_steps() for r in runs))
    failures: list[tuple[SeedRun, int, BaseException]] = []
    for resume_step in sorted(common_steps, reverse=True):
        restored = []
        for run_ in runs:
            try:
                restored.append(run_.ckpt.restore_step(seed_abstract, resume_step))
            except Exception as e:  # noqa: BLE001 (Orbax and TensorStore raise many kinds)
                if files.out_of_memory(e) is not None:   # not damage: rename nothing
                    raise
                failures.append((run_, resume_step, e))
                break
        if len(restored) < len(runs):
            continue
        for run_, step, error in failures:
            manager, kind = run_.ckpt.resume_source(step)
            checkpointing.report_set_aside(run_.workdir / "checkpoints" / kind / str(step),
                                           error, log)
            checkpointing.set_aside(manager, step)
        for run_, (_, meta) in zip(runs, restored):
            run_.best_accuracy, run_.best_step = meta["best_val_accuracy"], meta["best_step"]
        program.state = program.stack([state for state, _ in restored])
        kinds = sorted({r.ckpt.resume_source(resume_step)[1] for r in runs})
        log(f"resumed from {_where(runs)}/checkpoints/{'|'.join(kinds)} at step {resume_step} "
             f"(epoch {resume_step // steps_per_epoch})")
        return
    if failures:
        run_, step, _ = failures[0]
        raise checkpointing.no_checkpoint_restores(
            run_.workdir, run_.ckpt.resume_source(step)[1],
            [(step, e) for _, step, e in failures])


def _where(runs: list[SeedRun]) -> pathlib.Path:
    return runs[0].workdir if len(runs) == 1 else runs[0].workdir.parent / "seed_*"


class _Validation:
    """Validation accuracy of every seed at an epoch end; which seeds improved on their best.

    In two halves, so the next epoch's steps can be queued between them: `dispatch` queues the
    predictions of the epoch-end states (no wait), `finish` fetches them, writes the records
    and returns the seeds that improved (the loop keeps their states as the new bests)."""

    def __init__(self, runs: list[SeedRun], mesh):
        self.runs, self.mesh, self.predict_steps = runs, mesh, {}
        self.resident: dict[int, inference.ResidentSplit] = {}   # seed -> its validation split

    def __call__(self, members: list[steps.TrainState], step: int, epoch: int) -> list[int]:
        return self.finish(self.dispatch(members), members, step, epoch)

    def dispatch(self, members: list[steps.TrainState]) -> list[inference.PendingPredictions]:
        return [self._predictions(run_, member) for run_, member in zip(self.runs, members)]

    def finish(self, pending: list[inference.PendingPredictions],
               members: list[steps.TrainState], step: int, epoch: int) -> list[int]:
        """Records and the epoch's line; the indices of the seeds whose accuracy improved."""
        report = []
        for run_, member, predictions in zip(self.runs, members, pending):
            labels = run_.experiment.data.validation.labels
            accuracy = float(np.mean(
                run_.experiment.method.predicted_class(predictions.fetch()) == labels))
            run_.writer.write(step, "validation", {"accuracy": accuracy})
            if run_.config.epoch_eval:
                self._epoch_eval(run_, member, step, epoch)
            improved = accuracy > run_.best_accuracy
            if improved:
                run_.best_accuracy, run_.best_step = accuracy, step
            report.append((run_, accuracy, improved))
        if len(report) == 1:
            run_, accuracy, improved = report[0]
            best = "" if improved else f" (best {run_.best_accuracy:.4f})"
            log(f"epoch {epoch + 1}: validation accuracy {accuracy:.4f}"
                 f"{' (best)' if improved else best}")
        else:
            listed = " ".join(f"{r.seed}:{a:.4f}{'*' if imp else ''}" for r, a, imp in report)
            log(f"epoch {epoch + 1}: validation accuracy per seed {listed} (* = best so far)")
        return [i for i, (_, _, improved) in enumerate(report) if improved]

    def _epoch_eval(self, run_: SeedRun, state: steps.TrainState, step: int, epoch: int) -> None:
        """config.epoch_eval: the test and OOD sets scored with the current parameters (as the
        final evaluation scores the best ones), so a run shows when detection turns down."""
        exp = run_.experiment
        restored = workdir_eval.RestoredRun(exp, workdir_eval.fitted(exp, state), self.mesh)
        id_pred = workdir_eval.predict(restored, exp.data.test)
        ood_preds = {name: workdir_eval.predict(restored, split, with_labels=False)
                     for name, split in exp.data.ood.items()}
        summary = epoch_eval_summary(evaluate_predictions(id_pred, ood_preds))
        run_.writer.write(step, "epoch_eval", summary)
        log(f"epoch {epoch + 1}: " + " ".join(f"{k} {v:.4g}" for k, v in summary.items()))

    def _predictions(self, run_: SeedRun,
                     state: steps.TrainState) -> inference.PendingPredictions:
        exp = run_.experiment
        if exp.normalization not in self.predict_steps:
            self.predict_steps[exp.normalization] = steps.make_predict_step(
                exp.method, self.mesh, *exp.normalization)
        if run_.seed not in self.resident:   # put on the devices once, not every epoch
            self.resident[run_.seed] = inference.put_split(
                self.mesh, exp.data.validation, exp.config.eval_batch_size)
        return inference.dispatch_predictions(
            self.predict_steps[exp.normalization], state.variables, state.method_state,
            self.mesh, self.resident[run_.seed], exp.config.eval_batch_size,
            experiment.predict_key(exp.seed))


def epoch_eval_summary(results: dict[str, Any]) -> dict[str, float]:
    """The per-epoch curve's numbers from an `evaluate_predictions` dict: test accuracy, AUPR of
    misclassification ("conf_<score>") and of each OOD set ("<set>_<score>", ID positive) for
    MP and UM, and the mean Dirichlet strength S of the test and each OOD set where defined."""
    summary = {"accuracy": results["id"]["accuracy"]}
    for score in ("mp", "um"):
        if score in results["scores"]:
            summary[f"conf_{score}"] = results["id"]["misclassification"][score]["aupr"]
            for name, entry in results["ood"].items():
                summary[f"{name}_{score}"] = entry["detection"][score]["aupr_in"]
    if "uncertainty" in results["id"]:
        summary["test_strength"] = results["id"]["uncertainty"]["strength"]
        for name, entry in results["ood"].items():
            summary[f"{name}_strength"] = entry["uncertainty"]["strength"]
    return summary


def headline_numbers(results: dict[str, Any]) -> dict[str, float]:
    """What a tracker gets of a final evaluation (eval_results.json's dict): the per-epoch
    curve's numbers (`epoch_eval_summary`) and the test set's NLL, Brier score and ECE."""
    return {**epoch_eval_summary(results),
            **{k: results["id"][k] for k in ("nll", "brier", "ece") if k in results["id"]}}


def result_files(workdir: pathlib.Path, results: dict[str, Any] | None) -> list[pathlib.Path]:
    """The files a tracker keeps of a run: its config.json and, once evaluated, its results
    and plots."""
    if results is None:
        return [workdir / "config.json"]
    return [workdir / name for name in ("config.json", "eval_results.json", "eval_table.md")
            ] + [pathlib.Path(p) for p in results.get("plots", [])]


def _progress_line(config, method, averaged: dict[str, float], step: int, total: int,
                   steps_per_epoch: int, rate: float, eta: str) -> str:
    extras = "".join(f" {label} {averaged[name]:{fmt}}" for name, label, fmt in
                     method.progress_logs if name in averaged)
    return (f"epoch {(step - 1) // steps_per_epoch + 1}/{config.num_epochs} step {step}/{total} "
            f"loss {averaged['loss']:.4f} acc {averaged['accuracy']:.4f}{extras} | "
            f"{rate:,.0f} img/s | ETA {eta}")


def _clock() -> float:
    """Seconds on a clock that only goes forward (`_Loop.checkpoint_due`; tests replace it)."""
    return time.monotonic()


@dataclasses.dataclass
class _EpochEnd:
    """An epoch end whose host work (its progress line, validation accuracy, checkpoints) waits
    until the next call is queued, so the devices go on training meanwhile."""

    step: int
    epoch: int
    members: list[steps.TrainState]   # every seed's epoch-end state, in buffers of its own
    validation: list[inference.PendingPredictions] | None   # queued on the devices


@dataclasses.dataclass
class _Loop:
    """Everything the step loop touches, built once by `_prepare_loop`."""

    runs: list[SeedRun]
    program: programs.SeedProgram
    buffer: MetricsBuffer
    validate: _Validation
    config: Any
    method: Any
    steps_per_epoch: int
    total_steps: int
    defer_epoch_ends: bool = False   # `defers_epoch_ends()`
    saver: concurrent.futures.ThreadPoolExecutor | None = None
    pending: _EpochEnd | None = None
    # When the newest `last` checkpoints were handed to Orbax (`checkpoint_due`), and the
    # states of the seeds whose validation improved since: seed index -> (step, state), saved
    # as `best` just before the next `last`, so a `last` on disk never names a best step whose
    # state is not on disk.
    last_saved_at: float = dataclasses.field(default_factory=lambda: _clock())
    held_bests: dict[int, tuple[int, steps.TrainState]] = dataclasses.field(default_factory=dict)

    def members(self) -> list[steps.TrainState]:
        """Every seed's current state; with deferred epoch ends, detached from the buffers the
        next call donates (a deferred validation, or a save in `saver`'s thread, still reads
        them after the loop has gone on). A loop that waits saves and validates before its
        next call, so it needs no copy."""
        member = self.program.detached if self.defer_epoch_ends else self.program.member
        return [member(self.program.state, i) for i in range(len(self.runs))]

    def save_last(self, step: int, members: list[steps.TrainState] | None = None) -> None:
        """`last` checkpoints of step `step`: the current state, after every pending metric is
        fetched and checked (a non-finite step stops the run before it is saved), or
        `members`, whose metrics the caller has checked; the bests kept since the newest save
        first."""
        if members is None:
            self.buffer.flush()
            members = self.members()
        for i, (best_step, best) in sorted(self.held_bests.items()):
            run_ = self.runs[i]
            run_.ckpt.save_best(best_step, best, run_.meta(best_step, self.steps_per_epoch))
        for run_, member in zip(self.runs, members):
            run_.ckpt.save_last(step, member, run_.meta(step, self.steps_per_epoch))
        self.held_bests.clear()
        self.last_saved_at = _clock()

    def checkpoint_due(self, step: int) -> bool:
        """Whether the epoch end at `step` saves checkpoints: the run's last one always, the
        others once `config.checkpoint_interval_seconds` have passed since the newest save (0:
        every epoch end). An epoch end's saves cost the host a few tens of ms per seed, which
        an accelerator's epoch of a fraction of a second felt (the GPU notes in docs/gpu.md);
        the interval bounds that cost. With several processes, process 0's clock decides for
        all (their Orbax saves are collective)."""
        interval = self.config.checkpoint_interval_seconds
        if step == self.total_steps or not interval:
            return True
        due = _clock() - self.last_saved_at >= interval
        if jax.process_count() > 1:
            due = bool(multihost_utils.broadcast_one_to_all(np.int32(due)))
        return due

    def end_epoch(self, members: list[steps.TrainState], step: int, epoch: int,
                  improved: list[int]) -> None:
        """After the epoch end's validation: the states of the seeds in `improved` kept as
        their new bests, and when `checkpoint_due`, every kept best and every seed's `last`
        saved. A best kept for a later save needs buffers of its own: with deferred epoch ends
        `members` have them; a loop that waits copies the state before its next call donates
        it."""
        self.check_saves()   # before the epoch's saves are queued behind a failed one
        due = self.checkpoint_due(step)
        for i in improved:
            kept = members[i] if due or self.defer_epoch_ends else \
                self.program.detached(self.program.state, i)
            self.held_bests[i] = (step, kept)
        if not due:
            return
        bests = len(self.held_bests)
        self.save_last(step, members)
        if self.config.checkpoint_interval_seconds:
            seeds = f" of {len(self.runs)} seeds" if len(self.runs) > 1 else ""
            best = (f", best of {bests} seed{'s' * (bests != 1)}" if len(self.runs) > 1 else
                    f", best (step {self.runs[0].best_step})") if bests else ""
            log(f"epoch {epoch + 1}: checkpoints saving in {_where(self.runs)}/checkpoints: "
                f"last (step {step}){seeds}{best}")

    def start_epoch_end(self, step: int, epoch: int, validate: bool) -> None:
        """The epoch end at `step`, without waiting: the states detached and (if `validate`)
        their validation predictions queued; `finish_epoch_end` does the rest once the next
        call is queued behind them."""
        members = self.members()
        self.pending = _EpochEnd(step, epoch, members,
                                 self.validate.dispatch(members) if validate else None)

    def finish_epoch_end(self) -> None:
        """The pending epoch end's host work, in the order a synchronous one does it: the
        epoch's metrics (checked) and progress line, validation records, the checkpoints
        (`end_epoch`)."""
        end, self.pending = self.pending, None
        self.log_progress(end.step, keep_last=True)   # the newest call is the next epoch's
        improved = [] if end.validation is None else self.validate.finish(
            end.validation, end.members, end.step, end.epoch)
        self.end_epoch(end.members, end.step, end.epoch, improved)
        if end.validation is not None:
            self.buffer.restart_mean()

    def log_progress(self, step: int, keep_last: bool) -> None:
        """The progress line of the steps up to `step` (and their metrics.jsonl records).
        keep_last: the newest call, dispatched after `step`, is still running; it is left
        pending, so the device is not idle while the host logs."""
        averaged = self.buffer.flush(keep_last=keep_last)
        if averaged is not None:
            fetched = self.buffer.last_fetched   # == step
            rate, eta = self.buffer.rate_and_eta(self.config.batch_size * len(self.runs),
                                                 self.total_steps - fetched)
            log(_progress_line(self.config, self.method, averaged, fetched, self.total_steps,
                                self.steps_per_epoch, rate, eta))
        self.check_saves()

    def check_saves(self) -> None:
        """A save that failed in the background (a full disk) stops the run here, at a progress
        line or an epoch end, not at the next save (`RunCheckpoints.check_saves`)."""
        for run_ in self.runs:
            run_.ckpt.check_saves()


def _prepare_loop(runs: list[SeedRun], pool: data.Split | None, mesh) -> _Loop:
    """Workdirs checked, the program built (or restored from the newest common checkpoint),
    metrics writers open."""
    config, method = runs[0].config, runs[0].experiment.method
    num_train = len(runs[0].experiment.data.train.labels)
    for run_ in runs:   # everything checked before anything is written
        experiment.check_data_sizes(run_.config, run_.experiment.data)
        data.check_ood_groups(   # the sets the run's end evaluates
            run_.config.ood_groups, (*run_.config.ood_datasets, *run_.config.extra_ood))
    for run_ in runs:
        rundir.prepare(run_.workdir, run_.config)
    numerics.make_autotune_folder()
    steps_per_epoch = num_train // config.batch_size
    total_steps = steps_per_epoch * config.num_epochs
    norm = runs[0].experiment.normalization
    settings = steps.StepSettings(steps_per_epoch=steps_per_epoch,
                                  batch_size=config.batch_size, augment=config.augment,
                                  normalize_mean=norm[0], normalize_std=norm[1])
    program = _build_program(runs, optimizer.make_optimizer(config, total_steps), mesh,
                             settings, pool)
    for run_ in runs:
        run_.ckpt = checkpointing.RunCheckpoints(run_.workdir)
    _restore(runs, program, mesh, steps_per_epoch)
    # The saves in a thread of their own (`defers_epoch_ends`), one process only: with several,
    # each save holds barriers of every process, which must not interleave with the steps'
    # collectives.
    defer = defers_epoch_ends()
    saver = (concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gedl-checkpoints")
             if defer and jax.process_count() == 1 else None)
    for run_ in runs:
        run_.ckpt.saver = saver
    for run_ in runs:   # last: a failure above leaves no tracker run open
        run_.tracker = tracking.MlflowRun.open(run_.config, run_.workdir, run_.parent)
        run_.writer = rundir.MetricsWriter(run_.workdir, run_.tracker)
    buffer = MetricsBuffer(
        [r.seed for r in runs], lambda i, step, m: runs[i].writer.write(step, "train", m),
        on_nonfinite=lambda: _saved_checkpoints(runs),
        where=f"{_where(runs)}/checkpoints", steps_per_epoch=steps_per_epoch)
    together = (f"seeds {','.join(str(r.seed) for r in runs)} trained together (vmap), "
                if pool is not None else "")
    log(f"{config.variant} on {config.dataset} ({method.describe()}): {together}{num_train} "
         f"train / {len(runs[0].experiment.data.validation.labels)} val, {steps_per_epoch} "
         f"steps/epoch x {config.num_epochs} epochs, global batch {config.batch_size} on "
         f"{mesh.size} {jax.devices()[0].platform} device(s); {numerics.describe(config)}")
    return _Loop(runs, program, buffer, _Validation(runs, mesh), config, method,
                 steps_per_epoch, total_steps, defer, saver)


def _saved_checkpoints(runs: list[SeedRun]) -> bool:
    """Wait for pending saves; whether every seed has a `last` checkpoint on disk."""
    for run_ in runs:
        run_.ckpt.wait()
    return all(run_.ckpt.last_steps() for run_ in runs)


def chance_message(run_: SeedRun) -> str | None:
    """A line when the seed's best validation accuracy is not above what always predicting the
    most frequent validation class scores (3 standard errors of margin, at least 1.5/K): the
    run learnt nothing (it diverged, or the learning rate is far off). None otherwise."""
    labels = run_.experiment.data.validation.labels
    if run_.best_accuracy < 0 or not len(labels):
        return None
    majority = float(np.bincount(labels).max() / len(labels))
    limit = max(majority + 3 * np.sqrt(majority * (1 - majority) / len(labels)),
                1.5 / run_.config.num_classes)
    if run_.best_accuracy > limit or limit >= 1:   # >= 1: too few to tell (one image, say)
        return None
    return (f"{run_.workdir} ended at chance level: best validation accuracy "
            f"{run_.best_accuracy:.4f} (the most frequent class alone scores {majority:.4f}); "
            f"try a lower config.learning_rate")


def _next_event(loop: _Loop, step: int, stop_after_steps: int | None) -> int:
    """The step after `step` at which the loop must act on the host: an epoch end, a progress
    line, a mid-epoch checkpoint, a requested stop or the end, at most
    `config.steps_per_dispatch` steps on (a preemption is checked at each of these), one step
    on when a stop is already pending (single process: a signal that arrived before this call
    is answered after one step, one that arrives during it after the call)."""
    config, spe = loop.config, loop.steps_per_epoch

    def next_multiple(every: int) -> int:
        return (step // every + 1) * every

    ends = [next_multiple(spe), next_multiple(config.log_every_steps), loop.total_steps,
            step + (1 if preemption.stop_pending() else loop.program.max_steps)]
    if config.checkpoint_every_steps:
        ends.append(next_multiple(config.checkpoint_every_steps))
    if stop_after_steps is not None and stop_after_steps > step:
        ends.append(stop_after_steps)
    return min(ends)


# An epoch end's host work after the next call is queued, and the checkpoints saved in a thread
# of their own: on an accelerator, which trains meanwhile. On a CPU the host is the device, so
# there is nothing to overlap (the saver thread would compete with the steps for the cores),
# and the loop waits at an epoch end as it always did. None: off the CPU; tests set True or
# False (the same run either way, which tests/test_train.py checks).
DEFER_EPOCH_ENDS: bool | None = None


def defers_epoch_ends() -> bool:
    return jax.default_backend() != "cpu" if DEFER_EPOCH_ENDS is None else DEFER_EPOCH_ENDS


def _run_loop(loop: _Loop, stop_after_steps: int | None) -> tuple[int, bool]:
    """One loop over calls of one step or several (`config.steps_per_dispatch`, never across
    an event: `_next_event`); epoch ends (validate, checkpoint), mid-epoch checkpoints and
    preemption are events at their boundaries. An epoch end's host work waits until the next
    call is queued (`_Loop.finish_epoch_end`), except at a stop or the end, where the loop
    waits for it. Returns (steps done, stopped early)."""
    config, spe, program = loop.config, loop.steps_per_epoch, loop.program
    step = program.current_step()   # `step` counts the steps done
    order = None
    dispatches = 0
    log_after = None   # a progress line due, printed after the next call is dispatched
    while step < loop.total_steps:
        if stop_after_steps is not None and step >= stop_after_steps:
            return step, True
        epoch = step // spe
        if order is None or step % spe == 0:
            order = program.epoch_order(epoch)
        # The first call is one step: it carries the compile and the device's warm-up, which
        # the progress lines time apart from the steps (`progress.MetricsBuffer.add`). How the
        # steps are cut into calls does not change the run (tests/test_multi_step.py).
        count = 1 if dispatches == 0 else _next_event(loop, step, stop_after_steps) - step
        step += count
        program.state, metrics = program.steps(program.state, order, count)
        loop.buffer.add(step, metrics, count if program.max_steps > 1 else None)
        dispatches += 1
        if loop.pending is not None:   # the epoch end before this call, while this call runs
            loop.finish_epoch_end()
        if log_after is not None:   # the line of the call before, while this one runs
            loop.log_progress(log_after, keep_last=True)
            log_after = None
        epoch_end = step % spe == 0
        checkpoint = bool(config.checkpoint_every_steps) and \
            step % config.checkpoint_every_steps == 0 and not epoch_end
        # Called after every call on every process, with a count that goes up by one each
        # time (JAX's multi-host sync point needs both; the hosts cut the same calls). At an
        # epoch end the stop waits for validation and the epoch's checkpoint, so a resumed
        # run never skips a validation.
        preempted = preemption.should_stop(dispatches)
        stop_now = stop_after_steps is not None and step >= stop_after_steps
        deferred = loop.defer_epoch_ends and epoch_end and \
            not (stop_now or preempted or step == loop.total_steps)
        if (step % config.log_every_steps == 0 or epoch_end) and not deferred:
            if epoch_end or checkpoint or step == stop_after_steps:
                loop.log_progress(step, keep_last=False)   # the loop waits here anyway
            else:
                log_after = step
        if checkpoint:
            loop.save_last(step)
        validate = (epoch + 1) % config.eval_every_epochs == 0 or step == loop.total_steps
        if deferred:
            loop.start_epoch_end(step, epoch, validate)
        elif epoch_end and not stop_now:
            loop.buffer.flush()
            members = loop.members()
            improved = loop.validate(members, step, epoch) if validate else []
            loop.end_epoch(members, step, epoch, improved)
            if validate:
                loop.buffer.restart_mean()
        if preempted:
            loop.save_last(step)
            _stop_for_preemption(loop.runs, step)
        if stop_now:
            return step, True
    loop.buffer.flush()
    return step, False


def _train_seeds(runs: list[SeedRun], *, stop_after_steps: int | None,
                 pool: data.Split | None = None) -> list[dict[str, Any]]:
    """Train one seed, or several together (then `pool` is the official training split the
    seeds' `train_index` point into), then evaluate each seed's best checkpoint."""
    mesh = sharding.make_mesh()
    try:
        with numerics.precision(runs[0].config):
            return _train_and_finish(runs, pool, mesh, stop_after_steps)
    except Exception as e:  # noqa: BLE001 (Orbax's async save wraps the OSError)
        if isinstance(e, DiskFullError) or not files.is_disk_full(e):
            raise
        raise DiskFullError(_disk_full_message(runs, e)) from e


def _train_and_finish(runs: list[SeedRun], pool: data.Split | None, mesh,
                      stop_after_steps: int | None) -> list[dict[str, Any]]:
    try:
        return _train_and_finish_runs(runs, pool, mesh, stop_after_steps)
    except BaseException as e:
        for run_ in runs:   # those a seed's `_finish` ended stay FINISHED
            if run_.tracker is not None:
                run_.tracker.end(tracking.status_after(e))
        raise


def _train_and_finish_runs(runs: list[SeedRun], pool: data.Split | None, mesh,
                           stop_after_steps: int | None) -> list[dict[str, Any]]:
    loop = _prepare_loop(runs, pool, mesh)
    try:
        step, stopped_early = _run_loop(loop, stop_after_steps)
    finally:
        try:
            _close_all(runs)
        finally:
            if loop.saver is not None:
                loop.saver.shutdown()
    summaries = []
    for i, run_ in enumerate(runs):
        try:
            summaries.append(_finish(run_, loop.program, i, step, stopped_early, mesh))
        except preemption.EvaluationInterrupted:
            if len(runs) == 1:
                raise
            # seeds trained together: every seed from this one on is left to evaluate
            raise preemption.EvaluationInterrupted(
                [str(r.workdir) for r in runs[i:]], trained=True,
                evaluated=[str(r.workdir) for r in runs[:i]]) from None
    return summaries


def _close_all(runs: list[SeedRun]) -> None:
    """Every seed's pending saves waited for and its metrics closed, even after one fails (each
    failure collected, so none is printed at exit); the first failure is raised."""
    errors = []
    for run_ in runs:
        for close in (run_.ckpt and run_.ckpt.wait, run_.writer and run_.writer.close):
            if close is None:
                continue
            try:
                close()
            except Exception as e:  # noqa: BLE001 (Orbax wraps the OSError)
                errors.append(e)
    if errors:
        raise errors[0]


class DiskFullError(OSError):
    """The disk filled while the run wrote a checkpoint, its metrics or its results; what was
    already on disk is intact (the CLI exits with 74)."""

    def __init__(self, message: str):
        super().__init__(errno.ENOSPC, message)

    def __str__(self) -> str:
        return self.strerror


def _disk_full_message(runs: list[SeedRun], error: BaseException) -> str:
    """The line of a failed write (exit 74): where, how much space is left there, and the
    newest complete checkpoint a rerun continues from."""
    kept = []
    for run_ in runs:
        found = {kind: [int(p.name) for p in (run_.workdir / "checkpoints" / kind).glob("*")
                        if p.name.isdigit()] for kind in ("last", "best")}
        newest = max((max(s), kind) for kind, s in found.items() if s) if any(
            found.values()) else None
        kept.append(f"step {newest[0]} ({newest[1]})" if newest else "none yet")
    failed = files.disk_full_error(error)
    where = getattr(failed, "filename", None) or f"{_where(runs)}/checkpoints"
    return (f"no space left on device writing {where}: free some space and rerun the same "
            f"command to continue from the newest checkpoint\n"
            f"  {files.free_space_text(runs[0].workdir)} on that filesystem; the checkpoints "
            f"already on disk are intact (newest: {', '.join(sorted(set(kept)))})")


def _finish(run_: SeedRun, program: programs.SeedProgram, index: int, step: int,
            stopped_early: bool, mesh) -> dict[str, Any]:
    """The seed's summary; its best checkpoint evaluated (config.evaluate_at_end)."""
    summary = {"workdir": str(run_.workdir), "steps": step, "seed": run_.seed,
               "best_val_accuracy": run_.best_accuracy, "best_step": run_.best_step,
               "state": program.member(program.state, index),
               "at_chance": None if stopped_early else chance_message(run_)}
    if not stopped_early and run_.config.evaluate_at_end:
        abstract = checkpointing.abstract_like(summary["state"], sharding.replicated(mesh))
        best_state, _ = checkpointing.restore_for_evaluation(run_.ckpt, abstract, run_.workdir,
                                                             log)
        summary["evaluation"] = workdir_eval.evaluate_and_write(
            run_.experiment, best_state, run_.workdir, mesh=mesh)
    run_.ckpt.close()
    if run_.tracker is not None:
        evaluation = summary.get("evaluation")
        run_.tracker.log_results(headline_numbers(evaluation) if evaluation else {},
                                 run_.best_step, result_files(run_.workdir, evaluation))
        run_.tracker.end("KILLED" if stopped_early else "FINISHED")
    return summary


def _stop_for_preemption(runs: list[SeedRun], step: int) -> None:
    """After the `last` checkpoint of every seed is on disk, raise `preemption.Preempted` (the
    CLI exits with `EXIT_PREEMPTED`)."""
    for run_ in runs:
        run_.ckpt.wait()
    raise preemption.Preempted(step, str(_where(runs)))


def _train_seed_list(config: ResolvedConfig, workdir: pathlib.Path, seeds: list[int],
                     parent=None) -> list[dict[str, Any]]:
    """`seeds` into workdir/seed_<s>: together in one program (config.vmap_seeds) or one after
    another; their tracker runs nested under `parent`'s."""
    if config.vmap_seeds and len(seeds) > 1:
        log(f"=== seeds {','.join(map(str, seeds))} (vmap) ===")
        return _train_vmapped(config, workdir, seeds, parent=parent)
    results = []
    for k, seed in enumerate(seeds):
        log(f"=== seed {seed} ===")
        try:
            results.append(_train_one(config_lib.with_seed(config, seed),
                                      workdir / f"seed_{seed}", parent=parent))
        except preemption.EvaluationInterrupted as e:
            if k == len(seeds) - 1:
                raise
            raise preemption.EvaluationInterrupted(
                e.workdirs, trained=True,
                untrained=[str(workdir / f"seed_{s}") for s in seeds[k + 1:]]) from None
    return results


def train_ensemble(config, workdir: str | pathlib.Path) -> dict[str, Any]:
    """A deep ensemble: `config.ensemble_size` members of the method, trained as seeds
    seed*N + m into workdir/members/seed_<seed*N + m>, then scored as one model into workdir
    (mean probabilities; the mutual information between prediction and member as the
    epistemic score "neg_mi")."""
    config = _resolved(config, workdir)
    with lock.holding(workdir, create=False):
        return _train_ensemble(config, pathlib.Path(workdir))


def _train_ensemble(config: ResolvedConfig, workdir: pathlib.Path,
                    parent=None) -> dict[str, Any]:
    size, seed = int(config.ensemble_size), int(config.seed)
    members = config_lib.ensemble_member_config(config)
    log(f"=== ensemble of {size} ({config.variant}, seed {seed}): members seeds "
         f"{seed * size}..{seed * size + size - 1} ===")
    rundir.prepare(workdir, config)
    seeds = [seed * size + m for m in range(size)]
    with tracking.ending(tracking.MlflowRun.open(config, workdir, parent)) as tracker:
        trained = _train_seed_list(members, workdir / "members", seeds, parent=tracker)
        summary = {"workdir": str(workdir), "seed": seed, "members": trained}
        if config.evaluate_at_end:
            member_dirs = [workdir / "members" / f"seed_{s}" for s in seeds]
            summary["evaluation"] = ensemble_eval.evaluate_ensemble_and_write(
                config, member_dirs, workdir)
        if tracker is not None:   # the ensemble is scored as one model, at no one step: 0
            evaluation = summary.get("evaluation")
            tracker.log_results(headline_numbers(evaluation) if evaluation else {}, 0,
                                result_files(workdir, evaluation))
    return summary


def _check_one_kind_of_workdir(workdir: pathlib.Path, single_dir: bool) -> None:
    """A workdir holds one run (its config.json) or a seeds command's runs (seed_*/), never
    both: their tables (eval_table.md) would overwrite each other's."""
    seed_runs = rundir.seed_runs(workdir)
    if single_dir and seed_runs:
        raise ConfigMismatchError(
            f"{workdir} holds the runs of a config.seeds command ({', '.join(seed_runs)}); a "
            f"single run there would overwrite their table: give the same config.seeds to "
            f"resume them, or use a new --workdir")
    if not single_dir and (workdir / "config.json").exists():
        raise ConfigMismatchError(
            f"{workdir} holds a single run (config.json); the seeds' runs there would "
            f"overwrite its table: resume it without config.seeds, or use a new --workdir")


def train(config, workdir: str | pathlib.Path) -> list[dict[str, Any]]:
    """The engine's entry: one run per seed of `config.seeds` (workdir/seed_<s>), or a single
    run in `workdir`; a deep ensemble per seed when `config.ensemble_size` is set. The config is
    resolved here, once (every field checked: nothing is trained or written before that), and
    every seed and member reads a copy of the resolved one; `workdir` is held by this process
    from its first write (`lock.holding`)."""
    config = _resolved(config, workdir)   # before any copy of it
    with lock.holding(workdir, create=False):
        return _train_resolved(config, pathlib.Path(workdir))


def _train_resolved(config: ResolvedConfig, workdir: pathlib.Path) -> list[dict[str, Any]]:
    seeds = config_lib.parse_seeds(config)
    single_dir = not config.seeds
    _check_one_kind_of_workdir(workdir, single_dir)
    if single_dir and not config.ensemble_size:
        return [_train_one(config, workdir)]
    # the seeds' tracker runs nest under one of the command's workdir
    with tracking.ending(None if single_dir else tracking.CommandRun(config, workdir)) as command:
        if config.ensemble_size:
            results = [_train_ensemble(config_lib.with_seed(config, s),
                                       workdir if single_dir else workdir / f"seed_{s}",
                                       parent=command)
                       for s in seeds]
        else:
            results = _train_seed_list(config, workdir, seeds, parent=command)
        evaluations = [r["evaluation"] for r in results if "evaluation" in r]
        if len(evaluations) > 1 and jax.process_index() == 0:
            from gedl_jax import evaluation

            table = evaluation.results_table(evaluations, fmt="markdown")
            files.write_text(workdir / "eval_table.md", table + "\n")
            log(f"\n=== {len(evaluations)} seeds, mean ± std ===\n{table}")
            if command is not None:
                command.log_results({}, 0, [workdir / "eval_table.md"])
    return results


def run(config, workdir: str | pathlib.Path) -> list[dict[str, Any]]:
    """Deprecated name of `train` (`run` names the package): kept in 0.1.0, removed in 0.2.0."""
    import warnings

    warnings.warn("gedl_jax.run.training.run is renamed train (the old name goes in 0.2.0)",
                  DeprecationWarning, stacklevel=2)
    return train(config, workdir)
