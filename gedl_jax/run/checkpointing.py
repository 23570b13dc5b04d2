"""Orbax checkpoints of a run: `last` (resume) and `best` (highest validation accuracy).

Layout under the workdir:
    checkpoints/last/<step>/   the newest state, for resuming (two kept, so a save killed half-way
                               never leaves a run without a complete checkpoint)
    checkpoints/best/<step>/   the state with the best validation accuracy so far
Each holds the TrainState (step, params, the model's mutable collections, optimizer state, the
method's state; the data order is a function of seed and step) and a JSON of loop metadata
(epoch, best validation accuracy and its step, variant, seed).
Orbax writes into a temporary folder and renames it when complete, so an interrupted save is
ignored on restore.
"""

from __future__ import annotations

import concurrent.futures
import pathlib
import zlib
from typing import Any

import jax
import orbax.checkpoint as ocp

from gedl_jax import files
from gedl_jax.run.rundir import ConfigMismatchError


def _options(folder: pathlib.Path, max_to_keep: int) -> ocp.CheckpointManagerOptions:
    # With several processes Orbax synchronises each save with barriers named after the step;
    # `last` and `best` (and the seeds of a vmapped run) save the same step at the same time,
    # so each manager needs its own barrier names.
    prefix = f"gedl{zlib.crc32(str(folder).encode()):08x}"
    return ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep, create=True,
        multiprocessing_options=ocp.options.MultiprocessingOptions(
            barrier_sync_key_prefix=prefix))


class RunCheckpoints:
    """A run's two checkpoint folders: `checkpoints/last` (the newest two states, to resume)
    and `checkpoints/best` (the best-validation state, to evaluate), each an Orbax manager
    saving the train state and a JSON `meta` beside it."""

    def __init__(self, workdir: str | pathlib.Path,
                 saver: concurrent.futures.Executor | None = None):
        """`saver`: a one-thread executor that runs the saves (Orbax's own work on the host, a
        few tens of ms each, then its asynchronous write), so the training loop goes on
        dispatching steps meanwhile; the saves keep their order. None: saved by the caller."""
        root = pathlib.Path(workdir).absolute() / "checkpoints"
        refuse_planted_links(root)
        self.last = ocp.CheckpointManager(root / "last", options=_options(root / "last", 2))
        self.best = ocp.CheckpointManager(root / "best", options=_options(root / "best", 1))
        self.saver = saver
        self._queued: list[concurrent.futures.Future] = []

    def save_last(self, step: int, state, meta: dict[str, Any]) -> None:
        """Save `state` and `meta` as step `step` of `last` (asynchronous; a step already
        saved is skipped)."""
        self._save(self.last, step, state, meta)

    def save_best(self, step: int, state, meta: dict[str, Any]) -> None:
        """Save `state` and `meta` as the new `best` (asynchronous; only one is kept)."""
        self._save(self.best, step, state, meta)

    def _save(self, manager, step, state, meta) -> None:
        if self.saver is None:
            _save_now(manager, step, state, meta)
            return
        self._raise_failed_saves()   # a failed save (a full disk) stops the run at the next one
        self._queued.append(self.saver.submit(_save_now, manager, step, state, meta))

    def _raise_failed_saves(self) -> None:
        done = [f for f in self._queued if f.done()]
        self._queued = [f for f in self._queued if not f.done()]
        for future in done:
            future.result()

    def check_saves(self) -> None:
        """Raise the error of a save that failed in the background (a full disk) now, without
        waiting for the saves still running: the loop calls it at each progress line and epoch
        end, so a failed save stops the run there, not at the next save (with `saver`, once
        its thread is done with the saves queued). With several processes a save is collective
        and its failure is raised at the next one (a check here could stop one process and
        leave the others waiting)."""
        self._raise_failed_saves()
        if self._queued:   # `saver`'s thread is inside a save: its managers are left to it
            return
        if jax.process_count() == 1:
            for manager in (self.last, self.best):
                # Orbax's check_for_errors misses a failure its finalize thread collected; a
                # manager that saves nothing returns from wait_until_finished at once, raising
                # the error of a save that failed.
                manager.check_for_errors()
                if not manager.is_saving_in_progress():
                    manager.wait_until_finished()

    def latest_step(self) -> int | None:
        """The newest step saved in `last`, or None when there is none."""
        return self.last.latest_step()

    def last_steps(self) -> set[int]:
        """Steps of the complete `last` checkpoints on disk (at most two)."""
        return set(self.last.all_steps())

    def resumable_steps(self) -> set[int]:
        """Steps a run can resume from: those of the complete `last` checkpoints and of the
        `best` one (saved complete where the `last` save of its step failed, say on a full
        disk; it holds the same train state)."""
        return set(self.last.all_steps()) | set(self.best.all_steps())

    def resume_source(self, step: int) -> tuple[Any, str]:
        """(manager, "last" or "best") to resume from at `step`: its `last` checkpoint where
        there is one, else its `best`."""
        return (self.last, "last") if step in self.last.all_steps() else (self.best, "best")

    def restore_step(self, abstract_state, step: int):
        """(state, meta) of `step` from `resume_source(step)`."""
        return self._restore(self.resume_source(step)[0], step, abstract_state)

    def restore_last(self, abstract_state, step: int | None = None):
        """The newest `last` checkpoint, or the one at `step` (seeds trained together resume
        from the newest step that every seed saved)."""
        return self._restore(self.last, self.last.latest_step() if step is None else step,
                             abstract_state)

    def restore_best(self, abstract_state):
        """The `best` state shaped like `abstract_state` (the `last` one when no validation ever
        ran)."""
        step = self.best.latest_step()
        if step is None:  # e.g. validation never ran: fall back to the last state
            return self.restore_last(abstract_state)
        return self._restore(self.best, step, abstract_state)

    @staticmethod
    def _restore(manager, step, abstract_state):
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {manager.directory}")
        try:
            restored = manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
            return restored["state"], restored["meta"]
        except (ValueError, KeyError, TypeError) as e:
            legacy = _legacy_abstract(abstract_state)
            if legacy is None:
                raise
            try:
                restored = manager.restore(step, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(legacy), meta=ocp.args.JsonRestore()))
            except (ValueError, KeyError, TypeError):
                restored = None
            if restored is None:
                # Not a legacy checkpoint either: the first error says what is wrong (a
                # damaged file, another method's state). Raised outside the legacy attempt's
                # handler, so that attempt's tree mismatch is not chained to it as its context,
                # where `describe_failure` would report it instead.
                raise e
            return _from_legacy(abstract_state, restored["state"]), restored["meta"]

    def wait(self) -> None:
        """Block until every pending asynchronous save is on disk. Both managers are waited for
        even when the first fails (a full disk fails both): a save whose failure nobody
        collects is printed by asyncio when the process exits, after the run's `error:` line.
        The first failure is raised."""
        errors = []
        for future in self._queued:   # the saves handed to `saver`, in order
            try:
                future.result()
            except Exception as e:  # noqa: BLE001 (Orbax wraps the OSError)
                errors.append(e)
        self._queued = []
        for manager in (self.last, self.best):
            try:
                manager.wait_until_finished()
            except Exception as e:  # noqa: BLE001 (Orbax wraps the OSError)
                errors.append(e)
        if errors:
            raise errors[0]

    def close(self) -> None:
        """Wait for the pending saves, then close both managers."""
        self.wait()
        self.last.close()
        self.best.close()


