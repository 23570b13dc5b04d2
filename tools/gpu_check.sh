#!/usr/bin/env bash
# One command for a GPU machine: the test suite on the GPU, the train-step benchmark (with and
# without deterministic kernels), our step beside an independent PyTorch step, the main job
# (`bin/train`: GEDL on MNIST, 200 epochs) end to end, five seeds trained together (vmapped) beside
# their step's floor, and a stopped-and-resumed run against the
# uninterrupted one (studies/resume_check.py, under the trainer's flags and under XLA's
# stricter --xla_gpu_deterministic_ops), with the wall time of each part; the results go to
# docs/results/gpu/<gpu name>/ (tables, logs, wall_times.json, README.md).
#
#   bash tools/gpu_check.sh                 # everything, on this machine's GPU
#   bash tools/gpu_check.sh --dry-run       # every part tiny, on a CPU (CI runs this)
#   bash tools/gpu_check.sh --parts=bench,train --out=DIR   # DIR: relative to where it starts
#   bash tools/gpu_check.sh --parts=resume --out=DIR --append   # add parts to DIR's results
#   bash tools/gpu_check.sh --parts=tests --tests='-x tests/test_train.py'   # pytest's arguments
#   GEDL_CHECK_ROW=gedl bash tools/gpu_check.sh --parts=cifar10   # one CIFAR-10 row, 5 seeds
#
# Needs: the package's dependencies with jax's CUDA plugin (GEDL_EXTRAS=dev,cuda12 or cuda13
# bash bin/setup.sh) and the MNIST, KMNIST and Fashion-MNIST files in $GEDL_DATA_DIR (or the
# download cache; a folder with only some files needs a SHA256SUMS listing only those, or none:
# the suite checks every file it lists), with the dev extra for the tests part (both checked
# before any work). PYTHON (default: .venv/bin/python if present, else python3) runs everything;
# TORCH_PYTHON (default: PYTHON) runs the PyTorch reference, whose column says "not measured"
# when it cannot import torch. GEDL_TEST_WORKERS pytest workers share the GPU (default: the
# CPU cores less 4, from 2 to 12; an H200 with 16 cores ran the whole suite in 361 s with 13
# beside the resume part, 356 s with 14 alone).
# GEDL_TORCH_MODES (default eager,compile,cudagraphs) chooses the PyTorch columns;
# GEDL_CHECK_MODELS (default convnet,vgg16) and GEDL_CHECK_DTYPES (default float32,bfloat16)
# the bench and torch parts' rows (convnet and float32 alone: about a minute less);
# GEDL_CHECK_TIMEOUTS="tests=S,train=S,..." stops a part after S seconds;
# GEDL_CHECK_SEEDS_EPOCHS (default 200) the seeds part's epochs. Parts, in this order: tests,
# train, bench, torch, seeds, resume (default: all), and cifar10, only when named (or in a dry
# run): one row of the paper's CIFAR-10 table, `bin/reproduce.py --dataset=cifar10
# --setting=paper --variants=$GEDL_CHECK_ROW (gedl) --seeds=$GEDL_CHECK_ROW_SEEDS (0-4)
# --vmap_seeds` with GEDL_CHECK_ROW_ARGS added (e.g. "--study=readings --publish_predictions"),
# published into $GEDL_CHECK_RESULTS (default docs/results/cifar10_paper; a dry run: a copy of it
# in the results folder), whose tables it remakes from every row there; it needs CIFAR-10 and
# the MNIST and Fashion-MNIST test files (the far-OOD sets) in $GEDL_DATA_DIR. On one H200 the parts' wall times sum to 14
# minutes, the seeds part with 50 epochs (with 200: 276 s, commit 492beaf); with the resume part
# beside the tests, the two calls took 11 (docs/results/gpu/nvidia_h200/earlier_78c8da6,
# wall_times.json); --append joins such calls' results.
# Also GEDL_COMMIT (names the commit of a copy whose git metadata is older than its files; the
# benchmarks record it too). --append
# keeps the parts DIR already has in its wall_times.json (two checks into one folder, one
# after the other or side by side).
set -uo pipefail
STARTED_IN="$PWD"   # a relative --out=DIR is read from here, where the user typed it
cd "$(dirname "$0")/.."

