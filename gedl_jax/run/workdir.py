"""Evaluating runs: restore a workdir, predict with its method, write the results.

Works for every method (`gedl_jax.methods`): predictions come from `method.predict` over padded
batches (`evaluation.inference`) and `method.predictions`, and the metrics from
`evaluate_predictions`, which never ask which method ran. Imports nothing from training: a run
is rebuilt from its saved config with `experiment.Experiment`, the same setup training used.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import time
from typing import Any

import jax
import numpy as np

from gedl_jax import config as config_lib
from gedl_jax import data, files, networks
from gedl_jax.evaluation import bootstrap, core, posthoc, report, saved, sections
from gedl_jax.methods import common
from gedl_jax.networks import user
from gedl_jax.run import (
    checkpointing,
    experiment,
    heartbeat,
    inference,
    numerics,
    optimizer,
    preemption,
    rundir,
    sharding,
    steps,
)
from gedl_jax.run.heartbeat import log
from gedl_jax.run.progress import format_eta

__all__ = ["PREDICTIONS_FILENAME", "RestoredRun", "config_from_saved", "evaluate_and_write",
           "evaluate_run", "evaluation_options", "fitted", "predict", "predict_outputs",
           "restore_run", "saved_config", "write_results"]

PREDICTIONS_FILENAME = "predictions.npz"


@dataclasses.dataclass(frozen=True)
class RestoredRun:
    """A trained run, ready to predict: its setup, its best state (fitted where the method
    fits after training) and the mesh it lives on."""

    experiment: experiment.Experiment
    state: steps.TrainState
    mesh: Any

    @property
    def config(self):
        return self.experiment.config


def fitted(exp: experiment.Experiment, state: steps.TrainState) -> steps.TrainState:
    """The state with the method's after-training fit done (`Method.fit`; deterministic)."""
    if not exp.method.needs_fit:
        return state
    def batches(split: data.Split):
        return inference.training_batches(split, exp.config.eval_batch_size, *exp.normalization)

    with numerics.precision(exp.config):   # the products the run trained with, on any path
        return state.replace(method_state=exp.method.fit(state.variables, state.method_state,
                                                         batches(exp.data.train),
                                                         batches(exp.data.validation)))


def predict(run: RestoredRun, split: data.Split, with_labels: bool = True,
            batch_size: int | None = None, on_batch=None) -> core.Predictions:
    """The run's `Predictions` on every example of `split`, under the products the run trained
    with (`config.matmul_precision`), whatever precision the caller's code is under: the
    predictions behind a written evaluation, recomputed in a notebook, are the same numbers
    (the same compiled predictor)."""
    return _predict_with_posthoc(run, split, with_labels, batch_size, on_batch,
                                 posthoc=False)[0]


def _predict_with_posthoc(run: RestoredRun, split: data.Split, with_labels: bool = True,
                          batch_size: int | None = None, on_batch=None, posthoc: bool = True
                          ) -> tuple[core.Predictions, dict[str, np.ndarray]]:
    """`predict`'s Predictions and, for a `Method.posthoc_from_logits` method, the network's
    logits ("logits_BxK") and a protocol network's features ("features_BxF") from the same
    pass ({} otherwise, or with `posthoc` False), for the post-hoc OOD scores."""
    raw, outputs = _raw_outputs(run, split, batch_size, on_batch, posthoc)
    return (run.experiment.method.predictions(raw, split.labels if with_labels else None),
            outputs)


