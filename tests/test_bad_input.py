"""Bad input a user can give (config fields, data folders and files, OOD sets, workdirs): a
clear error naming the problem, raised before training starts, and nothing already written is
lost. The table of what was tried is docs/robustness.md. Generated data only."""

import json
import re
import shutil
import subprocess

import jax
import numpy as np
import pytest
from data_fixtures import write_idx, write_npz
from training_fixtures import TINY_FIELDS, checkpoint_steps, write_tiny_mnist

from gedl_jax import config as config_lib
from gedl_jax import configs, data, train
from gedl_jax.run import experiment, steps


@pytest.fixture
def data_dir(tmp_path):
    return write_tiny_mnist(tmp_path / "data", n_train=200, n_test=40)


def config(data_dir, tmp_path, **fields):
    c = configs.build_config("mnist", "gedl")
    for k, v in {**TINY_FIELDS, "train_examples": 64, "val_examples": 32, "num_epochs": 1,
                 "data_dir": str(data_dir), "cache_dir": str(tmp_path / "cache"),
                 **fields}.items():
        config_lib.set_fields(c, **{k: v})
    return c


@pytest.mark.parametrize("fields,message", [
    ({"c_w": float("nan")}, "config.c_w=nan must be a finite number"),
    ({"learning_rate": float("inf")}, "config.learning_rate=inf must be a finite number"),
    ({"num_classes": 1}, "config.num_classes=1 must be >= 2"),
    ({"exp_clip": 0.0}, "config.exp_clip=0.0 must be > 0"),
    ({"checkpoint_every_steps": -1}, "config.checkpoint_every_steps=-1 must be >= 0"),
    ({"seeds": "1,2,1"}, "config.seeds=1,2,1 lists 1 twice"),
    ({"seeds": "0,0"}, "config.seeds=0,0 lists 0 twice"),
    ({"seed": -3}, "config.seed=-3: a seed must be in"),
    ({"seeds": "-1,2"}, "config.seeds=-1,2: a seed must be in"),   # as written, not a tuple
    ({"seeds": "1,01"}, "config.seeds=1,1 lists 1 twice"),
    ({"ood_datasets": "mnist,kmnist"}, "lists 'mnist', the dataset trained on (config.dataset)"),
    ({"ood_datasets": "kmnist,fashion_mnist,kmnist"}, "lists kmnist twice"),
    ({"ood_datasets": "kmnist", "extra_ood": "kmnist"}, "kmnist is in both"),
    ({"model": "vgg16"}, "config.model='vgg16' needs 32x32 RGB input"),
    ({"coordinator_address": "127.0.0.1:1234"}, "config.distributed=False"),
    ({"distributed": True, "coordinator_address": "localhost"}, "must be 'host:port'"),
    ({"distributed": True, "num_processes": 2, "process_id": 2}, "config.process_id=2 must be"),
    ({"distributed": True, "num_processes": 2}, "go together"),
])
def test_bad_config_fields(data_dir, tmp_path, fields, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        config_lib.validate(config(data_dir, tmp_path, **fields))


def test_list_fields_are_echoed_as_written_and_ood_sets_compared_by_real_path(tmp_path,
                                                                              monkeypatch):
    """`--config.seeds=1,x` is named as the user wrote it (it was "('1,x',)", a Python tuple);
    one OOD file or folder under two spellings (`a.npz`, `x/../a.npz`, a link) is one set
    listed twice (the check compared the strings)."""
    with pytest.raises(ValueError) as refused:
        config_lib.as_tuple("seeds", ("1,x",))   # what the command line hands over
    assert str(refused.value).startswith("config.seeds=1,x must be a list of integers")
    (tmp_path / "x").mkdir()
    (tmp_path / "sets").mkdir()
    (tmp_path / "linked").symlink_to(tmp_path / "sets")
    monkeypatch.chdir(tmp_path)
    for fields, message in [
            ({"extra_ood": "npz:a.npz,npz:x/../a.npz"},
             "config.extra_ood=npz:a.npz,npz:x/../a.npz lists npz:x/../a.npz (= npz:a.npz) "
             "twice"),
            ({"extra_ood": f"images:{tmp_path / 'sets'},images:linked"},
             "lists images:linked (= images:"),
            ({"ood_datasets": "kmnist,npz:./a.npz", "extra_ood": "npz:a.npz"},
             "npz:a.npz (= npz:./a.npz) is in both config.ood_datasets and config.extra_ood")]:
        c = configs.build_config("mnist", "gedl")
        config_lib.set_fields(c, **fields)
        with pytest.raises(ValueError, match=re.escape(message)):
            config_lib.validate(config_lib.normalize_lists(c))
    c = configs.build_config("mnist", "gedl")
    config_lib.set_fields(c, extra_ood="npz:a.npz,npz:b.npz")   # two files: two sets
    config_lib.validate(config_lib.normalize_lists(c))


def test_a_workdir_holds_one_run_or_a_seeds_commands_runs_not_both(data_dir, tmp_path):
    """A single run into a seeds command's workdir, or seeds into a single run's: refused
    before anything is written (each writes eval_table.md there)."""
    seeds = tmp_path / "seeds"
    (seeds / "seed_0").mkdir(parents=True)
    (seeds / "seed_0" / "config.json").write_text("{}")
    with pytest.raises(train.ConfigMismatchError, match="holds the runs of a config.seeds "
                                                        r"command \(seed_0\)"):
        train.run(config(data_dir, tmp_path), seeds)
    single = tmp_path / "single"
    single.mkdir()
    (single / "config.json").write_text("{}")
    with pytest.raises(train.ConfigMismatchError, match=r"holds a single run \(config.json\)"):
        train.run(config(data_dir, tmp_path, seeds="0,1"), single)
    assert sorted(p.name for p in seeds.rglob("*")) == ["config.json", "seed_0"]
    assert sorted(p.name for p in single.rglob("*")) == ["config.json"]


def test_num_classes_smaller_than_the_labels(data_dir, tmp_path):
    with pytest.raises(ValueError, match=r"num_classes=5 but mnist/train has labels up to 9"):
        experiment.load_run_data(config(data_dir, tmp_path, num_classes=5))


@pytest.mark.parametrize("field", ["train_examples", "val_examples"])
def test_more_examples_than_the_split_holds(data_dir, tmp_path, field):
    with pytest.raises(ValueError, match=rf"config.{field}=5000 exceeds the \d+ examples"):
        experiment.load_run_data(config(data_dir, tmp_path, **{field: 5000}))


@pytest.mark.parametrize("images,labels,message", [
    (np.zeros((40, 32, 32, 3), np.uint8), np.zeros(40, np.int64),
     r"images are \(32, 32, 3\), expected"),
    (np.zeros((40, 28, 28), np.float32), np.zeros(40, np.int64), "must be N x H x W x C uint8"),
    (np.zeros((40, 28, 28), np.uint8), np.full(40, 12), r"labels span 12\.\.12, expected 0\.\.9"),
    (np.zeros((40, 28, 28), np.uint8), np.zeros(39, np.int64), "'labels' must be 40 integers"),
])
def test_training_files_of_the_wrong_shape_dtype_or_labels(tmp_path, images, labels, message):
    root = write_tiny_mnist(tmp_path / "data", n_train=200, n_test=40)
    write_npz(root / "mnist" / "train.npz", images, labels)
    with pytest.raises(data.DataError, match=message):
        experiment.load_run_data(config(root, tmp_path))


def test_truncated_training_file(tmp_path):
    root = write_tiny_mnist(tmp_path / "data", n_train=200, n_test=40)
    path = root / "mnist" / "train.npz"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(data.CorruptDataError, match="train.npz: cannot read the npz arrays"):
        experiment.load_run_data(config(root, tmp_path))


def test_ood_set_of_another_image_size_fails_before_training(data_dir, tmp_path):
    ood = tmp_path / "ood32"
    write_idx(ood / "t10k-images-idx3-ubyte.gz", np.zeros((10, 32, 32), np.uint8))
    write_idx(ood / "t10k-labels-idx1-ubyte.gz", np.zeros(10, np.uint8))
    with pytest.raises(ValueError, match=r"OOD set .*ood32' has images of shape \(32, 32, 1\), "
                                         r"but the model reads \(28, 28, 1\)"):
        train.train_and_evaluate(config(data_dir, tmp_path, extra_ood=str(ood)), tmp_path / "w")
    assert not (tmp_path / "w").exists()  # nothing started


def test_workdir_that_is_a_file(data_dir, tmp_path):
    path = tmp_path / "a_file"
    path.write_text("keep me")
    with pytest.raises(ValueError, match="is a file, not a folder"):
        train.train_and_evaluate(config(data_dir, tmp_path), path)
    assert path.read_text() == "keep me"


@pytest.mark.parametrize("content,message", [
    ("{not json", "is not a readable config"),
    ("[1, 2]", "is not a readable config"),
    (None, "(?s)another version of gedl-jax.*fields this version does not know \\(old_field\\)"),
])
def test_workdir_config_unreadable_or_from_another_version(data_dir, tmp_path, content,
                                                            message):
    workdir = tmp_path / "w"
    workdir.mkdir()
    c = config(data_dir, tmp_path)
    if content is None:
        written = json.loads(c.to_json_best_effort())
        written["old_field"] = 1
        content = json.dumps(written)
    (workdir / "config.json").write_text(content)
    with pytest.raises(train.ConfigMismatchError, match=message):
        train.train_and_evaluate(c, workdir)
    assert (workdir / "config.json").read_text() == content  # left as it was
    assert sorted(p.name for p in workdir.iterdir()) == ["config.json"]


def test_workdir_from_another_version(data_dir, tmp_path, fast_compile, monkeypatch):
    """A config.json without a field added since (at its default) is accepted; a checkpoint
    whose train state does not fit this version's is refused with a clear error, and kept."""
    workdir = tmp_path / "w"
    c = config(data_dir, tmp_path, checkpoint_every_steps=1)
    train.train_and_evaluate(c, workdir, stop_after_steps=1)
    saved = json.loads((workdir / "config.json").read_text())
    del saved["coordinator_address"]  # a field this version added
    (workdir / "config.json").write_text(json.dumps(saved))
    # This "version" keeps one more leaf in its train state than the one that wrote it.
    original = steps.init_train_state

    def grown(*args, **kwargs):
        state = original(*args, **kwargs)
        return state.replace(model_state={"extra": jax.numpy.zeros(3)})

    monkeypatch.setattr(steps, "init_train_state", grown)
    before = sorted(p.relative_to(workdir) for p in workdir.rglob("*"))
    with pytest.raises(train.ConfigMismatchError,
                       match=r"cannot resume from .*checkpoints/last/1: it does not match"):
        train.train_and_evaluate(c, workdir)
    assert checkpoint_steps(workdir) == [1]
    assert sorted(p.relative_to(workdir) for p in workdir.rglob("*")) == before
    shutil.rmtree(tmp_path / "cache", ignore_errors=True)


@pytest.mark.parametrize("seeds", ["0,0", "1,2,1"])
def test_a_seed_twice_stops_train_run_before_anything(data_dir, tmp_path, seeds):
    with pytest.raises(ValueError, match="twice"):
        train.run(config(data_dir, tmp_path, seeds=seeds), tmp_path / "w")
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("fields", [["--config.seeds=0,0"],
                                    ["--config.seeds=1,2,1", "--config.num_epochs=0"]])
def test_a_seed_twice_on_the_command_line_exits_2_before_any_seed(tmp_path, fields):
    from training_fixtures import REPO, cli_args, subprocess_env

    proc = subprocess.run(cli_args(tmp_path / "w", write_tiny_mnist(tmp_path / "data")) + fields,
                          cwd=REPO, env=subprocess_env(tmp_path / "cache"), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "===" not in proc.stdout and "epoch" not in proc.stdout, proc.stdout
    assert [line for line in proc.stderr.splitlines() if line.startswith("error:")] == [
        proc.stderr.strip().splitlines()[-1]]
    assert not (tmp_path / "w").exists()


def test_distributed_with_nothing_to_detect_is_a_clear_cli_error(tmp_path):
    """Outside SLURM / Open MPI / TPU, `--config.distributed=True` alone cannot find the other
    processes: exit 2 with what to add, no waiting."""
    from training_fixtures import REPO, cli_args, subprocess_env

    env = subprocess_env(tmp_path / "cache")
    for name in [k for k in env if k.startswith(("SLURM_", "OMPI_", "PMI_", "JAX_COORD"))]:
        del env[name]
    proc = subprocess.run(cli_args(tmp_path / "w", tmp_path / "data") + [
        "--config.distributed=True"], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--config.coordinator_address=HOST:PORT" in proc.stderr, proc.stderr
    assert not (tmp_path / "w").exists()
