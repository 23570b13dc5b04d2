"""checkpointing.RunCheckpoints directly: the two managers, what they keep, the fallbacks, the
legacy layout, and the error a foreign checkpoint gives (the trainer's tests reach these paths
only through whole runs)."""

from __future__ import annotations

import concurrent.futures
import errno

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from gedl_jax.run import checkpointing
from gedl_jax.run.rundir import ConfigMismatchError
from gedl_jax.run.steps import TrainState


def _state(value: float, with_batch_stats: bool = True) -> TrainState:
    params = {"w": jnp.full((3, 2), value, jnp.float32), "b": jnp.full((2,), -value)}
    model_state = {"batch_stats": {"mean": jnp.full((2,), 2 * value)}} if with_batch_stats else {}
    return TrainState(step=jnp.asarray(int(value), jnp.int32), params=params,
                      model_state=model_state, opt_state=optax.adam(1e-3).init(params),
                      method_state={"tau": jnp.asarray(value / 10, jnp.float32)})


def _assert_state_equal(got: TrainState, want: TrainState) -> None:
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_last_keeps_two_newest_and_restores_any_of_them(tmp_path):
    ckpt = checkpointing.RunCheckpoints(tmp_path)
    for step in (1, 2, 3):
        ckpt.save_last(step, _state(step), {"epoch": step})
    ckpt.wait()
    assert ckpt.last_steps() == {2, 3} and ckpt.latest_step() == 3
    abstract = checkpointing.abstract_like(_state(0))
    state, meta = ckpt.restore_last(abstract)
    _assert_state_equal(state, _state(3))
    assert meta == {"epoch": 3}
    state, meta = ckpt.restore_last(abstract, step=2)
    _assert_state_equal(state, _state(2))
    ckpt.close()


def test_saving_a_step_twice_keeps_the_first(tmp_path):
    ckpt = checkpointing.RunCheckpoints(tmp_path)
    ckpt.save_last(5, _state(5), {"v": 1})
    ckpt.wait()
    ckpt.save_last(5, _state(7), {"v": 2})   # e.g. preemption right after an epoch-end save
    ckpt.wait()
    state, meta = ckpt.restore_last(checkpointing.abstract_like(_state(0)))
    _assert_state_equal(state, _state(5))
    assert meta == {"v": 1}
    ckpt.close()


def test_best_keeps_one_and_falls_back_to_last(tmp_path):
    ckpt = checkpointing.RunCheckpoints(tmp_path)
    abstract = checkpointing.abstract_like(_state(0))
    ckpt.save_last(4, _state(4), {"epoch": 4})
    ckpt.wait()
    state, _ = ckpt.restore_best(abstract)   # no validation yet: the last state
    _assert_state_equal(state, _state(4))
    ckpt.save_best(2, _state(2), {"val": 0.5})
    ckpt.save_best(3, _state(3), {"val": 0.7})
    ckpt.wait()
    assert ckpt.best.all_steps() == [3]
    state, meta = ckpt.restore_best(abstract)
    _assert_state_equal(state, _state(3))
    assert meta == {"val": 0.7}
    ckpt.close()
    # A new process (new managers) sees the same checkpoints.
    again = checkpointing.RunCheckpoints(tmp_path)
    assert again.latest_step() == 4 and again.best.latest_step() == 3
    again.close()


def test_empty_workdir_has_no_checkpoint_to_restore(tmp_path):
    ckpt = checkpointing.RunCheckpoints(tmp_path)
    assert ckpt.latest_step() is None and ckpt.last_steps() == set()
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        ckpt.restore_last(checkpointing.abstract_like(_state(0)))
    ckpt.close()


def test_saves_in_a_saver_thread_keep_their_order_and_a_failure_stops_the_next(tmp_path,
                                                                              monkeypatch):
    saver = concurrent.futures.ThreadPoolExecutor(1)
    ckpt = checkpointing.RunCheckpoints(tmp_path, saver)
    for step in (1, 2, 3):
        ckpt.save_last(step, _state(step), {"epoch": step})
    ckpt.save_best(2, _state(2), {"epoch": 2})
    ckpt.wait()   # every queued save done, in order: `last` kept its two newest
    assert ckpt.last_steps() == {2, 3} and ckpt.best.latest_step() == 2
    _assert_state_equal(ckpt.restore_last(checkpointing.abstract_like(_state(0)))[0], _state(3))

    def full_disk(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpointing, "_save_now", full_disk)
    ckpt.save_last(4, _state(4), {"epoch": 4})   # queued; fails in the thread
    saver.submit(lambda: None).result()           # ... by now
    with pytest.raises(OSError, match="No space left"):
        ckpt.save_last(5, _state(5), {"epoch": 5})   # the next save raises it
    ckpt.save_last(6, _state(6), {"epoch": 6})
    with pytest.raises(OSError, match="No space left"):
        ckpt.wait()                               # and so does waiting for them
    ckpt.close()
    saver.shutdown()


@pytest.mark.parametrize("with_batch_stats", [True, False])
def test_legacy_layout_restores_into_todays_train_state(tmp_path, with_batch_stats):
    """A checkpoint with the pre-method-interface fields (batch_stats, tau_state) restores into
    model_state / method_state."""
    new = _state(6, with_batch_stats)
    legacy = {"step": new.step, "params": new.params,
              "batch_stats": new.model_state.get("batch_stats", {}),
              "opt_state": new.opt_state, "tau_state": new.method_state}
    ckpt = checkpointing.RunCheckpoints(tmp_path)
    ckpt._save(ckpt.last, 6, legacy, {"epoch": 1})
    ckpt.wait()
    state, meta = ckpt.restore_last(checkpointing.abstract_like(_state(0, with_batch_stats)))
    assert isinstance(state, TrainState)
    _assert_state_equal(state, new)
    assert meta == {"epoch": 1}
    ckpt.close()


def test_a_foreign_checkpoint_is_a_clear_error_and_stays_on_disk(tmp_path):
    ckpt = checkpointing.RunCheckpoints(tmp_path)
    ckpt.save_last(1, _state(1), {})
    ckpt.wait()
    other = _state(0).replace(params={"w": jnp.zeros((5, 5)), "b": jnp.zeros((5,))},
                              opt_state=optax.adam(1e-3).init(
                                  {"w": jnp.zeros((5, 5)), "b": jnp.zeros((5,))}))
    with pytest.raises(ConfigMismatchError, match="(?s)cannot resume .* left as it is"):
        checkpointing.restore_for_resume(ckpt, checkpointing.abstract_like(other), 1, tmp_path)
    assert ckpt.last_steps() == {1}
    ckpt.close()
