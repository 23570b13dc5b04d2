"""Tiny generated MNIST-format data and CLI helpers for tests of the training mechanics
(preemption, kill-and-resume, multi-process): no real data, seconds per run.

The data are `<root>/mnist/{train,test}.npz` (decoded arrays, which the loader accepts without a
registered checksum, with a warning), with a learnable signal: class k lights up row block k, so
a few steps of training move the accuracy and the parameters measurably.
"""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest
from data_fixtures import write_npz

REPO = pathlib.Path(__file__).resolve().parents[1]
# The studies' committed results: a clone has them, the sdist does not ship them (MANIFEST.in).
needs_committed_results = pytest.mark.skipif(
    not (REPO / "docs" / "results").is_dir(),
    reason="compares with the studies' committed results in docs/results, which a clone has and "
           "the sdist does not ship")


def write_tiny_mnist(root: pathlib.Path, n_train: int = 320, n_test: int = 64,
                     seed: int = 0) -> pathlib.Path:
    """Writes root/mnist/{train,test}.npz; returns root (the data_dir)."""
    rng = np.random.default_rng(seed)
    for split, n in (("train", n_train), ("test", n_test)):
        labels = (np.arange(n) % 10).astype(np.uint8)
        rng.shuffle(labels)
        images = rng.integers(0, 96, size=(n, 28, 28), dtype=np.uint8)
        for k in range(10):
            images[labels == k, 2 * k + 4: 2 * k + 6, 4:24] = 255
        write_npz(root / "mnist" / f"{split}.npz", images, labels)
    return root


# Every run of a test uses these: tiny, no OOD sets, no plots (matplotlib import is slow).
# checkpoint_interval_seconds=0: the tests of what a checkpoint keeps save at every epoch end of
# their sub-second runs (the interval itself: tests/test_checkpoint_interval.py).
TINY_FIELDS = {
    "train_examples": 256, "val_examples": 64, "batch_size": 32, "num_epochs": 2,
    "log_every_steps": 4, "eval_batch_size": 64, "evaluate_at_end": False, "plots": False,
    "ood_datasets": "", "checkpoint_interval_seconds": 0,
}


def cli_args(workdir: pathlib.Path, data_dir: pathlib.Path, variant: str = "gedl",
             **fields) -> list[str]:
    """The training command line for a tiny run (fields override TINY_FIELDS)."""
    merged = {**TINY_FIELDS, **fields}
    return [sys.executable, "-m", "gedl_jax.train", f"--config=configs/mnist.py:{variant}",
            f"--workdir={workdir}", f"--config.data_dir={data_dir}",
            *(f"--config.{k}={v}" for k, v in merged.items())]


def subprocess_env(cache_dir: pathlib.Path, devices: int = 1, cpu: bool = False,
                   **extra: str) -> dict[str, str]:
    """Environment of a training subprocess: offline, a private cache, fast compiles; on the
    test process's own platform with one device, so its results compare with an in-process
    run bit for bit (on a GPU: the caller's XLA_FLAGS, deterministic kernels included, and no
    preallocation beside the test process); `devices` > 1 or `cpu`: that many CPU devices."""
    import jax

    env = dict(os.environ)
    kept = [f for f in os.environ.get("XLA_FLAGS", "").split()
            if not f.startswith("--xla_force_host_platform_device_count")]
    if cpu or devices > 1 or jax.default_backend() == "cpu":
        env["JAX_PLATFORMS"] = "cpu"
        kept.append(f"--xla_force_host_platform_device_count={devices}")
    else:
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    env.update({
        "XLA_FLAGS": " ".join(kept),
        "GEDL_OFFLINE": "1",
        "GEDL_CACHE_DIR": str(cache_dir),
        "JAX_DISABLE_MOST_OPTIMIZATIONS": "1",
        # the repository first; what the caller had on PYTHONPATH (packages installed with
        # --target, say) stays reachable
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "PYTHONWARNINGS": "ignore",
    })
    env.pop("GEDL_DATA_DIR", None)
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_to_end(args: list[str], env: dict[str, str], timeout: float = 240
               ) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def checkpoint_steps(workdir: pathlib.Path, kind: str = "last") -> list[int]:
    folder = workdir / "checkpoints" / kind
    if not folder.exists():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def saved_state(workdir: pathlib.Path, kind: str = "last", step: int | None = None
                ) -> tuple[dict, dict]:
    """(state as nested dict of numpy arrays, meta) of a checkpoint, read without the model."""
    import jax
    import orbax.checkpoint as ocp

    folder = (workdir / "checkpoints" / kind).absolute()
    manager = ocp.CheckpointManager(folder)
    step = manager.latest_step() if step is None else step
    # Onto this process's first device, whatever devices wrote it.
    on_device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    metadata = ocp.StandardCheckpointer().metadata(folder / str(step) / "state")
    tree = getattr(metadata, "item_metadata", metadata)
    tree = getattr(tree, "tree", tree)
    abstract = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype,
                                                           sharding=on_device), tree)
    restored = manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
    manager.close()
    return jax.tree.map(np.asarray, restored["state"]), restored["meta"]


def assert_same_tree(a, b) -> None:
    import jax

    la, lb = jax.tree.leaves_with_path(a), jax.tree.leaves_with_path(b)
    assert [p for p, _ in la] == [p for p, _ in lb]
    for (path, x), (_, y) in zip(la, lb):
        np.testing.assert_array_equal(x, y, err_msg=jax.tree_util.keystr(path))
