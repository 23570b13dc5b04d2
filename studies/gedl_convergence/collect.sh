#!/usr/bin/env bash
# Copies finished runs of the study (run_queue.sh) into this folder, one <reading>_seed<s>/ each
# (eval_results.json, metrics.jsonl, config.json), and redraws curves.png / curves.md from every
# run under OUT. Paths of the machine that ran them are replaced by RUNS_DIR (the folder holding
# OUT) and DATA_DIR (GEDL_DATA_DIR), so the copies name no machine.
#   bash studies/gedl_convergence/collect.sh            # OUT=~/gedl_runs/gedl_convergence
# DEST: the folder to fill (default: this one). Runs trained on another machine and copied here:
# TRAINED_RUNS_DIR / TRAINED_DATA_DIR are the paths they were trained under (default: OUT's
# parent and GEDL_DATA_DIR).
case "${1:-}" in   # --help: the comment above, before anything runs
  -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
esac
set -eu
cd "$(dirname "$0")/../.."
here="${DEST:-docs/results/gedl_convergence}"
OUT="${OUT:-$HOME/gedl_runs/gedl_convergence}"
PY="${PYTHON:-.venv/bin/python}"
[ -d "$OUT/runs" ] || { echo "error: $OUT/runs does not exist: set OUT to run_queue.sh's OUT" >&2; exit 2; }
runs_parent="${TRAINED_RUNS_DIR:-$(cd "$OUT/.." && pwd)}"
data_dir="${TRAINED_DATA_DIR:-${GEDL_DATA_DIR:-}}"
for run in "$OUT"/runs/*/seed_*; do
  [ -f "$run/eval_results.json" ] || continue          # still training
  reading="$(basename "$(dirname "$run")")"
  seed="${run##*seed_}"
  dest="$here/${reading}_seed${seed}"
  mkdir -p "$dest"
  for f in eval_results.json metrics.jsonl config.json environment.json; do
    [ -f "$run/$f" ] || continue
    if [ -n "$data_dir" ]; then
      sed -e "s#$runs_parent#RUNS_DIR#g" -e "s#$data_dir#DATA_DIR#g" "$run/$f" > "$dest/$f"
    else
      sed -e "s#$runs_parent#RUNS_DIR#g" "$run/$f" > "$dest/$f"
    fi
  done
  # results.md: reproduce.py's report (command, hardware, wall time) when OUT's latest one is
  # this run's and trained it (a rerun of the queue reuses finished runs and reports ~0 min);
  # else the run's own table, unless an earlier collection kept the report.
  if grep -q -- "--variants=$reading --seeds=$seed " "$OUT/results.md" 2>/dev/null \
      && ! grep -q "^Wall time: 0.0 min" "$OUT/results.md"; then
    sed -e "s#$runs_parent#RUNS_DIR#g" "$OUT/results.md" > "$dest/results.md"
  elif [ ! -f "$dest/results.md" ] && [ -f "$run/eval_table.md" ]; then
    cp "$run/eval_table.md" "$dest/results.md"
  fi
  echo "collected $reading seed $seed -> $dest"
done
# The curves of readings whose every started seed has finished (a run in progress would cut the
# mean over seeds short).
finished=()
for reading_dir in "$OUT"/runs/*; do
  done_all=1
  for run in "$reading_dir"/seed_*; do [ -f "$run/eval_results.json" ] || done_all=0; done
  [ "$done_all" = 1 ] && finished+=("$reading_dir")
done
"$PY" bin/curves.py "${finished[@]}" --out="$here"
