#!/usr/bin/env bash
# Sets gedl-jax up on a fresh machine: a virtual environment in .venv with the exact tested
# dependency set for this Python (requirements/constraints-py<major>.<minor>.txt) and the package
# in editable mode. bin/train and bin/test run it for you when .venv is missing or out of date;
# run it yourself for the venv alone, another interpreter or the GPU extras:
#   bash bin/setup.sh                                  # CPU, the newest tested Python found
#   GEDL_EXTRAS=dev,cuda12 bash bin/setup.sh           # + jax[cuda12] on an NVIDIA machine
#   PYTHON=python3.11 GEDL_VENV=.venv-py311 bash bin/setup.sh   # another interpreter
#   bash bin/setup.sh --check       # is the venv set up? Exit 0 yes; 1 no, with the reason
#   bash bin/setup.sh --if-needed   # set up only when missing or out of date (bin/train, bin/test)
# Without PYTHON it keeps the venv's own Python where the venv exists, else it takes the newest
# interpreter that has a constraints file (python3.X on PATH or a pyenv version 3.X.*), else
# python3: the newest stack is the fastest (on a 2-core CPU the ConvNet train step runs ~1.5x
# faster under Python 3.13 / jax 0.12 than under Python 3.11, whose newest jax is 0.10.2;
# docs/performance.md). A Python without a constraints file resolves freely (newest versions the
# bounds in pyproject.toml allow), with a warning: not what CI tests.
# Out of date: the venv lacks the record a finished setup writes ($VENV/.gedl-setup-stamp), or
# the constraints file of its Python or the [project] table of pyproject.toml (the dependencies
# and extras) changed since, or GEDL_EXTRAS names other extras than it was set up with. Setting
# up again installs in place, with the extras recorded unless GEDL_EXTRAS names others. Two
# setups of one venv never run at once (flock, where present).
case "${1:-}" in   # --help: the comment above, before anything runs
  -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
esac
set -euo pipefail
cd "$(dirname "$0")/.."

mode="${1:-}"
case "$#:$mode" in
  0: | 1:--check | 1:--if-needed) ;;
  *) echo "error: bin/setup.sh takes no argument but --check or --if-needed, not '$*'" >&2
     exit 2 ;;
esac
VENV="${GEDL_VENV:-.venv}"
STAMP="$VENV/.gedl-setup-stamp"
# What a setup from scratch takes on this project's 2-core CPU (from a fresh clone with pip's
# cache warm: 2 min 22 s wall, 65 s of CPU time, while other jobs shared the two cores).
DURATION="1.5-2.5 minutes on a 2-core CPU"

# The record a finished setup writes (`write STAMP EXTRAS`), or the reason the venv no longer
# matches it (`check STAMP`: nothing when it does). Run by the venv's Python, from the root.
STAMP_PY='
import hashlib, json, pathlib, sys, tomllib
mode, stamp = sys.argv[1], pathlib.Path(sys.argv[2])
version = "%d.%d" % sys.version_info[:2]
constraints = pathlib.Path(f"requirements/constraints-py{version}.txt")
pyproject = tomllib.loads(pathlib.Path("pyproject.toml").read_text())
installed_from = json.dumps({k: pyproject.get(k) for k in ("project", "build-system")},
                            sort_keys=True)
current = {
    "python": version,
    "constraints": (f"{constraints} sha256:{hashlib.sha256(constraints.read_bytes()).hexdigest()}"
                    if constraints.exists() else "none"),
    "pyproject.toml": "sha256:" + hashlib.sha256(installed_from.encode()).hexdigest(),
}
if mode == "write":
    stamp.write_text("# what bin/setup.sh installed this venv from (bin/setup.sh --check)\n"
                     + "".join(f"{k} {v}\n" for k, v in {**current, "extras": sys.argv[3]}.items()))
    sys.exit()
recorded = dict(line.split(" ", 1) for line in stamp.read_text().splitlines() if " " in line)
changed = {
    "python": f"its Python {version} is not the one it was set up with",
    "constraints": (f"{constraints} changed since it was set up" if constraints.exists()
                    else f"{constraints} was removed since it was set up"),
    "pyproject.toml": "the dependencies in pyproject.toml changed since it was set up",
}
print(next((changed[k] for k, v in current.items() if recorded.get(k) != v), ""))
'

