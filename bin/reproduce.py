#!/usr/bin/env python
"""Reproduce the paper's tables: train variants x seeds, evaluate, write tables beside the paper's.

    python bin/reproduce.py --study=main --setting=short --out=runs/mnist_short
    python bin/reproduce.py --study=main --setting=medium --seeds=0,1,2 --out=~/runs/mnist_medium
    python bin/reproduce.py --study=main --setting=paper --out=runs/mnist_paper       # 200 epochs
    python bin/reproduce.py --study=readings --setting=long --seeds=0,1,2 --out=RUNS  # readings
    python bin/reproduce.py --study=ablation --setting=short --out=runs/ablation_short
    python bin/reproduce.py --study=sensitivity --setting=short --out=runs/sens_short
    python bin/reproduce.py --dataset=cifar10 --study=main --setting=paper --variants=gedl \
        --override=ood_datasets= --out=runs/cifar10_paper

Settings: `paper` (old name `full`) is the paper's protocol (Table implementation_details: 200
epochs, batch 128, Adam + cosine); `long` the whole split for 20 epochs (every KL schedule at
full weight by epoch 10). `medium` trains on the whole training split for 1 epoch (full-data
results sized for a CPU: about 70 s a run on 2 cores; `--override=num_epochs=N` for more).
`short` (old name `quick`; not the config modifier `quick`, which trains 2 epochs on 6,400
images) runs on a 2-core CPU in well under an hour for 5 variants x 5 seeds: 3 epochs on the
first 12,000 examples of the training split, 2,000 validation examples. The test and OOD sets are
always evaluated in full. `--help` lists every study, its run names and every setting.

Each run's workdir keeps its checkpoints, eval_results.json and environment.json (the machine,
versions and commit that started it, and any other that resumed it); the script writes `results.md`
(tables with mean ± std, the paper's numbers, commit, versions, hardware, seeds, wall time) and
`results.json` into --out. Runs already complete in --out are reused (the workdir resumes), so an
interrupted reproduction continues: SIGTERM or SIGINT (a cluster's preemption, Ctrl-C) stops the
run in progress at its next step with a checkpoint and exits 75; the same command resumes it.
`--aggregate_only` trains nothing: it remakes the tables from the finished runs in --out (runs
trained on several machines and copied together, or a table while the study trains elsewhere).
Bad input (an unknown study, setting or run name, bad seeds,
an override that is not a field) is one `error:` line and exit 2, before --out is created.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import subprocess
import sys
import time

import jax

from gedl_jax import cli, configuration, evaluation, files, methods, train
from gedl_jax.run import lock, numerics, preemption, rundir

# The paper's numbers (AUPR %, accuracy %): main Table results and Table additional_baselines.
PAPER = {
    "mnist": {
        "columns": ["Acc", "Conf.MP", "KMNIST MP", "KMNIST UM", "FMNIST MP", "FMNIST UM"],
        "edl": [98.22, 99.99, 97.02, 96.31, 98.11, 98.08],
        "iedl": [99.21, 99.98, 98.34, 98.33, 98.89, 98.86],
        "redl": [99.33, 99.99, 98.69, 98.69, 99.29, 99.29],
        "red": [99.38, 99.97, 98.71, 97.24, 99.34, 98.78],
        "gedl": [99.58, 99.95, 99.80, 99.70, 98.54, 98.99],
        # Copied by the paper from earlier papers (no UM for MC Dropout and DUQ), and its
        # appendix runs of DAEDL and F-EDL with their authors' code (one run each).
        "mc_dropout": [99.26, 99.98, 94.00, None, 96.56, None],
        "duq": [98.65, 99.97, 98.52, None, 97.92, None],
        "kl_pn": [99.01, 99.92, 92.97, 93.39, 98.44, 98.16],
        "rkl_pn": [99.21, 99.67, 60.76, 53.76, 78.45, 72.18],
        "postnet": [99.34, 99.98, 95.75, 94.59, 97.78, 97.24],
        "daedl": [99.43, 99.99, 98.92, 98.86, 99.40, 99.54],
        "fedl": [99.48, 99.99, 99.02, 96.71, 99.66, 94.51],
    },
    "cifar10": {
        "columns": ["Acc", "Conf.MP", "SVHN MP", "SVHN UM", "CIFAR-100 MP", "CIFAR-100 UM"],
        "edl": [83.55, 97.86, 78.87, 79.12, 84.30, 84.18],
        "iedl": [89.20, 98.72, 83.26, 82.96, 85.35, 84.84],
        "redl": [90.09, 98.98, 85.00, 85.00, 87.72, 87.73],
        "red": [89.80, 98.63, 90.10, 89.92, 84.97, 84.62],
        "gedl": [90.22, 97.15, 89.26, 92.56, 88.27, 85.42],
        "mc_dropout": [82.84, 97.15, 51.39, None, 45.57, None],
        "duq": [89.33, 97.89, 80.23, None, 84.75, None],
        "kl_pn": [27.46, 50.61, 43.96, 43.23, 61.41, 61.53],
        "rkl_pn": [64.76, 86.11, 53.61, 49.37, 55.42, 54.74],
        "postnet": [84.85, 97.76, 80.21, 77.71, 81.96, 82.06],
        "daedl": [90.06, 98.80, 85.28, 85.30, 84.34, 84.50],
        "fedl": [91.29, 99.10, 88.57, 61.04, 88.18, 68.79],
        "calibration": {"gedl": {"ECE": 0.0464, "Brier": 0.1525}},
    },
}

STUDIES = {
    # Every method of the paper's tables that the toolkit has (configuration.VARIANTS), the
    # EDL family first, and the plain softmax classifier (the base of the post-hoc OOD scores
    # and of `laplace`, which evaluates from its runs: `evaluate --as_method=laplace`);
    # "ensemble" is a deep ensemble of 5 softmax networks.
    "main": lambda: [(v, v, {}) for v in MAIN_METHODS if v in configuration.VARIANTS]
                    + [("ensemble", "ensemble", {})],
    "ablation": lambda: [(v, v, {}) for v in ("ablation_base", "ablation_kl_all",
                                              "ablation_kl_all_tau", "ablation_full")],
    "sensitivity": lambda: ([(f"gedl_cw{c}", "gedl", {"c_w": c}) for c in (0.3, 0.5, 0.7)]
                            + [(f"gedl_ctau{t}", "gedl", {"c_tau": float(t)})
                               for t in (70, 90, 110, 130, 150)]),
    # GEDL under each reading of the paper that changes the KL weight 1/tau or its target
    # (docs/gedl_readings.md quotes the words behind each); "gedl" is the preset as shipped.
    "readings": lambda: [(name, "gedl", fields) for name, fields in GEDL_READINGS.items()],
}

GEDL_READINGS = {
    "gedl": {},
    "tau_step": {"tau_reading": "step"},
    "tau_sum_over_c": {"tau_form": "sum_over_c"},
    "kl_masked": {"kl_target": "masked"},
    "tau_completed_epochs": {"tau_reading": "completed_epochs"},
    "c_tau_1000": {"c_tau": 1000.0},
    "evidence_exp": {"evidence": "exp"},
}

MAIN_METHODS = ("gedl", "edl", "iedl", "redl", "red", "mc_dropout", "softmax", "duq", "kl_pn",
                "rkl_pn", "postnet", "daedl", "fedl")

SETTINGS = {
    # 3 epochs on the first 12,000 training images: 5 variants x 5 seeds in well under an hour on
    # a 2-core CPU. Called "quick" until the config modifier `quick` (2 epochs on 6,400 images)
    # made that name mean two settings; results recorded before the rename say "quick".
    "short": {"num_epochs": 3, "train_examples": 12000, "val_examples": 2000,
              "log_every_steps": 50},
    # The whole training split (MNIST: 48,000) for 1 epoch, schedules over that epoch: every
    # method of the main study (13 + a 5-member ensemble) x 3 seeds is 54 trainings, about an
    # hour on an idle 2-core CPU (Python 3.13 / jax 0.12: ~1,400 img/s, ~70 s a run with its
    # evaluation). `--override=num_epochs=N` for longer. Keep --out outside the checkout: an
    # interrupted study resumes there.
    "medium": {"num_epochs": 1, "log_every_steps": 100, "plots": False},
    # The whole split for 20 epochs: every KL schedule reaches full weight by epoch 10 (EDL's
    # min(1, epoch/10)), so this is the shortest run where the KL terms act at full strength;
    # about 13 min a ConvNet run on an idle 2-core CPU.
    "long": {"num_epochs": 20, "log_every_steps": 100, "plots": False},
    # The paper's Table implementation_details exactly (200 epochs, whole split, cosine, batch
    # 128): the presets' own settings. "full" is its older name.
    "paper": {},
}
# Old names, still accepted (the commands recorded with earlier results use them).
OLD_SETTING_NAMES = {"full": "paper", "quick": "short"}


def environment() -> dict:
    repo = pathlib.Path(__file__).resolve().parents[1]
    def git(*a):
        try:
            return subprocess.run(["git", *a], capture_output=True, text=True,
                                  cwd=repo).stdout.strip()
        except OSError:
            return "?"
    import flax  # noqa: E401
    import optax
    dev = jax.devices()[0]
    return {"commit": git("rev-parse", "--short", "HEAD"),
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
            "device": getattr(dev, "device_kind", dev.platform), "device_count": jax.device_count(),
            "cpu_count": os.cpu_count(), "machine": platform.machine(),
            "python": platform.python_version(), "jax": jax.__version__,
            "flax": flax.__version__, "optax": optax.__version__}


def environment_text(env: dict) -> str:
    late = env.get("recorded_at_resume_from_step")
    return (f"{env['device']} x{env['device_count']}, {env['cpu_count']} CPU cores "
            f"({env['machine']}); Python {env['python']}, jax {env['jax']}, flax {env['flax']}, "
            f"optax {env['optax']}; commit {env['commit'] or '?'}"
            f"{' (uncommitted changes)' if env['dirty'] else ''}"
            + (f" (recorded when resuming from step {late}: what trained the steps before it "
               f"is not recorded)" if late is not None else ""))


def checkpointed_step(seed_dir: pathlib.Path) -> int | None:
    """The newest step in the run's checkpoints/last (None: the run has not started)."""
    last = seed_dir / "checkpoints" / "last"
    steps = [int(p.name) for p in last.iterdir() if p.name.isdigit()] if last.is_dir() else []
    return max(steps) if steps else None


