r"""Train an evidential classifier.

    python -m gedl_jax.train --config=configs/mnist.py [--workdir=DIR]


Config syntax (ml_collections):
  --config=configs/mnist.py                 GEDL on MNIST, the paper's settings
  --config=configs/mnist.py:edl             a variant (gedl, edl, iedl, redl, red, ablation_*)
  --config=configs/mnist.py:gedl,quick      a variant, shrunk to a few-minute run
  --config.c_w=0.7 --config.seeds=0,1,2     override any field (see gedl_jax/configuration.py)

Before any training, every input (ID splits, OOD sets) is obtained: files missing from the data
folder are downloaded and verified (config.download, config.data_mirror; $GEDL_OFFLINE=1 turns
downloads off), or all of them are named in one error. The default workdir is
runs/<dataset>_<variant>[_quick]. The run writes into the workdir: config.json,
checkpoints/{last,best}, metrics.jsonl, tensorboard/, and at the end eval_results.json,
eval_table.md and plots. Started again with the same command, a killed run continues from its
last checkpoint and ends with the same parameters as an uninterrupted run.

Exit status: 0 finished; 2 bad input (config, data, workdir; the message says what to fix);
75 preempted: SIGTERM or SIGINT arrived, the run saved a checkpoint at the next step boundary and
stopped (rerun the same command to resume; `gedl_jax.preemption.EXIT_PREEMPTED`); 1 anything else.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import pathlib
import sys
import time
import zlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gedl_jax import checkpointing, configuration, data, losses, models, parallel, preemption

# Fields that do not change the trained parameters: a resumed run may change them.
_NON_TRAINING_FIELDS = {"evaluate_at_end", "plots", "log_every_steps", "ood_datasets",
                        "extra_ood", "eval_batch_size", "seeds", "data_dir", "cache_dir",
                        "data_source", "tfds_data_dir", "checkpoint_every_steps", "distributed",
                        "download", "data_mirror", "run_name", "eval_examples",
                        "coordinator_address", "num_processes", "process_id"}


class NonFiniteLossError(RuntimeError):
    pass


class ConfigMismatchError(ValueError):
    pass


def _log(msg: str) -> None:
    if jax.process_index() == 0:
        print(msg, flush=True)


def _format_eta(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def _config_dict(config) -> dict[str, Any]:
    return json.loads(config.to_json_best_effort())


def _check_or_write_config(config, workdir: pathlib.Path) -> None:
    """Save the config; refuse to resume a workdir trained with a different one."""
    path = workdir / "config.json"
    current = _config_dict(config)
    if path.exists():
        try:
            previous = json.loads(path.read_text())
            if not isinstance(previous, dict):
                raise ValueError("not a JSON object")
        except (ValueError, UnicodeDecodeError) as e:
            raise ConfigMismatchError(
                f"{path} is not a readable config ({type(e).__name__}: {e}); it was left as it "
                f"is. Use a new --workdir, or restore that file.") from None
        unknown = sorted(set(previous) - set(current))
        if unknown:
            raise ConfigMismatchError(
                f"{workdir} holds a run written by another version of gedl-jax: its "
                f"config.json has fields this version does not know ({', '.join(unknown)}). "
                f"Resume it with the version that wrote it, or use a new --workdir.")
        # A field added since that run was written counts as unchanged at the value runs had
        # before it existed: LEGACY_DEFAULTS where the default changed with the field (init:
        # "torch"), else its default (new fields default to the earlier behaviour).
        defaults = {**_config_dict(configuration.build_config(config.dataset, config.variant)),
                    **configuration.LEGACY_DEFAULTS}
        previous = {k: previous.get(k, defaults.get(k)) for k in current}
        changed = sorted(k for k in set(previous) | set(current)
                         if k not in _NON_TRAINING_FIELDS and previous.get(k) != current.get(k))
        if changed:
            details = ", ".join(f"{k}: {previous.get(k)!r} -> {current.get(k)!r}"
                                for k in changed)
            raise ConfigMismatchError(
                f"{workdir} holds a run with a different configuration ({details}). Resume it "
                f"with the same config, or use a new --workdir.")
    if jax.process_index() == 0:
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(current, indent=2, sort_keys=True))
        tmp.replace(path)


def check_shared_workdir(workdir: pathlib.Path) -> None:
    """With several processes, the workdir must be one folder all of them see (Orbax writes
    each checkpoint collectively, process 0 its metadata): process 0 writes a token, every
    process reads it back, and all of them fail together if any could not."""
    if jax.process_count() == 1:
        return
    from jax.experimental import multihost_utils  # noqa: PLC0415

    token = workdir / ".shared_filesystem_check"
    if jax.process_index() == 0:
        token.write_text(f"{os.getpid()}-{time.time_ns()}")
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
            f"processes: process(es) {blind} cannot see the file process 0 wrote there. "
            f"Multi-host runs need a shared filesystem (NFS, Lustre, a mounted bucket) for the "
            f"workdir, at the same path on every host.")


class MetricsWriter:
    """JSONL + TensorBoard (tensorboardX: no TensorFlow needed)."""

    def __init__(self, workdir: pathlib.Path):
        self.enabled = jax.process_index() == 0
        if not self.enabled:
            return
        self.jsonl = open(workdir / "metrics.jsonl", "a")
        try:
            from tensorboardX import SummaryWriter
            self.tb = SummaryWriter(str(workdir / "tensorboard"))
        except ImportError:  # optional
            self.tb = None

    def write(self, step: int, split: str, scalars: dict[str, float]) -> None:
        if not self.enabled:
            return
        record = {"step": step, "split": split, "time": time.time(), **scalars}
        self.jsonl.write(json.dumps(record) + "\n")
        self.jsonl.flush()
        if self.tb is not None:
            for key, value in scalars.items():
                self.tb.add_scalar(f"{split}/{key}", value, step)

    def close(self) -> None:
        if self.enabled:
            self.jsonl.close()
            if self.tb is not None:
                self.tb.close()


def _label_frequencies(labels: np.ndarray, num_classes: int) -> tuple[float, ...]:
    counts = np.bincount(labels, minlength=num_classes).astype(np.float64)
    return tuple(float(x) for x in counts / counts.sum())


def _sources(config) -> dict[str, Any]:
    return dict(data_dir=config.data_dir or None, cache_dir=config.cache_dir or None,
                source=config.data_source, tfds_data_dir=config.tfds_data_dir or None)


def _split_seed(config, seed: int) -> int:
    return seed if config.split_seed < 0 else config.split_seed


def _seed_splits(config, official: data.Split, test: data.Split, seed: int
                 ) -> tuple[dict[str, data.Split], np.ndarray]:
    """Seed `seed`'s {"train", "validation", "test"} carved from the official training split,
    and the training examples' indices into it (the order the split lists them in)."""
    train_idx, val_idx = data.split_indices(len(official), config.val_fraction,
                                            _split_seed(config, seed))
    for field, idx, part in (("train_examples", train_idx, "training"),
                             ("val_examples", val_idx, "validation")):
        if config[field] > len(idx):
            raise ValueError(f"config.{field}={config[field]} exceeds the {len(idx)} examples "
                             f"of the {part} split of {config.dataset}; use at most "
                             f"{len(idx)}, or 0 for all")
    if config.train_examples:
        train_idx = train_idx[:config.train_examples]
    if config.val_examples:
        val_idx = val_idx[:config.val_examples]
    splits = {"train": official.take(train_idx, f"{config.dataset}/train"),
              "validation": official.take(val_idx, f"{config.dataset}/validation"),
              "test": test}
    return splits, train_idx


