"""Links planted where gedl-jax writes (a shared runs folder, a run folder unpacked from someone
else's archive): no write goes through one.

Each test plants a symbolic link (or a hard link) to a sentinel file at a name a writer uses,
runs the writer, and checks the sentinel byte for byte. Names written in place (the workdir
lock, metrics.jsonl, TensorBoard's folder, the checkpoint folders, config.json, which a resume
reads back) are refused with one line that says what to remove; files written whole (results,
plots, predictions, model files, tables) go to a new file under a random name, created with
O_EXCL | O_NOFOLLOW, that then replaces the link. The old temporary and probe names, which held
the process id, are planted too: a link there was written through before.
"""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import time

import numpy as np
import pytest
from compile_mode import fast_compilation
from training_fixtures import REPO, cli_args, subprocess_env, write_tiny_mnist

from gedl_jax import config as config_lib
from gedl_jax import configs, files, train
from gedl_jax.run import lock, rundir

SENTINEL = b"the user's own file: never to be written by gedl-jax\n"


def _sentinel(folder: pathlib.Path, name: str = "sentinel") -> pathlib.Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(SENTINEL)
    return path


def _plant(link: pathlib.Path, target: pathlib.Path) -> pathlib.Path:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target)
    return link


def _old_temporary(path: pathlib.Path) -> pathlib.Path:
    """The temporary name `files` used before (predictable: the process id)."""
    return path.with_name(f".{path.stem}.tmp{os.getpid()}{path.suffix}")


def _assert_replaced(path: pathlib.Path) -> None:
    """`path` is now a file of its own (the planted link was replaced, not written through)."""
    assert not path.is_symlink() and path.is_file(), path
    assert path.stat().st_nlink == 1


# ------------------------------------------------------------------------------------ lock
@pytest.mark.parametrize("planted", ["symlink", "hard link", "dangling symlink"])
def test_a_planted_lock_is_refused_naming_what_to_remove(tmp_path, planted):
    sentinel = _sentinel(tmp_path / "user")
    folder = tmp_path / "runs" / "w"
    folder.mkdir(parents=True)
    path = folder / lock.LOCK_NAME
    absent = tmp_path / "user" / "created_by_the_lock"
    if planted == "symlink":
        path.symlink_to(sentinel)
    elif planted == "hard link":
        os.link(sentinel, path)
    else:   # O_CREAT through a dangling link would create a file where it points
        path.symlink_to(absent)
    with pytest.raises(files.PlantedLinkError) as refused:
        with lock.holding(folder):
            pass
    message = str(refused.value)
    assert "\n" not in message and f"Remove it (rm {path}) and rerun" in message, message
    assert sentinel.read_bytes() == SENTINEL and not absent.exists()


def test_the_train_command_refuses_a_planted_lock_with_one_line_and_exit_2(tmp_path):
    sentinel = _sentinel(tmp_path / "user")
    data_dir = write_tiny_mnist(tmp_path / "data")
    workdir = tmp_path / "w"
    _plant(workdir / lock.LOCK_NAME, sentinel)
    proc = subprocess.run(cli_args(workdir, data_dir, num_epochs=1), cwd=REPO,
                          env=subprocess_env(tmp_path / "cache"), capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {workdir / lock.LOCK_NAME} is a symbolic link (to "
                           f"{sentinel})") and "Remove it (rm " in last, proc.stderr
    assert "Traceback" not in proc.stderr and "epoch" not in proc.stdout
    assert sentinel.read_bytes() == SENTINEL


# ---------------------------------------------------------------------------- write probe
def test_the_write_probe_never_writes_through_a_planted_link(tmp_path):
    sentinel = _sentinel(tmp_path / "user")
    folder = tmp_path / "runs"
    _plant(folder / f".gedl_write_check_{os.getpid()}", sentinel)   # the old, predictable name
    files.check_writable(folder)
    files.check_writable(folder / "new" / "run")   # probed in its nearest existing parent
    assert sentinel.read_bytes() == SENTINEL
    assert [p.name for p in folder.iterdir()] == [f".gedl_write_check_{os.getpid()}"]


# ------------------------------------------------------------------------ files written whole
@pytest.mark.parametrize("writer", ["write_text", "write_with"])
def test_a_file_written_whole_replaces_a_planted_link_and_writes_nothing_through_one(
        tmp_path, writer):
    sentinel = _sentinel(tmp_path / "user")
    other = _sentinel(tmp_path / "user", "other")
    target = tmp_path / "out" / "eval_results.json"
    _plant(target, sentinel)
    _plant(_old_temporary(target), other)
    if writer == "write_text":
        files.write_text(target, "{}")
    else:
        files.write_with(target, lambda f: f.write(b"{}"))
    assert sentinel.read_bytes() == SENTINEL and other.read_bytes() == SENTINEL
    _assert_replaced(target)
    assert target.read_text() == "{}"
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask   # not mkstemp's 0600
    assert sorted(p.name for p in target.parent.iterdir()) == sorted(
        [target.name, _old_temporary(target).name])   # no temporary file left


# ---------------------------------------------------------------------- a run's own folder
TINY = {"train_examples": 64, "val_examples": 32, "batch_size": 32, "num_epochs": 1,
        "log_every_steps": 1, "eval_batch_size": 64, "evaluate_at_end": False,
        "plots": False, "ood_datasets": "", "checkpoint_interval_seconds": 0}


def _tiny_config(data_dir: pathlib.Path, cache_dir: pathlib.Path, **fields):
    c = configs.build_config("mnist", "gedl")
    config_lib.set_fields(c, **{**TINY, "data_dir": str(data_dir),
                                   "cache_dir": str(cache_dir), **fields})
    return c


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory):
    return write_tiny_mnist(tmp_path_factory.mktemp("planted_data"), n_train=160, n_test=32)


