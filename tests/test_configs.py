"""Configs from anywhere: `--config=<name>[:arg]` finds the packaged config from any directory
(and from a wheel install: bin/check_wheel.sh), `configs/<name>.py` keeps working (from the
repository's root too, where the presets are not copied), a user's own config file works, an
unknown name is one `error:` line with exit 2."""

from __future__ import annotations

import subprocess
import sys

import pytest
from training_fixtures import REPO, subprocess_env

from gedl_jax import configs, configuration

PACKAGED = REPO / "gedl_jax" / "configs"
PRESETS = sorted(p.stem for p in PACKAGED.glob("*.py") if not p.name.startswith("_"))


def test_each_preset_is_written_once():
    """The presets live in gedl_jax/configs/ only: no copy at the repository's top (where they
    were copied before; a copy would need a test to keep it equal)."""
    copies = sorted(name for name in PRESETS if (REPO / "configs" / f"{name}.py").exists())
    assert not copies, f"copies of the packaged presets in configs/: {copies}"


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("arg", ["", ":quick", ":gedl,quick"])
def test_the_documented_path_from_the_repository_root(name, arg, monkeypatch):
    """`--config=configs/<name>.py[:arg]`, the README's form, run where a clone puts you."""
    monkeypatch.chdir(REPO)
    assert configs.resolve(f"configs/{name}.py") == ("file", str(PACKAGED / f"{name}.py"))
    assert configs.load(f"configs/{name}.py{arg}").to_dict() == configuration.build_config(
        name, arg[1:] or None).to_dict()


def test_every_dataset_and_packaged_file_is_a_name():
    names = configs.config_names()
    assert set(configuration.DATASET_DEFAULTS) <= set(names)
    assert set(PRESETS) <= set(names)


@pytest.mark.parametrize("spec", ["mnist:gedl,quick", "configs/mnist.py:gedl,quick"])
def test_name_and_clone_path_give_the_preset_from_any_directory(spec, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # no configs/ here: the packaged file is used
    assert configs.load(spec).to_dict() == configuration.build_config(
        "mnist", "gedl,quick").to_dict()


def test_a_dataset_without_a_file_builds_its_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert configs.resolve("fashion_mnist") == ("dataset", "fashion_mnist")
    assert configs.load("fashion_mnist:edl").to_dict() == configuration.build_config(
        "fashion_mnist", "edl").to_dict()


def test_a_users_file_wins_over_a_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mnist").write_text("from gedl_jax.configuration import build_config\n\n"
                                    "def get_config(arg=None):\n"
                                    "    c = build_config('mnist', arg)\n"
                                    "    c.seed = 7\n    return c\n")
    assert configs.resolve("mnist") == ("file", "mnist")
    assert configs.load("mnist:edl").seed == 7
    mine = tmp_path / "configs" / "mnist.py"   # a local configs/mnist.py is used as it is
    mine.parent.mkdir()
    mine.write_text((tmp_path / "mnist").read_text())
    assert configs.load("configs/mnist.py:gedl").seed == 7


def test_unknown_names_and_missing_files():
    with pytest.raises(ValueError, match=r"unknown config name 'mnst': give one of .*mnist"):
        configs.resolve("mnst")
    assert configs.resolve("elsewhere/nope.py") == ("file", "elsewhere/nope.py")


@pytest.mark.parametrize("args,message", [
    (["--config=mnst"], "error: flag --config=mnst: unknown config name 'mnst'"),
    (["--config=nope.py"], "error: cannot load the config file nope.py"),
    # the name loads (the field check comes after loading):
    (["--config=mnist:gedl,quick", "--config.batch_sise=64"],
     "error: unknown config field 'batch_sise'"),
])
def test_cli_from_an_empty_directory(tmp_path, args, message):
    proc = subprocess.run([sys.executable, "-m", "gedl_jax.train", f"--workdir={tmp_path}/w",
                           *args], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env=subprocess_env(tmp_path / "cache"))
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(message), proc.stderr
    assert "Traceback" not in proc.stderr
