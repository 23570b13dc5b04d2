"""Pretrained models: registered, verified, loadable offline.

    from gedl_jax import pretrained
    pretrained.available()                     # {name: registry entry}
    model = pretrained.load("mnist/gedl")       # sha256 and the weights' checksum checked
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

import re

from gedl_jax.pretrained.fileformat import PretrainedFormatError
from gedl_jax.pretrained.model import (
    Pretrained,
    StoredAccuracyError,
    evaluate,
    from_file,
    load,
    stored_accuracy_mismatch,
)
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


# Headline keys -> the paper's column names; OOD sets not named here keep their own names.
_COLUMNS = {"accuracy": "Acc", "conf_mp": "Conf. MP", "kmnist": "KMNIST",
            "fashion_mnist": "FMNIST", "svhn": "SVHN", "cifar100": "CIFAR-100"}


def markdown_table(registry=None) -> str:
    """The registered models as Markdown tables, one per dataset (docs/pretrained.md holds this
    command's output): name, setting, checkpoint, trained on, the headline numbers (%) and
    where the results are committed."""
    models = read_registry(registry)
    blocks = []
    for dataset in sorted({e.get("dataset", "") for e in models.values()}):
        entries = {n: e for n, e in sorted(models.items()) if e.get("dataset", "") == dataset}
        keys = list(dict.fromkeys(k for e in entries.values() for k in e.get("headline", {})))
        found = [k.rsplit("_", 1)[0] for k in keys
                 if k.endswith(("_mp", "_um")) and k != "conf_mp"]
        oods = sorted(set(found), key=lambda o: (list(_COLUMNS).index(o) if o in _COLUMNS
                                                 else len(_COLUMNS), o))
        head = ["name", "setting", "best checkpoint", "trained on",
                *[_COLUMNS[k] for k in ("accuracy", "conf_mp") if k in keys],
                *[f"{_COLUMNS.get(o, o)} MP / UM" for o in oods], "results"]
        rows = [f"| {' | '.join(head)} |",
                "|" + "|".join("---:" if 4 <= i < len(head) - 1 else "---"
                               for i in range(len(head))) + "|"]
        for name, e in entries.items():
            h = e.get("headline", {})

            def num(k, h=h):
                return f"{h[k]:.2f}" if k in h else "-"
            best = re.search(r"epoch (\d+), validation accuracy ([\d.]+%)",
                             e.get("checkpoint", ""))
            cells = [f"`{name}`", e.get("setting", "").split(" (")[0] or "?",
                     f"epoch {best[1]} (val. {best[2]})" if best else e.get("checkpoint", ""),
                     e.get("hardware", "").split(", ")[0] or "?",
                     *[num(k) for k in ("accuracy", "conf_mp") if k in keys],
                     *[f"{num(o + '_mp')} / {num(o + '_um')}" for o in oods],
                     f"`{e['results_dir']}`" if e.get("results_dir") else "-"]
            rows.append(f"| {' | '.join(cells)} |")
        blocks.append("\n".join(rows))
    return "\n\n".join(blocks) if blocks else "no pretrained models registered"


__all__ = ["ENV_REGISTRY", "PACKAGE_REGISTRY", "Pretrained", "PretrainedChecksumError",
           "PretrainedError", "PretrainedFormatError", "StoredAccuracyError", "available",
           "evaluate", "from_file", "list_table", "load", "markdown_table",
           "stored_accuracy_mismatch"]
