r"""Evaluate trained runs, or a pretrained model.

    gedl-evaluate --workdir=DIR [--workdir=DIR2 ...] [--extra_ood=SET ...] [--out=DIR]
    gedl-evaluate --pretrained=mnist/gedl       (`--pretrained=list`: every registered model)

(`python -m gedl_jax.evaluate` is the same command; docs/pretrained.md for the models.)

Restores each workdir's best-validation checkpoint, scores the ID test set and every configured OOD
set (plus `--extra_ood=SET`, repeatable: config.extra_ood's sets), and writes into each workdir
`eval_results.json`, `eval_table.md` and PNG plots. With several workdirs (seeds) it also prints
the paper-style table with mean ± std (and writes it to `--out` if given).

Every example of every set is scored exactly once (padded batches, masked). The metric
conventions are in the JSON's "conventions" entry and the table header.
"""

from __future__ import annotations

import pathlib
import sys
from typing import Any

from gedl_jax import config as config_lib
from gedl_jax import data, evaluation, files
from gedl_jax.commands import cli
from gedl_jax.data import registry
from gedl_jax.evaluation import bootstrap
from gedl_jax.run import heartbeat, lock, preemption
from gedl_jax.run.corruption_study import corruption_study, study_table
from gedl_jax.run.evaluating import evaluate_workdir
from gedl_jax.run.workdir import saved_config

__all__ = ["main"]


def _results_dirs(workdirs: list[str], out: str | None) -> tuple[list, pathlib.Path | None]:
    """--out=DIR: each run's results in DIR (one workdir) or DIR/<workdir name> (several), the
    combined table in DIR/eval_table.md. --out=FILE.md: the combined table only (as before)."""
    if not out:
        return [None] * len(workdirs), None
    out_path = pathlib.Path(out)
    if out_path.suffix in (".md", ".txt") and not out_path.is_dir():
        return [None] * len(workdirs), out_path
    if len(workdirs) == 1:
        return [out_path], out_path / "eval_table.md"
    names = [pathlib.Path(w).resolve().name for w in workdirs]
    if len(set(names)) < len(names):
        names = [f"{i}_{n}" for i, n in enumerate(names)]
    return [out_path / n for n in names], out_path / "eval_table.md"


def _check_corruption_study(workdirs: list[str], corruptions: list[str],
                            overrides: dict[str, Any]) -> None:
    """--corruptions: every name a CIFAR-10-C corruption, every run trained on CIFAR-10 (the
    study corrupts CIFAR-10's test set, whose images only such a network reads)."""
    for name in corruptions:
        registry.corruption_file_stem(name)   # a DataError naming the known ones
    for workdir in workdirs:
        dataset = saved_config(workdir, overrides).dataset
        if dataset != "cifar10":
            raise ValueError(f"--corruptions studies CIFAR-10-C (CIFAR-10's test set, "
                             f"corrupted): {workdir} was trained on {dataset}, not cifar10")


def _evaluate_pretrained(name: str, out: str | None, extra_ood: tuple[str, ...],
                         overrides: dict[str, Any], latex: bool, *,
                         unverified_weights: bool = False, strict: bool = False) -> int:
    """--pretrained=NAME: the registered model's results (into --out, else a temporary folder
    removed afterwards: the table is printed either way); --pretrained=list: the names. A
    measured accuracy that is not the stored one warns; with --strict it is exit 3."""
    import tempfile

    from gedl_jax import pretrained

    if name == "list":
        print(pretrained.list_table())
        return 0
    if out and pathlib.Path(out).suffix in (".md", ".txt"):
        raise ValueError("--out with --pretrained is a folder (eval_results.json, eval_table.md)")
    preemption.install()
    with tempfile.TemporaryDirectory(prefix="gedl_pretrained_") as scratch, \
            lock.holding(out or scratch, "--out"):
        results = pretrained.evaluate(name, out or scratch, extra_ood, overrides=overrides,
                                      unverified_weights=unverified_weights, strict=strict)
    if latex:
        print(evaluation.results_table([results], fmt="latex"))
    print(f"results: {pathlib.Path(out) / 'eval_results.json'}" if out else
          "results: printed only (--out=DIR keeps eval_results.json and eval_table.md)",
          flush=True)
    return 0


