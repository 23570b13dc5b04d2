"""Several train steps per compiled call (`config.steps_per_dispatch`, `steps.multi_step`).

On an accelerator the training loop runs up to `steps_per_dispatch` steps per call in a
device-side loop; on a CPU one step per call (`training.steps_per_call`: XLA:CPU compiles a
convolution gradient inside a loop with its generic emitter, slow and summed in another order).
The tests force the device loop on the CPU (with an MLP; the ConvNet where the loop runs) and
check that it is a pure speed-up: however the steps are cut into calls, the same parameters,
optimiser and method state, metrics log, validations and best checkpoint as one call per step,
bit for bit, for one seed and for vmapped seeds, and a run stopped between calls resumes to the
same state. The boundaries of a call (`training._next_event`) are checked on their own.
"""

import json
import types

import jax
import numpy as np
import pytest
from test_train import assert_same_leaves, data_dir, leaves, tiny_config  # noqa: F401

from gedl_jax import train
from gedl_jax.run import progress, training


@pytest.fixture(autouse=True)
def _fast(fast_compile, monkeypatch):
    """Compiles in seconds (tests/compile_mode.py); the device loop on any platform, with the
    epoch ends an accelerator's loop has (`training.defers_epoch_ends`)."""
    monkeypatch.setattr(training, "steps_per_call", lambda config: int(config.steps_per_dispatch))
    monkeypatch.setattr(training, "DEFER_EPOCH_ENDS", True)


def _train_records(workdir):
    return [{k: v for k, v in json.loads(line).items() if k != "time"}
            for line in (workdir / "metrics.jsonl").read_text().splitlines()]


# 64 examples in batches of 8: 8 steps per epoch, 2 epochs. Calls end at log lines (every 3
# steps), mid-epoch checkpoints (every 5) and epoch ends (8): with up to 8 steps per call they
# are 3, 2, 1, 2 | 1, 1, 2, 3, 1 steps long; with up to 2, 2, 1, 2, 1, 2 | ...
SMALL = {"train_examples": 64, "batch_size": 8, "log_every_steps": 3,
         "checkpoint_every_steps": 5}
STEPS = 16
# The MLP on every platform; the ConvNet where the trainer runs the device loop (a GPU: its
# convolution gradients inside the loop are the library's; on a CPU they take seconds a step).
MODELS = ["mlp", pytest.param("convnet", marks=pytest.mark.skipif(
    jax.default_backend() == "cpu",
    reason="on a CPU the trainer runs one step per call (training.steps_per_call); XLA:CPU "
           "compiles a convolution gradient inside the device loop with its generic emitter, "
           "seconds per step"))]


def _config(data_dir, steps_per_dispatch, model, **fields):
    # float32 products: the one-step program is compared with the loop to float32 rounding
    # where they are not bit-identical (below), not to TF32's
    return tiny_config(data_dir, **{**SMALL, **fields}, model=model,
                       steps_per_dispatch=steps_per_dispatch, matmul_precision="highest")


def _same_run(a, b, workdir_a, workdir_b, bitwise=True):
    """Parameters, optimiser and method state, validations and the metrics log of two runs:
    bit for bit, or (`bitwise=False`, two different programs) to float32 rounding."""
    if bitwise:
        assert_same_leaves(a["state"], b["state"])
        assert (a["best_val_accuracy"], a["best_step"]) == (b["best_val_accuracy"], b["best_step"])
        assert _train_records(workdir_a) == _train_records(workdir_b)
        return
    for x, y in zip(leaves(a["state"]), leaves(b["state"]), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-5)
    ra, rb = _train_records(workdir_a), _train_records(workdir_b)
    assert [(r["step"], r["split"]) for r in ra] == [(r["step"], r["split"]) for r in rb]
    for x, y in zip(ra, rb):
        for key in x.keys() - {"step", "split"}:
            np.testing.assert_allclose(x[key], y[key], rtol=1e-3, atol=1e-4, err_msg=key)


@pytest.mark.parametrize("model", MODELS)
def test_how_steps_are_cut_into_calls_does_not_change_the_run(data_dir, tmp_path, model):
    runs = {n: train.train_and_evaluate(_config(data_dir, n, model), tmp_path / str(n))
            for n in (8, 2, 1)}   # 1: the step program alone, not inside a device loop
    records = _train_records(tmp_path / "8")
    # one train record per progress line and checkpoint, at the steps they name
    assert [r["step"] for r in records if r["split"] == "train"] == \
        [3, 5, 6, 8, 9, 10, 12, 15, 16]
    for n in (2, 1):
        assert runs[n]["steps"] == runs[8]["steps"] == STEPS
        # 8 and 2 run one program; 1 runs the step alone, which XLA:CPU compiles to the same
        # arithmetic for the MLP (measured: bit for bit) and a GPU may fuse otherwise
        _same_run(runs[8], runs[n], tmp_path / "8", tmp_path / str(n),
                  bitwise=n != 1 or jax.default_backend() == "cpu")