# Why $VENV needs a setup, or nothing when it is set up for the current files.
setup_needed() {
  local reason
  if [ ! -e "$VENV" ]; then
    echo "$VENV does not exist"
  elif [ ! -x "$VENV/bin/python" ]; then
    echo "$VENV/bin/python is missing"
  elif ! reason="$("$VENV/bin/python" -c "$STAMP_PY" check "$STAMP" 2>/dev/null)"; then
    if [ -f "$STAMP" ]; then echo "$VENV's Python does not run"
    else echo "$VENV has no record of a finished setup"; fi
  elif [ -n "$reason" ]; then
    echo "$VENV is out of date: $reason"
  elif [ -n "${GEDL_EXTRAS:-}" ] && [ "$GEDL_EXTRAS" != "$(sed -n 's/^extras //p' "$STAMP")" ]; then
    echo "$VENV was set up with the extras [$(sed -n 's/^extras //p' "$STAMP")], not [$GEDL_EXTRAS]"
  fi
}

if [ "$mode" = --check ]; then
  reason="$(setup_needed)"
  if [ -z "$reason" ]; then echo "setup: $VENV is set up"; exit 0; fi
  echo "setup: $reason"
  exit 1
fi
reason=""
if [ "$mode" = --if-needed ]; then
  reason="$(setup_needed)"
  [ -n "$reason" ] || exit 0
fi
mkdir -p "$VENV"
if command -v flock >/dev/null 2>&1; then
  exec 9>"$VENV/.gedl-setup.lock"
  flock 9
  # another setup of this venv may have finished while this one waited
  [ "$mode" != --if-needed ] || [ -n "$(setup_needed)" ] || exit 0
fi

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
python_version() { "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null; }

venv_version="$(python_version "$VENV/bin/python" || true)"
if [ -z "${PYTHON:-}" ] && [ -n "$venv_version" ]; then
  PYTHON="$(find_python "$venv_version" || true)"
fi
if [ -z "${PYTHON:-}" ]; then
  PYTHON=python3
  for version in $(ls requirements/constraints-py*.txt | sed 's/.*constraints-py\(.*\)\.txt/\1/' |
                   sort -V -r); do
    if found="$(find_python "$version")"; then
      PYTHON="$found"
      break
    fi
  done
fi
if [ -f "$STAMP" ] && [ -z "${GEDL_EXTRAS:-}" ]; then
  EXTRAS="$(sed -n 's/^extras //p' "$STAMP")"
fi
EXTRAS="${GEDL_EXTRAS:-${EXTRAS:-dev}}"
if ! command -v "$PYTHON" >/dev/null 2>&1; then
  echo "setup: interpreter '$PYTHON' not found; set PYTHON to a Python >= 3.11" >&2
  exit 1
fi
"$PYTHON" - <<'PY'
import sys
if sys.version_info < (3, 11):
    sys.exit(f"gedl-jax needs Python >= 3.11, this is {sys.version.split()[0]}; set PYTHON=python3.11")
PY
version="$(python_version "$PYTHON")"
constraints_file="requirements/constraints-py${version}.txt"
constraints=()
if [ -f "$constraints_file" ]; then
  constraints=(-c "$constraints_file")
  installs="gedl-jax[${EXTRAS}] into $VENV with Python $version ($PYTHON) and $constraints_file"
else
  tested="$(ls requirements/constraints-py*.txt | sed 's/.*constraints-py\(.*\)\.txt/\1/' |
            paste -sd, -)"
  echo "setup: WARNING: no $constraints_file; resolving freely for Python $version" \
       "(CI tests Python $tested: use one of those for the tested dependency set)" >&2
  installs="gedl-jax[${EXTRAS}] into $VENV with Python $version ($PYTHON), no constraints file"
fi
echo "setup: ${reason:+$reason: }installing $installs, $DURATION ..."
venv_options=()
# a venv of another Python is made afresh, not mixed with this one
[ -z "$venv_version" ] || [ "$venv_version" = "$version" ] || venv_options=(--clear)
rm -f "$STAMP"
"$PYTHON" -m venv "${venv_options[@]}" "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "${constraints[@]}" -e ".[${EXTRAS}]"
"$VENV/bin/python" -c 'import jax, flax, gedl_jax, sys; print(f"gedl-jax {gedl_jax.__version__} ready: Python {sys.version.split()[0]}, jax {jax.__version__} on {jax.default_backend()}, flax {flax.__version__}")'
"$VENV/bin/python" -c "$STAMP_PY" write "$STAMP" "$EXTRAS"
