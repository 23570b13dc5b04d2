"""I-EDL (and EDL) on the test suite's tiny generated MNIST run, under both matmul precisions and
two learning rates: each run's per-step training loss, evidence strength and validation accuracy.

    python -m studies.iedl_tiny_run        # from the repository root (imports tests/ fixtures)
    python -m studies.iedl_tiny_run --sweep  # I-EDL: learning rates x epochs x seeds 0-2

Why it exists: `tests/test_train.py::test_every_preset_trains_and_evaluates[iedl]` passed on a
CPU and failed on a GPU. This prints what the two runs did, step by step, so the platforms can be
compared line by line (docs/results/gpu/nvidia_h200/earlier_f1a2337/NOTES.md holds one GPU's
output).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from data_fixtures import write_generated_data  # noqa: E402
from test_train import tiny_config  # noqa: E402

from gedl_jax import train  # noqa: E402


def sweep(root: pathlib.Path) -> None:
    """I-EDL's validation accuracy after each epoch, per seed, for a few settings."""
    for lr, epochs in [(3e-3, 2), (1e-3, 4), (3e-3, 4), (1e-2, 2)]:
        accuracies = []
        for seed in range(3):
            config = tiny_config(root, "iedl", learning_rate=lr, num_epochs=epochs, seed=seed)
            workdir = root / f"sweep_{lr}_{epochs}_{seed}"
            train.train_and_evaluate(config, workdir)
            records = [json.loads(line) for line in
                       (workdir / "metrics.jsonl").read_text().splitlines()]
            accuracies.append([round(r["accuracy"], 3) for r in records
                               if r["split"] == "validation"])
        print(f"SWEEP iedl lr={lr} epochs={epochs} val acc per epoch per seed {accuracies}",
              flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m studies.iedl_tiny_run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", action="store_true",
                        help="instead: I-EDL's validation accuracy per epoch for 4 settings "
                             "(learning rate x epochs), seeds 0-2")
    args = parser.parse_args(argv)
    root = pathlib.Path(tempfile.mkdtemp())
    generated = write_generated_data(root)
    with generated.registered():
        if args.sweep:
            import jax

            jax.config.update("jax_disable_most_optimizations", True)   # as the tests compile
            sweep(root)
            return 0
        for variant in ("iedl", "edl"):
            for precision in ("default", "highest"):
                for lr in (3e-3, 1e-3):
                    config = tiny_config(root, variant, learning_rate=lr,
                                         matmul_precision=precision, log_every_steps=1)
                    workdir = root / f"{variant}_{precision}_{lr}"
                    start = time.time()
                    summary = train.train_and_evaluate(config, workdir)
                    records = [json.loads(line) for line in
                               (workdir / "metrics.jsonl").read_text().splitlines()]
                    steps = [r for r in records if r["split"] == "train"]
                    print(f"DIAG {variant} {precision} lr={lr} "
                          f"best_val={summary['best_val_accuracy']:.4f} "
                          f"loss={[round(r['loss'], 3) for r in steps]} "
                          f"grad_norm={[round(r['grad_norm'], 2) for r in steps]} "
                          f"t={time.time() - start:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
