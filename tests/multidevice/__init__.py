"""Multi-device tests as real scripts (linted, readable), run with fake CPU devices.

The number of devices must be fixed before JAX initialises, so each script runs in its own
process: `run_script("x.py", devices=4)` starts `python tests/multidevice/x.py` with
XLA_FLAGS=--xla_force_host_platform_device_count=4 on the CPU backend and checks that it exits
0 and prints a last line starting with "OK". Each script asserts its device count first.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]


def multidevice_env(devices: int) -> dict[str, str]:
    env = dict(os.environ)
    flag = f"--xla_force_host_platform_device_count={devices}"
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {flag}".strip()
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


def run_script(script: str, devices: int = 4, timeout: float = 600, args: tuple[str, ...] = ()
               ) -> str:
    """Run tests/multidevice/<script> [args] on `devices` fake CPU devices; returns its
    stdout."""
    proc = subprocess.run([sys.executable, str(HERE / script), *args], cwd=REPO,
                          env=multidevice_env(devices), capture_output=True, text=True,
                          timeout=timeout)
    assert proc.returncode == 0, f"{script}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    lines = proc.stdout.strip().splitlines()
    assert lines and lines[-1].startswith("OK"), f"{script}: no OK line\n{proc.stdout}"
    return proc.stdout
