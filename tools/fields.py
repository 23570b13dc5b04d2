"""docs/fields.md, the reference of every config field: written from the schema
(gedl_jax/config/fields.py, each field's type, default, allowed values and doc), group by group, so
that the page and the code cannot drift (a test compares the committed page with `page()`).

    python -m tools.fields            # rewrite docs/fields.md
    python -m tools.fields --check    # exit 1 when the committed page is not the schema's
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys
from collections.abc import Sequence

from gedl_jax import config
from gedl_jax.config.fields import Field, PerDataset
from gedl_jax.config.schema import default_text

REPO = pathlib.Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "fields.md"
# The datasets whose protocol settings a "per dataset" default reads, and one dataset of your own
# (npz:, tfds: and images: data share the same defaults).
DATASETS = ("mnist", "fashion_mnist", "cifar10", "cifar100")
YOUR_OWN = "npz:data.npz"

INTRO = """\
# Config fields

<!-- Written by `python -m tools.fields` from gedl_jax/config/fields.py: edit the fields there,
then run it (a test compares this page with the schema). -->

Every field of the experiment configuration, group by group, with its type, its default, the
values it allows and what it does. This page is written from the schema itself
(`gedl_jax/config/fields.py`) by `python -m tools.fields`, and a test keeps them equal;
`python -m gedl_jax.train --helpfull` prints the same list, and
`gedl_jax.config.help_text(group)` returns it in Python.

On the command line a field is `--config.<name>=<value>`, after the config file and its preset:
`python -m gedl_jax.train --config=configs/mnist.py:edl --config.learning_rate=3e-4` (list
fields also take `"a,b"`). In Python it is a key of the `ml_collections.ConfigDict` that
`gedl_jax.configs.build_config(dataset, preset)` returns. The defaults below are those of the
dataset before a preset; a preset (`gedl`, `edl`, `quick`, ...: [the
presets](../README.md#how-the-variants-map-to-the-paper)) sets some of them, and the config a
run used is its workdir's `config.json`. A default *per dataset* is the dataset's protocol
setting; "your own" is any `npz:`, `tfds:` or `images:` dataset. A field marked *resume-safe*
may differ when a run resumes: it does not change the trained parameters.
"""


def _escaped(text: str) -> str:
    """`text` for a cell of a markdown table, as written outside its `code spans`: no HTML tag,
    no emphasis by `*`, no link, no cell break (an underscore inside a word is no emphasis in
    Python-Markdown or on GitHub, and paths keep theirs)."""
    parts = re.split(r"(`[^`]*`)", text)
    out = []
    for i, part in enumerate(parts):
        if i % 2:   # a code span: only the cell separator needs escaping
            out.append(part.replace("|", "\\|"))
            continue
        part = part.replace("\\", "\\\\").replace("<", "&lt;").replace(">", "&gt;")
        out.append(re.sub(r"([|*\[\]])", r"\\\1", part))
    return "".join(out)


def _code(value: object) -> str:
    return "`" + repr(value).replace("|", "\\|") + "`"


def default_cell(field: Field) -> str:
    """The field's default: its value, or for a per-dataset default each dataset's value."""
    if not isinstance(field.default, PerDataset):
        return _code(field.default)
    if field.default.key in ("dataset", "run_name"):   # the name the preset gives
        return _escaped(default_text(field))
    values: dict[str, list[str]] = {}
    for dataset in (*DATASETS, YOUR_OWN):
        value = config.default_config(dataset)[field.name]
        values.setdefault(_code(value), []).append(
            "your own" if dataset == YOUR_OWN else dataset)
    return "per dataset: " + "; ".join(f"{value} ({', '.join(names)})"
                                        for value, names in values.items())


def kind_cell(field: Field) -> str:
    """The value's type; a per-dataset default's is its value's on the first dataset."""
    if field.kind == "per dataset":
        return type(config.default_config(DATASETS[0])[field.name]).__name__
    return _escaped(field.kind)


def description_cell(field: Field) -> str:
    text = _escaped(field.doc)
    if field.allowed is not None:
        text += ". One of " + ", ".join(f"`{v}`" for v in field.allowed)
    if field.resume_safe:
        text += ". *Resume-safe*"
    return text + ("" if text.endswith(".") else ".")


def page() -> str:
    """The page: the introduction, the groups' index, then a table per group."""
    groups = config.fields_by_group()
    lines = [INTRO, "## Groups", ""]
    lines += [f"- [{name}](#{name}): {_escaped(config.GROUPS[name])} ({len(fields)} "
              f"field{'s' if len(fields) > 1 else ''})" for name, fields in groups.items()]
    for name, fields in groups.items():
        summary = _escaped(config.GROUPS[name])
        lines += ["", f"## {name}", "", summary[:1].upper() + summary[1:] + ".", "",
                  "| field | type | default | what it does |", "|---|---|---|---|"]
        lines += [f"| `{f.name}` | {kind_cell(f)} | {default_cell(f)} | "
                  f"{description_cell(f)} |" for f in fields]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.fields",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing: exit 1 when the committed page is not the schema's")
    args = parser.parse_args(argv)
    wanted = page()
    current = PAGE.read_text() if PAGE.exists() else ""
    if args.check:
        if wanted != current:
            print(f"{PAGE.relative_to(REPO)} is not the schema's: run python -m tools.fields",
                  file=sys.stderr)
            return 1
        return 0
    if wanted != current:
        from gedl_jax import files

        files.write_text(PAGE, wanted)
        print(f"wrote {PAGE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
