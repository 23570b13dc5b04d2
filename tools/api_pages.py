"""The API reference's pages of the docs site: one page, api/<page>.md, for each
`gedl_jax.<module>: api/<page>.md` entry of mkdocs.yml's nav, which mkdocstrings fills from the
module's docstring and its public names. tools/docs.sh writes them into the staged docs folder.

    python -m tools.api_pages OUT_DIR

A module of `LEADING` shows the names it lists first, then the rest of its `__all__` in order:
`gedl_jax.evaluation` opens with `evaluate_model`, what a user with a model of their own calls.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import pathlib
import re
import sys
from collections.abc import Sequence

REPO = pathlib.Path(__file__).resolve().parents[1]
MKDOCS = REPO / "mkdocs.yml"
NAV_ENTRY = re.compile(r"^\s*- (gedl_jax[\w.]*): api/([\w.]+)\.md$", re.M)
LEADING: dict[str, tuple[str, ...]] = {
    "gedl_jax.evaluation": ("evaluate_model", "ModelEvaluation"),
}


def entries(mkdocs_text: str | None = None) -> list[tuple[str, str]]:
    """(module, page name) of every API reference entry of the nav, in its order."""
    return NAV_ENTRY.findall(MKDOCS.read_text() if mkdocs_text is None else mkdocs_text)


def _block(identifier: str, **options: object) -> list[str]:
    lines = [f"::: {identifier}"]
    if options:
        lines.append("    options:")
        lines += [f"      {k}: {str(v).lower() if isinstance(v, bool) else v}"
                  for k, v in options.items()]
    return lines + [""]


def _identifier(module, name: str) -> str:
    """The path mkdocstrings finds `name` of `module` under: the module's own, unless the module
    provides it on first use (a module `__getattr__`), which a static reading cannot see."""
    if name in vars(module):
        return f"{module.__name__}.{name}"
    obj = getattr(module, name)
    return f"{obj.__module__}.{obj.__qualname__}"


def page(module_name: str) -> str:
    """The page of one module: its docstring and its public names."""
    lines = [f"# `{module_name}`", ""]
    leading = LEADING.get(module_name)
    if leading is None:
        return "\n".join(lines + _block(module_name, show_root_heading=False))
    module = importlib.import_module(module_name)
    lines += _block(module_name, show_root_heading=False, members=False)
    rest = [n for n in module.__all__ if n not in leading]
    for name in (*leading, *rest):
        obj = getattr(module, name)
        if inspect.isfunction(obj) or inspect.isclass(obj):   # constants: in their modules
            lines += _block(_identifier(module, name), show_root_full_path=False)
    return "\n".join(lines)


def write(out: pathlib.Path) -> list[pathlib.Path]:
    from gedl_jax import files

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for module, name in entries():
        path = out / f"{name}.md"
        files.write_text(path, page(module))
        written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.api_pages",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", help="the folder the api/<module>.md pages are written into "
                                        "(tools/docs.sh: build/docs_src/api)")
    args = parser.parse_args(argv)
    print(f"api_pages: {len(write(pathlib.Path(args.out_dir)))} pages in {args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
