"""Interrupted runs. SIGTERM/SIGINT to a real training process save a checkpoint at the next step
boundary and exit with `EXIT_PREEMPTED` within seconds; SIGKILL at random points leaves the last
complete checkpoint; a save cut off half-way is ignored. Each time the same command resumes to
the parameters of an uninterrupted run, bit for bit; so does bin/reproduce.py's study, preempted
mid-run. Generated data (tests/training_fixtures.py).
"""

import pathlib
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from training_fixtures import (
    REPO,
    TINY_FIELDS,
    assert_same_tree,
    checkpoint_steps,
    cli_args,
    run_to_end,
    saved_state,
    subprocess_env,
    write_tiny_mnist,
)

from gedl_jax.run import preemption

# Enough steps that the signal lands mid-run: 8 steps/epoch x 4 epochs.
FIELDS = {"num_epochs": 4, "log_every_steps": 1}
TOTAL = 32


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """(data_dir, env, workdir of an uninterrupted run), shared by the tests of this module."""
    root = tmp_path_factory.mktemp("preemption")
    data_dir = write_tiny_mnist(root / "data")
    env = subprocess_env(root / "cache")
    run_to_end(cli_args(root / "reference", data_dir, **FIELDS), env)
    return data_dir, env, root / "reference"


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


def _preempt(workdir, data_dir, env, signum) -> tuple[list[str], str]:
    """Start the CLI, send `signum` in epoch 2; check the exit code, the time it took and the
    checkpoint. Returns the command and its output."""
    args = cli_args(workdir, data_dir, **FIELDS)
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        # The first progress line of epoch 2: the loop is running, mid-epoch.
        _wait_for_line(proc, f"epoch 2/4 step 10/{TOTAL}", timeout=180)
        sent = time.time()
        proc.send_signal(signum)
        # said at once, before the step it waits for ends (it can take seconds under load)
        told = _wait_for_line(proc, preemption.STOPPING["training"], timeout=15)
        announced = time.time() - sent
        rest, _ = proc.communicate(timeout=60)
        out = "".join(told) + rest
        elapsed = time.time() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == preemption.EXIT_PREEMPTED, out
    assert elapsed < 15, f"took {elapsed:.1f} s to stop"
    assert announced < 5 and out.count(preemption.STOPPING["training"]) == 1, out
    assert f"preempted ({signal.Signals(signum).name})" in rest, out
    steps = checkpoint_steps(workdir)
    assert steps and 10 <= steps[-1] < TOTAL, (steps, out)
    _, meta = saved_state(workdir)
    assert meta["epoch"] == steps[-1] // 8
    return args, out


def _catches_sigterm(pid: int) -> bool:
    """Whether process `pid` has a handler for SIGTERM (Linux: /proc/<pid>/status, SigCgt)."""
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    return False


