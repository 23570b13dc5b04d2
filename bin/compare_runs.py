"""Compare two evaluated runs, or two methods' runs over seeds, on the same examples: a paired
bootstrap of every metric's difference A - B, with its interval and how often A is better.

    gedl-compare RUN_A RUN_B [--bootstrap_samples=2000] [--bootstrap_confidence=0.95]
                 [--bootstrap_seed=0] [--scores=mp,um] [--calibrate] [--out=FILE.md|FILE.json]

(`gedl-compare` once installed; `python bin/compare_runs.py` in a clone.)

RUN_A and RUN_B are results folders of `python -m gedl_jax.evaluate` or `gedl_jax.train`
(their predictions.npz) on the same test set, folders of seed_* runs, or several run folders
joined by commas; gedl_jax/evaluation/compare.py says what the numbers mean (the command line:
gedl_jax/commands/compare.py).
"""

import sys

from gedl_jax.commands.compare import main

if __name__ == "__main__":
    sys.exit(main())
