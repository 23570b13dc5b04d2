"""The downloader against a server on 127.0.0.1 (port 0) that this test starts: success, no-op
second call, corrupted bytes, 404, a body shorter than its Content-Length, 5xx retries, a server
that never answers, a closed port, the offline switch, a local-folder mirror, the proxy variables,
two processes racing for one file, the run pre-flight and the CLIs. Nothing here leaves the
loopback interface; the one test against the real URLs is marked `network` (off by default)."""

from __future__ import annotations

import contextlib
import http.server
import multiprocessing
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from data_fixtures import specs_for, write_mnist_folder

from gedl_jax import data
from gedl_jax.data import download, fetch, registry
from gedl_jax.data.registry import FileSpec

REPO = Path(__file__).resolve().parents[1]
MNIST_FILES = ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
               "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")
TEST_FILES = MNIST_FILES[2:]


# ------------------------------------------------------------------------------ the server
class Server:
    """A ThreadingHTTPServer on 127.0.0.1 serving `root`; `modes[path]` changes one path's answer:
    "corrupt", "404", "short", "stall", ("5xx", n) (n answers 503, then the file), "slow"."""

    def __init__(self, root: Path):
        self.root = root
        self.modes: dict[str, object] = {}
        self.log: list[str] = []
        self.release = threading.Event()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):  # noqa: N802
                path = self.path
                if path.startswith("http://"):  # a proxy request carries the absolute URI
                    path = "/" + path.split("/", 3)[3]
                outer.log.append(path)
                mode = outer.modes.get(path)
                if mode == "stall":
                    outer.release.wait(10)
                    return
                if isinstance(mode, tuple) and mode[0] == "5xx" and mode[1] > 0:
                    outer.modes[path] = ("5xx", mode[1] - 1)
                    self.send_error(503)
                    return
                file = outer.root / path.lstrip("/")
                if mode == "404" or not file.is_file():
                    self.send_error(404)
                    return
                body = file.read_bytes()
                if mode == "corrupt":
                    body = body[:-1] + bytes([body[-1] ^ 0xFF])
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if mode == "short":
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                if mode == "slow":
                    for i in range(0, len(body), 256):
                        self.wfile.write(body[i:i + 256])
                        time.sleep(0.01)
                    return
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def count(self, path: str) -> int:
        return sum(1 for p in self.log if p == path)


@pytest.fixture
def online(monkeypatch):
    """Downloads allowed, but only to 127.0.0.1: any other address fails the test."""
    monkeypatch.delenv("GEDL_OFFLINE", raising=False)
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
                "all_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(var, raising=False)
    real_connect = socket.socket.connect

    def connect(self, address):
        host = address[0] if isinstance(address, tuple) else address
        if host not in ("127.0.0.1", "::1", "localhost"):
            raise AssertionError(f"a test tried to reach {address}")
        return real_connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)


@pytest.fixture
def served(tmp_path, monkeypatch):
    """Small MNIST-family files in the official formats, served from 127.0.0.1 as a mirror
    (<url>/<dataset>/<file>) and registered with their checksums; yields (server, arrays)."""
    root = tmp_path / "served"
    arrays = {"mnist": write_mnist_folder(root / "mnist", 40, 12, seed=1)}
    for i, name in enumerate(("kmnist", "fashion_mnist")):
        arrays[name] = write_mnist_folder(root / name, 10, 12, seed=2 + i)
    monkeypatch.setenv("GEDL_CACHE_DIR", str(tmp_path / "cache"))
    with Server(root) as server, contextlib.ExitStack() as stack:
        for name in arrays:
            specs = specs_for(root / name, MNIST_FILES)
            # Their "official URL" is on this server too, under /official/ (only used without a
            # mirror).
            specs = {f: FileSpec(s.filename, s.size, s.sha256,
                                 f"{server.url}/official/{name}/{f}", "test fixture")
                     for f, s in specs.items()}
            stack.enter_context(registry.override_file_specs(name, "official", specs))
        (root / "official").symlink_to(root, target_is_directory=True)
        yield server, arrays


