"""A pretrained model, loaded: its method, variables and config, ready to predict or evaluate.

    from gedl_jax import pretrained
    model = pretrained.load("mnist/gedl")
    pred = model.predict(images_Nx28x28x1_uint8)     # core.Predictions: probs, scores, alpha
    model.method, model.variables, model.config        # to call method.predict yourself

Evaluation reuses the workdir path (`gedl_jax.run.workdir.evaluate_run`): the same predictor,
metrics and result files as `python -m gedl_jax.evaluate --workdir=DIR`, so a model evaluates
to the same numbers as the run it was exported from.
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

from gedl_jax import data, methods
from gedl_jax.evaluation import core
from gedl_jax.pretrained import fileformat
from gedl_jax.pretrained.registry import PathLike, PretrainedError, model_file
from gedl_jax.run import experiment, sharding, steps, workdir


@dataclasses.dataclass(frozen=True)
class Pretrained:
    """A pretrained model. `variables` are the flax variables `method` applies, `method_state`
    the method's state after training; `metadata` holds the run's committed evaluation
    ("eval_results"), the setup and where the weights come from ("source")."""

    name: str
    config: Any
    method: methods.Method
    variables: dict[str, Any]
    method_state: Any
    normalization: tuple[tuple[float, ...] | None, tuple[float, ...] | None]
    metadata: dict[str, Any]

    @property
    def eval_results(self) -> dict[str, Any]:
        """The committed evaluation of the run the weights come from."""
        return self.metadata["eval_results"]

    def restored_run(self, run_data: experiment.RunData | None = None) -> workdir.RestoredRun:
        """The model as a `RestoredRun` (the object the workdir evaluation scores); `run_data`:
        the test and OOD sets to evaluate on."""
        exp = experiment.Experiment(self.config, run_data or _no_data(self), self.method,
                                    self.normalization)
        mesh = sharding.make_mesh()
        state = steps.TrainState(step=jnp.asarray(self.metadata["source"].get("step", 0),
                                                  jnp.int32),
                                 params=self.variables["params"],
                                 model_state={k: v for k, v in self.variables.items()
                                              if k != "params"},
                                 opt_state=None, method_state=self.method_state)
        return workdir.RestoredRun(exp, jax.device_put(state, sharding.replicated(mesh)), mesh)

    def predict(self, images: np.ndarray, labels: np.ndarray | None = None,
                batch_size: int | None = None) -> core.Predictions:
        """`core.Predictions` of N images (N x H x W x C uint8 pixels 0..255, as the datasets
        load, or float32 in [0, 1]); with `labels`, the ID metrics can be computed from them."""
        images = np.asarray(images)
        if images.ndim == len(self.metadata["setup"]["image_shape"]):
            images = images[None]
        _check_shape(self, images.shape[1:], "the images")
        split = data.Split(images, np.zeros(len(images), np.int32) if labels is None
                           else np.asarray(labels, np.int32), f"{self.name} input")
        return workdir.predict(self.restored_run(), split, with_labels=labels is not None,
                               batch_size=batch_size)


def _check_shape(model: Pretrained, shape: tuple[int, ...], what: str) -> None:
    expected = tuple(model.metadata["setup"]["image_shape"])
    if tuple(shape) != expected:
        raise PretrainedError(f"{what} have shape {tuple(shape)} per example, but {model.name} "
                              f"reads {expected}")


def _no_data(model: Pretrained) -> experiment.RunData:
    """Empty splits: the model needs no data to predict (its setup is in the file)."""
    shape = tuple(model.metadata["setup"]["image_shape"])
    empty = data.Split(np.zeros((0, *shape), np.uint8 if len(shape) == 3 else np.float32),
                       np.zeros(0, np.int32), f"{model.config.dataset} (not loaded)")
    return experiment.RunData(train=empty, validation=empty, test=empty, ood={},
                              train_index=np.zeros(0, np.int64))


def from_file(path: PathLike, name: str | None = None,
              overrides: dict[str, Any] | None = None,
              registered_weights: str | None = None, *,
              unverified_weights: bool = False) -> Pretrained:
    """A model file (`fileformat`), loaded (its bytes are not verified against a registry:
    `load` does). Its weights must match the checksum the file records, whatever the registry
    says, and `registered_weights` (a registry entry's "weights_sha256") when given. A file
    that records none is refused unless `unverified_weights=True` says to use it unverified."""
    path = pathlib.Path(path)
    metadata, variables, state_dict = fileformat.from_bytes(path.read_bytes(), str(path))
    _check_weights(metadata, variables, state_dict, registered_weights, name or path.name, path,
                   unverified_weights)
    # Resolved once, as a run's config is (validated, read-only, its text fields parsed).
    config = experiment.resolve_config(workdir.config_from_saved(metadata["config"], overrides),
                                       sharding.make_mesh().size)
    setup = methods.MethodSetup(int(metadata["setup"]["num_classes"]),
                                tuple(int(c) for c in metadata["setup"]["class_counts"]),
                                tuple(int(s) for s in metadata["setup"]["image_shape"]))
    method = methods.build(config, setup)
    _check_variables(method, setup.image_shape, variables, name or path.name)
    norm = metadata.get("normalization")
    normalization = (tuple(norm[0]), tuple(norm[1])) if norm else (None, None)
    return Pretrained(name or path.stem, config, method, jax.tree.map(jnp.asarray, variables),
                      _method_state(method, state_dict), normalization, metadata)


def _check_weights(metadata: dict[str, Any], variables: dict, state_dict: dict,
                   registered: str | None, name: str, path: pathlib.Path,
                   unverified: bool = False) -> None:
    if not metadata.get("weights_sha256") and not unverified:
        raise PretrainedError(
            f"{name}: {path} records no checksum of its weights: export it again, or use it "
            f"unverified (unverified_weights=True; evaluate --unverified_weights)\n"
            f"  nothing shows its weights are the ones its stored results were measured with "
            f"(python -m gedl_jax.pretrained reexport records the checksum)")
    recorded = {v for v in (metadata.get("weights_sha256"), registered) if v}
    if not recorded:   # no checksum anywhere, and the caller said to use it unverified
        return
    digest = fileformat.weights_sha256(variables, state_dict)
    if recorded != {digest}:
        accuracy = metadata.get("eval_results", {}).get("id", {}).get("accuracy")
        claim = f"; its stored results (accuracy {accuracy:.2%}) are not theirs" \
            if isinstance(accuracy, (int, float)) else ""
        expected = ", ".join(sorted(f"{r[:16]}..." for r in recorded))
        raise PretrainedError(
            f"{name}: the weights in {path} are not the ones it was exported with: use the "
            f"original file, or export the run again (python -m gedl_jax.pretrained export)\n"
            f"  weights sha256 {digest[:16]}..., recorded {expected}{claim}: the file was "
            f"changed after export")


def _check_variables(method: methods.Method, image_shape: tuple[int, ...], variables: dict,
                     name: str) -> None:
    """The stored variables have the tree, shapes and dtypes the method's model makes (a
    clear error instead of a shape error deep inside flax)."""
    expected = jax.eval_shape(lambda k: method.init(k, image_shape), jax.random.PRNGKey(0))
    want = {jax.tree_util.keystr(p): (tuple(x.shape), str(x.dtype))
            for p, x in jax.tree_util.tree_leaves_with_path(dict(expected))}
    have = {jax.tree_util.keystr(p): (tuple(np.shape(x)), str(np.asarray(x).dtype))
            for p, x in jax.tree_util.tree_leaves_with_path(variables)}
    if want != have:
        diff = sorted(set(want.items()) ^ set(have.items()))[:3]
        raise PretrainedError(f"{name}: the stored variables do not fit the model its config "
                              f"builds (first differences: {diff}); the file was written by "
                              f"another version of gedl-jax")


def _method_state(method: methods.Method, state_dict: dict) -> Any:
    """The stored method state in the method's own pytree type (e.g. GEDL's TauState); a state
    made by the method's fit (DAEDL) is a plain map of arrays."""
    template = method.init_method_state()
    if not jax.tree.leaves(template):
        return jax.tree.map(jnp.asarray, state_dict)
    return jax.tree.map(jnp.asarray, serialization.from_state_dict(template, state_dict))


