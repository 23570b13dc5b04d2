"""Export a run's best checkpoint as a pretrained model, and register it.

    python -m gedl_jax.pretrained export --workdir=W --name=mnist/gedl \
        --out=gedl_jax/pretrained/mnist_gedl.msgpack --register \
        --setting="long (...)" --commit=c0b3e04 --versions="..." --hardware="..." \
        --wall_time="77.5 min" --results_dir=docs/results/...
    python -m gedl_jax.pretrained list [--markdown]
    python -m gedl_jax.pretrained reexport [--registry=PATH] [NAME ...]

`--register` adds the entry to the registry beside the file (`--registry=PATH`, default the
registry.json in the file's folder) and prints it; the file is written with sorted keys, so the
same checkpoint always gives the same bytes and sha256. `reexport` writes registered files
(default: all of them) again in the current format, their weights unchanged (checked against the
registry), recording the checksum of the weights inside, and updates their entries' sha256 and
size. Evaluate a registered model with `python -m gedl_jax.evaluate --pretrained=NAME`.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from collections.abc import Sequence

from gedl_jax.commands import cli

__all__ = ["PROVENANCE", "main"]

PROVENANCE = ("setting", "commit", "versions", "hardware", "wall_time", "results_dir", "url")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gedl_jax.pretrained",
                                     description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    export = sub.add_parser("export", help="a run's best checkpoint -> a model file")
    export.add_argument("--workdir", required=True, help="the gedl_jax.train workdir")
    export.add_argument("--name", required=True, help="registry name, e.g. mnist/gedl")
    export.add_argument("--out", required=True, help="the model file to write (.msgpack)")
    export.add_argument("--results", default=None, help="the run's committed eval_results.json "
                        "(default: the workdir's)")
    export.add_argument("--register", action="store_true", help="add the entry to --registry")
    export.add_argument("--registry", default=None, help="registry JSON (default: registry.json "
                        "beside --out)")
    for field in PROVENANCE:
        export.add_argument(f"--{field}", default="", help=f"provenance: {field}")
    listing = sub.add_parser("list", help="the registered models")
    listing.add_argument("--registry", default=None, help="registry JSON (default: the "
                         "package's, or $GEDL_PRETRAINED_REGISTRY)")
    listing.add_argument("--markdown", action="store_true", help="as Markdown tables, one per "
                         "dataset (the table of docs/pretrained.md)")
    again = sub.add_parser("reexport", help="registered files again, their weights' checksum "
                           "recorded inside")
    again.add_argument("names", nargs="*", help="registered names (default: every one)")
    again.add_argument("--registry", default=None, help="registry JSON (default: the "
                       "package's, or $GEDL_PRETRAINED_REGISTRY)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from gedl_jax import pretrained  # jax only after the flags parse
    from gedl_jax.pretrained import export, registry

    try:
        if args.command == "list":
            print(pretrained.markdown_table(args.registry) if args.markdown
                  else pretrained.list_table(args.registry))
            return 0
        if args.command == "reexport":
            for name in args.names or sorted(pretrained.available(args.registry)):
                entry = export.reexport(name, args.registry)
                print(f"{name}: {entry['file']}, sha256 {entry['sha256']}, weights "
                      f"{entry['weights_sha256']}")
            return 0
        out = pathlib.Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        entry = export.export_workdir(args.workdir, out, results=args.results)
        entry.update({k: getattr(args, k) for k in PROVENANCE})
        print(json.dumps({args.name: entry}, indent=2, sort_keys=True))
        if args.register:
            where = registry.write_entry(args.registry or out.parent / "registry.json",
                                         args.name, entry)
            print(f"registered {args.name} in {where}")
        return 0
    except (ValueError, FileNotFoundError) as e:
        cli.print_error(cli.error_text(e))
        return 2


if __name__ == "__main__":
    sys.exit(main())