def _raw_outputs(run: RestoredRun, split: data.Split, batch_size: int | None = None,
                 on_batch=None, posthoc: bool = True
                 ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The predictor's outputs on `split`: (the method's raw outputs, the post-hoc ones; {}
    with `posthoc` False, when they are not fetched: the program is the same, so the
    predictions are too, and a set's features never cross to the host unused)."""
    exp = run.experiment
    step = _predict_step(exp, run.mesh)
    keep = None if posthoc else (lambda name: not name.startswith(steps.POSTHOC_PREFIX))
    with numerics.precision(exp.config):
        raw = inference.predict_split(step, run.state.variables, run.state.method_state,
                                      run.mesh, split, batch_size or exp.config.eval_batch_size,
                                      experiment.predict_key(exp.seed), on_batch=on_batch,
                                      keep_output=keep)
    return steps.split_posthoc(raw)


_PREDICT_STEPS: dict[Any, Any] = {}


def _predict_step(exp: experiment.Experiment, mesh):
    """One compiled predictor per (method, normalisation, mesh): every set of a run, and every
    corruption of a study, reuses it. A method whose predictions are a function of its
    network's logits gets the post-hoc outputs from the same program: one network pass scores
    a set both ways, and every prediction of an evaluation comes from one program."""
    features = exp.method.posthoc_from_logits and posthoc_features(exp)
    key = (exp.method, exp.normalization, mesh, features)
    if key not in _PREDICT_STEPS:
        _PREDICT_STEPS[key] = steps.make_predict_step(
            exp.method, mesh, *exp.normalization, with_posthoc=exp.method.posthoc_from_logits,
            posthoc_features=features)
    return _PREDICT_STEPS[key]


_FEATURE_CHECKS: dict[Any, bool] = {}


def posthoc_features(exp: experiment.Experiment) -> bool:
    """Whether the run's network gives the post-hoc feature scores its penultimate features: a
    protocol network does; a user network (resnet18, mlp, <module>:<Name>) with a `features`
    or `features_and_logits` method does once that method keeps the contract
    (`networks.user.check`, once per network and input shape). A network whose method breaks
    it gets the logit scores alone, with one line saying why: its training never read them."""
    model = exp.method.eval_model
    if isinstance(model, networks.Backbone):
        return True
    if user.feature_reader(model) is None:
        return False
    config = exp.config
    shape = tuple(exp.data.test.images.shape[1:])
    key = (config.model, str(config.get("model_kwargs", "")), int(config.num_classes), shape,
           config.init, config.compute_dtype, float(config.dropout_rate))
    if key not in _FEATURE_CHECKS:
        try:
            common.user_network(config, int(config.num_classes), axis_name=None,
                                input_shape=shape, need_features=True)
            _FEATURE_CHECKS[key] = True
        except ValueError as e:
            log(f"post-hoc feature scores left out: {e}")
            _FEATURE_CHECKS[key] = False
    return _FEATURE_CHECKS[key]


def evaluate_and_write(exp: experiment.Experiment, state: steps.TrainState, workdir, *,
                       mesh=None, extra_ood: tuple[str, ...] = ()) -> dict[str, Any]:
    """Score the test set and every OOD set with `state` (as trained: the method's fit after
    training runs first); write JSON, markdown table, plots."""
    mesh = mesh or sharding.make_mesh()
    return evaluate_run(RestoredRun(exp, fitted(exp, state), mesh), workdir, extra_ood,
                        trained=True)


class _EvalProgress:
    """One line per evaluated split with the time left (the rate so far x the images left),
    and inside a split one every `QUIET_SECONDS` at most; SIGTERM/SIGINT stop the evaluation
    at the next batch (`preemption.EvaluationInterrupted`). `stage` names what is done to
    the splits: "" for the method's predictions, "post-hoc scores" for their second pass."""

    QUIET_SECONDS = 5.0

    def __init__(self, splits: dict[str, data.Split], workdir, trained: bool, stage: str = ""):
        self.sizes = {name: len(split) for name, split in splits.items()}
        self.workdir, self.trained = workdir, trained
        self.start, self.done_images = time.time(), 0
        self.set_start = self.last_line = self.start
        self.prefix = f"{stage}: " if stage else ""

    def batch(self, name: str):
        def on_batch(done: int, total: int) -> None:
            if preemption.requested():
                raise preemption.EvaluationInterrupted(str(self.workdir), self.trained)
            now = time.time()
            if done < total and now - self.last_line >= self.QUIET_SECONDS:
                self.last_line = now
                log(f"{self.prefix}evaluating {name}: batch {done}/{total}, "
                    f"{now - self.set_start:.1f} s")
        return on_batch

    def done(self, name: str) -> None:
        size = self.sizes.pop(name)
        self.done_images += size
        now = time.time()
        elapsed, took, self.set_start = now - self.start, now - self.set_start, now
        self.last_line = now
        left = sum(self.sizes.values())
        eta = format_eta(left * elapsed / max(self.done_images, 1))
        log(f"{self.prefix}evaluated {name}: {size:,} images in {took:.1f} s"
             f"{f' | {len(self.sizes)} set(s) left, ETA {eta}' if self.sizes else ''}")


def evaluation_options(exp: experiment.Experiment,
                       ood_names=()) -> core.EvaluationOptions:
    """The run's `EvaluationOptions`: config.conformal_alpha / calibrate / aupr_trapezoidal /
    bootstrap_samples / bootstrap_confidence / bootstrap_interval,
    near/far groups of its OOD sets (`data.ood_group`: config.ood_groups, else the registry's),
    and the calibrator of its method
    (`Method.calibrator`: the evidence scale for the EDL family, whose alpha = e + W a;
    temperature scaling otherwise)."""
    config = exp.config
    declared = data.check_ood_groups(config.ood_groups, tuple(ood_names))
    groups = {name: data.ood_group(config.dataset, name, declared) for name in ood_names}
    return core.EvaluationOptions(
        conformal_alpha=float(config.get("conformal_alpha", 0.1)), conformal_seed=0,
        calibrate=bool(config.get("calibrate", False)),
        calibrator=exp.method.calibrator, base_rate=exp.method.base_rate,
        ood_groups={k: v for k, v in groups.items() if v is not None},
        aupr_trapezoidal=bool(config.get("aupr_trapezoidal", False)),
        bootstrap_samples=int(config.get("bootstrap_samples", 0)),
        bootstrap_confidence=float(config.get("bootstrap_confidence", 0.95)),
        bootstrap_interval=str(config.get("bootstrap_interval", "percentile")))


def evaluate_run(run: RestoredRun, workdir, extra_ood: tuple[str, ...] = (),
                 trained: bool = False, source=None) -> dict[str, Any]:
    """Score the test set, the validation split and every OOD set with a restored run; write
    its results into `workdir`. `source`: the run's own workdir, recorded as the results'
    "workdir" when they go elsewhere (`python -m gedl_jax.evaluate --out=...`)."""
    exp = run.experiment
    ood_sets = dict(exp.data.ood)
    for name in extra_ood:
        ood_sets[name] = experiment.load_ood_set(exp.config, name, exp.data.train)
    if jax.process_index() == 0:
        files.check_writable(workdir, "the results folder")   # before the work, not after
    validation = {"validation": exp.data.validation} if len(exp.data.validation) else {}
    progress = _EvalProgress({"test": exp.data.test, **validation, **ood_sets}, workdir,
                             trained)
    outputs = {}   # the post-hoc scores' inputs of each scored set, from the same pass
    with numerics.precision(exp.config):   # the products the run trained with
        id_pred, outputs["test"] = _predict_with_posthoc(run, exp.data.test,
                                                         on_batch=progress.batch("test"))
        progress.done("test")
        val_pred = None   # no validation split (a pretrained model without its training files)
        if len(exp.data.validation):
            val_pred = predict(run, exp.data.validation, on_batch=progress.batch("validation"))
            progress.done("validation")
        ood_preds = {}
        for name, split in ood_sets.items():
            ood_preds[name], outputs[f"ood/{name}"] = _predict_with_posthoc(
                run, split, with_labels=False, on_batch=progress.batch(name))
            progress.done(name)
    options = evaluation_options(exp, ood_preds)
    calibrated = " (before and after calibration)" if options.calibrate else ""
    replicates = (f" and {options.bootstrap_samples:,} bootstrap replicates{calibrated}"
                  if options.bootstrap_samples else "")
    with heartbeat.announced(f"computing the metrics{replicates}"):
        results = core.evaluate_predictions(id_pred, ood_preds, validation=val_pred,
                                            options=options)
    posthoc_scores = None
    names = posthoc_names(exp)
    if names:
        with numerics.precision(exp.config):
            posthoc_scores, section = posthoc_results(run, names, id_pred, ood_sets, outputs,
                                                      workdir, trained)
        if options.bootstrap_samples:
            section["bootstrap"] = _posthoc_bootstrap(posthoc_scores, section, id_pred,
                                                      options)
        results["posthoc"] = section
    fit = exp.method.fit_summary(run.state.method_state)
    if fit:   # what the method's fit after training chose (Laplace's prior precision)
        results["fit"] = fit
    results.update({"variant": exp.config.variant, "method": exp.method.describe(),
                    "score_captions": dict(exp.method.score_captions),
                    "dataset": exp.config.dataset, "seed": exp.seed,
                    "workdir": str(source or workdir),
                    "numerics": numerics.record(exp.config)})
    return write_results(results, pathlib.Path(workdir), id_pred, ood_preds, exp.config.plots,
                         validation=val_pred, posthoc_scores=posthoc_scores)


def _posthoc_bootstrap(posthoc_scores: dict[str, dict[str, np.ndarray]],
                       section: dict[str, Any], id_pred: core.Predictions,
                       options: core.EvaluationOptions) -> dict[str, Any]:
    """The post-hoc scores' bootstrap intervals, on the draws of the method's own
    (`bootstrap.score_section`: the same seed and streams)."""
    correct = np.argmax(id_pred.probs, axis=1) == id_pred.labels
    sets = [k[len("ood/"):] for k in posthoc_scores if k.startswith("ood/")]
    with heartbeat.announced(f"{options.bootstrap_samples:,} bootstrap replicates of the "
                             f"post-hoc scores"):
        return bootstrap.score_section(
            correct, posthoc_scores["test"], {o: posthoc_scores[f"ood/{o}"] for o in sets},
            section["scores"], int(options.bootstrap_samples),
            float(options.bootstrap_confidence), int(options.bootstrap_seed),
            options.bootstrap_interval)


def posthoc_names(exp: experiment.Experiment) -> tuple[str, ...]:
    """The post-hoc OOD scores `config.posthoc_scores` gives this run ("auto": all; "none";
    or a list, checked when the run starts, `methods.check_config`): those its method and
    network give the inputs for. They apply to a method whose prediction is a function of
    its network's logits (`Method.posthoc_from_logits`); the feature scores also need a
    protocol network and the run's training split. A listed score the run cannot give is left
    out, with a line saying so."""
    text = str(exp.config.get("posthoc_scores", "auto") or "none").strip()
    if text == "none" or not exp.method.posthoc_from_logits:
        return ()
    has_features = len(exp.data.train) > 0 and posthoc_features(exp)
    possible = posthoc.LOGIT_SCORE_NAMES + (posthoc.FEATURE_SCORE_NAMES if has_features else ())
    asked = (possible if text == "auto"
             else tuple(n.strip() for n in text.split(",") if n.strip()))
    left_out = [n for n in asked if n not in possible]
    if left_out and text != "auto":
        log(f"post-hoc scores {left_out} left out: they need the network's features (a "
            "protocol network's, or a `features` method of a user network) and the run's "
            "training split")
    names = tuple(n for n in asked if n in possible)
    if "neg_knn_distance" in names and len(exp.data.train) < posthoc.KNN_DEFAULT_K:
        # Its k-th neighbour does not exist in a training split this small (a dry run, a
        # tiny own dataset): the score is left out, not a failure after the training.
        log(f"post-hoc score neg_knn_distance left out: its k={posthoc.KNN_DEFAULT_K}-th "
            f"nearest training feature needs at least {posthoc.KNN_DEFAULT_K} training "
            f"examples; the run has {len(exp.data.train)}")
        names = tuple(n for n in names if n != "neg_knn_distance")
    return names


def posthoc_results(run: RestoredRun, names: tuple[str, ...], id_pred: core.Predictions,
                    ood_sets: dict[str, data.Split], outputs: dict[str, dict[str, np.ndarray]],
                    workdir=None, trained: bool = False
                    ) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, Any]]:
    """The post-hoc scores of every example ({"test": {score: (N,)}, "ood/<set>": ...}) and
    their results section (`sections.posthoc_section`). `outputs`: the logits (and features)
    of "test" and each "ood/<set>", from the pass that predicted them (`_predict_with_posthoc`).
    The feature scores are fitted on the run's training split (one more pass, with a progress
    line), never on the test or OOD sets; a line per split says how long its scores took."""
    exp = run.experiment
    options = posthoc.PosthocOptions(names)
    fits, settings = {}, {"temperature": options.temperature}
    scored = {"test": exp.data.test, **{f"ood/{o}": s for o, s in ood_sets.items()}}
    fitted = {"train (the fit)": exp.data.train} if options.needs_features else {}
    progress = _EvalProgress({**fitted, **scored}, workdir, trained, stage="post-hoc scores")
    if options.needs_features:
        name = next(iter(fitted))
        train = _raw_outputs(run, exp.data.train, on_batch=progress.batch(name))[1]
        head = _last_layer(exp, run.state.variables, train) if "vim" in names else None
        if "vim" in names and head is None:
            log("post-hoc score vim left out: no layer of the network computes its logits "
                "from its features as z = f W + b")
            options = dataclasses.replace(options, scores=tuple(n for n in names if n != "vim"))
        fits = posthoc.fit_posthoc(options, train["features_BxF"], exp.data.train.labels,
                                   train["logits_BxK"], head)
        progress.done(name)
        settings.update(fitted_on="train", num_train=len(exp.data.train), knn_k=options.knn_k)
        if "vim" in fits:
            settings["vim_dim"] = fits["vim"].principal_dim
    per_example = {}
    for name in scored:
        out = outputs[name]
        per_example[name] = posthoc.posthoc_scores(options, fits, out["logits_BxK"],
                                                   out.get("features_BxF"))
        progress.done(name)
    correct = np.argmax(id_pred.probs, axis=1) == id_pred.labels
    section = sections.posthoc_section(
        correct, per_example["test"],
        {o: per_example[f"ood/{o}"] for o in ood_sets}, settings)
    return per_example, section


