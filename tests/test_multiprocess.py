"""Two processes on 127.0.0.1 (jax.distributed, CPU collectives over gloo, one CPU device each)
train, validate, checkpoint and evaluate exactly like one process with two devices on the same
global batch. Every process is started with a free port, a bounded timeout (killed past it) and
its exit code checked. Generated data (tests/training_fixtures.py).

The processes run on the CPU on every machine: what is tested (coordination, the same global
batch, checkpoints and stops agreed between hosts) does not depend on the platform, and two
processes on a one-GPU machine would share its GPU, which NCCL refuses ("Duplicate GPU
detected", an H100 check). The training test runs twice: with the epoch ends a CPU's
processes take (the loop waits at each), and with those an accelerator's take (deferred until
the next call is queued; tests/multiprocess/train_deferred.py forces them on a CPU)."""

import json
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from training_fixtures import (
    REPO,
    assert_same_tree,
    checkpoint_steps,
    cli_args,
    free_port,
    run_to_end,
    saved_state,
    subprocess_env,
    write_tiny_mnist,
)

TIMEOUT = 300
HERE = pathlib.Path(__file__).resolve().parent


def run_processes(commands: list[list[str]], env: dict[str, str], timeout: float = TIMEOUT
                  ) -> list[str]:
    """Start every command at once; wait for all (killing all past `timeout`); every exit code
    must be 0. Returns their outputs."""
    procs = [subprocess.Popen(c, cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for c in commands]
    deadline, outputs = time.time() + timeout, []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=max(deadline - time.time(), 1))
            outputs.append(out)
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        raise AssertionError(f"processes still running after {timeout} s") from None
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    codes = [p.returncode for p in procs]
    assert codes == [0] * len(procs), "\n\n".join(
        f"process {i}: exit {c}\n{o}" for i, (c, o) in enumerate(zip(codes, outputs)))
    return outputs


def distributed_args(port: int, process_id: int, num_processes: int = 2) -> list[str]:
    return ["--config.distributed=True", f"--config.coordinator_address=127.0.0.1:{port}",
            f"--config.num_processes={num_processes}", f"--config.process_id={process_id}"]


def deferred(command: list[str]) -> list[str]:
    """`command` (a `cli_args` line) through the worker that defers the epoch ends as on an
    accelerator (tests/multiprocess/train_deferred.py)."""
    assert command[1:3] == ["-m", "gedl_jax.train"], command
    return [command[0], str(HERE / "multiprocess" / "train_deferred.py"), *command[3:]]


@pytest.mark.parametrize("epoch_ends", ["waiting", "deferred"])
def test_two_processes_equal_one_process_with_two_devices(tmp_path, epoch_ends):
    """Also with the epoch ends deferred as on an accelerator's processes (validation and the
    checkpoints after the next call is queued, the checkpoints saved by the loop, not a thread):
    the same checkpoints, results and records as the one waiting process."""
    data_dir = write_tiny_mnist(tmp_path / "data")
    # Deferred: no mid-epoch checkpoints, so the epoch end's `last` (step 8) is still on disk
    # at the end to compare (two are kept).
    fields = dict(evaluate_at_end=True, checkpoint_every_steps=3 if epoch_ends == "waiting"
                  else 0, extra_ood=str(write_tiny_ood(tmp_path / "ood")))
    if epoch_ends == "deferred":
        # An interval that has always passed: the same saves, decided by process 0's clock
        # and broadcast to the other process at each epoch end (`_Loop.checkpoint_due`).
        fields["checkpoint_interval_seconds"] = 1e-6
    single = tmp_path / "one_process"
    run_to_end(cli_args(single, data_dir, **fields), subprocess_env(tmp_path / "c1", devices=2),
               timeout=TIMEOUT)

    multi = tmp_path / "two_processes"
    port = free_port()
    env = subprocess_env(tmp_path / "c2", devices=1, cpu=True)
    wrap = deferred if epoch_ends == "deferred" else list
    outputs = run_processes([wrap(cli_args(multi, data_dir, **fields)) + distributed_args(port, i)
                             for i in range(2)], env)
    assert "process 0 of 2, 1 local / 2 global devices" in outputs[0], outputs[0]
    assert "epoch 2: validation accuracy" in outputs[0]
    assert "validation accuracy" not in outputs[1]  # only process 0 logs
    if epoch_ends == "deferred":   # 8 steps an epoch; the last epoch end is the run's end
        assert all("deferred epoch ends at steps [8]" in out for out in outputs), outputs

    assert checkpoint_steps(multi) == checkpoint_steps(single)
    for kind, step in [("last", s) for s in checkpoint_steps(single)] + [("best", None)]:
        a, meta_a = saved_state(single, kind, step)
        b, meta_b = saved_state(multi, kind, step)
        assert_same_tree(a, b)
        assert meta_a == meta_b
    ra = json.loads((single / "eval_results.json").read_text())
    rb = json.loads((multi / "eval_results.json").read_text())
    ra.pop("workdir"), rb.pop("workdir")
    assert ra == rb
    assert ra["id"]["num_examples"] == 64
    # One writer: the metrics log has each record once, as in the single-process run.
    lines_a = (single / "metrics.jsonl").read_text().splitlines()
    lines_b = (multi / "metrics.jsonl").read_text().splitlines()
    assert len(lines_a) == len(lines_b) > 0
    assert not list(multi.glob(".shared_filesystem_check*"))


