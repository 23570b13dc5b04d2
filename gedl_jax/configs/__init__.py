"""The preset config files, shipped inside the package so that a config is found by name from
any directory and from a wheel install:

    python -m gedl_jax.train --config=mnist:gedl,quick          # by name, from anywhere
    python -m gedl_jax.train --config=configs/mnist.py:gedl     # the same, the documented form
    python -m gedl_jax.train --config=my_experiment.py:edl      # a user's own config file

Each preset is written once, here (`<name>.py`). The documented form `--config=configs/<name>.py`
names the same file from a clone's root, whose top-level `configs` is a link to this folder
(rule 1), and from any other directory and a wheel install (rule 3).

How `--config=SPEC[:ARG]` is resolved (`resolve`):
1. SPEC is an existing file: that file (as ml_collections always did);
2. SPEC is a name: the packaged `gedl_jax/configs/<name>.py`, else, for a dataset that
   `gedl_jax.config` knows without a config file, `build_config(<name>, ARG)`;
3. SPEC is `configs/<name>.py` and no such file is here (the documented form): the packaged
   file of that name;
4. anything else that looks like a path (a `/` or `.py`) is left to ml_collections, whose
   missing-file error the CLI prints on one line; an unknown name is an error naming the names.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Any

__all__ = ["build_config", "config_names", "define_config_flag", "load", "packaged_file",
           "resolve"]

_HERE = pathlib.Path(__file__).resolve().parent


def build_config(dataset: str, arg: str | None = None) -> Any:
    """The config of `--config=configs/<dataset>.py[:<arg>]`: `gedl_jax.config.build_config`
    with the methods' own `source` recipes (what every config file here calls)."""
    from gedl_jax import config, methods

    return config.build_config(dataset, arg, methods.source_recipes())


def _dataset_names() -> tuple[str, ...]:
    from gedl_jax import config

    return tuple(config.DATASET_DEFAULTS)


def config_names() -> tuple[str, ...]:
    """Every name `--config=<name>[:arg]` accepts: the packaged config files and the datasets
    `gedl_jax.config.DATASET_DEFAULTS` knows, sorted."""
    files = {p.stem for p in _HERE.glob("*.py") if not p.stem.startswith("_")}
    return tuple(sorted(files | set(_dataset_names())))


def packaged_file(name: str) -> pathlib.Path | None:
    """The packaged config file `gedl_jax/configs/<name>.py`, or None when there is none."""
    path = _HERE / f"{name}.py"
    return path if name and not name.startswith("_") and path.is_file() else None


def resolve(spec: str) -> tuple[str, str | None]:
    """`SPEC` of `--config=SPEC[:ARG]` -> ("file", path) to load the config file at `path`, or
    ("dataset", name) to build the dataset's default config without a file (rules in the
    module docstring). Raises ValueError for an unknown name."""
    if pathlib.Path(spec).is_file():
        return "file", spec
    stem = pathlib.PurePath(spec).stem
    looks_like_path = "/" in spec or "\\" in spec or spec.endswith(".py")
    named = spec if not looks_like_path else (
        stem if pathlib.PurePath(spec).parent.name == "configs" and spec.endswith(".py")
        else None)
    if named is not None:
        if (path := packaged_file(named)) is not None:
            return "file", str(path)
        if named in _dataset_names():
            return "dataset", named
    if looks_like_path:
        return "file", spec
    raise ValueError(f"unknown config name {spec!r}: give one of {', '.join(config_names())} "
                     f"(e.g. --config=mnist:gedl,quick) or the path of a config file")


