"""Run a module's command line with the generated test files registered as official.

    python tests/fixture_cli.py <data_dir>/fixture_file_specs.json gedl_jax.train --workdir=...

The same as `python -m gedl_jax.train ...`, except that the small files the tests generate in the
official formats (tests/conftest.py, `write_generated_data`) pass the size and sha256 checks:
their FileSpecs are read from the JSON file and registered before the module runs.

With $GEDL_TEST_HOLD_AFTER_CHECKPOINT=N the process stops moving once a `last` checkpoint of
step N or later is on disk (it waits there until it is killed), so a kill-and-resume test kills
it at a known point however fast the platform trains (on a GPU the tiny run ends in a second).
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from contextlib import ExitStack


def _hold_after_checkpoint(step: int) -> None:
    import threading

    from gedl_jax.run import checkpointing

    save_last = checkpointing.RunCheckpoints.save_last

    def save_then_hold(self, at_step, state, meta):
        save_last(self, at_step, state, meta)
        if at_step >= step:
            self.wait()
            threading.Event().wait()   # until killed

    checkpointing.RunCheckpoints.save_last = save_then_hold


def main() -> None:
    specs_file, module, *args = sys.argv[1:]
    from gedl_jax.data import registry

    if os.environ.get("GEDL_TEST_HOLD_AFTER_CHECKPOINT"):
        _hold_after_checkpoint(int(os.environ["GEDL_TEST_HOLD_AFTER_CHECKPOINT"]))

    with open(specs_file) as f:
        specs = json.load(f)
    with ExitStack() as stack:
        for name, files in specs.items():
            by_file = {s["filename"]: registry.FileSpec(**s) for s in files}
            stack.enter_context(registry.override_file_specs(name, "official", by_file))
        sys.argv = [module, *args]
        runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