def _last_layer(exp: experiment.Experiment, variables, train: dict[str, np.ndarray]
                ) -> tuple[np.ndarray, np.ndarray] | None:
    """ViM's (weight_FxK, bias_K): a protocol network's final Dense layer, else the user
    network's kernel and bias pair that computes the training logits from the training
    features (`posthoc.linear_head`), else None."""
    known = exp.method.last_layer(variables)
    if known is not None:
        return known
    return posthoc.linear_head(exp.method.linear_head_candidates(variables),
                               train["features_BxF"], train["logits_BxK"])


def write_results(results: dict[str, Any], workdir: pathlib.Path, id_pred: core.Predictions,
                  ood_preds: dict[str, core.Predictions], plots: bool,
                  validation: core.Predictions | None = None,
                  posthoc_scores: dict[str, dict[str, np.ndarray]] | None = None
                  ) -> dict[str, Any]:
    """eval_results.json, eval_table.md, predictions.npz (`evaluation.saved`: the
    per-example outputs every number is computed from) and (with `plots`) the PNG figures, on
    process 0."""
    if jax.process_index() != 0:
        return results
    if plots:   # first, so eval_results.json is written once, complete
        results["plots"] = _write_plots(workdir, id_pred, ood_preds)
    saved.save_predictions(workdir / PREDICTIONS_FILENAME, id_pred, ood_preds, validation,
                           posthoc=posthoc_scores)
    files.write_text(workdir / "eval_results.json", json.dumps(results, indent=2))
    table = report.results_table([results], fmt="markdown")
    files.write_text(workdir / "eval_table.md", table + "\n")
    print(table, flush=True)
    return results