@pytest.mark.parametrize("name", [
    "config.json", "metrics.jsonl", "tensorboard", "xla_autotune", "checkpoints",
    "checkpoints/last", "checkpoints/best", "checkpoints/last/2", "checkpoints/best/1"])
def test_a_run_refuses_a_link_planted_where_it_writes_in_place(tmp_path, tiny_data, name):
    sentinel = _sentinel(tmp_path / "user")
    workdir = tmp_path / "w"
    _plant(workdir / name, sentinel)
    with fast_compilation(), pytest.raises(files.PlantedLinkError) as refused:
        train.train_and_evaluate(_tiny_config(tiny_data, tmp_path / "cache"), workdir)
    assert f"{workdir / name} is a symbolic link (to {sentinel})" in str(refused.value)
    assert f"Remove it (rm {workdir / name})" in str(refused.value)
    assert sentinel.read_bytes() == SENTINEL


def test_a_checkpoint_folder_linked_to_another_folder_is_refused_and_that_folder_kept(
        tmp_path, tiny_data):
    """Orbax would save into the folder a planted `checkpoints/last` names and delete the
    checkpoints it finds there beyond the two it keeps."""
    elsewhere = tmp_path / "user" / "results"
    for step in (1, 2, 3):
        _sentinel(elsewhere / str(step))
    workdir = tmp_path / "w"
    _plant(workdir / "checkpoints" / "last", elsewhere)
    with fast_compilation(), pytest.raises(files.PlantedLinkError, match="checkpoints/last"):
        train.train_and_evaluate(_tiny_config(tiny_data, tmp_path / "cache"), workdir)
    assert sorted(p.name for p in elsewhere.iterdir()) == ["1", "2", "3"]
    assert all((elsewhere / s / "sentinel").read_bytes() == SENTINEL for s in "123")


def test_metrics_and_tensorboard_files_are_never_opened_through_a_link(tmp_path):
    """metrics.jsonl is appended to only when it is a file of its own; TensorBoard's event file
    gets a random part in its name (tensorboardX names it after the second and the host, which
    anyone can plant links at ahead of time, and opens it with a plain open())."""
    pytest.importorskip("tensorboardX")
    sentinel = _sentinel(tmp_path / "user")
    workdir = tmp_path / "w"
    now = int(time.time())
    for second in range(now - 2, now + 60):   # every name tensorboardX could pick meanwhile
        _plant(workdir / "tensorboard" / f"events.out.tfevents.{second}.{socket.gethostname()}",
               sentinel)
    writer = rundir.MetricsWriter(workdir)
    writer.write(1, "train", {"loss": 1.0})
    writer.close()
    assert sentinel.read_bytes() == SENTINEL
    events = [p for p in (workdir / "tensorboard").iterdir() if not p.is_symlink()]
    assert len(events) == 1 and events[0].stat().st_size > 0
    os.link(sentinel, workdir / "hard_linked")
    (workdir / "metrics.jsonl").unlink()
    os.rename(workdir / "hard_linked", workdir / "metrics.jsonl")
    writer = rundir.MetricsWriter(workdir)
    with pytest.raises(files.PlantedLinkError, match="metrics.jsonl has"):
        writer.write(2, "train", {"loss": 1.0})
    assert sentinel.read_bytes() == SENTINEL


# ------------------------------------------------------------- results, predictions, plots
@pytest.fixture(scope="module")
def finished_run(tiny_data, tmp_path_factory):
    """A tiny run, trained and evaluated (its eval_results.json: what an export reads)."""
    root = tmp_path_factory.mktemp("planted_run")
    with fast_compilation():
        train.train_and_evaluate(_tiny_config(tiny_data, root / "cache",
                                              evaluate_at_end=True), root / "run")
    return root / "run"


RESULT_FILES = ("eval_results.json", "eval_table.md", "predictions.npz",
                "reliability_diagram.png", "smooth_reliability_diagram.png", "hist_mp.png",
                "hist_um.png", "risk_coverage.png")


