"""Compare two evaluated runs, or two methods' runs over seeds, on the same examples: the
command line of bin/compare_runs.py, over `gedl_jax.evaluation.compare` (whose docstring says
what the numbers mean).

    gedl-compare RUN_A RUN_B [--bootstrap_samples=2000] [--bootstrap_confidence=0.95]
                 [--bootstrap_seed=0] [--scores=mp,um] [--calibrate] [--out=FILE.md|FILE.json]

(`python bin/compare_runs.py` in a clone.) The bootstrap's flags are named as the config fields
of the evaluation's own intervals (config.bootstrap_samples, ...).
"""

from __future__ import annotations

import json
import pathlib
import sys
from collections.abc import Sequence
from typing import Any

from gedl_jax import files
from gedl_jax.commands import cli
from gedl_jax.evaluation import bootstrap, core
from gedl_jax.evaluation.compare import compare_runs, paired_table

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (gedl-compare, bin/compare_runs.py): bad input is one `error:` line and
    exit 2."""
    parser = cli.ArgumentParser(
        prog=cli.command_name("python bin/compare_runs.py"),
        description="Compare two evaluated runs, or two methods' runs over seeds, on the "
                    "same examples: a paired bootstrap of every metric's difference A - B.")
    parser.add_argument("run_a", help="run A: its results folder (predictions.npz) or the "
                                      "file; a folder of seed_* runs; or several joined by "
                                      "commas (a method's seeds)")
    parser.add_argument("run_b", help="run B, the same way, on the same test set")
    parser.add_argument("--bootstrap_samples", type=int, default=2000,
                        help="bootstrap replicates (default 2000)")
    parser.add_argument("--bootstrap_confidence", type=float, default=0.95,
                        help="the intervals' level (default 0.95)")
    parser.add_argument("--bootstrap_seed", type=int, default=0,
                        help="seeds the bootstrap's draws (default 0)")
    parser.add_argument("--bootstrap_interval", choices=bootstrap.INTERVAL_METHODS,
                        default="percentile",
                        help="percentile (default), or basic: the percentile bounds reflected "
                             "about the difference on all examples")
    parser.add_argument("--scores", help="comma-separated scores (default: mp,um where every "
                                         "run has them); the post-hoc OOD scores the runs "
                                         "saved (energy, ...) too")
    parser.add_argument("--calibrate", action="store_true",
                        help="compare the calibrated predictions: each run's calibrator (its "
                             "evaluation's: evidence scaling for the EDL family, temperature "
                             "scaling otherwise) fitted on its validation predictions")
    parser.add_argument("--calibrator", choices=core.CALIBRATORS,
                        help="with --calibrate, this calibrator for every run")
    parser.add_argument("--out", help="also write the table (.md) or the numbers (.json) here")
    return cli.run_argparse(parser, _main, argv, renamed=cli.RENAMED_FLAGS["compare"])


def _main(args: Any) -> int:
    if args.calibrator and not args.calibrate:
        raise ValueError("--calibrator chooses the calibrator of --calibrate; add --calibrate")
    comparison = compare_runs(args.run_a, args.run_b, args.bootstrap_samples,
                              args.bootstrap_confidence, args.bootstrap_seed,
                              args.scores.split(",") if args.scores else None,
                              args.calibrate, args.calibrator, args.bootstrap_interval)
    text = paired_table(comparison)
    print(text, end="")
    if args.out:
        out = pathlib.Path(args.out)
        files.write_text(out, json.dumps(comparison, indent=2) if out.suffix == ".json"
                         else text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
