"""Shared pytest setup and fixtures.

- Every test runs with $GEDL_OFFLINE=1 (no code path downloads) and its own $XDG_CACHE_HOME (the
  default data folder is empty), unless it clears them itself, as the download tests do against
  a server on 127.0.0.1.
- Tests marked `network` reach the real dataset URLs; they are skipped unless pytest runs with
  `--run-network`. Tests marked `extended` are the rest of a preset x network matrix whose
  representative cases run by default (every preset on VGG16 / ResNet-18, every user network
  with every method); they run with `--run-extended` (or GEDL_RUN_EXTENDED=1). Tests marked
  `notebooks` execute a notebook top to bottom in its smoke setting (about 5 CPU-minutes for
  the four); they run with `--run-notebooks` (or GEDL_RUN_NOTEBOOKS=1), as CI does in its own
  step after the default suite.
- Every test runs with `jax_numpy_rank_promotion="raise"`: a (B,) vs (B, K) broadcasting slip
  raises instead of silently broadcasting. A test that must allow it is marked
  `allow_rank_promotion`.
- Fixtures: `no_network` (any connection attempt fails the test), `isolated_env` (a private
  cache, no data folder from the environment), `generated_data` (a data folder of small,
  learnable MNIST / KMNIST / Fashion-MNIST files in the official IDX gz format, their checksums
  registered for the test: the training-mechanics tests run on it, offline, on any machine).
- The repository root is importable, so tests import the research scripts as the package
  `studies` (run as `python -m studies.<name>` from the root). `python -m pytest` from the
  root has it already; this covers a bare `pytest` and other working directories. It is
  appended, so an installed gedl_jax still comes first.
- On a GPU, XLA's default kernels (atomic adds in reductions and convolution gradients) differ
  from run to run in the last bits; the tests that compare a resumed run with an uninterrupted
  one need bit-reproducible kernels, so `--xla_gpu_deterministic_ops=true` is added to
  $XLA_FLAGS before jax starts (ignored on a CPU), with one autotuning cache for the run's
  processes (each would otherwise time candidate kernels and may pick others).
- float32 products are computed in float32 (`jax_default_matmul_precision="highest"`): the
  suite checks float32 arithmetic against float64 references with tolerances derived for
  float32. On an NVIDIA GPU jax's default would be TF32 (10-bit mantissa inputs), whose error
  is not what those tolerances bound; on a CPU the setting changes nothing. The trainer
  applies each run's own `config.matmul_precision` (tests/test_numerics.py checks that).
- Compiled programs go to a persistent compilation cache shared by the run's processes (the
  pytest workers and the training subprocesses they start; removed when the run ends): a
  resumed run, a re-evaluation or a second test of the same preset loads the executable
  instead of compiling it again. The executable is the one XLA built for the same program, so
  results are unchanged; the one test that times a compile opts out.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

_CACHE_VAR = "JAX_COMPILATION_CACHE_DIR"
if _CACHE_VAR not in os.environ:
    # Set here, in the process that starts the pytest workers (they inherit it), and removed by
    # this process alone when it exits.
    os.environ[_CACHE_VAR] = tempfile.mkdtemp(prefix="gedl_jax_tests_xla_cache_")
    atexit.register(shutil.rmtree, os.environ[_CACHE_VAR], ignore_errors=True)
# every program, not only those that compile for over a second (the default threshold)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

if "xla_gpu_deterministic_ops" not in os.environ.get("XLA_FLAGS", ""):
    # and one autotuning cache for the run's processes (the trainer keeps its own one per
    # workdir, unless XLA_FLAGS name one): a training subprocess runs the kernels the test
    # process chose, so their results compare bit for bit
    _autotune_dir = tempfile.mkdtemp(prefix="gedl_jax_tests_autotune_")
    atexit.register(shutil.rmtree, _autotune_dir, ignore_errors=True)
    os.environ["XLA_FLAGS"] = " ".join(filter(None, [
        os.environ.get("XLA_FLAGS"), "--xla_gpu_deterministic_ops=true",
        f"--xla_gpu_per_fusion_autotune_cache_dir={_autotune_dir}"]))

import jax  # noqa: E402  (after XLA_FLAGS: the flags are read when the backend starts)

jax.config.update("jax_default_matmul_precision", "highest")   # module docstring
import pytest  # noqa: E402
from compile_mode import fast_compilation  # noqa: E402
from data_fixtures import GeneratedData, write_generated_data  # noqa: E402

if str(Path(__file__).resolve().parents[1]) not in sys.path:
    sys.path.append(str(Path(__file__).resolve().parents[1]))


def pytest_addoption(parser):
    parser.addoption("--run-network", action="store_true", default=False,
                     help="also run the tests marked `network` (they download from the official "
                          "dataset URLs)")
    parser.addoption("--run-extended", action="store_true",
                     default=os.environ.get("GEDL_RUN_EXTENDED", "") == "1",
                     help="also run the tests marked `extended`: the full preset x network "
                          "matrices whose representative cases the default suite runs "
                          "(also GEDL_RUN_EXTENDED=1)")
    parser.addoption("--run-notebooks", action="store_true",
                     default=os.environ.get("GEDL_RUN_NOTEBOOKS", "") == "1",
                     help="also execute the notebooks (tests marked `notebooks`; CI runs them "
                          "in a step of their own; also GEDL_RUN_NOTEBOOKS=1)")


def pytest_configure(config):
    config.addinivalue_line("markers", "allow_rank_promotion: run this test without "
                                       "jax_numpy_rank_promotion='raise'")


def pytest_collection_modifyitems(config, items):
    skips = {}
    if not config.getoption("--run-network"):
        skips["network"] = pytest.mark.skip(reason="reaches the internet: run with --run-network")
    if not config.getoption("--run-extended"):
        skips["extended"] = pytest.mark.skip(
            reason="a case of an extended matrix: run with --run-extended")
    if not config.getoption("--run-notebooks"):
        skips["notebooks"] = pytest.mark.skip(
            reason="executes a notebook (minutes): run with --run-notebooks")
    for item in items:
        for marker, skip in skips.items():
            if marker in item.keywords:
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def _offline_by_default(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("GEDL_OFFLINE", "1")
    monkeypatch.delenv("GEDL_DATA_MIRROR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg_cache")))


@pytest.fixture(autouse=True)
def _rank_promotion_raises(request):
    if request.node.get_closest_marker("allow_rank_promotion"):
        yield
        return
    with jax.numpy_rank_promotion("raise"):
        yield


@pytest.fixture
def fast_compile():
    """In-process runs compile with XLA's optimisations mostly off (seconds, not tens)."""
    with fast_compilation():
        yield


