#!/usr/bin/env bash
# The GEDL-at-convergence study (docs/results/gedl_convergence/README.md): GEDL under every
# reading of the paper's KL weight at the long setting (whole split, 20 epochs) with the per-epoch
# test/OOD curve (config.epoch_eval), seed 0 of every reading first, then seeds 1 and 2. It
# resumes: rerun it and finished runs are reused, a killed run continues from its checkpoint.
# It runs at the lowest CPU priority, so other work on the machine goes first.
#   bash studies/gedl_convergence/run_queue.sh            # OUT=~/gedl_runs/gedl_convergence
case "${1:-}" in   # --help: the comment above, before anything runs
  -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
esac
set -u
cd "$(dirname "$0")/../.."
OUT="${OUT:-$HOME/gedl_runs/gedl_convergence}"
PY="${PYTHON:-.venv/bin/python}"
mkdir -p "$OUT"
READINGS="${READINGS:-gedl tau_sum_over_c kl_masked tau_step tau_completed_epochs c_tau_1000 evidence_exp}"
for seed in ${SEEDS:-0 1 2}; do
  for reading in $READINGS; do
    echo "=== $(date -u +%FT%TZ) $reading seed $seed ==="
    nice -n 19 "$PY" bin/reproduce.py --study=readings --setting=long --variants="$reading" \
      --seeds="$seed" --override=epoch_eval=True --out="$OUT" > "$OUT.$reading.$seed.log" 2>&1 \
      || { echo "failed: see $OUT.$reading.$seed.log"; exit 1; }
  done
done
