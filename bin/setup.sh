#!/usr/bin/env bash
# One command that sets gedl-jax up on a fresh machine: a virtual environment in .venv with the
# exact tested dependency set (requirements/constraints.txt) and the package in editable mode.
#   bash bin/setup.sh                 # CPU
#   GEDL_EXTRAS=dev,gpu bash bin/setup.sh   # + jax[cuda12] on an NVIDIA machine
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${GEDL_VENV:-.venv}"
EXTRAS="${GEDL_EXTRAS:-dev}"
"$PYTHON" - <<'PY'
import sys
if sys.version_info < (3, 11):
    sys.exit(f"gedl-jax needs Python >= 3.11, this is {sys.version.split()[0]}; set PYTHON=python3.11")
PY
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
constraints=()
# The constraints pin the set tested on Python 3.11 (CPU); on other Pythons let pip resolve.
if "$VENV/bin/python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  constraints=(-c requirements/constraints.txt)
fi
"$VENV/bin/python" -m pip install -q "${constraints[@]}" -e ".[${EXTRAS}]"
"$VENV/bin/python" -c 'import jax, flax, gedl_jax; print(f"gedl-jax {gedl_jax.__version__} ready: jax {jax.__version__} on {jax.default_backend()}, flax {flax.__version__}")'
