#!/bin/bash
# The runs of the initialisation ablation, one after another, each resumable:
# a killed run continues from its last epoch checkpoint when this script is started again.
#   GEDL_DATA_DIR=DATA_DIR bash studies/init_ablation/run_queue.sh RUNS_DIR
# Then: python bin/init_ablation.py RUNS_DIR --out=docs/results/init_ablation/table.md
# (bin/init_ablation.py: at commit c0b3e04, removed since; see README.md here)
case "${1:-}" in   # --help: the comment above, before anything runs
  -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
esac
set -u
RUNS=${1:?usage: run_queue.sh RUNS_DIR (outside the checkout)}
PY=${PYTHON:-.venv/bin/python}
cd "$(dirname "$0")/../.."
# variant init seed [extra config flags]; in the order they were run
while read -r variant init seed extra; do
  [ -z "$variant" ] && continue
  tag="${variant}_${init}${extra:+_$(echo "$extra" | tr -cd 'a-z0-9_=')}"
  [ -f "$RUNS/$tag/seed_$seed/eval_results.json" ] && continue
  echo "$(date -u +%FT%TZ) start $tag seed $seed"
  t0=$(date +%s)
  nice -n 10 "$PY" -m gedl_jax.train --config=configs/mnist.py:"$variant" \
    --config.num_epochs=3 --config.init="$init" --config.seeds="$seed" --config.plots=False \
    $extra --workdir="$RUNS/$tag"
  rc=$?
  echo "$(date -u +%FT%TZ) end $tag seed $seed rc=$rc wall_s=$(( $(date +%s) - t0 ))"
done <<'QUEUE'
gedl flax 0
gedl flax 1
gedl torch 0
gedl flax 2
gedl torch 1
gedl torch 2
edl flax 0
edl torch 0
gedl flax 0 --config.tau_reading=step
redl flax 0
redl torch 0
iedl flax 0
iedl torch 0
red flax 0
red torch 0
gedl torch 0 --config.tau_reading=step
QUEUE
