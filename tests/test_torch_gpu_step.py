"""studies/torch_gpu_step.py (the PyTorch reference step) and studies/gpu_vs_torch.py.

torch is not a gedl-jax dependency, so the PyTorch script runs in a subprocess under the Python
named by `GEDL_TORCH_PYTHON` (a venv with torch, e.g. `pip install torch==2.13.0 numpy`), or this
Python when it has torch. The tests that need torch skip, saying so, only when neither has it
(CI); the PyTorch-less path of gpu_vs_torch.py runs everywhere.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import evidential_reference as ref
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from studies import gpu_vs_torch
from gedl_jax.evidential import activations, dirichlet, loss, loss_terms, prior, schedules

REPO = pathlib.Path(__file__).resolve().parents[1]
HAS_TORCH_HERE = importlib.util.find_spec("torch") is not None
TORCH_PYTHON = os.environ.get("GEDL_TORCH_PYTHON") or (sys.executable if HAS_TORCH_HERE else None)
needs_torch = pytest.mark.skipif(
    TORCH_PYTHON is None,
    reason="torch is not installed (not a gedl-jax dependency); set GEDL_TORCH_PYTHON to a "
           "Python that has torch to run this test")
K, C_W = 10, 0.5


def run_torch_script(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([TORCH_PYTHON, "-m", "studies.torch_gpu_step", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def logits_and_labels(seed: int = 0, batch: int = 64):
    """float32-representable logits (so the float32 trainer loss sees the same inputs), with
    rows of no evidence and of one confident class. |logit| <= 15: PyTorch's softplus returns x
    itself above 20 (an error of exp(-20) ~ 2e-9, below float32's resolution there)."""
    rng = np.random.default_rng(seed)
    logits = np.clip(rng.normal(0.0, 4.0, (batch, K)), -15, 15)
    logits[0] = -15.0
    logits[1] = -15.0
    logits[1, 3] = 15.0
    labels = rng.integers(0, K, batch)
    labels[1] = 3
    return logits.astype(np.float32).astype(np.float64), labels


def scipy_gedl_loss(logits, labels):
    """GEDL's per-sample objective in float64 from scipy's digamma / loggamma (closed forms)."""
    evidence = np.logaddexp(0.0, logits)
    total = evidence.sum(-1)
    w = (K + C_W * K * total) / (1 + K * total)
    prior_alpha = np.broadcast_to((w / K)[:, None], evidence.shape)
    alpha = evidence + prior_alpha
    return ref.expected_nll(alpha, labels) + ref.kl(alpha, prior_alpha)


def gedl_jax_loss_float64(logits, labels):
    """gedl_jax's evidential functions composed as GEDL's loss (KL weight 1), in float64."""
    with jax.enable_x64(True):
        evidence = activations.evidence_from_logits(jnp.asarray(logits), "softplus")
        w = prior.adaptive_prior_strength(evidence, C_W)
        alpha = prior.dirichlet_alpha(evidence, w, prior.uniform_base_rate(K, jnp.float64))
        prior_alpha = w[:, None] * prior.uniform_base_rate(K, jnp.float64)[None]
        assert alpha.dtype == jnp.float64
        return np.asarray(loss_terms.expected_nll(alpha, jnp.asarray(labels))
                          + dirichlet.dirichlet_kl(alpha, prior_alpha))


def trainer_gedl_loss(logits, labels):
    """The trainer's per-example loss of the GEDL spec with a constant KL weight 1 (float32)."""
    spec = loss.LossSpec(num_classes=K, kl_schedule="constant", kl_weight=1.0)
    loss_B, _, _ = loss.per_example_loss(spec, jnp.asarray(logits, jnp.float32),
                                         jnp.asarray(labels), schedules.tau_init(),
                                         jnp.int32(0))
    return np.asarray(loss_B, np.float64)


@needs_torch
def test_torch_loss_is_gedls_objective(tmp_path):
    logits, labels = logits_and_labels()
    np.savez(tmp_path / "inputs.npz", logits=logits, labels=labels)
    done = run_torch_script(f"--loss_check={tmp_path / 'inputs.npz'}")
    assert done.returncode == 0, done.stderr
    torch_loss = np.asarray(json.loads(done.stdout)["loss_per_sample"])
    # The formula itself: scipy's float64 closed forms agree to rounding.
    np.testing.assert_allclose(torch_loss, scipy_gedl_loss(logits, labels), rtol=1e-12,
                               atol=1e-10)
    # gedl_jax's functions: their series and quadratures are built for float32 and carry
    # ~1e-9 relative error in float64, so that is the agreement to ask of them.
    np.testing.assert_allclose(torch_loss, gedl_jax_loss_float64(logits, labels), rtol=1e-8)
    # The trainer's loss (LossSpec of GEDL, constant KL weight 1), which computes in float32.
    np.testing.assert_allclose(torch_loss, trainer_gedl_loss(logits, labels), rtol=2e-5,
                               atol=1e-5)


@needs_torch
def test_torch_dry_run_writes_eager_results_and_the_reason_for_each_skip(tmp_path):
    out = tmp_path / "torch.json"
    done = run_torch_script("--dry_run", "--models=convnet", "--dtypes=float32",
                            f"--out={out}", timeout=300)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    written = json.loads(out.read_text())
    assert written["results"] == lines
    assert written["environment"]["float32_matmul_precision"] == "high"   # --tf32=on default
    by_mode = {r["mode"]: r for r in lines}
    assert set(by_mode) == {"eager", "compile", "cudagraphs"}
    assert by_mode["eager"]["batch"] == 8 and by_mode["eager"]["images_per_s"] > 0
    if written["environment"]["platform"] == "cpu":
        assert by_mode["cudagraphs"]["skipped"] == "cudagraphs needs a CUDA device"
        assert "dry run" in by_mode["compile"]["skipped"]


@needs_torch
def test_torch_script_rejects_an_unknown_model_with_one_error_line():
    done = run_torch_script("--models=resnet")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: --models: resnet is not one of convnet, vgg16"]


def test_table_takes_the_ratio_to_the_best_torch_mode_under_the_same_arithmetic():
    # Our float32 step timed under both precisions (the bench part of tools/gpu_check.sh): the
    # ratio takes the row with PyTorch's arithmetic, TF32 beside TF32 (an H100 check once
    # compared our true-float32 row with PyTorch's TF32), whichever row comes last.
    base = {"model": "convnet", "batch": 128, "dtype": "float32"}
    jax_out = {"environment": {"device": "H100", "platform": "gpu", "jax": "0.12"},
               "results": [{**base, "precision": "default", "arithmetic": "tf32",
                            "images_per_s": 300.0},
                           {**base, "precision": "highest", "arithmetic": "float32",
                            "images_per_s": 240.0}]}
    torch_out = {"environment": {"device": "H100", "torch": "2.13.0", "tf32": "on"},
                 "results": [{**base, "mode": "eager", "images_per_s": 100.0},
                             {**base, "mode": "compile", "images_per_s": 150.0},
                             {**base, "mode": "cudagraphs", "error": "RuntimeError()"}]}
    table = gpu_vs_torch.vs_torch_table(jax_out, torch_out, None)
    assert "| convnet | 128 | float32 | 300 (tf32) | 100 | 150 | failed | 2.00 |" in table
    torch_off = {**torch_out, "environment": {**torch_out["environment"], "tf32": "off"}}
    table = gpu_vs_torch.vs_torch_table(jax_out, torch_off, None)
    assert "| convnet | 128 | float32 | 240 (float32) | 100 | 150 | failed | 1.60 |" in table
    missing = gpu_vs_torch.vs_torch_table(jax_out, None, "python cannot import torch")
    assert ("| convnet | 128 | float32 | 300 (tf32) | not measured | not measured | "
            "not measured | n/a |") in missing
    assert "PyTorch: not measured (python cannot import torch)" in missing


def test_table_only_rewrites_the_table_from_the_folders_json(tmp_path):
    base = {"model": "convnet", "batch": 8, "dtype": "float32"}
    (tmp_path / "jax.json").write_text(json.dumps(
        {"environment": {}, "results": [{**base, "arithmetic": "tf32", "images_per_s": 30.0}]}))
    (tmp_path / "torch.json").write_text(json.dumps(
        {"environment": {"tf32": "on"}, "results": [{**base, "mode": "eager",
                                                     "images_per_s": 20.0}]}))
    assert gpu_vs_torch.main([f"--out={tmp_path}", "--table_only"]) == 0
    table = (tmp_path / "vs_torch.md").read_text()
    assert "| convnet | 8 | float32 | 30 (tf32) | 20 | not measured | not measured | 1.50 |" \
        in table


@pytest.mark.skipif(HAS_TORCH_HERE, reason="this Python has torch; the test is of the path "
                                           "without it")
def test_gpu_vs_torch_dry_run_without_torch_writes_our_numbers(tmp_path):
    done = subprocess.run([sys.executable, "-m", "studies.gpu_vs_torch", "--dry_run",
                           f"--torch_python={sys.executable}", f"--out={tmp_path}"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "torch column not measured: " in done.stdout
    jax_rows = json.loads((tmp_path / "jax.json").read_text())["results"]
    assert [(r["model"], r["batch"], r["dtype"]) for r in jax_rows] == [("convnet", 8, "float32")]
    table = (tmp_path / "vs_torch.md").read_text()
    ours = f"{jax_rows[0]['images_per_s']:,.0f} ({jax_rows[0]['arithmetic']})"
    assert (f"| convnet | 8 | float32 | {ours} | not measured | not measured | not measured | "
            "n/a |") in table
    assert not (tmp_path / "torch.json").exists()


@needs_torch
def test_gpu_vs_torch_dry_run_with_torch_fills_the_eager_column(tmp_path):
    done = subprocess.run([sys.executable, "-m", "studies.gpu_vs_torch", "--dry_run",
                           f"--torch_python={TORCH_PYTHON}", f"--out={tmp_path}"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    ours = json.loads((tmp_path / "jax.json").read_text())["results"][0]
    torch_rows = json.loads((tmp_path / "torch.json").read_text())["results"]
    assert [(r["model"], r["batch"], r["dtype"]) for r in torch_rows] == \
        [("convnet", 8, "float32")] * 3
    eager = next(r for r in torch_rows if r["mode"] == "eager")["images_per_s"]
    row = next(line for line in (tmp_path / "vs_torch.md").read_text().splitlines()
               if line.startswith("| convnet | 8 | float32 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3:5] == [f"{ours['images_per_s']:,.0f} ({ours['arithmetic']})", f"{eager:,.0f}"]
    if torch_rows[0]["platform"] == "cpu":   # compile and cudagraphs are skipped on the CPU
        assert cells[5:] == ["skipped", "skipped", f"{ours['images_per_s'] / eager:.2f}"]
