"""Training end to end: quick run + evaluation of every preset, resumption (bit for bit),
kill-and-resume of a real process, non-finite loss handling, several seeds (sequential and
vmapped), workdir/config mismatch, and CLI errors for bad configurations.

The training mechanics run on small files generated in the official MNIST IDX gz format
(tests/conftest.py, `generated_data`): class k is a bright band, so a few steps of training
reach well above chance, offline, on any machine. Only `test_quick_run_trains_and_evaluates`
checks an accuracy on the real MNIST files and needs the data folder ($GEDL_DATA_DIR).
"""

import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import pytest
from data_fixtures import SPECS_FILE, write_generated_cifar10
from training_fixtures import checkpoint_steps, saved_state, subprocess_env

from gedl_jax import config as config_lib
from gedl_jax import configs, methods, train
from gedl_jax.evidential import loss as losses
from gedl_jax.run import preemption, rundir
from gedl_jax.run import workdir as workdir_lib
from compile_mode import fast_compilation

REPO = pathlib.Path(__file__).resolve().parents[1]
# The real data folder: $GEDL_DATA_DIR only (None when unset: the test that needs it skips).
REAL_DATA_DIR = pathlib.Path(os.environ["GEDL_DATA_DIR"]) if os.environ.get("GEDL_DATA_DIR") \
    else None
needs_real_mnist = pytest.mark.skipif(
    REAL_DATA_DIR is None or not (REAL_DATA_DIR / "mnist" / "train-images-idx3-ubyte.gz").exists(),
    reason="GEDL_DATA_DIR is not set" if REAL_DATA_DIR is None
    else f"real MNIST files not found in {REAL_DATA_DIR}/mnist (set GEDL_DATA_DIR)")

STEPS_PER_EPOCH = 8   # 256 training examples / batch 32
# checkpoint_interval_seconds=0: a checkpoint at every epoch end (training_fixtures.TINY_FIELDS)
TINY = {"train_examples": 256, "val_examples": 64, "batch_size": 32, "num_epochs": 2,
        "log_every_steps": 4, "eval_batch_size": 64, "evaluate_at_end": False, "plots": False,
        "ood_datasets": (), "checkpoint_interval_seconds": 0}


@pytest.fixture(scope="module")
def data_dir(generated_data_files):
    """The generated data folder, its files registered for this module's tests."""
    with generated_data_files.registered() as root:
        yield root


@pytest.fixture(autouse=True)
def _fast(fast_compile):
    """Compiles in seconds; subprocesses get the same setting (training_fixtures.subprocess_env)
    so their parameters are comparable bit for bit."""


def tiny_config(data_dir, variant="gedl", **overrides):
    c = configs.build_config("mnist", variant)
    for k, v in {**TINY, "data_dir": str(data_dir), **overrides}.items():
        config_lib.set_fields(c, **{k: v})
    return c


def _adam_update_bound(t: int, b1: float = 0.9, b2: float = 0.999) -> float:
    """The largest |m_hat / sqrt(v_hat)| of Adam's step t over all gradient sequences
    (Cauchy-Schwarz: sqrt(sum_i w_i**2 / u_i), with m_hat = sum_i w_i g_i and v_hat =
    sum_i u_i g_i**2 the bias-corrected averages): 1 at step 1, 1.03 at step 8. A weight
    moves by at most the learning rate times this per step, whatever its gradients."""
    i = np.arange(1, t + 1)
    w = (1 - b1) * b1 ** (t - i) / (1 - b1**t)
    u = (1 - b2) * b2 ** (t - i) / (1 - b2**t)
    return float(np.sqrt(np.sum(w**2 / u)))


def leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(tree))]


def assert_same_leaves(a, b):
    la, lb = leaves(a), leaves(b)
    assert len(la) == len(lb) > 0
    for x, y in zip(la, lb):
        np.testing.assert_array_equal(x, y)


@pytest.fixture(scope="module")
def reference(data_dir, tmp_path_factory):
    """An uninterrupted tiny GEDL run (2 epochs, checkpoints every 3 steps), shared by the
    tests that compare against it."""
    with fast_compilation():   # as the `_fast` fixture
        workdir = tmp_path_factory.mktemp("reference")
        c = tiny_config(data_dir, checkpoint_every_steps=3)
        return c, train.train_and_evaluate(c, workdir)


