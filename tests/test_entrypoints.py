"""The two commands of the README's Quick start, `bin/train` and `bin/test`, from a fresh clone.

Each sets `.venv` up through `bin/setup.sh --if-needed` when it is missing or out of date (its
constraints file or pyproject.toml's [project] table changed since the record a finished setup
writes, `.venv/.gedl-setup-stamp`), saying so in one line, then runs `python -m gedl_jax.train` /
`python -m pytest` with the venv's Python, the arguments passed through.

- Default suite: the scripts in a temporary folder with a stand-in interpreter that logs
  `-m venv`, `-m pip` and the module it would run instead of doing them (everything else, the
  record of the setup and the "ready" line included, runs the real Python). Nothing is
  installed; what the scripts decide and in which order is checked.
- `network`: both commands from a copy of the tracked files with no `.venv`, installing from the
  package index this machine has (about 2 minutes; skipped with the reason where none answers):
  `bin/test` on one test file, then `bin/train` on generated `.npz` data, interrupted after its
  first epoch, starting at once.
- The README's Quick start and CI: `.ci/run` runs the README's test command as written.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
from own_fixtures import write_image_data

from gedl_jax.run import preemption

REPO = pathlib.Path(__file__).resolve().parents[1]
VERSION = "{}.{}".format(*sys.version_info[:2])
# As the session found it, before the tests' private cache replaces it: pip's cache, where a clone
# on this machine would find the wheels it downloaded before.
USER_CACHE_HOME = os.environ.get("XDG_CACHE_HOME")
CONSTRAINTS = f"requirements/constraints-py{VERSION}.txt"

# A Python that logs what it would install or run (FAKE_LOG; a run's arguments shell-quoted)
# and runs everything else for real.
FAKE_PYTHON = """#!/usr/bin/env bash
if [ "$1" = -m ] && [ "$2" = venv ]; then
  echo "venv ${*:3}" >> "$FAKE_LOG"
  dir="${@: -1}"; mkdir -p "$dir/bin"; cp "$0" "$dir/bin/python"; exit 0
elif [ "$1" = -m ] && [ "$2" = pip ]; then
  echo "pip ${*:3}" >> "$FAKE_LOG"; sleep "${FAKE_PIP_SECONDS:-0}"; exit 0
elif [ "$1" = -m ] && { [ "$2" = gedl_jax.train ] || [ "$2" = pytest ]; }; then
  { printf run; printf ' %q' "${@:2}"; echo; } >> "$FAKE_LOG"; exit 0