def test_sigterm_to_one_host_stops_every_host_at_the_same_step(tmp_path):
    """SIGTERM to process 1 only: JAX's preemption service agrees on a step, both processes
    save that step's checkpoint together and exit with 75; rerun, they finish."""
    data_dir = write_tiny_mnist(tmp_path / "data")
    workdir = tmp_path / "w"
    port = free_port()
    env = subprocess_env(tmp_path / "c", devices=1, cpu=True)
    commands = [cli_args(workdir, data_dir, num_epochs=4, log_every_steps=1)
                + distributed_args(port, i) for i in range(2)]
    procs = [subprocess.Popen(c, cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for c in commands]
    try:
        seen, deadline = [], time.time() + TIMEOUT
        while time.time() < deadline:
            line = procs[0].stdout.readline()
            seen.append(line)
            if not line or "epoch 2/4 step 10/32" in line:
                break
        assert procs[1].poll() is None, "".join(seen)
        procs[1].send_signal(signal.SIGTERM)
        outs = ["".join(seen) + procs[0].communicate(timeout=120)[0],
                procs[1].communicate(timeout=120)[0]]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    codes = [p.returncode for p in procs]
    assert codes == [75, 75], "\n\n".join(outs)
    steps = checkpoint_steps(workdir)
    assert steps and 10 <= steps[-1] < 32, steps
    assert all(f"checkpoint at step {steps[-1]} " in out for out in outs), outs
    outputs = run_processes(commands, env)
    assert f"resumed from {workdir}/checkpoints/last at step {steps[-1]}" in outputs[0]
    assert checkpoint_steps(workdir)[-1] == 32


def test_workdir_not_shared_fails_on_every_process_with_a_clear_error(tmp_path):
    """Each process gets a private folder (as on hosts without a shared filesystem): both stop
    with the error, neither hangs."""
    port = free_port()
    env = subprocess_env(tmp_path / "c", devices=1, cpu=True)
    procs = [subprocess.Popen([sys.executable, str(HERE / "multiprocess" / "check_workdir.py"),
                               f"127.0.0.1:{port}", "2", str(i), str(tmp_path / f"host{i}")],
                              cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(2)]
    try:
        outs = [p.communicate(timeout=TIMEOUT)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for i, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 3, f"process {i}: exit {p.returncode}\n{out}"
        assert "not one folder shared by all 2 processes: process(es) [1]" in out, out


def write_tiny_ood(folder: pathlib.Path) -> pathlib.Path:
    """An IDX-format OOD folder (t10k files), 40 images."""
    from data_fixtures import write_idx

    rng = np.random.default_rng(7)
    write_idx(folder / "t10k-images-idx3-ubyte.gz",
              rng.integers(0, 256, (40, 28, 28), dtype=np.uint8))
    write_idx(folder / "t10k-labels-idx1-ubyte.gz", (np.arange(40) % 10).astype(np.uint8))
    return folder
