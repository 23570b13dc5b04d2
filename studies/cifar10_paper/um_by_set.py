"""Where each set sits in strength, prior strength and evidence, from a run's evaluation alone:
why the uncertainty mass of a GEDL run at its objective's optimum does not tell OOD images from
test images, while the max probability does.

For each committed run (`runs/<row>_seed<s>/` beside this study's results) and each of its sets
(the test set, then every OOD set), from the set means its `eval_results.json` records (the mean
strength S, mean uncertainty mass u = W / S and mean max probability p), this prints:

- the spread of S over the set, its coefficient of variation from the two means the evaluation
  records (log of the mean S less the mean log S is CV^2 / 2 to second order);
- W: the prior strength, from the run's config for a fixed W; for GEDL's adaptive W, u S, a
  product of two means that stands for the mean of products where S hardly varies (CV < 0.05;
  else "–");
- E = S - W: the mean total evidence (Eq. e2alpha: alpha = e + W a, sum_k a_k = 1);
- the top class's share of the evidence, (p S - W / K) / E: with alpha_max = e_max + W / K and
  p = alpha_max / S, the share of the evidence on the predicted class (1: all of it); again a
  product of means, shown where S hardly varies;
- the AUROC of MP and of UM against the test set (in-distribution positive, %).

At the optimum every training image holds E = tau on its class, whatever the class
(`studies/gedl_convergence/fixed_point.py`). GEDL's u = W(E) / (W(E) + E) depends on E alone
and falls as E grows, so UM ranks an image by its total evidence; an OOD set with a little more
evidence than the test set ranks above it. Where the network puts the evidence is a different
quantity: an OOD image's evidence spread over more classes gives a lower max probability, which
MP sees and UM cannot. Per-example values need the runs' predictions (`predictions.npz`), which
these runs did not keep; `studies/gedl_convergence/evidence_split.py` computes them from a
checkpoint.

    python studies/cifar10_paper/um_by_set.py [RUNS_FOLDER]

It needs only the Python standard library.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
RUNS = HERE.parents[1] / "docs" / "results" / "cifar10_paper" / "runs"


# Where S varies less than this over a set (coefficient of variation), a product of its means
# stands for the mean of the products.
NARROW = 0.05


def fixed_prior_strength(config: dict) -> float | None:
    """The run's W if it is fixed (a number, "K" or "<x>K"), else None (GEDL's adaptive W)."""
    if config.get("prior_strength") != "fixed":
        return None
    value, k = str(config["prior_strength_value"]).strip(), int(config["num_classes"])
    return float(value[:-1] or 1.0) * k if value.endswith("K") else float(value)


def set_row(name: str, entry: dict, num_classes: int, fixed_w: float | None,
            against_test: bool) -> str:
    measures = entry["uncertainty"]
    strength, u, p = measures["strength"], measures["u"], measures["max_probability"]
    spread = math.sqrt(max(0.0, 2 * (math.log(strength) - measures["log_strength"])))
    narrow = spread < NARROW
    w = fixed_w if fixed_w is not None else (u * strength if narrow else None)
    evidence = None if w is None else strength - w
    share = ((p * strength - w / num_classes) / evidence
             if narrow and evidence is not None and evidence > 0 else None)
    cells = [name, f"{strength:.4f}", f"{spread:.3f}", f"{u:.4f}",
             "–" if w is None else f"{w:.4f}", "–" if evidence is None else f"{evidence:.4f}",
             f"{p:.4f}", "–" if share is None else f"{share:.3f}"]
    if against_test:
        detection = entry["detection"]
        cells += [f"{100 * detection['mp']['auroc']:.2f}", f"{100 * detection['um']['auroc']:.2f}"]
    else:
        cells += ["", ""]
    return "| " + " | ".join(cells) + " |"


def table(runs_folder: pathlib.Path) -> list[str]:
    lines = ["| run | set | S | CV of S | u | W | E = S - W | max p | top-class share of E "
             "| MP AUROC | UM AUROC |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for run in sorted(p for p in runs_folder.iterdir() if (p / "eval_results.json").is_file()):
        results = json.loads((run / "eval_results.json").read_text())
        config = json.loads((run / "config.json").read_text())
        k, fixed_w = int(results["id"]["num_classes"]), fixed_prior_strength(config)
        rows = [set_row("test", results["id"], k, fixed_w, False)]
        rows += [set_row(name, entry, k, fixed_w, True)
                 for name, entry in results["ood"].items()]
        lines += [f"| {run.name} |{row[1:]}" for row in rows]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="?", type=pathlib.Path, default=RUNS,
                        help="a folder of runs/<row>_seed<s>/ with eval_results.json")
    args = parser.parse_args(argv)
    if not args.runs.is_dir():
        print(f"um_by_set.py: {args.runs} is not a folder of runs", file=sys.stderr)
        return 2
    print("\n".join(table(args.runs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
