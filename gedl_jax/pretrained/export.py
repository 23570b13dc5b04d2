"""Export a run's best checkpoint to a pretrained-model file, and register it.

The weights are the ones `python -m gedl_jax.evaluate --workdir=W` scores (`workdir.restore_run`:
the best-validation checkpoint, with the method's fit after training done), so the file
evaluates to the run's eval_results.json. Nothing machine-specific is stored: the config's data,
cache and mirror locations are cleared (the user's own apply), and the results' "workdir" and
"plots" entries (paths) are dropped.
"""

from __future__ import annotations

import hashlib
import json
import pathlib
import re
from typing import Any

from gedl_jax import methods
from gedl_jax.pretrained import fileformat
from gedl_jax.pretrained.registry import PathLike, PretrainedError
from gedl_jax.run import workdir

# Where this machine keeps things, not what the model is: cleared in the exported config.
LOCATION_FIELDS = ("data_dir", "cache_dir", "tfds_data_dir", "data_mirror")
# How the run was spread over machines: a pretrained model is evaluated on one.
SINGLE_PROCESS = {"distributed": False, "coordinator_address": "", "num_processes": 0,
                  "process_id": -1}
# Result entries that name paths of the run's machine (the provenance of the evaluation, not a
# number): not stored, and not compared when a pretrained evaluation is checked against them.
PATH_RESULT_KEYS = ("workdir", "plots")
_ABSOLUTE = re.compile(r"(^|[\s,=:])(/|[A-Za-z]:\\|~/)")


def portable_config(config) -> dict[str, Any]:
    """The run's resolved config as JSON-able fields, with the location fields cleared; an
    error if any other field holds a path of this machine (e.g. an extra OOD folder)."""
    fields = json.loads(json.dumps(config.to_dict()))
    for key in LOCATION_FIELDS:
        if key in fields:
            fields[key] = ""
    fields.update({k: v for k, v in SINGLE_PROCESS.items() if k in fields})
    bad = [k for k, v in fields.items() if isinstance(v, str) and _ABSOLUTE.search(v)]
    bad += [k for k, v in fields.items() if isinstance(v, list)
            and any(isinstance(x, str) and _ABSOLUTE.search(x) for x in v)]
    if bad:
        raise PretrainedError(f"config field(s) {sorted(bad)} hold paths of this machine; a "
                              f"pretrained model must not depend on them: export a run without "
                              f"them (e.g. evaluate extra OOD folders with --extra_ood)")
    return fields


def portable_results(results: dict[str, Any]) -> dict[str, Any]:
    """eval_results.json without the entries that name paths (`PATH_RESULT_KEYS`)."""
    return {k: v for k, v in results.items() if k not in PATH_RESULT_KEYS}


def _checkpoint_source(workdir_path: pathlib.Path, step: int) -> dict[str, Any]:
    """The best checkpoint's loop metadata (epoch, validation accuracy), if it was saved."""
    meta = workdir_path / "checkpoints" / "best" / str(step) / "meta" / "metadata"
    source: dict[str, Any] = {"checkpoint": "best", "step": step}
    if meta.is_file():
        saved = json.loads(meta.read_text())
        source.update({k: saved[k] for k in ("epoch", "best_val_accuracy") if k in saved})
    else:
        source["checkpoint"] = "last (no best checkpoint was saved)"
    return source