def _checked_config_file(path: str, parse: Callable[[], Any]) -> Any:
    """`parse()` (ml_collections' loading of the config file at `path`) with what can go wrong
    in the user's file as a ValueError that says so (absl reports it as the bad value of
    --config, one line): a folder, Python that does not parse, no `get_config`, a
    `get_config` that raises or returns something other than a ConfigDict. A missing file
    stays ml_collections' deferred error (cli.one_line names it)."""
    import ml_collections

    if pathlib.Path(path).is_dir():
        raise ValueError(f"{path} is a folder: give a config file (a .py file with a "
                         f"get_config()) or a config name ({', '.join(config_names())})")
    _forget_loaded_config_file()
    try:
        config = parse()
    except SyntaxError as e:
        raise ValueError(f"the config file {path} is not valid Python: {e.msg} (line "
                         f"{e.lineno})") from None
    except (ValueError, TypeError):
        raise   # ml_collections wraps them with the traceback; cli.one_line reads the cause
    except Exception as e:  # noqa: BLE001 (the user's get_config may raise anything)
        if isinstance(e, AttributeError) and "get_config" in str(e):
            raise ValueError(f"the config file {path} defines no get_config(): it must return "
                             f"the config (see gedl_jax/configs/mnist.py)") from None
        text = str(e).split("Traceback (most recent call last)")[0].strip() or str(e)
        raise ValueError(f"the config file {path} failed in get_config(): "
                         f"{type(e).__name__}: {' '.join(text.split())[:300]} (--debug shows "
                         f"where)") from e
    if not isinstance(config, ml_collections.ConfigDict) and \
            type(config).__name__ != "_ErrorConfig":   # the deferred error of a missing file
        raise ValueError(f"get_config() of the config file {path} returned "
                         f"{type(config).__name__}, not an ml_collections.ConfigDict")
    return config


def load(spec_and_arg: str) -> Any:
    """The config `--config=SPEC[:ARG]` names, unlocked (what the CLI's parser locks)."""
    spec, _, arg = spec_and_arg.partition(":")
    kind, target = resolve(spec)
    if kind == "dataset":
        return build_config(target, arg or None)
    from ml_collections.config_flags import config_flags

    parser = config_flags.ConfigFileFlagParser(name="config", lock_config=False)
    return _checked_config_file(target, lambda: parser.parse(
        target + (f":{arg}" if arg else "")))


def _forget_loaded_config_file() -> None:
    """ml_collections executes a config file into the module `sys.modules["config_config"]`,
    reusing it: a second file loaded in the same process (a notebook, a script comparing two
    configs) would keep the names the first defined, its get_config included."""
    import sys

    sys.modules.pop("config_config", None)


def define_config_flag(name: str = "config", help_string: str = "") -> Any:
    """`ml_collections.config_flags.DEFINE_config_file(name, ...)` (locked config, `--name.field=`
    overrides) whose value may also be a config name (`resolve`); returns the flag holder."""
    from absl import flags
    from ml_collections.config_flags import config_flags, tuple_parser

    class _ListFieldParser(tuple_parser.TupleParser):
        """The list fields on the command line (`--config.seeds=0,1,2`,
        `--config.ood_datasets=kmnist,npz:far.npz`): text that is not a Python tuple or list
        literal stays one string, which `config.normalize_lists` splits at its commas
        (ml_collections reads it as a Python literal, which `npz:a.npz,b` is not)."""

        def parse(self, argument):
            if isinstance(argument, list):   # a repeated flag: --config.seeds=0 --config.seeds=1
                return tuple(item for a in argument for item in self.parse(a))
            if isinstance(argument, str) and not argument.strip().startswith(("(", "[")):
                return (argument,)
            return super().parse(argument)

    class _Parser(config_flags.ConfigFileFlagParser):
        def parse(self, path):
            spec = path.partition(":")[0]
            kind, target = resolve(spec)   # ValueError: absl reports it as a bad flag value
            if kind == "file":
                return _checked_config_file(target, lambda: super(_Parser, self).parse(
                    target + path[len(spec):]))
            config = load(path)
            config.lock()
            return config

    config_flags.register_flag_parser_for_type(tuple, _ListFieldParser())   # list fields
    holder = config_flags.DEFINE_config_file(name, None, help_string, lock_config=True)
    flags.FLAGS[name].parser = _Parser(name=name, lock_config=True)
    return holder
