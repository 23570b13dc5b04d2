r"""Train an evidential classifier.

    python -m gedl_jax.train --config=configs/mnist.py --workdir=DIR


Config syntax (ml_collections):
  --config=configs/mnist.py                 GEDL on MNIST, the paper's settings
  --config=configs/mnist.py:edl             a variant (gedl, edl, iedl, redl, red, ablation_*)
  --config=configs/mnist.py:gedl,quick      a variant, shrunk to a few-minute run
  --config.c_w=0.7 --config.seeds=0,1,2     override any field (see gedl_jax/configuration.py)

The run writes into the workdir: config.json, checkpoints/{last,best}, metrics.jsonl,
tensorboard/, and at the end eval_results.json, eval_table.md and plots. Started again with the
same command, a killed run continues from its last checkpoint and ends with the same parameters
as an uninterrupted run.
"""

from __future__ import annotations

import json
import math
import pathlib
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gedl_jax import checkpointing, configuration, data, losses, models, parallel

# Fields that do not change the trained parameters: a resumed run may change them.
_NON_TRAINING_FIELDS = {"evaluate_at_end", "plots", "log_every_steps", "ood_datasets",
                        "extra_ood", "eval_batch_size", "seeds", "data_dir", "cache_dir",
                        "data_source", "tfds_data_dir", "checkpoint_every_steps", "distributed"}


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
        previous = json.loads(path.read_text())
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


def load_data(config) -> dict[str, Any]:
    """All splits and OOD sets, loaded (and checked) before any training starts."""
    sources = dict(data_dir=config.data_dir or None, cache_dir=config.cache_dir or None,
                   source=config.data_source, tfds_data_dir=config.tfds_data_dir or None)
    split_seed = config.seed if config.split_seed < 0 else config.split_seed
    splits = data.load_train_val_test(config.dataset, seed=split_seed,
                                      val_fraction=config.val_fraction, **sources)
    for key, limit in (("train", config.train_examples), ("validation", config.val_examples)):
        if limit:
            split = splits[key]
            n = min(limit, len(split.labels))
            splits[key] = data.Split(images=split.images[:n], labels=split.labels[:n],
                                     name=split.name)
    ood = {}
    for name in configuration.parse_list(config.ood_datasets) + configuration.parse_list(
            config.extra_ood):
        ood[name] = data.load_ood(name, **sources)
    return {"splits": splits, "ood": ood}


def normalization_stats(config, train: data.Split):
    if not config.normalize:
        return None, None
    mean, std = data.channel_stats(train)
    return tuple(float(x) for x in np.ravel(mean)), tuple(float(x) for x in np.ravel(std))


def build_models(config):
    dtype = jnp.bfloat16 if config.compute_dtype == "bfloat16" else jnp.float32
    train_model = models.build_model(config.model, config.num_classes, dtype=dtype,
                                     axis_name=parallel.AXIS)
    eval_model = models.build_model(config.model, config.num_classes, dtype=dtype,
                                    axis_name=None)
    return train_model, eval_model


def run_keys(seed: int) -> dict[str, jax.Array]:
    init, order, augment, dropout = jax.random.split(jax.random.PRNGKey(seed), 4)
    return {"init": init, "order": order, "augment": augment, "dropout": dropout}


