"""Configs from anywhere: `--config=<name>[:arg]` finds the packaged config from any directory
(and from a wheel install: tools/check_wheel.sh), `configs/<name>.py` works from the repository's
root (where `configs` is the package's own folder, a link: the presets are not copied) and from
anywhere else, a user's own config file works, an unknown name is one `error:` line with exit 2."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
from training_fixtures import REPO, subprocess_env

from gedl_jax import config as config_lib
from gedl_jax import configs

PACKAGED = REPO / "gedl_jax" / "configs"
PRESETS = sorted(p.stem for p in PACKAGED.glob("*.py") if not p.name.startswith("_"))


def test_each_preset_is_written_once():
    """The presets live in gedl_jax/configs/ only. The repository's top-level configs/ is that
    folder itself (a relative link; a clone's, not the sdist's), no copy (a copy would need a
    test to keep it equal)."""
    top = REPO / "configs"
    if top.exists() or top.is_symlink():
        assert top.is_symlink() and top.readlink() == pathlib.Path("gedl_jax", "configs"), \
            "configs/ must be the link to gedl_jax/configs, not a folder of copies"
        assert top.resolve() == PACKAGED.resolve()


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.parametrize("arg", ["", ":quick", ":gedl,quick"])
def test_the_documented_path_from_the_repository_root(name, arg, monkeypatch):
    """`--config=configs/<name>.py[:arg]`, the README's form, run where a clone puts you: the
    packaged file (through the top-level link; in the sdist, which has no link, by name)."""
    monkeypatch.chdir(REPO)
    kind, path = configs.resolve(f"configs/{name}.py")
    assert kind == "file" and pathlib.Path(path).resolve() == (PACKAGED / f"{name}.py").resolve()
    assert configs.load(f"configs/{name}.py{arg}").to_dict() == configs.build_config(
        name, arg[1:] or None).to_dict()


def test_every_dataset_and_packaged_file_is_a_name():
    names = configs.config_names()
    assert set(config_lib.DATASET_DEFAULTS) <= set(names)
    assert set(PRESETS) <= set(names)


@pytest.mark.parametrize("spec", ["mnist:gedl,quick", "configs/mnist.py:gedl,quick"])
def test_name_and_clone_path_give_the_preset_from_any_directory(spec, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)   # no configs/ here: the packaged file is used
    assert configs.load(spec).to_dict() == configs.build_config(
        "mnist", "gedl,quick").to_dict()


def test_a_dataset_without_a_file_builds_its_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert configs.resolve("fashion_mnist") == ("dataset", "fashion_mnist")
    assert configs.load("fashion_mnist:edl").to_dict() == configs.build_config(
        "fashion_mnist", "edl").to_dict()


def test_a_users_file_wins_over_a_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mnist").write_text("from gedl_jax.configs import build_config\n\n"
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


@pytest.mark.parametrize("text,message", [
    (None, r"is a folder: give a config file \(a \.py file with a get_config\(\)\) or a config "
           r"name \(cifar10, .*mnist"),
    ("def get_config(:\n", r"is not valid Python: invalid syntax \(line 1\)"),
    ("x = 1\n", r"defines no get_config\(\): it must return the config"),
    ("def get_config():\n    raise RuntimeError('boom')\n",
     r"failed in get_config\(\): RuntimeError: boom \(--debug shows where\)"),
    ("def get_config():\n    return 5\n",
     r"get_config\(\) of the config file .* returned int, not an ml_collections\.ConfigDict"),
])
def test_what_is_wrong_in_a_users_config_file_is_said(tmp_path, text, message):
    """ml_collections defers some of these to the config's first use, where they read as a
    crash (a traceback, exit 1) or as an unknown field named 'module'."""
    from ml_collections.config_flags import config_flags

    path = tmp_path / "folder" if text is None else tmp_path / "mine.py"
    path.mkdir() if text is None else path.write_text(text)
    with pytest.raises(ValueError, match=message):
        configs._checked_config_file(
            str(path), lambda: config_flags.ConfigFileFlagParser("config").parse(str(path)))
    good = tmp_path / "good.py"
    good.write_text("from gedl_jax.configs import build_config\n\n"
                    "def get_config(arg=None):\n    return build_config('mnist', arg)\n")
    loaded = configs._checked_config_file(
        str(good), lambda: config_flags.ConfigFileFlagParser("config").parse(f"{good}:edl"))
    assert loaded.variant == "edl"


def test_a_second_config_file_in_one_process_keeps_nothing_of_the_first(tmp_path):
    """ml_collections runs every config file in one module object: a file without get_config
    loaded after one with it got the first file's config."""
    first, second = tmp_path / "first.py", tmp_path / "second.py"
    first.write_text("from gedl_jax.configs import build_config\n\n"
                     "def get_config(arg=None):\n    return build_config('mnist', arg)\n")
    second.write_text("x = 1\n")
    assert configs.load(f"{first}:edl").variant == "edl"
    with pytest.raises(ValueError, match=r"defines no get_config\(\)"):
        configs.load(str(second))


def test_an_unknown_nested_field_is_named():
    import ml_collections

    from gedl_jax.commands import cli

    with pytest.raises(KeyError) as raised:   # what --config.foo.bar=1 meets
        ml_collections.ConfigDict({"seed": 0})["foo"]
    assert cli.one_line(raised.value) == (
        "unknown config field 'foo'; `python -m gedl_jax.train --helpfull` lists every field "
        "with its default and doc")
    assert "config field" not in cli.one_line(KeyError("foo"))   # a KeyError of other code


@pytest.mark.parametrize("args,message", [
    (["--config=mnst"], "error: flag --config=mnst: unknown config name 'mnst'"),
    (["--config=/"], "error: flag --config=/: / is a folder: give a config file"),
    (["--config=mnist", "--config.foo.bar=1"], "error: unknown config field 'foo'"),
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
