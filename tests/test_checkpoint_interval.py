"""Epoch-end checkpoints at most every `config.checkpoint_interval_seconds`
(`gedl_jax.run.training._Loop.checkpoint_due`): the run is the same as one that saves at every
epoch end, the saves it skips are skipped, a best state kept across epoch ends is saved as it
was (not the buffers the next call donated), and a run stopped between saves resumes exactly.

The loop's clock is replaced by one that reads the number of steps dispatched (one second a
step), so which epoch ends save does not depend on this machine's speed. Generated data
(tests/conftest.py)."""

import json
import pathlib

import jax
import numpy as np
import pytest
from test_train import STEPS_PER_EPOCH, _fast, data_dir, tiny_config  # noqa: F401
from training_fixtures import checkpoint_steps, saved_state

from gedl_jax import config as config_lib
from gedl_jax import configs, train
from gedl_jax.run import checkpointing, training
from gedl_jax.run.progress import MetricsBuffer

REPO = pathlib.Path(__file__).resolve().parents[1]
# test_train's tiny run, for 4 epochs with validations at the 2nd and 4th.
FIELDS = {"num_epochs": 4, "eval_every_epochs": 2}
# One second a step: epoch ends at 8, 16, 24 and 32 s; validations at the 2nd and 4th. With
# 22 s, the epoch ends at 8 and 16 are not due, 24 is, and 32 ends the run: the best of the
# validation at 16 is kept across the epoch end at 24 and saved with `last` at 24. A deferred
# epoch end reads the clock after the next call: one step later on a CPU, at the next log line
# (4 steps) off it, so at 16 it reads 17 or 20, and at 24, 25 or 28: the same decisions.
INTERVAL = 22.0


@pytest.fixture
def step_clock(monkeypatch):
    """The loop's clock reads the last step dispatched, in seconds (set it to 0 before a run
    that starts at step 0)."""
    now = [0.0]
    add = MetricsBuffer.add

    def on_add(self, step, *args, **kwargs):
        now[0] = float(step)
        return add(self, step, *args, **kwargs)

    monkeypatch.setattr(MetricsBuffer, "add", on_add)
    monkeypatch.setattr(training, "_clock", lambda: now[0])
    return now


@pytest.fixture
def saves(monkeypatch):
    """Every save as it happens (in whichever thread): (kind, step, the state's leaves on the
    host, the meta)."""
    seen = []
    save_now = checkpointing._save_now

    def on_save(manager, step, state, meta):
        leaves = [np.asarray(x) for x in jax.tree.leaves(jax.device_get(state))]
        seen.append((pathlib.Path(manager.directory).name, step, leaves, dict(meta)))
        return save_now(manager, step, state, meta)

    monkeypatch.setattr(checkpointing, "_save_now", on_save)
    return seen


