"""Pretrained models: registered, verified, loadable offline.

    from gedl_jax import pretrained
    pretrained.available()                     # {name: registry entry}
    model = pretrained.load("mnist/gedl")       # sha256 checked before use
    pred = model.predict(images_Nx28x28x1)     # probabilities, scores, alpha
    model.method, model.variables, model.config, model.eval_results

    python -m gedl_jax.evaluate --pretrained=mnist/gedl     # its results table, no training
    python -m gedl_jax.evaluate --pretrained=list           # every name, setting and numbers
    python -m gedl_jax.pretrained export --workdir=W --name=mnist/gedl --out=F.msgpack

Modules: fileformat.py (the single-file format), registry.py (names -> file, sha256,
provenance; shipped or downloaded), model.py (load, predict, evaluate), export.py (a run's best
checkpoint -> a file and a registry entry). The models and how they were made:
docs/pretrained.md.
"""

from gedl_jax.pretrained.fileformat import PretrainedFormatError
from gedl_jax.pretrained.model import Pretrained, evaluate, from_file, load
from gedl_jax.pretrained.registry import (
    ENV_REGISTRY,
    PACKAGE_REGISTRY,
    PretrainedChecksumError,
    PretrainedError,
    read_registry,
)


def available(registry=None) -> dict:
    """{name: registry entry} of every registered pretrained model."""
    return read_registry(registry)


def list_table(registry=None) -> str:
    """The registered models, one line each: name, setting, seed, headline numbers (%)."""
    models = read_registry(registry)
    if not models:
        return "no pretrained models registered"
    lines = []
    for name, entry in sorted(models.items()):
        numbers = ", ".join(f"{k} {v:.2f}" for k, v in entry.get("headline", {}).items())
        lines += [f"{name}: {entry.get('variant', '')} on {entry.get('dataset', '')}, "
                  f"{entry.get('setting', '')}, seed {entry.get('seed', '?')}",
                  f"    {entry.get('checkpoint', '')}; commit {entry.get('commit') or '?'}",
                  f"    % {numbers}"]
    return "\n".join(lines)


__all__ = ["ENV_REGISTRY", "PACKAGE_REGISTRY", "Pretrained", "PretrainedChecksumError",
           "PretrainedError", "PretrainedFormatError", "available", "evaluate", "from_file",
           "list_table", "load"]
