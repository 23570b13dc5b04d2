"""Packaging: one version, a license and citation that agree with pyproject.toml, data files that
ship in the wheel, an sdist manifest that holds the tests' inputs; and (marked `network`: run
with --run-network) the `cuda12` and `cuda13` extras resolve against the tested dependency set.
Building and installing the wheel itself is tools/check_wheel.sh (CI runs it after the suite)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib

import pytest
from training_fixtures import REPO

import gedl_jax

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def test_the_version_is_set_in_one_place():
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "gedl_jax.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", gedl_jax.__version__)
    citation = (REPO / "CITATION.cff").read_text()
    assert re.search(rf"^version: {re.escape(gedl_jax.__version__)}$", citation, re.M), (
        "CITATION.cff's version differs from gedl_jax.__version__")


def test_license_and_citation():
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    assert "Apache License" in (REPO / "LICENSE").read_text()
    citation = (REPO / "CITATION.cff").read_text()
    assert "license: Apache-2.0" in citation and "preferred-citation:" in citation
    assert "Generalized Evidential Deep Learning: From a Bayesian Perspective" in citation


def test_data_files_under_the_package_ship_in_the_wheel():
    patterns = PYPROJECT["tool"]["setuptools"]["package-data"]["gedl_jax"]
    for suffix in ("json", "msgpack", "npz"):
        assert f"**/*.{suffix}" in patterns


def test_the_sdist_holds_what_the_tests_read():
    manifest = (REPO / "MANIFEST.in").read_text()
    for folder in ("tests", "requirements", "notebooks", "bin", "tools", "studies", "docs"):
        assert re.search(rf"^graft {folder}$", manifest, re.M), folder
    # but not the studies' committed results (9 MB of run logs, tables and plots)
    assert re.search(r"^prune docs/results$", manifest, re.M)


@pytest.mark.network
@pytest.mark.parametrize("extra", ["cuda12", "cuda13"])
def test_cuda_extras_resolve_with_the_constraints(extra, tmp_path):
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    constraints = REPO / "requirements" / f"constraints-py{version}.txt"
    if not constraints.exists():
        pytest.skip(f"no constraints file for Python {version}")
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "-q",
         "--report", str(report), "-c", str(constraints), f".[{extra}]"],
        cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    installed = {i["metadata"]["name"]: i["metadata"]["version"]
                 for i in json.loads(report.read_text())["install"]}
    pinned = dict(re.findall(r"^(jax|jaxlib)==(\S+)$", constraints.read_text(), re.M))
    assert installed["jax"] == pinned["jax"] and installed["jaxlib"] == pinned["jaxlib"]
    assert installed.get(f"jax-{extra}-plugin") == pinned["jax"], sorted(installed)