fi
exec REAL_PYTHON "$@"
"""


class Checkout:
    """A folder with the setup scripts, pyproject.toml and a constraints file for this Python."""

    def __init__(self, root: pathlib.Path):
        self.root = root
        for path in ("bin/setup.sh", "bin/train", "bin/test", "pyproject.toml"):
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / path, root / path)
        (root / CONSTRAINTS).parent.mkdir(parents=True, exist_ok=True)
        (root / CONSTRAINTS).write_text("numpy==2.0.0\n")
        self.python = root / "python_stand_in"
        self.python.write_text(FAKE_PYTHON.replace("REAL_PYTHON", sys.executable))
        self.python.chmod(0o755)
        self.log = root / "log.txt"
        self.env = {**os.environ, "PYTHON": str(self.python), "FAKE_LOG": str(self.log),
                    "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu"}
        for name in ("GEDL_VENV", "GEDL_EXTRAS"):
            self.env.pop(name, None)

    def run(self, *args: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", *args], cwd=self.root, env={**self.env, **env},
                              capture_output=True, text=True, timeout=120)

    def logged(self) -> list[str]:
        """What the stand-in was asked to do since the last call."""
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        self.log.unlink(missing_ok=True)
        return lines


def _setup_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stdout.splitlines() if line.startswith("setup:")]


@pytest.fixture
def checkout(tmp_path) -> Checkout:
    return Checkout(tmp_path / "clone")


def test_a_fresh_checkout_is_set_up_once_in_one_line_then_starts_at_once(checkout):
    first = checkout.run("bin/test")
    assert first.returncode == 0, first.stdout + first.stderr
    [line] = _setup_lines(first)
    assert line.startswith("setup: .venv does not exist: installing gedl-jax[dev] into .venv "
                           f"with Python {VERSION} ")
    assert line.endswith(f"and {CONSTRAINTS}, 1.5-2.5 minutes on a 2-core CPU ..."), line
    assert re.search(r"gedl-jax \S+ ready: Python ", first.stdout), first.stdout
    assert checkout.logged() == [
        "venv .venv", "pip install -q --upgrade pip",
        f"pip install -q -c {CONSTRAINTS} -e .[dev]", "run pytest -q -n 2"]
    assert checkout.run("bin/setup.sh", "--check").returncode == 0

    again = checkout.run("bin/train")   # the main job: gedl_jax.train's default config
    assert again.returncode == 0 and again.stdout == "", again.stdout + again.stderr
    assert checkout.logged() == ["run gedl_jax.train"]


def test_arguments_pass_through_without_the_defaults(checkout):
    checkout.run("bin/setup.sh")
    checkout.logged()
    checkout.run("bin/train", "--config=configs/cifar10.py", "--workdir=runs/a b")
    checkout.run("bin/train", "--config.learning_rate=0.003")   # the main job, tweaked
    checkout.run("bin/test", "-k", "resume")
    # --help is the command's (tests/test_command_lines.py walks the commands themselves)
    checkout.run("bin/train", "--help")
    checkout.run("bin/test", "--help")
    assert checkout.logged() == [
        r"run gedl_jax.train --config=configs/cifar10.py --workdir=runs/a\ b",
        "run gedl_jax.train --config.learning_rate=0.003", "run pytest -k resume",
        "run gedl_jax.train --help", "run pytest --help"]


def test_a_changed_constraints_file_sets_the_venv_up_again_in_place_with_its_extras(checkout):
    assert checkout.run("bin/setup.sh", GEDL_EXTRAS="dev,cuda12").returncode == 0
    checkout.logged()
    (checkout.root / CONSTRAINTS).write_text("numpy==2.0.1\n")
    check = checkout.run("bin/setup.sh", "--check")
    assert check.returncode == 1
    assert check.stdout == (f"setup: .venv is out of date: {CONSTRAINTS} changed since it was "
                            "set up\n")

    proc = checkout.run("bin/train", "--config=configs/mnist.py:quick")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [line] = _setup_lines(proc)
    assert line.startswith(f"setup: .venv is out of date: {CONSTRAINTS} changed since it was set "
                           "up: installing gedl-jax[dev,cuda12] into .venv"), line
    assert checkout.logged() == [
        "venv .venv", "pip install -q --upgrade pip",
        f"pip install -q -c {CONSTRAINTS} -e .[dev,cuda12]",
        "run gedl_jax.train --config=configs/mnist.py:quick"]
    assert checkout.run("bin/setup.sh", "--check").returncode == 0


def test_other_extras_asked_for_set_the_venv_up_again(checkout):
    checkout.run("bin/setup.sh")
    assert checkout.run("bin/setup.sh", "--check", GEDL_EXTRAS="dev").returncode == 0
    check = checkout.run("bin/setup.sh", "--check", GEDL_EXTRAS="dev,cuda12")
    assert (check.returncode, check.stdout) == (
        1, "setup: .venv was set up with the extras [dev], not [dev,cuda12]\n")
    checkout.logged()
    proc = checkout.run("bin/test", GEDL_EXTRAS="dev,cuda12")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert checkout.logged()[2] == f"pip install -q -c {CONSTRAINTS} -e .[dev,cuda12]"
    assert checkout.run("bin/setup.sh", "--check").returncode == 0


def test_only_the_dependencies_in_pyproject_make_the_venv_out_of_date(checkout):
    checkout.run("bin/setup.sh")
    pyproject = checkout.root / "pyproject.toml"
    text = pyproject.read_text()
    pyproject.write_text(text.replace('addopts = "-ra"', 'addopts = "-ra -v"'))
    assert checkout.run("bin/setup.sh", "--check").returncode == 0
    pyproject.write_text(text.replace("dependencies = [", 'dependencies = [\n  "six",', 1))
    check = checkout.run("bin/setup.sh", "--check")
    assert (check.returncode, check.stdout) == (
        1, "setup: .venv is out of date: the dependencies in pyproject.toml changed since it "
           "was set up\n")


def test_a_venv_whose_setup_did_not_finish_is_set_up_again(checkout):
    checkout.run("bin/setup.sh")
    (checkout.root / ".venv/.gedl-setup-stamp").unlink()
    checkout.logged()
    proc = checkout.run("bin/test", "-x")
    [line] = _setup_lines(proc)
    assert line.startswith("setup: .venv has no record of a finished setup: installing"), line
    assert checkout.logged()[-1] == "run pytest -x"
    shutil.rmtree(checkout.root / ".venv/bin")
    check = checkout.run("bin/setup.sh", "--check")
    assert (check.returncode, check.stdout) == (1, "setup: .venv/bin/python is missing\n")


def test_another_venv_path_and_setup_alone(checkout):
    """GEDL_VENV for setup.sh and the entry points alike; setup.sh alone always installs."""
    proc = checkout.run("bin/setup.sh", GEDL_VENV=".venv-other")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [line] = _setup_lines(proc)
    assert line.startswith("setup: installing gedl-jax[dev] into .venv-other with Python"), line
    assert not (checkout.root / ".venv").exists()
    checkout.logged()
    assert checkout.run("bin/test", GEDL_VENV=".venv-other").stdout == ""
    assert checkout.logged() == ["run pytest -q -n 2"]
    assert checkout.run("bin/setup.sh", GEDL_VENV=".venv-other").returncode == 0
    assert checkout.logged()[0] == "venv .venv-other"


@pytest.mark.skipif(shutil.which("flock") is None, reason="the lock needs flock (util-linux)")
def test_two_commands_started_together_set_the_venv_up_once(checkout):
    env = {**checkout.env, "FAKE_PIP_SECONDS": "1"}
    procs = [subprocess.Popen(["bash", script], cwd=checkout.root, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for script in ("bin/test", "bin/train")]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    logged = checkout.logged()
    assert logged.count("venv .venv") == 1, logged
    assert sorted(line for line in logged if line.startswith("run ")) == [
        "run gedl_jax.train", "run pytest -q -n 2"]


def test_setup_refuses_an_unknown_argument_in_one_error_line(checkout):
    proc = checkout.run("bin/setup.sh", "--fast")
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "error: bin/setup.sh takes no argument but --check or --if-needed, not '--fast'"]
    assert not (checkout.root / ".venv").exists()


# ------------------------------------------------------------------ the README and CI
def _quick_start_commands() -> list[str]:
    section = REPO.joinpath("README.md").read_text().split("## Quick start", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]


def test_the_quick_start_is_the_two_entry_points_and_ci_runs_its_test_command_as_written():
    train, test = _quick_start_commands()
    assert train.split()[0] == "bin/train" and test.split()[0] == "bin/test", (train, test)
    ci = REPO.joinpath(".ci/run").read_text().splitlines()
    assert test in ci, f".ci/run does not run the README's test command {test!r} on a line"
    assert ci.index("rm -rf .venv") < ci.index(test), "CI must run it without a .venv"
    for script in ("bin/train", "bin/test", "bin/setup.sh"):
        assert os.access(REPO / script, os.X_OK), f"{script} is not executable"


# ------------------------------------------------------------- from a fresh clone, for real
def _package_index_problem() -> str | None:
    """Why pip cannot install here, or None when the package index it is configured for answers."""
    proc = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "flax",
                           "--timeout", "15", "--retries", "0"],
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        return "no package index answers pip here: " + (proc.stderr.strip().splitlines()
                                                        or ["(no message)"])[-1]
    return None


def _tracked_copy(dest: pathlib.Path) -> pathlib.Path:
    """The tracked files as they are in the working tree: what a clone of this state holds."""
    names = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in filter(None, names):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


@pytest.mark.network
def test_from_a_fresh_clone_the_tests_pass_and_the_main_job_trains(tmp_path):
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs the git checkout the files are copied from")
    if problem := _package_index_problem():
        pytest.skip(problem)
    clone = _tracked_copy(tmp_path / "clone")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHON", "GEDL_VENV", "GEDL_EXTRAS", "PYTHONPATH", "VIRTUAL_ENV",
                        "XDG_CACHE_HOME")}
    if USER_CACHE_HOME is not None:
        env["XDG_CACHE_HOME"] = USER_CACHE_HOME

    tests = subprocess.run(["bin/test", "tests/test_evidential_schedules.py", "-q"], cwd=clone,
                           env=env, capture_output=True, text=True, timeout=900)
    out = tests.stdout + tests.stderr
    assert tests.returncode == 0, out
    assert len(_setup_lines(tests)) == 1 and " passed" in tests.stdout, out
    assert (clone / ".venv/.gedl-setup-stamp").exists()

    dataset, ood = write_image_data(tmp_path / "data")
    start = time.monotonic()
    proc = subprocess.Popen(
        ["bin/train", "--config=configs/mnist.py:quick", f"--config.dataset=npz:{dataset}",
         f"--config.ood_datasets=npz:{ood}", "--config.num_epochs=3", "--config.batch_size=32",
         "--config.train_examples=0", "--config.val_examples=0", "--config.eval_examples=0",
         "--config.plots=False", "--config.allow_chance=True", "--workdir=runs/first"],
        cwd=clone, env={**env, "JAX_PLATFORMS": "cpu"}, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("epoch 1: validation"):   # the first epoch is done
                proc.send_signal(signal.SIGINT)
                break
        out = "".join(lines) + proc.communicate(timeout=300)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == preemption.EXIT_PREEMPTED, out
    assert not any(line.startswith("setup:") for line in lines), out
    assert (clone / "runs/first/checkpoints/last").is_dir(), out
    assert time.monotonic() - start < 300