def obtain_inputs(config) -> None:
    """Pre-flight: make every split and OOD set of the run loadable before any work, i.e.
    downloaded and verified (config.download, config.data_mirror), or all missing files named in
    one error. Under jax.distributed only process 0 downloads; the others wait at a barrier and
    then verify the files as they load them."""
    wanted = [(config.dataset, "train"), (config.dataset, "test")] + [
        (name, "test") for name in configuration.parse_list(config.ood_datasets)
        if name in data.DATASETS]
    fetching = dict(download=config.get("download", "auto"),
                    mirror=config.get("data_mirror", "") or None)
    if jax.process_count() == 1:
        data.ensure_available(wanted, **_sources(config), **fetching)
        return
    from jax.experimental import multihost_utils  # noqa: PLC0415

    failure = None
    if jax.process_index() == 0:
        try:
            data.ensure_available(wanted, **_sources(config), **fetching)
        except data.DataError as e:  # reach the barrier first, so no process waits forever
            failure = e
    multihost_utils.sync_global_devices("gedl_jax: inputs obtained")
    if failure is not None:
        raise failure


def _load_official_and_ood(config) -> tuple[data.Split, data.Split, dict[str, data.Split]]:
    obtain_inputs(config)
    sources = dict(_sources(config), download="never")  # obtained above: no second fetch
    official = data.load_split(config.dataset, "train", **sources)
    test = data.load_split(config.dataset, "test", **sources)
    for split in (official, test):
        _check_labels_fit(config, split)
    test = test.subset(config.eval_examples)
    ood = {}
    for name in configuration.parse_list(config.ood_datasets) + configuration.parse_list(
            config.extra_ood):
        ood[name] = data.load_ood(name, **sources)
        _check_ood_shape(name, ood[name], official)
        ood[name] = ood[name].subset(config.eval_examples)
    return official, test, ood


