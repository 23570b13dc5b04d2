#!/usr/bin/env bash
# The evaluation sections of one quick MNIST GEDL run (selective prediction, post-hoc
# calibration, conformal sets, near/far OOD with a far set, OpenOOD's trapezoidal AUPR), written
# here: eval_table.md, eval_results.json (the workdir's path replaced by RUNS_DIR), and
# risk_coverage.png. predictions.npz stays in the workdir (every number here is recomputable
# from it: tests/test_evaluation_wiring.py).
#   bash studies/evaluation_quick/run.sh        # WORKDIR=~/gedl_runs/evaluation_quick
case "${1:-}" in   # --help: the comment above, before anything runs
  -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
esac
set -eu
cd "$(dirname "$0")/../.."
here=docs/results/evaluation_quick
WORKDIR="${WORKDIR:-$HOME/gedl_runs/evaluation_quick}"
PY="${PYTHON:-.venv/bin/python}"
"$PY" -m gedl_jax.train --config=mnist:gedl,quick --config.extra_ood=cifar10_gray28 \
  --config.calibrate=True --config.aupr_trapezoidal=True --workdir="$WORKDIR"
parent="$(cd "$WORKDIR/.." && pwd)"
sed -e "s#$parent#RUNS_DIR#g" "$WORKDIR/eval_results.json" > "$here/eval_results.json"
cp "$WORKDIR/eval_table.md" "$WORKDIR/risk_coverage.png" "$here/"
