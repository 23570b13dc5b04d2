#!/usr/bin/env bash
# Builds the wheel and the sdist, checks them with twine, then installs the wheel alone into a
# fresh virtual environment in an empty directory (the constraints file of that Python, as
# bin/setup.sh uses) and runs the installed commands from there:
#   gedl-train|gedl-evaluate|gedl-fetch|gedl-report|gedl-compare --help   (each exits 0)
#   gedl-train --helpfull                             (every config field with its doc)
#   gedl-train --config.learning_rat=0.1              (exit 2: the close match, `--helpfull`)
#   gedl-train --config=mnist:gedl,quick              (data from $GEDL_DATA_DIR)
#   gedl-evaluate --pretrained=mnist/gedl             (the committed numbers, offline)
# and checks that the sdist holds what its tests need (it collects them and runs a few).
#   bash tools/check_wheel.sh                   # with .venv/bin/python (PYTHON=... to choose)
#   GEDL_SKIP_TRAIN=1 bash tools/check_wheel.sh # everything but the training run
# Exit status: 0 all passed, 1 a step failed (the step is named).
set -euo pipefail
case "${1:-}" in   # --help: the comment above, before anything runs
  -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
esac
cd "$(dirname "$0")/.."
repo="$(pwd)"
PYTHON="${PYTHON:-$repo/.venv/bin/python}"
version="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
constraints="$repo/requirements/constraints-py${version}.txt"
[ -f "$constraints" ] || { echo "check_wheel: no $constraints for Python $version" >&2; exit 1; }
fail() { echo "check_wheel: FAILED: $*" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$PYTHON" -m pip install -q -c "$constraints" build twine || fail "installing build and twine"

echo "check_wheel: building the wheel and the sdist"
"$PYTHON" -m build --outdir "$work/dist" . > "$work/build.log" 2>&1 \
  || { tail -30 "$work/build.log"; fail "python -m build"; }
wheel="$(ls "$work"/dist/*.whl)"
sdist="$(ls "$work"/dist/*.tar.gz)"
"$PYTHON" -m twine check --strict "$wheel" "$sdist" || fail "twine check"

echo "check_wheel: the wheel holds the packaged configs"
"$PYTHON" - "$wheel" <<'PY' || fail "wheel contents"
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
need = {f"gedl_jax/configs/{n}.py" for n in ("__init__", "mnist", "cifar10", "cifar100")}
missing = need - names
sys.exit(f"missing from the wheel: {sorted(missing)}" if missing else 0)
PY

echo "check_wheel: installing the wheel into a fresh venv in an empty directory"
"$PYTHON" -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --upgrade pip
"$work/venv/bin/python" -m pip install -q -c "$constraints" "$wheel" || fail "pip install wheel"
mkdir "$work/empty"
cd "$work/empty"
bin="$work/venv/bin"
for command in gedl-train gedl-evaluate gedl-fetch gedl-report gedl-compare; do
  [ -x "$bin/$command" ] || fail "the wheel installed no $command command"
  "$bin/$command" --help > "$command.help" 2>&1 || { tail "$command.help"; fail "$command --help"; }
done
grep -q -- "--workdir" gedl-evaluate.help || fail "gedl-evaluate --help does not list --workdir"
"$bin/gedl-train" --helpfull > fields.txt || fail "gedl-train --helpfull"
grep -q "learning_rate" fields.txt || fail "gedl-train --helpfull does not list the config fields"
if "$bin/gedl-train" --config=mnist:gedl,quick --config.learning_rat=0.1 > misspelt.txt 2>&1; then
  fail "a misspelt config field did not fail"
fi
grep -q "did you mean 'learning_rate'.*gedl-train --helpfull" misspelt.txt \
  || { cat misspelt.txt; fail "a misspelt field's error does not name gedl-train --helpfull"; }
"$work/venv/bin/python" -c 'import gedl_jax, sys; sys.exit(0 if gedl_jax.__file__.startswith(sys.prefix) else "gedl_jax is not imported from the venv: " + gedl_jax.__file__)' \
  || fail "import location"
if [ "${GEDL_SKIP_TRAIN:-0}" != 1 ]; then
  [ -n "${GEDL_DATA_DIR:-}" ] || fail "GEDL_DATA_DIR is not set (the quick MNIST run needs the data)"
  echo "check_wheel: gedl-train --config=mnist:gedl,quick (from an empty directory)"
  "$bin/gedl-train" --config=mnist:gedl,quick --workdir=run \
    > train.log 2>&1 || { tail -30 train.log; fail "the quick MNIST run"; }
  tail -15 train.log
  [ -f run/eval_results.json ] || fail "the quick MNIST run wrote no eval_results.json"
  echo "check_wheel: gedl-evaluate --pretrained=mnist/gedl (the shipped weights)"
  "$bin/gedl-evaluate" --pretrained=mnist/gedl > pretrained.log 2>&1 \
    || { tail -30 pretrained.log; fail "gedl-evaluate --pretrained=mnist/gedl"; }
  # The committed headline numbers of the run the weights come from (registry.json).
  grep -q "| gedl | 99.41 | 99.93 | 91.34 | 90.15 | 98.86 | 96.49 |" pretrained.log \
    || { tail -30 pretrained.log; fail "evaluate --pretrained=mnist/gedl printed other numbers"; }
fi

echo "check_wheel: the sdist holds what its tests need"
cd "$work"
tar -xzf "$sdist"
src="$(ls -d "$work"/gedl_jax-*/)"
for f in tests/conftest.py gedl_jax/configs/mnist.py requirements/constraints-py${version}.txt \
         notebooks/quickstart.ipynb LICENSE CITATION.cff CHANGELOG.md; do
  [ -e "$src/$f" ] || fail "the sdist lacks $f"
done
[ ! -e "$src/docs/results" ] || fail "the sdist carries docs/results (MANIFEST.in prunes it)"
# Collect every test and run a few cheap ones against the sdist's own files (the package from
# the sdist: PYTHONPATH puts it before any installed copy).
(cd "$src" && PYTHONPATH="$src" "$PYTHON" -m pytest -q -n 0 -p no:cacheprovider --collect-only \
   > "$work/collect.log" 2>&1) || { tail -20 "$work/collect.log"; fail "collecting the sdist's tests"; }
(cd "$src" && PYTHONPATH="$src" "$PYTHON" -m pytest -q -n 0 -p no:cacheprovider \
   tests/test_configs.py tests/test_layout.py > "$work/sdist_tests.log" 2>&1) \
  || { tail -20 "$work/sdist_tests.log"; fail "the sdist's tests"; }
tail -1 "$work/collect.log"
echo "check_wheel: OK ($(basename "$wheel"), $(basename "$sdist"))"
