"""What the scripts of benchmarks/ share: the real GEDL train step of `bin/benchmark.py`.

`bin/benchmark.py` (a user tool) holds `compiled_train_step`, the train step `gedl_jax.train` runs,
compiled on synthetic uint8 data resident on the device. bin/ holds standalone scripts, not a
package, so `bin_benchmark()` loads that file by its path, here and nowhere else, instead of
putting bin/ on `sys.path`. Importing this module imports nothing else (a torch-only Python can
import it).
"""

from __future__ import annotations

import functools
import importlib.util
import pathlib
import types

REPO = pathlib.Path(__file__).resolve().parents[1]


@functools.cache
def bin_benchmark() -> types.ModuleType:
    """`bin/benchmark.py` as a module (loaded once; it imports jax and gedl_jax)."""
    path = REPO / "bin" / "benchmark.py"
    spec = importlib.util.spec_from_file_location("gedl_jax_bin_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
