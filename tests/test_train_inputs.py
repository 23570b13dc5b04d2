"""The run's pre-flight (experiment.obtain_inputs): what it asks the data layer for, and the
multi-host rule: only process 0 fetches, every process meets the barrier (also when process 0
fails, so no process waits forever), and the others then verify the files as they load them."""

from __future__ import annotations

import jax
import pytest
from jax.experimental import multihost_utils

from gedl_jax import configs, data
from gedl_jax.run import experiment


@pytest.fixture
def calls(monkeypatch):
    record = {"ensure": [], "barrier": 0}
    monkeypatch.setattr(data, "ensure_available",
                        lambda wanted, **kw: record["ensure"].append((wanted, kw)))
    monkeypatch.setattr(multihost_utils, "sync_global_devices",
                        lambda name: record.__setitem__("barrier", record["barrier"] + 1))
    return record


def _processes(monkeypatch, count, index):
    monkeypatch.setattr(jax, "process_count", lambda: count)
    monkeypatch.setattr(jax, "process_index", lambda: index)


def test_single_process_asks_for_the_id_splits_and_the_ood_test_splits(calls, monkeypatch):
    config = configs.build_config("mnist", "quick")
    config.extra_ood = ("/some/idx_folder",)  # a folder, checked when loaded: nothing to fetch
    with config.unlocked():
        config.data_mirror = "http://127.0.0.1:9/m"
    experiment.obtain_inputs(config)
    (wanted, kw), = calls["ensure"]
    assert wanted == [("mnist", "train"), ("mnist", "test"), ("kmnist", "test"),
                      ("fashion_mnist", "test")]
    assert kw["download"] == "auto" and kw["mirror"] == "http://127.0.0.1:9/m"
    assert calls["barrier"] == 0


@pytest.mark.parametrize("index,fetches", [(0, 1), (1, 0)])
def test_under_several_processes_only_process_0_fetches(calls, monkeypatch, index, fetches):
    _processes(monkeypatch, 2, index)
    experiment.obtain_inputs(configs.build_config("cifar10", None))
    assert len(calls["ensure"]) == fetches and calls["barrier"] == 1


def test_a_failure_on_process_0_still_meets_the_barrier_then_raises(calls, monkeypatch):
    _processes(monkeypatch, 2, 0)

    def fail(wanted, **kw):
        raise data.MissingDataError("nothing here")

    monkeypatch.setattr(data, "ensure_available", fail)
    with pytest.raises(data.MissingDataError, match="nothing here"):
        experiment.obtain_inputs(configs.build_config("mnist", None))
    assert calls["barrier"] == 1
