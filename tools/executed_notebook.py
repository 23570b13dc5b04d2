"""The docs site's docs/executed/quickstart.ipynb: notebooks/quickstart.ipynb executed top to
bottom in its smoke setting on the CPU (GEDL_NOTEBOOK_SMOKE=1: one epoch on a few hundred
examples, offline), so that the site shows what its cells print and draw. tools/docs.sh runs it
into the pages it stages for every build; nothing executed is committed. Its code cells are the
notebook's, unchanged (a test checks); a first cell says what the copy is and what ran it. The
notebooks themselves stay without outputs (tests/test_notebooks.py).

    GEDL_DATA_DIR=DATA_DIR python -m tools.executed_notebook [--out=PATH]   # MNIST, KMNIST, FMNIST

Machine paths in the outputs are written as `$GEDL_DATA_DIR`, `$GEDL_CACHE_DIR`, `WORKDIR` and
`VENV` (the repository's own files relative to it), execution times are dropped, and the figures
are stored as palette PNGs (plots have few colours; the file stays small).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import pathlib
import subprocess
import sys
import tempfile
from collections.abc import Sequence

REPO = pathlib.Path(__file__).resolve().parents[1]
SOURCE = REPO / "notebooks" / "quickstart.ipynb"
OUT = REPO / "docs" / "executed" / "quickstart.ipynb"
KERNEL = "gedl-executed-notebook"
# Links in a notebook stay as written on the site (mkdocs-jupyter does not resolve them): GitHub's.
GITHUB = "https://github.com/gedl-jax/gedl-jax/blob/main"


def header(provenance: str) -> dict:
    """The markdown cell put before the notebook's own cells."""
    from gedl_jax.notebook import SMOKE_EXAMPLES

    sizes = SMOKE_EXAMPLES["mnist"]
    text = (
        "> **This page is the quickstart notebook run in its smoke setting** "
        f"(`GEDL_NOTEBOOK_SMOKE=1`: one epoch on {sizes['train_examples']} MNIST training "
        f"images, every evaluation set cut to {sizes['eval_examples']} examples, on a CPU, "
        "offline; the install cell skipped), by `python -m tools.executed_notebook`. It shows "
        "what each cell prints and draws, not what GEDL reaches: the notebook's own setting "
        "trains for longer on all of MNIST "
        f"([the notebook]({GITHUB}/notebooks/quickstart.ipynb), "
        f"[results of full runs]({GITHUB}/docs/results/mnist_long/README.md)). " + provenance)
    return {"cell_type": "markdown", "metadata": {}, "source": text}


def code_sources(notebook: dict) -> list[str]:
    """The code cells' sources, each as one string."""
    return ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            for c in notebook["cells"] if c["cell_type"] == "code"]


def _palette_png(data: str) -> str:
    """A base64 PNG re-encoded with a 256-colour palette (plots have few colours)."""
    from PIL import Image

    image = Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")
    out = io.BytesIO()
    image.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(out, "PNG", optimize=True)
    return base64.b64encode(out.getvalue()).decode("ascii")


def _scrubbed(value, replacements: dict[str, str]):
    if isinstance(value, str):
        for old, new in replacements.items():
            value = value.replace(old, new)
        return value
    if isinstance(value, list):
        return [_scrubbed(v, replacements) for v in value]
    if isinstance(value, dict):
        return {k: _scrubbed(v, replacements) for k, v in value.items()}
    return value


def tidy(notebook: dict, replacements: dict[str, str]) -> dict:
    """The executed notebook without machine paths, execution times and heavy figures."""
    for cell in notebook["cells"]:
        cell.get("metadata", {}).pop("execution", None)
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "image/png" in data:
                data["image/png"] = _palette_png(data["image/png"])
            for key in ("text", "data", "traceback", "evalue"):
                if key in output:
                    output[key] = _scrubbed(output[key], replacements)
    return notebook


def execute(data_dir: pathlib.Path, scratch: pathlib.Path) -> dict:
    """notebooks/quickstart.ipynb executed in a fresh kernel of this interpreter, smoke setting."""
    import nbformat

    from gedl_jax import files
    from nbclient import NotebookClient

    spec = scratch / "jupyter" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    files.write_text(spec / "kernel.json", json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": KERNEL, "language": "python"}))
    work = scratch / "work"
    work.mkdir()
    os.environ.update(JUPYTER_PATH=str(scratch / "jupyter"), IPYTHONDIR=str(scratch / "ipython"),
                      MPLCONFIGDIR=str(scratch / "mpl"), GEDL_NOTEBOOK_SMOKE="1",
                      GEDL_OFFLINE="1", GEDL_DATA_DIR=str(data_dir), JAX_PLATFORMS="cpu",
                      GEDL_CACHE_DIR=str(scratch / "cache"),
                      PYTHONPATH=os.pathsep.join(filter(None, [str(REPO),
                                                               os.environ.get("PYTHONPATH")])))
    notebook = nbformat.read(SOURCE, as_version=4)
    NotebookClient(notebook, kernel_name=KERNEL, timeout=900,
                   resources={"metadata": {"path": str(work)}}).execute()
    return json.loads(nbformat.writes(notebook))


def provenance() -> str:
    import jax

    import gedl_jax

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                            capture_output=True, text=True).stdout.strip() or "unknown"
    return (f"Run with gedl-jax {gedl_jax.__version__} (commit {commit}), jax {jax.__version__}, "
            f"Python {sys.version.split()[0]}.")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="GEDL_DATA_DIR=DATA_DIR python -m tools.executed_notebook",
        description=__doc__.split("\n\n")[0] + " DATA_DIR holds MNIST, KMNIST and Fashion-MNIST.")
    parser.add_argument("--out", type=pathlib.Path, default=OUT,
                        help=f"where the executed notebook goes (default: "
                             f"{OUT.relative_to(REPO)}, which git ignores)")
    args = parser.parse_args(argv)
    if not os.environ.get("GEDL_DATA_DIR"):
        parser.error("set GEDL_DATA_DIR to a folder holding MNIST, KMNIST and Fashion-MNIST")
    data_dir = pathlib.Path(os.environ["GEDL_DATA_DIR"]).resolve()
    from gedl_jax import files

    with tempfile.TemporaryDirectory() as tmp:
        scratch = pathlib.Path(tmp).resolve()
        notebook = execute(data_dir, scratch)
        replacements = {str(scratch / "cache"): "$GEDL_CACHE_DIR", str(data_dir): "$GEDL_DATA_DIR",
                        str(scratch / "work"): "WORKDIR", str(scratch): "SCRATCH",
                        f"{REPO}/": "", sys.prefix: "VENV"}
        notebook = tidy(notebook, replacements)
    notebook["cells"].insert(0, header(provenance()))
    out = args.out.absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    files.write_text(out, json.dumps(notebook, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {out} ({out.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