def record_environment(seed_dir: pathlib.Path, env: dict, *, continuing: bool = False) -> None:
    """Each run keeps the environment that trained it (environment.json), so a table made later,
    on another machine, from reused runs still says where its numbers were computed.

    Called before a run trains (`continuing=True`): the first machine is recorded when the run
    starts, and a different machine that resumes it later is appended to "resumed_on" (a run
    preempted on a GPU and finished on a CPU names both). An existing record is never replaced.
    A run already under way without a record (started by code that wrote none) is recorded with
    "recorded_at_resume_from_step", so the record does not claim the steps before it.
    """
    path = seed_dir / "environment.json"
    if not seed_dir.is_dir():
        return
    if not path.exists():
        step = checkpointed_step(seed_dir)
        record = env if step is None else {**env, "recorded_at_resume_from_step": step}
        files.write_text(path, json.dumps(record, indent=2) + "\n")
        return
    if not continuing:
        return
    recorded = json.loads(path.read_text())
    if rundir.machine_fields(rundir.machines(recorded)[-1]) != env:
        recorded["resumed_on"] = [*recorded.get("resumed_on", []), env]
        files.write_text(path, json.dumps(recorded, indent=2) + "\n")


def trained_on(run_dirs: list[pathlib.Path]) -> list[str]:
    """'<environment> (N runs)' for each distinct recorded environment of `run_dirs` (with the
    machines that resumed a run, if any)."""
    counts: dict[str, int] = {}
    for d in run_dirs:
        path = d / "environment.json"
        if path.exists():
            first, *later = rundir.machines(json.loads(path.read_text()))
            text = environment_text(first)
            if later:
                text += "; resumed on " + "; then ".join(environment_text(e) for e in later)
        else:
            text = "not recorded (runs trained before environment.json existed)"
        counts[text] = counts.get(text, 0) + 1
    return [f"{text} ({n} run{'s' if n > 1 else ''})" for text, n in counts.items()]


