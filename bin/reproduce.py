#!/usr/bin/env python
"""Reproduce the paper's tables: train variants x seeds, evaluate, write tables beside the paper's.

    python bin/reproduce.py --study=main --setting=short --out=runs/mnist_short
    python bin/reproduce.py --study=main --setting=medium --seeds=0,1,2 --out=~/runs/mnist_medium
    python bin/reproduce.py --study=main --setting=paper --out=runs/mnist_paper       # 200 epochs
    python bin/reproduce.py --study=readings --setting=long --seeds=0,1,2 --out=RUNS  # readings
    python bin/reproduce.py --study=ablation --setting=short --out=runs/ablation_short
    python bin/reproduce.py --study=sensitivity --setting=short --out=runs/sens_short
    python bin/reproduce.py --dataset=cifar10 --setting=paper --variants=gedl --seeds=0-4 \
        --vmap_seeds --out=runs/cifar10_paper --results=docs/results/cifar10_paper

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

`--results=DIR` also publishes each finished run into DIR (`runs/<row>_seed<s>/`: its config,
evaluation, table, training log and environment, the machine's paths replaced by RUNS_DIR and
DATA_DIR; `rows.json`: each row's command, seeds, machine and wall time) and remakes DIR's
`results.md` and `results.json` from every row DIR holds, ours beside the paper's
(`gedl_jax.evaluation.against_paper`): one command per row, on whatever machine, fills one
table. OOD sets (`--ood_datasets`): on CIFAR the paper's (SVHN, CIFAR-100) and the far-OOD sets
derived from MNIST and Fashion-MNIST, those the data folder (or the cache) holds; the command
names the ones it leaves out. `--dry_run` trains each run a few steps on a few images (the
whole program: network, augmentation, evaluation), to check a command before a long run.
Bad input (an unknown study, setting or run name, bad seeds,
an override that is not a field) is one `error:` line and exit 2, before --out is created.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import time

import jax

from gedl_jax import config, data, evaluation, files, methods, train
from gedl_jax.commands import cli
from gedl_jax.configs import build_config
from gedl_jax.evaluation import against_paper
from gedl_jax.paper import MAIN_METHODS, PAPER
from gedl_jax.run import lock, numerics, preemption, rundir

STUDIES = {
    # Every method of the paper's tables that the toolkit has (config.VARIANTS), the
    # EDL family first, and the plain softmax classifier (the base of the post-hoc OOD scores
    # and of `laplace`, which evaluates from its runs: `evaluate --as_method=laplace`);
    # "ensemble" is a deep ensemble of 5 softmax networks.
    "main": lambda: [(v, v, {}) for v in MAIN_METHODS if v in config.VARIANTS]
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
    rows = [n for n in names if n in ref and n != "columns"]
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
    p.add_argument("--dataset", default="mnist", choices=["mnist", "cifar10", "cifar100"],
                   help="the in-distribution dataset (default mnist)")
    p.add_argument("--study", default="main", choices=sorted(STUDIES),
                   help="which table's runs (below: each study's run names; default main)")
    p.add_argument("--setting", default="short", choices=[*SETTINGS, *OLD_SETTING_NAMES],
                   help="the training length on top of each preset (below; default short)")
    p.add_argument("--variants", default="", help="subset of the study's run names, e.g. gedl,edl")
    p.add_argument("--seeds", default="0,1,2,3,4",
                   help="comma-separated integers or ranges: 0,1,2 or 0-4 (both ends included)")
    p.add_argument("--vmap_seeds", action="store_true",
                   help="train each variant's seeds together in one program (config.vmap_seeds; "
                        "pays on an accelerator, slower on a CPU)")
    p.add_argument("--override", action="append", default=[],
                   help="field=value applied to every run (e.g. ood_datasets= on CIFAR here)")
    p.add_argument("--ood_datasets", default="auto",
                   help="the OOD sets every run evaluates: 'auto' (MNIST: the preset's; CIFAR: "
                        "the paper's and the derived far-OOD sets, those that load without the "
                        "network, naming the rest), 'preset', or a comma-separated list")
    p.add_argument("--results", default="",
                   help="also publish each finished run and remake this folder's tables from "
                        "every row it holds (e.g. docs/results/cifar10_paper)")
    p.add_argument("--publish_predictions", action="store_true",
                   help="with --results: publish each run's predictions.npz too (per-example "
                        "outputs, a few MB a run)")
    p.add_argument("--dry_run", action="store_true",
                   help="each run a few steps on a few images, every part of the program: to "
                        "check a command (CI runs it) before a long run")
    p.add_argument("--data_dir", default="",
                   help="the data folder of every run (config.data_dir; default: "
                        "$GEDL_DATA_DIR, else the default data folder)")
    p.add_argument("--aggregate_only", action="store_true",
                   help="train nothing: make the table from the finished runs already in --out "
                        "(e.g. runs trained on several machines, or while a study is still "
                        "training elsewhere); a run without results is an error that names it")
    p.add_argument("--out", required=True,
                   help="the study's folder: one subfolder per run, the summary table and "
                        "provenance (rerunning the command resumes it)")
    return p


def _override(c, item: str) -> None:
    key, eq, value = item.partition("=")
    if not eq or key not in c:
        raise ValueError(f"--override={item!r}: expected field=value with a config field "
                         f"(e.g. --override=num_epochs=5); the fields are in "
                         f"`python -m gedl_jax.train --helpfull`")
    try:
        if key in config.LIST_FIELDS:
            c[key] = config.as_tuple(key, value)
        elif isinstance(c[key], bool):
            c[key] = value.lower() in ("1", "true", "yes")
        else:
            c[key] = type(c[key])(value)
    except (TypeError, ValueError) as e:
        raise ValueError(f"--override={item!r}: {e}") from None


def parse_seeds(text: str) -> list[int]:
    """The seeds of `--seeds`: comma-separated integers or inclusive ranges ("0-4", "0,3-5")."""
    seeds = []
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        first, dash, last = item.partition("-")
        try:
            seeds += list(range(int(first), int(last) + 1)) if dash and first else [int(item)]
        except ValueError:
            raise ValueError(f"--seeds={text}: {item!r} is not an integer or a range such as "
                             f"0-4; e.g. --seeds=0,1,2 or --seeds=0-4") from None
    return seeds


# A dry run (`--dry_run`): every part of each run's program on a few images, in a few steps.
DRY_RUN = {"num_epochs": 1, "train_examples": 64, "val_examples": 16, "eval_examples": 32,
           "batch_size": 16, "log_every_steps": 1, "eval_batch_size": 32, "plots": False,
           "allow_chance": True, "checkpoint_interval_seconds": 0.0}


def ood_candidates(dataset: str, preset: tuple[str, ...]) -> list[str]:
    """`--ood_datasets=auto`'s sets for a CIFAR dataset: the preset's (the paper's), then the near
    and far sets the registry declares for it (e.g. MNIST and Fashion-MNIST made 32x32 RGB)."""
    groups = data.ood_sets_by_group(dataset)
    return list(dict.fromkeys([*preset, *groups.get("near", ()), *groups.get("far", ())]))


def choose_ood_sets(args: argparse.Namespace, c) -> tuple[tuple[str, ...], list[str]]:
    """(the OOD sets every run evaluates, the candidates left out because they do not load
    without the network) for `--ood_datasets`."""
    if args.ood_datasets not in ("auto", "preset"):
        return config.as_tuple("ood_datasets", args.ood_datasets), []
    preset = tuple(c.ood_datasets)
    overridden = any(item.partition("=")[0] == "ood_datasets" for item in args.override)
    if args.ood_datasets == "preset" or overridden or not args.dataset.startswith("cifar"):
        return preset, []
    candidates = ood_candidates(args.dataset, preset)
    loadable = data.loadable_offline(candidates, c.data_dir or None, c.cache_dir or None,
                                     c.data_source)
    return (tuple(n for n in candidates if loadable[n]),
            [n for n in candidates if not loadable[n]])


def plan(args: argparse.Namespace) -> tuple[list[int], list[tuple[str, object]]]:
    """The seeds and (run name, config) of every run, each config validated: bad input is found
    here, before --out is created or anything trains."""
    seeds = parse_seeds(args.seeds)
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds={args.seeds!r} must list at least one seed, none twice")
    args.ood_left_out = []
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
        c = build_config(args.dataset, variant)
        for k, v in {**SETTINGS[args.setting], **fields}.items():
            c[k] = v
        if args.dry_run:
            for k, v in DRY_RUN.items():
                c[k] = v
        for item in args.override:
            _override(c, item)
        if args.data_dir:
            c.data_dir = args.data_dir
        c.ood_datasets, args.ood_left_out = choose_ood_sets(args, c)
        config.validate(c)
        configs.append((name, c))
    return seeds, configs


def ood_lines(configs, left_out: list[str]) -> list[str]:
    """What the runs evaluate as OOD, and which of the candidates they leave out and why."""
    sets = list(configs[0][1].ood_datasets) if configs else []
    lines = [f"OOD sets: {', '.join(sets) or 'none'}"]
    if left_out:
        lines += [f"OOD sets left out, not in the data folder or the cache: "
                  f"{', '.join(left_out)}",
                  f"  to add them: python -m gedl_jax.data.fetch "
                  f"{' '.join(data.source_split(n)[0] for n in left_out)} (needs a network), "
                  f"or their official files in $GEDL_DATA_DIR"]
    return lines


def main(argv=None) -> int:
    """Bad input (an unknown study, setting or run name, bad seeds, an override that is not a
    field) is one `error:` line and exit 2 before anything is written (gedl_jax.commands.cli)."""
    return cli.run_argparse(_parser(), lambda args: _main(args, argv), argv, codes=[
        ((preemption.Preempted, preemption.EvaluationInterrupted), cli.EXIT_INTERRUPTED)],
        renamed=cli.RENAMED_FLAGS["reproduce"])


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
    for line in ood_lines(configs, args.ood_left_out):
        print(line, flush=True)
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
                train.train_ensemble(config.set_fields(c.copy_and_resolve_references(),
                                                       seed=seed), run_dir / f"seed_{seed}")
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
    if args.dry_run:
        lines[0] += " (dry run: a few steps on a few images; the numbers mean nothing)"
    files.write_text(out / "results.md", "\n".join(lines))
    files.write_text(out / "results.tex", latex + "\n")
    files.write_text(out / "results.json", json.dumps(
        {"environment": env, "args": vars(args), "wall_seconds": wall,
         "aggregate": {k: evaluation.aggregate(v) for k, v in grouped.items()}}, indent=2))
    print("\n".join(lines))
    if args.results:
        command = "python bin/reproduce.py " + " ".join(argv if argv is not None
                                                         else sys.argv[1:])
        # a command that trained the row records itself; one that only aggregates does not
        # claim the training's machine or time
        record = {"published_by": command} if args.aggregate_only else {
            "command": command, "seeds": seeds, "wall_seconds": round(wall, 1),
            "vmap_seeds": args.vmap_seeds, "device": env["device"], "commit": env["commit"],
            "dry_run": args.dry_run}
        published = publish(out, configs, seeds, pathlib.Path(args.results), record,
                            predictions=args.publish_predictions)
        print(f"published {published} run(s) into {args.results}; its tables: "
              f"{pathlib.Path(args.results) / 'results.md'}", flush=True)
    return 0


# ----------------------------------------------------------------- a results folder of rows

# A published run's files (`--results`): what its table, its curves and its provenance need.
PUBLISHED_FILES = ("config.json", "eval_results.json", "eval_table.md", "metrics.jsonl",
                   "environment.json")


def _anonymised(text: str, runs_parent: pathlib.Path, data_dir: str) -> str:
    """The machine's paths in a published file replaced by RUNS_DIR (the folder holding --out)
    and DATA_DIR ($GEDL_DATA_DIR), as the committed results name them."""
    text = text.replace(str(runs_parent), "RUNS_DIR")
    return text.replace(data_dir, "DATA_DIR") if data_dir else text


def publish(out: pathlib.Path, configs, seeds: list[int], results: pathlib.Path,
            row_record: dict, predictions: bool = False) -> int:
    """Copy each finished run of `configs` x `seeds` into `results`/runs/<row>_seed<s>/, add
    `row_record` (the command, and for one that trained: its seeds, machine and wall time) to
    each row's list in `results`/rows.json, and remake `results`' tables from every row it holds
    (`write_results_tables`); with `predictions`, each run's predictions.npz too. Returns how
    many runs were published."""
    runs_parent = out.resolve().parent
    data_dir = os.environ.get("GEDL_DATA_DIR", "")
    files.check_writable(results, "--results")
    rows_path = results / "rows.json"
    rows = json.loads(rows_path.read_text()) if rows_path.exists() else {}
    count = 0
    for name, _ in configs:
        for seed in seeds:
            source = out / "runs" / name / f"seed_{seed}"
            if not (source / "eval_results.json").exists():
                continue
            target = results / "runs" / f"{name}_seed{seed}"
            target.mkdir(parents=True, exist_ok=True)
            for file in PUBLISHED_FILES:
                if (source / file).exists():
                    files.write_text(target / file, _anonymised(
                        (source / file).read_text(), runs_parent, data_dir))
            if predictions and (source / "predictions.npz").exists():
                files.write_with(target / "predictions.npz", lambda tmp, src=source:
                                 shutil.copyfile(src / "predictions.npz", tmp))
            count += 1
        rows[name] = [*rows.get(name, []), {
            k: _anonymised(v, runs_parent, data_dir) if isinstance(v, str) else v
            for k, v in row_record.items()}]
    files.write_text(rows_path, json.dumps(rows, indent=2, sort_keys=True) + "\n")
    write_results_tables(results, configs[0][1].dataset if configs else "")
    return count


def published_runs(results: pathlib.Path) -> dict[str, list[dict]]:
    """{row: its seeds' evaluations} of a results folder, rows in the main study's order (the
    EDL family first), seeds in order."""
    found: dict[str, list[tuple[int, dict]]] = {}
    for path in sorted((results / "runs").glob("*_seed*/eval_results.json")):
        name, _, seed = path.parent.name.rpartition("_seed")
        if not seed.isdigit():
            continue
        result = json.loads(path.read_text())
        result["variant"] = name
        found.setdefault(name, []).append((int(seed), result))
    order = {name: i for i, name in enumerate(MAIN_METHODS)}
    return {name: [r for _, r in sorted(runs, key=lambda sr: sr[0])]
            for name, runs in sorted(found.items(), key=lambda kv: (order.get(kv[0], 99), kv[0]))}


def write_results_tables(results: pathlib.Path, dataset: str) -> None:
    """`results`/results.md (and .json): every row the folder holds beside the paper's rows,
    the calibration table, and which machine trained each row."""
    grouped = published_runs(results)
    if not grouped:
        return
    dataset = dataset or next(iter(grouped.values()))[0].get("dataset", "")
    rows_path = results / "rows.json"
    rows = json.loads(rows_path.read_text()) if rows_path.exists() else {}
    machines = []
    for name, runs in grouped.items():
        envs = [results / "runs" / f"{name}_seed{r.get('seed', '?')}" / "environment.json"
                for r in runs]
        trained = sorted({environment_text(json.loads(e.read_text())) if e.exists()
                          else "not recorded" for e in envs})
        trainings = [r for r in rows.get(name, []) if "wall_seconds" in r]
        wall = "; ".join(f"{r['wall_seconds']:.0f} s (seeds "
                         f"{','.join(map(str, r['seeds']))}{', vmap' * r['vmap_seeds']})"
                         for r in trainings) or "–"
        seeds = ", ".join(str(r.get("seed", "?")) for r in runs)
        label = f"{name} (dry run)" if any(r.get("dry_run") for r in trainings) else name
        machines.append(f"| {label} | {seeds} | {wall} | {'; '.join(trained)} |")
    calibration = against_paper.calibration_table(dataset, grouped)
    text = [f"# {dataset}: our rows beside the paper's", "",
            "Written by `bin/reproduce.py --results` from every row of this folder "
            "(`runs/<row>_seed<s>/`); the same command for another row adds it here. Ours: "
            "mean ± sample std over seeds, AUPR % with the in-distribution set positive; the "
            "paper's rows: its means ± its std.", "",
            "## Main table", "", against_paper.main_table(dataset, grouped), ""]
    if calibration:
        text += ["## Calibration (the paper's Table calibration_cifar10)", "",
                 "ECE: 15 equal-width bins on the max probability; Brier: the multi-class "
                 "sum of squares.", "", calibration, ""]
    text += ["## Rows", "",
             "| row | seeds | wall time of each command that trained it | trained on |",
             "|---|---|---:|---|", *machines, ""]
    files.write_text(results / "results.md", "\n".join(text))
    files.write_text(results / "results.json", json.dumps(
        {"dataset": dataset, "aggregate": {k: evaluation.aggregate(v)
                                           for k, v in grouped.items()}}, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