def train_and_evaluate(config, workdir: str | pathlib.Path, *,
                       stop_after_steps: int | None = None) -> dict[str, Any]:
    """Train one seed into `workdir` (resuming if it holds a checkpoint), then evaluate.

    `stop_after_steps` ends the loop early as if the process had been killed after that many
    steps (tests of resumption); checkpoints written before that point stay.
    """
    workdir = pathlib.Path(workdir)
    mesh = parallel.make_mesh()
    num_devices = mesh.size
    configuration.validate_config(config, num_devices)
    workdir.mkdir(parents=True, exist_ok=True)
    _check_or_write_config(config, workdir)

    loaded = load_data(config)
    splits = loaded["splits"]
    train, validation = splits["train"], splits["validation"]
    steps_per_epoch = len(train.labels) // config.batch_size
    if steps_per_epoch == 0:
        raise ValueError(f"config.batch_size={config.batch_size} exceeds the {len(train.labels)} "
                         f"training examples")
    total_steps = steps_per_epoch * config.num_epochs
    base_rate = (_label_frequencies(train.labels, config.num_classes)
                 if config.base_rate == "label_frequency" else None)
    spec = losses.LossSpec.from_config(config, base_rate=base_rate)
    mean, std = normalization_stats(config, train)

    train_model, eval_model = build_models(config)
    tx = parallel.make_optimizer(config, total_steps)
    keys = run_keys(config.seed)
    image_shape = train.images.shape[1:]
    state = jax.jit(lambda k: parallel.init_train_state(eval_model, tx, k, image_shape),
                    out_shardings=parallel.replicated(mesh))(keys["init"])

    ckpt = checkpointing.RunCheckpoints(workdir)
    best_accuracy, best_step = -1.0, -1
    if ckpt.latest_step() is not None:
        state, meta = ckpt.restore_last(checkpointing.abstract_like(state,
                                                                    parallel.replicated(mesh)))
        best_accuracy, best_step = meta["best_val_accuracy"], meta["best_step"]
        _log(f"resumed from {workdir}/checkpoints/last at step {int(state.step)} "
             f"(epoch {int(state.step) // steps_per_epoch})")

    settings = parallel.StepSettings(steps_per_epoch=steps_per_epoch,
                                     batch_size=config.batch_size, augment=config.augment,
                                     normalize_mean=mean, normalize_std=std)
    train_step = parallel.make_train_step(train_model, spec, tx, mesh, settings, keys)
    eval_step = parallel.make_eval_step(eval_model, spec, mesh, mean, std)
    images_dev = parallel.put_replicated(mesh, train.images)
    labels_dev = parallel.put_replicated(mesh, train.labels.astype(np.int32))
    permute = jax.jit(lambda epoch: data.epoch_permutation(
        jax.random.fold_in(keys["order"], epoch), len(train.labels)),
        out_shardings=parallel.replicated(mesh))

    writer = MetricsWriter(workdir)
    step = int(state.step)
    _log(f"{config.variant} on {config.dataset}: {len(train.labels)} train / "
         f"{len(validation.labels)} val, {steps_per_epoch} steps/epoch x {config.num_epochs} "
         f"epochs, global batch {config.batch_size} on {num_devices} {jax.devices()[0].platform} "
         f"device(s)")

    def meta() -> dict[str, Any]:
        return {"best_val_accuracy": best_accuracy, "best_step": best_step,
                "epoch": step // steps_per_epoch, "variant": config.variant, "seed": config.seed}

    pending: list[tuple[int, dict]] = []
    window_start, window_steps = time.time(), 0
    rate = float("nan")

    def flush_metrics() -> None:
        nonlocal pending
        if not pending:
            return
        fetched = jax.device_get([m for _, m in pending])
        steps = [s for s, _ in pending]
        bad = [s for s, m in zip(steps, fetched) if m["nonfinite"]]
        if bad:
            ckpt.wait()
            raise NonFiniteLossError(
                f"non-finite loss or gradient at step(s) {bad[0]}..{bad[-1]} (epoch "
                f"{bad[0] // steps_per_epoch}); the update was skipped and training stopped. "
                f"The last good checkpoint in {workdir}/checkpoints is intact. Try a lower "
                f"learning rate, config.grad_clip_norm, or config.compute_dtype='float32'.")
        averaged = {k: float(np.mean([m[k] for m in fetched])) for k in fetched[0]
                    if k != "nonfinite"}
        writer.write(steps[-1], "train", averaged)
        pending = []
        return averaged

    stopped_early = False
    try:
        while step < total_steps:
            if stop_after_steps is not None and step >= stop_after_steps:
                stopped_early = True
                break
            epoch = step // steps_per_epoch
            permutation = permute(epoch)
            epoch_end = (epoch + 1) * steps_per_epoch
            while step < epoch_end:
                state, metrics = train_step(state, images_dev, labels_dev, permutation)
                step += 1
                window_steps += 1
                pending.append((step, metrics))
                if step % config.log_every_steps == 0 or step == epoch_end:
                    averaged = flush_metrics()
                    now = time.time()
                    rate = window_steps * config.batch_size / max(now - window_start, 1e-9)
                    window_start, window_steps = now, 0
                    eta = (total_steps - step) * config.batch_size / rate
                    _log(f"epoch {epoch + 1}/{config.num_epochs} step {step}/{total_steps} "
                         f"loss {averaged['loss']:.4f} acc {averaged['accuracy']:.4f} "
                         f"kl_w {averaged['kl_weight']:.3f} "
                         f"W {averaged['mean_prior_strength']:.3f} "
                         f"S {averaged['mean_strength']:.1f} | {rate:,.0f} img/s | "
                         f"ETA {_format_eta(eta)}")
                if config.checkpoint_every_steps and step % config.checkpoint_every_steps == 0 \
                        and step != epoch_end:
                    flush_metrics()
                    ckpt.save_last(step, state, meta())
                if stop_after_steps is not None and step >= stop_after_steps:
                    stopped_early = True
                    break
            if stopped_early:
                break
            flush_metrics()
            last_epoch = step == total_steps
            if (epoch + 1) % config.eval_every_epochs == 0 or last_epoch:
                alpha, _ = parallel.predict_dirichlet(eval_step, state.params, state.batch_stats,
                                                      mesh, validation, config.eval_batch_size)
                accuracy = float(np.mean(np.argmax(alpha, -1) == validation.labels))
                writer.write(step, "validation", {"accuracy": accuracy})
                improved = accuracy > best_accuracy
                if improved:
                    best_accuracy, best_step = accuracy, step
                    ckpt.save_best(step, state, meta())
                _log(f"epoch {epoch + 1}: validation accuracy {accuracy:.4f}"
                     f"{' (best)' if improved else f' (best {best_accuracy:.4f})'}")
            ckpt.save_last(step, state, meta())
        ckpt.wait()
    finally:
        ckpt.wait()
        writer.close()

    summary = {"workdir": str(workdir), "steps": step, "best_val_accuracy": best_accuracy,
               "best_step": best_step, "state": state}
    if stopped_early:
        ckpt.close()
        return summary
    if config.evaluate_at_end:
        from gedl_jax import evaluate  # noqa: PLC0415 (keeps matplotlib out of the import path)

        best_state, _ = ckpt.restore_best(checkpointing.abstract_like(
            state, parallel.replicated(mesh)))
        summary["evaluation"] = evaluate.evaluate_and_write(
            config, best_state.params, best_state.batch_stats, workdir, loaded=loaded,
            eval_model=eval_model, mesh=mesh)
    ckpt.close()
    return summary


def run(config, workdir: str | pathlib.Path) -> list[dict[str, Any]]:
    """One run per seed of `config.seeds` (workdir/seed_<s>), or a single run in `workdir`."""
    seeds = configuration.parse_seeds(config)
    workdir = pathlib.Path(workdir)
    if not str(config.seeds).strip():
        return [train_and_evaluate(config, workdir)]
    results = []
    for seed in seeds:
        seeded = config.copy_and_resolve_references()
        seeded.seed = seed
        seeded.seeds = ""
        _log(f"=== seed {seed} ===")
        results.append(train_and_evaluate(seeded, workdir / f"seed_{seed}"))
    evaluations = [r["evaluation"] for r in results if "evaluation" in r]
    if len(evaluations) > 1 and jax.process_index() == 0:
        from gedl_jax import evaluation  # noqa: PLC0415

        table = evaluation.results_table(evaluations, fmt="markdown")
        (workdir / "eval_table.md").write_text(table + "\n")
        _log(f"\n=== {len(evaluations)} seeds, mean ± std ===\n{table}")
    return results


def main(argv=None) -> int:
    from absl import app, flags  # noqa: PLC0415
    from ml_collections import config_flags  # noqa: PLC0415

    flags_ = flags.FLAGS
    config_flags.DEFINE_config_file("config", None, "Experiment config file (see configs/).",
                                    lock_config=True)
    flags.DEFINE_string("workdir", None, "Output folder (checkpoints, logs, results).")
    flags.mark_flags_as_required(["config", "workdir"])

    def _main(_argv):
        from absl import logging as absl_logging  # noqa: PLC0415
        absl_logging.set_verbosity(absl_logging.WARNING)  # Orbax logs every save at INFO
        if len(_argv) > 1:
            raise app.UsageError(f"unexpected arguments: {_argv[1:]}")
        config = flags_.config
        if config.distributed:
            jax.distributed.initialize()
        try:
            run(config, flags_.workdir)
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
