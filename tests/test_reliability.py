"""Nothing silent, nothing stuck: a rejected value leaves the workdir usable, bad input through
any CLI is one `error:` line and exit 2, a damaged checkpoint is set aside and the previous one
used, a run at chance or diverged says so (exit 3), a full disk loses nothing (exit 74).
docs/robustness.md lists every case; generated data only (tests/training_fixtures.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from training_fixtures import (
    REPO,
    TINY_FIELDS,
    checkpoint_steps,
    subprocess_env,
    write_tiny_mnist,
)

from gedl_jax import config as config_lib
from gedl_jax import configs, train
from compile_mode import fast_compilation


@pytest.fixture
def data_dir(tmp_path):
    return write_tiny_mnist(tmp_path / "data", n_train=200, n_test=40)


def config(data_dir, tmp_path, **fields):
    c = configs.build_config("mnist", "gedl")
    for k, v in {**TINY_FIELDS, "train_examples": 64, "val_examples": 32, "num_epochs": 1,
                 "data_dir": str(data_dir), "cache_dir": str(tmp_path / "cache"),
                 **fields}.items():
        config_lib.set_fields(c, **{k: v})
    return c


def cli(*args: str, tmp_path, module: str = "gedl_jax.train", timeout: float = 120,
        **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO,
                          env=subprocess_env(tmp_path / "cli_cache", **env),
                          capture_output=True, text=True, timeout=timeout)


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("error:")]


# --------------------------------------------------------------- 1. nothing written on a reject
def test_rejected_batch_size_writes_nothing_and_the_corrected_command_trains(
        data_dir, tmp_path, fast_compile):
    workdir = tmp_path / "w"
    with pytest.raises(ValueError, match=r"config.batch_size=128 exceeds the 64 training "
                                         r"examples of mnist: use --config.batch_size=64"):
        train.train_and_evaluate(config(data_dir, tmp_path, batch_size=128), workdir)
    assert not workdir.exists()
    assert train.train_and_evaluate(config(data_dir, tmp_path, batch_size=32),
                                    workdir)["steps"] == 2


def test_workdir_without_a_checkpoint_accepts_a_changed_config(data_dir, tmp_path,
                                                               fast_compile, capsys):
    workdir = tmp_path / "w"
    workdir.mkdir()
    old = json.loads(config(data_dir, tmp_path, learning_rate=0.5).to_json_best_effort())
    (workdir / "config.json").write_text(json.dumps(old))
    c = config(data_dir, tmp_path)
    assert train.train_and_evaluate(c, workdir, stop_after_steps=1)["steps"] == 1
    assert "holds no checkpoint yet: its config.json is replaced by this configuration " \
           "(learning_rate: 0.5 -> 0.001)" in capsys.readouterr().out
    assert json.loads((workdir / "config.json").read_text())["learning_rate"] == 0.001


# --------------------------------------------------------------- 3. one line, exit 2, --help 0
@pytest.mark.parametrize("args,message", [
    (["--config=configs/mnist.py", "--config.batch_sise=64"],
     "error: unknown config field 'batch_sise' (did you mean 'batch_size'?)"),
    (["--config=configs/mnist.py", "--config.learning_rate=abc"],
     "error: flag --config.learning_rate=abc: could not convert string to float: 'abc'"),
    (["--config=configs/mnist.py:gedel"], "error: unknown config argument(s) ['gedel']"),
    (["--config=configs/nope.py"],
     "error: cannot load the config file configs/nope.py (No such file or directory)"),
    (["--config=configs/mnist.py", "stray"], "error: unexpected arguments ['stray']"),
    (["--config=configs/mnist.py:duq", "--config.duq_length_scale=0.2"],
     "error: --config.duq_length_scale was replaced by config.method_args (the settings of "
     "config.method=duq): use --config.method_args='{\"length_scale\": <value>}'"),
    (["--config=configs/mnist.py:duq", "--config.method_args={\"length_scale\": 0}"],
     "error: config.method_args: length_scale=0.0 is not allowed; it must be > 0"),
])
def test_train_cli_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    proc = cli(f"--workdir={tmp_path}/w", *args, tmp_path=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert [line[:len(message)] for line in error_lines(proc)] == [message], proc.stderr
    assert not (tmp_path / "w").exists()


def test_debug_shows_the_traceback(tmp_path):
    proc = cli("--config=configs/mnist.py:gedel", "--debug", tmp_path=tmp_path)
    assert proc.returncode == 2 and "Traceback" in proc.stderr
    proc = cli("--config=configs/mnist.py:gedel", tmp_path=tmp_path, GEDL_DEBUG="1")
    assert proc.returncode == 2 and "Traceback" in proc.stderr


def test_help_exits_0_and_lists_every_preset(tmp_path):
    proc = cli("--help", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    for name in [*config_lib.VARIANTS, *config_lib.MODIFIERS]:
        assert name in proc.stdout
    assert "--workdir" in proc.stdout
    assert "dataset_info" not in proc.stderr and "Variant folder" not in proc.stderr


def test_evaluate_cli_bad_input_is_one_line_and_exit_2(tmp_path):
    proc = cli(f"--workdir={tmp_path}/none", tmp_path=tmp_path, module="gedl_jax.evaluate")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert len(error_lines(proc)) == 1 and "has no config.json" in proc.stderr
    assert cli("--help", tmp_path=tmp_path, module="gedl_jax.evaluate").returncode == 0


def test_evaluate_cli_refuses_what_it_cannot_do_before_any_work(finished, tmp_path):
    """One line, exit 2, before any evaluation: a run listed twice (it would pass for two
    seeds), the corruption study on a run not trained on CIFAR-10 or with an unknown
    corruption, and the parent folder of a seeds command (the line names its runs)."""
    import shutil

    _, _, reference = finished
    seeds = tmp_path / "seeds"
    for seed in (0, 1):
        (seeds / f"seed_{seed}").mkdir(parents=True)
        shutil.copy(reference / "config.json", seeds / f"seed_{seed}" / "config.json")
    for args, message in [
            ([f"--workdir={reference}", f"--workdir={reference}/."], "more than once"),
            ([f"--workdir={reference}", "--corruptions=snow"],
             "was trained on mnist, not cifar10"),
            ([f"--workdir={reference}", "--corruptions=snowfall"],
             "unknown CIFAR-10-C corruption 'snowfall'"),
            ([f"--workdir={seeds}"], f"one run per seed (seed_0, seed_1), not a run: evaluate "
                                     f"them with --workdir={seeds}/seed_0 "
                                     f"--workdir={seeds}/seed_1")]:
        proc = cli(*args, tmp_path=tmp_path, module="gedl_jax.evaluate")
        assert proc.returncode == 2, proc.stderr
        assert len(error_lines(proc)) == 1 and message in error_lines(proc)[0], proc.stderr
        assert "evaluated" not in proc.stdout, proc.stdout


def test_evaluate_cli_writes_the_table_into_a_new_folder(finished, tmp_path):
    """--out=NEW/FOLDERS/table.md: the folders are made (the check that they can be is made
    before the work)."""
    import shutil

    _, _, reference = finished
    runs = [tmp_path / "a", tmp_path / "b"]
    for run_ in runs:
        shutil.copytree(reference, run_)
    table = tmp_path / "new" / "sub" / "table.md"
    proc = cli(*(f"--workdir={r}" for r in runs), f"--out={table}", tmp_path=tmp_path,
               module="gedl_jax.evaluate")
    assert proc.returncode == 0, proc.stderr
    assert "over 2 seeds" in table.read_text()


def test_tiny_cli_run_finishes_with_exit_0(tmp_path):
    """The same tiny run the interruption tests use ends above chance: exit 0."""
    data = write_tiny_mnist(tmp_path / "data")
    fields = {**TINY_FIELDS}
    proc = cli(f"--workdir={tmp_path}/w", "--config=configs/mnist.py:gedl",
               f"--config.data_dir={data}", *(f"--config.{k}={v}" for k, v in fields.items()),
               tmp_path=tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert checkpoint_steps(tmp_path / "w") == [8, 16]


# --------------------------------------------------------------- 2. damaged checkpoints
def _damage(step_folder, every_data_file: bool = False) -> None:
    """Truncate the largest file under <step>/state/ to a third (an array's bytes go missing),
    or (`every_data_file`) every file of its data folder to 50 bytes (the arrays' metadata
    goes missing too: a restore then fails before it reads an array, as a restore of another
    layout would)."""
    files = [p for p in (step_folder / "state").rglob("*") if p.is_file()]
    if every_data_file:
        for f in files:
            if f.parent.name == "d" and f.stat().st_size > 50:
                f.write_bytes(f.read_bytes()[:50])
        return
    largest = max(files, key=lambda p: p.stat().st_size)
    largest.write_bytes(largest.read_bytes()[: largest.stat().st_size // 3])


def assert_names_the_damage(out: str) -> None:
    """The set-aside line names what is wrong with the files (TensorStore's read error), not
    the tree mismatch of the restore that tried the checkpoint as the pre-method layout."""
    line = next(line for line in out.splitlines() if "cannot be restored" in line)
    assert "Error reading" in line, line
    assert "tree structures do not match" not in line, line


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished tiny run (2 epochs x 8 steps, `last` at 8 and 16), uninterrupted."""
    root = tmp_path_factory.mktemp("finished")
    with fast_compilation():
        data = write_tiny_mnist(root / "data")
        c = config(data, root, train_examples=256, val_examples=64, num_epochs=2)
        return c, train.train_and_evaluate(c, root / "w"), root / "w"


def test_damaged_newest_checkpoint_is_set_aside_and_the_run_resumes_to_the_same_result(
        finished, tmp_path, fast_compile, capsys):
    import shutil

    from training_fixtures import assert_same_tree

    c, full, reference = finished
    workdir = tmp_path / "w"
    shutil.copytree(reference, workdir)
    _damage(workdir / "checkpoints" / "last" / "16")
    capsys.readouterr()
    again = train.train_and_evaluate(c, workdir)
    out = capsys.readouterr().out
    assert f"warning: checkpoint {workdir}/checkpoints/last/16 cannot be restored (" in out
    assert_names_the_damage(out)
    assert "set aside as 16.damaged" in out and "resumed from" in out and "at step 8" in out
    assert (workdir / "checkpoints" / "last" / "16.damaged").is_dir()   # kept, renamed
    assert again["steps"] == 16
    import jax
    assert_same_tree(jax.device_get(full["state"]), jax.device_get(again["state"]))
    assert checkpoint_steps(workdir) == [8, 16]


def test_a_best_checkpoint_whose_last_save_failed_is_resumed_from(finished, tmp_path,
                                                                     fast_compile, capsys):
    """A `last` save that failed (a full disk) leaves the `best` checkpoint of its epoch end,
    complete, and an unfinished temporary folder: the run resumes from that `best` (it used to
    start again from the previous `last`, or from step 0) and ends as the uninterrupted run."""
    import shutil

    import jax
    from training_fixtures import assert_same_tree

    c, full, reference = finished
    workdir = tmp_path / "w"
    shutil.copytree(reference, workdir)
    best = checkpoint_steps(workdir, "best")[-1]
    for step in checkpoint_steps(workdir):
        if step >= best:   # as a save cut off by a full disk leaves it
            (workdir / "checkpoints" / "last" / str(step)).rename(
                workdir / "checkpoints" / "last" / f"{step}.orbax-checkpoint-tmp-1")
    older = [s for s in checkpoint_steps(workdir) if s < best]
    capsys.readouterr()
    again = train.train_and_evaluate(c, workdir)
    assert f"resumed from {workdir}/checkpoints/best at step {best}" in capsys.readouterr().out
    assert again["steps"] == 16 and older != [best]
    assert_same_tree(jax.device_get(full["state"]), jax.device_get(again["state"]))


@pytest.mark.parametrize("every_data_file", [False, True])
def test_evaluate_falls_back_when_the_best_checkpoint_is_damaged(finished, tmp_path, capsys,
                                                                  every_data_file):
    import shutil

    from gedl_jax import evaluate

    _, _, reference = finished
    workdir = tmp_path / "w"
    shutil.copytree(reference, workdir)
    best_step = checkpoint_steps(workdir, "best")[-1]
    _damage(workdir / "checkpoints" / "best" / str(best_step), every_data_file)
    results = evaluate.evaluate_workdir(workdir)
    out = capsys.readouterr().out
    assert f"checkpoints/best/{best_step} cannot be restored" in out
    assert_names_the_damage(out)
    assert f"evaluating {workdir}/checkpoints/last/16 instead" in out
    assert results["id"]["num_examples"] > 0
    assert (workdir / "checkpoints" / "best" / f"{best_step}.damaged").is_dir()


def test_no_checkpoint_restores_is_one_error_and_nothing_is_renamed(finished, tmp_path,
                                                                     fast_compile):
    import shutil

    c, _, reference = finished
    workdir = tmp_path / "w"
    shutil.copytree(reference, workdir)
    for step in (8, 16):
        _damage(workdir / "checkpoints" / "last" / str(step))
    before = sorted(p.relative_to(workdir) for p in workdir.rglob("*"))
    with pytest.raises(train.ConfigMismatchError,
                       match=r"(?s)cannot resume from .*checkpoints/last/16: .* no older "
                             r"checkpoint restores either \(2 tried\)") as raised:
        train.train_and_evaluate(c, workdir)
    from gedl_jax.commands import cli

    first, *details = cli.error_text(raised.value).split("\n")   # as the command prints it
    assert first.endswith("use a new --workdir, or the version that wrote it"), first
    # under 200 characters with a workdir path of 20 (pytest's are longer)
    assert len(details) == 2 and len(first) - len(str(workdir)) + 20 < cli.MAX_LINE, first
    assert max(map(len, details)) < cli.MAX_LINE, details
    assert sorted(p.relative_to(workdir) for p in workdir.rglob("*")) == before


def test_a_checkpoint_that_runs_out_of_memory_is_not_set_aside_as_damaged(
        finished, tmp_path, monkeypatch, fast_compile):
    """Memory that runs out while a checkpoint restores (a GPU another process fills) says
    nothing about the file: resume and evaluation stop with that error, nothing renamed."""
    import shutil

    import jax.numpy as jnp

    from gedl_jax import evaluate
    from gedl_jax.commands import cli
    from gedl_jax.run import checkpointing

    try:   # a real out-of-memory error: an allocation no machine has
        jnp.zeros((2**50,), jnp.uint8).block_until_ready()
    except RuntimeError as e:
        oom = e

    def first_call_out_of_memory(method):
        """`method`, whose first call runs out of memory: the next checkpoint would restore,
        so a restore that took the error for damage would set the first one aside."""
        calls = []

        def patched(*args, **kwargs):
            calls.append(1)
            if len(calls) == 1:
                raise oom
            return method(*args, **kwargs)
        return patched

    c, _, reference = finished
    workdir = tmp_path / "w"
    shutil.copytree(reference, workdir)
    before = sorted(p.relative_to(workdir) for p in workdir.rglob("*"))
    with monkeypatch.context() as m:
        m.setattr(checkpointing.RunCheckpoints, "restore_step",
                  first_call_out_of_memory(checkpointing.RunCheckpoints.restore_step))
        with pytest.raises(RuntimeError, match="RESOURCE_EXHAUSTED") as raised:
            train.train_and_evaluate(c, workdir)
    assert cli.out_of_memory(raised.value).startswith("out of device memory (RESOURCE_")
    monkeypatch.setattr(checkpointing.RunCheckpoints, "_restore",
                        first_call_out_of_memory(checkpointing.RunCheckpoints._restore))
    with pytest.raises(RuntimeError, match="RESOURCE_EXHAUSTED"):
        evaluate.evaluate_workdir(workdir, results_dir=tmp_path / "out")
    assert sorted(p.relative_to(workdir) for p in workdir.rglob("*")) == before


# --------------------------------------------------------------- 5. divergence, chance level
def test_a_run_at_chance_level_says_so_and_exits_3_unless_allowed(tmp_path):
    data = write_tiny_mnist(tmp_path / "data")
    args = [f"--workdir={tmp_path}/w", "--config=configs/mnist.py:gedl",
            f"--config.data_dir={data}", *(f"--config.{k}={v}" for k, v in TINY_FIELDS.items()),
            "--config.learning_rate=100"]
    proc = cli(*args, tmp_path=tmp_path, timeout=240)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    lines = error_lines(proc)
    assert len(lines) == 1 and ("ended at chance level" in lines[0] or "diverged" in lines[0])
    assert "Traceback" not in proc.stderr
    allowed = cli(*args, "--config.allow_chance=True", tmp_path=tmp_path, timeout=240)
    if "ended at chance level" in lines[0]:
        assert allowed.returncode == 0, allowed.stderr
        assert "warning:" in allowed.stderr and "ended at chance level" in allowed.stderr


def test_chance_level_is_claimed_only_where_the_validation_split_can_tell():
    """Accuracy at or below always-the-most-frequent-class (3 standard errors over it, at least
    1.5/K) is "did not learn"; with too few validation images to tell (one image: its
    majority class scores 1.0), nothing is claimed."""
    import types

    import numpy as np

    from gedl_jax.run import training

    def run(labels, best):
        split = types.SimpleNamespace(labels=np.asarray(labels))
        return types.SimpleNamespace(
            experiment=types.SimpleNamespace(data=types.SimpleNamespace(validation=split)),
            best_accuracy=best, config=types.SimpleNamespace(num_classes=10), workdir="w")

    balanced = np.arange(100) % 10
    assert "ended at chance level" in training.chance_message(run(balanced, 0.12))
    assert training.chance_message(run(balanced, 0.9)) is None
    assert training.chance_message(run([3], 1.0)) is None
    assert training.chance_message(run([3, 3], 1.0)) is None


def test_divergence_before_any_checkpoint_does_not_claim_one(data_dir, tmp_path, fast_compile):
    with pytest.raises(train.NonFiniteLossError,
                       match="(?s)the run diverged: .*No checkpoint had been saved yet"):
        train.train_and_evaluate(config(data_dir, tmp_path, learning_rate=1e30), tmp_path / "w")
    assert checkpoint_steps(tmp_path / "w") == []


# --------------------------------------------------------------- 4. evaluation
def test_evaluate_out_dir_progress_and_interruption(finished, tmp_path, capsys):
    from gedl_jax import evaluate
    from gedl_jax.run import preemption

    _, _, reference = finished
    before = sorted(p.name for p in reference.iterdir())
    results = evaluate.evaluate_workdir(reference, results_dir=tmp_path / "out")
    assert results["workdir"] == str(reference)   # the run evaluated, not the folder of --out
    assert (tmp_path / "out" / "eval_results.json").exists()
    assert (tmp_path / "out" / "eval_table.md").exists()
    assert sorted(p.name for p in reference.iterdir()) == before   # nothing written there
    assert "evaluated test: 64 images in" in capsys.readouterr().out
    assert results["id"]["num_examples"] == 64
    preemption.request()
    try:
        # the results folder is --out here: the command, not --workdir=<that folder>, is
        # what to run again
        with pytest.raises(preemption.EvaluationInterrupted,
                           match=r"interrupted \(request\) during the evaluation: no result "
                                 r"file was written for it. Run the same command again"):
            evaluate.evaluate_workdir(reference, results_dir=tmp_path / "stopped")
    finally:
        preemption.reset()
    assert not (tmp_path / "stopped" / "eval_results.json").exists()


@pytest.mark.parametrize("vmap_seeds", [True, False])
def test_seeds_interrupted_while_evaluated_name_what_is_left(data_dir, tmp_path, monkeypatch,
                                                             fast_compile, vmap_seeds):
    """SIGTERM during the second of three seeds' evaluations: seeds trained together name
    the two left to evaluate (and the one written); seeds trained one after another say the
    third is not trained, so the command is what to run again."""
    from gedl_jax.run import preemption
    from gedl_jax.run import workdir as workdir_eval

    evaluate_and_write, calls = workdir_eval.evaluate_and_write, []

    def stopped_at_the_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            preemption.request()   # as a SIGTERM: the evaluation stops at its first batch
        return evaluate_and_write(*args, **kwargs)

    monkeypatch.setattr(workdir_eval, "evaluate_and_write", stopped_at_the_second)
    c = config(data_dir, tmp_path, seeds="0,1,2", vmap_seeds=vmap_seeds, evaluate_at_end=True)
    w = tmp_path / "w"
    try:
        with pytest.raises(preemption.EvaluationInterrupted) as stopped:
            train.run(c, w)
    finally:
        preemption.reset()
    message = str(stopped.value)
    assert (w / "seed_0" / "eval_results.json").exists()
    assert not (w / "seed_1" / "eval_results.json").exists()
    if vmap_seeds:
        assert f"checkpoints are in {w}/seed_1/checkpoints, {w}/seed_2/checkpoints" in message
        assert f"({w}/seed_0/eval_results.json written)" in message
        assert message.endswith(f"gedl_jax.evaluate --workdir={w}/seed_1 "
                                f"--workdir={w}/seed_2`"), message
    else:
        assert f"during the evaluation of {w}/seed_1: its training is complete" in message
        assert f"{w}/seed_2 is not trained yet. Run the same command again" in message
        assert not (w / "seed_2").exists()


def test_results_folder_that_cannot_be_written_is_reported_before_the_work(finished, tmp_path,
                                                                         monkeypatch):
    from gedl_jax import evaluate, files
    from gedl_jax.run import workdir

    _, _, reference = finished
    restored = []
    monkeypatch.setattr(workdir, "restore_run", lambda *a, **k: restored.append(1))
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(PermissionError, match="the results folder=.*cannot be written"):
        evaluate.evaluate_workdir(reference, results_dir=blocker / "out")
    assert restored == []
    assert files.write_text(tmp_path / "x.json", "{}").read_text() == "{}"
    assert [p.name for p in tmp_path.iterdir() if ".tmp" in p.name] == []


# --------------------------------------------------------------- a full disk loses nothing
def _no_space(*args, **kwargs):
    import errno

    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("site", ["checkpoint", "metrics", "results"])
def test_full_disk_at_each_write_site_loses_nothing(finished, tmp_path, fast_compile,
                                                    monkeypatch, site):
    """ENOSPC injected while the second epoch's checkpoint, a metrics line of the second epoch,
    or the final results are written: one clear error (exit 74 from the CLI); the previous
    checkpoint restores, and the same command, once space is back, ends bit-identical to the
    uninterrupted run."""
    import jax
    from training_fixtures import assert_same_tree

    from gedl_jax.commands import cli
    from gedl_jax.run import checkpointing, rundir, training
    from gedl_jax.run import workdir as workdir_eval

    c, full, _ = finished
    c = c.copy_and_resolve_references()
    c.evaluate_at_end = site == "results"
    workdir = tmp_path / "w"
    with monkeypatch.context() as patch:
        if site == "checkpoint":
            original = checkpointing.RunCheckpoints.save_last
            patch.setattr(checkpointing.RunCheckpoints, "save_last",
                          lambda self, step, *a: _no_space() if step == 16
                          else original(self, step, *a))
        elif site == "metrics":
            original_write = rundir.MetricsWriter.write
            patch.setattr(rundir.MetricsWriter, "write",
                          lambda self, step, *a: _no_space() if step > 8
                          else original_write(self, step, *a))
        else:
            original_text = workdir_eval.files.write_text
            patch.setattr(workdir_eval.files, "write_text",
                          lambda path, text: _no_space() if "eval_" in str(path)
                          else original_text(path, text))
        with pytest.raises(training.DiskFullError,
                           match=r"no space left on device writing .*: free some space and "
                                 r"rerun the same command to continue from the newest "
                                 r"checkpoint\n  .* free on that filesystem; the checkpoints "
                                 r"already on disk are intact \(newest: step (8|16) ") as e:
            train.train_and_evaluate(c, workdir)
    assert cli.is_write_failure(e.value) and str(e.value).count("\n") == 1
    steps = checkpoint_steps(workdir)
    assert steps and steps[-1] in (8, 16)
    again = train.train_and_evaluate(c, workdir)
    assert again["steps"] == 16
    assert_same_tree(jax.device_get(full["state"]), jax.device_get(again["state"]))
    if site == "results":
        assert (workdir / "eval_results.json").exists()


# --------------------------------------------------------------- 6. and the table itself
def test_report_names_a_corrupted_results_file(tmp_path, capsys):
    from gedl_jax.commands import report

    bad = tmp_path / "runs" / "gedl_seed0" / "eval_results.json"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"id": {"accuracy": 0.9')
    assert report.main([str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {bad} cannot be read (JSONDecodeError") and err.count("\n") == 1


def test_a_file_edited_in_place_with_its_mtime_restored_is_hashed_again(tmp_path, monkeypatch):
    """The verified-file record holds the change time: an edit of the same size whose mtime is
    put back (os.utime, `touch -d`, `cp -p`) is still hashed again, and fails the checksum."""
    import hashlib
    import os
    import time

    from gedl_jax.data import ChecksumError, FileSpec
    from gedl_jax.data import cache as cache_lib

    f = tmp_path / "t10k-labels-idx1-ubyte.gz"
    f.write_bytes(bytes(range(256)) * 8)
    spec = FileSpec(f.name, f.stat().st_size, hashlib.sha256(f.read_bytes()).hexdigest(),
                    "https://example.invalid/x", "test")
    cache_root = tmp_path / "cache"
    hashed = []
    real_sha256_file = cache_lib.sha256_file
    monkeypatch.setattr(cache_lib, "sha256_file", lambda p: hashed.append(p) or
                        real_sha256_file(p))
    cache_lib.verify_file(f, spec, cache_root)
    cache_lib.verify_file(f, spec, cache_root)
    assert len(hashed) == 1   # the record served the second check
    before = f.stat()
    time.sleep(0.05)   # past the kernel's coarse timestamp tick
    with open(f, "r+b") as handle:   # same inode, same size
        handle.seek(100)
        handle.write(b"\xff")
    os.utime(f, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = f.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == \
           (before.st_size, before.st_mtime_ns, before.st_ino)
    with pytest.raises(ChecksumError, match="checksum mismatch"):
        cache_lib.verify_file(f, spec, cache_root)
    assert len(hashed) == 2


def test_tfds_is_not_asked_about_a_dataset_it_has_no_folder_for(tmp_path, caplog):
    """A missing dataset with source='auto' used to construct TFDS builders for a folder that
    does not exist: two absl warnings ("Variant folder ... has no dataset_info.json") per
    split, on every CLI start that reached the TFDS fallback."""
    from gedl_jax import data

    pytest.importorskip("tensorflow_datasets")
    (tmp_path / "data").mkdir()
    with pytest.raises(data.MissingDataError):
        data.load_split("kmnist", "test", tmp_path / "data", tmp_path / "cache",
                        tfds_data_dir=tmp_path / "tfds", download="never")
    assert "dataset_info" not in caplog.text and "Variant folder" not in caplog.text


def test_evaluate_cli_prints_no_tfds_warning_and_one_line_for_a_missing_ood_set(finished,
                                                                               tmp_path):
    _, _, reference = finished
    proc = cli(f"--workdir={reference}", "--extra_ood=kmnist", f"--out={tmp_path}/out",
               tmp_path=tmp_path, module="gedl_jax.evaluate", TFDS_DATA_DIR=str(tmp_path / "t"))
    assert proc.returncode == 2, proc.stderr
    assert "dataset_info" not in proc.stderr and "Variant folder" not in proc.stderr
    assert len(error_lines(proc)) == 1 and "kmnist" in error_lines(proc)[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_sigterm_while_compiling_stops_within_seconds(tmp_path):
    """Python runs a signal handler only between bytecodes, so not while XLA compiles (13 s on
    a 2-core CPU here): before the first step the signal is acted on from a thread, at once;
    nothing of this command is lost (no checkpoint of it exists yet)."""
    import signal
    import time

    data = write_tiny_mnist(tmp_path / "data")
    env = subprocess_env(tmp_path / "cli_cache")
    env.pop("JAX_DISABLE_MOST_OPTIMIZATIONS")   # a real compile: seconds long
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # compiled here, not loaded from the tests' cache
    proc = subprocess.Popen(
        [sys.executable, "-u", "-m", "gedl_jax.train", f"--workdir={tmp_path}/w",
         "--config=configs/mnist.py:gedl", f"--config.data_dir={data}",
         *(f"--config.{k}={v}" for k, v in TINY_FIELDS.items())],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in proc.stdout:   # printed once the data are loaded, just before compiling
            lines.append(line)
            if "steps/epoch x" in line:
                break
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        elapsed = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 75, "".join(lines) + out
    assert elapsed < 3, f"took {elapsed:.1f} s"
    assert "preempted (SIGTERM) before the first training step" in out, out
    assert checkpoint_steps(tmp_path / "w") == []
    written = {p.name for p in (tmp_path / "w").rglob("*") if p.is_file()}
    assert written <= {"config.json", ".gedl_jax.lock"}, written   # as the message says


def _load_reproduce():
    from bin import reproduce

    return reproduce


def _one_error_line(capsys, *needles: str) -> None:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, err


def test_fetch_report_and_reproduce_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    """The argparse CLIs share gedl_jax/commands/cli.py: `error: ...`, exit 2, nothing written;
    --help exits 0 and lists what can be named."""
    from gedl_jax.commands import fetch, report
    from gedl_jax.data.registry import DATASETS

    assert fetch.main(["nope", "--data_dir", str(tmp_path / "d")]) == 2
    _one_error_line(capsys, "unknown dataset 'nope'", "known datasets")
    assert fetch.main(["mnist:valid", "--data_dir", str(tmp_path / "d")]) == 2
    _one_error_line(capsys, "mnist has splits ['train', 'test'], not 'valid'")
    assert fetch.main(["--bogus"]) == 2
    _one_error_line(capsys, "unrecognized arguments: --bogus", "--help")
    assert fetch.main([]) == 2
    _one_error_line(capsys, "name at least one dataset")
    assert fetch.main(["--help"]) == 0
    text = capsys.readouterr().out
    assert all(name in text for name in DATASETS)
    assert report.main([str(tmp_path)]) == 2
    _one_error_line(capsys, f"no eval_results.json under {tmp_path}")
    assert report.main([str(tmp_path / "absent")]) == 2
    _one_error_line(capsys, "is not a directory")
    assert report.main(["--bogus", str(tmp_path)]) == 2
    _one_error_line(capsys, "unrecognized arguments")

    reproduce = _load_reproduce()
    out = tmp_path / "out"
    for args, needles in [
        (["--study=nope"], ["invalid choice: 'nope'"]),
        (["--setting=medum"], ["invalid choice: 'medum'"]),
        (["--variants=gedl,foo"], ["['foo'] not in the main study; its runs: ['gedl'"]),
        (["--seeds=1,x"], ["--seeds=1,x: 'x' is not an integer or a range"]),
        (["--seeds=1,1"], ["none twice"]),
        (["--override=batch_sise=3"], ["expected field=value with a config field"]),
        (["--override=learning_rate=abc"], ["could not convert string to float: 'abc'"]),
        (["--override=learning_rate=-1"], ["config.learning_rate=-1.0 must be > 0"]),
    ]:
        assert reproduce.main([f"--out={out}", *args]) == 2, args
        _one_error_line(capsys, *needles)
        assert not out.exists()
    assert reproduce.main([]) == 2
    _one_error_line(capsys, "--out")
    assert reproduce.main(["--help"]) == 0
    text = capsys.readouterr().out
    for study, make in reproduce.STUDIES.items():
        assert f"  {study}: {', '.join(run[0] for run in make())}" in text
    assert all(f"  {name}: " in text for name in reproduce.SETTINGS)
    assert "old names: full = paper, quick = short" in text


def test_reproduce_script_exit_status_and_debug(tmp_path):
    """The script itself (sys.exit of main): exit 2 without a traceback; GEDL_DEBUG=1 adds it."""
    def run(**env):
        return subprocess.run([sys.executable, str(REPO / "bin" / "reproduce.py"),
                               f"--out={tmp_path}/out", "--variants=nope"], cwd=REPO,
                              env=subprocess_env(tmp_path / "c", **env), capture_output=True,
                              text=True, timeout=120)

    proc = run()
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert error_lines(proc) == [line for line in proc.stderr.splitlines() if line.strip()]
    proc = run(GEDL_DEBUG="1")
    assert proc.returncode == 2 and "Traceback" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()
