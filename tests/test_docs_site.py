"""The docs site (mkdocs.yml, built strict by tools/docs.sh) keeps what a reader needs, which a
strict build does not check by itself:

- every page a page of the nav links to is in the nav too (a page outside it is built, but no
  menu leads to it), no page links to a folder (a static host has no listing: link the
  folder's README.md, or its GitHub tree), and no notebook has a relative link (mkdocs-jupyter
  leaves it as written, relative to the page's own folder on the site);
- a link to this repository on GitHub (`.../tree/main/<path>`, `.../blob/main/<path>`) names a
  path the checkout holds;
- docs/fields.md is `python -m tools.fields`'s page of the schema;
- docs/executed/quickstart.ipynb, which tools/docs.sh writes into the staged pages for every
  build and git ignores, is notebooks/quickstart.ipynb executed: the same code cells, with
  outputs and figures (`python -m tools.executed_notebook`), and small (a `notebooks` test:
  it runs the quickstart);
- the API reference has a page for `gedl_jax.evaluation` (opening with `evaluate_model`), for
  its user-facing modules and for every module of the engine, at the end of the nav;
- the install page names every extra of pyproject.toml.
"""

from __future__ import annotations

import json
import os
import pathlib
import posixpath
import re
import subprocess
import sys
import tomllib

import pytest
from test_repository_hygiene import MARKDOWN_LINK
from training_fixtures import REPO

from tools import api_pages, executed_notebook, fields

MKDOCS = (REPO / "mkdocs.yml").read_text()
NAV_PAGE = re.compile(r"^\s*- (?:\"[^\"]*\"|[^:\n]+): ([\w./-]+\.(?:md|ipynb))\s*$", re.M)
# What tools/docs.sh stages into the site's docs folder (its pages are the .md files among them).
STAGED = ("README.md", "CHANGELOG.md", "docs/", "notebooks/", "gedl_jax/", "configs/", "bin/",
          "tools/", "studies/", "tests/", "requirements/")
# The pages tools/docs.sh writes into the staged folder for each build (git ignores them).
GENERATED_PAGES = ("docs/executed/quickstart.ipynb",)
REPOSITORY = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["urls"]["Repository"]
GITHUB_PATH = re.compile(re.escape(REPOSITORY) + r"""/(?:tree|blob)/main/([^)\s#?"'\]]+)""")


def nav_pages(mkdocs_text: str = MKDOCS) -> list[str]:
    """The nav's pages of the repository (not the generated API pages), in order."""
    return [p for p in NAV_PAGE.findall(mkdocs_text) if not p.startswith("api/")]


@pytest.fixture(scope="module")
def tracked() -> list[str]:
    proc = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True)
    if proc.returncode:
        pytest.skip("not a git checkout: the site's pages are the files git tracks")
    return sorted(f for f in proc.stdout.split("\0") if f and (REPO / f).is_file())


def page_text(root: pathlib.Path, page: str) -> str:
    """A page's markdown: the file, or a notebook's markdown cells."""
    text = (root / page).read_text()
    if not page.endswith(".ipynb"):
        return text
    return "\n".join("".join(c["source"]) for c in json.loads(text)["cells"]
                     if c["cell_type"] == "markdown")


def link_problems(files: list[str], nav: list[str], root: pathlib.Path = REPO) -> list[str]:
    """Each link of a built page to a folder, and each link of a nav page to a page outside
    the nav, as "page -> target: what is wrong"."""
    present = set(files)
    folders = {str(p) for f in files for p in pathlib.PurePosixPath(f).parents}
    pages = [f for f in files if f.endswith(".md") and f.startswith(STAGED)]
    pages += [p for p in nav if p.endswith(".ipynb") and p in present]
    in_nav = set(nav)
    problems = []
    for page in pages:
        for match in MARKDOWN_LINK.finditer(page_text(root, page)):
            target = match.group(1)
            if re.match(r"[A-Za-z][\w+.-]*:", target) or target.startswith("#"):
                continue
            path = target.split("#")[0].split("?")[0]
            resolved = posixpath.normpath(posixpath.join(posixpath.dirname(page), path))
            if page.endswith(".ipynb"):
                problems.append(f"{page} -> {target}: a notebook's relative link, which the site "
                                f"leaves as written (link the file on GitHub)")
            elif resolved in folders:
                problems.append(f"{page} -> {target}: a folder (link its README.md or its "
                                f"GitHub tree)")
            elif (page in in_nav and resolved.endswith((".md", ".ipynb"))
                  and resolved in present and resolved not in in_nav):
                problems.append(f"{page} -> {target}: a page outside the nav (add it)")
    return problems


