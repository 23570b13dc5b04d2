#!/usr/bin/env python
"""The README.md of a `tools/gpu_check.sh` results folder, made from the files the check wrote.

    python tools/gpu_report.py docs/results/gpu/nvidia_h200

Reads environment.json, wall_times.json, tests.log (pytest's closing line), benchmark*.json,
vs_torch/vs_torch.md, train.log and train_metrics.jsonl / train_eval_results.json where present,
replaces machine paths in them (`scrub`: the checkout's root, Python's site-packages and
interpreter, temporary folders), and writes README.md beside them: the machine and versions,
each part's wall time and exit status, the test counts, the step table, what deterministic
kernels cost, our step beside PyTorch's, and the main job's (`bin/train`) training time against
its floor (the steps times the benchmarked time of one step in the device loop) and its
progress lines' ETAs against the training time then left, and for it and the vmapped seeds the
epochs' durations by the checkpoints saved at the epoch end before each (train.log, seeds.log).
Every number is read from those files; a part that did not run is named as not run.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import statistics
import sys
import tempfile

from gedl_jax import files
from gedl_jax.run.progress import format_eta


REPO = pathlib.Path(__file__).resolve().parents[1]
# Machine-specific absolute paths in the logs, and the names that replace them (`scrub`): the
# results say what ran, not where on one machine it ran.
MACHINE_PATHS = (
    (re.compile(r"(?<![\w.])/(?:[\w.+-]+/)*site-packages/"), "SITE_PACKAGES/"),
    (re.compile(r"(?<![\w.])/(?:[\w.+-]+/)+python[\d.]*(?![\w/])"), "PYTHON"),
    (re.compile(r"(?<![\w.])" + re.escape(tempfile.gettempdir()) + r"/[\w.-]+"), "TMP"),
)


def scrub(folder: pathlib.Path) -> int:
    """Replace machine paths in the folder's logs and records, in place: the checkout's root by
    nothing (paths become relative to it; the root alone by "."), then `MACHINE_PATHS`; NUL
    bytes are dropped. Returns
    the files changed."""
    changed = 0
    for path in sorted(folder.rglob("*")):
        if path.suffix not in (".log", ".json", ".jsonl", ".md") or path.name == "README.md":
            continue
        text = path.read_text(errors="replace")
        # and NUL bytes: a log whose writer was killed mid-write can hold a run of them
        new = text.replace(f"{REPO}/", "").replace("\0", "")
        # the root alone (pytest's "rootdir: <root>"): "."
        new = re.sub(re.escape(str(REPO)) + r"(?![\w./-])", ".", new)
        for pattern, name in MACHINE_PATHS:
            new = pattern.sub(name, new)
        if new != text:
            files.write_text(path, new)   # a new file, never through a link
            changed += 1
    return changed


def _json(path: pathlib.Path):
    return json.loads(path.read_text()) if path.exists() else None


def _pytest_summary(log: pathlib.Path) -> str | None:
    """pytest's closing line; for a run stopped before it (a time limit), the counts of its
    progress characters so far (names of failures are only in the closing summary)."""
    if not log.exists():
        return None
    text = log.read_text().splitlines()
    lines = [line.strip("= ") for line in text if re.search(r"\d+ (passed|failed|error)", line)]
    failed = sorted({m.group(1) for line in text
                     for m in [re.search(r"(?:FAILED|ERROR) (tests/\S+)", line)] if m})
    named = f"; failed: {', '.join(failed)}" if failed else ""
    if lines:
        return lines[-1] + named
    progress = "".join(line.split(" [")[0] for line in text
                       if line and set(line.split(" [")[0]) <= set(".FEsx"))
    verbose = [m.group(1) for line in text   # -v: "[gw0] [ 5%] PASSED tests/..."
               for m in [re.search(r"\] (PASSED|FAILED|ERROR|SKIPPED) ", line)] if m]
    if not progress and not verbose:
        return None
    counts = {name: progress.count(char) + verbose.count(word) for char, word, name in
              ((".", "PASSED", "passed"), ("F", "FAILED", "failed"), ("E", "ERROR", "errors"),
               ("s", "SKIPPED", "skipped"))}
    return ("stopped before its closing line (the part's time limit): so far " +
            ", ".join(f"{n} {name}" for name, n in counts.items() if n) +
            (named or "; which tests failed is not in the log"))


def _step_row(bench: dict | None, model: str, dtype: str = "float32",
              batch: int = 128) -> dict | None:
    for row in (bench or {}).get("results", []):
        if row["model"] == model and row["dtype"] == dtype and row["batch"] == batch \
                and row.get("seeds", 1) == 1 and row.get("precision", "default") == "default":
            return row
    return None


def _training(folder: pathlib.Path, bench: dict | None) -> list[str]:
    metrics = folder / "train_metrics.jsonl"
    if not metrics.exists():
        return ["The main job (`bin/train`, GEDL on MNIST) did not run."]
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    train = [r for r in records if r["split"] == "train"]
    lines = []
    if len(train) >= 2:
        steps = train[-1]["step"] - train[0]["step"]
        seconds = train[-1]["time"] - train[0]["time"]
        lines.append(f"Training loop: steps {train[0]['step']}-{train[-1]['step']} took "
                     f"{seconds:.1f} s ({steps * 128 / seconds:,.0f} img/s; from the first to "
                     f"the last train record of metrics.jsonl, so compilation and the final "
                     f"evaluation are not in it, every epoch's validation and checkpoint are).")
        step = _step_row(bench, "convnet")
        if step:
            floor = steps * step["step_ms"] / 1e3
            lines.append(f"Its floor, {steps} steps x {step['step_ms']:.3f} ms (the benchmarked "
                         f"ConvNet step in the device loop): {floor:.1f} s; the loop took "
                         f"**{seconds / floor:.2f}x** the floor.")
        log = folder / "train.log"
        lines += _epoch_notes(records, log)
        etas = eta_against_time_left(records, log.read_text()) if log.exists() else None
        if etas:
            lines.append(etas)
    walls = _json(folder / "wall_times.json") or {}
    if "train" in walls:
        lines.append(f"Whole command (start-up, data, compilation, training, evaluation): "
                     f"{walls['train']['seconds']} s.")
    results = _json(folder / "train_eval_results.json")
    if results:
        ood = ", ".join(f"{name} AUPR MP {100 * e['detection']['mp']['aupr_in']:.2f} / UM "
                        f"{100 * e['detection']['um']['aupr_in']:.2f}"
                        for name, e in results.get("ood", {}).items()
                        if "um" in e.get("detection", {}))
        lines.append(f"Its result: test accuracy {100 * results['id']['accuracy']:.2f} %"
                     f"{'; ' + ood if ood else ''}.")
    return lines


def _epoch_notes(records: list[dict], log: pathlib.Path) -> list[str]:
    """What the epoch ends cost (`epoch_end_cost`) and the epochs between checkpoint saves
    (`epochs_by_saves`, from the run's log when it was kept): the lines that exist."""
    notes = [epoch_end_cost(records),
             epochs_by_saves(records, log.read_text()) if log.exists() else None]
    return [note for note in notes if note]


def epoch_end_cost(records: list[dict]) -> str | None:
    """Where a run's time went, from its metrics.jsonl records' times (the times the host
    fetched each record, so single intervals jitter; medians): the ms a step inside an epoch,
    and the ms more across an epoch end (from the epoch's last train record to the next one,
    less the steps between them at the in-epoch rate). None without two epochs' records."""
    train = [r for r in records if r["split"] == "train"]
    ends = {r["step"] for r in records if r["split"] == "validation"}
    inside, across = [], []
    for a, b in zip(train, train[1:]):
        (across if a["step"] in ends else inside).append(a | {"next": b})
    if not inside or not across:
        return None
    per_step = statistics.median((r["next"]["time"] - r["time"]) / (r["next"]["step"] - r["step"])
                                 for r in inside)
    extra = statistics.median(r["next"]["time"] - r["time"]
                              - (r["next"]["step"] - r["step"]) * per_step for r in across)
    return (f"Inside an epoch, {1e3 * per_step:.3f} ms a step; across an epoch end, "
            f"{1e3 * extra:.0f} ms more (medians over {len(inside)} intervals and "
            f"{len(across)} epoch ends of the train records' times).")


# A progress line of the training log (gedl_jax.run.training): "epoch 1/200 step 100/75000 loss
# ... | 4,307 img/s | ETA 0:37:05".
_PROGRESS_LINE = re.compile(r"^epoch \d+/\d+ step (\d+)/(\d+) .*\| ETA (\d+):(\d\d):(\d\d)$")


def eta_against_time_left(records: list[dict], log: str) -> str | None:
    """The ETAs the progress lines printed against the training time then left (the last train
    record's time less the time of the line's record, both taken when the host fetched them):
    the first three lines, the first line after the first validation, and the first lines at
    10 % and 50 % of the steps. None without two such lines."""
    times = {r["step"]: r["time"] for r in records if r["split"] == "train"}
    validations = sorted(r["step"] for r in records if r["split"] == "validation")
    etas, total = {}, None
    for line in log.splitlines():
        match = _PROGRESS_LINE.match(line)
        if match and int(match[1]) in times:
            hours, minutes, seconds = (int(g) for g in match.group(3, 4, 5))
            etas[int(match[1])], total = 3600 * hours + 60 * minutes + seconds, int(match[2])
    last = max(times, default=0)
    steps = sorted(s for s in etas if s < last)
    if len(steps) < 2:
        return None
    picks = set(steps[:3])
    for after in ([validations[0]] if validations else []) + [total // 10, total // 2]:
        picks.update(next(([s] for s in steps if s > after), []))
    shown = "; ".join(f"step {s}: {format_eta(etas[s])} for {times[last] - times[s]:.1f} s"
                      for s in sorted(picks))
    return (f"ETAs printed against the training time then left (to the last train record): "
            f"{shown}.")


# A validation line of the training log: one seed's ("epoch 3: validation accuracy 0.9899
# (best)") or several seeds' ("... per seed 0:0.9899* 1:0.9850 (* = best so far)").
_VALIDATION_LINE = re.compile(r"^epoch (\d+): validation accuracy (per seed )?(.*)$")
# The epoch ends that saved, with `config.checkpoint_interval_seconds` > 0 (gedl_jax.run.training)
_CHECKPOINT_LINE = re.compile(r"^epoch (\d+): checkpoints saving in \S+: last \(step \d+\)"
                              r"(?: of (\d+) seeds)?(, best(?: of (\d+) seeds?| \(step \d+\)))?$")


def saves_per_epoch_end(log: str) -> list[int]:
    """The checkpoints each validated epoch end of a training log saved, in order. A log with
    checkpoint lines (saves at most every `checkpoint_interval_seconds`): what the line of the
    same epoch names (every seed's `last`, and the `best` states kept since the save before),
    0 where there is none. An older log (a save at every epoch end): every seed's `last`, and
    `best` for each seed whose validation accuracy improved."""
    lines = [line.strip() for line in log.splitlines()]
    rounds = {}
    for line in lines:
        if match := _CHECKPOINT_LINE.match(line):
            best = int(match.group(4) or 1) if match.group(3) else 0
            rounds[int(match.group(1))] = int(match.group(2) or 1) + best
    saves = []
    for line in lines:
        match = _VALIDATION_LINE.match(line)
        if not match:
            continue
        if rounds:
            saves.append(rounds.get(int(match.group(1)), 0))
        elif match.group(2):   # several seeds: "<seed>:<accuracy>" and "*" where improved
            entries = re.findall(r"\b\d+:[\d.]+(\*?)", match.group(3))
            saves.append(len(entries) + sum(1 for star in entries if star))
        else:
            saves.append(1 + ("(best)" in match.group(3)))
    return saves


def epochs_by_saves(records: list[dict], log: str) -> str | None:
    """Each epoch's duration (from one validation record's time to the next) grouped by the
    checkpoints saved at the epoch end before it (`saves_per_epoch_end`; off the CPU their
    writing overlaps that epoch): medians per group. None without two validations, or when the
    log's validation lines do not match the records."""
    times = [r["time"] for r in records if r["split"] == "validation"]
    saves = saves_per_epoch_end(log)
    if len(times) < 2 or len(saves) != len(times):
        return None
    groups: dict[int, list[float]] = {}
    for count, start, end in zip(saves, times, times[1:]):
        groups.setdefault(count, []).append(end - start)
    listed = "; ".join(f"{count} checkpoint{'s' * (count != 1)}: {statistics.median(d):.3f} s "
                       f"({len(d)} epoch{'s' * (len(d) != 1)})"
                       for count, d in sorted(groups.items()))
    return (f"Epoch durations by the checkpoints saved at the epoch end before each (medians, "
            f"from one validation record to the next): {listed}.")


def _seeds(folder: pathlib.Path) -> list[str]:
    """The vmapped run's training time against its floor (steps x the vmapped step)."""
    bench = _json(folder / "benchmark_seeds.json")
    config = _json(folder / "seeds_config.json") or {}
    path = folder / "seeds_metrics.jsonl"
    if not path.exists():
        return ["Not run."]
    records = [json.loads(line) for line in path.read_text().splitlines()]
    train = [r for r in records if r.get("split") == "train"]
    if len(train) < 2:
        return ["Too few metrics records."]
    steps = train[-1]["step"] - train[0]["step"]
    seconds = train[-1]["time"] - train[0]["time"]
    row = next((r for r in (bench or {}).get("results", []) if r.get("seeds", 1) > 1), None)
    seeds = f"{row['seeds']} seeds" if row else "the seeds"
    lines = [f"{config.get('num_epochs', '?')} epochs, {seeds} in one program: steps "
             f"{train[0]['step']}-{train[-1]['step']} took {seconds:.1f} s "
             f"(from the first to the last train record of seed 0's metrics.jsonl)."]
    if row:
        floor = steps * row["step_ms"] / 1e3
        lines.append(f"Its floor, {steps} steps x {row['step_ms']:.3f} ms (the benchmarked "
                     f"{row['seeds']}-seed step): {floor:.1f} s; the run took "
                     f"**{seconds / floor:.2f}x** the floor.")
    return lines + _epoch_notes(records, folder / "seeds.log")


def _resume(folder: pathlib.Path) -> list[str]:
    """studies/resume_check.py's verdicts, one line per set of XLA flags."""
    lines = []
    for name, flags in (("resume", "the trainer's flags (config.deterministic)"),
                        ("resume_deterministic_ops", "`--xla_gpu_deterministic_ops=true`")):
        result = _json(folder / name / "resume_check.json")
        log = folder / f"{name}.log"
        if result is None and log.exists():
            # the part's own log keeps the verdict line when its folder did not come back whole
            said = [line for line in log.read_text().splitlines()
                    if line.startswith("resume_check: ")]
            lines.append(f"- {flags}: no resume_check.json; the log's last verdict: "
                         f"\"{said[-1].removeprefix('resume_check: ')}\"" if said else
                         f"- {flags}: no resume_check.json, and no verdict in {log.name}")
            continue
        if result is None:
            continue
        if "error" in result:
            lines.append(f"- {flags}: the check failed: {result['error']}")
            continue
        verdict = ("**identical** to the uninterrupted run, bit for bit" if result["identical"]
                   else f"**different**: {len(result['leaves_differing'])} of "
                        f"{result['leaves']} leaves, largest difference "
                        f"{result['largest_difference']:.3g}")
        lines.append(f"- {flags}: stopped by SIGTERM at step {result['stopped_at_step']} of "
                     f"{result['steps'][0]} ({result['config']}, {result['epochs']} epochs), "
                     f"resumed: {verdict}.")
    return lines or ["Not run."]


def report(folder: pathlib.Path) -> str:
    env = _json(folder / "environment.json") or {}
    walls = _json(folder / "wall_times.json") or {}
    bench = _json(folder / "benchmark.json")
    fast = _json(folder / "benchmark_nondeterministic.json")
    no_autotune = _json(folder / "benchmark_deterministic_ops.json")
    out = [f"# gpu_check on {env.get('device', '?')}", "",
           f"`bash tools/gpu_check.sh` at commit {env.get('commit', '?')}: jax {env.get('jax')}, "
           f"flax {env.get('flax')}, Python {env.get('python')}, {env.get('cpu_count')} CPU "
           f"cores. Made by `tools/gpu_report.py` from the files in this folder.", "",
           "| part | wall time s | exit status |", "|---|---:|---:|"]
    out += [f"| {name} | {w['seconds']} | {w['exit_status']} |" for name, w in walls.items()]
    out += ["", "## Tests", "", f"pytest: {_pytest_summary(folder / 'tests.log') or 'not run'}"]
    if (folder / "test_failures.log").exists():
        out += ["", "Each failure's traceback: [`test_failures.log`](test_failures.log)."]
    out += ["", "## Train step", ""]
    table = folder / "benchmark.md"
    out += [table.read_text().strip()] if table.exists() else ["Not run."]
    if bench and fast:
        out += ["", "What deterministic kernels cost (float32, the same steps in other processes: "
                "XLA's fastest kernels, and `--xla_gpu_deterministic_ops`, which also turns "
                "autotuning off):", "",
                "| model | deterministic (the trainer's flags) img/s | without autotuning img/s "
                "| fastest img/s | cost of the trainer's flags |",
                "|---|---:|---:|---:|---:|"]
        for row in fast["results"]:
            det = _step_row(bench, row["model"], row["dtype"], row["batch"])
            ops = _step_row(no_autotune, row["model"], row["dtype"], row["batch"]) \
                if no_autotune else None
            if det:
                cost = 1 - det["images_per_s"] / row["images_per_s"]
                ops_rate = f"{ops['images_per_s']:,.0f}" if ops else "not measured"
                out.append(f"| {row['model']} | {det['images_per_s']:,.0f} | {ops_rate} | "
                           f"{row['images_per_s']:,.0f} | {100 * cost:.1f} % |")
    if bench and bench.get("loop"):
        loop = bench["loop"]
        ratio = (f"{loop['loop_over_step_time']:.2f}x the bare step's time per image"
                 if "loop_over_step_time" in loop else "no batch-128 ConvNet step to compare")
        out += ["", f"Training loop ({loop['loop_epochs']} epoch(s) of the main job's "
                f"program, {loop['loop_steps']} steps"
                f"{', timed over its ' + loop['loop_window'] if 'loop_window' in loop else ''}): "
                f"{loop['loop_images_per_s']:,.0f} img/s, {ratio}."]
    out += ["", "## Five seeds together (vmap_seeds)", "", *_seeds(folder)]
    out += ["", "## Resume", "", *_resume(folder)]
    vs = folder / "vs_torch" / "vs_torch.md"
    out += ["", "## Beside PyTorch", "", vs.read_text().strip() if vs.exists() else "Not run."]
    config = _json(folder / "train_config.json") or {}
    epochs = f"; this run: {config['num_epochs']} epochs" if "num_epochs" in config else ""
    out += ["", f"## The main job, `bin/train` (GEDL on MNIST{epochs})", "",
            *_training(folder, bench)]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python tools/gpu_report.py", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results_folder", type=pathlib.Path,
                        help="the folder tools/gpu_check.sh wrote (--out); its README.md is "
                             "written there and its files' machine paths replaced")
    folder = parser.parse_args(argv).results_folder
    if not folder.is_dir():
        parser.error(f"{folder} is not a folder: give the one tools/gpu_check.sh wrote")
    scrub(folder)
    files.write_text(folder / "README.md", report(folder))
    print(f"gpu_report: wrote {folder / 'README.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
