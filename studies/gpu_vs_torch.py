"""Our train step beside the PyTorch reference on this machine's accelerator, as one table.

Runs, one after the other as subprocesses (with XLA_PYTHON_CLIENT_PREALLOCATE=false, so JAX does
not hold the GPU's memory):

1. our step benchmark, `bin/benchmark.py --devices=1 --out=DIR/jax.json` (this Python, with this
   checkout first on PYTHONPATH);
2. the PyTorch reference, `PYTHON -m studies.torch_gpu_step --out=DIR/torch.json` with the
   Python given by `--torch_python` (a venv with torch; torch is not a dependency of gedl-jax),
   all three modes (eager, compile, cudagraphs);

then writes `DIR/vs_torch.md`: per model / batch / dtype our images/s, PyTorch's in each mode
and the ratio of ours to the best PyTorch mode. When `--torch_python` cannot import torch the
PyTorch columns say "not measured" (one line says so) and our numbers are still written.

From the repository root, on the GPU machine:

    .venv/bin/python -m studies.gpu_vs_torch --torch_python="$TORCH_PYTHON" --out=DIR \\
        --models=convnet,vgg16 --batches=128 --dtypes=float32,bfloat16
    .venv/bin/python -m studies.gpu_vs_torch --dry_run --out=DIR   # tiny, any machine

`--dry_run` runs bin/benchmark.py with `--steps=2 --repeats=1 --batches=8 --models=convnet
--dtypes=float32` and passes `--dry_run` (and the same model and dtype) to the PyTorch script.
`--torch_python` defaults to `$GEDL_TORCH_PYTHON`, else this Python.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
TORCH_MODES = ("eager", "compile", "cudagraphs")
DRY_RUN = {"models": "convnet", "batches": "8", "dtypes": "float32", "steps": 2, "repeats": 1}


def torch_importable(python: str) -> str | None:
    """None when `python` imports torch, else why not (one line)."""
    try:
        done = subprocess.run([python, "-c", "import torch"], capture_output=True, text=True,
                              timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{python} could not be run ({e})"
    if done.returncode:
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return f"{python} cannot import torch ({last})"
    return None


def subprocess_env() -> dict:
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


def jax_command(args, out: pathlib.Path) -> list[str]:
    return [sys.executable, str(REPO / "bin" / "benchmark.py"), f"--models={args.models}",
            f"--batches={args.batches}", f"--dtypes={args.dtypes}", "--devices=1",
            f"--steps={args.steps}", f"--repeats={args.repeats}", f"--out={out}"]


def torch_command(args, python: str, out: pathlib.Path) -> list[str]:
    cmd = [python, "-m", "studies.torch_gpu_step", f"--models={args.models}",
           f"--dtypes={args.dtypes}", f"--tf32={args.tf32}",
           f"--compile_mode={args.torch_compile_mode}", f"--out={out}"]
    if args.dry_run:
        return [*cmd, "--dry_run"]
    return [*cmd, f"--batches={args.batches}", f"--steps={args.steps}",
            f"--repeats={args.repeats}", f"--modes={args.torch_modes}"]


def run(cmd: list[str]) -> int:
    # as typed from the repository's root: no machine's absolute paths in the log
    shown = [os.path.relpath(a, REPO) if os.path.isabs(a) and a.startswith(str(REPO)) else a
             for a in cmd]
    print("$ " + " ".join(shown), flush=True)
    return subprocess.run(cmd, cwd=REPO, env=subprocess_env()).returncode


def read_results(path: pathlib.Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _img_s(value: float) -> str:
    return f"{value:,.0f}"


def _same_arithmetic(row: dict, torch_tf32: bool) -> bool:
    """Whether our benchmark row ran the arithmetic PyTorch ran: for float32, TF32 products
    (our `matmul_precision=default` on a GPU) when PyTorch's TF32 is on, true float32
    (`highest`) when it is off; a bfloat16 row under the default precision."""
    if row["dtype"] != "float32":
        return row.get("precision", "default") == "default"
    return row.get("arithmetic") == ("tf32" if torch_tf32 else "float32")


def vs_torch_table(jax_out: dict | None, torch_out: dict | None, torch_missing: str | None) -> str:
    """The markdown comparison: one row per model / batch / dtype of either side."""
    torch_rows = {(r["model"], r["batch"], r["dtype"], r["mode"]): r
                  for r in (torch_out or {}).get("results", [])}
    tf32 = (torch_out or {}).get("environment", {}).get("tf32", "on") == "on"
    jax_rows = {}
    for r in (jax_out or {}).get("results", []):
        key = (r["model"], r["batch"], r["dtype"])
        # our row with PyTorch's arithmetic: a float32 step under TF32 beside PyTorch's TF32
        # (bin/benchmark.py times both precisions when asked; the other row is not comparable)
        if key not in jax_rows or _same_arithmetic(r, tf32):
            jax_rows[key] = r
    keys = list(jax_rows)
    keys += [k[:3] for k in torch_rows if k[:3] not in keys]
    keys = list(dict.fromkeys(keys))
    lines = []
    if jax_out:
        e = jax_out.get("environment", {})
        lines.append(f"Ours: {e.get('device')} ({e.get('platform')}), jax {e.get('jax')}, "
                     f"flax {e.get('flax')}, commit {e.get('commit')}.")
    else:
        lines.append("Ours: not measured (bin/benchmark.py wrote no results).")
    if torch_out:
        e = torch_out.get("environment", {})
        lines.append(f"PyTorch: {e.get('device')} ({e.get('platform')}), torch {e.get('torch')}, "
                     f"CUDA {e.get('cuda')}, TF32 {e.get('tf32')} (cuda.matmul.allow_tf32 "
                     f"{e.get('cuda_matmul_allow_tf32')}, cudnn.allow_tf32 "
                     f"{e.get('cudnn_allow_tf32')}, float32 matmul precision "
                     f"{e.get('float32_matmul_precision')}), {e.get('memory_format')}, "
                     f"torch.compile mode {e.get('compile_mode')}.")
    else:
        lines.append(f"PyTorch: not measured ({torch_missing or 'no results'}).")
    lines += ["Images/s, median of repeats after warm-up; synthetic uint8 data resident on the "
              "device.", "",
              "| model | batch | dtype | ours img/s (arithmetic) | torch eager | torch compile | "
              "torch cudagraphs | ours / best torch |",
              "|---|---:|---|---:|---:|---:|---:|---:|"]
    for key in keys:
        ours = jax_rows.get(key)
        cells, best = [], None
        for mode in TORCH_MODES:
            r = torch_rows.get((*key, mode))
            if not torch_out or r is None:
                cells.append("not measured")
            elif "images_per_s" in r:
                cells.append(_img_s(r["images_per_s"]))
                best = max(best or 0.0, r["images_per_s"])
            else:
                cells.append("skipped" if "skipped" in r else "failed")
        ours_cell = (f"{_img_s(ours['images_per_s'])} ({ours.get('arithmetic', '?')})"
                     if ours else "not measured")
        ratio = f"{ours['images_per_s'] / best:.2f}" if ours and best else "n/a"
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {ours_cell} | {' | '.join(cells)} | "
                     f"{ratio} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--torch_python", default=os.environ.get("GEDL_TORCH_PYTHON", sys.executable),
                   help="a Python with torch (default $GEDL_TORCH_PYTHON, else this one)")
    p.add_argument("--out", required=True, help="folder for jax.json, torch.json, vs_torch.md")
    p.add_argument("--models", default="convnet,vgg16",
                   help="comma-separated models: convnet (MNIST), vgg16 (CIFAR VGG16-bn)")
    p.add_argument("--batches", default="128", help="comma-separated batch sizes")
    p.add_argument("--dtypes", default="float32,bfloat16",
                   help="comma-separated compute dtypes (float32, bfloat16)")
    p.add_argument("--steps", type=int, default=20, help="steps per timed repeat (both sides)")
    p.add_argument("--repeats", type=int, default=5,
                   help="timed repeats after the warm-up (both sides); the median is reported")
    p.add_argument("--tf32", default="on", choices=("on", "off"), help="PyTorch's TF32 setting")
    p.add_argument("--torch_compile_mode", default="default",
                   help="torch.compile's mode for the PyTorch compile column")
    p.add_argument("--torch_modes", default=",".join(TORCH_MODES),
                   help="the PyTorch columns to measure (the others read 'not measured')")
    p.add_argument("--jax_json", default=None,
                   help="our side from this bin/benchmark.py --out file of the same machine and "
                        "settings instead of running it again (tools/gpu_check.sh: its bench part)")
    p.add_argument("--table_only", action="store_true",
                   help="rewrite OUT/vs_torch.md from OUT's jax.json and torch.json, running "
                        "nothing")
    p.add_argument("--dry_run", action="store_true",
                   help="tiny settings on both sides (seconds on a CPU)")
    p.add_argument("--dry-run", dest="dry_run", action="store_true",
                   help=argparse.SUPPRESS)   # the older spelling, still read
    args = p.parse_args(argv)
    if args.dry_run:
        for name, value in DRY_RUN.items():
            setattr(args, name, value)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jax_json, torch_json = out / "jax.json", out / "torch.json"
    if args.table_only:
        table = vs_torch_table(read_results(jax_json), read_results(torch_json),
                               None if torch_json.exists() else "no torch.json")
        (out / "vs_torch.md").write_text(table)
        print(table, end="")
        return 0
    for stale in (jax_json, torch_json):
        stale.unlink(missing_ok=True)

    if args.jax_json:
        shutil.copyfile(args.jax_json, jax_json)
        print(f"our side: {args.jax_json}", flush=True)
        failed = False
    else:
        failed = run(jax_command(args, jax_json)) != 0
    torch_missing = torch_importable(args.torch_python)
    if torch_missing:
        print(f"torch column not measured: {torch_missing}", flush=True)
    else:
        failed |= run(torch_command(args, args.torch_python, torch_json)) != 0
    table = vs_torch_table(read_results(jax_json), read_results(torch_json), torch_missing)
    (out / "vs_torch.md").write_text(table)
    print(table, end="")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
