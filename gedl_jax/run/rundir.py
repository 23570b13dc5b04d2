"""A run's folder (the workdir): its config.json, its metrics log, and the checks that keep
a workdir to one run (resume only with the same training config; one folder all hosts see)."""

from __future__ import annotations

import json
import os
import pathlib
import secrets
import time
import zlib
from typing import Any

import jax
import ml_collections
import numpy as np

from gedl_jax import config as config_lib
from gedl_jax import files, methods
from gedl_jax.run import lock, numerics


class ConfigMismatchError(ValueError):
    pass


# What a run reads back or writes in place in its workdir, and so must not be a link planted
# there (its results are written whole, by `files.atomic_file`, which replaces a link):
# (name, what it holds, "file" or "folder"). The checkpoints' folders: `checkpointing`.
WRITTEN_IN_PLACE = (
    ("config.json", "config (read back to resume)", "file"),
    ("metrics.jsonl", "metrics log", "file"),
    ("tensorboard", "TensorBoard logs", "folder"),
    (numerics.AUTOTUNE_FOLDER, "XLA autotuning cache", "folder"),
)


def prepare(workdir: pathlib.Path, config) -> None:
    """Create the workdir (a folder), check all processes share it and that no name the run
    writes in place is a planted link, and save the config or refuse one that differs from the
    run already there."""
    if workdir.exists() and not workdir.is_dir():
        raise ValueError(f"--workdir={workdir} is a file, not a folder: give a folder "
                         f"(it is created if missing)")
    lock.claim(workdir)   # the lock of the run's folder, before anything is written there
    workdir.mkdir(parents=True, exist_ok=True)
    for name, what, kind in WRITTEN_IN_PLACE:
        files.refuse_link(workdir / name, what, kind)
    check_shared_workdir(workdir)
    check_or_write_config(config, workdir)


def config_fields(config) -> dict[str, Any]:
    """The config's fields as config.json holds them."""
    return json.loads(config.to_json_best_effort())


def check_or_write_config(config, workdir: pathlib.Path) -> None:
    """Save the config; refuse to resume a workdir trained with a different one."""
    path = workdir / "config.json"
    current = config_fields(config)
    if path.exists():
        try:
            previous = json.loads(path.read_text())
            if not isinstance(previous, dict):
                raise ValueError("not a JSON object")
        except (ValueError, UnicodeDecodeError) as e:
            raise ConfigMismatchError(
                f"{path} is not a readable config ({type(e).__name__}: {e}); it was left as it "
                f"is. Use a new --workdir, or restore that file.") from None
        if previous == current:   # the same run again: nothing to write
            return
        previous = config_lib.upgrade_saved(previous)   # old flat method settings
        unknown = sorted(set(previous) - set(current))
        if unknown:
            raise ConfigMismatchError(
                f"{workdir} holds a run written by another version of gedl-jax: resume it with "
                f"the version that wrote it, or use a new --workdir\n"
                f"  its config.json has fields this version does not know "
                f"({', '.join(unknown)})")
        # A field added since that run was written counts as unchanged at the value runs had
        # before it existed: LEGACY_DEFAULTS where the default changed with the field (init:
        # "torch"), else its default (new fields default to the earlier behaviour).
        defaults = {**config_fields(config_lib.default_config(config.dataset)),
                    **config_lib.LEGACY_DEFAULTS}
        previous = {k: previous.get(k, defaults.get(k)) for k in current}
        before, after = _with_settings(previous), _with_settings(current)
        safe = config_lib.RESUME_SAFE_FIELDS
        changed = sorted(k for k in set(before) | set(after)
                         if k not in safe and before.get(k) != after.get(k))
        if changed:
            details = ", ".join(f"{k}: {before.get(k)!r} -> {after.get(k)!r}"
                                for k in changed)
            if not has_checkpoint(workdir):
                if jax.process_index() == 0:
                    print(f"{workdir} holds no checkpoint yet: its config.json is replaced by "
                          f"this configuration ({details})", flush=True)
                _write_config(path, current)
                return
            raise ConfigMismatchError(
                f"{workdir} holds a run with a different configuration ({details}). Resume it "
                f"with the same config, or use a new --workdir.")
    _write_config(path, current)


