"""Paper-style tables (mean ± std over seeds) of every eval_results.json under a folder, grouped
by dataset and method: the command line of bin/report.py (whose docstring says what it reads and
prints), over `gedl_jax.evaluation.report`.

    gedl-report RUNS_DIR [--latex] [--out=FILE] [--json=AGG.json] [--ood_datasets=KMNIST,FMNIST]

(`python bin/report.py` in a clone.)
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from gedl_jax import files
from gedl_jax.commands import cli
from gedl_jax.evaluation.report import RESULTS_FILENAME, aggregate, load_runs, results_table

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (gedl-report, bin/report.py): bad input is one `error:` line and exit 2
    (commands/cli.py)."""
    parser = cli.ArgumentParser(
        prog=cli.command_name("python bin/report.py"),
        description="Paper-style table (mean ± std over seeds) of every eval_results.json under "
                    "RUNS_DIR, grouped by dataset and method.")
    parser.add_argument("runs_dir", help="folder searched recursively for eval_results.json")
    parser.add_argument("--latex", action="store_true", help="LaTeX (booktabs) instead of markdown")
    parser.add_argument("--out", help="also write the tables to this file")
    parser.add_argument("--json", help="write the aggregated numbers {dataset: {method: ...}}")
    parser.add_argument("--ood_datasets", help="the OOD sets the tables show, comma-separated, "
                                               "in their order (default: every set the runs "
                                               "have)")
    parser.add_argument("--no_extra", action="store_true",
                        help="only the main table (no calibration / detection-detail tables)")
    return cli.run_argparse(parser, _main, argv, renamed=cli.RENAMED_FLAGS["report"])


def _main(args: Any) -> int:
    grouped = load_runs(args.runs_dir)
    if not grouped:
        raise FileNotFoundError(f"no {RESULTS_FILENAME} under {args.runs_dir}: give the folder "
                                f"of evaluated runs (python -m gedl_jax.evaluate writes it)")
    ood_names = args.ood_datasets.split(",") if args.ood_datasets else None
    texts, aggregated = [], {}
    for dataset, methods in grouped.items():
        for method, runs in methods.items():
            seeds = [r["seed"] for r in runs if "seed" in r]
            if len(seeds) != len(set(map(str, seeds))):
                print(f"warning: {method}: duplicate seeds {seeds}", file=sys.stderr)
        title = dataset or "results"
        heading = (f"% ---- {title} ----" if args.latex else f"## {title}")
        texts.append(heading + "\n\n" + results_table(
            methods, fmt="latex" if args.latex else "markdown", ood_names=ood_names,
            extra=not args.no_extra))
        aggregated[str(title)] = {m: aggregate(runs) for m, runs in methods.items()}
    text = "\n".join(texts)
    print(text, end="")
    if args.out:
        files.write_text(args.out, text)
    if args.json:
        files.write_text(args.json, json.dumps(aggregated, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
