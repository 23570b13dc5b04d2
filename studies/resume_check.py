"""Is a stopped and resumed training run the uninterrupted run, bit for bit, on this machine?

    python -m studies.resume_check --out=DIR                  # GEDL on MNIST, 4 epochs
    python -m studies.resume_check --config=configs/mnist.py:quick --epochs=2 --stop_at=40

Three `python -m gedl_jax.train` processes, nothing shared between them but the files a user's
run keeps in its workdir (no compilation cache: each process compiles, and on a GPU autotunes,
for itself):
1. the uninterrupted run, in `uninterrupted/`;
2. the same command in `resumed/`, stopped by SIGTERM (a preemption) once its metrics pass step
   `--stop_at`; it saves a checkpoint at the step it reached and exits;
3. the same command again in `resumed/`, which resumes from that checkpoint and finishes.
Before run 2 starts, `resumed/xla_autotune/` gets a copy of the kernel choices run 1 made (what a
run's own folder holds when its first process made them): the check is whether a resumed process
reads and keeps them, not whether two independent runs autotune alike (`--independent` adds a
fourth run in a fresh workdir and says whether it, too, matches). The final `last` checkpoints
(parameters, optimiser, the method's state, the step) are compared leaf by leaf, and the
metrics records after the stop as numbers. Prints one verdict line and writes `resume_check.json`
(the stop step, the number of leaves that differ and the largest difference, the XLA flags).
Exit status 0 when identical, 1 when not, 2 when a run failed.

XLA_FLAGS from the environment reach every run (e.g. `--xla_gpu_deterministic_ops=true` to check
XLA's stricter flag); `--override` adds `--config.` fields to every run.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]


def train_command(config: str, workdir: pathlib.Path, epochs: int, overrides: list[str]
                  ) -> list[str]:
    return [sys.executable, "-m", "gedl_jax.train", f"--config={config}",
            f"--workdir={workdir}", f"--config.num_epochs={epochs}",
            "--config.evaluate_at_end=False", "--config.plots=False",
            *(f"--config.{o}" for o in overrides)]


def run_to_end(command: list[str], log: pathlib.Path) -> None:
    with log.open("a") as f:
        rc = subprocess.run(command, cwd=REPO, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        raise RuntimeError(f"{' '.join(command[1:4])} exited with {rc}; see {log}")


def train_records(workdir: pathlib.Path) -> list[dict]:
    path = workdir / "metrics.jsonl"
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:   # a line being written
            continue
        if record.get("split") == "train":
            records.append(record)
    return records


def run_and_stop(command: list[str], workdir: pathlib.Path, stop_at: int, log: pathlib.Path,
                 timeout_s: float) -> None:
    """Start `command`, send SIGTERM once its metrics reach `stop_at`, wait for its exit."""
    with log.open("a") as f:
        proc = subprocess.Popen(command, cwd=REPO, stdout=f, stderr=subprocess.STDOUT)
        deadline = time.time() + timeout_s
        try:
            while proc.poll() is None and time.time() < deadline:
                if any(r["step"] >= stop_at for r in train_records(workdir)):
                    proc.send_signal(signal.SIGTERM)
                    break
                time.sleep(0.01)
            proc.wait(timeout=timeout_s)
        finally:
            if proc.poll() is None:
                proc.kill()
    if proc.returncode not in (0, 75):   # 75: preempted, checkpoint saved (gedl_jax.train)
        raise RuntimeError(f"the run to stop exited with {proc.returncode}; see {log}")


def final_state(workdir: pathlib.Path) -> tuple[int, dict[str, np.ndarray]]:
    """The newest `last` checkpoint's step and its leaves as NumPy arrays, by path."""
    import jax
    import orbax.checkpoint as ocp

    manager = ocp.CheckpointManager(workdir / "checkpoints" / "last")
    try:
        step = manager.latest_step()
        restored = manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore()))
    finally:
        manager.close()
    leaves = jax.tree_util.tree_leaves_with_path(restored["state"])
    return step, {jax.tree_util.keystr(k): np.asarray(v) for k, v in leaves}


def compare(a: pathlib.Path, b: pathlib.Path) -> dict:
    step_a, leaves_a = final_state(a)
    step_b, leaves_b = final_state(b)
    differing, largest = [], 0.0
    for name in sorted(set(leaves_a) | set(leaves_b)):
        x, y = leaves_a.get(name), leaves_b.get(name)
        if x is None or y is None or x.shape != y.shape:
            differing.append(name)
            continue
        if not np.array_equal(x, y, equal_nan=True):
            differing.append(name)
            if np.issubdtype(x.dtype, np.number):
                largest = max(largest, float(np.max(np.abs(x.astype(np.float64)
                                                           - y.astype(np.float64)))))
    return {"steps": [step_a, step_b], "leaves": len(leaves_a), "leaves_differing": differing,
            "largest_difference": largest,
            "identical": step_a == step_b and not differing}


