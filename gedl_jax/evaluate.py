r"""Evaluate trained runs: `python -m gedl_jax.evaluate --workdir=DIR [--workdir=DIR2 ...]`.

Restores each workdir's best-validation checkpoint, scores the ID test set and every configured OOD
set (plus `--ood=NAME_OR_IDX_FOLDER`, repeatable), and writes into each workdir
`eval_results.json`, `eval_table.md` and PNG plots. With several workdirs (seeds) it also prints
the paper-style table with mean ± std (and writes it to `--out` if given).

Every example of every set is scored exactly once (padded batches, masked). The metric
conventions are in the JSON's "conventions" entry and the table header.
"""

from __future__ import annotations

import json
import pathlib
import sys
from typing import Any

import jax
import numpy as np

from gedl_jax import checkpointing, configuration, data, evaluation, parallel
from gedl_jax.data.registry import corruption_file_stem


def _outputs(eval_step, params, batch_stats, mesh, split, batch_size, with_labels=True):
    alpha, w = parallel.predict_dirichlet(eval_step, params, batch_stats, mesh, split, batch_size)
    return evaluation.ModelOutputs(alpha=alpha, prior_strength=w,
                                   labels=split.labels if with_labels else None)


def _write_plots(results_dir: pathlib.Path, id_out, ood_outs) -> list[str]:
    from gedl_jax.evaluation import plots  # noqa: PLC0415
    from gedl_jax import metrics  # noqa: PLC0415

    probs = id_out.alpha / id_out.alpha.sum(-1, keepdims=True)
    written = [plots.reliability_diagram(
        metrics.expected_calibration_error(probs, id_out.labels),
        results_dir / "reliability_diagram.png")]
    id_scores = evaluation.confidence_scores(id_out.alpha, id_out.prior_strength)
    for score in ("mp", "um"):
        ood_scores = {name: evaluation.confidence_scores(o.alpha, o.prior_strength)[score]
                      for name, o in ood_outs.items()}
        written.append(plots.score_histograms(id_scores[score], ood_scores,
                                              results_dir / f"hist_{score}.png", score))
    written.append(plots.distributional_uncertainty_study(
        id_out.alpha, id_out.prior_strength, results_dir / "distributional_uncertainty.png"))
    return [str(p) for p in written]


def loss_spec(config, train_split: data.Split):
    """The LossSpec a run was trained with, so evaluation scores the same alpha: with
    `base_rate="label_frequency"` the base rate a is the training split's label frequencies,
    computed as train.py computes it (Eq. e2alpha: alpha = e + W a)."""
    from gedl_jax import losses, train  # noqa: PLC0415

    base_rate = (train._label_frequencies(train_split.labels, config.num_classes)
                 if config.base_rate == "label_frequency" else None)
    return losses.LossSpec.from_config(config, base_rate=base_rate)


def evaluate_and_write(config, params, batch_stats, workdir, *, loaded=None, eval_model=None,
                       mesh=None, extra_ood: tuple[str, ...] = ()) -> dict[str, Any]:
    """Score test + OOD sets with the given parameters; write JSON, markdown table, plots."""
    from gedl_jax import train  # noqa: PLC0415

    workdir = pathlib.Path(workdir)
    mesh = mesh or parallel.make_mesh()
    loaded = loaded or train.load_data(config)
    if eval_model is None:
        _, eval_model = train.build_models(config)
    splits = loaded["splits"]
    ood_sets = dict(loaded["ood"])
    for name in extra_ood:
        ood_sets[name] = data.load_ood(name, data_dir=config.data_dir or None,
                                       cache_dir=config.cache_dir or None,
                                       source=config.data_source,
                                       tfds_data_dir=config.tfds_data_dir or None)
    spec = loss_spec(config, splits["train"])
    mean, std = train.normalization_stats(config, splits["train"])
    eval_step = parallel.make_eval_step(eval_model, spec, mesh, mean, std)
    batch = config.eval_batch_size
    id_out = _outputs(eval_step, params, batch_stats, mesh, splits["test"], batch)
    ood_outs = {name: _outputs(eval_step, params, batch_stats, mesh, split, batch, False)
                for name, split in ood_sets.items()}
    results = evaluation.evaluate_outputs(id_out, ood_outs)
    results.update({"variant": config.variant, "dataset": config.dataset,
                    "seed": int(config.seed), "workdir": str(workdir)})
    if jax.process_index() == 0:
        (workdir / "eval_results.json").write_text(json.dumps(results, indent=2))
        table = evaluation.results_table([results], fmt="markdown")
        (workdir / "eval_table.md").write_text(table + "\n")
        print(table, flush=True)
        if config.plots:
            results["plots"] = _write_plots(workdir, id_out, ood_outs)
            (workdir / "eval_results.json").write_text(json.dumps(results, indent=2))
    return results