def _records(workdir: pathlib.Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k != "time"}
            for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert len(a) == len(b) > 0
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("deferred", [False, True])
def test_an_interval_skips_epoch_end_saves_and_changes_nothing_else(
        data_dir, tmp_path, monkeypatch, step_clock, saves, capsys, deferred):
    monkeypatch.setattr(training, "DEFER_EPOCH_ENDS", deferred)
    every = train.train_and_evaluate(
        tiny_config(data_dir, **FIELDS, checkpoint_interval_seconds=0), tmp_path / "every")
    saved_every = list(saves)
    saves.clear()
    capsys.readouterr()
    step_clock[0] = 0.0
    spaced = train.train_and_evaluate(tiny_config(data_dir, **FIELDS,
                                                  checkpoint_interval_seconds=INTERVAL),
                                      tmp_path / "spaced")
    out = capsys.readouterr().out
    e = STEPS_PER_EPOCH

    # The same run: its state, its records, its best.
    _same([np.asarray(x) for x in jax.tree.leaves(every["state"])],
          [np.asarray(x) for x in jax.tree.leaves(spaced["state"])])
    assert _records(tmp_path / "every") == _records(tmp_path / "spaced")
    assert (every["best_val_accuracy"], every["best_step"]) == \
        (spaced["best_val_accuracy"], spaced["best_step"])

    # Its saves: `last` at every epoch end against at 24 and 32 only; the validation at 16
    # always improves (the first one), its state kept and saved just before `last` at 24.
    assert [(k, s) for k, s, *_ in saved_every if k == "last"] == \
        [("last", s) for s in (e, 2 * e, 3 * e, 4 * e)]
    kinds_steps = [(k, s) for k, s, *_ in saves]
    assert kinds_steps[:2] == [("best", 2 * e), ("last", 3 * e)]
    assert kinds_steps[2:] in ([("last", 4 * e)], [("best", 4 * e), ("last", 4 * e)])
    # The kept best is the state at 16 (the loop that waits copied it before step 17's call
    # donated it), as the run that saved it at once saved it, meta included.
    best_every = [(leaves, meta) for k, s, leaves, meta in saved_every
                  if (k, s) == ("best", 2 * e)]
    assert len(best_every) == 1
    _same(saves[0][2], best_every[0][0])
    assert saves[0][3] == best_every[0][1]
    # On disk, as the other run's: the best, and the newest `last`.
    assert checkpoint_steps(tmp_path / "spaced", "best") == \
        checkpoint_steps(tmp_path / "every", "best") == [spaced["best_step"]]
    _same(*(jax.tree.leaves(saved_state(tmp_path / w, "best")[0]) for w in ("every", "spaced")))
    assert checkpoint_steps(tmp_path / "spaced") == [3 * e, 4 * e]
    # Every `last` on disk names a best step whose state is on disk or was replaced by a newer
    # best: never a best that was not yet written.
    for step in checkpoint_steps(tmp_path / "spaced"):
        _, meta = saved_state(tmp_path / "spaced", "last", step)
        assert meta["best_step"] <= checkpoint_steps(tmp_path / "spaced", "best")[0]

    # The log says where the saves went; tools/gpu_report.py reads those lines.
    lines = [line for line in out.splitlines() if "checkpoints saving" in line]
    assert lines == [
        f"epoch 3: checkpoints saving in {(tmp_path / 'spaced').absolute()}/checkpoints: "
        f"last (step {3 * e}), best (step {2 * e})",
        f"epoch 4: checkpoints saving in {(tmp_path / 'spaced').absolute()}/checkpoints: "
        f"last (step {4 * e})" + (f", best (step {4 * e})" if len(kinds_steps) == 4 else "")]
    from tools import gpu_report as report

    # validated epoch ends 2 and 4: none saved at 2, `last` (and a best if 4 improved) at 4
    assert report.saves_per_epoch_end(out) == [0, len(kinds_steps) - 2]


def test_a_run_stopped_between_saves_resumes_to_the_same_end(data_dir, tmp_path, step_clock,
                                                            saves, capsys):
    c = tiny_config(data_dir, **FIELDS, checkpoint_interval_seconds=INTERVAL)
    full = train.train_and_evaluate(c, tmp_path / "full")
    e = STEPS_PER_EPOCH
    # Stopped ("killed") at step 30, after the saves at 24; then the same command again.
    step_clock[0] = 0.0
    partial = train.train_and_evaluate(c, tmp_path / "resumed", stop_after_steps=30)
    assert partial["steps"] == 30
    assert checkpoint_steps(tmp_path / "resumed") == [3 * e]
    assert checkpoint_steps(tmp_path / "resumed", "best") == [2 * e]
    stopped = len(_records(tmp_path / "resumed"))
    capsys.readouterr()
    resumed = train.train_and_evaluate(c, tmp_path / "resumed")
    assert f"resumed from {(tmp_path / 'resumed').absolute()}/checkpoints/last at step {3 * e}" \
        in capsys.readouterr().out
    _same([np.asarray(x) for x in jax.tree.leaves(full["state"])],
          [np.asarray(x) for x in jax.tree.leaves(resumed["state"])])
    assert (full["best_val_accuracy"], full["best_step"]) == \
        (resumed["best_val_accuracy"], resumed["best_step"])
    # the stopped run's records up to the checkpoint, then the resumed run's
    records = _records(tmp_path / "resumed")
    assert _records(tmp_path / "full") == \
        [r for r in records[:stopped] if r["step"] <= 3 * e] + records[stopped:]
    _same(*(jax.tree.leaves(saved_state(tmp_path / w, "best")[0]) for w in ("full", "resumed")))


def test_the_interval_must_not_be_negative():
    c = configs.build_config("mnist", "gedl")
    config_lib.set_fields(c, checkpoint_interval_seconds=-1.0)
    with pytest.raises(ValueError, match="checkpoint_interval_seconds=-1.0 must be >= 0"):
        config_lib.validate(c)
