"""gedl_jax/run/step_benchmark.py: what bin/benchmark.py times is the trainer's own program
(`run/programs.py`), and the ahead-of-time compiled step (`SeedProgram.compile`) computes what
the trainer's `program.steps` computes, bit for bit. bin/benchmark.py sets each seed count's
step beside one seed's."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest


from gedl_jax.run import step_benchmark

# The MLP on CIFAR-shaped images: the cheapest network to compile.
MODEL, BATCH, STEPS = "mlp", 4, 2


def _leaves(state):
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(state))]


def _copy(state):
    """A copy in new buffers, same placement: the step donates the state it is given."""
    return jax.tree.map(lambda x: jax.device_put(np.asarray(x), x.sharding), state)


@pytest.mark.parametrize("seeds,device_loop", [(1, False), (1, True), (2, True)])
def test_the_compiled_step_is_the_trainers_step(seeds, device_loop):
    program = step_benchmark.synthetic_program(MODEL, BATCH, "float32", 1, STEPS, seeds,
                                               device_loop=device_loop)
    order = program.epoch_order(0)
    compiled = program.compile(order)
    n = program.max_steps
    assert n == (STEPS if device_loop else 1)
    by_trainer, _ = program.steps(_copy(program.state), order, n)
    by_benchmark, metrics = compiled(_copy(program.state), n)
    assert "HloModule" in compiled.executable.as_text()
    for a, b in zip(_leaves(by_trainer), _leaves(by_benchmark), strict=True):
        np.testing.assert_array_equal(a, b)
    steps_done = np.asarray(jax.device_get(by_benchmark.step))
    assert np.all(steps_done == n) and steps_done.size == seeds
    assert np.all(np.isfinite(np.asarray(jax.device_get(metrics["loss"]))))


def test_compiled_train_step_runs_any_number_of_steps():
    run, compile_s = step_benchmark.compiled_train_step(MODEL, BATCH, "float32", 1, STEPS,
                                                        device_loop=True)
    assert compile_s > 0 and "HloModule" in run.compiled.as_text()
    run(1)
    run(STEPS + 1)   # more than one call's worth: two calls of the device loop


def test_loop_rate_times_whole_epochs_from_the_first_epoch_end():
    # 10 steps an epoch, batch 4: epoch 1 compiles (its end at t = 5.0); epochs 2 and 3 take
    # 1.0 s of steps and 0.5 s of epoch end each
    records = [{"step": 5, "split": "train", "time": 4.0},
               {"step": 10, "split": "train", "time": 4.5},
               {"step": 10, "split": "validation", "time": 5.0},
               {"step": 15, "split": "train", "time": 5.5},
               {"step": 20, "split": "train", "time": 6.0},
               {"step": 20, "split": "validation", "time": 6.5},
               {"step": 25, "split": "train", "time": 7.0},
               {"step": 30, "split": "train", "time": 7.5},
               {"step": 30, "split": "validation", "time": 8.0}]
    rate = step_benchmark.loop_rate(records, batch_size=4)
    assert rate == {"loop_images_per_s": 20 * 4 / 3.0, "loop_window": "epoch ends at steps 10-30",
                    "loop_window_steps": 20}
    # one epoch: its train records, the first (which compiles) as the start
    one = step_benchmark.loop_rate(records[:3], batch_size=4)
    assert one == {"loop_images_per_s": 5 * 4 / 0.5, "loop_window": "train records at steps 5-10",
                   "loop_window_steps": 5}


def test_benchmark_sets_several_seeds_step_beside_one_seeds(tmp_path, monkeypatch, capsys):
    """`--seeds=1,5`: a line and a JSON field per setting measured with both, the 5-seed step's
    time over the one-seed step's (timings faked: the wiring, not a measurement)."""
    from bin import benchmark as bench

    times = {("float32", 1): 10.0, ("float32", 5): 18.0, ("bfloat16", 1): 4.0,
             ("bfloat16", 5): 9.0}

    def fake_bench_one(model, batch, dtype, devices, steps, repeats, seeds, device_loop,
                       precision):
        step_ms = times[dtype, seeds]
        return {"model": model, "batch": batch, "dtype": dtype, "devices": devices,
                "seeds": seeds, "precision": precision, "arithmetic": dtype,
                "device_loop": device_loop, "images_per_s": 1e3 * batch * seeds / step_ms,
                "step_ms": step_ms, "step_ms_spread": [step_ms, step_ms], "compile_s": 1.0,
                "peak_memory_bytes": None, "train_flops_per_image": 1e9,
                "achieved_flops": 1e12, "fraction_of_peak": None}

    monkeypatch.setattr(bench, "bench_one", fake_bench_one)
    out = tmp_path / "bench.json"
    assert bench.main(["--models=vgg16", "--batches=8", "--dtypes=float32,bfloat16",
                       "--devices=1", "--seeds=1,5", "--deterministic=false",
                       f"--out={out}"]) == 0
    printed = capsys.readouterr().out
    for line in ("vgg16 b8 float32 float32 x1: 5 seeds: 18.00 ms/step = 1.80 x one seed's step",
                 "vgg16 b8 bfloat16 bfloat16 x1: 5 seeds: 9.00 ms/step = 2.25 x one seed's "
                 "step"):
        assert line in printed
        assert line in out.with_suffix(".md").read_text()
    rows = json.loads(out.read_text())["results"]
    assert [r.get("step_over_one_seed") for r in rows] == [None, 1.8, None, 2.25]
    # a setting without its one-seed row gets none
    alone = bench.with_seed_ratios([fake_bench_one("vgg16", 8, "float32", 1, 1, 1, 5, False,
                                                   "default")])
    assert "step_over_one_seed" not in alone[0] and bench.seed_ratio_lines(alone) == []
