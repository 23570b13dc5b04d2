#!/usr/bin/env python
"""Export one seed of a study's runs as pretrained models, each evaluated on this machine.

    python bin/export_pretrained.py --study=OUT --variants=edl,iedl --setting=long \
        --results_dir=docs/results/mnist_long/pretrained

OUT is a `bin/reproduce.py --out` folder (runs/<variant>/seed_<s>/). For each variant, the run's
best checkpoint is
1. evaluated here (`python -m gedl_jax.evaluate --workdir=...`): a model trained on a GPU scores a
   little differently on a CPU, and the numbers a model file carries must be the ones
   `--pretrained=NAME` prints on the machines users evaluate it on. The evaluation (without its
   machine paths) goes to RESULTS_DIR/<variant>_seed<s>/, with how far it is from the run's own;
2. exported to PACKAGE_DIR/<dataset>_<variant><suffix>.msgpack and registered in
   PACKAGE_DIR/registry.json as <dataset>/<variant><suffix> (PACKAGE_DIR: gedl_jax/pretrained,
   the models the package ships, unless --package_dir names another folder, e.g. a lab's own
   registry), with the run's commit, versions and hardware (its environment.json; "not
   recorded" for a run without one), its training time (from its metrics.jsonl) and the
   setting.

Exporting the same checkpoint again writes the same bytes. A run that is not finished (no
eval_results.json) is refused, as are deep ensembles (`gedl_jax.pretrained.export`).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parents[1]
# The evaluation command a model's numbers come from: the one users run (tests put the
# generated-data launcher tests/fixture_cli.py before the module name).
EVALUATE = (sys.executable, "-m", "gedl_jax.evaluate")
SETTINGS = {
    "long": "long (the whole training split, 20 epochs; bin/reproduce.py --setting=long)",
    "paper": "paper (the paper's implementation details: the whole training split, 200 epochs, "
             "cosine, batch 128; bin/reproduce.py --setting=paper)",
}


def numeric_leaves(tree, path: str = ""):
    """{path: value} of every number in a results tree."""
    if isinstance(tree, dict):
        return {p: v for k, sub in tree.items()
                for p, v in numeric_leaves(sub, f"{path}/{k}").items()}
    if isinstance(tree, list):
        return {p: v for i, sub in enumerate(tree)
                for p, v in numeric_leaves(sub, f"{path}[{i}]").items()}
    if isinstance(tree, (int, float)) and not isinstance(tree, bool):
        return {path: float(tree)}
    return {}


def difference_text(own: dict, here: dict, headline_own: dict, headline_here: dict) -> str:
    """How this machine's evaluation compares with the run's own, in words."""
    a, b = numeric_leaves(own), numeric_leaves(here)
    common = set(a) & set(b)
    if all(a[k] == b[k] for k in common):
        return f"identical to the run's own evaluation ({len(common)} numbers)"
    relative = max(abs(a[k] - b[k]) / max(1.0, abs(a[k])) for k in common)
    head = max(abs(headline_own[k] - headline_here[k]) for k in headline_own)
    heads = ("the same headline numbers" if head == 0
             else f"headline numbers within {head:.2f} points")
    return (f"the run's own evaluation gives {heads}, every number within {relative:.1e} "
            f"(relative where above 1)")


def training_minutes(metrics: pathlib.Path, log_every_steps: int | None = None
                     ) -> tuple[float | None, int]:
    """(minutes from the first to the last logged line of a run's metrics.jsonl, not counting
    the time between a stop and its resume; the number of resumes). A resume shows as a
    training step logged again (the resumed process retrained from an older checkpoint), or,
    given the run's `log_every_steps`, as a training line at a step that is neither a log point
    nor an epoch end (a validation line's step): a stopped process's last line, its checkpoint
    at that step. The interval after such a stop line, or before the line logged again, is
    left out."""
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    records = [r for r in records if "time" in r]
    if len(records) < 2:
        return None, 0
    epoch_ends = {r["step"] for r in records if r.get("split") == "validation"}

    def stop_line(record: dict) -> bool:
        return (log_every_steps is not None and record.get("split") == "train"
                and record["step"] % log_every_steps != 0 and record["step"] not in epoch_ends)

    seconds, resumes, last_train_step = 0.0, 0, None
    for previous, record in zip(records, records[1:]):
        if (record.get("split") == "train" and last_train_step is not None
                and record["step"] <= last_train_step):
            resumes += 1
        elif stop_line(previous):   # the next line is the resumed process's
            resumes += 1
        else:
            seconds += record["time"] - previous["time"]
        if record.get("split") == "train":
            last_train_step = record["step"]
    return seconds / 60, resumes


def wall_time_text(minutes: float | None, resumes: int) -> str:
    if minutes is None:
        return "not recorded"
    stops = (f", not counting the time between {resumes} stop{'s' if resumes > 1 else ''} "
             f"and {'their' if resumes > 1 else 'its'} resume" if resumes else "")
    return f"{minutes:.1f} min from the first to the last logged step{stops}"


def environment_fields(run: pathlib.Path) -> dict[str, str]:
    """commit, versions and hardware from the run's environment.json, which
    `bin/reproduce.py` writes; "not recorded" for a run without one (e.g. `gedl_jax.train`'s)."""
    from gedl_jax.run import rundir
    if not (run / "environment.json").is_file():
        return dict.fromkeys(("commit", "versions", "hardware"), "not recorded")
    env = json.loads((run / "environment.json").read_text())
    late = env.get("recorded_at_resume_from_step")
    fields = {"commit": env["commit"] + (" (uncommitted changes)" if env.get("dirty") else "")
              + (f" (recorded when resuming from step {late}; the steps before are not "
                 f"recorded)" if late is not None else ""),
              "versions": f"Python {env['python']}, jax {env['jax']}, flax {env['flax']}, "
                          f"optax {env['optax']}",
              "hardware": f"{env['device']} x{env['device_count']}, {env['cpu_count']} CPU cores "
                          f"({env['machine']})"}
    for later in rundir.machines(env)[1:]:
        fields["hardware"] += (f"; resumed on {later['device']} x{later['device_count']} "
                               f"(jax {later['jax']}, commit {later['commit']})")
    return fields


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--study", required=True, help="a bin/reproduce.py --out folder")
    p.add_argument("--variants", required=True, help="comma-separated, e.g. edl,iedl")
    p.add_argument("--seed", type=int, default=0,
                   help="the seed whose runs are exported (runs/<variant>/seed_<s>; default 0)")
    p.add_argument("--setting", required=True, choices=sorted(SETTINGS),
                   help="the bin/reproduce.py --setting the study ran, recorded with each model")
    p.add_argument("--suffix", default="", help="appended to the name, e.g. _paper")
    p.add_argument("--results_dir", required=True, help="where each evaluation is kept")
    p.add_argument("--wall_time_note", default="", help="appended to the training time")
    p.add_argument("--package_dir", default=str(REPO / "gedl_jax" / "pretrained"),
                   help="where the model files and their registry.json go (default: the "
                        "package's, i.e. the models gedl-jax ships)")
    args = p.parse_args(argv)

    sys.path.insert(0, str(REPO))
    from gedl_jax import files
    from gedl_jax.pretrained import export, registry

    results_root = pathlib.Path(args.results_dir)
    package_dir = pathlib.Path(args.package_dir)
    package_dir.mkdir(parents=True, exist_ok=True)
    for variant in args.variants.split(","):
        run = pathlib.Path(args.study) / "runs" / variant / f"seed_{args.seed}"
        own_path = run / "eval_results.json"
        if not own_path.is_file():
            print(f"{variant}: {run} has no eval_results.json (not finished); skipped")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            proc = subprocess.run([*EVALUATE, f"--workdir={run}", f"--out={tmp}"],
                                  capture_output=True, text=True, cwd=REPO,
                                  env={**os.environ, "GEDL_OFFLINE": "1"})
            if proc.returncode:
                print(proc.stderr[-3000:], file=sys.stderr)
                return 1
            here = export.portable_results(
                json.loads((pathlib.Path(tmp) / "eval_results.json").read_text()))
        kept = results_root / f"{variant}_seed{args.seed}"
        kept.mkdir(parents=True, exist_ok=True)
        files.write_text(kept / "eval_results.json", json.dumps(here, indent=2) + "\n")
        own = export.portable_results(json.loads(own_path.read_text()))
        evaluation_note = difference_text(own, here, export.headline(own), export.headline(here))

        dataset = json.loads((run / "config.json").read_text())["dataset"]
        name = f"{dataset}/{variant}{args.suffix}"
        out = package_dir / f"{dataset}_{variant}{args.suffix}.msgpack"
        entry = export.export_workdir(run, out, results=kept / "eval_results.json")
        log_every = json.loads((run / "config.json").read_text()).get("log_every_steps")
        minutes, resumes = (training_minutes(run / "metrics.jsonl", log_every)
                            if (run / "metrics.jsonl").is_file() else (None, 0))
        entry.update(environment_fields(run))
        entry.update({
            "setting": SETTINGS[args.setting],
            "results_dir": repository_relative(kept),
            "wall_time": wall_time_text(minutes, resumes) + args.wall_time_note,
            "evaluation": f"evaluated on {export_machine()} at export; {evaluation_note}",
            "url": kept_url(package_dir / "registry.json", name, entry["sha256"]),
        })
        registry.write_entry(package_dir / "registry.json", name, entry)
        print(f"{name}: {entry['size'] / 1e6:.2f} MB, {entry['checkpoint']}; "
              f"{entry['evaluation']}")
    return 0


def kept_url(registry_json: pathlib.Path, name: str, sha256: str) -> str:
    """The download URL registered for `name`, if its file is the same (same sha256): exporting
    a model again must not drop where it is hosted. A changed file needs a new upload: ""."""
    if not registry_json.is_file():
        return ""
    previous = json.loads(registry_json.read_text()).get("models", {}).get(name, {})
    return previous.get("url", "") if previous.get("sha256") == sha256 else ""


def repository_relative(path: pathlib.Path) -> str:
    """`path` relative to the repository (as the registry names results), else as given."""
    try:
        return path.resolve().relative_to(REPO).as_posix()
    except ValueError:
        return path.as_posix()


def export_machine() -> str:
    import platform

    import jax

    dev = jax.devices()[0]
    return (f"{getattr(dev, 'device_kind', dev.platform)} x{jax.device_count()}, "
            f"{os.cpu_count()} CPU cores ({platform.machine()}), jax {jax.__version__}")


if __name__ == "__main__":
    sys.exit(main())