@pytest.mark.skipif(not pathlib.Path("/proc/self/status").exists(),
                    reason="reads a process's signal handlers from /proc (Linux)")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_the_command_starts_exits_75_and_says_so(tmp_path, signum):
    """Sent as soon as the command handles SIGTERM, while it still imports (seconds): not
    Python's defaults (status 143 and no word, or a KeyboardInterrupt traceback)."""
    proc = subprocess.Popen(cli_args(tmp_path / "w", tmp_path / "data"), cwd=REPO,
                            env=subprocess_env(tmp_path / "c"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 60
        while not _catches_sigterm(proc.pid):
            assert proc.poll() is None and time.time() < deadline, proc.communicate()[0]
            time.sleep(0.002)
        proc.send_signal(signum)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == preemption.EXIT_PREEMPTED, out
    assert out == (f"preempted ({signal.Signals(signum).name}) while the command was starting, "
                   f"before any training: nothing to save; rerun the same command\n")
    assert not (tmp_path / "w").exists()


def test_sigint_checkpoints_and_exits_75(tmp_path, uninterrupted):
    data_dir, env, _ = uninterrupted
    _preempt(tmp_path / "w", data_dir, env, signal.SIGINT)


def test_sigterm_checkpoints_at_next_step_and_same_command_resumes(tmp_path, uninterrupted):
    data_dir, env, reference = uninterrupted
    workdir = tmp_path / "preempted"
    args, _ = _preempt(workdir, data_dir, env, signal.SIGTERM)
    steps = checkpoint_steps(workdir)
    rerun = run_to_end(args, env)
    assert f"resumed from {workdir}/checkpoints/last at step {steps[-1]}" in rerun.stdout
    full, full_meta = saved_state(reference)
    resumed, resumed_meta = saved_state(workdir)
    assert int(full["step"]) == int(resumed["step"]) == TOTAL
    assert_same_tree(full, resumed)
    assert resumed_meta["best_val_accuracy"] == full_meta["best_val_accuracy"]


def test_preemption_request_in_process_stops_with_a_checkpoint(tmp_path, fast_compile):
    """Library callers: `preemption.request()` (what the signal handler does) ends
    `train_and_evaluate` with `Preempted` after saving the current step."""
    from gedl_jax import config as config_lib
    from gedl_jax import configs, train

    data_dir = write_tiny_mnist(tmp_path / "data")
    c = configs.build_config("mnist", "gedl")
    fields = {**TINY_FIELDS, "data_dir": str(data_dir), "cache_dir": str(tmp_path / "c")}
    for k, v in fields.items():
        config_lib.set_fields(c, **{k: v})
    preemption.request()
    try:
        with pytest.raises(preemption.Preempted, match="step 1 in"):
            train.train_and_evaluate(c, tmp_path / "w")
    finally:
        preemption.reset()
    assert checkpoint_steps(tmp_path / "w") == [1]


def test_sigkill_at_random_points_then_rerun_ends_like_an_uninterrupted_run(tmp_path,
                                                                           uninterrupted):
    """SIGKILL (no handler, no checkpoint on the way out; possibly in the middle of an Orbax
    save) three times at seeded random points, rerunning the same command after each; the
    final parameters are bit-identical to the uninterrupted run's."""
    data_dir, env, reference = uninterrupted
    workdir = tmp_path / "killed"
    # Mid-epoch checkpoints every 3 steps; checkpoint_every_steps does not change the
    # parameters (it is not part of the training config), so the reference stays comparable.
    args = cli_args(workdir, data_dir, **FIELDS, checkpoint_every_steps=3)
    rng = np.random.default_rng(14)   # kills after 2, 6 and 5 lines: before the first save,
    kills = []                           # while one may be written, after a resume
    for attempt in range(3):
        proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        try:
            # Kill after a random number (1..7) of progress lines, i.e. steps of this attempt.
            # On a GPU those steps take milliseconds, less than an asynchronous save takes to
            # reach the disk, so every kill can land before the first checkpoint (an H200's
            # three did): the last attempt, if none is on disk yet, also waits for one, so
            # that the rerun resumes.
            lines: list[str] = []
            wanted, seen, deadline = int(rng.integers(1, 8)), 0, time.time() + 180
            wait_for_checkpoint = attempt == 2 and not checkpoint_steps(workdir)
            while (seen < wanted or (wait_for_checkpoint and not checkpoint_steps(workdir))) \
                    and time.time() < deadline:
                line = proc.stdout.readline()
                if not line:
                    break
                lines.append(line)
                seen += " step " in line and "/32 loss" in line
            assert proc.poll() is None, "".join(lines)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        kills.append((wanted, checkpoint_steps(workdir)))
    assert any(steps for _, steps in kills), kills  # at least one attempt left a checkpoint
    rerun = run_to_end(args, env)
    assert "resumed from" in rerun.stdout
    full, full_meta = saved_state(reference)
    final, final_meta = saved_state(workdir)
    assert int(final["step"]) == TOTAL
    assert_same_tree(full, final)
    assert final_meta["best_val_accuracy"] == full_meta["best_val_accuracy"]


def test_checkpoint_cut_off_while_written_is_never_used(tmp_path, fast_compile):
    """A save interrupted before Orbax's final rename leaves `<step>.orbax-checkpoint-tmp-*`:
    resuming ignores it and continues from the newest complete checkpoint, ending bit-identical
    to an uninterrupted run."""
    from gedl_jax import config as config_lib
    from gedl_jax import configs, train

    data_dir = write_tiny_mnist(tmp_path / "data")
    c = configs.build_config("mnist", "gedl")
    for k, v in {**TINY_FIELDS, "data_dir": str(data_dir), "cache_dir": str(tmp_path / "c"),
                 "checkpoint_every_steps": 3}.items():
        config_lib.set_fields(c, **{k: v})
    full = train.train_and_evaluate(c, tmp_path / "full")
    workdir = tmp_path / "cut"
    train.train_and_evaluate(c, workdir, stop_after_steps=5)
    last = workdir / "checkpoints" / "last"
    assert checkpoint_steps(workdir) == [3]
    # A half-written step 6: a copy of step 3 with its array data truncated, under the
    # temporary name Orbax writes to before renaming.
    partial = last / "6.orbax-checkpoint-tmp-1763870000000000"
    shutil.copytree(last / "3", partial)
    for f in sorted(p for p in partial.rglob("*") if p.is_file() and p.stat().st_size > 64):
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    resumed = train.train_and_evaluate(c, workdir)
    assert resumed["steps"] == full["steps"] == 16
    assert_same_tree(jax.device_get(full["state"]), jax.device_get(resumed["state"]))


def test_a_reproduction_preempted_mid_run_checkpoints_and_the_same_command_finishes(
        tmp_path, uninterrupted):
    """bin/reproduce.py, the long-job driver: SIGTERM in a run's epoch 2 checkpoints it and
    exits 75 (without it a preempted study lost everything since the last epoch's checkpoint);
    the same command resumes the run to the uninterrupted run's parameters and writes the
    table."""
    data_dir, env, reference = uninterrupted
    out = tmp_path / "study"
    fields = {**TINY_FIELDS, **FIELDS, "evaluate_at_end": True}
    args = [sys.executable, str(REPO / "bin" / "reproduce.py"), "--study=main",
            "--variants=gedl", "--seeds=0", "--setting=short", f"--data_dir={data_dir}",
            f"--out={out}", *(f"--override={k}={v}" for k, v in fields.items())]
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for_line(proc, f"epoch 2/4 step 10/{TOTAL}", timeout=180)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == preemption.EXIT_PREEMPTED, output
    assert "preempted (SIGTERM)" in output and "rerun the same command" in output, output
    workdir = out / "runs" / "gedl" / "seed_0"
    steps = checkpoint_steps(workdir)
    assert steps and 10 <= steps[-1] < TOTAL, (steps, output)
    assert not (workdir / "eval_results.json").exists() and not (out / "results.md").exists()

    rerun = run_to_end(args, env)
    assert f"resumed from {workdir}/checkpoints/last at step {steps[-1]}" in rerun.stdout
    assert (out / "results.md").is_file()
    full, _ = saved_state(reference)
    resumed, _ = saved_state(workdir)
    assert int(resumed["step"]) == TOTAL
    assert_same_tree(full, resumed)


@pytest.mark.parametrize("service", [False, True])
def test_with_several_processes_sigterm_leaves_the_start_up_handler(monkeypatch, service):
    """Several processes: SIGINT is forwarded to JAX's preemption service. SIGTERM is the
    service's (its own handler replaced the start-up one when it started), or, with the
    service off, Python's default again: the start-up handler's line would misname a stop
    during training."""
    from jax._src import distributed

    from gedl_jax.run import startup_signals

    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    monkeypatch.setattr(preemption, "_multi_process", lambda: True)
    monkeypatch.setattr(distributed.global_state, "preemption_sync_manager",
                        object() if service else None)
    try:
        startup_signals.install()
        preemption.install(prompt=True)
        assert signal.getsignal(signal.SIGINT) is preemption._forward_to_jax
        assert signal.getsignal(signal.SIGTERM) is \
            (startup_signals._stop if service else signal.SIG_DFL)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