def _define_flags() -> None:
    from absl import flags

    flags.DEFINE_multi_string("workdir", None, "Workdir(s) of gedl_jax.train runs (seeds).")
    flags.DEFINE_string("pretrained", None, "Evaluate a registered pretrained model instead of "
                        "a workdir (e.g. mnist/gedl; `list` lists them): its test and OOD sets "
                        "from the data folder, results into --out (default: only printed).")
    flags.DEFINE_bool("unverified_weights", False, "With --pretrained: use a model file that "
                      "records no checksum of its weights (exported by an older gedl-jax), "
                      "unverified: nothing then shows its weights are the ones its stored "
                      "results were measured with.")
    flags.DEFINE_bool("strict", False, "With --pretrained: exit 3 when the accuracy measured "
                      "lies outside the bootstrap interval of the accuracy the file stores (a "
                      "warning line otherwise).")
    flags.DEFINE_multi_string("extra_ood", [], "An OOD set besides the run's own (repeatable; "
                              "config.extra_ood): a dataset name (e.g. "
                              "kmnist), npz:<path> (an .npz file with test_images), "
                              "tfds:<name>, images:<folder> (image files, resized to the "
                              "model's input by --image_resize, else the run's "
                              "config.image_resize), or a folder of "
                              "MNIST-format IDX files (t10k-images-idx3-ubyte.gz, ...).")
    flags.DEFINE_enum("image_resize", None, list(config_lib.ALLOWED["image_resize"]),
                      "How an images:<folder> OOD set's images of another size become the "
                      "model's input (default: the run's config.image_resize): crop (aspect "
                      "kept, scaled to cover, centre cut; torchvision Resize+CenterCrop) or "
                      "stretch (resized to the input).")
    flags.DEFINE_integer("bootstrap_samples", None, "Bootstrap intervals of every metric "
                         "over N resamples of the test and OOD examples, in a table of their "
                         "own (config.bootstrap_samples; a line says how long they took). "
                         "Default: as the run was configured (0: none).")
    flags.DEFINE_enum("bootstrap_interval", None, list(bootstrap.INTERVAL_METHODS),
                      "The bootstrap intervals' method (config.bootstrap_interval; default: as "
                      "the run was configured): percentile, or basic, the percentile bounds "
                      "reflected about the metric on all examples (corrects ECE's upward bias "
                      "to first order).")
    flags.DEFINE_multi_string("ood_groups", [], "GROUP=SET (repeatable; config.ood_groups): "
                              "put OOD set SET (as --extra_ood or the run's config names it) "
                              "in the near or far group of the OpenOOD-style group means, over "
                              "the run's own groups and the registry's, e.g. "
                              "far=images:/data/textures.")
    flags.DEFINE_string("data_dir", None, "Override the data folder saved in the run config.")
    flags.DEFINE_string("out", None, "Write the results here instead of into the workdirs: a "
                        "folder (each run's eval_results.json, eval_table.md and plots, one "
                        "subfolder per workdir when several, and the combined table), or a .md "
                        "file for the combined table only.")
    flags.DEFINE_bool("latex", False, "Also print the table as LaTeX.")
    flags.DEFINE_bool("calibrate", None, "Fit the post-hoc calibrators on the validation "
                      "split (config.calibrate: temperature or the evidence scale, vector "
                      "scaling, Dirichlet calibration, isotonic regression) and print their "
                      "table (NLL, ECE, SmoothECE, Brier before and after); about 8 s more on "
                      "MNIST on 2 CPU cores. Default: on with --pretrained, else as the run "
                      "was configured (--nocalibrate turns it off).")
    flags.DEFINE_string("as_method", None, "Evaluate the runs as another method whose training "
                        "they are, without retraining: a softmax run as `laplace` (its "
                        "last-layer Laplace posterior, fitted now). Results into --out, else "
                        "<workdir>/as_<method>.")
    flags.DEFINE_list("corruptions", [], "CIFAR-10-C corruption study over the workdirs (an "
                      "ensemble when several), e.g. snow,brightness,pixelate,shot_noise. Uses "
                      "the official CIFAR-10-C where present, else a set regenerated by "
                      "`python -m gedl_jax.data.regenerate` (outputs say which).")
    flags.DEFINE_bool("study_only", False, "With --corruptions: run only the corruption study "
                      "(the runs' eval_results.json from training stay as they are).")
    flags.DEFINE_string("study_dir", None, "Folder of the corruption study's outputs (default: "
                        "the folder of --out, else the first workdir).")
    flags.DEFINE_integer("corruption_examples", 0, "Corruption study on N evenly spaced "
                         "examples of the clean test set and of each severity (0 = all).")
    flags.DEFINE_bool("debug", False, "Show the traceback of an error (also GEDL_DEBUG=1).")