def _check_labels_fit(config, split: data.Split) -> None:
    if len(split.labels) and int(split.labels.max()) >= config.num_classes:
        raise ValueError(f"config.num_classes={config.num_classes} but {split.name} has labels up "
                         f"to {int(split.labels.max())}: set config.num_classes to at least "
                         f"{int(split.labels.max()) + 1}")


def _check_ood_shape(name: str, ood: data.Split, train: data.Split) -> None:
    if ood.images.shape[1:] != train.images.shape[1:]:
        raise ValueError(f"OOD set {name!r} has images of shape {ood.images.shape[1:]}, but the "
                         f"model reads {train.images.shape[1:]} ({train.name}): an OOD set must "
                         f"have the in-distribution image size and channels")


def load_data(config) -> dict[str, Any]:
    """All splits and OOD sets, loaded (and checked) before any training starts.

    The train/validation split is the seeded protocol split (`data.split_indices`), shortened to
    `train_examples` / `val_examples` when those are set.
    """
    official, test, ood = _load_official_and_ood(config)
    splits, _ = _seed_splits(config, official, test, int(config.seed))
    return {"splits": splits, "ood": ood}


def normalization_stats(config, train: data.Split):
    if not config.normalize:
        return None, None
    mean, std = data.channel_stats(train)
    return tuple(float(x) for x in np.ravel(mean)), tuple(float(x) for x in np.ravel(std))


def build_models(config):
    dtype = jnp.bfloat16 if config.compute_dtype == "bfloat16" else jnp.float32
    init = config.get("init", configuration.LEGACY_DEFAULTS["init"])   # pre-`init` config.json
    train_model = models.build_model(config.model, config.num_classes, dtype=dtype,
                                     axis_name=parallel.AXIS, init=init)
    eval_model = models.build_model(config.model, config.num_classes, dtype=dtype,
                                    axis_name=None, init=init)
    return train_model, eval_model


def run_keys(seed: int) -> dict[str, jax.Array]:
    init, order, augment, dropout = jax.random.split(jax.random.PRNGKey(seed), 4)
    return {"init": init, "order": order, "augment": augment, "dropout": dropout}


@dataclasses.dataclass
class _SeedRun:
    """One seed's config, data and outputs, and its loop bookkeeping."""

    config: Any
    workdir: pathlib.Path
    loaded: dict[str, Any]
    ckpt: checkpointing.RunCheckpoints | None = None
    writer: MetricsWriter | None = None
    train_index: np.ndarray | None = None  # training examples' indices in the official split
    best_accuracy: float = -1.0
    best_step: int = -1

    @property
    def seed(self) -> int:
        return int(self.config.seed)

    @property
    def train(self) -> data.Split:
        return self.loaded["splits"]["train"]