# ------------------------------------------------------------------------------ real data
@needs_real_mnist
def test_quick_run_trains_and_evaluates(tmp_path):
    """Needs the real MNIST files (data folder): accuracy after 3 short epochs on 2k images,
    evaluated on 2,000 evenly spaced images of each test set."""
    c = tiny_config(REAL_DATA_DIR, evaluate_at_end=True, plots=True,
                    ood_datasets="kmnist,fashion_mnist", train_examples=2048, val_examples=512,
                    batch_size=64, num_epochs=3, eval_examples=2000)
    summary = train.train_and_evaluate(c, tmp_path)
    assert summary["best_val_accuracy"] > 0.6
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

    again = evaluate.evaluate_workdir(tmp_path, extra_ood=(str(REAL_DATA_DIR / "kmnist"),))
    assert again["id"]["accuracy"] == results["id"]["accuracy"]
    idx_key = [k for k in again["ood"] if k not in ("kmnist", "fashion_mnist")][0]
    assert again["ood"][idx_key]["detection"] == again["ood"]["kmnist"]["detection"]


# ------------------------------------------------------------------------ generated data
# Presets with the same fields train the same program (ablation_full is gedl): one of each.
_DISTINCT: dict[str, str] = {}
for _name in sorted(config_lib.VARIANTS, key=lambda n: (n.startswith("ablation"), n)):
    _DISTINCT.setdefault(json.dumps(config_lib.VARIANTS[_name], sort_keys=True), _name)
PRESETS = sorted(_DISTINCT.values())
# PostNet's flows learn slowly (its reference trains with lr 1e-4 for up to 200 epochs; a few
# hundred steps reach ~78 % here): in a few dozen steps its check is a falling loss.
# I-EDL: its Fisher-weighted MSE sum_k psi1(alpha_k) (y_k - p_k)^2 falls towards 0 when every
# class's evidence grows together (psi1(alpha) ~ 1/alpha), whether or not the classes separate,
# and in its first epoch nothing opposes that but the -log det FIM term of weight 0.005 (EDL's
# annealed KL weight is 0). At 3e-3 the first epoch inflates S to ~420 for all classes at once
# and validation stays near chance (0.33 on a CPU, 0.06 on an H200 with TF32 products; float32
# products on the H200 give the CPU's 0.33: studies/iedl_tiny_run.py,
# docs/results/gpu/nvidia_h200/earlier_f1a2337/NOTES.md). At I-EDL's own protocol rate, 1e-3,
# over 4 epochs it learns: 0.875-0.922 on seeds 0-2 (CPU), far from the 0.25 this test asks.
LEARNING_RATE: dict[str, float] = {"iedl": 1e-3}
LEARNS_SLOWLY = ("postnet",)


def test_preset_list_covers_every_variant():
    for name, fields in config_lib.VARIANTS.items():
        assert any(config_lib.VARIANTS[p] == fields for p in PRESETS), name


@pytest.mark.parametrize("variant", PRESETS)
def test_every_preset_trains_and_evaluates(data_dir, tmp_path, variant):
    """Each distinct preset of config_lib.VARIANTS: two short epochs (a higher learning rate
    than the protocol's, so that 16 steps suffice), then the evaluation on a cut of the test
    set and the OOD sets: accuracy well above chance (0.1), finite state, the files written."""
    full = variant == "gedl"   # plots and a second OOD set once (they cost seconds)
    # MC Dropout's p = 0.5 on the ConvNet's 64-unit layers, PostNet's flows and I-EDL at its
    # protocol rate (LEARNING_RATE) learn slower: twice the epochs.
    epochs = 4 if variant in ("mc_dropout", "postnet", "iedl") else 2
    c = tiny_config(data_dir, variant, learning_rate=LEARNING_RATE.get(variant, 3e-3),
                    evaluate_at_end=True, ood_datasets="kmnist,fashion_mnist" if full else "kmnist",
                    eval_examples=60, plots=full, num_epochs=epochs)
    summary = train.train_and_evaluate(c, tmp_path)
    assert summary["steps"] == epochs * STEPS_PER_EPOCH
    assert all(np.all(np.isfinite(x)) for x in leaves(summary["state"]) if x.dtype.kind == "f")
    # 64 validation examples: P(accuracy > 0.25) at chance is ~1e-5.
    assert summary["best_val_accuracy"] > 0.25 or variant in LEARNS_SLOWLY
    results = json.loads((tmp_path / "eval_results.json").read_text())
    assert results["id"]["accuracy"] == summary["evaluation"]["id"]["accuracy"]
    assert results["id"]["num_examples"] == 60  # eval_examples cuts the test set ...
    assert sorted(results["ood"]) == sorted(config_lib.parse_list(c.ood_datasets))
    for name in results["ood"]:  # ... and the OOD sets
        assert results["ood"][name]["num_examples"] == 60
    assert json.loads((tmp_path / "config.json").read_text())["method"] == c.method
    files = ["config.json", "metrics.jsonl", "eval_table.md"]
    files += ["reliability_diagram.png"] if c.plots else []
    for name in files:
        assert (tmp_path / name).stat().st_size > 0, name
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train_losses = [r["loss"] for r in records if r["split"] == "train"]
    assert len(train_losses) == 2 * epochs and np.all(np.isfinite(train_losses))
    if variant in LEARNS_SLOWLY:
        assert train_losses[-1] < train_losses[0]