def runs_at_chance(grouped: dict[str, list[dict]]) -> list[str]:
    """One line per run whose test accuracy is not above 1.5/K: a run that learnt nothing
    (diverged, or collapsed to the prior) is averaged into its row like any other seed, so the
    table names it rather than leave a mean of 70 ± 50 unexplained."""
    lines = []
    for name, results in grouped.items():
        for r in results:
            acc, k = r["id"]["accuracy"], r["id"]["num_classes"]
            if acc <= 1.5 / k:
                lines.append(f"{name} seed {r.get('seed', '?')}: test accuracy {100 * acc:.2f} % "
                             f"(chance: {100 / k:.1f} %); the run did not learn (see its "
                             f"metrics.jsonl)")
    return lines


def paper_table(dataset: str, names: list[str]) -> str:
    ref = PAPER.get(dataset)
    if not ref:
        return ""
    rows = [n for n in names if n in ref and n not in ("columns", "calibration")]
    if not rows:
        return ""
    lines = ["| paper | " + " | ".join(ref["columns"]) + " |",
             "|---|" + "---:|" * len(ref["columns"])]
    for n in rows:
        lines.append(f"| {n} | " + " | ".join("–" if x is None else f"{x:.2f}" for x in ref[n])
                     + " |")
    return "\n".join(lines)


