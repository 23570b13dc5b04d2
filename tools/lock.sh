#!/usr/bin/env bash
# Writes requirements/constraints-py<major>.<minor>.txt for one interpreter: a fresh virtual
# environment, `pip install -e .[dev,docs,release]`, `pip check`, then `pip freeze` (the package itself left out).
#   PYTHON=python3.13 bash tools/lock.sh          # resolve afresh: newest versions the bounds allow
#   PYTHON=python3.11 bash tools/lock.sh --keep   # keep the file's pins, resolve only what is new
# bin/setup.sh installs with the file for its interpreter; CI tests 3.11 and 3.13 (.ci/run).
case "${1:-}" in   # --help: the comment above, before anything runs
  -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
esac
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
keep=0
[ "${1:-}" = "--keep" ] && keep=1
version="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
out="requirements/constraints-py${version}.txt"
venv="$(mktemp -d)/venv"
"$PYTHON" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
constraints=()
if [ "$keep" = 1 ] && [ -f "$out" ]; then
  constraints=(-c "$out")
fi
"$venv/bin/python" -m pip install -q "${constraints[@]}" -e ".[dev,docs,release]"
"$venv/bin/python" -m pip check
{ echo "# Exact set tested on Python $version: fresh venv, pip install -e .[dev,docs,release],"
  echo "# pip check, pip freeze (tools/lock.sh$([ "$keep" = 1 ] && echo " --keep")). Used by bin/setup.sh and .ci/run."
  "$venv/bin/python" -m pip freeze --exclude-editable; } > "$out.tmp"
mv "$out.tmp" "$out"
rm -rf "$(dirname "$venv")"
echo "wrote $out (Python $("$PYTHON" -c 'import sys; print(sys.version.split()[0])'))"
