#!/usr/bin/env bash
# A release's dry run: it checks that the version, its tag, the changelog and the notebooks agree,
# builds the sdist and the wheel into dist/, checks them with twine, and prints what it would
# upload. It never uploads, tags or pushes: the commands it prints do that, by hand.
#   bash tools/release.sh                 # the tag is HEAD's v* tag, else v<gedl_jax.__version__>
#   bash tools/release.sh --tag=v0.1.0    # the tag to check (before creating it)
#   bash tools/release.sh --checks-only   # the agreement checks alone: no build (seconds)
# Checked: the tag is v<gedl_jax.__version__>; CHANGELOG.md has an "## Unreleased" section above
# the version's "## <version> (<date>)"; CITATION.cff states the version and that date; every
# notebook installs that tag (REPO_REF); the distributions are named after the version and pass
# `twine check --strict`. tools/check_wheel.sh installs the wheel into a fresh venv and runs it:
# run it too.
# Exit status: 0 ready to publish, 1 a check failed (named), 2 a bad argument.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
tag="" build=1
for arg in "$@"; do
  case "$arg" in
    --tag=*) tag="${arg#--tag=}" ;;
    --checks-only) build=0 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' tools/release.sh; exit 0 ;;
    *) echo "release: unknown argument $arg (see: bash tools/release.sh --help)" >&2; exit 2 ;;
  esac
done
fail() { echo "release: FAILED: $*" >&2; exit 1; }

version="$(PYTHONPATH="$PWD" "$PYTHON" -c 'import gedl_jax; print(gedl_jax.__version__)')" \
  || fail "importing gedl_jax with $PYTHON"
if [ -z "$tag" ]; then
  tag="$(git tag --points-at HEAD --list 'v*' 2>/dev/null | head -1 || true)"
  if [ -z "$tag" ]; then
    tag="v$version"
    echo "release: HEAD has no v* tag; checking the tag it would get, $tag"
  fi
fi
[ "$tag" = "v$version" ] || fail "the tag $tag is not v$version (gedl_jax.__version__ is $version)"

echo "release: the changelog, the citation and the notebooks name $version / $tag"
"$PYTHON" - "$version" "$tag" <<'PY' || fail "the files above disagree with the version"
import json, pathlib, re, sys
version, tag = sys.argv[1:]
problems = []
changelog = pathlib.Path("CHANGELOG.md").read_text()
headings = re.findall(r"^## (.+)$", changelog, re.M)
if not headings or headings[0] != "Unreleased":
    problems.append('CHANGELOG.md: the first section is not "## Unreleased"')
released = [h for h in headings if re.fullmatch(rf"{re.escape(version)} \(\d{{4}}-\d\d-\d\d\)", h)]
if not released:
    problems.append(f'CHANGELOG.md: no "## {version} (YYYY-MM-DD)" section')
elif headings[1:2] != released[:1]:
    problems.append(f"CHANGELOG.md: the {version} section is not the one after Unreleased")
citation = pathlib.Path("CITATION.cff").read_text()
if not re.search(rf"^version: {re.escape(version)}$", citation, re.M):
    problems.append(f"CITATION.cff: not version {version}")
dates = re.findall(r'^date-released: "?([\d-]+)"?$', citation, re.M)
if released and dates != [released[0][-11:-1]]:
    problems.append(f"CITATION.cff: date-released {dates}, not the changelog's {released[0]}")
for path in sorted(pathlib.Path("notebooks").glob("*.ipynb")):
    code = "".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"]
                   if c["cell_type"] == "code")
    refs = re.findall(r'^REPO_REF = "([^"]*)"', code, re.M)
    if refs != [tag]:
        problems.append(f"{path}: installs REPO_REF {refs}, not {tag}")
print("\n".join(f"  {p}" for p in problems) or f"  CHANGELOG.md, CITATION.cff, notebooks/: {tag}")
sys.exit(1 if problems else 0)
PY
if [ -n "$(git status --porcelain 2>/dev/null)" ]; then
  echo "release: warning: the working tree has uncommitted changes; a release builds from the" \
       "tagged commit"
fi
[ "$build" = 1 ] || { echo "release: checks passed (--checks-only: nothing built)"; exit 0; }

version_py="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
constraints=()
[ -f "requirements/constraints-py${version_py}.txt" ] \
  && constraints=(-c "requirements/constraints-py${version_py}.txt")
"$PYTHON" -c 'import build, twine' 2>/dev/null \
  || "$PYTHON" -m pip install -q "${constraints[@]}" build twine \
  || fail "installing build and twine"
rm -f "dist/gedl_jax-$version"*
echo "release: building the sdist and the wheel into dist/"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
"$PYTHON" -m build --outdir dist . > "$log" 2>&1 || { tail -30 "$log"; fail "python -m build"; }
files=("dist/gedl_jax-$version.tar.gz" "dist/gedl_jax-$version-py3-none-any.whl")
for f in "${files[@]}"; do
  [ -f "$f" ] || fail "python -m build wrote no $f"
done
"$PYTHON" -m twine check --strict "${files[@]}" || fail "twine check"
echo "release: ready to publish gedl-jax $version. Nothing was uploaded; it would upload:"
for f in "${files[@]}"; do
  printf '  %s  %s bytes  sha256 %s\n' "$f" "$(wc -c < "$f")" "$(sha256sum "$f" | cut -d' ' -f1)"
done
echo "by hand, from this commit:"
echo "  git tag -a $tag -m 'gedl-jax $version' && git push origin $tag"
echo "  $PYTHON -m twine upload ${files[*]}"