def _write_plots(results_dir: pathlib.Path, id_pred: core.Predictions,
                 ood_preds: dict[str, core.Predictions]) -> list[str]:
    from gedl_jax.evaluation import metrics
    from gedl_jax.evaluation import plots  # matplotlib only when plotting
    from gedl_jax.evaluation import selective_plot

    from gedl_jax.evaluation import smooth_ece

    written = [plots.reliability_diagram(
        metrics.expected_calibration_error(id_pred.probs, id_pred.labels),
        results_dir / "reliability_diagram.png"),
        plots.smooth_reliability_diagram(
            smooth_ece.smooth_ece(*smooth_ece.top_label_confidences(id_pred.probs,
                                                                    id_pred.labels)),
            results_dir / "smooth_reliability_diagram.png")]
    for score in ("mp", "um"):
        if score in id_pred.scores:
            written.append(plots.score_histograms(
                id_pred.scores[score], {name: p.scores[score] for name, p in ood_preds.items()},
                results_dir / f"hist_{score}.png", score))
    written.append(selective_plot.risk_coverage_plot(
        np.argmax(id_pred.probs, axis=1) == id_pred.labels,
        {s: id_pred.scores[s] for s in id_pred.scores},
        results_dir / "risk_coverage.png", title="risk-coverage (test set)"))
    if id_pred.is_dirichlet:
        written.append(plots.distributional_uncertainty_study(
            id_pred.alpha, id_pred.prior_strength,
            results_dir / "distributional_uncertainty.png"))
    return [str(p) for p in written]