def test_epoch_ends_wait_for_the_next_call_and_change_nothing(data_dir, tmp_path, monkeypatch):
    """Off the CPU, an epoch end's host work (its metrics, validation, checkpoints) is done
    once the next call is queued, and its checkpoints are written in a thread of their own,
    from buffers the next call does not donate: the run, its log and its checkpoints are those
    of the loop that waits at every epoch end (a CPU's). The last epoch end waits (nothing
    comes after it)."""
    from gedl_jax.run import checkpointing, training
    from gedl_jax.run.progress import MetricsBuffer

    assert training.defers_epoch_ends() == (jax.default_backend() != "cpu")

    events, saved = [], []   # the loop's (main thread), the saves' (whichever thread)
    add, finish = MetricsBuffer.add, training._Validation.finish
    submit, save_now = checkpointing.RunCheckpoints._save, checkpointing._save_now

    def on_add(self, step, *args, **kwargs):
        events.append(("call", step))
        return add(self, step, *args, **kwargs)

    def on_finish(self, pending, members, step, *args):
        events.append(("validation", step))
        return finish(self, pending, members, step, *args)

    def on_submit(self, manager, step, *args):
        events.append((pathlib.Path(manager.directory).name, step))
        return submit(self, manager, step, *args)

    def on_save(manager, step, *args):
        saved.append((pathlib.Path(manager.directory).name, step,
                      threading.current_thread().name.rsplit("_", 1)[0]))
        return save_now(manager, step, *args)

    monkeypatch.setattr(MetricsBuffer, "add", on_add)
    monkeypatch.setattr(training._Validation, "finish", on_finish)
    monkeypatch.setattr(checkpointing.RunCheckpoints, "_save", on_submit)
    monkeypatch.setattr(checkpointing, "_save_now", on_save)
    c = tiny_config(data_dir, log_every_steps=3)
    monkeypatch.setattr(training, "DEFER_EPOCH_ENDS", True)   # as off the CPU
    deferred = train.train_and_evaluate(c, tmp_path / "deferred")
    e = STEPS_PER_EPOCH
    # The calls' last steps: one step a call on a CPU; off it, calls end at log lines and epoch
    # ends (`training._next_event`), so the call after the epoch end is not always step e + 1.
    calls = [step for kind, step in events if kind == "call"]
    after, second = calls[calls.index(e) + 1], calls[calls.index(e) + 2]
    assert events[events.index(("call", e)):events.index(("call", second))] == \
        [("call", e), ("call", after), ("validation", e), ("best", e), ("last", e)]
    last_end = events[events.index(("call", 2 * e)):]
    assert last_end[:2] == [("call", 2 * e), ("validation", 2 * e)]
    assert last_end[-1] == ("last", 2 * e)
    assert [step for _, step in last_end[2:]] == [2 * e] * len(last_end[2:])
    # in the order they were handed over, each in the saver's thread
    assert saved == [(*event, "gedl-checkpoints") for event in events
                     if event[0] in ("best", "last")]

    monkeypatch.setattr(training, "DEFER_EPOCH_ENDS", False)   # as on a CPU
    waiting = train.train_and_evaluate(c, tmp_path / "waiting")
    assert_same_leaves(deferred["state"], waiting["state"])
    assert (deferred["best_val_accuracy"], deferred["best_step"]) == \
        (waiting["best_val_accuracy"], waiting["best_step"])

    def log(workdir):
        return [{k: v for k, v in json.loads(line).items() if k != "time"}
                for line in (workdir / "metrics.jsonl").read_text().splitlines()]

    assert log(tmp_path / "deferred") == log(tmp_path / "waiting")
    for kind in ("last", "best"):
        steps_ = checkpoint_steps(tmp_path / "deferred", kind)
        assert steps_ == checkpoint_steps(tmp_path / "waiting", kind) and steps_
        for step in steps_:
            assert_same_leaves(*(saved_state(tmp_path / w, kind, step)
                                 for w in ("deferred", "waiting")))


