"""Read-only folders on a real read-only filesystem (a tmpfs remounted read-only: root ignores
permission bits): a workdir, a finished run's workdir, a results folder and a data cache that
cannot be written are each one `error:` line naming the folder, exit 2, before any work; and a
finished run started again writes nothing it need not write."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from filesystems import folder_that_can_be_made_read_only, read_only, small_filesystem
from training_fixtures import (
    REPO,
    assert_same_tree,
    checkpoint_steps,
    cli_args,
    saved_state,
    subprocess_env,
    write_tiny_mnist,
)

from gedl_jax import config as config_lib
from gedl_jax import configs, train


def _one_error_line(proc: subprocess.CompletedProcess, *expected: str) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == errors[0]
    for text in expected:
        assert text in errors[0], errors[0]
    assert "epoch" not in proc.stdout, proc.stdout   # before any work
    return errors[0]


def test_read_only_workdir_results_folder_and_data_cache(tmp_path):
    data_dir = write_tiny_mnist(tmp_path / "data")
    env = subprocess_env(tmp_path / "cache")

    def run(*args, **extra_env):
        return subprocess.run(list(args), cwd=REPO, env={**env, **extra_env},
                              capture_output=True, text=True, timeout=240)

    with folder_that_can_be_made_read_only(tmp_path / "fs") as fs:
        finished = fs / "finished"
        proc = run(*cli_args(finished, data_dir, num_epochs=1, allow_chance=True))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        before = sorted(p.relative_to(fs) for p in fs.rglob("*"))
        with read_only(fs):
            _one_error_line(run(*cli_args(finished, data_dir, num_epochs=1, allow_chance=True)),
                            f"--workdir={finished} cannot be written", "give a folder you can")
            _one_error_line(run(*cli_args(fs / "new", data_dir)),
                            f"--workdir={fs / 'new'} cannot be written")
            _one_error_line(run(sys.executable, "-m", "gedl_jax.evaluate",
                                f"--workdir={finished}"),
                            f"the results folder={finished} cannot be written")
            _one_error_line(run(*cli_args(tmp_path / "w", data_dir), GEDL_CACHE_DIR=str(fs / "c")),
                            f"the data cache (config.cache_dir, else $GEDL_CACHE_DIR)={fs / 'c'} "
                            f"cannot be written")
        assert sorted(p.relative_to(fs) for p in fs.rglob("*")) == before
    assert not (tmp_path / "w").exists()


def test_a_finished_run_started_again_writes_nothing_it_need_not(tmp_path, fast_compile):
    data_dir = write_tiny_mnist(tmp_path / "data")
    c = configs.build_config("mnist", "gedl")
    config_lib.set_fields(c, train_examples=64, val_examples=32, batch_size=32, num_epochs=1,
                             eval_batch_size=64, evaluate_at_end=False, plots=False,
                             ood_datasets="", data_dir=str(data_dir),
                             cache_dir=str(tmp_path / "cache"))
    workdir = tmp_path / "w"
    train.train_and_evaluate(c, workdir)
    before = {p: p.stat().st_mtime_ns for p in workdir.rglob("*") if p.is_file()}
    again = train.train_and_evaluate(c, workdir)
    assert again["steps"] == 2
    assert {p: p.stat().st_mtime_ns for p in workdir.rglob("*") if p.is_file()} == before


FULL_DISK_FIELDS = dict(num_epochs=4, allow_chance=True)   # 8 steps an epoch, a line every 4


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """(data_dir, env, the workdir of an uninterrupted run of FULL_DISK_FIELDS)."""
    root = tmp_path_factory.mktemp("full_disk")
    data_dir = write_tiny_mnist(root / "data")
    env = subprocess_env(root / "cache")
    reference = subprocess.run(cli_args(root / "reference", data_dir, **FULL_DISK_FIELDS),
                               cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert reference.returncode == 0, reference.stdout + reference.stderr
    return data_dir, env, root / "reference"


def _error_and_details(stderr: str) -> list[str]:
    """The `error:` line and the detail lines under it, which end what the command printed."""
    lines = stderr.strip().splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("error:"))
    assert all(line.startswith("  ") for line in lines[start + 1:]), stderr
    return lines[start:]


def test_a_real_full_disk_is_one_line_and_the_rerun_ends_identical(uninterrupted, tmp_path):
    """A 7 MB tmpfs holds the first epoch's two checkpoints (2.8 MB each) but not the second
    epoch's: exit 74 before the third epoch ends (the failed save is seen at the next progress
    line), the progress lines and then at most a few lines (ours), none of the checkpoint
    library's hundreds; with space back, the same command ends with the parameters of an
    uninterrupted run."""
    data_dir, env, reference = uninterrupted
    with small_filesystem(tmp_path / "fs", size="7m") as fs:
        args = cli_args(fs / "w", data_dir, **FULL_DISK_FIELDS)
        full = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=240)
        assert full.returncode == 74, full.stdout + full.stderr
        assert "epoch 3: validation" not in full.stdout, full.stdout
        # stderr: the data loader's two warnings on these unregistered files, then ours only
        ours = [line for line in full.stderr.strip().splitlines()
                if not line.startswith("WARNING:gedl_jax.data.loading")]
        assert len(ours) <= 5, full.stderr
        assert "Traceback" not in full.stderr and "ERROR:absl" not in full.stderr, full.stderr
        error, *details = _error_and_details(full.stderr)
        assert error.startswith(f"error: no space left on device writing {fs / 'w'}"), error
        assert "rerun the same command" in error and " free on that filesystem" in details[0]
        subprocess.run(["mount", "-o", "remount,size=64m", str(fs)], check=True, timeout=30)
        resumed = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True,
                                 timeout=240)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        assert "resumed from" in resumed.stdout
        assert checkpoint_steps(fs / "w") == checkpoint_steps(reference)
        assert_same_tree(saved_state(fs / "w")[0], saved_state(reference)[0])


def test_a_failed_save_stops_the_run_within_an_epoch_and_the_rerun_resumes_from_best(
        uninterrupted, tmp_path):
    """`checkpoints/last` on a tmpfs of its own too small for one checkpoint: epoch 1's `last`
    save fails in the background while its `best` is saved complete. The run stops at its next
    progress line, before epoch 2 ends (it used to train all of epoch 2 and fail at that
    epoch's save), exit 74, naming where the write failed and the space left; with space back
    the same command resumes from `best` at step 8 (it used to start again from step 0) and
    ends with the parameters of an uninterrupted run."""
    data_dir, env, reference = uninterrupted
    workdir = tmp_path / "w"
    args = cli_args(workdir, data_dir, **FULL_DISK_FIELDS)
    with small_filesystem(workdir / "checkpoints" / "last", size="1m") as last:
        full = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=240)
        assert full.returncode == 74, full.stdout + full.stderr
        assert "epoch 1: validation" in full.stdout and "epoch 2: validation" not in full.stdout
        error, *details = _error_and_details(full.stderr)
        assert error.startswith("error: no space left on device writing "), error
        assert " free on that filesystem" in details[0], details
        assert "newest: step 8 (best)" in details[0], details
        assert checkpoint_steps(workdir) == [] and checkpoint_steps(workdir, "best") == [8]
        subprocess.run(["mount", "-o", "remount,size=64m", str(last)], check=True, timeout=30)
        resumed = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True,
                                 timeout=240)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        assert f"resumed from {workdir}/checkpoints/best at step 8" in resumed.stdout
        assert checkpoint_steps(workdir) == checkpoint_steps(reference)
        assert_same_tree(saved_state(workdir)[0], saved_state(reference)[0])


def test_only_write_failure_tracebacks_are_held_back():
    import io
    import logging

    from gedl_jax.commands import cli

    other = "Traceback (most recent call last):\n  File \"x.py\", line 1\nKeyError: 'a'\n"
    closed = ("Traceback (most recent call last):\n  File \"base_events.py\", line 874\n"
              "RuntimeError: Event loop is closed\n")
    full = "Traceback (most recent call last):\n  File \"y.py\"\nOSError: No space left on device\n"
    # two threads' "Event loop is closed" tracebacks, interleaved line by line
    a, b = closed.splitlines(keepends=True), closed.splitlines(keepends=True)
    interleaved = "".join(x + y for x, y in zip(a, b))
    # one of them interleaved with a traceback that must be printed
    mixed = "".join(x + y for x, y in zip(a, other.splitlines(keepends=True)))

    class RaisesWhenCollected:
        def __init__(self, error):
            self.error = error

        def __del__(self):
            raise self.error

    sink, records = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(records)
    logging.getLogger("absl").addHandler(handler)
    real_stderr, real_unraisable_hook, unraisable = sys.stderr, sys.unraisablehook, []
    sys.stderr, sys.unraisablehook = sink, unraisable.append
    try:
        with cli.quiet_write_failures():
            for text in ("progress 1\n", closed[:20], closed[20:], other, full, interleaved,
                         "partial"):
                sys.stderr.write(text)
            RaisesWhenCollected(RuntimeError("Event loop is closed"))   # unraisable: dropped
            RaisesWhenCollected(OSError(28, "No space left on device"))
            RaisesWhenCollected(ValueError("kept"))   # passed on to the hook before ours
            sys.stderr.write(mixed)
            logging.getLogger("absl").error("Save failed: [os_error_code='28'] ...")
            logging.getLogger("absl").error("something else broke")
    finally:
        sys.stderr, sys.unraisablehook = real_stderr, real_unraisable_hook
        logging.getLogger("absl").removeHandler(handler)
    assert sink.getvalue() == "progress 1\n" + other + "partial" + mixed
    assert [str(args.exc_value) for args in unraisable] == ["kept"]
    assert records.getvalue() == "something else broke\n"


def test_after_a_failed_write_the_librarys_leftovers_stay_quiet():
    """asyncio reports a failed save's task as it is collected, after the command's error line:
    once a command ends in a failed write, the filters stay; after any other end, they go."""
    import io
    import logging

    from gedl_jax.commands import cli

    asyncio_logger = logging.getLogger("asyncio")
    records = io.StringIO()
    handler = logging.StreamHandler(records)
    asyncio_logger.addHandler(handler)
    loggers = [logging.getLogger(name) for name in ("absl", "asyncio", "orbax")]
    filters = [list(logger.filters) for logger in loggers]
    hooks = (threading.excepthook, sys.unraisablehook)
    full = OSError(28, "No space left on device")
    try:
        with pytest.raises(KeyError), cli.quiet_write_failures():
            raise KeyError("not a write")
        assert [logger.filters for logger in loggers] == filters
        assert (threading.excepthook, sys.unraisablehook) == hooks
        with pytest.raises(OSError), cli.quiet_write_failures():
            raise full
        asyncio_logger.error("Task exception was never retrieved",
                             exc_info=(OSError, full, None))
        asyncio_logger.error("something else")
    finally:
        asyncio_logger.removeHandler(handler)
        for logger, kept in zip(loggers, filters):
            logger.filters[:] = kept
        threading.excepthook, sys.unraisablehook = hooks
    assert records.getvalue() == "something else\n"