def _left_in(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*")) if folder.exists() else []


# ------------------------------------------------------------------------------ the cases
def test_mirror_fetches_exactly_what_is_asked_verifies_and_a_second_call_does_nothing(
        online, served, tmp_path):
    server, arrays = served
    target = tmp_path / "data"
    wanted = [("mnist", "train"), ("mnist", "test"), ("kmnist", "test")]
    root = download.ensure_files(wanted, target, mirror=server.url, progress=False)
    assert root == target
    expected = sorted([f"/mnist/{f}" for f in MNIST_FILES] + [f"/kmnist/{f}" for f in TEST_FILES])
    assert sorted(server.log) == expected
    for name, files in (("mnist", MNIST_FILES), ("kmnist", TEST_FILES)):
        for f in files:
            assert (target / name / f).read_bytes() == (server.root / name / f).read_bytes()
    assert _left_in(target / "kmnist") == sorted(TEST_FILES)  # no train files, no temp files
    download.ensure_files(wanted, target, mirror=server.url, progress=False)
    assert len(server.log) == len(expected)
    split = data.load_split("mnist", "test", target, download="never")
    np.testing.assert_array_equal(split.images[..., 0], arrays["mnist"]["test"][0])


def test_without_a_mirror_the_registered_official_url_is_used(online, served, tmp_path):
    server, _ = served
    download.ensure_files([("kmnist", "test")], tmp_path / "data", progress=False)
    assert sorted(server.log) == sorted(f"/official/kmnist/{f}" for f in TEST_FILES)


def test_corrupted_bytes_fail_naming_the_checksum_and_leave_nothing(online, served, tmp_path):
    server, _ = served
    server.modes["/kmnist/t10k-images-idx3-ubyte.gz"] = "corrupt"
    with pytest.raises(data.ChecksumError, match="sha256") as e:
        download.ensure_files([("kmnist", "test")], tmp_path / "data", mirror=server.url,
                              progress=False)
    assert "t10k-images-idx3-ubyte.gz" in str(e.value) and "not kept" in str(e.value)
    assert "t10k-images-idx3-ubyte.gz" not in _left_in(tmp_path / "data")
    assert not [n for n in _left_in(tmp_path / "data") if n.endswith(".tmp")]


def test_404_names_the_url_and_what_to_do(online, served, tmp_path):
    server, _ = served
    server.modes["/kmnist/t10k-labels-idx1-ubyte.gz"] = "404"
    with pytest.raises(data.DownloadError) as e:
        download.ensure_files([("kmnist", "test")], tmp_path / "data", mirror=server.url,
                              progress=False)
    msg = str(e.value)
    assert "404" in msg and f"{server.url}/kmnist/t10k-labels-idx1-ubyte.gz" in msg
    assert "GEDL_DATA_MIRROR" in msg and "\n    t10k-labels-idx1-ubyte.gz  " in msg  # ways out
    assert "t10k-labels-idx1-ubyte.gz" not in _left_in(tmp_path / "data")


def test_a_body_shorter_than_its_content_length_is_retried_twice_then_fails(online, served,
                                                                             tmp_path):
    server, _ = served
    path = "/kmnist/t10k-images-idx3-ubyte.gz"
    server.modes[path] = "short"
    with pytest.raises(data.DownloadError, match="3 tries"):
        download.ensure_files([("kmnist", "test")], tmp_path / "data", mirror=server.url,
                              progress=False)
    assert server.count(path) == 3
    assert "t10k-images-idx3-ubyte.gz" not in _left_in(tmp_path / "data")


def test_5xx_answers_are_retried_and_a_later_success_is_kept(online, served, tmp_path):
    server, _ = served
    path = "/kmnist/t10k-images-idx3-ubyte.gz"
    server.modes[path] = ("5xx", 2)
    download.ensure_files([("kmnist", "test")], tmp_path / "data", mirror=server.url,
                          progress=False)
    assert server.count(path) == 3
    server.modes[path] = ("5xx", 5)
    with pytest.raises(data.DownloadError, match="HTTP 503 after 3 tries"):
        download.ensure_files([("kmnist", "test")], tmp_path / "other", mirror=server.url,
                              progress=False)


def test_a_server_that_never_answers_hits_the_read_timeout(online, served, tmp_path):
    server, _ = served
    path = "/kmnist/t10k-images-idx3-ubyte.gz"
    server.modes[path] = "stall"
    start = time.monotonic()
    with pytest.raises(data.DownloadError, match="read timeout"):
        download.ensure_files([("kmnist", "test")], tmp_path / "data", mirror=server.url,
                              progress=False, timeouts=download.Timeouts(connect=1, read=1))
    assert time.monotonic() - start < 5
    assert server.count(path) == 1  # a timeout is not retried
    assert "t10k-images-idx3-ubyte.gz" not in _left_in(tmp_path / "data")


def test_a_closed_port_fails_at_once_without_retries(online, served, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(data.DownloadError, match="cannot connect") as e:
        download.ensure_files([("kmnist", "test")], tmp_path / "data",
                              mirror=f"http://127.0.0.1:{port}", progress=False)
    assert time.monotonic() - start < download.RETRY_BACKOFF_S  # no retry sleep happened
    assert "set $GEDL_DATA_DIR to a folder with these files, or fetch them" in str(e.value)


def test_offline_switch_names_every_missing_file_without_touching_the_network(
        no_network_at_all, served, tmp_path, monkeypatch):
    server, _ = served
    monkeypatch.setenv("GEDL_OFFLINE", "1")
    wanted = [("mnist", "train"), ("mnist", "test"), ("kmnist", "test"),
              ("fashion_mnist", "test")]
    with pytest.raises(data.MissingDataError) as e:
        download.ensure_files(wanted, tmp_path / "data", mirror=server.url, download="auto")
    msg = str(e.value)
    lines = msg.splitlines()
    for name, files in (("mnist", MNIST_FILES), ("kmnist", TEST_FILES),
                        ("fashion_mnist", TEST_FILES)):
        folder = next(i for i, line in enumerate(lines)
                      if line.endswith(f", in {tmp_path / 'data' / name}:"))
        for f in files:   # each file on a line of its own under its folder
            assert any(line.startswith(f"    {f}  ") for line in lines[folder + 1:]), (f, msg)
    assert "GEDL_OFFLINE" in msg and "GEDL_DATA_MIRROR" in msg and "GEDL_DATA_DIR" in lines[0]
    assert "python -m gedl_jax.data.fetch --data_dir=DIR mnist:train,test" in lines[1]
    assert server.log == []
    with pytest.raises(data.MissingDataError):  # the same through the loader
        data.load_split("mnist", "test", tmp_path / "data", mirror=server.url)


@pytest.fixture
def no_network_at_all(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"tried to open a connection: {args[:2]}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


def test_a_local_folder_mirror_works_like_a_url(online, served, tmp_path):
    server, _ = served
    download.ensure_files([("mnist", "test")], tmp_path / "data", mirror=str(server.root),
                          progress=False)
    assert (tmp_path / "data/mnist/t10k-images-idx3-ubyte.gz").read_bytes() == \
        (server.root / "mnist/t10k-images-idx3-ubyte.gz").read_bytes()
    assert server.log == []
    with pytest.raises(data.DownloadError, match="not in the mirror folder"):
        download.ensure_files([("mnist", "test")], tmp_path / "other",
                              mirror=str(tmp_path / "empty_mirror"), progress=False)


def test_proxy_environment_variables_are_honoured(online, served, tmp_path, monkeypatch):
    server, _ = served
    monkeypatch.setenv("HTTP_PROXY", server.url)
    download.ensure_files([("kmnist", "test")], tmp_path / "data",
                          mirror="http://mirror.invalid", progress=False)
    assert sorted(server.log) == sorted(f"/kmnist/{f}" for f in TEST_FILES)


def test_force_fetches_again_and_auto_keeps_a_verified_file(online, served, tmp_path):
    server, _ = served
    target = tmp_path / "data"
    download.ensure_files([("kmnist", "test")], target, mirror=server.url, progress=False)
    download.ensure_files([("kmnist", "test")], target, mirror=server.url, progress=False,
                          download="force")
    assert server.count("/kmnist/t10k-images-idx3-ubyte.gz") == 2


def test_a_damaged_local_file_is_reported_not_silently_replaced(online, served, tmp_path):
    server, _ = served
    target = tmp_path / "data"
    download.ensure_files([("kmnist", "test")], target, mirror=server.url, progress=False)
    f = target / "kmnist/t10k-labels-idx1-ubyte.gz"
    damaged = bytearray(f.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    f.write_bytes(bytes(damaged))
    stat = f.stat()  # a later edit: the verified-file record is keyed on (size, mtime, inode)
    os.utime(f, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    with pytest.raises(data.ChecksumError, match="checksum mismatch"):
        download.ensure_files([("kmnist", "test")], target, mirror=server.url, progress=False)
    download.ensure_files([("kmnist", "test")], target, mirror=server.url, progress=False,
                          download="force")
    assert f.read_bytes() == (server.root / "kmnist/t10k-labels-idx1-ubyte.gz").read_bytes()


def _fetch_in_child(url, folder, spec_fields, cache_dir, results):
    os.environ.pop("GEDL_OFFLINE", None)
    spec = FileSpec(*spec_fields)
    path = download.fetch_file(spec, "kmnist", Path(folder), mirror=url,
                               cache_root=Path(cache_dir), progress=False)
    results.put(path.stat().st_size == spec.size)


def test_two_processes_fetching_one_file_download_it_once(online, served, tmp_path):
    server, _ = served
    name = "t10k-images-idx3-ubyte.gz"
    server.modes[f"/kmnist/{name}"] = "slow"  # long enough for the two to overlap
    spec = registry.registered_files("kmnist")[name]
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    folder = tmp_path / "data" / "kmnist"
    args = (server.url, str(folder), (spec.filename, spec.size, spec.sha256, spec.url,
                                      spec.registered_by), str(tmp_path / "cache"), results)
    procs = [ctx.Process(target=_fetch_in_child, args=args) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    assert results.qsize() == 2
    assert server.count(f"/kmnist/{name}") == 1
    assert (folder / name).read_bytes() == (server.root / "kmnist" / name).read_bytes()


def test_run_preflight_fetches_only_the_missing_test_splits_of_the_ood_sets(online, served,
                                                                         tmp_path):
    server, _ = served
    target = tmp_path / "data"
    (target / "mnist").mkdir(parents=True)
    for f in MNIST_FILES:  # the ID set is already here
        (target / "mnist" / f).write_bytes((server.root / "mnist" / f).read_bytes())
    wanted = fetch.requests_for_run("mnist")
    assert wanted == [("mnist", "train"), ("mnist", "test"), ("kmnist", "test"),
                      ("fashion_mnist", "test")]
    data.ensure_available(wanted, target, mirror=server.url)
    assert sorted(server.log) == sorted(f"/{d}/{f}" for d in ("kmnist", "fashion_mnist")
                                        for f in TEST_FILES)


def test_loaders_download_what_is_missing(online, served, tmp_path):
    server, arrays = served
    s = data.load_train_val_test("mnist", tmp_path / "data", seed=0, mirror=server.url)
    assert len(s["train"]) + len(s["validation"]) == 40 and len(s["test"]) == 12
    ood = data.load_ood("fashion_mnist", tmp_path / "data", mirror=server.url)
    np.testing.assert_array_equal(ood.labels, arrays["fashion_mnist"]["test"][1])


def test_fetch_cli_lists_and_fetches(online, served, tmp_path, capsys):
    from gedl_jax.commands import fetch as command

    server, _ = served
    target = tmp_path / "data"
    assert command.main(["kmnist:test", "--data_dir", str(target), "--mirror", server.url]) == 0
    lines = []
    assert command.main(["--list", "--data_dir", str(target)], printer=lines.append) == 0
    table = lines[0]
    row = next(r for r in table.splitlines() if r.startswith("kmnist") and "t10k-images" in r)
    assert row.rstrip().endswith("verified")
    row = next(r for r in table.splitlines() if r.startswith("kmnist") and "train-images" in r)
    assert row.rstrip().endswith("missing")
    assert command.main(["kmnist:nope", "--data_dir", str(target)]) == 2
    assert "not 'nope'" in capsys.readouterr().err


def test_download_mode_validation_and_the_offline_switch(monkeypatch):
    monkeypatch.delenv("GEDL_OFFLINE")
    assert download.download_mode(None) == "auto"
    assert download.download_mode("force") == "force"
    with pytest.raises(ValueError, match="allowed values"):
        download.download_mode("sometimes")
    for value in ("1", "true", "yes"):
        monkeypatch.setenv("GEDL_OFFLINE", value)
        assert download.download_mode("force") == "never"
    monkeypatch.setenv("GEDL_OFFLINE", "0")
    assert download.download_mode("auto") == "auto"


def _train_cli(config: str, tmp_path: Path, env_extra: dict[str, str]):
    env = dict(os.environ, GEDL_DATA_DIR=str(tmp_path / "empty"),
               GEDL_CACHE_DIR=str(tmp_path / "cache"), JAX_PLATFORMS="cpu", **env_extra)
    (tmp_path / "empty").mkdir(exist_ok=True)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "gedl_jax.train", f"--config={REPO / config}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    return proc, time.monotonic() - start


@pytest.mark.parametrize("config,files", [
    ("configs/mnist.py", ["mnist/train-images-idx3-ubyte.gz", "mnist/t10k-labels-idx1-ubyte.gz",
                          "kmnist/t10k-images-idx3-ubyte.gz",
                          "fashion_mnist/t10k-labels-idx1-ubyte.gz"]),
    ("configs/cifar10.py", ["cifar10/cifar-10-binary.tar.gz", "svhn_cropped/test_32x32.mat",
                            "cifar100/cifar-100-binary.tar.gz"]),
])
def test_card_command_offline_fails_fast_naming_every_missing_file(tmp_path, config, files):
    proc, seconds = _train_cli(config, tmp_path, {"GEDL_OFFLINE": "1"})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert seconds < 30  # ~5 s here; generous for a loaded CI machine
    for f in files:   # under a line naming its dataset's folder
        folder, name = f.split("/")
        assert f", in {tmp_path / 'empty' / folder}:" in proc.stderr, proc.stderr
        assert f"\n    {name}  " in proc.stderr, proc.stderr
    assert "extra_32x32.mat" not in proc.stderr  # never asked for
    assert max(map(len, proc.stderr.splitlines())) < 200 + len(str(tmp_path)), proc.stderr
    assert "GEDL_DATA_MIRROR" in proc.stderr
    assert "workdir: runs/" in proc.stdout  # the default workdir, printed
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("*.json"))


@pytest.mark.network
def test_the_real_official_url_serves_the_registered_file(tmp_path, monkeypatch):
    monkeypatch.delenv("GEDL_OFFLINE", raising=False)
    spec = registry.registered_files("mnist")["t10k-labels-idx1-ubyte.gz"]
    path = download.fetch_file(spec, "mnist", tmp_path, cache_root=tmp_path / "cache")
    assert path.stat().st_size == spec.size


def test_tfds_source_offline_names_every_file_the_builder_needs(tmp_path):
    with pytest.raises(data.MissingDataError) as e:
        data.ensure_available([("kmnist", "test")], tmp_path / "data", source="tfds",
                              tfds_data_dir=tmp_path / "tfds")
    msg = str(e.value)
    assert "TFDS has not prepared ['kmnist']" in msg
    assert f", in {tmp_path / 'data' / 'kmnist'}:" in msg
    for f in MNIST_FILES:  # TFDS's builder needs the training files too, not only the test split
        assert f"\n    {f}  " in msg


def test_tfds_source_fetches_every_registered_file_then_prepares_from_manual_dir(
        online, served, tmp_path, monkeypatch):
    server, _ = served
    prepared = []
    monkeypatch.setattr(data.tfds_source, "prepare_tfds",
                        lambda name, data_dir, tfds_data_dir, cache_dir=None:
                        prepared.append((name, Path(data_dir), Path(tfds_data_dir))))
    data.ensure_available([("kmnist", "test")], tmp_path / "data", source="tfds",
                          tfds_data_dir=tmp_path / "tfds", mirror=server.url)
    assert sorted(server.log) == sorted(f"/kmnist/{f}" for f in MNIST_FILES)
    assert prepared == [("kmnist", tmp_path / "data", tmp_path / "tfds")]