def load(name: str, *, registry: PathLike | None = None, overrides: dict[str, Any] | None = None,
         download: str | None = None, mirror: str | None = None,
         unverified_weights: bool = False) -> Pretrained:
    """The registered pretrained model `name` (e.g. "mnist/gedl"), its file verified (sha256)
    before use, and its weights against the checksum the file records (`from_file`; a file
    without one only with `unverified_weights=True`). `registry`: another registry JSON (else
    $GEDL_PRETRAINED_REGISTRY, else the package's); `overrides`: config fields to change (e.g.
    data_dir)."""
    from gedl_jax.pretrained.registry import get_entry

    return from_file(model_file(name, registry, download=download, mirror=mirror), name,
                     overrides, get_entry(name, registry).get("weights_sha256"),
                     unverified_weights=unverified_weights)


def evaluation_data(model: Pretrained) -> experiment.RunData:
    """The model's test set and OOD sets (config.ood_datasets and extra_ood), and the validation
    split its run held out (the same seeded split of the official training split, for the
    conformal sets and the post-hoc calibration), loaded from the data folder (fetched when
    missing and allowed, as for a run). Without the training split's files the validation
    split is empty and the sections that need it are left out, with a note saying so."""
    config = model.config
    sources = dict(experiment.DataSources.from_config(config).kwargs(),
                   download=config.get("download", "auto"),
                   mirror=config.get("data_mirror", "") or None)
    test = data.load_split(config.dataset, "test", **sources).subset(config.eval_examples)
    ood = {}
    for name in config.ood_datasets + config.extra_ood:
        ood[name] = data.load_ood(name, **sources).subset(config.eval_examples)
        _check_shape(model, ood[name].image_shape, f"the OOD set {name!r}")
    try:
        train = data.load_split(config.dataset, "train", **sources)
    except data.DataError as e:
        print(f"note: no validation split ({e}); the conformal sets and the post-hoc "
              f"calibration need it and are left out", file=sys.stderr)
        empty = _no_data(model).train
        return experiment.RunData(train=empty, validation=empty, test=test, ood=ood,
                                  train_index=np.zeros(0, np.int64))
    seed = int(model.eval_results.get("seed", 0))
    return experiment.OfficialData(train, test, ood).for_seed(config, seed)