def same_records_after(a: pathlib.Path, b: pathlib.Path, step: int) -> bool | None:
    """Whether the train records after the first one past `step` agree (that first one averages
    a window the stop cut in two in the resumed run); None when there are none to compare."""
    keep = lambda r: {k: v for k, v in r.items() if k != "time"}   # noqa: E731
    later = [[keep(r) for r in train_records(w) if r["step"] > step][1:] for w in (a, b)]
    return (later[0] == later[1]) if (later[0] or later[1]) else None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/mnist.py:gedl",
                   help="the runs' python -m gedl_jax.train --config (default "
                        "configs/mnist.py:gedl)")
    p.add_argument("--epochs", type=int, default=4, help="each run's num_epochs (default 4)")
    p.add_argument("--stop_at", type=int, default=0,
                   help="SIGTERM once the metrics reach this step (0: 1.5 epochs' steps, read "
                        "from the uninterrupted run; half of them in a one-epoch run)")
    p.add_argument("--override", action="append", default=[],
                   help="a config field for every run, e.g. --override=train_examples=2560")
    p.add_argument("--independent", action="store_true",
                   help="also train in a fresh workdir and compare it with the first run")
    p.add_argument("--timeout", type=float, default=600, help="seconds per run")
    p.add_argument("--out", default=None, help="folder for resume_check.json and the logs")
    args = p.parse_args(argv)
    out = pathlib.Path(args.out or tempfile.mkdtemp(prefix="resume_check_"))
    out.mkdir(parents=True, exist_ok=True)
    work = pathlib.Path(tempfile.mkdtemp(prefix="resume_check_runs_"))
    full, resumed = work / "uninterrupted", work / "resumed"
    log = out / "resume_check.log"
    log.write_text("")
    result: dict = {"config": args.config, "epochs": args.epochs, "overrides": args.override,
                    "xla_flags": os.environ.get("XLA_FLAGS", "")}
    try:
        start = time.time()
        run_to_end(train_command(args.config, full, args.epochs, args.override), log)
        records = train_records(full)
        steps = records[-1]["step"]
        # mid-epoch, after the first epoch's end (or half-way through a one-epoch run)
        stop_at = args.stop_at or max(1, (3 * steps) // (2 * args.epochs) if args.epochs > 1
                                      else steps // 2)
        if (full / "xla_autotune").is_dir():
            shutil.copytree(full / "xla_autotune", resumed / "xla_autotune")
        command = train_command(args.config, resumed, args.epochs, args.override)
        run_and_stop(command, resumed, stop_at, log, args.timeout)
        saved = sorted(int(d.name) for d in (resumed / "checkpoints" / "last").iterdir()
                       if d.name.isdigit())
        result["stopped_at_step"] = saved[-1] if saved else 0
        if result["stopped_at_step"] >= steps:
            raise RuntimeError(f"the run finished (step {steps}) before the stop at {stop_at}: "
                               f"give a smaller --stop_at")
        run_to_end(command, log)
        result.update(compare(full, resumed))
        result["records_after_stop_identical"] = same_records_after(
            full, resumed, result["stopped_at_step"])
        result["identical"] = (result["identical"]
                               and result["records_after_stop_identical"] is not False)
        if args.independent:
            fresh = work / "independent"
            run_to_end(train_command(args.config, fresh, args.epochs, args.override), log)
            result["independent_run"] = compare(full, fresh)
        result["wall_s"] = round(time.time() - start, 1)
    except (RuntimeError, OSError) as e:
        result["error"] = str(e)
        print(f"resume_check: error: {e}", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    (out / "resume_check.json").write_text(json.dumps(result, indent=2) + "\n")
    if "error" in result:
        return 2
    verdict = ("IDENTICAL: the resumed run equals the uninterrupted one bit for bit"
               if result["identical"] else
               f"DIFFERENT: {len(result['leaves_differing'])} of {result['leaves']} leaves differ "
               f"(largest difference {result['largest_difference']:.3g})")
    extra = ""
    if "independent_run" in result:
        extra = ("; an independent run is identical too" if result["independent_run"]
                 ["identical"] else "; an independent run differs")
    print(f"resume_check: stopped at step {result['stopped_at_step']} of {result['steps'][0]}, "
          f"resumed: {verdict}{extra} ({result['wall_s']} s)")
    return 0 if result["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