def restore_run(workdir, overrides: dict[str, Any] | None = None):
    """(config, best TrainState, eval_model, mesh, loaded data) of a gedl_jax.train workdir."""
    from gedl_jax import train  # noqa: PLC0415

    workdir = pathlib.Path(workdir)
    config_path = workdir / "config.json"
    if not config_path.exists():
        raise FileNotFoundError(f"{workdir} has no config.json: is it a gedl_jax.train workdir?")
    saved = json.loads(config_path.read_text())
    # Fields added after the run was written take their defaults (e.g. eval_examples = all).
    config = configuration.default_config(saved.get("dataset", "mnist"))
    config.update(saved)
    for key, value in (overrides or {}).items():
        config[key] = value
    mesh = parallel.make_mesh()
    configuration.validate_config(config, mesh.size)
    _, eval_model = train.build_models(config)
    loaded = train.load_data(config)
    tx = parallel.make_optimizer(config, total_steps=1)
    image_shape = loaded["splits"]["train"].images.shape[1:]
    template = jax.jit(lambda k: parallel.init_train_state(eval_model, tx, k, image_shape),
                       out_shardings=parallel.replicated(mesh))(jax.random.PRNGKey(0))
    ckpt = checkpointing.RunCheckpoints(workdir)
    try:
        state, _ = ckpt.restore_best(checkpointing.abstract_like(template,
                                                                 parallel.replicated(mesh)))
    finally:
        ckpt.close()
    return config, state, eval_model, mesh, loaded


def predict_outputs(workdir, splits: dict[str, data.Split] | None = None,
                    overrides: dict[str, Any] | None = None
                    ) -> dict[str, evaluation.ModelOutputs]:
    """Dirichlet outputs (alpha, W; labels on the ID test set) of `workdir`'s best checkpoint on
    its test set ("test") and its OOD sets (each config.eval_examples evenly spaced examples, when
    set), or on `splits`
    ({name: Split}, with labels). For analyses beyond the written evaluation (notebooks)."""
    from gedl_jax import train  # noqa: PLC0415

    config, state, eval_model, mesh, loaded = restore_run(workdir, overrides)
    spec = loss_spec(config, loaded["splits"]["train"])
    mean, std = train.normalization_stats(config, loaded["splits"]["train"])
    eval_step = parallel.make_eval_step(eval_model, spec, mesh, mean, std)
    with_labels = splits is not None
    if splits is None:
        splits = {"test": loaded["splits"]["test"], **loaded["ood"]}
    return {name: _outputs(eval_step, state.params, state.batch_stats, mesh, split,
                           config.eval_batch_size, with_labels or name == "test")
            for name, split in splits.items()}


