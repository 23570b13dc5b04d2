"""The command lines, on the top floor: each module parses one command's flags and makes calls
into the library, which imports nothing of this package (tests/test_layout.py).

- `train`: `python -m gedl_jax.train` (the entry points it calls: `gedl_jax.train`);
- `evaluate`: `python -m gedl_jax.evaluate` (a workdir's evaluation: `gedl_jax.evaluate`);
- `fetch`: `python -m gedl_jax.data.fetch`; `regenerate`: `python -m gedl_jax.data.regenerate`;
- `report`: `bin/report.py`; `compare`: `bin/compare_runs.py`;
- `pretrained`: `python -m gedl_jax.pretrained`;
- `cli`: what they all share (one-line errors, exit statuses, `--debug`).

The names users type stay the documented ones: `gedl_jax/train.py` and the others forward to
their command when run as a program (`if __name__ == "__main__":`, or a package's
`__main__.py`), and only then. `python -m gedl_jax.commands.<name>` runs a command too.
Imports nothing at import time.
"""
