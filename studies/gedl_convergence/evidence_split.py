"""How much evidence a GEDL model gives the test set and each OOD set, and where that puts them
in the uncertainty-mass ranking.

At the objective's optimum (`fixed_point.py`) every training image holds total evidence
E = tau on its class, so on the test set the uncertainty mass u = W / S is nearly one value.
With the adaptive prior strength (Eq. weight_update), W = C_w + (K - C_w) / (1 + K E), u falls
as E grows: an OOD image ranks above the in-distribution images by UM exactly when the network
gives it more total evidence than they hold. The strength S = W + E is no guide here: it is
smallest at E = (sqrt(K (K - C_w)) - 1) / K (0.875 for K = 10, C_w = 0.5) and grows on both
sides of it, so a larger mean S can mean less evidence as well as more.

For a training workdir's best checkpoint, on its test set and its OOD sets, this prints the
total evidence E (mean, median), the share of images with more evidence than the test set's
median image, u (mean), and the share of images ranked above the test set's median and above
its 1 % quantile of u (the most confident in-distribution images):

    python studies/gedl_convergence/evidence_split.py WORKDIR [WORKDIR ...] \
        [--pretrained=mnist/gedl,...] [--names=A,B,...] [--out=FILE]

It restores each checkpoint, or loads each pretrained model, and reads the data as
`python -m gedl_jax.evaluate --workdir` (or `--pretrained`) does (`$GEDL_DATA_DIR`), so it
needs gedl-jax installed. The runs come first, then the pretrained models, in the order given.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np


class SetSummary(NamedTuple):
    name: str
    images: int
    evidence_mean: float
    evidence_median: float
    above_test_median_evidence: float   # share with E > the test set's median E
    uncertainty_mean: float
    above_test_median_rank: float       # share with u < the test set's median u
    above_test_top_rank: float          # share with u < the test set's 1 % quantile of u


def evidence_and_uncertainty(alpha_NxK: np.ndarray,
                             prior_strength_N: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Total evidence E = S - W (Eq. e2alpha: alpha = e + W a, sum_k a_k = 1) and u = W / S."""
    alpha_NxK = np.asarray(alpha_NxK, np.float64)
    w_N = np.asarray(prior_strength_N, np.float64)
    strength_N = alpha_NxK.sum(axis=1)
    return strength_N - w_N, w_N / strength_N


def evidence_split(predictions: Mapping[str, object], test: str = "test") -> list[SetSummary]:
    """One summary per set of `predictions` ({name: object with .alpha and .prior_strength},
    e.g. `gedl_jax.run.workdir.predict_outputs`), measured against the set named `test`."""
    if test not in predictions:
        raise ValueError(f"no {test!r} set among {sorted(predictions)}")
    for name, p in predictions.items():
        if getattr(p, "alpha", None) is None or getattr(p, "prior_strength", None) is None:
            raise ValueError(f"the {name!r} predictions have no Dirichlet (alpha and W): "
                             "is this an evidential run?")
    e_test, u_test = evidence_and_uncertainty(predictions[test].alpha,
                                              predictions[test].prior_strength)
    e_median = float(np.median(e_test))
    u_median, u_top = (float(q) for q in np.quantile(u_test, [0.5, 0.01]))
    out = []
    for name, p in predictions.items():
        e, u = evidence_and_uncertainty(p.alpha, p.prior_strength)
        out.append(SetSummary(name, len(e), float(e.mean()), float(np.median(e)),
                              float(np.mean(e > e_median)), float(u.mean()),
                              float(np.mean(u < u_median)), float(np.mean(u < u_top))))
    return out


def table(rows: list[SetSummary]) -> list[str]:
    lines = ["| set | images | E mean | E median | share E > test median | u mean "
             "| share ranked above the test median | above the test's top 1 % |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r.name} | {r.images} | {r.evidence_mean:.3f} | "
                     f"{r.evidence_median:.3f} | {r.above_test_median_evidence:.3f} | "
                     f"{r.uncertainty_mean:.3f} | {r.above_test_median_rank:.3f} | "
                     f"{r.above_test_top_rank:.3f} |")
    return lines


def workdir_predictions(path: pathlib.Path) -> dict:
    from gedl_jax.run import workdir  # the heavy import only when run

    return workdir.predict_outputs(path)


def pretrained_predictions(name: str) -> dict:
    """A pretrained model's predictions on its test set and OOD sets (the sets
    `python -m gedl_jax.evaluate --pretrained=NAME` scores)."""
    from gedl_jax import pretrained
    from gedl_jax.pretrained import model as model_lib
    from gedl_jax.run import workdir

    model = pretrained.load(name)
    run_data = model_lib.evaluation_data(model)
    run = model.restored_run(run_data)
    return {"test": workdir.predict(run, run_data.test),
            **{set_name: workdir.predict(run, split, with_labels=False)
               for set_name, split in run_data.ood.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdirs", nargs="*", type=pathlib.Path, metavar="WORKDIR",
                        help="a training run's folder; its best checkpoint is evaluated")
    parser.add_argument("--pretrained", default="",
                        help="comma-separated pretrained model names, e.g. mnist/gedl")
    parser.add_argument("--names", default="",
                        help="comma-separated names of the runs and models in the output "
                             "(default: each workdir's last three path parts, each model's "
                             "name)")
    parser.add_argument("--out", type=pathlib.Path, help="also write the tables here")
    args = parser.parse_args(argv)
    models = [m for m in args.pretrained.split(",") if m]
    sources = ([(path, workdir_predictions) for path in args.workdirs]
               + [(name, pretrained_predictions) for name in models])
    if not sources:
        parser.error("give a workdir or --pretrained=NAME")
    names = [n for n in args.names.split(",") if n] or (
        ["/".join(w.parts[-3:]) for w in args.workdirs] + models)
    if len(names) != len(sources):
        parser.error(f"--names has {len(names)} names for {len(sources)} runs and models")
    lines = []
    for name, (source, predictions_of) in zip(names, sources):
        try:
            rows = evidence_split(predictions_of(source))
        except (FileNotFoundError, ValueError) as e:   # PretrainedError is a ValueError
            print(f"evidence_split.py: {source}: {e}", file=sys.stderr)
            return 2
        lines += [f"### {name}", ""] + table(rows) + [""]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
