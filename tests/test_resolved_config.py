"""One resolved config per run (`config.resolve`, through `run.experiment.resolve_config`):
resolved where a run starts and where a workdir is restored, read-only below, and nothing below
the entry point calls back into the config package to parse, normalise, validate or resolve it.
Following `method_args` to its method, the JSON is parsed once and the method's settings are
resolved once: `resolve` keeps them on the config (`method_settings`), which the method reads."""

from __future__ import annotations

import collections
import functools
import inspect
import sys

import pytest
from training_fixtures import write_tiny_mnist

from gedl_jax import config as config_lib
from gedl_jax import configs, methods, train
from gedl_jax.config import resolution as resolve_lib
from gedl_jax.config import checks as validate_lib
from gedl_jax.config import values
from gedl_jax.methods.base import Method
from gedl_jax.run import experiment
from gedl_jax.run import workdir as workdir_eval

# The config package's modules whose functions are counted, and the functions that parse,
# normalise, resolve or check a config.
MODULES = (values, validate_lib, resolve_lib)
RESOLVING = ("resolve", "check", "normalize_lists", "parse_list", "as_tuple", "set_fields",
             "parse_seeds", "json_object", "prior_strength")
PACKAGE = "gedl_jax.config"


@pytest.fixture
def calls(monkeypatch):
    """Every call of a function of the config package's modules, and of a method's
    `resolved_settings`, as {(name, "outside" | "inside"): count}: "outside" when the caller is
    not in the config package (a walk down into it)."""
    counted: collections.Counter = collections.Counter()
    for module in MODULES:
        for name, function in list(vars(module).items()):
            if inspect.isfunction(function) and function.__module__ == module.__name__:
                wrapped = _counting(function, name, counted)
                for other in (*MODULES, config_lib):   # wherever the name was imported to
                    if getattr(other, name, None) is function:
                        monkeypatch.setattr(other, name, wrapped)
    settings = Method.resolved_settings.__func__
    monkeypatch.setattr(Method, "resolved_settings",
                        classmethod(_counting(settings, "resolved_settings", counted)))
    return counted


def _counting(function, name, counted):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        caller = sys._getframe(1).f_globals.get("__name__", "")
        counted[name, "inside" if caller.startswith(PACKAGE) else "outside"] += 1
        return function(*args, **kwargs)
    return wrapper


def _total(calls, name):
    return calls[name, "inside"] + calls[name, "outside"]


def _tiny_config(tmp_path, preset="gedl", **fields):
    data_dir = write_tiny_mnist(tmp_path / "data")
    write_tiny_mnist(tmp_path / "other", seed=1)
    (tmp_path / "other" / "mnist").rename(data_dir / "fashion_mnist")   # a tiny OOD set
    c = configs.build_config("mnist", preset)
    config_lib.set_fields(c, train_examples=64, val_examples=32, batch_size=32,
                          num_epochs=1, eval_batch_size=64, evaluate_at_end=True,
                          plots=False, ood_datasets="fashion_mnist", data_dir=str(data_dir),
                          cache_dir=str(tmp_path / "cache"), allow_chance=True, **fields)
    c.seeds = ("0,1",)   # as the command line passes --config.seeds=0,1 on
    return c


def test_a_run_parses_method_args_and_resolves_its_settings_once(tmp_path, fast_compile,
                                                                  calls):
    """DUQ with `method_args`, two seeds, trained and evaluated: the JSON is parsed once, the
    method's settings resolved once (the seeds' copies keep both), the config resolved and
    checked once, and a restored workdir resolves its saved config once."""
    c = _tiny_config(tmp_path, "duq", method_args='{"length_scale": 0.2}')
    given = c.to_json_best_effort()
    calls.clear()
    results = train.run(c, tmp_path / "w")
    assert [r["seed"] for r in results] == [0, 1] and all("evaluation" in r for r in results)
    resolving = {name: n for (name, where), n in calls.items()
                 if where == "outside" and name in RESOLVING}
    assert resolving == {"resolve": 1, "parse_seeds": 1}   # at the entry point, nowhere below
    assert _total(calls, "json_object") == 2   # method_args and model_kwargs, once each
    assert _total(calls, "resolved_settings") == 1
    assert _total(calls, "check") == 1             # the per-seed copies are not checked again
    assert _total(calls, "normalize_lists") == 1
    assert _total(calls, "parse_list") == 0
    assert c.to_json_best_effort() == given         # the caller's config is left as it is

    calls.clear()
    restored = workdir_eval.restore_run(tmp_path / "w" / "seed_1")
    assert calls["resolve", "outside"] == 1 and _total(calls, "check") == 1
    assert _total(calls, "resolved_settings") == 1
    config = restored.experiment.config
    assert isinstance(config, config_lib.ResolvedConfig)
    assert config.seed == 1 and config.ood_datasets == ("fashion_mnist",)
    assert config.method_settings["length_scale"] == 0.2
    assert restored.experiment.method.length_scale == 0.2


