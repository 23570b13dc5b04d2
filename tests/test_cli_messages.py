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

from gedl_jax import configs, data
from gedl_jax.commands import cli
from gedl_jax.commands import train as command
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
    assert command.results_line("runs/a", evaluated[:1]) == \
        "results: runs/a/seed_0/eval_results.json"
    assert command.results_line("runs/a", evaluated).endswith(
        "the 2 seeds' table: runs/a/eval_table.md")
    assert command.results_line("runs/b", [{"workdir": "runs/b"}]).startswith(
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
    assert configs.build_config("mnist", "gedl,quick").allow_chance
    assert not configs.build_config("mnist", "gedl").allow_chance


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


def test_out_of_memory_says_what_to_lower_not_a_crash(capsys):
    """XLA's RESOURCE_EXHAUSTED (a real one: an allocation no machine has) and NumPy's
    MemoryError are exit 2 with one error line naming the allocation and the settings to lower,
    then detail lines (the allocation's whole line, what to lower when); another runtime error
    is still a crash."""
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
        assert lines[0].startswith(f"error: out of {where} memory ("), err
        assert "--config.batch_size" in lines[0] and "--config.eval_batch_size" in lines[0]
        assert all(line.startswith("  ") for line in lines[1:]), err
        assert max(map(len, lines)) < cli.MAX_LINE, err
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


def test_without_config_the_train_command_trains_the_main_jobs_config():
    main = command.MAIN_JOB_CONFIG
    assert main == "configs/mnist.py"
    assert command.with_default_config(["train"]) == ["train", f"--config={main}"]
    assert command.with_default_config(["train", "--config.learning_rate=0.003", "--workdir=w"]) \
        == ["train", f"--config={main}", "--config.learning_rate=0.003", "--workdir=w"]
    for named in (["train", "--config=mnist:edl"], ["train", "--config", "cifar10"],
                  ["train", "--workdir=w", "--config=x.py", "--config.seed=1"]):
        assert command.with_default_config(named) == named


def test_the_first_tweak_trains_the_main_job_with_it(tmp_path):
    """`bin/train --config.learning_rate=0.003` (bin/train passes its arguments through): the
    main job's config with that field changed, not "Unknown command line flag"."""
    import json

    from training_fixtures import TINY_FIELDS, write_tiny_mnist

    data_dir = write_tiny_mnist(tmp_path / "data")
    fields = {**TINY_FIELDS, "num_epochs": 1, "learning_rate": 0.003, "data_dir": data_dir}
    proc = subprocess.run([sys.executable, "-m", "gedl_jax.train", f"--workdir={tmp_path / 'w'}",
                           *(f"--config.{k}={v}" for k, v in fields.items())], cwd=REPO,
                          env=subprocess_env(tmp_path / "cache"), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"config: {command.MAIN_JOB_CONFIG} (the main job" in proc.stdout, proc.stdout
    saved = json.loads((tmp_path / "w" / "config.json").read_text())
    main_job = configs.build_config("mnist", "gedl")
    assert (saved["dataset"], saved["variant"], saved["learning_rate"]) == ("mnist", "gedl", 0.003)
    assert saved["num_epochs"] == 1 and main_job.num_epochs == 200


# ------------------------------------------------------------------- the length of error lines
_PLACEHOLDER = "\0" * 20   # a value put into a message: a path, a number, a name


def _rendered(node) -> str | None:
    """The text a string expression builds (a constant, an f-string, `+`, a conditional: the
    longer branch), each value put in as `_PLACEHOLDER`; None for anything else."""
    import ast

    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else
                       (_rendered(v.value) or _PLACEHOLDER) for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _rendered(node.left), _rendered(node.right)
        return None if left is None and right is None else \
            (left or _PLACEHOLDER) + (right or _PLACEHOLDER)
    if isinstance(node, ast.IfExp):
        branches = [t for t in (_rendered(node.body), _rendered(node.orelse)) if t is not None]
        return max(branches, key=len) if branches else None
    return None


def _error_texts() -> list[tuple[str, str]]:
    """(where, text) of every message gedl_jax gives an exception (`...Error(<text>, ...)`,
    raised or returned) and of what its `*message*` functions and the CLI module return."""
    import ast

    found = set()
    for path in sorted((REPO / "gedl_jax").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for function in ast.walk(tree):
            for node in ast.walk(function):
                text = None
                if isinstance(node, ast.Call) and node.args:
                    name = getattr(node.func, "id", getattr(node.func, "attr", ""))
                    if name.endswith(("Error", "Exception", "Interrupted")):
                        text = _rendered(node.args[0])
                elif isinstance(node, ast.Return) and node.value is not None and isinstance(
                        function, ast.FunctionDef) and ("message" in function.name
                                                        or path.name == "cli.py"):
                    text = _rendered(node.value)
                if text is not None:
                    found.add((f"{path.relative_to(REPO)}:{node.lineno}", text))
    return sorted(found)


def _printed_lines(text: str) -> list[str]:
    """The lines a command prints for an error message (`cli.error_text`); a line that begins
    with a value put in is a detail line (the value is indented: a list of files, say)."""
    text = "\n".join("  " + line if line.startswith(_PLACEHOLDER) else line
                     for line in text.split("\n"))
    return cli.error_text(text).split("\n")


def test_no_error_text_of_the_package_has_a_line_over_200_characters():
    """Every message gedl-jax gives an error, with each value it puts in 20 characters long, as
    the CLI prints it: one line, or a first line with the cause and the way out and indented
    detail lines (the files a run lacks, the names it knows). None over `cli.MAX_LINE`."""
    texts = _error_texts()
    assert len(texts) > 400
    too_long = [f"{where}: {len(line)}: {line[:80]}..." for where, text in texts
                for line in _printed_lines(text) if len(line) >= cli.MAX_LINE]
    assert too_long == [], "\n".join(too_long)


def test_the_check_of_error_lines_can_fail():
    one = "a" * 150 + "{x}" + "b" * 40
    assert max(map(len, _printed_lines(one.replace("{x}", _PLACEHOLDER)))) >= cli.MAX_LINE
    detailed = "cause: what to do\n" + "\n".join(f"  {_PLACEHOLDER * 3} {i}" for i in range(9))
    assert max(map(len, _printed_lines(detailed))) < cli.MAX_LINE
    collapsed = "cause\nmore text, not indented: one line\n  " + "c" * 150
    assert _printed_lines(collapsed) == [" ".join(collapsed.split())]


def test_the_first_command_offline_says_the_way_out_first_then_the_files(monkeypatch):
    """The main job on a machine without the data and without a network: the first line says
    what is wrong and the one variable or command that fixes it; the files follow, a line each;
    no line is over 200 characters (it was one line of 2,030)."""
    import pathlib

    monkeypatch.setenv("GEDL_OFFLINE", "1")
    folder = pathlib.Path("no_such_folder_as_long_as_a_home/.cache/gedl_jax/data")
    assert not folder.exists()
    with pytest.raises(data.MissingDataError) as missing:
        data.ensure_available([("mnist", "train"), ("mnist", "test"), ("kmnist", "test"),
                               ("fashion_mnist", "test")], data_dir=folder)
    first, *details = cli.error_text(missing.value).split("\n")
    assert first.startswith(f"the data folder {folder} (from data_dir) does not exist, and "
                            f"downloads are off: set $GEDL_DATA_DIR to a folder with these "
                            f"files, or fetch them:"), first
    assert details[0] == ("  python -m gedl_jax.data.fetch --data_dir=DIR mnist:train,test "
                          "kmnist:test fashion_mnist:test   (where there is a network)")
    assert any(line.startswith("    train-images-idx3-ubyte.gz  9,912,422 bytes  https://")
               for line in details), details
    assert f"  mnist (train, test), in {folder / 'mnist'}:" in details
    assert "$GEDL_OFFLINE is set" in details[-1]
    assert max(len(line) for line in [first, *details]) < cli.MAX_LINE


def test_the_chance_line_names_the_option_only_where_it_is_not_set(capsys):
    """At chance level: without allow_chance an error that names it (exit 3); with it set a
    warning that does not tell the user to set it again (it did)."""
    message = "runs/w ended at chance level: best validation accuracy 0.0938 (...)"
    results = [{"at_chance": message}]
    for allowed, status, line in (
            (False, cli.EXIT_DIVERGED,
             f"error: {message}, or --config.allow_chance=True if this is intended"),
            (True, cli.EXIT_OK, f"warning: {message}")):
        c = configs.build_config("mnist", "gedl")
        c.allow_chance = allowed
        assert command._exit_status(c, results) == status
        assert capsys.readouterr().err == line + "\n"
    import types

    import numpy as np

    from gedl_jax.run import training

    labels = np.arange(100) % 10
    run = types.SimpleNamespace(best_accuracy=0.1, workdir="runs/w",
                                config=types.SimpleNamespace(num_classes=10),
                                experiment=types.SimpleNamespace(data=types.SimpleNamespace(
                                    validation=types.SimpleNamespace(labels=labels))))
    said = training.chance_message(run)
    assert said.startswith("runs/w ended at chance level") and "allow_chance" not in said
