"""Preemption: SIGTERM/SIGINT to a real training process save a checkpoint at the next step
boundary, exit with `EXIT_PREEMPTED` within seconds, and the same command resumes to the
parameters of an uninterrupted run. Generated data (tests/training_fixtures.py)."""

import signal
import subprocess
import time

import pytest
from training_fixtures import (REPO, assert_same_tree, checkpoint_steps, cli_args, run_to_end,
                               saved_state, subprocess_env, write_tiny_mnist)

from gedl_jax import preemption

# Enough steps that the signal lands mid-run: 8 steps/epoch x 6 epochs, a step per ~10 ms.
FIELDS = {"num_epochs": 6, "log_every_steps": 1}


def _wait_for_line(proc: subprocess.Popen, needle: str, timeout: float) -> list[str]:
    lines, deadline = [], time.time() + timeout
    while time.time() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if needle in line:
            return lines
    proc.kill()
    raise AssertionError(f"no {needle!r} within {timeout} s:\n{''.join(lines)}")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_checkpoints_at_next_step_and_same_command_resumes(tmp_path, signum):
    data_dir = write_tiny_mnist(tmp_path / "data")
    env = subprocess_env(tmp_path / "cache")
    reference = tmp_path / "reference"
    run_to_end(cli_args(reference, data_dir, **FIELDS), env)

    workdir = tmp_path / "preempted"
    args = cli_args(workdir, data_dir, **FIELDS)
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        # The first progress line of epoch 2: the loop is running, mid-epoch.
        _wait_for_line(proc, "epoch 2/6 step 10/", timeout=180)
        sent = time.time()
        proc.send_signal(signum)
        out, _ = proc.communicate(timeout=60)
        elapsed = time.time() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == preemption.EXIT_PREEMPTED, out
    assert elapsed < 15, f"took {elapsed:.1f} s to stop"
    assert f"preempted ({signal.Signals(signum).name})" in out, out
    steps = checkpoint_steps(workdir)
    assert steps and 10 <= steps[-1] < 48, (steps, out)
    _, meta = saved_state(workdir)
    assert meta["epoch"] == steps[-1] // 8

    rerun = run_to_end(args, env)
    assert f"resumed from {workdir}/checkpoints/last at step {steps[-1]}" in rerun.stdout
    full, full_meta = saved_state(reference)
    resumed, resumed_meta = saved_state(workdir)
    assert int(full["step"]) == int(resumed["step"]) == 48
    assert_same_tree(full, resumed)
    assert resumed_meta["best_val_accuracy"] == full_meta["best_val_accuracy"]


def test_preemption_request_in_process_stops_with_a_checkpoint(tmp_path):
    """Library callers: `preemption.request()` (what the signal handler does) ends
    `train_and_evaluate` with `Preempted` after saving the current step."""
    from gedl_jax import configuration, train

    data_dir = write_tiny_mnist(tmp_path / "data")
    c = configuration.build_config("mnist", "gedl")
    for k, v in {**_tiny(), "data_dir": str(data_dir), "cache_dir": str(tmp_path / "c")}.items():
        c[k] = v
    preemption.request()
    try:
        with pytest.raises(preemption.Preempted, match="step 1 in"):
            train.train_and_evaluate(c, tmp_path / "w")
    finally:
        preemption.reset()
    assert checkpoint_steps(tmp_path / "w") == [1]


def _tiny():
    from training_fixtures import TINY_FIELDS

    return dict(TINY_FIELDS)
