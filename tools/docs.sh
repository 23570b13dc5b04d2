#!/usr/bin/env bash
# Builds the docs site into site/ with warnings as errors (mkdocs.yml: MkDocs Material,
# mkdocstrings for the API reference, mkdocs-jupyter renders the notebooks without running them;
# the quickstart is also run here, in its smoke setting on the CPU, into the staged
# docs/executed/quickstart.ipynb, the page with its outputs: a minute, with GEDL_DATA_DIR holding
# MNIST, KMNIST and Fashion-MNIST (`python -m tools.executed_notebook`; nothing executed is
# committed).
#   bash tools/docs.sh            # build into site/ (open site/index.html)
#   bash tools/docs.sh serve      # live preview on http://127.0.0.1:8000
# Installs the `docs` extra into the venv first when mkdocs is missing (the pins of
# requirements/constraints-py<version>.txt). The pages are staged into build/docs_src with the
# repository's layout, so the relative links of the README and docs/ work on the site too, and
# each API reference page (api/<module>.md) is generated here from the list in mkdocs.yml
# (tools/api_pages.py).
set -euo pipefail
case "${1:-}" in   # --help: the comment above, before anything runs
  -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
esac
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
export NO_MKDOCS_2_WARNING=1   # Material's banner about its successor: not a warning about our pages
if ! "$PYTHON" -c 'import mkdocs, material, mkdocstrings_handlers.python, mkdocs_jupyter, nbclient, ipykernel' \
    2>/dev/null; then
  version="$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
  constraints=()
  [ -f "requirements/constraints-py${version}.txt" ] \
    && constraints=(-c "requirements/constraints-py${version}.txt")
  echo "docs: installing the docs extra" >&2
  "$PYTHON" -m pip install -q "${constraints[@]}" -e ".[docs]"
fi
stage=build/docs_src
rm -rf "$stage"
mkdir -p "$stage/api"
# The files the pages link to: the pages themselves and the code, configs and scripts they name.
for f in README.md CHANGELOG.md CITATION.cff LICENSE pyproject.toml docs notebooks gedl_jax \
         configs bin tools studies tests requirements; do
  [ -e "$f" ] && cp -r "$f" "$stage/"
done
find "$stage" \( -name __pycache__ -o -name .ipynb_checkpoints \) -prune -exec rm -rf {} +
# API reference: one page per "gedl_jax.<name>: api/<name>.md" entry of mkdocs.yml's nav.
"$PYTHON" -m tools.api_pages "$stage/api" >/dev/null
# The quickstart, run for the site (its page in the nav: docs/executed/quickstart.ipynb), on the
# data folder's MNIST, KMNIST and Fashion-MNIST ($GEDL_DATA_DIR, else the default folder; a missing
# file is one error naming the fetch command).
GEDL_DATA_DIR="${GEDL_DATA_DIR:-$("$PYTHON" -c 'from gedl_jax.data import resolve_data_dir; print(resolve_data_dir())')}" \
  "$PYTHON" -m tools.executed_notebook --out="$stage/docs/executed/quickstart.ipynb"
if [ "${1:-}" = serve ]; then
  exec "$PYTHON" -m mkdocs serve
fi
"$PYTHON" -m mkdocs build --strict --clean
echo "docs: built site/ ($(find site -name '*.html' | wc -l) pages)"