def export_workdir(workdir_dir: PathLike, out: PathLike, *,
                   results: PathLike | None = None) -> dict[str, Any]:
    """Write `workdir_dir`'s best checkpoint, config and evaluation (`results`, default the
    workdir's eval_results.json) to the model file `out`; returns the registry fields it
    knows (file, size, sha256, weights_sha256, dataset, variant, method, seed, checkpoint,
    headline)."""
    workdir_dir = pathlib.Path(workdir_dir)
    results_path = pathlib.Path(results or workdir_dir / "eval_results.json")
    if not results_path.is_file():
        raise PretrainedError(f"{results_path} does not exist: evaluate the run first "
                              f"(python -m gedl_jax.evaluate --workdir={workdir_dir})")
    if workdir.saved_config(workdir_dir).ensemble_size:
        raise PretrainedError("a deep ensemble's workdir cannot be exported (yet): export its "
                              "members one by one")
    run = workdir.restore_run(workdir_dir)
    exp, state = run.experiment, run.state
    setup = methods.MethodSetup.from_labels(exp.data.train.labels, exp.config.num_classes,
                                            exp.data.train.images.shape[1:])
    mean, std = exp.normalization
    evaluation = portable_results(json.loads(results_path.read_text()))
    metadata = {
        "config": portable_config(exp.config),
        "eval_results": evaluation,
        "setup": {"num_classes": setup.num_classes, "class_counts": list(setup.class_counts),
                  "image_shape": list(setup.image_shape)},
        "normalization": None if mean is None else [list(mean), list(std)],
        "source": _checkpoint_source(workdir_dir, int(state.step)),
        "weights_sha256": fileformat.weights_sha256(state.variables, state.method_state),
    }
    blob = fileformat.write(out, metadata, state.variables, state.method_state)
    return {"file": pathlib.Path(out).name, "size": len(blob),
            "sha256": hashlib.sha256(blob).hexdigest(),
            "weights_sha256": metadata["weights_sha256"], "dataset": exp.config.dataset,
            "variant": exp.config.variant, "method": evaluation.get("method", ""),
            "seed": int(exp.config.seed), "checkpoint": _describe(metadata["source"]),
            "headline": headline(evaluation)}


def reexport(name: str, registry_json: PathLike | None = None) -> dict[str, Any]:
    """Write the registered model `name`'s file again in the current format: the same weights,
    method state and metadata, bit for bit, with the checksum of its weights recorded inside
    (files exported before the format recorded it lack it), once the weights are checked
    against the registry entry's `weights_sha256`. The entry's sha256 and size follow the new
    bytes (a changed file's url is dropped: the hosted file is the old one). Only a file beside
    its registry (a shipped model, or one of your own registry's). Returns the new entry."""
    from gedl_jax.pretrained import registry

    entry = registry.get_entry(name, registry_json)
    reg = registry.registry_path(registry_json)
    path = reg.parent / entry["file"]
    if not path.is_file():
        raise PretrainedError(f"{name}: {entry['file']} is not beside {reg}: only a file "
                              f"beside its registry is exported again")
    registry.model_file(name, registry_json)   # its bytes are the registered ones
    metadata, variables, method_state = fileformat.from_bytes(path.read_bytes(), str(path))
    digest = fileformat.weights_sha256(variables, method_state)
    recorded = {v for v in (entry.get("weights_sha256"), metadata.get("weights_sha256")) if v}
    if recorded != {digest}:
        raise PretrainedError(f"{name}: its weights' checksum {digest[:16]}... is not the "
                              f"recorded one ({', '.join(sorted(recorded)) or 'none recorded'})"
                              f": it cannot be vouched for; export it from its run instead")
    blob = fileformat.write(path, {**metadata, "weights_sha256": digest}, variables,
                            method_state)
    new = {**entry, "size": len(blob), "sha256": hashlib.sha256(blob).hexdigest(),
           "weights_sha256": digest}
    if new["sha256"] != entry["sha256"] and new.get("url"):
        new["url"] = ""
    registry.write_entry(reg, name, new)
    return new


def _describe(source: dict[str, Any]) -> str:
    text = f"{source['checkpoint']} checkpoint, step {source['step']}"
    if "epoch" in source:
        text += f" (epoch {source['epoch']}"
        if "best_val_accuracy" in source:
            text += f", validation accuracy {100 * source['best_val_accuracy']:.2f}%"
        text += ")"
    return text


def headline(results: dict[str, Any]) -> dict[str, float]:
    """The paper's columns in %: accuracy, Conf. AUPR by MP, and per OOD set AUPR by MP and
    UM (in-distribution positive), rounded to 2 decimals."""
    out = {"accuracy": results["id"]["accuracy"]}
    misc = results["id"].get("misclassification", {})
    if "mp" in misc:
        out["conf_mp"] = misc["mp"]["aupr"]
    for name, ood in results.get("ood", {}).items():
        for score in ("mp", "um"):
            if score in ood.get("detection", {}):
                out[f"{name}_{score}"] = ood["detection"][score]["aupr_in"]
    return {k: round(100 * float(v), 2) for k, v in out.items()}