def test_predictions_behind_the_evaluation_and_old_workdirs_restore(data_dir, tmp_path,
                                                                     monkeypatch):
    c = tiny_config(data_dir, num_epochs=1, evaluate_at_end=True, ood_datasets="kmnist",
                    eval_examples=50)
    assert c.matmul_precision == "default"   # TF32 on a GPU; the suite's code runs "highest"
    results = train.train_and_evaluate(c, tmp_path)["evaluation"]
    from gedl_jax import evaluate, evaluation
    from gedl_jax.run import inference

    # The predictions behind the written evaluation, for analyses in notebooks: recomputed
    # under the run's precision, not the caller's (on a GPU the two differ in the 5th digit).
    seen = []
    predict_split = inference.predict_split

    def spy(*args, **kwargs):
        seen.append(jax.config.jax_default_matmul_precision)
        return predict_split(*args, **kwargs)

    monkeypatch.setattr(inference, "predict_split", spy)
    outputs = evaluate.predict_outputs(tmp_path)
    assert seen == ["default"] * 2
    assert list(outputs) == ["test", "kmnist"]
    assert outputs["test"].num_examples == 50 and outputs["kmnist"].labels is None
    again = evaluation.evaluate_predictions(outputs["test"], {"kmnist": outputs["kmnist"]})
    assert again["id"] == results["id"] and again["ood"] == results["ood"]
    # An OOD set added at evaluation (its IDX folder) is cut to eval_examples as KMNIST is.
    added = evaluate.evaluate_workdir(tmp_path, extra_ood=(str(data_dir / "kmnist"),),
                                      results_dir=tmp_path / "added")
    folder = next(k for k in added["ood"] if k != "kmnist")
    assert added["ood"][folder]["detection"] == added["ood"]["kmnist"]["detection"]
    # A workdir written before a field existed restores with its default (all examples).
    saved = json.loads((tmp_path / "config.json").read_text())
    del saved["eval_examples"], saved["method"]
    (tmp_path / "config.json").write_text(json.dumps(saved))
    config = evaluate.restore_run(tmp_path).config
    assert config.eval_examples == 0 and config.method == "evidential"


def test_deep_ensemble_trains_members_and_is_scored_as_one_model(data_dir, tmp_path):
    c = configs.build_config("mnist", "ensemble")
    for k, v in {**TINY, "data_dir": str(data_dir), "ensemble_size": 2, "evaluate_at_end": True,
                 "ood_datasets": "kmnist", "eval_examples": 60, "seed": 1}.items():
        config_lib.set_fields(c, **{k: v})
    summary = train.train_ensemble(c, tmp_path)
    members = sorted(p.name for p in (tmp_path / "members").iterdir())
    assert members == ["seed_2", "seed_3"]          # seed * N + m
    results = summary["evaluation"]
    assert results["scores"] == ["mp", "neg_mi", "neg_entropy"]   # no UM: no Dirichlet
    assert results["variant"] == "ensemble" and len(results["ensemble_members"]) == 2
    from gedl_jax import evaluate
    from gedl_jax.run import workdir
    from gedl_jax.run import ensemble

    # The members' mean probabilities, recomputed from each member's own predictions.
    dirs = [tmp_path / "members" / m for m in members]
    preds = [workdir.predict_outputs(d)["test"] for d in dirs]
    mean = np.mean([p.probs for p in preds], axis=0)
    assert results["id"]["accuracy"] == pytest.approx(
        np.mean(mean.argmax(-1) == preds[0].labels))
    assert ensemble.combine(preds).probs == pytest.approx(mean)
    again = evaluate.evaluate_workdir(tmp_path)    # the CLI's path for an ensemble workdir
    assert again["id"] == results["id"] and again["ood"] == results["ood"]


@pytest.mark.parametrize("variant", ["gedl", "red"])
def test_resume_equals_uninterrupted(data_dir, tmp_path, reference, variant, capsys):
    c = tiny_config(data_dir, variant, checkpoint_every_steps=3)
    if variant == "gedl":
        full = reference[1]
    else:
        full = train.train_and_evaluate(c, tmp_path / "full")
    # "Killed" after step 5 (mid-epoch; last checkpoint at step 3), then the same command again.
    partial = train.train_and_evaluate(c, tmp_path / "resumed", stop_after_steps=5)
    assert partial["steps"] == 5
    assert checkpoint_steps(tmp_path / "resumed") == [3]
    capsys.readouterr()
    resumed = train.train_and_evaluate(c, tmp_path / "resumed")
    assert "resumed from" in capsys.readouterr().out   # not a fresh run that happens to match
    assert resumed["steps"] == full["steps"] == 2 * STEPS_PER_EPOCH
    # The whole state (parameters, optimiser, the method's state such as GEDL's tau accumulator).
    assert_same_leaves(full["state"], resumed["state"])
    assert resumed["best_val_accuracy"] == full["best_val_accuracy"]
    assert resumed["best_step"] == full["best_step"]