def test_an_evaluation_replaces_links_planted_at_its_results_and_plots(finished_run, tmp_path):
    from gedl_jax.evaluate import evaluate_workdir

    sentinel = _sentinel(tmp_path / "user")
    out = tmp_path / "out"
    for name in RESULT_FILES:
        _plant(out / name, sentinel)
        _plant(_old_temporary(out / name), sentinel)
    with fast_compilation():
        evaluate_workdir(finished_run, overrides={"plots": True}, results_dir=out)
    assert sentinel.read_bytes() == SENTINEL
    written = [name for name in RESULT_FILES if not (out / name).is_symlink()]
    assert set(written) >= {"eval_results.json", "eval_table.md", "predictions.npz",
                            "reliability_diagram.png", "risk_coverage.png"}, written
    for name in written:
        _assert_replaced(out / name)
    assert np.load(out / "predictions.npz")["test/probs"].shape[0] == 32


def test_an_exported_model_and_its_registry_replace_planted_links(finished_run, tmp_path):
    from gedl_jax.pretrained import export, registry

    sentinel = _sentinel(tmp_path / "user")
    model, reg = tmp_path / "models" / "tiny.msgpack", tmp_path / "models" / "registry.json"
    _plant(model, sentinel)
    _plant(_old_temporary(model), sentinel)
    # (a registry is read before an entry is added: a link at its own name is read through)
    _plant(_old_temporary(reg), sentinel)
    entry = export.export_workdir(finished_run, model)
    registry.write_entry(reg, "tiny/gedl", {**entry, "url": ""})
    assert sentinel.read_bytes() == SENTINEL
    _assert_replaced(model)
    _assert_replaced(reg)


# -------------------------------------------------------------------- data cache, downloads
def test_the_data_cache_and_the_download_lock_never_write_through_a_link(tmp_path,
                                                                        generated_data):
    """The cache entries and verified-file records are written whole (a link planted at one is
    read as a damaged entry, then replaced); a download's lock file is refused as a link."""
    from gedl_jax import data
    from gedl_jax.data import download

    sentinel = _sentinel(tmp_path / "user")
    cache = tmp_path / "cache"
    first = data.load_split("mnist", "test", generated_data, cache_dir=cache, download="never")
    entries = sorted(cache.rglob("*.npz")) + sorted((cache / "verified").glob("*.json"))
    assert any(p.suffix == ".npz" for p in entries) and any(p.suffix == ".json" for p in entries)
    for entry in entries:
        entry.unlink()
        _plant(entry, sentinel)
    again = data.load_split("mnist", "test", generated_data, cache_dir=cache, download="never")
    np.testing.assert_array_equal(again.labels, first.labels)
    assert sentinel.read_bytes() == SENTINEL
    for entry in entries:
        _assert_replaced(entry)
    final = tmp_path / "data" / "mnist" / "t10k-images-idx3-ubyte.gz"
    with download._file_lock(final, cache):   # creates the lock file: then plant one there
        pass
    (lock_file,) = (cache / "locks").iterdir()
    lock_file.unlink()
    _plant(lock_file, sentinel)
    with pytest.raises(files.PlantedLinkError, match="download lock"):
        with download._file_lock(final, cache):
            pass
    assert sentinel.read_bytes() == SENTINEL


# ------------------------------------------------------------------------------ the package
def test_bin_reproduce_replaces_a_link_planted_at_its_plot(tmp_path):
    from bin import reproduce

    sentinel = _sentinel(tmp_path / "user")
    run = {"id": {"accuracy": 0.9, "misclassification": {"mp": {"aupr": 0.95}}}, "ood": {}}
    grouped = {f"gedl_cw{w}": [run, run] for w in (0.5, 1.0)}
    path = _plant(tmp_path / "out" / "sensitivity.png", sentinel)
    reproduce.sensitivity_plot(grouped, path)
    assert sentinel.read_bytes() == SENTINEL
    _assert_replaced(path)


def test_every_writer_of_the_package_and_the_scripts_goes_through_files():
    """No module of gedl_jax and no script of bin/ or tools/ opens a file to write by itself: each
    whole file goes through `files.atomic_file` (or `write_text` / `write_with`), each file written
    in place through `files.open_in_place`. A new writer that opens its file directly fails
    here. (tools/gpu_check.sh's Python writes its own scratch files in its output folder.)"""
    import re

    direct = re.compile(r"open\([^)]*[\"'](w|a|x|wb|ab|xb|w\+|r\+)[\"']|\.write_text\(|"
                        r"\.write_bytes\(|savefig\((path|tmp)|json\.dump\(")
    found = []
    for path in sorted([*(REPO / "gedl_jax").rglob("*.py"), *(REPO / "bin").glob("*.py"),
                        *(REPO / "tools").glob("*.py")]):
        if path.name == "files.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#")[0]
            if direct.search(code) and "files.write_text" not in code:
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert found == [], "\n".join(found)
