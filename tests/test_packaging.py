"""Packaging: one version, a license and citation that agree with pyproject.toml, data files that
ship in the wheel, an sdist manifest that holds the tests' inputs; and (marked `network`: run
with --run-network) the `cuda12` and `cuda13` extras resolve against the tested dependency set.
Building and installing the wheel itself is tools/check_wheel.sh (CI runs it after the suite)."""

from __future__ import annotations

import ast
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


def _names(specs) -> set[str]:
    return {re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", s).group().lower() for s in specs}


def test_what_only_the_tests_import_is_no_runtime_dependency():
    """chex (the JAX tests' assertions), pytest and hypothesis are the test extra's, which the
    dev extra includes; no module of gedl_jax imports them."""
    project = PYPROJECT["project"]
    extras = project["optional-dependencies"]
    test_only = {"chex", "pytest", "hypothesis"}
    assert not test_only & _names(project["dependencies"])
    assert test_only <= _names(extras["test"])
    assert "gedl-jax[test]" in extras["dev"]
    imported = set()
    for path in (REPO / "gedl_jax").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module.split(".")[0])
    assert "jax" in imported and not test_only & imported, sorted(test_only & imported)


def test_the_project_urls_name_the_repository():
    urls = PYPROJECT["project"]["urls"]
    assert set(urls) == {"Homepage", "Documentation", "Repository", "Issues", "Changelog"}
    repository = urls["Repository"]
    assert re.fullmatch(r"https://github\.com/[\w-]+/[\w-]+", repository)
    assert all(url.startswith(repository) for url in urls.values()), urls
    # the repository the notebooks install from and the README's badges link
    notebook = json.loads((REPO / "notebooks" / "quickstart.ipynb").read_text())
    assert f'REPO_URL = "{repository}"' in "".join(
        "".join(cell["source"]) for cell in notebook["cells"])
    assert repository.removeprefix("https://github.com/") in (REPO / "README.md").read_text()


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
