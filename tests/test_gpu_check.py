"""tools/gpu_check.sh refuses, before any work, what would fail the suite minutes into a lent GPU's
time: a data folder whose SHA256SUMS lists files it does not hold (the suite checks every
listed file; a list of only the files present passes), and an interpreter without the dev extra."""

import os
import subprocess
import sys

from training_fixtures import REPO


def _check(data_dir, tmp_path, script="tools/gpu_check.sh", relative_out=False):
    """The check's tests part, collecting one file's tests; started in the repository with an
    absolute --out, or (`relative_out`) in `tmp_path` with --out=out, which is read from there."""
    env = {**os.environ, "PYTHON": sys.executable, "GEDL_DATA_DIR": str(data_dir),
           "JAX_PLATFORMS": "cpu"}
    out, cwd = ("out", tmp_path) if relative_out else (tmp_path / "out", REPO)
    return subprocess.run(
        ["bash", str(REPO / script), "--dry-run", "--parts=tests", f"--out={out}",
         "--tests=--collect-only -q tests/test_numerics.py"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_a_sha256sums_listing_absent_files_is_refused_before_any_work(tmp_path):
    data = tmp_path / "data"
    (data / "mnist").mkdir(parents=True)
    (data / "mnist" / "t10k-labels-idx1-ubyte.gz").write_bytes(b"x")
    listed = ["mnist/t10k-labels-idx1-ubyte.gz", "cifar10/test.npz", "cifar10/train.npz"]
    (data / "SHA256SUMS").write_text("".join(f"{'0' * 64}  {f}\n" for f in listed))
    proc = _check(data, tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "lists 2 file(s) absent from $GEDL_DATA_DIR (first: cifar10/test.npz)" in proc.stderr
    assert "=== tests" not in proc.stdout   # nothing ran

    # the old name forwards, with a line that says so
    old = _check(data, tmp_path, "bin/gpu_check.sh")
    assert old.stderr.startswith("bin/gpu_check.sh moved to tools/gpu_check.sh; the old name "
                                 "goes in 0.2.0\n"), old.stderr
    assert (old.returncode, old.stderr.splitlines()[1:]) == (2, proc.stderr.splitlines())

    (data / "SHA256SUMS").write_text(f"{'0' * 64}  {listed[0]}\n")
    proc = _check(data, tmp_path, relative_out=True)   # --out=out, from tmp_path
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "=== tests" in proc.stdout
    # its wall times written, and no lock file left among the results
    out = tmp_path / "out"
    assert (out / "wall_times.json").is_file() and (out / "README.md").is_file()
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []


def test_an_interpreter_without_part_of_the_dev_extra_is_refused_before_any_work(tmp_path):
    """ruff's absence failed the lint test 7 minutes into a lent GPU's suite; now the check names
    what the interpreter lacks first. The absence is simulated: a sitecustomize makes
    importlib.metadata report ruff and hypothesis as not installed."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import importlib.metadata as metadata\n"
        "_version = metadata.version\n"
        "def version(name):\n"
        "    if name in ('ruff', 'hypothesis'):\n"
        "        raise metadata.PackageNotFoundError(name)\n"
        "    return _version(name)\n"
        "metadata.version = version\n")
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH="{site}" exec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    env = {**os.environ, "PYTHON": str(python), "JAX_PLATFORMS": "cpu"}
    env.pop("GEDL_DATA_DIR", None)
    proc = subprocess.run(
        ["bash", "tools/gpu_check.sh", "--dry-run", "--parts=tests", f"--out={tmp_path / 'out'}",
         "--tests=--collect-only -q tests/test_numerics.py"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "lacks the dev extra's hypothesis ruff, which the suite needs" in proc.stderr
    assert "=== tests" not in proc.stdout   # nothing ran
