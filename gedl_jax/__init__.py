"""gedl-jax: Generalized Evidential Deep Learning in JAX/Flax.

Layers, each importing only the ones above it (docs/architecture.md):

- `evidential`: the Dirichlet math of the EDL family (pure functions of arrays, GEDL's W and tau);
- `evaluation`: scoring of predictions (metrics, scores, tables, plots), pure NumPy;
- `networks`: the Flax networks; `methods`: every method (its math, its `Method`, its builder);
- `data`: datasets (download, verification, loading);
- `run`: the run engine (setup, compiled steps, training loop, checkpoints, run evaluation);
- `pretrained`: registered trained models; `train`, `evaluate`: the engine's entry points for code;
- `commands`: the command lines (`python -m gedl_jax.train` and the others forward to them).
"""

import importlib
import sys
import types
import warnings

__version__ = "0.1.0"

# Modules moved or renamed before 0.1.0: their old names still import in 0.1.0, with a
# DeprecationWarning (CHANGELOG.md lists them under 0.1.0's "Deprecated"); 0.2.0 removes this table.
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
    "gedl_jax.evidential.objectives": "gedl_jax.evidential.loss_terms",
    "gedl_jax.methods.objective": "gedl_jax.methods.own_loop",
    "gedl_jax.cli": "gedl_jax.commands.cli",
}


class _MovedModule(types.ModuleType):
    """An old module name: importing it costs nothing; reading a name from it warns once per
    name and reads it from the module at the new place (a module `__getattr__`, as optax
    deprecates names). Dunder names (`__file__`, `__spec__`, ...) are not forwarded, so tools
    that walk `sys.modules` (inspect, doctest, pytest) see an empty module and no warning."""

    def __init__(self, old: str, new: str):
        super().__init__(old, f"Deprecated: moved to {new}.")
        self.__dict__["_new_name"] = new

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        new = self.__dict__["_new_name"]
        warnings.warn(f"{self.__name__} moved to {new}; the old name goes in 0.2.0",
                      DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(new), name)


for _old, _new in _MOVED.items():
    sys.modules.setdefault(_old, _MovedModule(_old, _new))


def __getattr__(name: str):
    """`gedl_jax.EvidentialObjective` (imported on first use); `gedl_jax.steps` (an old name)
    still works in 0.1.0 (removed in 0.2.0)."""
    if f"gedl_jax.{name}" in _MOVED:
        return sys.modules[f"gedl_jax.{name}"]
    if name in ("EvidentialObjective", "ObjectiveState"):   # the own-loop API, on first use
        return getattr(importlib.import_module("gedl_jax.methods.own_loop"), name)
    raise AttributeError(f"module 'gedl_jax' has no attribute {name!r}")