def saved_config(workdir, overrides: dict[str, Any] | None = None):
    """The config a workdir was trained with (fields added since take their defaults, or the
    value earlier runs used: `config.LEGACY_DEFAULTS`), with `overrides` applied."""
    workdir = pathlib.Path(workdir)
    config_path = workdir / "config.json"
    if not config_path.exists():
        seeds = rundir.seed_runs(workdir)
        if seeds:   # the parent of a `config.seeds` command's runs
            raise FileNotFoundError(
                f"{workdir} holds one run per seed ({', '.join(seeds)}), not a run: evaluate "
                f"them with {' '.join(f'--workdir={workdir / s}' for s in seeds)}")
        raise FileNotFoundError(f"{workdir} has no config.json: is it a gedl_jax.train workdir?")
    return config_from_saved(json.loads(config_path.read_text()), overrides)


def config_from_saved(saved: dict[str, Any], overrides: dict[str, Any] | None = None):
    """A config from a saved config.json's fields (as `saved_config`; also the config a
    pretrained model file carries), old flat method settings moved into method_args
    (`config.upgrade_saved`)."""
    config = config_lib.default_config(saved.get("dataset", "mnist"))
    saved = {k: config_lib.as_tuple(k, v) if k in config_lib.LIST_FIELDS else v
             for k, v in saved.items()}   # runs saved before the list fields were tuples
    config.update({**config_lib.LEGACY_DEFAULTS, **config_lib.upgrade_saved(saved)})
    for key, value in (overrides or {}).items():
        if key == "ood_groups":   # `evaluate --ood_groups`: added to the run's own declarations
            value = data.add_ood_groups(config.get(key, ()), value)
        config[key] = value
    return config