DRY_RUN=0
PARTS=""
OUT=""
APPEND=0
TEST_ARGS=()
for arg in "$@"; do
  case "$arg" in
    --dry-run|--dry_run) DRY_RUN=1 ;;
    --parts=*) PARTS="${arg#--parts=}" ;;
    --out=*) OUT="${arg#--out=}"
             case "$OUT" in /*|"") ;; *) OUT="$STARTED_IN/$OUT" ;; esac ;;
    --append) APPEND=1 ;;
    --tests=*) read -r -a TEST_ARGS <<< "${arg#--tests=}" ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' tools/gpu_check.sh
               exit 0 ;;
    *) echo "error: unknown argument '$arg' (--dry-run, --parts=tests,train,bench,torch," \
            "seeds,resume,cifar10, --out=DIR, --append, --tests='PYTEST ARGS'; --help)" >&2
       exit 2 ;;
  esac
done
if [ -z "$PARTS" ]; then   # the default; a dry run checks the cifar10 part too
  PARTS="tests,train,bench,torch,seeds,resume"
  [ "$DRY_RUN" = 1 ] && PARTS="$PARTS,cifar10"
fi
for part in ${PARTS//,/ }; do
  case "$part" in tests|bench|torch|train|seeds|resume|cifar10) ;;
    *) echo "error: unknown part '$part' in --parts (tests, train, bench, torch, seeds," \
            "resume, cifar10)" >&2
       exit 2 ;;
  esac
done
has_part() { [[ ",$PARTS," == *",$1,"* ]]; }

if [ -z "${PYTHON:-}" ]; then
  if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
TORCH_PYTHON="${TORCH_PYTHON:-$PYTHON}"
export XLA_PYTHON_CLIENT_PREALLOCATE=false   # several processes share the GPU
export PYTHONUNBUFFERED=1

backend="$("$PYTHON" -c 'import jax; print(jax.default_backend())' 2>/dev/null)" || {
  echo "error: $PYTHON cannot import jax; set PYTHON to the interpreter of the gedl-jax" \
       "environment (bin/setup.sh makes .venv)" >&2; exit 2; }
if [ "$DRY_RUN" = 0 ] && [ "$backend" != "gpu" ]; then
  echo "error: jax runs on '$backend', not on a GPU: install the CUDA plugin" \
       "(GEDL_EXTRAS=dev,cuda12 bash bin/setup.sh; cuda13 for a CUDA 13 driver), or run" \
       "--dry-run to check the script on a CPU" >&2
  exit 2
fi
# A data folder's SHA256SUMS must list only files it holds: the suite checks every one
# (tests/test_data_real.py), so a partial copy with the whole list fails there. Said before any
# work, not after the suite's minutes on a lent GPU.
sums="${GEDL_DATA_DIR:-}/SHA256SUMS"
if has_part tests && [ -n "${GEDL_DATA_DIR:-}" ] && [ -f "$sums" ]; then
  absent="$(awk 'NF == 2 { print $2 }' "$sums" | while read -r f; do
              [ -e "$GEDL_DATA_DIR/$f" ] || echo "$f"; done)"
  if [ -n "$absent" ]; then
    echo "error: $sums lists $(echo "$absent" | wc -l) file(s) absent from \$GEDL_DATA_DIR" \
         "(first: $(echo "$absent" | head -1)); the suite checks every listed file. Copy" \
         "them, or keep a SHA256SUMS that lists only the files there (or none)" >&2
    exit 2
  fi
fi
# The suite needs the dev extra (its oracles, ruff's lint, the notebook runner): a copy set up
# without one of them fails that test minutes in; say so before any work.
if has_part tests; then
  missing="$("$PYTHON" -c '
import importlib.metadata, re, tomllib
extras = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]
def names_of(extra):   # its packages, and those of the extras it names (gedl-jax[test])
    for spec in extras[extra]:
        name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", spec).group()
        if name != "gedl-jax":
            yield name
            continue
        for named in re.search(r"\[(.*)\]", spec).group(1).split(","):
            yield from names_of(named.strip())
names = list(names_of("dev"))
def absent(name):
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return True
    return False
print(" ".join(name for name in names if absent(name)))')" || exit 2
  if [ -n "$missing" ]; then
    echo "error: $PYTHON lacks the dev extra's $missing, which the suite needs; install" \
         "them (pip install -e '.[dev]', or GEDL_EXTRAS=dev,cuda12 bash bin/setup.sh)" >&2
    exit 2
  fi
fi
gpu_slug="$("$PYTHON" -c 'import jax, re; d = jax.devices()[0]
print(re.sub(r"[^a-z0-9]+", "_", getattr(d, "device_kind", d.platform).lower()).strip("_"))')"
if [ -z "$OUT" ]; then
  if [ "$DRY_RUN" = 1 ]; then OUT="$(mktemp -d)/gpu_check"; else OUT="docs/results/gpu/$gpu_slug"; fi
fi
mkdir -p "$OUT"
WORK="$(mktemp -d)"
echo "gpu_check: $([ "$DRY_RUN" = 1 ] && echo 'dry run, ')parts $PARTS on $backend" \
     "($gpu_slug), results in $OUT"
"$PYTHON" - "$OUT/environment.json" <<'PY'
import json, os, platform, subprocess, sys
import flax, jax
d = jax.devices()[0]
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
# a copy whose git metadata is not its tree's (a device copy): GEDL_COMMIT names the tree
dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                       capture_output=True, text=True).stdout.strip()
env = {"device": getattr(d, "device_kind", d.platform), "backend": jax.default_backend(),
       "device_count": jax.device_count(), "jax": jax.__version__, "flax": flax.__version__,
       "python": platform.python_version(), "cpu_count": os.cpu_count(),
       "commit": os.environ.get("GEDL_COMMIT") or commit.stdout.strip() or "?",
       "tree_differs_from_commit": bool(dirty) and not os.environ.get("GEDL_COMMIT"),
       "xla_flags": os.environ.get("XLA_FLAGS", "")}
json.dump(env, open(sys.argv[1], "w"), indent=2)
print("gpu_check: " + ", ".join(f"{k} {v}" for k, v in env.items() if k != "xla_flags"))
PY

declare -A SECONDS_OF STATUS_OF
ORDER=()
# GEDL_CHECK_TIMEOUTS="tests=120,train=150": a part still running after that many seconds is
# stopped (exit status 124), so a lease of fixed length still gets the parts after it.
part_timeout() {
  local entry timeouts="${GEDL_CHECK_TIMEOUTS:-}"
  for entry in ${timeouts//,/ }; do
    [ "${entry%%=*}" = "$1" ] && { echo "${entry#*=}"; return; }
  done
  echo 0
}
run_part() {   # name, command...: runs it, logs to $OUT/<name>.log, records wall time and status
  local name="$1"; shift
  local start=$SECONDS limit
  limit="$(part_timeout "$name")"
  echo "gpu_check: === $name: $* ==="
  [ "$limit" != 0 ] && set -- timeout "$limit" "$@"
  "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  ORDER+=("$name")
  SECONDS_OF[$name]=$((SECONDS - start))
  STATUS_OF[$name]=$rc
  echo "gpu_check: $name took ${SECONDS_OF[$name]} s, exit status $rc"
}

if has_part tests; then
  if [ "${#TEST_ARGS[@]}" = 0 ]; then
    if [ "$DRY_RUN" = 1 ]; then
      TEST_ARGS=(-q tests/test_multi_step.py::test_multi_step_rows_hold_each_steps_metrics
                 tests/test_numerics.py)
    else
      # -v -rfE: each test's outcome is logged as it ends, so a run stopped by its time limit
      # still names its failures (pytest's summary comes only at the end)
      cores="$(nproc 2>/dev/null || echo 4)"
      workers=$(( cores - 4 )); [ "$workers" -lt 2 ] && workers=2; [ "$workers" -gt 12 ] && workers=12
      # --durations: the slowest tests on the GPU, to plan the next check's time
      TEST_ARGS=(-v -rfE --durations=25 -n "${GEDL_TEST_WORKERS:-$workers}")
    fi
  fi
  # each failure's traceback as it happens (tests/conftest.py), in case the limit stops pytest
  export GEDL_TEST_FAILURE_LOG="$OUT/test_failures.log"
  rm -f "$GEDL_TEST_FAILURE_LOG"
  run_part tests "$PYTHON" -m pytest -p no:cacheprovider "${TEST_ARGS[@]}"
  unset GEDL_TEST_FAILURE_LOG
fi

if has_part train; then
  # the main job as `bin/train` runs it (GEDL on MNIST, the paper's 200 epochs); --dry-run: 1 epoch of
  # the quick preset.
  config=(--config=configs/mnist.py)
  [ "$DRY_RUN" = 1 ] && config=(--config=configs/mnist.py:quick --config.num_epochs=1)
  run_part train "$PYTHON" -m gedl_jax.train "${config[@]}" --workdir="$WORK/mnist_gedl"
  for f in eval_results.json eval_table.md metrics.jsonl config.json; do
    [ -f "$WORK/mnist_gedl/$f" ] && cp "$WORK/mnist_gedl/$f" "$OUT/train_$f"
  done
fi

if has_part bench; then
  if [ "$DRY_RUN" = 1 ]; then
    bench=(--models=convnet --batches=8 --dtypes=float32 --steps=2 --repeats=1 --devices=1)
  else
    bench=(--models="${GEDL_CHECK_MODELS:-convnet,vgg16}" --batches=128
           --dtypes="${GEDL_CHECK_DTYPES:-float32,bfloat16}" --devices=1
           --steps=20 --repeats=5 --precisions=default,highest)
  fi
  loop=(--loop_epochs=3)
  [ "$DRY_RUN" = 1 ] && loop=(--loop_epochs=1 --loop_train_examples=2560)
  run_part bench "$PYTHON" bin/benchmark.py "${bench[@]}" "${loop[@]}" \
    --out="$OUT/benchmark.json"
  # What deterministic kernels cost: the same steps with XLA's fastest kernels (the flags are
  # read when the backend starts, so in another process).
  run_part bench_nondeterministic "$PYTHON" bin/benchmark.py "${bench[@]}" \
    --models=convnet --dtypes=float32 --precisions=default --deterministic=false \
    --out="$OUT/benchmark_nondeterministic.json"
  # and XLA's stricter flag, which also turns autotuning off (gedl_jax/run/numerics.py)
  run_part bench_deterministic_ops "$PYTHON" bin/benchmark.py "${bench[@]}" \
    --models=convnet --dtypes=float32 --precisions=default --deterministic=ops \
    --out="$OUT/benchmark_deterministic_ops.json"
fi

if has_part torch; then
  if [ "$DRY_RUN" = 1 ]; then
    vs=(--dry_run)
  else
    vs=(--models="${GEDL_CHECK_MODELS:-convnet,vgg16}" --batches=128
        --dtypes="${GEDL_CHECK_DTYPES:-float32,bfloat16}" --steps=20 --repeats=5
        --torch_modes="${GEDL_TORCH_MODES:-eager,compile,cudagraphs}")
    # our side: the bench part's numbers (same settings), when it ran
    [ -f "$OUT/benchmark.json" ] && vs+=(--jax_json="$OUT/benchmark.json")
  fi
  run_part torch "$PYTHON" -m studies.gpu_vs_torch --torch_python="$TORCH_PYTHON" \
    --out="$OUT/vs_torch" "${vs[@]}"
fi

if has_part seeds; then
  # Five seeds trained together (config.vmap_seeds, README "Several seeds") against their own
  # floor: the vmapped step benchmarked, then the run; GEDL_CHECK_SEEDS_EPOCHS (default 200).
  if [ "$DRY_RUN" = 1 ]; then
    sbench=(--batches=8 --steps=2 --repeats=1 --seeds=2)
    strain=(--config=configs/mnist.py:quick --config.num_epochs=1 --config.seeds=0,1
            --config.train_examples=1280 --config.log_every_steps=2)
  else
    sbench=(--batches=128 --steps=20 --repeats=5 --seeds=5)
    strain=(--config=configs/mnist.py --config.seeds=0,1,2,3,4
            --config.num_epochs="${GEDL_CHECK_SEEDS_EPOCHS:-200}")
  fi
  run_part seeds_bench "$PYTHON" bin/benchmark.py --models=convnet --dtypes=float32 \
    --devices=1 "${sbench[@]}" --out="$OUT/benchmark_seeds.json"
  run_part seeds "$PYTHON" -m gedl_jax.train "${strain[@]}" --config.vmap_seeds=True \
    --config.evaluate_at_end=False --workdir="$WORK/mnist_seeds"
  for f in metrics.jsonl config.json; do
    [ -f "$WORK/mnist_seeds/seed_0/$f" ] && cp "$WORK/mnist_seeds/seed_0/$f" "$OUT/seeds_$f"
  done
fi

if has_part resume; then
  # A run stopped by SIGTERM and resumed against the uninterrupted one, bit for bit: under the
  # trainer's own flags (config.deterministic), then under --xla_gpu_deterministic_ops.
  resume=()
  [ "$DRY_RUN" = 1 ] && resume=(--config=configs/mnist.py:gedl,quick --epochs=1
                                --override=train_examples=1280 --override=log_every_steps=1
                                --stop_at=4)
  run_part resume "$PYTHON" -m studies.resume_check "${resume[@]}" --out="$OUT/resume"
  if [ "$DRY_RUN" = 0 ]; then
    run_part resume_deterministic_ops env XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_deterministic_ops=true" \
      "$PYTHON" -m studies.resume_check --out="$OUT/resume_deterministic_ops"
  fi
fi

if has_part cifar10; then
  # One row of the paper's CIFAR-10 table, its seeds trained together, published into the
  # results folder with its machine and wall time, the folder's tables remade from every row.
  results="${GEDL_CHECK_RESULTS:-docs/results/cifar10_paper}"
  row=(--variants="${GEDL_CHECK_ROW:-gedl}" --seeds="${GEDL_CHECK_ROW_SEEDS:-0-4}")
  if [ "$DRY_RUN" = 1 ]; then
    rm -rf "$OUT/cifar10_paper"
    [ -d "$results" ] && cp -r "$results" "$OUT/cifar10_paper"
    results="$OUT/cifar10_paper"
    row=(--variants="${GEDL_CHECK_ROW:-gedl}" --seeds=0-1 --dry_run)
  fi
  read -r -a row_args <<< "${GEDL_CHECK_ROW_ARGS:-}"
  run_part cifar10 "$PYTHON" bin/reproduce.py --dataset=cifar10 --setting=paper "${row[@]}" \
    --vmap_seeds "${row_args[@]}" --out="$WORK/cifar10_paper" --results="$results"
fi

# Wall times and exit statuses (merged into the folder's earlier ones with --append), then the
# summary README (tools/gpu_report.py).
walls=()
for name in "${ORDER[@]}"; do walls+=("$name=${SECONDS_OF[$name]}=${STATUS_OF[$name]}"); done
"$PYTHON" - "$OUT/wall_times.json" "$APPEND" "${walls[@]}" <<'PY'
import fcntl, json, os, sys
path, append, entries = sys.argv[1], sys.argv[2] == "1", sys.argv[3:]
# Side-by-side checks into one folder take turns on the folder itself (an flock on its
# descriptor): no lock file is left among the results.
folder = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
try:
    fcntl.flock(folder, fcntl.LOCK_EX)
    walls = json.load(open(path)) if append and os.path.exists(path) else {}
    for entry in entries:
        name, seconds, status = entry.rsplit("=", 2)
        walls[name] = {"seconds": int(seconds), "exit_status": int(status)}
    with open(path + ".tmp", "w") as f:
        json.dump(walls, f, indent=2)
    os.replace(path + ".tmp", path)
finally:
    os.close(folder)
PY
"$PYTHON" tools/gpu_report.py "$OUT" || STATUS_OF[report]=1
rm -rf "$WORK"
failed=0
for name in "${ORDER[@]}" ${STATUS_OF[report]+report}; do
  [ "${STATUS_OF[$name]}" = 0 ] || { echo "gpu_check: $name FAILED (exit ${STATUS_OF[$name]})"; failed=1; }
done
echo "gpu_check: results in $OUT$([ $failed = 0 ] && echo ', every part passed')"
exit $failed