def sensitivity_plot(grouped: dict[str, list[dict]], path: pathlib.Path) -> pathlib.Path | None:
    """Accuracy, Conf.MP and OOD AUPR (MP and UM) against C_w and C_tau (mean ± std over seeds),
    the paper's Fig. param_analysis, from runs named gedl_cw<value> / gedl_ctau<value>."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    def series(prefix):
        points = []
        for name, runs in grouped.items():
            if name.startswith(prefix):
                value = float(name[len(prefix):])
                metrics = {"Acc": [r["id"]["accuracy"] for r in runs],
                           "Conf.MP": [r["id"]["misclassification"]["mp"]["aupr"] for r in runs]}
                for ood in runs[0]["ood"]:
                    for score in ("mp", "um"):
                        metrics[f"{ood} {score.upper()}"] = [
                            r["ood"][ood]["detection"][score]["aupr_in"] for r in runs]
                points.append((value, metrics))
        return sorted(points, key=lambda p: p[0])

    panels = [("gedl_cw", "$C_W$"), ("gedl_ctau", r"$C_\tau$")]
    panels = [(prefix, label, series(prefix)) for prefix, label in panels if series(prefix)]
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, (_, label, points) in zip(axes[0], panels):
        xs = [p[0] for p in points]
        for metric in points[0][1]:
            values = [100 * np.asarray(p[1][metric], float) for p in points]
            ax.errorbar(xs, [v.mean() for v in values],
                        yerr=[v.std(ddof=1) if len(v) > 1 else 0 for v in values],
                        marker="o", capsize=3, label=metric)
        ax.set_xlabel(label)
        ax.set_ylabel("% (AUPR; accuracy)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    files.write_with(path, lambda f: fig.savefig(f, dpi=120, format="png"))   # never via a link
    plt.close(fig)
    return path


def _parser() -> argparse.ArgumentParser:
    studies = "\n".join(f"  {name}: {', '.join(run[0] for run in make())}"
                        for name, make in sorted(STUDIES.items()))
    settings = "\n".join(f"  {name}: {fields or 'the presets as they are (the paper protocol)'}"
                         for name, fields in SETTINGS.items())
    old = ", ".join(f"{o} = {n}" for o, n in OLD_SETTING_NAMES.items())
    p = cli.ArgumentParser(
        prog="bin/reproduce.py", description=__doc__,
        epilog=f"studies and their run names (--variants picks some):\n{studies}\n"
               f"settings (on top of each preset):\n{settings}\n  old names: {old}")
    p.add_argument("--dataset", default="mnist", choices=["mnist", "cifar10", "cifar100"])
    p.add_argument("--study", default="main", choices=sorted(STUDIES))
    p.add_argument("--setting", default="short", choices=[*SETTINGS, *OLD_SETTING_NAMES])
    p.add_argument("--variants", default="", help="subset of the study's run names, e.g. gedl,edl")
    p.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated integers")
    p.add_argument("--vmap_seeds", action="store_true",
                   help="train each variant's seeds together in one program (config.vmap_seeds; "
                        "pays on an accelerator, slower on a CPU)")
    p.add_argument("--override", action="append", default=[],
                   help="field=value applied to every run (e.g. ood_datasets= on CIFAR here)")
    p.add_argument("--data_dir", default="")
    p.add_argument("--aggregate_only", action="store_true",
                   help="train nothing: make the table from the finished runs already in --out "
                        "(e.g. runs trained on several machines, or while a study is still "
                        "training elsewhere); a run without results is an error that names it")
    p.add_argument("--out", required=True)
    return p


def _override(c, item: str) -> None:
    key, eq, value = item.partition("=")
    if not eq or key not in c:
        raise ValueError(f"--override={item!r}: expected field=value with a config field "
                         f"(e.g. --override=num_epochs=5); the fields are in "
                         f"gedl_jax/configuration.py")
    try:
        if key in configuration.LIST_FIELDS:
            c[key] = configuration.as_tuple(key, value)
        elif isinstance(c[key], bool):
            c[key] = value.lower() in ("1", "true", "yes")
        else:
            c[key] = type(c[key])(value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"--override={item!r}: {e}") from None


def plan(args: argparse.Namespace) -> tuple[list[int], list[tuple[str, object]]]:
    """The seeds and (run name, config) of every run, each config validated: bad input is found
    here, before --out is created or anything trains."""
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        raise ValueError(f"--seeds={args.seeds!r} must be comma-separated integers, e.g. "
                         f"--seeds=0,1,2") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds={args.seeds!r} must list at least one seed, none twice")
    runs = STUDIES[args.study]()
    if args.variants:
        wanted = [v for v in args.variants.split(",") if v]
        unknown = [v for v in wanted if v not in {r[0] for r in runs}]
        if unknown:
            raise ValueError(f"--variants: {unknown} not in the {args.study} study; its runs: "
                             f"{[r[0] for r in runs]}")
        runs = [r for r in runs if r[0] in wanted]
    configs = []
    for name, variant, fields in runs:
        c = configuration.build_config(args.dataset, variant)
        for k, v in {**SETTINGS[args.setting], **fields}.items():
            c[k] = v
        for item in args.override:
            _override(c, item)
        if args.data_dir:
            c.data_dir = args.data_dir
        configuration.validate_config(c)
        configs.append((name, c))
    return seeds, configs


def main(argv=None) -> int:
    """Bad input (an unknown study, setting or run name, bad seeds, an override that is not a
    field) is one `error:` line and exit 2 before anything is written (gedl_jax.cli)."""
    return cli.run_argparse(_parser(), lambda args: _main(args, argv), argv, codes=[
        ((preemption.Preempted, preemption.EvaluationInterrupted), cli.EXIT_INTERRUPTED)])


def _main(args: argparse.Namespace, argv) -> int:
    if args.setting in OLD_SETTING_NAMES:
        new = OLD_SETTING_NAMES[args.setting]
        print(f"note: --setting={args.setting} is the old name of --setting={new}", flush=True)
        args.setting = new
    seeds, configs = plan(args)
    out = pathlib.Path(args.out)
    if args.aggregate_only:
        unfinished = [f"{name}/seed_{s}" for name, _ in configs for s in seeds
                      if not (out / "runs" / name / f"seed_{s}" / "eval_results.json").exists()]
        if unfinished:
            raise ValueError(f"--aggregate_only: {len(unfinished)} run(s) in {out / 'runs'} have "
                             f"no eval_results.json: {', '.join(unfinished)}; train them (the "
                             f"same command without --aggregate_only) or leave them out with "
                             f"--variants/--seeds")
    if args.aggregate_only:   # trains nothing: may run beside a study still training there
        files.check_writable(out, "--out")
        out.mkdir(parents=True, exist_ok=True)
        return _study(args, argv, seeds, configs, out)
    # The runs train in this process: the determinism flags must be set before anything
    # starts jax's backend (`environment()` does), or no run gets them (`numerics`).
    numerics.configure_process(any(bool(c.get("deterministic", True)) for _, c in configs),
                               out)
    with lock.holding(out, "--out"):   # checked writable, created, and ours alone
        return _study(args, argv, seeds, configs, out)


def _study(args: argparse.Namespace, argv, seeds: list[int], configs, out: pathlib.Path) -> int:
    env = environment()
    print(f"# {env}", flush=True)
    # A preemption (SIGTERM) or Ctrl-C checkpoints the run in progress and ends the study, as
    # for `python -m gedl_jax.train`; without this a SIGTERM killed it mid-epoch.
    if not args.aggregate_only:
        preemption.install(prompt=True)
    start = time.time()
    grouped: dict[str, list[dict]] = {}
    num_runs = 0
    for name, c in configs:
        run_dir = out / "runs" / name
        pending = [] if args.aggregate_only else [
            s for s in seeds if not (run_dir / f"seed_{s}" / "eval_results.json").exists()]
        for seed in pending:   # the machine that starts (or resumes) each run, before it trains
            (run_dir / f"seed_{seed}").mkdir(parents=True, exist_ok=True)
            record_environment(run_dir / f"seed_{seed}", env, continuing=True)
        if c.ensemble_size:   # each seed: N members trained, scored as one model
            for seed in pending:
                print(f"=== {name} seed {seed} ===", flush=True)
                train.train_ensemble(configuration.with_seed(c, seed), run_dir / f"seed_{seed}")
        elif args.vmap_seeds and len(pending) > 1:
            print(f"=== {name} seeds {pending} (vmap) ===", flush=True)
            c.seeds = tuple(pending)
            c.vmap_seeds = True
            train.train_and_evaluate_vmapped(c, run_dir, pending)
        else:
            for seed in pending:
                print(f"=== {name} seed {seed} ===", flush=True)
                seeded = c.copy_and_resolve_references()
                seeded.seed = seed
                train.train_and_evaluate(seeded, run_dir / f"seed_{seed}")
        num_runs += len(seeds)
        for seed in seeds:
            result = json.loads((run_dir / f"seed_{seed}" / "eval_results.json").read_text())
            result["variant"] = name
            # results written before methods recorded what their scores mean: the method's own
            # words (a class attribute; no score changed its definition since)
            result.setdefault("score_captions", dict(methods.method_class(c).score_captions))
            grouped.setdefault(name, []).append(result)
    wall = time.time() - start
    vmap_note = "; each variant's seeds trained together (vmap)" if args.vmap_seeds else ""
    table = evaluation.results_table(grouped, fmt="markdown")
    latex = evaluation.results_table(grouped, fmt="latex")
    settings_text = SETTINGS[args.setting] or {"(paper protocol)": True}
    lines = [
        f"# {args.dataset} {args.study} study, {args.setting} setting",
        "",
        "Command: `python bin/reproduce.py "
        f"{' '.join(argv if argv is not None else sys.argv[1:])}`",
        f"Settings on top of each variant's config: `{settings_text}`; seeds {seeds}.",
        f"Table made on: {environment_text(env)}.",
        "Runs trained on: " + "; ".join(trained_on(
            [out / "runs" / name / f"seed_{s}" for name, _ in configs for s in seeds])) + ".",
        f"Wall time: {wall / 60:.1f} min for {num_runs} runs "
        f"(runs reused from an earlier invocation count ~0 s)"
        f"{vmap_note}.",
        "",
        "## Measured",
        "",
        table,
        "",
    ]
    at_chance = runs_at_chance(grouped)
    if at_chance:
        for line in at_chance:
            print(f"warning: {line}", file=sys.stderr, flush=True)
        lines += ["## Runs at chance level (included in the means above)", "",
                  *[f"- {line}" for line in at_chance], ""]
    ref = paper_table(args.dataset, list(grouped))
    if ref:
        lines += ["## The paper's numbers (200 epochs, 5 seeds)", "", ref, ""]
    if args.study == "sensitivity":
        plot = sensitivity_plot(grouped, out / "sensitivity.png")
        if plot:
            lines += [f"Plot: `{plot.name}` (mean ± sample std over seeds).", ""]
    files.write_text(out / "results.md", "\n".join(lines))
    files.write_text(out / "results.tex", latex + "\n")
    files.write_text(out / "results.json", json.dumps(
        {"environment": env, "args": vars(args), "wall_seconds": wall,
         "aggregate": {k: evaluation.aggregate(v) for k, v in grouped.items()}}, indent=2))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
