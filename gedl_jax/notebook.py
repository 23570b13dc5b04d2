"""What the notebooks in notebooks/ share: the smoke setting CI runs them in, and the check
that jax really uses the GPU a runtime has (a silent CPU fallback is the classic Colab failure).

    from gedl_jax import notebook
    print(notebook.check_accelerator())   # raises if there is an NVIDIA GPU but jax runs on CPU
    config = configs.build_config("mnist", "gedl")
    if notebook.smoke_mode():
        notebook.shrink(config)

``GEDL_NOTEBOOK_SMOKE=1`` selects the smoke setting: each notebook then runs top to bottom on a
CPU in a minute or two (tiny subsets, one epoch) and skips its install cell.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import jax
import ml_collections

from gedl_jax import config as config_lib
from gedl_jax import configs

SMOKE_ENV = "GEDL_NOTEBOOK_SMOKE"

# The smoke setting: enough to execute every code path of a notebook (train, checkpoint,
# evaluate, plot), not to learn anything. Per dataset family: examples used for training,
# validation, and for each evaluation set (test, OOD, corrupted).
SMOKE_EXAMPLES: dict[str, dict[str, int]] = {
    "mnist": dict(train_examples=512, val_examples=256, eval_examples=512),
    "cifar": dict(train_examples=256, val_examples=128, eval_examples=256),
}


def smoke_mode() -> bool:
    """True when ``GEDL_NOTEBOOK_SMOKE`` is set to 1/true/yes (unset, 0/false/no: False)."""
    value = os.environ.get(SMOKE_ENV, "").strip().lower()
    if value in ("", "0", "false", "no"):
        return False
    if value in ("1", "true", "yes"):
        return True
    raise ValueError(f"{SMOKE_ENV}={os.environ[SMOKE_ENV]!r} is not understood; set it to 1 "
                     f"(smoke setting) or 0 / leave it unset (full setting)")


def shrink(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Turn `config` (in place, and returned) into the smoke setting: one epoch on a few hundred
    examples, every evaluation set cut to a few hundred evenly spaced examples, small batches (so an
    epoch still has several steps), no warm-up."""
    family = "mnist" if config.dataset in ("mnist", "fashion_mnist") else "cifar"
    if not config_lib.is_custom_dataset(config.dataset):   # your own data: all of it
        for key, value in SMOKE_EXAMPLES[family].items():
            config_lib.set_fields(config, **{key: value})
    config.num_epochs = 1
    config.warmup_epochs = 0
    config.batch_size = 64
    config.eval_batch_size = 256
    config.log_every_steps = 2
    return config


def nvidia_gpu_present(proc_root: str | os.PathLike = "/proc") -> bool:
    """Whether this machine has an NVIDIA GPU, asked of the driver, not of jax: the kernel
    driver lists each GPU under /proc/driver/nvidia/gpus; else `nvidia-smi -L` names them."""
    gpus = pathlib.Path(proc_root) / "driver" / "nvidia" / "gpus"
    if gpus.is_dir() and any(gpus.iterdir()):
        return True
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def check_accelerator(expect_gpu: bool | None = None, backend: str | None = None) -> str:
    """Raise RuntimeError if the runtime has an NVIDIA GPU but jax does not use it; else
    return a one-line description of what jax runs on.

    Args:
      expect_gpu: whether a GPU must be used; None asks the driver (`nvidia_gpu_present`).
      backend: jax's default backend; None asks jax (a parameter for tests).
    """
    expect_gpu = nvidia_gpu_present() if expect_gpu is None else expect_gpu
    backend = jax.default_backend() if backend is None else backend
    if expect_gpu and backend != "gpu":
        raise RuntimeError(
            f"This runtime has an NVIDIA GPU but jax {jax.__version__} runs on {backend!r}: "
            f"reinstall with the CUDA extra, restart the runtime and run the notebook again:\n"
            f"  pip install 'gedl-jax[cuda12] @ git+<repository URL>'   ([cuda13] for a CUDA 13 "
            f"driver)\n"
            f"  (its CUDA plugin is missing or does not match jax, e.g. a preinstalled "
            f"jax-cuda12-plugin beside a newer jax)")
    devices = jax.devices() if backend == jax.default_backend() else []
    kinds = sorted({d.device_kind for d in devices}) or [backend]
    return f"jax {jax.__version__} on {backend}: {len(devices)} device(s) ({', '.join(kinds)})"



def experiment_config(dataset: str, variant: str = "gedl", *, num_epochs: int, seed: int = 0,
                      data_dir: str | os.PathLike = "", smoke: bool | None = None,
                      **overrides) -> ml_collections.ConfigDict:
    """`configs.build_config(dataset, variant)` (what --config=configs/<dataset>.py:<variant>
    builds) with the given epochs, seed, data folder and field overrides, shrunk to the smoke
    setting when `smoke` (None: `smoke_mode()`). Validated."""
    config = configs.build_config(dataset, variant)
    config.num_epochs = num_epochs
    config.seed = seed
    config.data_dir = str(data_dir)
    for key, value in overrides.items():
        if key not in config:
            raise ValueError(f"config has no field {key!r}; `python -m gedl_jax.train "
                             f"--helpfull` lists them")
        config_lib.set_fields(config, **{key: value})
    if smoke_mode() if smoke is None else smoke:
        shrink(config)
    config_lib.validate(config)
    return config