def test_a_resolved_config_is_read_only_and_its_copies_stay_resolved(calls):
    c = configs.build_config("mnist", "gedl")
    config_lib.set_fields(c, ood_datasets="kmnist")
    c.seeds = ("0,1",)
    resolved = experiment.resolve_config(c, num_devices=1)
    assert isinstance(resolved, config_lib.ResolvedConfig)
    assert resolved.seeds == (0, 1) and resolved.ood_datasets == ("kmnist",)
    assert c.seeds == ("0,1",)   # the user's config is not changed
    with pytest.raises(AttributeError, match="immutable"):
        resolved.num_epochs = 3
    with pytest.raises(AttributeError, match="immutable"):
        resolved["seed"] = 3
    assert experiment.resolve_config(resolved, num_devices=1) is resolved
    calls.clear()
    seeded = config_lib.with_seed(resolved, 1)
    member = config_lib.ensemble_member_config(resolved)
    assert isinstance(seeded, config_lib.ResolvedConfig) and seeded.seed == 1
    assert seeded.seeds == () and resolved.seeds == (0, 1)
    assert isinstance(member, config_lib.ResolvedConfig) and member.ensemble_size == 0
    assert member.method_settings == resolved.method_settings
    assert _total(calls, "check") == 0 and _total(calls, "resolved_settings") == 0


def test_resolving_still_refuses_a_bad_config():
    c = config_lib.set_fields(configs.build_config("mnist", "gedl"),
                              ood_datasets="kmnist,kmnist")
    with pytest.raises(ValueError, match="lists kmnist twice"):
        experiment.resolve_config(c, num_devices=1)


def test_the_json_fields_and_w_are_parsed_once_when_resolved(calls):
    c = configs.build_config("mnist", "duq")
    config_lib.set_fields(c, method_args='{"length_scale": 0.2}', prior_strength_value="0.1K")
    resolved = experiment.resolve_config(c, num_devices=1)
    assert resolved.method_args == '{"length_scale": 0.2}'   # the field is as given
    assert resolved.method_arguments == {"length_scale": 0.2}
    assert resolved.model_arguments == {} and resolved.prior_strength_W == pytest.approx(1.0)
    assert resolved.method_settings == {**methods.METHODS["duq"].settings(),
                                        "length_scale": 0.2}
    resolved.method_arguments["length_scale"] = 9.0   # a reader's copy, not the config's
    resolved.method_settings["length_scale"] = 9.0
    calls.clear()
    assert resolved.method_arguments == {"length_scale": 0.2}
    assert config_lib.with_seed(resolved, 3).method_settings["length_scale"] == 0.2
    assert resolved.prior_strength_W == pytest.approx(1.0)
    parsing = ("json_object", "prior_strength", "check", "resolve", "resolved_settings")
    assert [name for name, _ in calls if name in parsing] == []   # nothing parsed again


def test_a_config_resolved_without_its_method_settings_says_how_to_resolve_it():
    resolved = config_lib.resolve(configs.build_config("mnist", "duq"))
    with pytest.raises(ValueError, match="run.experiment.resolve_config"):
        _ = resolved.method_settings


def test_a_bad_json_field_is_refused_when_resolved():
    c = config_lib.set_fields(configs.build_config("mnist", "duq"),
                              method_args="{length_scale: 0.2}")
    with pytest.raises(ValueError, match="config.method_args=.* is not JSON"):
        experiment.resolve_config(c, num_devices=1)


def test_no_code_outside_the_config_package_asks_which_type_a_config_is():
    """One config type after the boundary: `isinstance(..., ResolvedConfig)` is asked only
    where a config is resolved (gedl_jax/config/resolution.py)."""
    import pathlib
    import re
    package = pathlib.Path(config_lib.__file__).resolve().parents[1]
    asking = re.compile(r"isinstance\([^()]*ResolvedConfig\)")
    found = [str(p.relative_to(package)) for p in package.rglob("*.py")
             if asking.search(p.read_text()) and p.name != "resolution.py"]
    assert found == []
    assert asking.search((package / "config" / "resolution.py").read_text())   # the one place
