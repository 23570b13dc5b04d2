"""Your model, your data, from the command line: a package outside the repository (a Linen CNN,
an NNX CNN, an MLP), `.npz` image and vector datasets and OOD sets, and

    python -m gedl_jax.train --config=configs/custom.py:<preset>,quick
        --config.dataset=npz:D --config.ood_datasets=npz:O --config.model=userpkg.nets:<Name>

trained, preempted (SIGTERM: a checkpoint, exit 75), resumed by the same command, evaluated at
the end, then re-evaluated by `gedl_jax.evaluate` to the same results. One case (GEDL with the
NNX network) in the default suite; the matrix over presets and networks is `slow`. Also
`--config.model=resnet18` for a few CIFAR-10 steps per preset (real data, `slow`).
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest
from own_fixtures import write_image_data, write_user_package, write_vector_data
from training_fixtures import REPO, run_to_end, subprocess_env

from gedl_jax import config as config_lib
from gedl_jax.run import preemption

# 204 training examples (20% validate), batch 32: 6 steps per epoch, 3 epochs.
FIELDS = {"batch_size": 32, "num_epochs": 3, "log_every_steps": 1, "plots": False,
          "eval_batch_size": 64, "allow_chance": True, "learning_rate": 0.01}


@pytest.fixture(scope="module")
def outside(tmp_path_factory):
    """(env with the user package on PYTHONPATH, image data, vector data): all outside REPO."""
    root = tmp_path_factory.mktemp("own")
    write_user_package(root / "pkg")
    env = subprocess_env(root / "cache")
    env["PYTHONPATH"] = os.pathsep.join([str(root / "pkg"), env["PYTHONPATH"]])
    return env, write_image_data(root / "data"), write_vector_data(root / "data")


def _args(preset: str, model: str, dataset: pathlib.Path, ood: pathlib.Path,
          workdir: pathlib.Path, **extra) -> list[str]:
    fields = {**FIELDS, **extra}
    return [sys.executable, "-m", "gedl_jax.train", f"--config=configs/custom.py:{preset},quick",
            f"--config.dataset=npz:{dataset}", f"--config.ood_datasets=npz:{ood}",
            f"--config.model={model}", f"--workdir={workdir}",
            *(f"--config.{k}={v}" for k, v in fields.items())]


def _preempted(args: list[str], env: dict[str, str]) -> str:
    """Start the run, SIGTERM at its first progress line: a checkpoint and exit 75."""
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if " step " in line and line.startswith("epoch 1/"):
                proc.send_signal(signal.SIGTERM)
                break
        out = "".join(lines) + proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == preemption.EXIT_PREEMPTED, out
    return out


def _numbers(results: dict) -> dict:
    """eval_results.json without what differs between two evaluations (timings, paths)."""
    return {k: v for k, v in results.items() if k in ("id", "ood", "num_classes", "results")
            or k.startswith(("accuracy", "aupr", "calibration"))}


def _train_kill_resume_evaluate(env, preset, model, dataset, ood, workdir, **extra):
    args = _args(preset, model, dataset, ood, workdir, **extra)
    _preempted(args, env)
    rerun = run_to_end(args, env)
    assert "resumed from" in rerun.stdout, rerun.stdout
    results = json.loads((workdir / "eval_results.json").read_text())
    saved = json.loads((workdir / "config.json").read_text())
    assert saved["model"] == model and saved["dataset"] == f"npz:{dataset}"
    assert saved["num_classes"] == 3
    again = subprocess.run([args[0], "-m", "gedl_jax.evaluate", f"--workdir={workdir}"],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert again.returncode == 0, again.stdout + again.stderr
    assert _numbers(json.loads((workdir / "eval_results.json").read_text())) == \
        _numbers(results)
    return results


def test_gedl_with_an_nnx_network_on_npz_images(outside, tmp_path):
    env, (images, images_ood), _ = outside
    results = _train_kill_resume_evaluate(env, "gedl", "userpkg.nets:NNXCNN", images,
                                          images_ood, tmp_path / "w")
    assert set(results["ood"]) == {f"npz:{images_ood}"}, results["ood"].keys()


def test_a_network_that_breaks_the_contract_is_one_error_line_exit_2(outside, tmp_path):
    """DUQ reads features; a class without them is refused before anything is written."""
    env, (images, images_ood), _ = outside
    args = _args("duq", "userpkg.nets:NoFeatures", images, images_ood, tmp_path / "w")
    proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "features" in errors[0], proc.stderr
    assert not (tmp_path / "w" / "config.json").exists()


MATRIX = [
    ("gedl", "userpkg.nets:LinenCNN", "images", {}),
    ("edl", "userpkg.nets:NNXCNN", "images", {}),
    ("edl", "userpkg.nets:MLP", "vectors", {}),
    ("duq", "userpkg.nets:LinenCNN", "images", {}),
    ("duq", "userpkg.nets:MLP", "vectors", {}),
    ("postnet", "userpkg.nets:NNXCNN", "images", {}),
    ("postnet", "userpkg.nets:MLP", "vectors", {}),
    ("ensemble", "userpkg.nets:LinenCNN", "images", {"ensemble_size": 2}),
    ("ensemble", "userpkg.nets:MLP", "vectors", {"ensemble_size": 2}),
]


# The default suite runs PostNet on vectors here (a features-and-latent method on (N, D) data)
# beside GEDL with the NNX network above; the rest is `extended` (pytest --run-extended).
DEFAULT_CASES = {("postnet", "userpkg.nets:MLP", "vectors")}


@pytest.mark.slow
@pytest.mark.parametrize("preset, model, kind, extra", [
    pytest.param(*case, marks=[] if case[:3] in DEFAULT_CASES else [pytest.mark.extended],
                 id=f"{case[0]}-{case[1].split(':')[-1]}-{case[2]}") for case in MATRIX])
def test_presets_with_user_networks_on_npz_data(outside, tmp_path, preset, model, kind, extra):
    env, image_files, vector_files = outside
    dataset, ood = image_files if kind == "images" else vector_files
    _train_kill_resume_evaluate(env, preset, model, dataset, ood, tmp_path / "w", **extra)


# --------------------------------------------------------------- resnet18 on CIFAR-10
def _cifar_dir() -> pathlib.Path | None:
    root = os.environ.get("GEDL_DATA_DIR")
    return pathlib.Path(root) if root and (pathlib.Path(root) / "cifar10").is_dir() else None


PRESETS = sorted(v for v in config_lib.VARIANTS if v != "ablation_full")


# ~50-90 s of CPU per preset (ResNet-18's compile dominates): `extended` (pytest
# --run-extended). The default suite covers ResNet-18 in the train step in-process
# (test_networks_resnet.py) and lowers its GEDL steps for CUDA (test_gpu_export.py).
@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.skipif(_cifar_dir() is None, reason="needs GEDL_DATA_DIR with CIFAR-10")
@pytest.mark.parametrize("preset", PRESETS)
def test_resnet18_trains_a_few_cifar10_steps_for_every_preset(tmp_path, preset):
    env = subprocess_env(tmp_path / "cache", GEDL_DATA_DIR=str(_cifar_dir()))
    args = [sys.executable, "-m", "gedl_jax.train", f"--config=configs/cifar10.py:{preset},quick",
            "--config.model=resnet18", f"--workdir={tmp_path / 'w'}",
            f"--config.data_dir={_cifar_dir()}", "--config.train_examples=64",
            "--config.val_examples=32", "--config.eval_examples=32", "--config.batch_size=32",
            "--config.num_epochs=1", "--config.warmup_epochs=0", "--config.ood_datasets=",
            "--config.plots=False", "--config.allow_chance=True", "--config.augment=False",
            "--config.mc_samples=2"]
    refusals = {"mc_dropout": "MC Dropout needs"}   # ResNet-18 has no dropout
    if preset in refusals:   # refused in one line, before any work
        proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert refusals[preset] in proc.stderr
        return
    run_to_end(args, env, timeout=600)
    saved = json.loads((tmp_path / "w" / "config.json").read_text())
    assert saved["model"] == "resnet18"