def refuse_planted_links(root: pathlib.Path) -> None:
    """`files.PlantedLinkError` when `root` (a run's checkpoints/), its `last` or `best`
    folder, or a checkpoint in them is a link: Orbax would save into the folder it names and
    delete the old checkpoints there, or take it for a checkpoint."""
    what = "checkpoints"
    files.refuse_link(root, what, "folder")
    for kind in ("last", "best"):
        folder = root / kind
        files.refuse_link(folder, what, "folder")
        if folder.is_dir():
            for entry in folder.iterdir():
                if entry.is_symlink():
                    files.refuse_link(entry, what, "folder")


def _save_now(manager, step, state, meta) -> None:
    if step in manager.all_steps():
        return
    manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                               meta=ocp.args.JsonSave(meta)))


# Checkpoints written before the method interface (gedl-jax <= dd3581c) hold the EDL family's
# TrainState with the fields (step, params, batch_stats, opt_state, tau_state). They restore into
# today's (step, params, model_state={"batch_stats": ...} or {}, opt_state, method_state).
_LEGACY_FIELDS = ("step", "params", "batch_stats", "opt_state", "tau_state")


def _legacy_abstract(abstract_state) -> dict[str, Any] | None:
    model_state = getattr(abstract_state, "model_state", None)
    if model_state is None or set(model_state) - {"batch_stats"}:
        return None
    return {"step": abstract_state.step, "params": abstract_state.params,
            "batch_stats": model_state.get("batch_stats", {}),
            "opt_state": abstract_state.opt_state, "tau_state": abstract_state.method_state}


def _from_legacy(abstract_state, legacy: dict[str, Any]):
    model_state = {"batch_stats": legacy["batch_stats"]} if "batch_stats" in \
        abstract_state.model_state else {}
    return abstract_state.replace(step=legacy["step"], params=legacy["params"],
                                  model_state=model_state, opt_state=legacy["opt_state"],
                                  method_state=legacy["tau_state"])


