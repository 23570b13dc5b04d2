#!/usr/bin/env bash
# One command that sets gedl-jax up on a fresh machine: a virtual environment in .venv with the
# exact tested dependency set for this Python (requirements/constraints-py<major>.<minor>.txt)
# and the package in editable mode.
#   bash bin/setup.sh                                  # CPU, the newest tested Python found
#   GEDL_EXTRAS=dev,cuda12 bash bin/setup.sh           # + jax[cuda12] on an NVIDIA machine
#   PYTHON=python3.11 GEDL_VENV=.venv-py311 bash bin/setup.sh   # another interpreter
# Without PYTHON it takes the newest interpreter that has a constraints file (python3.X on PATH
# or a pyenv version 3.X.*), else python3: the newest stack is the fastest (on a 2-core CPU the
# ConvNet train step runs ~1.5x faster under Python 3.13 / jax 0.12 than under Python 3.11, whose
# newest jax is 0.10.2; docs/performance.md). A Python without a constraints file resolves freely
# (newest versions the bounds in pyproject.toml allow), with a warning: not what CI tests.
set -euo pipefail
cd "$(dirname "$0")/.."

# The first candidate interpreter for Python 3.X that runs and really is 3.X (a pyenv shim named
# python3.X exists even where that version is not selected, and then fails).
find_python() {
  local version="$1" root p
  root="$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-$HOME/.pyenv}")"
  for p in "python$version" $(ls -d "$root"/versions/"$version".*/bin/python"$version" \
                               2>/dev/null | sort -V -r); do
    if "$p" -c "import sys; sys.exit('%d.%d' % sys.version_info[:2] != '$version')" \
        >/dev/null 2>&1; then
      echo "$p"
      return 0
    fi
  done
  return 1
}

if [ -z "${PYTHON:-}" ]; then
  PYTHON=python3
  for version in $(ls requirements/constraints-py*.txt | sed 's/.*constraints-py\(.*\)\.txt/\1/' |
                   sort -V -r); do
    if found="$(find_python "$version")"; then
      PYTHON="$found"
      break
    fi
  done
  echo "setup: using $PYTHON (the newest Python with a tested dependency set here;" \
       "PYTHON=... to choose)"
fi
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