def test_nav_pages_exist(tracked):
    missing = [p for p in nav_pages() if p not in tracked and p not in GENERATED_PAGES]
    assert not missing, missing


def test_nav_pages_link_only_pages_in_the_nav_and_no_folders(tracked):
    assert not link_problems(tracked, nav_pages())


def test_the_link_check_sees_a_folder_and_a_page_outside_the_nav(tmp_path):
    (tmp_path / "notebooks" / "runs").mkdir(parents=True)
    (tmp_path / "notebooks" / "runs" / "a.json").write_text("{}")
    (tmp_path / "notebooks" / "hidden.md").write_text("# hidden\n")
    (tmp_path / "notebooks" / "listed.md").write_text(
        "[runs](runs/) and [more](hidden.md) and [back](listed.md#top) and [a run](runs/a.json)\n")
    files = ["notebooks/runs/a.json", "notebooks/hidden.md", "notebooks/listed.md"]
    assert link_problems(files, ["notebooks/listed.md"], tmp_path) == [
        "notebooks/listed.md -> runs/: a folder (link its README.md or its GitHub tree)",
        "notebooks/listed.md -> hidden.md: a page outside the nav (add it)"]
    assert link_problems(files, ["notebooks/listed.md", "notebooks/hidden.md"], tmp_path) == [
        "notebooks/listed.md -> runs/: a folder (link its README.md or its GitHub tree)"]
    (tmp_path / "notebooks" / "n.ipynb").write_text(json.dumps({"cells": [
        {"cell_type": "markdown", "source": ["[a page](listed.md), [GitHub](https://github.com)"]},
        {"cell_type": "code", "source": ["x = 1"]}]}))
    assert link_problems([*files, "notebooks/n.ipynb"], ["notebooks/n.ipynb"], tmp_path) == [
        "notebooks/listed.md -> runs/: a folder (link its README.md or its GitHub tree)",
        "notebooks/n.ipynb -> listed.md: a notebook's relative link, which the site leaves as "
        "written (link the file on GitHub)"]


def test_links_to_the_repository_on_github_name_paths_it_holds(tracked):
    present = set(tracked) | {str(p) for f in tracked for p in pathlib.PurePosixPath(f).parents}
    wrong = [f"{f}: {m.group(1)}" for f in tracked if f.endswith((".md", ".ipynb", ".toml"))
             for m in GITHUB_PATH.finditer((REPO / f).read_text())
             if m.group(1).rstrip("/") not in present]
    assert not wrong, wrong


def test_the_field_page_is_the_schemas():
    assert (REPO / "docs" / "fields.md").read_text() == fields.page(), \
        "run: python -m tools.fields"
    assert fields.main(["--check"]) == 0


def test_the_field_page_lists_every_field_with_its_default_and_doc():
    from gedl_jax import config

    page = fields.page()
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \| (.+?) \| (.+) \|$", page, re.M)
    assert [r[0] for r in rows] == [f.name for fs in config.fields_by_group().values()
                                    for f in fs]
    row = {r[0]: r for r in rows}
    assert row["learning_rate"][1:3] == (
        "float", "per dataset: `0.001` (mnist, fashion_mnist, your own); `0.0001` (cifar10, "
                 "cifar100)")
    assert row["download"][2] == "`'auto'`" and "One of `auto`, `never`, `force`" in row[
        "download"][3]
    assert "&lt;importable.module&gt;:&lt;Name&gt;" in row["model"][3]   # no stray HTML tag
    assert "*Resume-safe*" in row["plots"][3] and "Resume-safe" not in row["learning_rate"][3]