class StoredAccuracyError(PretrainedError):
    """A pretrained model's measured accuracy is not its stored one (`evaluate(strict=True)`)."""


def evaluate(name: str, results_dir: PathLike, extra_ood: tuple[str, ...] = (), *,
             registry: PathLike | None = None,
             overrides: dict[str, Any] | None = None, unverified_weights: bool = False,
             strict: bool = False) -> dict[str, Any]:
    """Evaluate the pretrained model `name` on its test and OOD sets (plus `extra_ood`) and
    write eval_results.json and eval_table.md into `results_dir` (the workdir evaluation's
    files); prints the results table. A measured accuracy whose bootstrap interval does not
    hold the accuracy the file stores (`stored_accuracy_mismatch`) prints a warning line, or
    with `strict` raises `StoredAccuracyError` once the results are written."""
    model = load(name, registry=registry, overrides=overrides,
                 unverified_weights=unverified_weights)
    results_dir = pathlib.Path(results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    results = workdir.evaluate_run(model.restored_run(evaluation_data(model)), results_dir,
                                   extra_ood)
    mismatch = stored_accuracy_mismatch(model, results)
    if mismatch and strict:
        raise StoredAccuracyError(mismatch)
    if mismatch:
        print(f"warning: {mismatch}", file=sys.stderr, flush=True)
    return results


def stored_accuracy_mismatch(model: Pretrained, results: dict[str, Any],
                             samples: int = 1000, seed: int = 0) -> str | None:
    """A line when the test accuracy the file stores lies outside the bootstrap interval
    (`samples` resamples of the test images, at the config's bootstrap_confidence and
    bootstrap_interval) of the accuracy measured now; None when it lies inside, or when
    either is missing. The weights are checked before use; this catches the rest: other
    test data, another library computing other predictions."""
    from gedl_jax.evaluation import bootstrap

    stored = model.eval_results.get("id", {}).get("accuracy")
    measured = results.get("id", {})
    n, correct = int(measured.get("num_examples", 0)), int(measured.get("num_correct", 0))
    if stored is None or n < 2:
        return None
    correct_N = np.arange(n) < correct
    values = [float(correct_N[idx].mean()) for idx in
              bootstrap.resample_indices(n, samples, seed, "id")]
    confidence = float(model.config.get("bootstrap_confidence", 0.95))
    bounds = bootstrap.interval(np.asarray(values), confidence,
                                str(model.config.get("bootstrap_interval", "percentile")),
                                correct / n)
    if bounds["low"] <= stored <= bounds["high"]:
        return None
    return (f"{model.name}: the accuracy it stores, {stored:.2%}, lies outside the "
            f"{confidence:.0%} bootstrap interval [{bounds['low']:.2%}, {bounds['high']:.2%}] of "
            f"the {correct / n:.2%} measured now on {n:,} test images: other data or other "
            f"weights than the export's")
