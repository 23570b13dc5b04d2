"""The notebooks in notebooks/: stored without outputs, shaped for Colab (badge, one repository
URL, install cell skipped in the smoke setting), no logic of their own; and each one executed top
to bottom in the smoke setting (GEDL_NOTEBOOK_SMOKE=1), offline, on the real data folder."""

import json
import os
import pathlib
import re
import sys

import pytest

import gedl_jax

REPO = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
NAMES = [p.stem for p in NOTEBOOKS]
# The real data folder: $GEDL_DATA_DIR only (None when unset: the notebooks' runs skip).
DATA_DIR = pathlib.Path(os.environ["GEDL_DATA_DIR"]) if os.environ.get("GEDL_DATA_DIR") else None
# The real files each notebook reads (offline: the data folder must hold them).
NEEDS = {
    "quickstart": ("mnist/train-images-idx3-ubyte.gz", "kmnist/t10k-images-idx3-ubyte.gz",
                   "fashion_mnist/t10k-images-idx3-ubyte.gz"),
    "methods": ("mnist/train-images-idx3-ubyte.gz", "kmnist/t10k-images-idx3-ubyte.gz",
                "fashion_mnist/t10k-images-idx3-ubyte.gz"),
    "uncertainty": ("mnist/train-images-idx3-ubyte.gz", "cifar10"),
}
COLAB = "https://colab.research.google.com/github/"


def load(path):
    return json.loads(path.read_text())


def source(cell):
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def code_cells(nb):
    return [source(c) for c in nb["cells"] if c["cell_type"] == "code"]


def test_the_three_notebooks_exist():
    assert {"quickstart", "methods", "uncertainty"} <= set(NAMES)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NAMES)
def test_outputs_are_stripped(path):
    """Outputs, execution counts and widget state stay out of git (they bloat diffs and can
    carry a user's data); clear them before committing (Edit > Clear all outputs)."""
    nb = load(path)
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [], f"{path.name} cell {i} has outputs"
            assert cell.get("execution_count") is None, f"{path.name} cell {i} has a count"
    assert "widgets" not in nb["metadata"]


def repo_url(nb):
    match = re.search(r'^REPO_URL = "(https://github\.com/[^"]+)"$', "\n".join(code_cells(nb)),
                      re.MULTILINE)
    assert match, "no REPO_URL = \"https://github.com/...\" line"
    return match.group(1)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NAMES)
def test_colab_shape(path):
    nb = load(path)
    first = source(nb["cells"][0])
    url = repo_url(nb)
    badge = f"{COLAB}{url.removeprefix('https://github.com/')}/blob/main/notebooks/{path.name}"
    assert "colab-badge.svg" in first and badge in first, f"badge must link {badge}"
    cells = code_cells(nb)
    assert cells[0].lstrip().startswith("# Where gedl-jax is installed from"), \
        "the repository URL is set in the first code cell"
    # The release, with the versions tested for it: the tag of gedl_jax.__version__ (never
    # "main", which drifts with every commit) and that tag's constraints file.
    assert re.search(rf'^REPO_REF = "v{re.escape(gedl_jax.__version__)}"', cells[0], re.M), \
        f"REPO_REF must be the release tag v{gedl_jax.__version__}"
    install = cells[1]
    assert "pip" in install and "{REPO_URL}" in install and "{CUDA_EXTRA}" in install
    assert '"-c", constraints' in install and "{REPO_REF}/requirements/constraints-py" in install
    assert {f"constraints-py{v}.txt" for v in ("3.11", "3.13")} <= {
        p.name for p in (REPO / "requirements").glob("constraints-py*.txt")}
    assert "GEDL_NOTEBOOK_SMOKE" in install, "the install cell is skipped in the smoke setting"
    assert "notebook.check_accelerator()" in cells[2], "jax must be checked against the GPU"
    # The README lists the notebook with the same badge.
    assert badge in (REPO / "README.md").read_text()


def test_one_repository_url_everywhere():
    assert len({repo_url(load(p)) for p in NOTEBOOKS}) == 1


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NAMES)
def test_no_logic_lives_only_in_a_notebook(path):
    """Notebooks call the library; functions and classes belong in gedl_jax (with tests)."""
    # A network class of the user's own (a Flax module: `class X(nnx.Module)` / `(nn.Module)`)
    # is the point of bring_your_own, not logic of the toolkit: those cells are exempt.
    code = "\n".join(c for c in code_cells(load(path))
                     if not re.match(r"\s*class \w+\((nnx|nn)\.Module\):", c))
    assert "from gedl_jax import" in code
    assert not re.search(r"^\s*(def|class|lambda)\b|\blambda\b", code, re.MULTILINE), \
        f"{path.name} defines a function or class: move it into gedl_jax with a test"


@pytest.fixture
def kernel_env(tmp_path, monkeypatch):
    """A kernel spec for this interpreter (whatever python3 kernel the machine has) and the
    smoke, offline environment the kernel inherits."""
    spec = tmp_path / "jupyter" / "kernels" / "gedl-test"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "gedl-test", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "mpl"))
    monkeypatch.setenv("GEDL_NOTEBOOK_SMOKE", "1")
    monkeypatch.setenv("GEDL_OFFLINE", "1")
    # A writable view of the data folder (one link per dataset folder): the uncertainty notebook
    # writes a regenerated CIFAR-10-C into its data folder, as it does in Colab's; the real
    # folder stays untouched (it may be read-only).
    view = tmp_path / "data"
    view.mkdir()
    for entry in DATA_DIR.iterdir() if DATA_DIR and DATA_DIR.is_dir() else ():
        (view / entry.name).symlink_to(entry.resolve(), target_is_directory=entry.is_dir())
    monkeypatch.setenv("GEDL_DATA_DIR", str(view))
    if not os.environ.get("GEDL_CACHE_DIR"):
        monkeypatch.setenv("GEDL_CACHE_DIR", str(tmp_path / "cache"))
    return "gedl-test"


@pytest.mark.slow
@pytest.mark.notebooks
@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs(name, tmp_path, kernel_env):
    """Every cell of the notebook runs without an error in the smoke setting (a failing cell
    fails here with its traceback)."""
    import nbformat
    from nbclient import NotebookClient

    missing = [f for f in NEEDS.get(name, ()) if DATA_DIR is None or not (DATA_DIR / f).exists()]
    if missing:
        pytest.skip("GEDL_DATA_DIR is not set" if DATA_DIR is None
                    else f"real data not found in {DATA_DIR}: {missing} (set GEDL_DATA_DIR)")
    nb = nbformat.read(REPO / "notebooks" / f"{name}.ipynb", as_version=4)
    work = tmp_path / "work"
    work.mkdir()
    client = NotebookClient(nb, kernel_name=kernel_env, timeout=600,
                            resources={"metadata": {"path": str(work)}})
    client.execute()
    assert any(o.get("output_type") == "display_data" and "image/png" in o.get("data", {})
               for c in nb.cells if c.cell_type == "code" for o in c.outputs), "no figure shown"