def train_and_evaluate(config, workdir: str | pathlib.Path, *,
                       stop_after_steps: int | None = None) -> dict[str, Any]:
    """Train one seed into `workdir` (resuming if it holds a checkpoint), then evaluate.

    `stop_after_steps` ends the loop early as if the process had been killed after that many
    steps (tests of resumption); checkpoints written before that point stay.
    """
    workdir = pathlib.Path(workdir)
    configuration.validate_config(config, jax.device_count())
    run_ = _SeedRun(config=config, workdir=workdir, loaded=load_data(config))
    return _train_seeds([run_], vmapped=False, stop_after_steps=stop_after_steps)[0]


def train_and_evaluate_vmapped(config, workdir: str | pathlib.Path, seeds: list[int], *,
                               stop_after_steps: int | None = None) -> list[dict[str, Any]]:
    """Train `seeds` together in one program (`vmap` over a seed axis), into workdir/seed_<s>.

    Each seed directory ends up with what `train_and_evaluate` writes for that seed alone
    (config, checkpoints, logs, evaluation), and seed s follows the same data order,
    augmentation and dropout draws as its sequential run: the parameters agree to float32
    rounding (the batched convolutions may sum in another order), not bit for bit, which is why
    `vmap_seeds` is part of the recorded config. Killed and restarted, it resumes from the
    newest checkpoint step that every seed saved.
    """
    workdir = pathlib.Path(workdir)
    configuration.validate_config(config, jax.device_count())
    official, test, ood = _load_official_and_ood(config)
    runs = []
    for seed in seeds:
        seeded = _seed_config(config, seed)
        splits, train_index = _seed_splits(seeded, official, test, seed)
        runs.append(_SeedRun(config=seeded, workdir=workdir / f"seed_{seed}",
                             loaded={"splits": splits, "ood": ood}, train_index=train_index))
    return _train_seeds(runs, vmapped=True, stop_after_steps=stop_after_steps, pool=official)


def _seed_config(config, seed: int):
    seeded = config.copy_and_resolve_references()
    with seeded.unlocked():
        seeded.seed = seed
        seeded.seeds = ""
    return seeded


def _stack_on(mesh, trees: list) -> Any:
    return jax.jit(parallel.stack_states, out_shardings=parallel.replicated(mesh))(trees)


