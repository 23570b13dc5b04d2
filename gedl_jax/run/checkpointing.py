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

import pathlib
import zlib
from typing import Any

import jax
import orbax.checkpoint as ocp

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
    def __init__(self, workdir: str | pathlib.Path):
        root = pathlib.Path(workdir).absolute() / "checkpoints"
        self.last = ocp.CheckpointManager(root / "last", options=_options(root / "last", 2))
        self.best = ocp.CheckpointManager(root / "best", options=_options(root / "best", 1))

    def save_last(self, step: int, state, meta: dict[str, Any]) -> None:
        self._save(self.last, step, state, meta)

    def save_best(self, step: int, state, meta: dict[str, Any]) -> None:
        self._save(self.best, step, state, meta)

    @staticmethod
    def _save(manager, step, state, meta) -> None:
        if step in manager.all_steps():
            return
        manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                   meta=ocp.args.JsonSave(meta)))

    def latest_step(self) -> int | None:
        return self.last.latest_step()

    def last_steps(self) -> set[int]:
        """Steps of the complete `last` checkpoints on disk (at most two)."""
        return set(self.last.all_steps())

    def restore_last(self, abstract_state, step: int | None = None):
        """The newest `last` checkpoint, or the one at `step` (seeds trained together resume
        from the newest step that every seed saved)."""
        return self._restore(self.last, self.last.latest_step() if step is None else step,
                             abstract_state)

    def restore_best(self, abstract_state):
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
                raise e from None
            return _from_legacy(abstract_state, restored["state"]), restored["meta"]

    def wait(self) -> None:
        self.last.wait_until_finished()
        self.best.wait_until_finished()

    def close(self) -> None:
        self.wait()
        self.last.close()
        self.best.close()


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


def restore_for_resume(ckpt: RunCheckpoints, abstract_state, step: int,
                       workdir: pathlib.Path):
    """The `last` checkpoint at `step`, or a clear error if it does not fit this program (a
    workdir from another version of gedl-jax or another method, or a damaged checkpoint).
    Nothing is deleted."""
    try:
        return ckpt.restore_last(abstract_state, step)
    except (ValueError, KeyError, TypeError, FileNotFoundError, OSError) as e:
        raise ConfigMismatchError(
            f"cannot resume from {workdir}/checkpoints/last/{step}: it does not match the "
            f"train state of this version of gedl-jax, or it is damaged ({type(e).__name__}: "
            f"{str(e)[:300]}). The workdir was left as it is; use a new --workdir, or the "
            f"version that wrote it.") from None


def abstract_like(state, sharding=None):
    """The ShapeDtypeStruct tree Orbax restores into (on `sharding` if given)."""
    def to_abstract(x):
        return jax.ShapeDtypeStruct(x.shape, x.dtype,
                                    sharding=sharding if sharding is not None else x.sharding)
    return jax.tree.map(to_abstract, state)