def _overrides(FLAGS) -> dict[str, Any]:
    """The config fields the flags change for this evaluation (`saved_config`'s overrides)."""
    overrides: dict[str, Any] = {"data_dir": FLAGS.data_dir} if FLAGS.data_dir else {}
    calibrate = FLAGS.calibrate
    if calibrate is None and FLAGS.pretrained:
        calibrate = True   # a pretrained model's evaluation prints every table
    if calibrate is not None:
        overrides["calibrate"] = bool(calibrate)
    if FLAGS.bootstrap_samples is not None:
        if FLAGS.bootstrap_samples < 0 or FLAGS.bootstrap_samples == 1:
            raise ValueError(f"--bootstrap_samples={FLAGS.bootstrap_samples} must be 0 (none) "
                             f"or >= 2 (1,000 is usual)")
        overrides["bootstrap_samples"] = FLAGS.bootstrap_samples
    if FLAGS.bootstrap_interval:
        overrides["bootstrap_interval"] = FLAGS.bootstrap_interval
    if FLAGS.image_resize:
        overrides["image_resize"] = FLAGS.image_resize
    if FLAGS.ood_groups:
        data.parse_ood_groups(FLAGS.ood_groups)   # a malformed entry: before any work
        overrides["ood_groups"] = tuple(FLAGS.ood_groups)
    return overrides


def main(argv=None) -> int:
    """The command line `python -m gedl_jax.evaluate` (module docstring); returns the exit
    status."""
    from absl import flags

    _define_flags()
    FLAGS = flags.FLAGS

    def body() -> int:
        overrides = _overrides(FLAGS)
        if FLAGS.pretrained:
            if FLAGS.workdir or FLAGS.corruptions or FLAGS.as_method:
                raise ValueError("--pretrained evaluates a registered model: give no --workdir, "
                                 "--corruptions or --as_method with it")
            return _evaluate_pretrained(FLAGS.pretrained, FLAGS.out, tuple(FLAGS.extra_ood),
                                        overrides, FLAGS.latex,
                                        unverified_weights=FLAGS.unverified_weights,
                                        strict=FLAGS.strict)
        if not FLAGS.workdir:
            raise ValueError("give --workdir=DIR (a gedl_jax.train run), or --pretrained=NAME "
                             "(--pretrained=list lists them)")
        listed = [pathlib.Path(w).resolve() for w in FLAGS.workdir]
        twice = sorted({str(w) for w in listed if listed.count(w) > 1})
        if twice:   # one run counted twice would pass for two seeds
            raise ValueError(f"--workdir lists {', '.join(twice)} more than once: give each "
                             f"run once")
        if FLAGS.study_only and not FLAGS.corruptions:
            raise ValueError("--study_only needs --corruptions=...")
        for w in FLAGS.workdir:   # before anything is written
            config = saved_config(w, overrides)
            data.check_ood_groups(
                config.ood_groups, (*config.ood_datasets, *config.extra_ood, *FLAGS.extra_ood))
        results_dirs, table_path = _results_dirs(FLAGS.workdir, FLAGS.out)
        if FLAGS.as_method:   # never over the run's own results
            results_dirs = [d or pathlib.Path(w) / f"as_{FLAGS.as_method}"
                            for w, d in zip(FLAGS.workdir, results_dirs)]
        if table_path is not None:
            files.check_writable(table_path.parent, "--out")
            table_path.parent.mkdir(parents=True, exist_ok=True)
        if FLAGS.corruptions:   # before any evaluation
            _check_corruption_study(FLAGS.workdir, FLAGS.corruptions, overrides)
        preemption.install()
        all_results = [] if FLAGS.study_only else [
            evaluate_workdir(w, tuple(FLAGS.extra_ood), overrides, d, FLAGS.as_method)
            for w, d in zip(FLAGS.workdir, results_dirs)]
        if len(all_results) > 1:
            table = evaluation.results_table(all_results, fmt="markdown")
            print(f"\n{table}")
            if table_path is not None:
                files.write_text(table_path, table + "\n")
        if FLAGS.latex and all_results:
            print(evaluation.results_table(all_results, fmt="latex"))
        written = [pathlib.Path(d or w) / "eval_results.json"
                   for w, d in zip(FLAGS.workdir, results_dirs)] if all_results else []
        if len(all_results) > 1 and table_path is not None:
            written.append(table_path)
        if FLAGS.corruptions:
            out_dir = pathlib.Path(FLAGS.study_dir or (table_path.parent if table_path
                                                       else FLAGS.workdir[0]))
            study = corruption_study(FLAGS.workdir, FLAGS.corruptions, out_dir, overrides,
                                     num_examples=FLAGS.corruption_examples)
            print(study_table(study), flush=True)
            written.append(out_dir)
        print(f"results: {', '.join(map(str, written))}", flush=True)
        return 0

    def announced_body() -> int:
        with heartbeat.compilations_announced():
            return body()

    from gedl_jax.pretrained.model import StoredAccuracyError

    return cli.run(announced_body, argv, doc=__doc__, codes=[
        ((preemption.EvaluationInterrupted,), cli.EXIT_INTERRUPTED),
        ((StoredAccuracyError,), cli.EXIT_DIVERGED),
        ((data.DataError,), cli.EXIT_BAD_INPUT)], renamed_flags=cli.RENAMED_FLAGS["evaluate"])


if __name__ == "__main__":
    sys.exit(main())