def _train_seeds(runs: list[_SeedRun], *, vmapped: bool, stop_after_steps: int | None,
                 pool: data.Split | None = None) -> list[dict[str, Any]]:
    """The training loop, for one seed (`vmapped=False`) or several trained together (then
    `pool` is the official training split the seeds' `train_index` point into)."""
    config = runs[0].config  # the fields that shape the program are the same for every seed
    mesh = parallel.make_mesh()
    num_devices = mesh.size
    for run_ in runs:
        if run_.workdir.exists() and not run_.workdir.is_dir():
            raise ValueError(f"--workdir={run_.workdir} is a file, not a folder: give a folder "
                             f"(it is created if missing)")
        run_.workdir.mkdir(parents=True, exist_ok=True)
        check_shared_workdir(run_.workdir)
        _check_or_write_config(run_.config, run_.workdir)

    num_train = len(runs[0].train.labels)
    steps_per_epoch = num_train // config.batch_size
    if steps_per_epoch == 0:
        raise ValueError(f"config.batch_size={config.batch_size} exceeds the {num_train} "
                         f"training examples")
    total_steps = steps_per_epoch * config.num_epochs
    # Identical for all seeds of a vmapped run (validate_config requires a shared split for
    # label-frequency base rates).
    base_rate = (_label_frequencies(runs[0].train.labels, config.num_classes)
                 if config.base_rate == "label_frequency" else None)
    spec = losses.LossSpec.from_config(config, base_rate=base_rate)
    norms = [normalization_stats(r.config, r.train) for r in runs]

    train_model, eval_model = build_models(config)
    tx = parallel.make_optimizer(config, total_steps)
    keys = [run_keys(r.seed) for r in runs]
    image_shape = runs[0].train.images.shape[1:]

    def init(key):
        return parallel.init_train_state(eval_model, tx, key, image_shape)

    replicated = parallel.replicated(mesh)
    settings = parallel.StepSettings(steps_per_epoch=steps_per_epoch,
                                     batch_size=config.batch_size, augment=config.augment,
                                     normalize_mean=norms[0][0], normalize_std=norms[0][1])
    if vmapped:
        state = jax.jit(jax.vmap(init), out_shardings=replicated)(
            jnp.stack([k["init"] for k in keys]))
        seed_state = jax.jit(parallel.unstack_state, static_argnums=1)
        multi_step = parallel.make_multi_seed_train_step(train_model, spec, tx, mesh, settings)
        images_dev = parallel.put_replicated(mesh, pool.images)
        labels_dev = parallel.put_replicated(mesh, pool.labels.astype(np.int32))
        train_idx_SxN = parallel.put_replicated(
            mesh, np.stack([r.train_index for r in runs]).astype(np.int32))
        order_keys_S = jnp.stack([k["order"] for k in keys])
        step_keys_S = {name: jnp.stack([k[name] for k in keys]) for name in ("augment",
                                                                             "dropout")}
        mean_S = None if norms[0][0] is None else jnp.asarray([n[0] for n in norms])
        std_S = None if norms[0][1] is None else jnp.asarray([n[1] for n in norms])

        @functools.partial(jax.jit, out_shardings=replicated)
        def epoch_order(epoch):
            perm_SxN = jax.vmap(lambda k: data.epoch_permutation(
                jax.random.fold_in(k, epoch), num_train))(order_keys_S)
            return jnp.take_along_axis(train_idx_SxN, perm_SxN, axis=1)

        def train_step(state, order):
            return multi_step(state, images_dev, labels_dev, order, step_keys_S, mean_S, std_S)
    else:
        state = jax.jit(init, out_shardings=replicated)(keys[0]["init"])

        def seed_state(state, index):
            del index
            return state
        single_step = parallel.make_train_step(train_model, spec, tx, mesh, settings, keys[0])
        images_dev = parallel.put_replicated(mesh, runs[0].train.images)
        labels_dev = parallel.put_replicated(mesh, runs[0].train.labels.astype(np.int32))
        epoch_order = jax.jit(lambda epoch: data.epoch_permutation(
            jax.random.fold_in(keys[0]["order"], epoch), num_train), out_shardings=replicated)

        def train_step(state, order):
            return single_step(state, images_dev, labels_dev, order)

    # One seed's slice of the state, as Orbax restores it.
    seed_abstract = checkpointing.abstract_like(
        jax.eval_shape(lambda s: seed_state(s, 0), state), replicated)
    for run_ in runs:
        run_.ckpt = checkpointing.RunCheckpoints(run_.workdir)
    common_steps = set.intersection(*(r.ckpt.last_steps() for r in runs))
    if common_steps:
        resume_step = max(common_steps)
        restored = []
        for run_ in runs:
            seed_restored, meta = _restore_for_resume(run_, seed_abstract, resume_step)
            run_.best_accuracy, run_.best_step = meta["best_val_accuracy"], meta["best_step"]
            restored.append(seed_restored)
        state = _stack_on(mesh, restored) if vmapped else restored[0]
        where = runs[0].workdir if len(runs) == 1 else runs[0].workdir.parent / "seed_*"
        _log(f"resumed from {where}/checkpoints/last at step {resume_step} "
             f"(epoch {resume_step // steps_per_epoch})")

    eval_steps: dict[Any, Callable] = {}

    def eval_step_for(norm) -> Callable:
        if norm not in eval_steps:
            eval_steps[norm] = parallel.make_eval_step(eval_model, spec, mesh, *norm)
        return eval_steps[norm]

    for run_ in runs:
        run_.writer = MetricsWriter(run_.workdir)
    step = int(jax.device_get(state.step).max()) if vmapped else int(state.step)
    seeds_text = (f"seeds {','.join(str(r.seed) for r in runs)} trained together (vmap), "
                  if vmapped else "")
    _log(f"{config.variant} on {config.dataset}: {seeds_text}{num_train} train / "
         f"{len(runs[0].loaded['splits']['validation'].labels)} val, {steps_per_epoch} "
         f"steps/epoch x {config.num_epochs} epochs, global batch {config.batch_size} on "
         f"{num_devices} {jax.devices()[0].platform} device(s)")

    def meta(run_: _SeedRun) -> dict[str, Any]:
        return {"best_val_accuracy": run_.best_accuracy, "best_step": run_.best_step,
                "epoch": step // steps_per_epoch, "variant": config.variant, "seed": run_.seed}

    def save_last() -> None:
        for i, run_ in enumerate(runs):
            run_.ckpt.save_last(step, seed_state(state, i), meta(run_))

    pending: list[tuple[int, dict]] = []
    window_start, window_steps = time.time(), 0
    images_per_step = config.batch_size * len(runs)

    def flush_metrics() -> dict[str, float] | None:
        """Fetch the pending step metrics, write each seed's averages; seeds' mean returned."""
        nonlocal pending
        if not pending:
            return None
        fetched = jax.device_get([m for _, m in pending])
        steps = [s for s, _ in pending]
        pending = []
        nonfinite = np.stack([np.atleast_1d(m["nonfinite"]) for m in fetched])  # steps x S
        if nonfinite.any():
            bad_steps, bad_seeds = np.nonzero(nonfinite)
            first, last = steps[bad_steps.min()], steps[bad_steps.max()]
            for run_ in runs:
                run_.ckpt.wait()
            seeds = sorted({runs[i].seed for i in bad_seeds})
            where = (f"{runs[0].workdir}/checkpoints" if len(runs) == 1
                     else f"{runs[0].workdir.parent}/seed_*/checkpoints")
            raise NonFiniteLossError(
                f"non-finite loss or gradient at step(s) {first}..{last} (epoch "
                f"{first // steps_per_epoch}, seed(s) {seeds}); the update was skipped and "
                f"training stopped. The last good checkpoint in {where} is intact. Try a lower "
                f"learning rate, config.grad_clip_norm, or config.compute_dtype='float32'.")
        per_seed = []
        for i, run_ in enumerate(runs):
            averaged = {k: float(np.mean([np.atleast_1d(m[k])[i] for m in fetched]))
                        for k in fetched[0] if k != "nonfinite"}
            run_.writer.write(steps[-1], "train", averaged)
            per_seed.append(averaged)
        return {k: float(np.mean([a[k] for a in per_seed])) for k in per_seed[0]}

    def validate(epoch: int) -> None:
        accuracies = []
        for i, run_ in enumerate(runs):
            validation = run_.loaded["splits"]["validation"]
            member = seed_state(state, i)
            alpha, _ = parallel.predict_dirichlet(
                eval_step_for(norms[i]), member.params, member.batch_stats, mesh, validation,
                config.eval_batch_size)
            accuracy = float(np.mean(np.argmax(alpha, -1) == validation.labels))
            run_.writer.write(step, "validation", {"accuracy": accuracy})
            improved = accuracy > run_.best_accuracy
            if improved:
                run_.best_accuracy, run_.best_step = accuracy, step
                run_.ckpt.save_best(step, member, meta(run_))
            accuracies.append((accuracy, improved, run_.best_accuracy))
        if len(runs) == 1:
            accuracy, improved, best = accuracies[0]
            _log(f"epoch {epoch + 1}: validation accuracy {accuracy:.4f}"
                 f"{' (best)' if improved else f' (best {best:.4f})'}")
        else:
            listed = " ".join(f"{r.seed}:{a:.4f}{'*' if imp else ''}"
                              for r, (a, imp, _) in zip(runs, accuracies))
            _log(f"epoch {epoch + 1}: validation accuracy per seed {listed} (* = best so far)")

    stopped_early = preempted = False
    try:
        while step < total_steps:
            if stop_after_steps is not None and step >= stop_after_steps:
                stopped_early = True
                break
            epoch = step // steps_per_epoch
            order = epoch_order(epoch)
            epoch_end = (epoch + 1) * steps_per_epoch
            while step < epoch_end:
                state, metrics = train_step(state, order)
                step += 1
                window_steps += 1
                pending.append((step, metrics))
                if step % config.log_every_steps == 0 or step == epoch_end:
                    averaged = flush_metrics()
                    now = time.time()
                    rate = window_steps * images_per_step / max(now - window_start, 1e-9)
                    window_start, window_steps = now, 0
                    eta = (total_steps - step) * images_per_step / rate
                    _log(f"epoch {epoch + 1}/{config.num_epochs} step {step}/{total_steps} "
                         f"loss {averaged['loss']:.4f} acc {averaged['accuracy']:.4f} "
                         f"kl_w {averaged['kl_weight']:.3f} "
                         f"W {averaged['mean_prior_strength']:.3f} "
                         f"S {averaged['mean_strength']:.1f} | {rate:,.0f} img/s | "
                         f"ETA {_format_eta(eta)}")
                if config.checkpoint_every_steps and step % config.checkpoint_every_steps == 0 \
                        and step != epoch_end:
                    flush_metrics()
                    save_last()
                # Called after every step on every process (JAX's multi-host sync point needs
                # that). At an epoch end the stop waits for validation and the epoch's
                # checkpoint below, so a resumed run never skips a validation.
                preempted = preemption.should_stop(step)
                if preempted and step != epoch_end:
                    _stop_for_preemption(flush_metrics, save_last, runs, step)
                if stop_after_steps is not None and step >= stop_after_steps:
                    stopped_early = True
                    break
            if stopped_early:
                break
            flush_metrics()
            if (epoch + 1) % config.eval_every_epochs == 0 or step == total_steps:
                validate(epoch)
            save_last()
            if preempted:
                _stop_for_preemption(flush_metrics, save_last, runs, step)
    finally:
        for run_ in runs:
            run_.ckpt.wait()
            run_.writer.close()

    summaries = []
    for i, run_ in enumerate(runs):
        summary = {"workdir": str(run_.workdir), "steps": step, "seed": run_.seed,
                   "best_val_accuracy": run_.best_accuracy, "best_step": run_.best_step,
                   "state": seed_state(state, i)}
        if not stopped_early and config.evaluate_at_end:
            from gedl_jax import evaluate  # noqa: PLC0415 (keeps matplotlib out of the imports)

            best_state, _ = run_.ckpt.restore_best(seed_abstract)
            summary["evaluation"] = evaluate.evaluate_and_write(
                run_.config, best_state.params, best_state.batch_stats, run_.workdir,
                loaded=run_.loaded, eval_model=eval_model, mesh=mesh)
        run_.ckpt.close()
        summaries.append(summary)
    return summaries


def _restore_for_resume(run_: _SeedRun, abstract_state, step: int):
    """The `last` checkpoint at `step`, or a clear error if it does not fit this program (a
    workdir from another version of gedl-jax, or a damaged checkpoint). Nothing is deleted."""
    try:
        return run_.ckpt.restore_last(abstract_state, step)
    except (ValueError, KeyError, TypeError, FileNotFoundError, OSError) as e:
        raise ConfigMismatchError(
            f"cannot resume from {run_.workdir}/checkpoints/last/{step}: it does not match the "
            f"train state of this version of gedl-jax, or it is damaged ({type(e).__name__}: "
            f"{str(e)[:300]}). The workdir was left as it is; use a new --workdir, or the "
            f"version that wrote it.") from None


def _stop_for_preemption(flush_metrics: Callable, save_last: Callable, runs: list[_SeedRun],
                         step: int) -> None:
    """Write the pending metrics and the `last` checkpoint of every seed, wait until it is on
    disk, and raise `preemption.Preempted` (the CLI exits with `EXIT_PREEMPTED`)."""
    flush_metrics()
    save_last()
    for run_ in runs:
        run_.ckpt.wait()
    where = runs[0].workdir if len(runs) == 1 else runs[0].workdir.parent / "seed_*"
    raise preemption.Preempted(step, str(where))


def run(config, workdir: str | pathlib.Path) -> list[dict[str, Any]]:
    """One run per seed of `config.seeds` (workdir/seed_<s>), or a single run in `workdir`.

    With `config.vmap_seeds`, the seeds train together in one program (see
    `train_and_evaluate_vmapped`); otherwise one after another.
    """
    seeds = configuration.parse_seeds(config)
    workdir = pathlib.Path(workdir)
    if not str(config.seeds).strip():
        return [train_and_evaluate(config, workdir)]
    if config.vmap_seeds and len(seeds) > 1:
        _log(f"=== seeds {','.join(map(str, seeds))} (vmap) ===")
        results = train_and_evaluate_vmapped(config, workdir, seeds)
    else:
        results = []
        for seed in seeds:
            _log(f"=== seed {seed} ===")
            results.append(train_and_evaluate(_seed_config(config, seed),
                                              workdir / f"seed_{seed}"))
    evaluations = [r["evaluation"] for r in results if "evaluation" in r]
    if len(evaluations) > 1 and jax.process_index() == 0:
        from gedl_jax import evaluation  # noqa: PLC0415

        table = evaluation.results_table(evaluations, fmt="markdown")
        (workdir / "eval_table.md").write_text(table + "\n")
        _log(f"\n=== {len(evaluations)} seeds, mean ± std ===\n{table}")
    return results


def initialize_distributed(config) -> None:
    """`jax.distributed.initialize` from the config; empty fields are left to JAX, which reads
    JAX_COORDINATOR_ADDRESS and detects SLURM, Open MPI and TPU pods."""
    kwargs: dict[str, Any] = {}
    if config.coordinator_address:
        kwargs["coordinator_address"] = config.coordinator_address
    if config.num_processes:
        kwargs["num_processes"] = int(config.num_processes)
        kwargs["process_id"] = int(config.process_id)
    try:
        jax.distributed.initialize(**kwargs)
    except ValueError as e:  # JAX: "coordinator_address should be defined." and the like
        raise ValueError(f"config.distributed=True but {e} Outside SLURM/Open MPI/TPU, give "
                         f"--config.coordinator_address=HOST:PORT --config.num_processes=N "
                         f"--config.process_id=I on every host (docs/multihost.md)") from None
    _log(f"jax.distributed: process {jax.process_index()} of {jax.process_count()}, "
         f"{jax.local_device_count()} local / {jax.device_count()} global devices")


def main(argv=None) -> int:
    from absl import app, flags  # noqa: PLC0415
    from ml_collections import config_flags  # noqa: PLC0415

    flags_ = flags.FLAGS
    config_flags.DEFINE_config_file("config", None, "Experiment config file (see configs/).",
                                    lock_config=True)
    flags.DEFINE_string("workdir", None, "Output folder (checkpoints, logs, results); default "
                        "runs/<dataset>_<variant>[_quick].")
    flags.mark_flags_as_required(["config"])

    def _main(_argv):
        from absl import logging as absl_logging  # noqa: PLC0415
        absl_logging.set_verbosity(absl_logging.WARNING)  # Orbax logs every save at INFO
        if len(_argv) > 1:
            raise app.UsageError(f"unexpected arguments: {_argv[1:]}")
        config = flags_.config
        try:
            if config.distributed:
                configuration.validate_config(config)  # before waiting for the other hosts
                initialize_distributed(config)
            workdir = flags_.workdir
            if not workdir:
                workdir = str(pathlib.Path("runs") / config.run_name)
                _log(f"workdir: {workdir} (the default for this config; --workdir=DIR to choose)")
            preemption.install()
            run(config, workdir)
        except preemption.Preempted as e:
            print(f"{e}", file=sys.stderr, flush=True)
            return preemption.EXIT_PREEMPTED
        except (ValueError, ConfigMismatchError, NonFiniteLossError, data.DataError) as e:
            print(f"error: {e}", file=sys.stderr, flush=True)
            return 2
        return 0

    try:
        app.run(_main, argv=argv)
    except SystemExit as e:
        return int(e.code or 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
