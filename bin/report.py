"""Paper-style table (mean ± std over seeds) from a folder of evaluation runs.

    gedl-report RUNS_DIR [--latex] [--out=FILE] [--json=AGG.json]
                [--ood_datasets=KMNIST,FMNIST] [--no_extra]

(`gedl-report` once installed; `python bin/report.py` in a clone.)

Finds every ``eval_results.json`` under RUNS_DIR (recursively; one per seed run), groups them by
the JSON's "dataset" key (one set of tables per dataset) and by method, and prints, per dataset,
the paper's main table (Acc, Conf.MP, then MP and UM per OOD set; AUPR in %, mean ± sample std
with ddof=1), a calibration table (NLL, Brier, Brier-L2, ECE, adaptive ECE; fractions) and a
detection-detail table (AUPR-in, AUPR-out, AUROC, FPR95). Markdown by default, LaTeX (booktabs,
multicolumn) with --latex. A header line above every table states its conventions and the number
of seeds.

Method of a run: the JSON's "variant" key, else its "name" key, else the parent folder name with a
seed suffix removed (runs/gedl_seed3/ -> "gedl"); a parent folder that is only a seed
(runs/gedl/seed3/, run_1/, s2/) names the grandparent ("gedl").

Expected JSON schema (``gedl_jax.evaluation.evaluate_outputs`` output plus optional top-level keys;
every number a fraction in [0, 1], undefined numbers null):

    {
      "variant": "gedl",            # optional: method name (or "name")
      "seed": 0,                    # optional: not aggregated; duplicates are warned about
      "dataset": "cifar10",         # optional: ID dataset, one table per dataset
      "conventions": {...},         # strings, copied from gedl_jax.evaluation.CONVENTIONS
      "scores": ["mp", "um", ...],
      "id": {
        "num_examples": int, "num_classes": int, "num_correct": int,
        "accuracy": f, "nll": f, "brier": f, "brier_l2": f, "ece": f, "ece_adaptive": f,
        "calibration": {"equal_width": {per-bin lists}, "adaptive": {per-bin lists}},
        "misclassification": {"mp": {"aupr": f, "auroc": f}, "um": {...}, ...},
        "uncertainty": {"u": f, "mutual_information": f, ...}      # means over the set
      },
      "ood": {
        "SVHN": {"num_examples": int,
                 "detection": {"mp": {"aupr_in": f, "aupr_out": f, "auroc": f, "fpr95": f},
                               "um": {...}, ...},
                 "uncertainty": {...}},
        ...
      }
    }

Results written since the evaluation grew its extra sections (docs/evaluation.md) also hold
"id.selective", "conformal", "ood_groups", "validation", "evaluation_options" and, with
calibrate=True, "posthoc_calibration" and "calibrated" (with aupr_trapezoidal=True, the detection
entries gain "aupr_in_trapezoidal" / "aupr_out_trapezoidal"). Every number in them is aggregated
over seeds like the rest, and each section adds its table (selective prediction, conformal sets,
near/far OOD, trapezoidal AUPR, post-hoc calibration before/after; a "<method> (calibrated: ...)"
row in every table); results without them print the tables as before.

The tables need "id.accuracy", "id.misclassification.mp.aupr" and
"ood.<set>.detection.{mp,um}.aupr_in"; anything missing prints as "–".
"""

import sys

from gedl_jax.commands.report import main

if __name__ == "__main__":
    sys.exit(main())