def test_killed_process_resumes_to_the_same_parameters(data_dir, tmp_path, reference):
    """SIGKILL a real training process after its second checkpoint; rerun the same command;
    the result equals the uninterrupted in-process run bit for bit."""
    c, full = reference
    workdir = tmp_path / "killed"
    fields = {**TINY, "checkpoint_every_steps": 3, "log_every_steps": 1}
    args = [sys.executable, str(REPO / "tests" / "fixture_cli.py"), str(data_dir / SPECS_FILE),
            "gedl_jax.train", "--config=configs/mnist.py:gedl", f"--workdir={workdir}",
            f"--config.data_dir={data_dir}", *(f"--config.{k}={v}" for k, v in fields.items())]
    env = subprocess_env(tmp_path / "cache")
    # it stops moving after its step-6 checkpoint (tests/fixture_cli.py): killed there on any
    # platform, however fast
    proc = subprocess.Popen(args, cwd=REPO, env={**env, "GEDL_TEST_HOLD_AFTER_CHECKPOINT": "6"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None:
            if any(s >= 6 for s in checkpoint_steps(workdir)):
                break
            time.sleep(0.02)
        assert proc.poll() is None, "training ended before the kill:\n" + proc.stdout.read()
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    assert max(checkpoint_steps(workdir)) < 2 * STEPS_PER_EPOCH
    rerun = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "resumed from" in rerun.stdout
    killed = train.train_and_evaluate(c, workdir)  # already complete: restores, trains nothing
    assert killed["steps"] == full["steps"]
    assert_same_leaves(full["state"], killed["state"])


@pytest.mark.parametrize("deferred", [False, True])
def test_nonfinite_loss_stops_and_keeps_last_good_checkpoint(data_dir, tmp_path, monkeypatch,
                                                             deferred):
    """Also with the epoch ends deferred as off the CPU: the first non-finite step comes in the
    call after the epoch end whose checkpoint the saver thread is still writing."""
    from gedl_jax.run import training

    monkeypatch.setattr(training, "DEFER_EPOCH_ENDS", deferred)
    original = losses.per_example_loss

    def poisoned(spec, logits, labels, tau_state, epoch, *args, **kwargs):
        loss, tau, terms = original(spec, logits, labels, tau_state, epoch, *args, **kwargs)
        return jax.numpy.where(epoch >= 1, jax.numpy.nan, loss), tau, terms

    monkeypatch.setattr(losses, "per_example_loss", poisoned)
    c = tiny_config(data_dir)
    with pytest.raises(train.NonFiniteLossError, match=r"(?s)non-finite loss.*epoch 1.*intact"):
        train.train_and_evaluate(c, tmp_path)
    monkeypatch.undo()
    assert checkpoint_steps(tmp_path) == [STEPS_PER_EPOCH]  # the end of epoch 0, nothing after
    summary = train.train_and_evaluate(c, tmp_path, stop_after_steps=STEPS_PER_EPOCH)
    assert summary["steps"] == STEPS_PER_EPOCH
    assert all(np.all(np.isfinite(x)) for x in leaves(summary["state"]))


def test_seeds_sequential_and_vmapped_agree_and_vmapped_resumes_exactly(data_dir, tmp_path,
                                                                         capsys):
    """`seeds="3,4"`: one run per seed and a mean ± std table. With vmap_seeds the seeds train
    together and follow their sequential runs; a vmapped run preempted at step 1 and run again
    ends bit-identical to an uninterrupted one; a sequential rerun of a vmapped workdir is
    refused, not mixed.

    Sequential and vmapped seeds are different programs (a vmapped convolution is a grouped
    one), so they agree to the rounding of their products, not bit for bit. The runs pin
    float32 products (`matmul_precision="highest"`): under a GPU's TF32 default the unit
    roundoff is 2**-11 instead of 2**-24, and the gap grows with it (docs/gpu.md)."""
    c = tiny_config(data_dir, seeds="3,4", num_epochs=1, evaluate_at_end=True,
                    matmul_precision="highest")
    sequential = train.run(c, tmp_path / "seq")
    assert [r["workdir"] for r in sequential] == [str(tmp_path / "seq" / f"seed_{s}")
                                                  for s in (3, 4)]
    assert [r["seed"] for r in sequential] == [3, 4]
    for s in (3, 4):
        saved = json.loads((tmp_path / "seq" / f"seed_{s}" / "eval_results.json").read_text())
        assert saved["seed"] == s
    assert "±" in (tmp_path / "seq" / "eval_table.md").read_text()
    # The two seeds really differ (else "each seed follows its sequential run" is vacuous).
    assert not np.allclose(leaves(sequential[0]["state"].params)[0],
                           leaves(sequential[1]["state"].params)[0])

    vm = tiny_config(data_dir, seeds="3,4", num_epochs=1, evaluate_at_end=True,
                     vmap_seeds=True, matmul_precision="highest")
    together = train.run(vm, tmp_path / "vmap")
    assert [r["seed"] for r in together] == [3, 4]
    for seq, vmr in zip(sequential, together):
        assert vmr["steps"] == seq["steps"] == STEPS_PER_EPOCH
        # float32 rounding apart (batched convolutions may sum in another order): after these
        # 8 Adam steps the gap measured on a CPU is 1.5e-6, 25 units of float32 roundoff
        # (2**-24); atol is 168 of them, rtol 1678. Except where a gradient is itself at the
        # rounding level: Adam divides it by its own size, so rounding can turn its update by
        # up to the step size (an H100 had 1 of 102,400 weights 1.2e-5 apart). Those few
        # are bounded by what Adam can move a weight at all.
        reach = 2 * c.learning_rate * sum(_adam_update_bound(t) for t in range(1, seq["steps"] + 1))
        for a, b in zip(leaves(seq["state"].params), leaves(vmr["state"].params)):
            rounded_apart = ~np.isclose(a, b, rtol=1e-4, atol=1e-5)
            assert rounded_apart.mean() <= 1e-3, rounded_apart.sum()
            np.testing.assert_array_less(np.abs(a - b), reach)
        assert abs(vmr["best_val_accuracy"] - seq["best_val_accuracy"]) <= 2 / 64
    saved = json.loads((tmp_path / "vmap" / "seed_4" / "config.json").read_text())
    assert saved["seed"] == 4 and saved["vmap_seeds"] is True
    assert "±" in (tmp_path / "vmap" / "eval_table.md").read_text()

    vm_quiet = vm.copy_and_resolve_references()
    vm_quiet.evaluate_at_end = False   # a resume-safe field: the same training
    preemption.request()   # what SIGTERM does: stop at the next step with a checkpoint
    try:
        with pytest.raises(preemption.Preempted):
            train.run(vm_quiet, tmp_path / "resumed")
    finally:
        preemption.reset()
    for s in (3, 4):
        assert checkpoint_steps(tmp_path / "resumed" / f"seed_{s}") == [1]
    capsys.readouterr()
    resumed = train.run(vm_quiet, tmp_path / "resumed")
    assert "resumed from" in capsys.readouterr().out
    for full, again in zip(together, resumed):
        assert again["steps"] == STEPS_PER_EPOCH
        assert_same_leaves(full["state"], again["state"])
        assert again["best_val_accuracy"] == full["best_val_accuracy"]

    with pytest.raises(train.ConfigMismatchError, match="vmap_seeds"):
        train.run(tiny_config(data_dir, seeds="3,4", num_epochs=1, evaluate_at_end=True,
                              vmap_seeds=False, matmul_precision="highest"), tmp_path / "vmap")


@pytest.fixture(scope="module")
def cifar10_dir(tmp_path_factory):
    """A generated CIFAR-10 in its official tarball (20 training images, random pixels and
    labels), registered for this module's tests."""
    with write_generated_cifar10(tmp_path_factory.mktemp("cifar10")).registered() as root:
        yield root


def _train_records(workdir: pathlib.Path) -> list[dict]:
    return [r for r in map(json.loads, (workdir / "metrics.jsonl").read_text().splitlines())
            if r["split"] == "train"]


CONV_BIAS = re.compile(r"\['params'\]\['conv\d+'\]\['bias'\]")


def test_vgg16_seeds_vmapped_follow_their_sequential_runs(cifar10_dir, tmp_path):
    """The cifar10 preset with vmap_seeds: VGG16 with batch norm and classifier dropout, on
    augmented images (the im2col convolutions of its last block on a CPU). Each seed trains
    as its sequential run, with its own batch statistics, augmentation and dropout draws. Two
    epochs of one step, batch 4. (tests/multidevice/multi_seed_step.py compares the step alone,
    in float64 on 4 devices, with --run-extended.)

    After the first step the whole state (parameters, batch-norm running statistics, Adam's
    moments, GEDL's tau sums) is the sequential run's to float32 rounding, held as the
    ConvNet's above, except the convolutions' biases: batch norm subtracts each channel's mean
    right after its convolution, so their gradient is zero and its float32 value rounding
    noise, which Adam's first step turns into a step of about the learning rate either way;
    they are held to what Adam can move a weight at all.
    From the second step on the gradients part where a ReLU's input lies within rounding of
    zero: batch norm's backward spreads that unit's change over its channel, and Adam moves
    many weights up to a step apart (measured at the second step: 16-51 % of a convolution
    kernel's entries, 20-67 % of a batch norm's biases; the sequential program's own
    second-step gradients of those layers change by as much as their size when its
    convolutions' biases move by 1e-7, which batch norm cancels).
    So the second step is compared through its records (the loss and its terms, the accuracy,
    to 1e-4: measured within 1e-5, while a seed given another step's augmentation or dropout
    draws moves them by 3-4 %), and the final parameters to Adam's reach."""
    def config(vmap: bool, seeds: str):
        c = configs.build_config("cifar10", "gedl")
        config_lib.set_fields(
            c, data_dir=str(cifar10_dir), seeds=seeds, vmap_seeds=vmap, train_examples=4,
            batch_size=4, num_epochs=2, log_every_steps=1, eval_batch_size=4,
            evaluate_at_end=False, plots=False, ood_datasets=(), checkpoint_interval_seconds=0,
            allow_chance=True, matmul_precision="highest")
        return c

    # The second seed alone runs sequentially (each sequential seed compiles a program of its
    # own, ~20 s on a CPU): were the vmapped second seed given the first one's keys (its
    # augmentation, dropout or initialisation), it would part from its sequential run.
    c = config(False, "4")
    assert c.model == "vgg16" and c.augment   # and VGG16's classifier dropout (0.5)
    sequential = train.run(c, tmp_path / "seq")
    together = train.run(config(True, "3,4"), tmp_path / "vmap")
    def reach(steps: int) -> float:
        return 2 * c.learning_rate * sum(_adam_update_bound(t) for t in range(1, steps + 1))

    assert [r["seed"] for r in together] == [3, 4]
    (seq,), vmr, s = sequential, together[1], 4
    assert seq["seed"] == vmr["seed"] == s and seq["steps"] == vmr["steps"] == 2
    a, b = (saved_state(tmp_path / run / f"seed_{s}", step=1)[0] for run in ("seq", "vmap"))
    for (path, x), y in zip(jax.tree.leaves_with_path(a), jax.tree.leaves(b), strict=True):
        name = jax.tree_util.keystr(path)
        if name.startswith("['params']"):
            np.testing.assert_array_less(np.abs(x - y), reach(1), err_msg=name)
        if not CONV_BIAS.fullmatch(name):
            rounded_apart = ~np.isclose(x, y, rtol=1e-4, atol=1e-5)
            assert rounded_apart.mean() <= 1e-3, (name, rounded_apart.sum())
    ra, rb = _train_records(tmp_path / "seq" / f"seed_{s}"), \
        _train_records(tmp_path / "vmap" / f"seed_{s}")
    assert [r["step"] for r in ra] == [r["step"] for r in rb] == [1, 2]
    for x, y in zip(ra, rb):
        assert x.keys() == y.keys() >= {"loss", "grad_norm", "accuracy"}
        # the second step's gradient norm is that of the parted gradients (docstring)
        parted = {"grad_norm"} if x["step"] > 1 else set()
        for key in x.keys() - {"step", "split", "time"} - parted:
            np.testing.assert_allclose(x[key], y[key], rtol=1e-4, atol=1e-5,
                                       err_msg=f"step {x['step']}: {key}")
    for x, y in zip(leaves(seq["state"].params), leaves(vmr["state"].params), strict=True):
        np.testing.assert_array_less(np.abs(x - y), reach(2))
    # The seeds differ (else "each seed follows its own run" is vacuous), in their batch
    # statistics too.
    other = saved_state(tmp_path / "vmap" / "seed_3", step=1)[0]
    for part in ("params", "model_state"):
        assert not np.allclose(jax.tree.leaves(other[part])[0], jax.tree.leaves(a[part])[0])


def test_workdir_refuses_a_different_config(data_dir, tmp_path, reference):
    c, full = reference
    workdir = tmp_path / "w"
    shutil.copytree(full["workdir"], workdir)   # a run with checkpoints
    before = sorted(p.relative_to(workdir) for p in workdir.rglob("*"))
    changed = c.copy_and_resolve_references()
    changed.learning_rate = 0.1
    with pytest.raises(train.ConfigMismatchError, match="learning_rate"):
        train.train_and_evaluate(changed, workdir)
    assert sorted(p.relative_to(workdir) for p in workdir.rglob("*")) == before
    # A field that does not change the parameters may change on resume.
    same = c.copy_and_resolve_references()
    same.log_every_steps = 1
    assert train.train_and_evaluate(same, workdir)["steps"] == full["steps"]


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


def test_cifar10_vgg_end_to_end_on_tfds_mock_data(tmp_path):
    """CIFAR-10 path (VGG16-bn, on-device augmentation, batch norm) through the TFDS source with
    tfds.testing.mock_data: random images of the right spec, no files, no network."""
    import tensorflow_datasets as tfds

    c = configs.build_config("cifar10", "gedl")
    c.data_source = "tfds"
    c.data_dir = str(tmp_path / "no_data")
    c.cache_dir = str(tmp_path / "cache")
    c.batch_size = 16
    c.num_epochs = 2
    c.log_every_steps = 2
    c.eval_batch_size = 32
    c.plots = False
    c.ood_datasets = ("cifar100",)
    with tfds.testing.mock_data(num_examples=64):
        summary = train.train_and_evaluate(c, tmp_path / "run")
    assert summary["steps"] == 2 * (60 // 16)  # 64 * 0.95 -> 60 train examples, 3 steps/epoch
    results = json.loads((tmp_path / "run" / "eval_results.json").read_text())
    assert results["id"]["num_examples"] == 64
    assert results["ood"]["cifar100"]["num_examples"] == 64
    # Beyond the parameters the state holds finite batch-norm statistics (VGG16-bn).
    state_leaves = leaves(summary["state"])
    assert len(state_leaves) > len(leaves(summary["state"].params))
    assert all(np.all(np.isfinite(x)) for x in state_leaves if x.dtype.kind == "f")
    from gedl_jax import evaluate

    with tfds.testing.mock_data(num_examples=64):
        study = evaluate.corruption_study([tmp_path / "run"], ["snow"], tmp_path / "study")
    assert sorted(study["snow"]["measures"]) == [0, 1, 2, 3, 4, 5]
    assert (tmp_path / "study" / "corruption_snow.png").stat().st_size > 0


def test_workdir_with_the_old_flat_method_settings_resumes_and_restores(tmp_path):
    """A config.json with the flat method fields of before config.method_args (a KL-PN run of
    docs/results): the same run from today's preset resumes (its values are the defaults), a
    changed setting is refused naming method_args, and restored it holds the old values."""
    committed = REPO / "docs" / "results" / "mnist_long" / "runs" / "kl_pn_seed2" / "config.json"
    old = json.loads(committed.read_text())
    assert old["pn_target_form"] == "smoothed" and "method_args" not in old
    (tmp_path / "config.json").write_text(json.dumps(old))
    (tmp_path / "checkpoints" / "last" / "1").mkdir(parents=True)   # a run exists
    fresh = workdir_lib.config_from_saved(old)
    assert json.loads(fresh.method_args)["target_form"] == "smoothed"
    fresh.method_args = ""                                    # the preset's: the defaults
    rundir.check_or_write_config(fresh, tmp_path)            # = the old explicit values
    assert "pn_target_form" not in json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(old))
    fresh.method_args = '{"target_form": "pnet"}'
    with pytest.raises(train.ConfigMismatchError, match="method_args: .*'smoothed'.*'pnet'"):
        rundir.check_or_write_config(fresh, tmp_path)
    restored = workdir_lib.saved_config(tmp_path)
    method = methods.from_config(restored, methods.MethodSetup(10, (5,) * 10, (28, 28, 1)))
    assert (method.target_form, method.target_smoothing, method.ood) == (
        "smoothed", 0.01, "noise_uniform")


def test_workdir_from_before_the_init_field_reads_as_torch_init(tmp_path):
    """A config.json written before `config.init` existed (no "init" key) is a torch-init run: it
    resumes with init="torch", refuses "flax" naming the field, and builds its models."""
    config = configs.build_config("mnist", "gedl")
    config.init = "torch"
    old = json.loads(config.to_json_best_effort())
    del old["init"]
    (tmp_path / "config.json").write_text(json.dumps(old))
    rundir.check_or_write_config(config, tmp_path)             # same run: accepted
    (tmp_path / "config.json").write_text(json.dumps(old))
    (tmp_path / "checkpoints" / "last" / "1").mkdir(parents=True)   # a run exists
    config.init = "flax"
    with pytest.raises(train.ConfigMismatchError, match="init: 'torch' -> 'flax'"):
        rundir.check_or_write_config(config, tmp_path)
    # Restored, it reads as torch-init (config_lib.LEGACY_DEFAULTS, the one place of that
    # default) and builds its models with that init.
    from gedl_jax.run.workdir import saved_config

    restored = saved_config(tmp_path)
    assert restored.init == "torch"
    _, eval_model = methods.build_models(restored)
    assert eval_model.param_init == "torch"
