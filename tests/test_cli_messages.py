"""What a command says while it works and when it ends: no wait of more than a few seconds
without a line (data loading, XLA compiling), each evaluated set's own size, the path of the
results as the last line, and one readable line for a bad boolean, a data folder that is a file,
or a warning of gedl_jax's own."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import warnings

import jax
import jax.numpy as jnp
import pytest
from training_fixtures import REPO, subprocess_env

from gedl_jax import cli, configuration, data, train
from gedl_jax.run import heartbeat


def test_a_slow_wait_is_announced_while_it_runs_and_a_quick_one_is_not(capsys):
    with heartbeat.announced("loading something", after=0.05):
        time.sleep(0.3)
    with heartbeat.announced("quick thing", after=5.0):
        pass
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "loading something ..."
    # the time it took (at least the 0.3 s slept; more on a busy machine)
    took = re.fullmatch(r"loading something: done in (\d+\.\d) s", out[1])
    assert took and float(took.group(1)) >= 0.3, out[1]
    assert len(out) == 2


def test_a_compilation_is_announced_with_its_time(capsys):
    def never_compiled_before(x):
        return jnp.sin(x) * 3.0 + jnp.cos(x) ** 2

    with heartbeat.compilations_announced(after=0.0):
        jax.jit(never_compiled_before)(jnp.ones(7)).block_until_ready()
    out = capsys.readouterr().out
    assert "compiling jit(never_compiled_before) (XLA; once per command) ..." in out
    assert "compiling jit(never_compiled_before) (XLA; once per command): done in" in out
    jax.jit(lambda x: x + 1)(jnp.ones(3))   # the listeners are gone after the block
    assert capsys.readouterr().out == ""


def test_the_last_line_names_the_results():
    evaluated = [{"workdir": "runs/a/seed_0", "evaluation": {}},
                 {"workdir": "runs/a/seed_1", "evaluation": {}}]
    assert train.results_line("runs/a", evaluated[:1]) == \
        "results: runs/a/seed_0/eval_results.json"
    assert train.results_line("runs/a", evaluated).endswith(
        "the 2 seeds' table: runs/a/eval_table.md")
    assert train.results_line("runs/b", [{"workdir": "runs/b"}]).startswith(
        "checkpoints in runs/b (no evaluation")


def test_a_bad_boolean_is_one_readable_line():
    error = ValueError("flag --config.plots=maybe: ('Non-boolean argument to boolean flag', "
                       "'maybe')")
    assert cli.one_line(error) == ("flag --config.plots=maybe: 'maybe' is not a boolean: use "
                                   "true or false")


def test_a_data_folder_that_is_a_file_says_so(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(data.DataError, match=r"is a file, not a folder"):
        data.ensure_available([("mnist", "test")], data_dir=tmp_path / "file",
                              download="never")


def test_a_warning_of_gedl_jax_is_one_line(capsys):
    with cli.warnings_as_lines():
        warnings.warn_explicit("the fitted scale 100 lies on the search bound [0.01, 100]",
                               RuntimeWarning, "/x/gedl_jax/evaluation/calibration.py", 165)
    err = capsys.readouterr().err
    assert err == "warning: the fitted scale 100 lies on the search bound [0.01, 100]\n"


def test_quick_runs_warn_at_chance_instead_of_failing():
    assert configuration.build_config("mnist", "gedl,quick").allow_chance
    assert not configuration.build_config("mnist", "gedl").allow_chance


def test_evaluate_help_shows_the_npz_form_of_ood(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "gedl_jax.evaluate", "--help"], cwd=REPO,
                          env=subprocess_env(tmp_path), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and "npz:<path>" in proc.stdout, proc.stdout + proc.stderr


def test_a_long_evaluation_set_says_where_it_is_every_few_seconds(monkeypatch, capsys):
    """Inside one evaluated set, a line at most every QUIET_SECONDS (here: every batch), none
    after its last batch (the set's own line follows)."""
    import numpy as np

    from gedl_jax import data
    from gedl_jax.run import workdir

    monkeypatch.setattr(workdir._EvalProgress, "QUIET_SECONDS", 0.0)
    split = data.Split(np.zeros((10, 2, 2, 1), np.uint8), np.zeros(10, np.int32), "x")
    progress = workdir._EvalProgress({"kmnist": split}, "w", trained=False)
    on_batch = progress.batch("kmnist")
    for done in (1, 2, 3):
        on_batch(done, 3)
    progress.done("kmnist")
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(",")[0] for line in lines[:2]] == ["evaluating kmnist: batch 1/3",
                                                          "evaluating kmnist: batch 2/3"]
    assert lines[2].startswith("evaluated kmnist: 10 images in") and len(lines) == 3
    # The post-hoc scores' second pass says which stage it is, with the time left.
    progress = workdir._EvalProgress({"train (the fit)": split, "test": split}, "w",
                                     trained=False, stage="post-hoc scores")
    progress.done("train (the fit)")
    progress.done("test")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("post-hoc scores: evaluated train (the fit): 10 images in")
    assert "1 set(s) left, ETA" in lines[0]
    assert lines[1].startswith("post-hoc scores: evaluated test: 10 images in")


def test_out_of_memory_is_one_line_that_says_what_to_lower_not_a_crash(capsys):
    """XLA's RESOURCE_EXHAUSTED (a real one: an allocation no machine has) and NumPy's
    MemoryError are exit 2 with one line naming the allocation and the settings to lower;
    another runtime error is still a crash."""
    def device_oom():
        jnp.zeros((2**50,), jnp.uint8).block_until_ready()

    def host_oom():
        import numpy as np

        np.zeros((2**46, 28, 28), np.uint8)

    def wrapped():
        try:
            device_oom()
        except RuntimeError as e:
            raise ValueError("evaluating the test set failed") from e

    for body, where in ((device_oom, "device"), (host_oom, "host"), (wrapped, "device")):
        assert cli.guarded(lambda b=body: b() or 0, debug=False) == cli.EXIT_BAD_INPUT
        err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: out of {where} memory ("), err
        assert "--config.batch_size" in lines[0] and "--config.eval_batch_size" in lines[0]
        assert "Traceback" not in err
    assert "RESOURCE_EXHAUSTED" in cli.out_of_memory(_raised(device_oom))
    assert cli.out_of_memory(RuntimeError("INTERNAL: something else")) is None

    def crash():
        raise RuntimeError("INTERNAL: something else")

    assert cli.guarded(crash, debug=False) == cli.EXIT_CRASH
    assert "a crash" in capsys.readouterr().err


def _raised(body) -> BaseException:
    try:
        body()
    except BaseException as e:  # noqa: BLE001
        return e
    raise AssertionError("no error")


def test_a_training_run_out_of_memory_exits_2_with_one_line(tmp_path):
    from training_fixtures import cli_args, write_tiny_mnist

    args = cli_args(tmp_path / "w", write_tiny_mnist(tmp_path / "data"), eval_batch_size=2**36)
    proc = subprocess.run(args, cwd=REPO, env=subprocess_env(tmp_path / "cache"),
                          capture_output=True, text=True, timeout=300)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr
    # which allocation fails first is the backend's: on a CPU the host's (NumPy's MemoryError),
    # on a GPU the device's (XLA's RESOURCE_EXHAUSTED, before any host copy of the batch)
    first = ("host memory (Unable to allocate" if jax.default_backend() == "cpu"
             else "device memory (RESOURCE_EXHAUSTED")
    assert errors[0].startswith(f"error: out of {first}"), errors[0]
    assert "Traceback" not in proc.stderr