def test_the_executed_quickstart_is_staged_for_the_site_and_never_committed():
    """tools/docs.sh runs the quickstart into the staged pages; no executed copy is tracked."""
    assert set(GENERATED_PAGES) <= set(nav_pages())
    assert '"docs/executed/*.ipynb"' in MKDOCS   # rendered by mkdocs-jupyter
    docs_sh = (REPO / "tools" / "docs.sh").read_text()
    assert 'tools.executed_notebook --out="$stage/docs/executed/quickstart.ipynb"' in docs_sh
    tracked = subprocess.run(["git", "ls-files", "docs/executed"], cwd=REPO, capture_output=True,
                             text=True, check=True).stdout
    assert tracked == ""
    assert "/docs/executed/" in (REPO / ".gitignore").read_text().splitlines()


@pytest.mark.slow
@pytest.mark.notebooks
def test_the_executed_quickstart_is_the_notebook_run(tmp_path):
    data_dir = os.environ.get("GEDL_DATA_DIR")
    if not data_dir:
        pytest.skip("GEDL_DATA_DIR is not set (MNIST, KMNIST, Fashion-MNIST)")
    out = tmp_path / "quickstart.ipynb"
    subprocess.run([sys.executable, "-m", "tools.executed_notebook", f"--out={out}"], cwd=REPO,
                   env={**os.environ, "PYTHONPATH": str(REPO)}, check=True, timeout=900)
    executed = json.loads(out.read_text())
    source = json.loads((REPO / "notebooks" / "quickstart.ipynb").read_text())
    assert executed_notebook.code_sources(executed) == executed_notebook.code_sources(source), \
        "notebooks/quickstart.ipynb changed: GEDL_DATA_DIR=... python -m tools.executed_notebook"
    first = "".join(executed["cells"][0]["source"])
    assert "smoke setting" in first and "tools.executed_notebook" in first
    outputs = [o for c in executed["cells"] if c["cell_type"] == "code" for o in c["outputs"]]
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= 2
    assert not [o for o in outputs if o["output_type"] == "error"]
    assert out.stat().st_size < 1_000_000


def test_the_api_reference_opens_with_what_users_call():
    entries = api_pages.entries()
    modules = [m for m, _ in entries]
    assert modules[0] == "gedl_jax.evaluation"
    for name in ("metrics", "calibration", "conformal", "selective", "posthoc", "smooth_ece",
                 "bootstrap", "compare", "laplace", "scores", "core", "report"):
        assert f"gedl_jax.evaluation.{name}" in modules
    assert "gedl_jax.config" in modules and "gedl_jax.configuration" not in modules
    page = api_pages.page("gedl_jax.evaluation")
    blocks = re.findall(r"^::: (\S+)", page, re.M)
    assert blocks[:3] == ["gedl_jax.evaluation", "gedl_jax.evaluation.any_model.evaluate_model",
                          "gedl_jax.evaluation.any_model.ModelEvaluation"]
    assert "gedl_jax.evaluation.ModelOutputs" in blocks


def test_the_engine_comes_last_with_every_module():
    import pkgutil

    import gedl_jax.run

    modules = [m for m, _ in api_pages.entries()]
    engine = [f"gedl_jax.run.{m.name}" for m in pkgutil.iter_modules(gedl_jax.run.__path__)
              if not m.name.startswith("_")]
    tail = modules[-len(engine) - 1:]
    assert tail == ["gedl_jax.run", *engine], "the engine's pages: the end of the API reference"


def test_the_install_page_names_every_extra():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    page = (REPO / "docs" / "install.md").read_text()
    missing = [e for e in extras if f"| `{e}` |" not in page]
    assert not missing, f"docs/install.md's table of extras lacks {missing}"
    assert "docs/install.md" in nav_pages()[:3]
