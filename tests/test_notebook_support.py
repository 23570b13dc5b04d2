"""gedl_jax.notebook: the smoke switch, the smoke config, the GPU check; data.Split.subset."""

import numpy as np
import pytest

from gedl_jax import config as config_lib
from gedl_jax import configs, data, notebook
from gedl_jax.data import corruptions


@pytest.mark.parametrize("value, expected", [(None, False), ("", False), ("0", False),
                                             ("false", False), ("1", True), ("TRUE", True),
                                             (" yes ", True)])
def test_smoke_mode_reads_the_environment(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv(notebook.SMOKE_ENV, raising=False)
    else:
        monkeypatch.setenv(notebook.SMOKE_ENV, value)
    assert notebook.smoke_mode() is expected


def test_smoke_mode_rejects_an_unclear_value(monkeypatch):
    monkeypatch.setenv(notebook.SMOKE_ENV, "maybe")
    with pytest.raises(ValueError, match="GEDL_NOTEBOOK_SMOKE='maybe'.*set it to 1"):
        notebook.smoke_mode()


@pytest.mark.parametrize("dataset, variant", [("mnist", "gedl"), ("mnist", "iedl"),
                                              ("cifar10", "gedl")])
def test_shrink_gives_a_valid_tiny_config_of_the_same_variant(dataset, variant):
    full = configs.build_config(dataset, variant)
    c = notebook.shrink(configs.build_config(dataset, variant))
    config_lib.validate(c)
    assert c.num_epochs == 1 and c.warmup_epochs == 0
    assert 0 < c.train_examples <= 512 and 0 < c.eval_examples <= 512
    assert c.train_examples // c.batch_size >= 4      # an epoch still has several steps
    # The method itself is untouched: only size fields differ.
    size_fields = {"num_epochs", "warmup_epochs", "train_examples", "val_examples",
                   "eval_examples", "batch_size", "eval_batch_size", "log_every_steps"}
    changed = {k for k in full.keys() if full[k] != c[k]}
    assert changed <= size_fields and "num_epochs" in changed


def test_nvidia_gpu_present_asks_the_driver(tmp_path, monkeypatch):
    monkeypatch.setattr(notebook.shutil, "which", lambda name: None)
    assert not notebook.nvidia_gpu_present(tmp_path)
    gpus = tmp_path / "driver" / "nvidia" / "gpus"
    gpus.mkdir(parents=True)
    assert not notebook.nvidia_gpu_present(tmp_path)      # driver loaded, no GPU listed
    (gpus / "0000:00:04.0").mkdir()
    assert notebook.nvidia_gpu_present(tmp_path)


def test_nvidia_gpu_present_falls_back_to_nvidia_smi(tmp_path, monkeypatch):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: Tesla T4 (UUID: GPU-1234)'\n")
    smi.chmod(0o755)
    monkeypatch.setattr(notebook.shutil, "which", lambda name: str(smi))
    assert notebook.nvidia_gpu_present(tmp_path / "no_proc")
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    assert not notebook.nvidia_gpu_present(tmp_path / "no_proc")


def test_check_accelerator_refuses_a_silent_cpu_fallback():
    with pytest.raises(RuntimeError, match="(?s)NVIDIA GPU but jax .* runs on 'cpu'.*cuda12"):
        notebook.check_accelerator(expect_gpu=True, backend="cpu")
    assert "on gpu" in notebook.check_accelerator(expect_gpu=True, backend="gpu")
    assert "on cpu" in notebook.check_accelerator(expect_gpu=False, backend="cpu")
    # This machine: whatever the driver says, the check agrees with jax (no GPU in CI).
    if not notebook.nvidia_gpu_present():
        assert "device(s)" in notebook.check_accelerator()


def test_split_subset_is_evenly_spaced_like_the_corruption_subsets():
    labels = np.repeat(np.arange(10, dtype=np.int32), 7)          # sorted by label, as CIFAR's
    s = data.Split(np.arange(70 * 4, dtype=np.uint8).reshape(70, 2, 2, 1), labels, "x/test",
                   "arrays")
    assert s.subset(0) is s and s.subset(70) is s and s.subset(99) is s
    sub = s.subset(10)
    assert len(sub) == 10 and sub.name == "x/test" and sub.source == "arrays"
    np.testing.assert_array_equal(sub.labels, np.arange(10))        # every class, once
    np.testing.assert_array_equal(sub.images, s.images[::7])
    for n in (1, 3, 9, 33, 69):
        np.testing.assert_array_equal(s.subset(n).images,
                                      s.images[corruptions.subset_indices(70, n)])