def evaluate_workdir(workdir, extra_ood: tuple[str, ...] = (),
                     overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Restore `workdir`'s best checkpoint (its saved config.json) and evaluate it."""
    config, state, eval_model, mesh, loaded = restore_run(workdir, overrides)
    return evaluate_and_write(config, state.params, state.batch_stats, workdir, loaded=loaded,
                              eval_model=eval_model, mesh=mesh, extra_ood=extra_ood)


def _subset(split: data.Split, num_examples: int) -> data.Split:
    """`num_examples` evenly spaced examples (a split sorted by label still gives every class)."""
    from gedl_jax.data import corruptions as corruptions_lib  # noqa: PLC0415

    if not num_examples or num_examples >= len(split):
        return split
    return split.take(corruptions_lib.subset_indices(len(split), num_examples), split.name)


def _source_label(sources: set[str], config, corruption: str) -> tuple[str, dict[str, Any]]:
    """A label naming where the corrupted sets came from, and the regenerated set's provenance
    (empty for the official release)."""
    if sources == {"regenerated"}:
        from gedl_jax.data import corruptions as corruptions_lib  # noqa: PLC0415

        folder = corruptions_lib.regenerated_folder(data.resolve_data_dir(config.data_dir or
                                                                          None))
        stem = corruption_file_stem(corruption)
        entry = corruptions_lib.read_provenance(folder).get("corruptions", {}).get(stem, {})
        return corruptions_lib.describe_source(folder, corruption), dict(entry, folder=str(
            folder))
    if "regenerated" in sources:
        return "mixed official and regenerated CIFAR-10-C", {}
    return "official CIFAR-10-C", {}


def _study_table(study: dict[str, Any]) -> str:
    labels = sorted({v["source_label"] for v in study.values()})
    lines = [f"CIFAR-10-C corruption study; data: {'; '.join(labels)}. Severity 0 = clean test "
             "set; means over the examples, averaged over the runs.", "",
             "| corruption | severity | n | accuracy | u = W/S | mutual information | "
             "variance sum | ensemble MI | source |",
             "|---|---|---|---|---|---|---|---|---|"]
    for corruption, v in study.items():
        for sev, m in v["measures"].items():
            ens = v["ensemble_epistemic"]
            ens_text = f"{ens[sev]:.4f}" if ens else "-"
            lines.append(f"| {corruption} | {sev} | {v['num_examples'][sev]} | "
                         f"{v['accuracy'][sev]:.4f} | {m['u']:.4f} | "
                         f"{m['mutual_information']:.4f} | {m['variance_sum']:.5f} | "
                         f"{ens_text} | {v['source_label'] if sev else 'clean test'} |")
    return "\n".join(lines)


def corruption_study(workdirs, corruptions, out_dir, overrides: dict[str, Any] | None = None,
                     num_examples: int = 0) -> dict[str, Any]:
    """The paper's Fig. uncertainty (bottom row) on CIFAR-10-C: for each corruption, the mean of
    u = W/S, mutual information and variance sum at severities 0 (clean test) to 5, averaged
    over the runs (seeds), next to the epistemic uncertainty of the runs' ensemble (mutual
    information between prediction and member). `num_examples` > 0 scores only n evenly spaced
    examples of the clean test set and of each severity (the same positions in each).

    Writes corruption_study.json, corruption_study.md and one PNG per corruption into `out_dir`;
    each names where the corrupted sets came from (the official release, or the set
    regenerated by gedl_jax.data.corruptions, with its seed and whether it is approximate)."""
    from gedl_jax import train  # noqa: PLC0415
    from gedl_jax.evaluation import plots  # noqa: PLC0415

    out_dir = pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = [restore_run(w, overrides) for w in workdirs]
    eval_steps = []
    for config, _, eval_model, mesh, loaded in runs:  # compiled once per run, not per corruption
        # The base rate a the run was trained with (label frequencies where configured).
        spec = loss_spec(config, loaded["splits"]["train"])
        mean, std = train.normalization_stats(config, loaded["splits"]["train"])
        eval_steps.append(parallel.make_eval_step(eval_model, spec, mesh, mean, std))
    study: dict[str, Any] = {}
    for corruption in corruptions:
        per_run, probs_by_severity, accuracy, sources = [], {}, {}, set()
        counts: dict[int, int] = {}
        for (config, state, _, mesh, loaded), eval_step in zip(runs, eval_steps):
            batch = config.eval_batch_size
            if num_examples:  # no padding a small study up to a whole large batch
                batch = min(batch, -(-num_examples // mesh.size) * mesh.size)
            sets = {0: _subset(loaded["splits"]["test"], num_examples)}
            for severity in range(1, 6):
                split = data.load_corrupted(
                    corruption, severity, data_dir=config.data_dir or None,
                    cache_dir=config.cache_dir or None, source=config.data_source,
                    tfds_data_dir=config.tfds_data_dir or None)
                sources.add(split.source.split("+")[0])
                sets[severity] = _subset(split, num_examples)
            outputs = {sev: _outputs(eval_step, state.params, state.batch_stats, mesh, split,
                                     batch)
                       for sev, split in sets.items()}
            per_run.append(evaluation.severity_summary(outputs))
            for sev, o in outputs.items():
                probs = o.alpha / o.alpha.sum(-1, keepdims=True)
                probs_by_severity.setdefault(sev, []).append(probs)
                accuracy.setdefault(sev, []).append(float(np.mean(
                    np.argmax(probs, -1) == np.asarray(sets[sev].labels))))
                counts[sev] = len(sets[sev])
        measures = {sev: {m: float(np.mean([r[sev][m] for r in per_run]))
                          for m in per_run[0][sev]} for sev in per_run[0]}
        ensemble = ({sev: float(np.mean(evaluation.ensemble_epistemic_uncertainty(
            np.stack(p)))) for sev, p in probs_by_severity.items()} if len(runs) > 1 else None)
        label, provenance = _source_label(sources, runs[0][0], corruption)
        plot = plots.corruption_severity_study(
            measures, out_dir / f"corruption_{corruption}.png", ensemble_epistemic=ensemble,
            title=f"{corruption}\n({label}, n={counts[1]})")
        study[corruption] = {"measures": measures, "ensemble_epistemic": ensemble,
                             "accuracy": {sev: float(np.mean(a)) for sev, a in accuracy.items()},
                             "num_runs": len(runs), "num_examples": counts,
                             "source": sorted(sources)[0] if len(sources) == 1 else
                             sorted(sources), "source_label": label,
                             "regenerated_provenance": provenance or None, "plot": str(plot)}
    (out_dir / "corruption_study.json").write_text(json.dumps(study, indent=2))
    (out_dir / "corruption_study.md").write_text(_study_table(study) + "\n")
    return study


def main(argv=None) -> int:
    from absl import app, flags  # noqa: PLC0415

    flags.DEFINE_multi_string("workdir", None, "Workdir(s) of gedl_jax.train runs (seeds).")
    flags.DEFINE_multi_string("ood", [], "Extra OOD set: a dataset name or a folder of "
                              "MNIST-format IDX files (t10k-images-idx3-ubyte.gz, ...).")
    flags.DEFINE_string("data_dir", None, "Override the data folder saved in the run config.")
    flags.DEFINE_string("out", None, "Write the combined table (markdown) to this file.")
    flags.DEFINE_bool("latex", False, "Also print the table as LaTeX.")
    flags.DEFINE_list("corruptions", [], "CIFAR-10-C corruption study over the workdirs (an "
                      "ensemble when several), e.g. snow,brightness,pixelate,shot_noise. Uses "
                      "the official CIFAR-10-C where present, else a set regenerated by "
                      "`python -m gedl_jax.data.corruptions` (outputs say which).")
    flags.DEFINE_bool("study_only", False, "With --corruptions: run only the corruption study "
                      "(the runs' eval_results.json from training stay as they are).")
    flags.DEFINE_string("study_dir", None, "Folder of the corruption study's outputs (default: "
                        "the folder of --out, else the first workdir).")
    flags.DEFINE_integer("corruption_examples", 0, "Corruption study on N evenly spaced "
                         "examples of the clean test set and of each severity (0 = all).")
    flags.mark_flag_as_required("workdir")
    FLAGS = flags.FLAGS

    def _main(_argv):
        from absl import logging as absl_logging  # noqa: PLC0415
        absl_logging.set_verbosity(absl_logging.WARNING)  # Orbax logs every save at INFO
        overrides = {"data_dir": FLAGS.data_dir} if FLAGS.data_dir else {}
        if FLAGS.study_only and not FLAGS.corruptions:
            print("error: --study_only needs --corruptions=...", file=sys.stderr, flush=True)
            return 2
        try:
            all_results = [] if FLAGS.study_only else [
                evaluate_workdir(w, tuple(FLAGS.ood), overrides) for w in FLAGS.workdir]
        except (ValueError, FileNotFoundError, data.DataError) as e:
            print(f"error: {e}", file=sys.stderr, flush=True)
            return 2
        if len(all_results) > 1:
            table = evaluation.results_table(all_results, fmt="markdown")
            print(f"\n{table}")
            if FLAGS.out:
                pathlib.Path(FLAGS.out).write_text(table + "\n")
        if FLAGS.latex and all_results:
            print(evaluation.results_table(all_results, fmt="latex"))
        if FLAGS.corruptions:
            out_dir = pathlib.Path(FLAGS.study_dir or (pathlib.Path(FLAGS.out).parent if FLAGS.out
                                                       else FLAGS.workdir[0]))
            try:
                study = corruption_study(FLAGS.workdir, FLAGS.corruptions, out_dir, overrides,
                                         num_examples=FLAGS.corruption_examples)
            except (ValueError, FileNotFoundError, data.DataError) as e:
                print(f"error: {e}", file=sys.stderr, flush=True)
                return 2
            print(_study_table(study), flush=True)
        return 0

    try:
        app.run(_main, argv=argv)
    except SystemExit as e:
        return int(e.code or 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
