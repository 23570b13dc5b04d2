"""gedl-jax: Generalized Evidential Deep Learning in JAX/Flax.

Layers, each importing only the ones above it (docs/architecture.md):

- `evidential`: the Dirichlet math of the EDL family (pure functions of arrays, GEDL's W and tau);
- `evaluation`: scoring of predictions (metrics, scores, tables, plots), pure NumPy;
- `networks`: the Flax networks; `methods`: every method (its math, its `Method`, its builder);
- `data`: datasets (download, verification, loading);
- `run`: the run engine (setup, compiled steps, training loop, checkpoints, run evaluation);
- `train`, `evaluate`: the command lines.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

__version__ = "0.1.0"

# Modules moved by the 0.2 layout, importable under their old names for one release (with a
# DeprecationWarning); CHANGELOG.md lists them.
_MOVED = {
    **{f"gedl_jax.{m}": f"gedl_jax.run.{m}" for m in (
        "experiment", "programs", "steps", "sharding", "optimizer", "checkpointing", "rundir",
        "progress", "preemption")},
    **{f"gedl_jax.evaluation.{m}": f"gedl_jax.run.{m}" for m in (
        "workdir", "ensemble", "corruption_study", "inference")},
    **{f"gedl_jax.baselines.{m}": f"gedl_jax.methods.{m}" for m in (
        "daedl", "duq", "fedl", "postnet", "prior_networks")},
    "gedl_jax.baselines": "gedl_jax.methods",
    "gedl_jax.metrics": "gedl_jax.evaluation.metrics",
    "gedl_jax.models": "gedl_jax.networks",
    "gedl_jax.losses": "gedl_jax.evidential.loss",
    "gedl_jax.methods.networks": "gedl_jax.networks",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves an old module name to the module at its new place."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in _MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        new = _MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {new}; the old name goes in the next release",
                      DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module):
        pass


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.append(_MovedModules())


def __getattr__(name: str):
    """`gedl_jax.EvidentialObjective` (imported on first use); `from gedl_jax import steps` (an
    old name) still works for one release."""
    if f"gedl_jax.{name}" in _MOVED:
        return importlib.import_module(f"gedl_jax.{name}")
    if name in ("EvidentialObjective", "ObjectiveState"):   # the own-loop API, on first use
        return getattr(importlib.import_module("gedl_jax.methods.objective"), name)
    raise AttributeError(f"module 'gedl_jax' has no attribute {name!r}")
