"""End-to-end training on real MNIST: quick run + evaluation, resumption, kill-and-resume,
non-finite loss handling, and CLI errors for bad configurations."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from gedl_jax import (
    checkpointing,
    configuration,
    evidential,
    losses,
    methods,
    rundir,
    steps,
    train,
)

REPO = pathlib.Path(__file__).resolve().parents[1]
DATA_DIR = pathlib.Path(os.environ.get("GEDL_DATA_DIR", REPO.parent / "shared" / "data"))
needs_mnist = pytest.mark.skipif(
    not (DATA_DIR / "mnist" / "train-images-idx3-ubyte.gz").exists(),
    reason=f"real MNIST files not found in {DATA_DIR}/mnist (set GEDL_DATA_DIR)")


def tiny_config(variant="gedl", **overrides):
    c = configuration.build_config("mnist", variant)
    c.data_dir = str(DATA_DIR)
    c.train_examples = 512
    c.val_examples = 512
    c.batch_size = 64
    c.num_epochs = 2
    c.log_every_steps = 4
    c.evaluate_at_end = False
    c.plots = False
    c.ood_datasets = ""
    for k, v in overrides.items():
        c[k] = v
    return c


def leaves(state):
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(state))]


@needs_mnist
def test_quick_run_trains_and_evaluates(tmp_path):
    c = tiny_config(evaluate_at_end=True, plots=True, ood_datasets="kmnist,fashion_mnist",
                    train_examples=2048, num_epochs=3)
    summary = train.train_and_evaluate(c, tmp_path)
    assert summary["best_val_accuracy"] > 0.6  # 3 short epochs on 2k images: well above chance
    results = json.loads((tmp_path / "eval_results.json").read_text())
    assert results["variant"] == "gedl"
    for name in ("config.json", "metrics.jsonl", "eval_table.md", "reliability_diagram.png"):
        assert (tmp_path / name).exists(), name
    assert list((tmp_path / "tensorboard").iterdir())
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train_records = [r for r in records if r["split"] == "train"]
    assert train_records[-1]["loss"] < train_records[0]["loss"]
    assert 0 < train_records[-1]["kl_weight"] <= 1
    table = (tmp_path / "eval_table.md").read_text()
    assert "kmnist" in table.lower() and "fashion" in table.lower()
    # The evaluation CLI's library path: restore the best checkpoint, add an IDX-folder OOD set.
    from gedl_jax import evaluate

    again = evaluate.evaluate_workdir(tmp_path, extra_ood=(str(DATA_DIR / "kmnist"),))
    assert again["id"]["accuracy"] == results["id"]["accuracy"]
    idx_key = [k for k in again["ood"] if k not in ("kmnist", "fashion_mnist")][0]
    assert again["ood"][idx_key]["detection"] == again["ood"]["kmnist"]["detection"]


@needs_mnist
def test_eval_examples_cuts_test_and_ood_sets_and_old_workdirs_restore(tmp_path):
    c = tiny_config(num_epochs=1, evaluate_at_end=True, ood_datasets="kmnist", eval_examples=300)
    results = train.train_and_evaluate(c, tmp_path)["evaluation"]
    assert results["id"]["num_examples"] == 300
    assert results["ood"]["kmnist"]["num_examples"] == 300
    from gedl_jax import evaluate, evaluation

    # The outputs behind the written evaluation, for analyses in notebooks.
    outputs = evaluate.predict_outputs(tmp_path)
    assert list(outputs) == ["test", "kmnist"]
    assert outputs["test"].num_examples == 300 and outputs["kmnist"].labels is None
    again = evaluation.evaluate_predictions(outputs["test"], {"kmnist": outputs["kmnist"]})
    assert again["id"]["accuracy"] == results["id"]["accuracy"]
    assert again["ood"]["kmnist"]["detection"] == results["ood"]["kmnist"]["detection"]
    # A workdir written before the field existed restores with its default (all examples).

    saved = json.loads((tmp_path / "config.json").read_text())
    del saved["eval_examples"]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    config = evaluate.restore_run(tmp_path).config
    assert config.eval_examples == 0 and config.train_examples == 512


@needs_mnist
@pytest.mark.parametrize("variant", ["gedl", "red"])
def test_resume_equals_uninterrupted(tmp_path, variant):
    c = tiny_config(variant, checkpoint_every_steps=3)
    full = train.train_and_evaluate(c, tmp_path / "full")
    # "Killed" after step 5 (mid-epoch; last checkpoint at step 3), then the same command again.
    partial = train.train_and_evaluate(c, tmp_path / "resumed", stop_after_steps=5)
    assert partial["steps"] == 5
    resumed = train.train_and_evaluate(c, tmp_path / "resumed")
    assert resumed["steps"] == full["steps"] == 16
    for a, b in zip(leaves(full["state"]), leaves(resumed["state"])):
        np.testing.assert_array_equal(a, b)
    assert resumed["best_val_accuracy"] == full["best_val_accuracy"]


@needs_mnist
def test_killed_process_resumes_to_same_parameters(tmp_path):
    """SIGKILL a real training process after its first checkpoint; rerun the same command."""
    workdir = tmp_path / "killed"
    args = [sys.executable, "-m", "gedl_jax.train", "--config=configs/mnist.py:gedl",
            f"--workdir={workdir}", f"--config.data_dir={DATA_DIR}",
            "--config.train_examples=512", "--config.val_examples=256",
            "--config.batch_size=64", "--config.num_epochs=3", "--config.log_every_steps=1",
            "--config.evaluate_at_end=False", "--config.ood_datasets=",
            "--config.checkpoint_every_steps=2"]
    proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    last = workdir / "checkpoints" / "last"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if last.exists() and any(p.name.isdigit() and int(p.name) >= 4 for p in last.iterdir()):
            break
        time.sleep(0.05)
    assert proc.poll() is None, "training finished before it could be killed:\n" + \
        proc.stdout.read()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    rerun = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "resumed from" in rerun.stdout
    c = tiny_config(train_examples=512, val_examples=256, num_epochs=3, log_every_steps=1,
                    checkpoint_every_steps=2)
    reference = train.train_and_evaluate(c, tmp_path / "reference")
    killed = train.train_and_evaluate(c, workdir)  # already complete: restores, trains nothing
    assert killed["steps"] == reference["steps"]
    for a, b in zip(leaves(reference["state"]), leaves(killed["state"])):
        np.testing.assert_array_equal(a, b)


@needs_mnist
def test_nonfinite_loss_stops_and_keeps_last_good_checkpoint(tmp_path, monkeypatch):
    original = losses.per_example_loss

    def poisoned(spec, logits, labels, tau_state, epoch, global_mean=lambda x: x):
        loss, tau, terms = original(spec, logits, labels, tau_state, epoch, global_mean)
        return jax.numpy.where(epoch >= 1, jax.numpy.nan, loss), tau, terms

    monkeypatch.setattr(losses, "per_example_loss", poisoned)
    c = tiny_config()
    with pytest.raises(train.NonFiniteLossError, match=r"non-finite loss.*epoch 1.*intact"):
        train.train_and_evaluate(c, tmp_path)
    monkeypatch.undo()
    ckpt = checkpointing.RunCheckpoints(tmp_path)
    assert ckpt.latest_step() == 8  # the end of epoch 0, nothing after
    ckpt.close()
    summary = train.train_and_evaluate(tiny_config(), tmp_path, stop_after_steps=8)
    assert all(np.all(np.isfinite(x)) for x in leaves(summary["state"].params))


@needs_mnist
def test_several_seeds_in_one_command_give_a_mean_std_table(tmp_path):
    c = tiny_config(num_epochs=1, seeds="3,4", evaluate_at_end=True)
    results = train.run(c, tmp_path)
    assert [r["workdir"] for r in results] == [str(tmp_path / "seed_3"), str(tmp_path / "seed_4")]
    seeds = [json.loads((tmp_path / f"seed_{s}" / "eval_results.json").read_text())["seed"]
             for s in (3, 4)]
    assert seeds == [3, 4]
    assert "±" in (tmp_path / "eval_table.md").read_text()


@needs_mnist
def test_vmapped_seeds_equal_sequential_seeds_and_resume_exactly(tmp_path):
    """Seeds trained together (vmap) follow their sequential runs, with their own splits; a
    vmapped run stopped mid-epoch and restarted ends bit-identical to an uninterrupted one."""
    seeds = [3, 4]
    c = tiny_config(seeds="3,4", num_epochs=2, checkpoint_every_steps=3)
    sequential = [train.train_and_evaluate(configuration.with_seed(c, s), tmp_path / "seq" / str(s))
                  for s in seeds]
    together = train.train_and_evaluate_vmapped(_with(c, vmap_seeds=True), tmp_path / "vmap",
                                                seeds)
    assert [r["seed"] for r in together] == seeds
    for seq, vm in zip(sequential, together):
        assert vm["steps"] == seq["steps"] == 16
        for a, b in zip(leaves(seq["state"].params), leaves(vm["state"].params)):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
        # Nearly identical, but not trivially so: the two seeds really differ.
        assert abs(vm["best_val_accuracy"] - seq["best_val_accuracy"]) <= 2 / 512
    first = [leaves(r["state"].params)[0] for r in together]
    assert not np.allclose(first[0], first[1])
    saved = json.loads((tmp_path / "vmap" / "seed_4" / "config.json").read_text())
    assert saved["seed"] == 4 and saved["vmap_seeds"] is True

    vm = _with(c, vmap_seeds=True)
    partial = train.train_and_evaluate_vmapped(vm, tmp_path / "resumed", seeds,
                                               stop_after_steps=5)
    assert [r["steps"] for r in partial] == [5, 5]
    resumed = train.train_and_evaluate_vmapped(vm, tmp_path / "resumed", seeds)
    for full, again in zip(together, resumed):
        assert again["steps"] == 16
        for a, b in zip(leaves(full["state"]), leaves(again["state"])):
            np.testing.assert_array_equal(a, b)
        assert again["best_val_accuracy"] == full["best_val_accuracy"]


def _with(c, **fields):
    c = c.copy_and_resolve_references()
    for k, v in fields.items():
        c[k] = v
    return c


@needs_mnist
def test_vmapped_seeds_through_run_write_each_seed_and_the_table(tmp_path):
    c = tiny_config(num_epochs=1, seeds="0,1", vmap_seeds=True, evaluate_at_end=True)
    results = train.run(c, tmp_path)
    for s in (0, 1):
        saved = json.loads((tmp_path / f"seed_{s}" / "eval_results.json").read_text())
        assert saved["seed"] == s
        assert (tmp_path / f"seed_{s}" / "checkpoints" / "best").exists()
    assert len(results) == 2 and "±" in (tmp_path / "eval_table.md").read_text()
    # A sequential rerun of the same workdir is a different program: refused, not mixed.
    with pytest.raises(train.ConfigMismatchError, match="vmap_seeds"):
        train.run(_with(c, vmap_seeds=False), tmp_path)


@needs_mnist
def test_workdir_refuses_a_different_config(tmp_path):
    train.train_and_evaluate(tiny_config(num_epochs=1), tmp_path)
    with pytest.raises(train.ConfigMismatchError, match="learning_rate"):
        train.train_and_evaluate(tiny_config(num_epochs=1, learning_rate=0.1), tmp_path)


@pytest.mark.parametrize("args,message", [
    (["--config=configs/mnist.py:gedel"], "unknown config argument"),
    (["--config=configs/mnist.py", "--config.likelihood=ce"], "config.likelihood='ce'"),
    (["--config=configs/mnist.py", "--config.batch_sise=64"], "batch_sise"),
    (["--config=configs/mnist.py", "--config.batch_size=abc"], "batch_size"),
    (["--config=configs/mnist.py", "--config.data_dir=/nonexistent/gedl"], "/nonexistent/gedl"),
])
def test_cli_bad_config_fails_fast_with_a_clear_message(tmp_path, args, message):
    start = time.time()
    proc = subprocess.run([sys.executable, "-m", "gedl_jax.train", f"--workdir={tmp_path}/w",
                           *args], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert message in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert time.time() - start < 60
    assert not (tmp_path / "w" / "checkpoints").exists()


def test_tau_state_is_part_of_the_checkpointed_state():
    fields = steps.TrainState.__dataclass_fields__
    assert {"params", "opt_state", "model_state", "method_state", "step"} <= set(fields)
    method = methods.from_config(configuration.build_config("mnist", "gedl"),
                                 methods.MethodSetup(10, (1,) * 10, (28, 28, 1)))
    assert isinstance(method.init_method_state(), evidential.TauState)
    assert isinstance(evidential.tau_init(), evidential.TauState)


def test_cifar10_vgg_end_to_end_on_tfds_mock_data(tmp_path):
    """CIFAR-10 path (VGG16-bn, on-device augmentation, batch norm) through the TFDS source with
    tfds.testing.mock_data: random images of the right spec, no files, no network."""
    import tensorflow_datasets as tfds

    c = configuration.build_config("cifar10", "gedl")
    c.data_source = "tfds"
    c.data_dir = str(tmp_path / "no_data")
    c.cache_dir = str(tmp_path / "cache")
    c.batch_size = 16
    c.num_epochs = 2
    c.log_every_steps = 2
    c.eval_batch_size = 32
    c.plots = False
    c.ood_datasets = "cifar100"
    with tfds.testing.mock_data(num_examples=64):
        summary = train.train_and_evaluate(c, tmp_path / "run")
    assert summary["steps"] == 2 * (60 // 16)  # 64 * 0.95 -> 60 train examples, 3 steps/epoch
    results = json.loads((tmp_path / "run" / "eval_results.json").read_text())
    assert results["id"]["num_examples"] == 64
    assert results["ood"]["cifar100"]["num_examples"] == 64
    batch_stats = jax.tree.leaves(summary["state"].model_state["batch_stats"])
    assert batch_stats and all(np.all(np.isfinite(x)) for x in batch_stats)
    from gedl_jax import evaluate

    with tfds.testing.mock_data(num_examples=64):
        study = evaluate.corruption_study([tmp_path / "run"], ["snow"], tmp_path / "study")
    assert sorted(study["snow"]["measures"]) == [0, 1, 2, 3, 4, 5]
    assert (tmp_path / "study" / "corruption_snow.png").stat().st_size > 0


def test_workdir_from_before_the_init_field_reads_as_torch_init(tmp_path):
    """A config.json written before `config.init` existed (no "init" key) is a torch-init run: it
    resumes with init="torch", refuses "flax" naming the field, and builds its models."""
    config = configuration.build_config("mnist", "gedl")
    config.init = "torch"
    old = json.loads(config.to_json_best_effort())
    del old["init"]
    (tmp_path / "config.json").write_text(json.dumps(old))
    rundir.check_or_write_config(config, tmp_path)             # same run: accepted
    (tmp_path / "config.json").write_text(json.dumps(old))
    config.init = "flax"
    with pytest.raises(train.ConfigMismatchError, match="init: 'torch' -> 'flax'"):
        rundir.check_or_write_config(config, tmp_path)
    import ml_collections  # noqa: PLC0415

    _, eval_model = methods.build_models(ml_collections.ConfigDict(old))
    assert eval_model.param_init == "torch"