class NetworkAccessError(AssertionError):
    pass


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a network connection fails the test at once."""
    def refuse(*args, **kwargs):
        raise NetworkAccessError(f"the data pipeline tried to reach the network: {args[:2]}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


@pytest.fixture
def isolated_env(tmp_path, monkeypatch):
    """A private cache folder; no data folder from the environment (tests pass it explicitly)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("GEDL_CACHE_DIR", str(cache))
    monkeypatch.delenv("GEDL_DATA_DIR", raising=False)
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "tfds"))
    return cache


# ------------------------------------------------------------------------- generated data
@pytest.fixture(scope="session")
def generated_data_files(tmp_path_factory) -> GeneratedData:
    return write_generated_data(tmp_path_factory.mktemp("generated_data"))


@pytest.fixture
def generated_data(generated_data_files, monkeypatch) -> Iterator[Path]:
    """The generated data folder (also $GEDL_DATA_DIR), its files registered for the test."""
    monkeypatch.setenv("GEDL_DATA_DIR", str(generated_data_files.root))
    with generated_data_files.registered() as root:
        yield root


def pytest_runtest_logreport(report) -> None:
    """With $GEDL_TEST_FAILURE_LOG set, each failure's report (its traceback) is appended to that
    file as it happens, in the controlling process (tools/gpu_check.sh: a suite stopped by a time
    limit still has the tracebacks pytest prints only at its end)."""
    path = os.environ.get("GEDL_TEST_FAILURE_LOG")
    if path and report.failed and "PYTEST_XDIST_WORKER" not in os.environ:
        with open(path, "a") as f:
            f.write(f"==== {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")