def _with_settings(fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` with method_args as the method's settings of the run, every default written
    out: "" and the defaults' values given explicitly (an upgraded old config) compare equal."""
    view = ml_collections.ConfigDict({k: fields.get(k) for k in
                                      ("method", "method_args", "dataset", "num_classes")})
    try:
        settings = methods.method_class(view).resolved_settings(
            config_lib.json_object(view, "method_args"), int(view.num_classes),
            str(view.dataset))
    except (ValueError, TypeError):
        return fields
    return {**fields, "method_args": settings}


def _write_config(path: pathlib.Path, current: dict[str, Any]) -> None:
    if jax.process_index() == 0:
        files.write_text(path, json.dumps(current, indent=2, sort_keys=True))


def seed_runs(workdir: pathlib.Path) -> list[str]:
    """The `seed_<s>` folders under `workdir` that hold a run (its config.json): the runs of a
    `config.seeds` command, by seed."""
    found = [p.parent.name for p in pathlib.Path(workdir).glob("seed_*/config.json")]
    return sorted(found, key=lambda name: (len(name), name))


def has_checkpoint(workdir: pathlib.Path) -> bool:
    """Whether any run under `workdir` (itself, its seeds, an ensemble's members) saved a
    complete checkpoint, damaged ones set aside included: then its config is the run's."""
    for folder in workdir.rglob("checkpoints"):
        for kind in ("last", "best"):
            sub = folder / kind
            if sub.is_dir() and any(p.name.split(".")[0].isdigit() and
                                    "orbax-checkpoint-tmp" not in p.name
                                    for p in sub.iterdir()):
                return True
    return False


def check_shared_workdir(workdir: pathlib.Path) -> None:
    """With several processes, the workdir must be one folder all of them see (Orbax writes
    each checkpoint collectively, process 0 its metadata): process 0 writes a token, every
    process reads it back, and all of them fail together if any could not."""
    if jax.process_count() == 1:
        return
    from jax.experimental import multihost_utils

    token = workdir / ".shared_filesystem_check"
    if jax.process_index() == 0:
        files.write_text(token, f"{os.getpid()}-{time.time_ns()}")
    multihost_utils.sync_global_devices("gedl_jax: shared workdir token written")
    try:
        seen = zlib.crc32(token.read_bytes()) + 1
    except OSError:
        seen = 0
    everyone = np.asarray(multihost_utils.process_allgather(np.int64(seen))).reshape(-1)
    multihost_utils.sync_global_devices("gedl_jax: shared workdir token read")
    if jax.process_index() == 0:
        token.unlink(missing_ok=True)
    blind = [i for i, value in enumerate(everyone) if value != everyone[0] or value == 0]
    if blind:
        raise ValueError(
            f"--workdir={workdir} is not one folder shared by all {jax.process_count()} "
            f"processes: process(es) {blind} cannot see what process 0 wrote there. Put it on "
            f"a shared filesystem\n"
            f"  (NFS, Lustre, a mounted bucket), at the same path on every host: multi-host runs "
            f"write one workdir together")


class MetricsWriter:
    """JSONL + TensorBoard (tensorboardX: no TensorFlow needed), opened at the first record (a
    finished run started again writes no new event file), and the run's tracker where
    config.tracker names one (`tracking.MlflowRun`: each record is queued for it as written)."""

    def __init__(self, workdir: pathlib.Path, tracker=None):
        self.enabled = jax.process_index() == 0
        self.workdir, self.jsonl, self.tb = workdir, None, None
        self.tracker = tracker

    def _open(self) -> None:
        self.jsonl = files.open_append(self.workdir / "metrics.jsonl", "metrics log")
        try:
            from tensorboardX import SummaryWriter
        except ImportError:  # optional
            return
        folder = self.workdir / "tensorboard"
        files.refuse_link(folder, "TensorBoard logs", "folder")
        # The event file's name is otherwise the time to the second and the host name, which
        # anyone can plant links at ahead of time; tensorboardX opens it with plain open().
        self.tb = SummaryWriter(str(folder), filename_suffix=f".{secrets.token_hex(4)}")

    def write(self, step: int, split: str, scalars: dict[str, float]) -> None:
        """Append one record (step, split, time, scalars) to metrics.jsonl and TensorBoard,
        and queue it for the tracker."""
        if not self.enabled:
            return
        if self.jsonl is None:
            self._open()
        record = {"step": step, "split": split, "time": time.time(), **scalars}
        self.jsonl.write(json.dumps(record) + "\n")
        self.jsonl.flush()
        if self.tb is not None:
            for key, value in scalars.items():
                self.tb.add_scalar(f"{split}/{key}", value, step)
        if self.tracker is not None:
            self.tracker.log_record(record)

    def close(self) -> None:
        """Close metrics.jsonl and the TensorBoard writer (if a record opened them), and wait
        for the records queued for the tracker (which stays open for the results)."""
        if self.tracker is not None:
            self.tracker.flush()
        if self.jsonl is not None:
            self.jsonl.close()
            self.jsonl = None
        if self.tb is not None:
            self.tb.close()
            self.tb = None


def machine_fields(environment_record: dict[str, Any]) -> dict[str, Any]:
    """An environment.json record without what the record adds to the machine's fields."""
    return {k: v for k, v in environment_record.items()
            if k not in ("resumed_on", "recorded_at_resume_from_step")}


def machines(environment_record: dict[str, Any]) -> list[dict[str, Any]]:
    """The environments that trained a run, in order, from its environment.json (as
    `bin/reproduce.py` writes it): the first record (with its "recorded_at_resume_from_step", if
    any), then each machine in "resumed_on" that differs from the one before it. A resume on the
    same machine adds none: code before this function appended one whenever the first record had
    been made mid-run, since that record's extra field made it differ from every machine."""
    found = [{k: v for k, v in environment_record.items() if k != "resumed_on"}]
    for later in environment_record.get("resumed_on", []):
        if later != machine_fields(found[-1]):
            found.append(later)
    return found
