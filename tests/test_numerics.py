"""The numerics policy (gedl_jax/run/numerics.py): `config.matmul_precision` reaches every program
a run traces, the deterministic-kernel flags are set before the backend starts and never
override the user's, and a run records both.

A CPU computes float32 products whatever the precision, so these tests check what the programs
ask for (the precision in the lowered StableHLO) and that on a CPU the two settings give the same
numbers; what TF32 changes on a GPU is measured by tools/gpu_check.sh.
"""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from test_train import data_dir, tiny_config  # noqa: F401

from gedl_jax import config as config_lib
from gedl_jax import configs, train
from gedl_jax.run import numerics


def _conv_and_dot(x, w, a, b):
    conv = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                        dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return conv.sum(), a @ b


def _inputs():
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    return (jax.random.normal(keys[0], (2, 8, 8, 3)), jax.random.normal(keys[1], (3, 3, 3, 4)),
            jax.random.normal(keys[2], (5, 7)), jax.random.normal(keys[3], (7, 6)))


@pytest.mark.parametrize("value,expected", [("highest", "HIGHEST"), ("default", "DEFAULT")])
def test_the_configs_precision_is_what_the_traced_programs_ask_for(value, expected):
    config = configs.build_config("mnist", "gedl")
    config.matmul_precision = value
    with numerics.precision(config):
        text = jax.jit(_conv_and_dot).lower(*_inputs()).as_text()
    lines = [line for line in text.splitlines() if "convolution" in line or "dot_general" in line]
    assert len(lines) == 2
    if expected == "HIGHEST":
        assert all("HIGHEST" in line for line in lines), lines
    else:   # the default: no precision attribute above DEFAULT
        assert not any("HIGHEST" in line or "HIGH>" in line for line in lines), lines


def test_an_unknown_precision_is_refused():
    config = configs.build_config("mnist", "gedl")
    config.matmul_precision = "tf32"
    with pytest.raises(ValueError, match="matmul_precision"):
        config_lib.validate(config)


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="a CPU fact: on a GPU 'default' "
                    "means TF32 products, which differ")
def test_on_a_cpu_both_precisions_compute_the_same_numbers():
    outs = []
    for value in numerics.PRECISIONS:
        with jax.default_matmul_precision(value):
            outs.append(jax.jit(_conv_and_dot)(*_inputs()))
    for a, b in zip(*outs, strict=True):
        np.testing.assert_array_equal(a, b)


def test_flags_are_added_once_and_the_users_own_setting_is_kept():
    flags = numerics.determinism_flags("/w/xla_autotune")
    assert flags == ["--xla_gpu_exclude_nondeterministic_ops=true",
                     "--xla_gpu_per_fusion_autotune_cache_dir=/w/xla_autotune"]
    merged = numerics.with_flags("--xla_foo=1", flags)
    assert merged.split() == ["--xla_foo=1", *flags]
    assert numerics.with_flags(merged, flags) == merged        # idempotent
    user = "--xla_gpu_exclude_nondeterministic_ops=false"
    assert numerics.with_flags(user, flags).split() == [user, flags[1]]   # theirs stays


@pytest.mark.parametrize(("xla_flags", "in_force"), [
    ("", False), ("--xla_gpu_exclude_nondeterministic_ops=true", True),
    ("--xla_gpu_deterministic_ops=true", True), ("--xla_gpu_deterministic_ops", True),
    ("--xla_gpu_exclude_nondeterministic_ops=false", False),
    ("--xla_gpu_deterministic_ops=false --xla_foo=1", False)])
def test_either_determinism_flag_counts_as_in_force(monkeypatch, xla_flags, in_force):
    monkeypatch.setenv("XLA_FLAGS", xla_flags)
    assert numerics.flags_in_force() is in_force


def test_a_new_process_gets_the_flags_before_its_backend_starts(tmp_path):
    """What the training CLI does first: the flags are in XLA_FLAGS when jax starts, the
    autotuning folder is named inside the workdir (made once the run has checked its inputs),
    and a second call after the backend started changes nothing."""
    script = (
        "import os, sys\n"
        "from gedl_jax.run import numerics\n"
        "assert numerics.configure_process(True, sys.argv[1])\n"
        "import jax; jax.devices()\n"
        "assert numerics.backend_started() and numerics.flags_in_force()\n"
        "before = os.environ['XLA_FLAGS']\n"
        "assert numerics.configure_process(True, sys.argv[1] + '_other') is True\n"
        "assert os.environ['XLA_FLAGS'] == before\n"
        "numerics.make_autotune_folder()\n"
        "print(before)\n")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "w")], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == numerics.determinism_flags(tmp_path / "w" / "xla_autotune")
    assert (tmp_path / "w" / "xla_autotune").is_dir()
    off = subprocess.run([sys.executable, "-c", "from gedl_jax.run import numerics\n"
                          "assert numerics.configure_process(False, 'w') is False\n"
                          "import os; print(os.environ.get('XLA_FLAGS', ''))"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert off.returncode == 0 and off.stdout.strip() == "", off.stderr


def test_a_run_prints_and_records_its_numerics(data_dir, tmp_path, capsys):
    c = tiny_config(data_dir, num_epochs=1, evaluate_at_end=True, eval_examples=20,
                    matmul_precision="highest")
    summary = train.train_and_evaluate(c, tmp_path)
    first_line = capsys.readouterr().out.splitlines()[0]
    assert "matmul_precision highest" in first_line
    assert json.loads((tmp_path / "config.json").read_text())["matmul_precision"] == "highest"
    recorded = json.loads((tmp_path / "eval_results.json").read_text())["numerics"]
    assert recorded == summary["evaluation"]["numerics"]
    assert recorded["matmul_precision"] == "highest" and recorded["deterministic"] is True
    assert recorded["backend"] == jax.default_backend()
    assert recorded["host_cpu"] == numerics.host_cpu()
    # the precision is part of what a resumed run must match; the kernels' flag is not
    with pytest.raises(train.ConfigMismatchError, match="matmul_precision"):
        train.train_and_evaluate(tiny_config(data_dir, num_epochs=1, evaluate_at_end=True,
                                             eval_examples=20), tmp_path)
    assert "deterministic" in config_lib.RESUME_SAFE_FIELDS


def test_the_host_cpu_is_described_from_cpuinfo():
    """Model, architecture and the widest vector extension XLA:CPU may compile for (the same
    model evaluated on two CPUs can differ in the last bits of its float32 outputs)."""
    x86 = ("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9454\n"
           "flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw\n\n"
           "processor\t: 1\nmodel name\t: other\nflags\t\t: fpu\n")
    assert numerics.describe_cpu(x86, "x86_64") == "AMD EPYC 9454 (x86_64, avx512f)"
    no_avx512 = x86.replace(" avx512f avx512bw", "")
    assert numerics.describe_cpu(no_avx512, "x86_64") == "AMD EPYC 9454 (x86_64, avx2)"
    arm = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes sve\nCPU part\t: 0xd40\n"
    assert numerics.describe_cpu(arm, "aarch64", "arm") == "arm (aarch64, sve)"
    assert numerics.describe_cpu("", "", "") == "unknown CPU"
    assert numerics.host_cpu() == numerics.host_cpu() != ""
