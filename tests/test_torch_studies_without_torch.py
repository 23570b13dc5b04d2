"""The PyTorch paths of the speed studies without torch (not a gedl-jax dependency): one error
line saying how to get it, exit 2, no traceback. torch's absence is simulated by a `torch`
package first on the path whose import fails, so the test runs the same with torch installed."""

import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture
def no_torch_env(tmp_path):
    fake = tmp_path / "fake" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named torch (simulated)')\n")
    return {**os.environ, "JAX_PLATFORMS": "cpu",
            "PYTHONPATH": os.pathsep.join([str(fake.parent), str(REPO)])}


@pytest.mark.parametrize("args", [
    ["studies.profile_models", "--torch", "--rounds=1", "--repeats=1"],
    ["studies.profile_step", "--framework=torch", "--steps=1"],
    ["studies.speed_vs_torch", "--rounds=1", "--steps=1"],
])
def test_a_torch_path_without_torch_is_one_error_line_and_exit_2(args, no_torch_env, tmp_path):
    proc = subprocess.run([sys.executable, "-m", *args], cwd=tmp_path, env=no_torch_env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "error:" in lines[0] and "pip install torch" in lines[0], lines
    assert "Traceback" not in proc.stderr + proc.stdout
