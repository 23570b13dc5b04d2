"""The list fields on the command line: `--config.ood_datasets=npz:far.npz,npz:near.npz` (the
form docs/library.md shows), npz: entries mixed with built-in names, and the other list forms,
parsed as the CLI parses them and trained (tiny) and evaluated on every named set."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from data_fixtures import write_npz
from training_fixtures import REPO, cli_args, subprocess_env, write_tiny_mnist

PARSE_ONLY = """
import sys
from absl import flags
from gedl_jax import config as config_lib
from gedl_jax import configs
configs.define_config_flag("config")
flags.FLAGS(["prog", "--config=mnist:gedl", *sys.argv[1:]])
config = config_lib.normalize_lists(flags.FLAGS.config)
print(repr((config.seeds, config.ood_datasets, config.extra_ood)))
"""


@pytest.mark.parametrize("args,expected", [
    (["--config.ood_datasets=npz:far.npz,npz:near.npz"], ((), ("npz:far.npz", "npz:near.npz"), ())),
    (["--config.ood_datasets=kmnist,npz:x.npz", "--config.extra_ood=npz:/d/a b.npz,fashion_mnist"],
     ((), ("kmnist", "npz:x.npz"), ("npz:/d/a b.npz", "fashion_mnist"))),
    (["--config.ood_datasets=npz:a.npz,tfds:svhn_cropped,kmnist"],
     ((), ("npz:a.npz", "tfds:svhn_cropped", "kmnist"), ())),
    (["--config.seeds=0,1,2", "--config.ood_datasets=kmnist"], ((0, 1, 2), ("kmnist",), ())),
    (["--config.seeds=3", "--config.ood_datasets="], ((3,), (), ())),
    (["--config.seeds=(4, 5)", "--config.ood_datasets=('kmnist', 'npz:a.npz')"],
     ((4, 5), ("kmnist", "npz:a.npz"), ())),
    (["--config.seeds=1", "--config.seeds=2"], ((1, 2), ("kmnist", "fashion_mnist"), ())),
])
def test_list_fields_parse_from_the_command_line(tmp_path, args, expected):
    proc = subprocess.run([sys.executable, "-c", PARSE_ONLY, *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env=subprocess_env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == repr(expected)


def test_npz_ood_sets_mixed_with_a_built_in_one_train_and_evaluate(tmp_path):
    data_dir = write_tiny_mnist(tmp_path / "data")
    rng = np.random.default_rng(1)
    write_npz(data_dir / "kmnist" / "test.npz",
              rng.integers(0, 256, (40, 28, 28), dtype=np.uint8), np.arange(40) % 10)
    for name, n in (("far", 30), ("near", 20)):
        np.savez(tmp_path / f"{name}.npz",
                 test_images=rng.integers(0, 256, (n, 28, 28, 1), dtype=np.uint8))
    proc = subprocess.run(
        cli_args(tmp_path / "w", data_dir, num_epochs=1, evaluate_at_end=True,
                 ood_datasets=f"npz:{tmp_path}/far.npz,kmnist,npz:{tmp_path}/near.npz",
                 allow_chance=True),
        cwd=REPO, env=subprocess_env(tmp_path / "cache"), capture_output=True, text=True,
        timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads((tmp_path / "w" / "eval_results.json").read_text())
    assert sorted(results["ood"]) == sorted([f"npz:{tmp_path}/far.npz", "kmnist",
                                             f"npz:{tmp_path}/near.npz"])
    # each set's own size (not a running total), and the results' path last
    assert "evaluated kmnist: 40 images in" in proc.stdout
    assert f"evaluated npz:{tmp_path}/near.npz: 20 images in" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == \
        f"results: {tmp_path / 'w' / 'eval_results.json'}"
