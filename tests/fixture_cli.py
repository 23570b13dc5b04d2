"""Run a module's command line with the generated test files registered as official.

    python tests/fixture_cli.py <data_dir>/fixture_file_specs.json gedl_jax.train --workdir=...

The same as `python -m gedl_jax.train ...`, except that the small files the tests generate in the
official formats (tests/conftest.py, `write_generated_data`) pass the size and sha256 checks:
their FileSpecs are read from the JSON file and registered before the module runs.
"""

from __future__ import annotations

import json
import runpy
import sys
from contextlib import ExitStack


def main() -> None:
    specs_file, module, *args = sys.argv[1:]
    from gedl_jax.data import registry

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
