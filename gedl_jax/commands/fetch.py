"""Download and verify the official dataset files into the data folder.

    python -m gedl_jax.data.fetch mnist kmnist:test fashion_mnist:test  # into the data folder
    python -m gedl_jax.data.fetch --for=cifar10     # what a CIFAR-10 run needs (ID + its OOD sets)
    python -m gedl_jax.data.fetch --list            # every dataset, its files, sizes, what is here

The same from code: `gedl_jax.data.fetch.fetch_datasets`. How files are fetched and verified
(official URLs or a mirror, timeouts, retries, the offline switch): `gedl_jax.data.download`.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from gedl_jax.commands import cli
from gedl_jax.data.download import (
    ENV_MIRROR,
    default_splits,
    ensure_files,
    list_datasets,
    requests_for_run,
)
from gedl_jax.data.errors import DataError
from gedl_jax.data.locations import data_dir_origin
from gedl_jax.data.registry import DATASETS, get_info

__all__ = ["format_list", "main", "parse_targets"]


def format_list(rows: list[dict[str, object]], root: Path) -> str:
    """`list_datasets` as a table."""
    out = [f"data folder: {root}",
           f"{'dataset':<18}{'file':<30}{'splits':<18}{'bytes':>15}  status", "-" * 96]
    for r in rows:
        out.append(f"{r['dataset']:<18}{r['file']:<30}{','.join(r['splits']):<18}"
                   f"{r['size']:>15,}  {r['status']}")
    return "\n".join(out)


def parse_targets(tokens: Sequence[str], for_dataset: str | None) -> list[tuple[str, str]]:
    """`dataset[:split,split]` tokens (and --for=DATASET) -> unique (dataset, split) pairs."""
    wanted: list[tuple[str, str]] = []
    if for_dataset:
        wanted += requests_for_run(for_dataset)
    for token in tokens:
        name, _, split_text = token.partition(":")
        info = get_info(name)
        splits = [s for s in split_text.split(",") if s] or list(default_splits(name))
        for s in splits:
            if s not in info.splits:
                raise DataError(f"{name} has splits {list(info.splits)}, not {s!r}: name one "
                                f"of them, e.g. {name}:{info.splits[-1]}")
            wanted.append((name, s))
    return list(dict.fromkeys(wanted))


def _parser() -> argparse.ArgumentParser:
    parser = cli.ArgumentParser(
        prog=cli.command_name("python -m gedl_jax.data.fetch"),
        description="Download and verify the official dataset files into the data folder.",
        epilog="datasets: " + ", ".join(f"{n} ({','.join(DATASETS[n].splits)})"
                                        for n in sorted(DATASETS)))
    parser.add_argument("datasets", nargs="*",
                        help="dataset[:split,split] (e.g. mnist kmnist:test); without splits: "
                             "every split but SVHN's 1.3 GB extra")
    parser.add_argument("--for", dest="for_dataset", default=None,
                        help="everything a run on this ID dataset needs (train, test, and the "
                             "test splits of its OOD sets)")
    parser.add_argument("--data_dir", default=None, help="data folder (else $GEDL_DATA_DIR, else "
                                                         "the default under the user's cache)")
    parser.add_argument("--mirror", default=None,
                        help=f"mirror URL or folder <mirror>/<dataset>/<file> (else ${ENV_MIRROR})")
    parser.add_argument("--cache_dir", default=None, help="cache folder (verified-file records)")
    parser.add_argument("--force", action="store_true", help="download again and replace")
    parser.add_argument("--list", action="store_true",
                        help="list every dataset's files, sizes and status here, and exit")
    return parser


def main(argv: Sequence[str] | None = None, *, printer: Callable[[str], None] = print) -> int:
    """The command line: one `error:` line and exit 2 on bad input (commands/cli.py)."""
    parser = _parser()

    def body(args: argparse.Namespace) -> int:
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        if args.list:
            root, origin = data_dir_origin(args.data_dir)
            note = ("\n(the default data folder; set $GEDL_DATA_DIR or --data_dir)"
                    if origin == "default" else "")
            printer(format_list(list_datasets(args.data_dir, args.cache_dir), root) + note)
            return 0
        wanted = parse_targets(args.datasets, args.for_dataset)
        if not wanted:
            raise ValueError("name at least one dataset, or --for=DATASET, or --list; "
                             f"`{parser.prog} --help` lists them")
        root = ensure_files(wanted, args.data_dir, download="force" if args.force else "auto",
                            mirror=args.mirror, cache_dir=args.cache_dir)
        printer(f"ok: {', '.join(f'{d}:{s}' for d, s in wanted)} present and verified in {root}")
        return 0

    return cli.run_argparse(parser, body, argv, codes=[((DataError,), cli.EXIT_BAD_INPUT)])


if __name__ == "__main__":
    sys.exit(main())
