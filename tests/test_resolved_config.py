"""One resolved config per run (`configuration.resolve`, through `run.experiment.resolve_config`):
resolved where a run starts and where a workdir is restored, read-only below, and nothing
below the entry point calls back into `configuration` to parse, normalise or validate it."""

from __future__ import annotations

import collections
import functools
import inspect
import sys

import pytest
from training_fixtures import write_tiny_mnist

from gedl_jax import configuration, train
from gedl_jax.run import experiment
from gedl_jax.run import workdir as workdir_eval

# The functions that parse, normalise, resolve or validate a config (the readers
# parsed_method_args, parsed_model_kwargs and prior_strength_number are not among them: for a
# resolved config they return what `resolve` parsed).
RESOLVING = ("resolve", "validate_config", "normalize_lists", "parse_list", "as_tuple",
             "set_fields", "parse_seeds", "method_args", "model_kwargs",
             "resolved_prior_strength")


@pytest.fixture
def calls(monkeypatch):
    """Every call of a `configuration` function, as {(name, "outside" | "inside"): count}:
    "outside" when the caller is another module (a walk down into configuration)."""
    counted: collections.Counter = collections.Counter()
    for name, function in list(vars(configuration).items()):
        if inspect.isfunction(function) and function.__module__ == configuration.__name__:
            monkeypatch.setattr(configuration, name, _counting(function, name, counted))
    return counted


def _counting(function, name, counted):
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        caller = sys._getframe(1).f_globals.get("__name__")
        counted[name, "inside" if caller == configuration.__name__ else "outside"] += 1
        return function(*args, **kwargs)
    return wrapper


def _total(calls, name):
    return calls[name, "inside"] + calls[name, "outside"]


def _tiny_config(tmp_path):
    data_dir = write_tiny_mnist(tmp_path / "data")
    write_tiny_mnist(tmp_path / "other", seed=1)
    (tmp_path / "other" / "mnist").rename(data_dir / "fashion_mnist")   # a tiny OOD set
    c = configuration.build_config("mnist", "gedl")
    configuration.set_fields(c, train_examples=64, val_examples=32, batch_size=32,
                             num_epochs=1, eval_batch_size=64, evaluate_at_end=True,
                             plots=False, ood_datasets="fashion_mnist", data_dir=str(data_dir),
                             cache_dir=str(tmp_path / "cache"))
    c.seeds = ("0,1",)   # as the command line passes --config.seeds=0,1 on
    return c


def test_a_run_and_a_restored_workdir_each_resolve_their_config_once(tmp_path, fast_compile,
                                                                     calls):
    c = _tiny_config(tmp_path)
    given = c.to_json_best_effort()
    calls.clear()
    results = train.run(c, tmp_path / "w")
    assert [r["seed"] for r in results] == [0, 1] and all("evaluation" in r for r in results)
    resolving = {name: n for (name, where), n in calls.items()
                 if where == "outside" and name in RESOLVING}
    assert resolving == {"resolve": 1, "parse_seeds": 1}   # at the entry point, nowhere below
    assert _total(calls, "validate_config") == 1      # the per-seed copies are not validated
    assert _total(calls, "normalize_lists") == 1
    assert _total(calls, "parse_list") == 0
    assert c.to_json_best_effort() == given            # the caller's config is left as it is

    calls.clear()
    restored = workdir_eval.restore_run(tmp_path / "w" / "seed_1")
    assert calls["resolve", "outside"] == 1 and _total(calls, "validate_config") == 1
    assert isinstance(restored.experiment.config, configuration.ResolvedConfig)
    assert restored.experiment.config.seed == 1
    assert restored.experiment.config.ood_datasets == ("fashion_mnist",)


def test_a_resolved_config_is_read_only_and_its_copies_stay_resolved(calls):
    c = configuration.build_config("mnist", "gedl")
    configuration.set_fields(c, ood_datasets="kmnist")
    c.seeds = ("0,1",)
    resolved = experiment.resolve_config(c, num_devices=1)
    assert isinstance(resolved, configuration.ResolvedConfig)
    assert resolved.seeds == (0, 1) and resolved.ood_datasets == ("kmnist",)
    assert c.seeds == ("0,1",)   # the user's config is not changed
    with pytest.raises(AttributeError, match="immutable"):
        resolved.num_epochs = 3
    with pytest.raises(AttributeError, match="immutable"):
        resolved["seed"] = 3
    assert experiment.resolve_config(resolved, num_devices=1) is resolved
    calls.clear()
    seeded = configuration.with_seed(resolved, 1)
    member = configuration.ensemble_member_config(resolved)
    assert isinstance(seeded, configuration.ResolvedConfig) and seeded.seed == 1
    assert seeded.seeds == () and resolved.seeds == (0, 1)
    assert isinstance(member, configuration.ResolvedConfig) and member.ensemble_size == 0
    assert _total(calls, "validate_config") == 0   # copies are not validated again


def test_resolving_still_refuses_a_bad_config():
    c = configuration.set_fields(configuration.build_config("mnist", "gedl"),
                                 ood_datasets="kmnist,kmnist")
    with pytest.raises(ValueError, match="lists kmnist twice"):
        experiment.resolve_config(c, num_devices=1)


def test_the_json_fields_and_w_are_parsed_once_when_resolved(calls):
    c = configuration.build_config("mnist", "duq")
    configuration.set_fields(c, method_args='{"length_scale": 0.2}', prior_strength_value="0.1K")
    resolved = experiment.resolve_config(c, num_devices=1)
    assert resolved.method_args == '{"length_scale": 0.2}'   # the field is as given
    assert resolved.method_arguments == {"length_scale": 0.2}
    assert resolved.model_arguments == {} and resolved.prior_strength_W == pytest.approx(1.0)
    resolved.method_arguments["length_scale"] = 9.0   # a reader's copy, not the config's
    calls.clear()
    assert configuration.parsed_method_args(resolved) == {"length_scale": 0.2}
    assert configuration.parsed_method_args(configuration.with_seed(resolved, 3)) == {
        "length_scale": 0.2}
    assert configuration.prior_strength_number(resolved) == pytest.approx(1.0)
    assert calls["method_args", "outside"] == 0 and calls["resolved_prior_strength",
                                                          "outside"] == 0
    # a config not resolved yet is parsed where it is read
    assert configuration.parsed_method_args(c) == {"length_scale": 0.2}


def test_a_bad_json_field_is_refused_when_resolved():
    c = configuration.set_fields(configuration.build_config("mnist", "duq"),
                                 method_args="{length_scale: 0.2}")
    with pytest.raises(ValueError, match="config.method_args=.* is not JSON"):
        experiment.resolve_config(c, num_devices=1)