@pytest.mark.parametrize("model", MODELS)
def test_vmapped_seeds_cut_into_calls_differently_give_the_same_runs(data_dir, tmp_path,
                                                                     model):
    runs = [train.run(_config(data_dir, n, model, seeds="3,4", vmap_seeds=True, num_epochs=1),
                      tmp_path / str(n)) for n in (8, 1)]
    for seed, x, y in zip((3, 4), *runs, strict=True):
        _same_run(x, y, tmp_path / "8" / f"seed_{seed}", tmp_path / "1" / f"seed_{seed}",
                  bitwise=jax.default_backend() == "cpu")


@pytest.mark.parametrize("model", MODELS)
def test_a_run_stopped_between_calls_resumes_to_the_same_state(data_dir, tmp_path, model):
    c = _config(data_dir, 8, model)
    full = train.train_and_evaluate(c, tmp_path / "full")
    partial = train.train_and_evaluate(c, tmp_path / "resumed", stop_after_steps=7)
    assert partial["steps"] == 7   # a call ends at the requested stop, not past it
    resumed = train.train_and_evaluate(c, tmp_path / "resumed")
    assert resumed["steps"] == full["steps"]
    assert_same_leaves(full["state"], resumed["state"])


def test_the_first_call_is_one_step_then_calls_end_at_the_events(data_dir, tmp_path,
                                                                 monkeypatch):
    """The first call carries the compile and the device's warm-up, which the progress lines
    time apart (`progress.MetricsBuffer.add`); a resumed process's first call too."""
    calls = []
    add = progress.MetricsBuffer.add

    def spy(self, step, metrics, num_steps=None):
        calls.append((step, num_steps))
        return add(self, step, metrics, num_steps)

    monkeypatch.setattr(progress.MetricsBuffer, "add", spy)
    c = _config(data_dir, 8, "mlp")
    train.train_and_evaluate(c, tmp_path / "run", stop_after_steps=7)
    assert calls == [(1, 1), (3, 2), (5, 2), (6, 1), (7, 1)]
    calls.clear()
    train.train_and_evaluate(c, tmp_path / "run")   # resumes at step 5, the newest checkpoint
    assert calls == [(6, 1), (8, 2), (9, 1), (10, 1), (12, 2), (15, 3), (16, 1)]

def test_on_a_cpu_the_loop_runs_one_step_per_call(monkeypatch):
    monkeypatch.undo()
    config = types.SimpleNamespace(steps_per_dispatch=100)
    expected = 1 if jax.default_backend() == "cpu" else 100
    assert training.steps_per_call(config) == expected


def _loop(steps_per_epoch=8, total=16, log=3, ckpt=5, max_steps=8):
    config = types.SimpleNamespace(log_every_steps=log, checkpoint_every_steps=ckpt)
    program = types.SimpleNamespace(max_steps=max_steps)
    return types.SimpleNamespace(config=config, steps_per_epoch=steps_per_epoch,
                                 total_steps=total, program=program)


def _calls(loop, start=0, stop_after=None):
    ends, step = [], start
    while step < loop.total_steps and (stop_after is None or step < stop_after):
        step = training._next_event(loop, step, stop_after)
        ends.append(step)
    return ends


def test_calls_end_at_every_event_and_never_cross_an_epoch():
    assert _calls(_loop()) == [3, 5, 6, 8, 9, 10, 12, 15, 16]
    assert _calls(_loop(ckpt=0, log=100, max_steps=100)) == [8, 16]
    assert _calls(_loop(ckpt=0, log=100, max_steps=3)) == [3, 6, 8, 11, 14, 16]
    assert _calls(_loop(), stop_after=7) == [3, 5, 6, 7]
    assert _calls(_loop(), start=7) == [8, 9, 10, 12, 15, 16]   # a resume at step 7
    steps_per_epoch = 375   # MNIST at batch 128, the default 100 steps per call and log line
    ends = _calls(_loop(steps_per_epoch, 2 * steps_per_epoch, log=100, ckpt=0, max_steps=100))
    assert ends[:5] == [100, 200, 300, 375, 400]
    assert all(b - a <= 100 for a, b in zip([0, *ends], ends))
    assert all((e - 1) // steps_per_epoch == (s // steps_per_epoch)
               for s, e in zip([0, *ends], ends))


def test_multi_step_rows_hold_each_steps_metrics():
    """`steps.multi_step` on a toy step: row i is step i's metrics, rows past n are zeros, and
    the state equals n applications of the step."""
    import jax.numpy as jnp

    from gedl_jax.run import steps

    def toy_step(state, scale):
        new = state * scale + 1.0
        return new, {"value": new, "pair": jnp.stack([new, -new])}

    run = steps.multi_step(toy_step, 5)
    state, rows = run(jnp.float32(1.0), np.int32(3), jnp.float32(2.0))
    assert float(state) == 15.0          # 1 -> 3 -> 7 -> 15
    np.testing.assert_array_equal(rows["value"], [3.0, 7.0, 15.0, 0.0, 0.0])
    assert rows["pair"].shape == (5, 2)
