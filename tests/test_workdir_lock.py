"""One writer per workdir (`gedl_jax.run.lock`): real processes, real flock.

The unit tests hold a folder in a child process (a few lines of Python, no JAX) and try it from
this one; the CLI test starts a real tiny training run and a second one on the same workdir.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest
from training_fixtures import REPO, cli_args, subprocess_env, write_tiny_mnist

from gedl_jax.run import lock

HOLDER = """
import sys, time
from gedl_jax.run import lock
with lock.holding(sys.argv[1]):
    print("held", flush=True)
    time.sleep(60)
"""


def _hold_in_child(folder: pathlib.Path) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], cwd=REPO,
                             env={**os.environ, "PYTHONPATH": str(REPO)},
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "held"
    return child


@pytest.fixture
def held(tmp_path):
    child = _hold_in_child(tmp_path / "w")
    yield tmp_path / "w", child
    if child.poll() is None:
        child.kill()
    child.wait()


def test_a_second_process_is_refused_naming_the_first(held):
    folder, child = held
    with pytest.raises(lock.WorkdirBusyError) as refused:
        with lock.holding(folder):
            pass
    message = str(refused.value)
    assert f"pid {child.pid} on {os.uname().nodename}" in message
    assert "started 20" in message and "UTC" in message
    assert "use another --workdir" in message
    with pytest.raises(lock.WorkdirBusyError) as refused:
        with lock.holding(folder / "as_laplace", "the results folder"):
            pass
    assert str(refused.value).endswith("wait for it to finish or stop it, or use another folder")


@pytest.mark.parametrize("relative", ["seed_0", "members/seed_3", "."])
def test_folders_inside_and_around_a_held_one_are_refused(held, relative):
    folder, child = held
    with pytest.raises(lock.WorkdirBusyError, match=f"pid {child.pid}"):
        with lock.holding(folder / relative):
            pass
    outer = folder.parent
    with pytest.raises(lock.WorkdirBusyError, match=f"it holds {folder}"):
        with lock.holding(outer):
            pass


def test_a_killed_holder_blocks_nobody_and_a_release_leaves_no_file(held):
    folder, child = held
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert (folder / lock.LOCK_NAME).exists()   # its record stays; its lock went with it
    with lock.holding(folder):
        assert lock.held_by_this_process(folder / "seed_0")
        with lock.holding(folder / "seed_0"):   # re-entrant within one process
            pass
    assert not (folder / lock.LOCK_NAME).exists()
    assert not lock.held_by_this_process(folder)


def test_a_deferred_lock_creates_nothing_until_the_first_write(tmp_path):
    folder = tmp_path / "new"
    with lock.holding(folder, create=False):
        assert not folder.exists()   # bad input found now would leave nothing behind
        lock.claim(folder / "seed_0")   # rundir.prepare, before its first write
        assert (folder / lock.LOCK_NAME).exists() and lock.held_by_this_process(folder)
    assert not (folder / lock.LOCK_NAME).exists()


def test_a_deferred_lock_inside_a_held_folder_is_refused_at_once(held):
    folder, child = held
    with pytest.raises(lock.WorkdirBusyError, match=f"pid {child.pid}"):
        with lock.holding(folder / "seed_9", create=False):
            pass


def test_two_training_runs_on_one_workdir(tmp_path):
    """The second run exits 2 within seconds naming the first; the first finishes with its own
    config and results."""
    data_dir = write_tiny_mnist(tmp_path / "data")
    env = subprocess_env(tmp_path / "cache")
    workdir = tmp_path / "w"
    first = subprocess.Popen(cli_args(workdir, data_dir, learning_rate=0.001),
                             cwd=REPO, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 120
        while not (workdir / lock.LOCK_NAME).exists():
            assert first.poll() is None and time.time() < deadline, first.stdout.read()
            time.sleep(0.1)
        first.send_signal(signal.SIGSTOP)   # paused while it holds the workdir
        start = time.time()
        second = subprocess.run(cli_args(workdir, data_dir, learning_rate=0.003), cwd=REPO,
                                env=env, capture_output=True, text=True, timeout=120)
        took = time.time() - start
        first.send_signal(signal.SIGCONT)
        first_out, _ = first.communicate(timeout=240)
    finally:
        if first.poll() is None:
            first.kill()
    assert second.returncode == 2, second.stdout + second.stderr
    error_lines = [line for line in second.stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1 and f"pid {first.pid}" in error_lines[0], second.stderr
    assert "epoch" not in second.stdout and took < 30
    assert first.returncode == 0, first_out
    assert json.loads((workdir / "config.json").read_text())["learning_rate"] == 0.001
    steps = [json.loads(line)["step"] for line in (workdir / "metrics.jsonl").read_text()
             .splitlines() if json.loads(line)["split"] == "train"]
    assert steps == sorted(set(steps))   # one writer
    assert not (workdir / lock.LOCK_NAME).exists()


def test_an_evaluation_into_a_held_folder_is_refused(held):
    from gedl_jax import evaluate

    folder, child = held
    (folder / "config.json").write_text("{}")
    with pytest.raises(lock.WorkdirBusyError, match=rf"the results folder={folder} is in use .*"
                                                     rf"pid {child.pid}"):
        evaluate.evaluate_workdir(folder)


def test_reproduce_into_a_held_out_folder_exits_2_naming_the_holder(held, tmp_path):
    folder, child = held
    proc = subprocess.run([sys.executable, "bin/reproduce.py", f"--out={folder}",
                           "--variants=gedl", "--seeds=0"], cwd=REPO,
                          env=subprocess_env(tmp_path / "cache"), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(f"error: --out={folder} is in use")
    assert f"pid {child.pid}" in proc.stderr and not (folder / "runs").exists()