def describe_failure(error: BaseException) -> str:
    """An Orbax / TensorStore restore error on one line (they span dozens)."""
    chain = []
    while error is not None and error not in chain:
        chain.append(error)
        error = error.__cause__ or error.__context__
    # The innermost message says what is wrong (TensorStore: "OUT_OF_RANGE: Error reading ...");
    # the outer ones wrap it with object reprs.
    readable = [e for e in chain if str(e) and "<bound method" not in str(e)] or chain
    cause = readable[-1]
    text = " ".join(str(cause).split())
    return f"{type(cause).__name__}: {text[:160]}{'...' if len(text) > 160 else ''}"


def set_aside(manager, step: int) -> pathlib.Path:
    """Rename checkpoint `step` of `manager` to `<step>.damaged` (never deleted: a user may want
    it back), so the manager and later runs no longer see it."""
    folder = pathlib.Path(manager.directory) / str(step)
    target, n = folder.with_name(f"{step}.damaged"), 1
    while target.exists():
        target, n = folder.with_name(f"{step}.damaged{n}"), n + 1
    if jax.process_index() == 0:
        folder.rename(target)
    manager.reload()
    return target


def report_set_aside(folder: pathlib.Path, error: BaseException, log) -> None:
    """Log (with `log`) that the checkpoint `folder` could not be restored and was set aside."""
    log(f"warning: checkpoint {folder} cannot be restored ({describe_failure(error)}); "
        f"set aside as {folder.name}.damaged")


def no_checkpoint_restores(workdir, kind: str, failures) -> ConfigMismatchError:
    """The error to raise when no `kind` checkpoint of `workdir` restores: it names the first
    failure (`failures`: [(step, exception)]) and what to do."""
    step, error = failures[0]
    return ConfigMismatchError(
        f"cannot resume from {workdir}/checkpoints/{kind}/{step}: it does not match this "
        f"version, or it is damaged: use a new --workdir, or the version that wrote it\n"
        f"  no older checkpoint restores either ({len(failures)} tried); the workdir was left "
        f"as it is. The train state of this version of gedl-jax does not fit:\n"
        f"  {describe_failure(error)}")


def restore_for_resume(ckpt: RunCheckpoints, abstract_state, step: int,
                       workdir: pathlib.Path):
    """The `last` checkpoint at `step`, or a clear error if it does not fit this program (a
    workdir from another version of gedl-jax or another method, or a damaged checkpoint).
    Nothing is deleted."""
    try:
        return ckpt.restore_last(abstract_state, step)
    except Exception as e:  # noqa: BLE001 (Orbax and TensorStore raise many kinds)
        if files.out_of_memory(e) is not None:   # not a checkpoint that does not fit
            raise
        raise no_checkpoint_restores(workdir, "last", [(step, e)]) from None


def restore_for_evaluation(ckpt: RunCheckpoints, abstract_state, workdir, log=print):
    """The best checkpoint; if it does not restore, it is set aside (one line) and the newest
    `last` checkpoint that restores is used instead (one line). None restores: a
    `ConfigMismatchError`, with nothing renamed."""
    candidates = [(ckpt.best, "best", s) for s in sorted(ckpt.best.all_steps(), reverse=True)]
    candidates += [(ckpt.last, "last", s) for s in sorted(ckpt.last.all_steps(), reverse=True)]
    if not candidates:
        raise FileNotFoundError(f"no checkpoint in {pathlib.Path(workdir)}/checkpoints: was the "
                                f"run trained (python -m gedl_jax.train ... --workdir=DIR)?")
    failures = []
    for manager, kind, step in candidates:
        try:
            state, meta = ckpt._restore(manager, step, abstract_state)
        except Exception as e:  # noqa: BLE001 (Orbax and TensorStore raise many kinds)
            if files.out_of_memory(e) is not None:   # not damage: rename nothing
                raise
            failures.append((manager, kind, step, e))
            continue
        for bad_manager, _, bad_step, error in failures:
            report_set_aside(pathlib.Path(bad_manager.directory) / str(bad_step), error, log)
            set_aside(bad_manager, bad_step)
        if failures:
            log(f"evaluating {workdir}/checkpoints/{kind}/{step} instead")
        return state, meta
    raise no_checkpoint_restores(workdir, failures[0][1], [(s, e) for _, _, s, e in failures])


def abstract_like(state, sharding=None):
    """The ShapeDtypeStruct tree Orbax restores into (on `sharding` if given)."""
    def to_abstract(x):
        return jax.ShapeDtypeStruct(x.shape, x.dtype,
                                    sharding=sharding if sharding is not None else x.sharding)
    return jax.tree.map(to_abstract, state)