def restore_run(workdir, overrides: dict[str, Any] | None = None, *,
                official: experiment.OfficialData | None = None) -> RestoredRun:
    """A gedl_jax.train workdir's best checkpoint with its setup (`official`: the loaded data,
    to share it between runs of one dataset)."""
    workdir = pathlib.Path(workdir)
    mesh = sharding.make_mesh()
    config = experiment.resolve_config(saved_config(workdir, overrides), mesh.size)
    official = official or experiment.OfficialData.load(config)
    exp = experiment.Experiment.from_config(config, official.for_seed(config, int(config.seed)))
    tx = optimizer.make_optimizer(config, total_steps=1)
    image_shape = exp.data.train.images.shape[1:]
    template = jax.jit(lambda k: steps.init_train_state(exp.method, tx, k, image_shape),
                       out_shardings=sharding.replicated(mesh))(jax.random.PRNGKey(0))
    ckpt = checkpointing.RunCheckpoints(workdir)
    try:
        state, _ = checkpointing.restore_for_evaluation(
            ckpt, checkpointing.abstract_like(template, sharding.replicated(mesh)), workdir,
            log)
    finally:
        ckpt.close()
    return RestoredRun(exp, fitted(exp, state), mesh)


def predict_outputs(workdir, splits: dict[str, data.Split] | None = None,
                    overrides: dict[str, Any] | None = None) -> dict[str, core.Predictions]:
    """`Predictions` (probabilities, scores; alpha and W for a Dirichlet method; labels on the
    ID test set) of `workdir`'s best checkpoint on its test set ("test") and its OOD sets, or on
    `splits` ({name: Split}, with labels). For analyses beyond the written evaluation."""
    run = restore_run(workdir, overrides)
    with_labels = splits is not None
    if splits is None:
        splits = {"test": run.experiment.data.test, **run.experiment.data.ood}
    return {name: predict(run, split, with_labels or name == "test")
            for name, split in splits.items()}
