"""tools/release.sh, the release's dry run: its agreement checks (the version, its tag, the
changelog's section, the citation, the notebooks' REPO_REF) pass on the checkout and name what
disagrees. Its build and `twine check` are what tools/check_wheel.sh runs too (CI)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from training_fixtures import REPO

import gedl_jax

TAG = f"v{gedl_jax.__version__}"


def release(root, *args):
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run(["bash", str(root / "tools" / "release.sh"), *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_checkout_agrees_with_its_version():
    proc = release(REPO, "--checks-only", f"--tag={TAG}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"CHANGELOG.md, CITATION.cff, notebooks/: {TAG}" in proc.stdout
    assert "nothing built" in proc.stdout


def test_another_tag_is_refused():
    proc = release(REPO, "--checks-only", "--tag=v99.0.0")
    assert proc.returncode == 1
    assert f"the tag v99.0.0 is not {TAG}" in proc.stderr


def test_what_disagrees_is_named(tmp_path):
    """A copy whose changelog has no section for the version and one of whose notebooks installs
    main: both are named, and nothing is built."""
    for name in ("tools/release.sh", "gedl_jax/__init__.py", "CITATION.cff"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, tmp_path / name)
    changelog = (REPO / "CHANGELOG.md").read_text()
    (tmp_path / "CHANGELOG.md").write_text(
        changelog.replace(f"## {gedl_jax.__version__} (", "## Released ("))
    (tmp_path / "notebooks").mkdir()
    notebook = json.loads((REPO / "notebooks" / "quickstart.ipynb").read_text())
    for cell in notebook["cells"]:
        cell["source"] = [line.replace(f'REPO_REF = "{TAG}"', 'REPO_REF = "main"')
                          for line in cell["source"]]
    (tmp_path / "notebooks" / "quickstart.ipynb").write_text(json.dumps(notebook))
    proc = release(tmp_path, "--checks-only", f"--tag={TAG}")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f'no "## {gedl_jax.__version__} (YYYY-MM-DD)" section' in proc.stdout
    assert f"notebooks/quickstart.ipynb: installs REPO_REF ['main'], not {TAG}" in proc.stdout
    assert "the files above disagree with the version" in proc.stderr
    assert not (tmp_path / "dist").exists()
