#!/usr/bin/env bash
# One command that sets gedl-jax up on a fresh machine: a virtual environment in .venv with the
# exact tested dependency set for this Python (requirements/constraints-py<major>.<minor>.txt)
# and the package in editable mode.
#   bash bin/setup.sh                                  # CPU, the default python3
#   GEDL_EXTRAS=dev,cuda12 bash bin/setup.sh           # + jax[cuda12] on an NVIDIA machine
#   PYTHON=python3.13 GEDL_VENV=.venv-py313 bash bin/setup.sh   # another interpreter
# A Python without a constraints file resolves freely (newest versions the bounds in
# pyproject.toml allow), with a warning: that combination is not the one CI tests.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
VENV="${GEDL_VENV:-.venv}"
EXTRAS="${GEDL_EXTRAS:-dev}"
if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "setup: interpreter '$PYTHON' not found; set PYTHON to a Python >= 3.11" >&2
  exit 1
fi
"$PYTHON" - <<'PY'
import sys
if sys.version_info < (3, 11):
    sys.exit(f"gedl-jax needs Python >= 3.11, this is {sys.version.split()[0]}; set PYTHON=python3.11")
PY
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
version="$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
constraints_file="requirements/constraints-py${version}.txt"
constraints=()
if [ -f "$constraints_file" ]; then
  constraints=(-c "$constraints_file")
else
  tested="$(ls requirements/constraints-py*.txt | sed 's/.*constraints-py\(.*\)\.txt/\1/' |
            paste -sd, -)"
  echo "setup: WARNING: no $constraints_file; resolving freely for Python $version" \
       "(CI tests Python $tested: use one of those for the tested dependency set)" >&2
fi
"$VENV/bin/python" -m pip install -q "${constraints[@]}" -e ".[${EXTRAS}]"
"$VENV/bin/python" -c 'import jax, flax, gedl_jax, sys; print(f"gedl-jax {gedl_jax.__version__} ready: Python {sys.version.split()[0]}, jax {jax.__version__} on {jax.default_backend()}, flax {flax.__version__}")'
