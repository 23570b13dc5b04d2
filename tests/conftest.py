"""Shared pytest setup: tests are offline unless they opt in.

- Every test runs with $GEDL_OFFLINE=1 (no code path downloads) and its own $XDG_CACHE_HOME (the
  default data folder is empty), unless it clears them itself, as the download tests do against
  a server on 127.0.0.1.
- Tests marked `network` reach the real dataset URLs; they are skipped unless pytest runs with
  `--run-network`.
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser):
    parser.addoption("--run-network", action="store_true", default=False,
                     help="also run the tests marked `network` (they download from the official "
                          "dataset URLs)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--run-network"):
        return
    skip = pytest.mark.skip(reason="reaches the internet: run with --run-network")
    for item in items:
        if "network" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _offline_by_default(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("GEDL_OFFLINE", "1")
    monkeypatch.delenv("GEDL_DATA_MIRROR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg_cache")))
