"""Where GEDL's objective sends each training example, in closed form, beside a run's log.

The paper derives its objective from a tempered posterior (Eq. scaled_posterior, Eq. loss and
the Appendix's Proposition "Detailed derivation of the training objective"): for one example
with label y, prior Dir(W a) and KL weight 1/tau,

    E_Dir(alpha)[-log pi_y] + (1/tau) KL(Dir(alpha) || Dir(W a))
        = (1/tau) [ KL(Dir(alpha) || Dir(W a + tau e_y)) - log Z ],
    Z = B(W a + tau e_y) / B(W a) = Gamma(W a_y + tau) Gamma(W) / (Gamma(W a_y) Gamma(W + tau)).

The KL on the right is >= 0 and is 0 only at alpha = W a + tau e_y. So the objective has one
minimiser per example, the tempered posterior itself: evidence tau on the true class and none
on the others, strength S* = W + tau, and its minimum is -(1/tau) log Z (log K when tau = 1 and
the base rate is uniform: the loss of a run at its optimum is 2.3026 on MNIST). With GEDL's
adaptive prior strength (Eq. weight_update, a stop-gradient function of the evidence total E)
the optimum has E = tau, so

    W* = C_w + (K - C_w) / (1 + K tau),    S* = W* + tau,    u* = W* / S*,
    max_k alpha*_k / S* = (W* a_y + tau) / S*.

The paper's schedule as printed (Eq. tau_schedule, tau = max(1, C_tau / sum)) lowers tau to
its floor of 1 as the strengths accumulate, so with the KL on all examples it ends at
S* = W*(1) + 1 (2.364 for K = 10, C_w = 0.5) on every training image, whatever the network
could tell apart. (The inverted form, tau = max(1, sum / C_tau), raises tau instead once the
sum passes C_tau.) EDL's masked target (`kl_target=masked`) has no such minimiser: it leaves
the true class's evidence out of the KL, so the likelihood term keeps raising it.

This script prints, for each epoch of a run, the KL weight, the logged training means of S, W
and the loss, and the values the closed form predicts from the logged tau alone:

    python studies/gedl_convergence/fixed_point.py RUN_DIR [RUN_DIR ...] [--out=FILE]

With `--predict_from=E` it also feeds the optimum's strength back into the schedule, from the
state logged at the end of epoch E, and predicts 1/tau and S* for every later epoch to
`--predict_to` (200): under the epoch reading (`tau_reading=epoch`) each epoch's tau solves
tau = max(1, C_tau / (sum of the earlier epochs' S + S*(tau))) (`tau_form=c_over_sum`, the
default), or max(1, (sum + S*(tau)) / C_tau) (`sum_over_c`). `--predict_form=sum_over_c` (or
`c_over_sum`) predicts under that form instead of the run's: what the other reading of
Eq. tau_schedule would do from the same start, the strength accumulated by the end of epoch E
summed from the log's mean training S (the run's own tau is of the other form).

(RUN_DIR: a training workdir with config.json and metrics.jsonl, e.g.
`RUNS/runs/gedl/seed_0` of `bin/reproduce.py`.) It needs only the Python standard library.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
from typing import NamedTuple


class Optimum(NamedTuple):
    """The per-example minimiser of the objective at one tau, and the objective's minimum."""

    evidence_y: float       # tau: the evidence on the true class (0 on the others)
    prior_strength: float   # W*
    strength: float         # S* = W* + tau
    uncertainty: float      # u* = W* / S* (Eq. compute_opinion)
    max_probability: float  # (W* a_y + tau) / S*, the predicted class's projected probability
    loss: float             # -(1/tau) log Z


def log_normaliser(prior_strength: float, base_rate_y: float, tau: float) -> float:
    """log Z = log B(W a + tau e_y) - log B(W a): the tempered posterior's normaliser."""
    w_y = prior_strength * base_rate_y
    return (math.lgamma(w_y + tau) + math.lgamma(prior_strength)
            - math.lgamma(w_y) - math.lgamma(prior_strength + tau))


def optimum(tau: float, num_classes: int, *, c_w: float | None = None,
            prior_strength: float | None = None, base_rate_y: float | None = None) -> Optimum:
    """The minimiser at KL weight 1/tau, for GEDL's adaptive W (give `c_w`) or a fixed W (give
    `prior_strength`, e.g. EDL's K). `base_rate_y` defaults to the uniform 1/K."""
    if tau <= 0 or not math.isfinite(tau):
        raise ValueError(f"tau must be finite and > 0, got {tau}")
    if (c_w is None) == (prior_strength is None):
        raise ValueError("give exactly one of c_w (adaptive W) and prior_strength (fixed W)")
    a_y = 1.0 / num_classes if base_rate_y is None else float(base_rate_y)
    if c_w is not None:
        # Eq. weight_update at the optimum's evidence total E = tau, written as in
        # gedl_jax.evidential.prior.adaptive_prior_strength.
        w = c_w + (num_classes - c_w) / (1.0 + num_classes * tau)
    else:
        w = float(prior_strength)
    strength = w + tau
    return Optimum(evidence_y=tau, prior_strength=w, strength=strength,
                   uncertainty=w / strength, max_probability=(w * a_y + tau) / strength,
                   loss=-log_normaliser(w, a_y, tau) / tau)


# ---------------------------------------------------------------------------------------------
# A run's log


def check_config(config: dict) -> None:
    """Raise ValueError unless the run's objective is the one the closed form is about."""
    problems = []
    if config.get("method", "evidential") not in ("evidential", None):
        problems.append(f"method={config.get('method')!r} (not an evidential variant)")
    if config.get("likelihood") != "digamma":
        problems.append(f"likelihood={config.get('likelihood')!r} (needs 'digamma')")
    if config.get("kl_target") != "all":
        problems.append(
            f"kl_target={config.get('kl_target')!r} (needs 'all': with the masked target the "
            "true class's evidence is outside the KL and has no finite optimum)")
    for extra in ("fisher_logdet_weight", "red_regularizer_weight"):
        if config.get(extra):
            problems.append(f"{extra}={config[extra]} (an extra term)")
    if config.get("base_rate", "uniform") != "uniform":
        problems.append(f"base_rate={config.get('base_rate')!r} (the loss column assumes 1/K)")
    if not config.get("num_classes"):
        problems.append("num_classes is not recorded")
    if int(config.get("eval_every_epochs", 1) or 1) != 1:
        problems.append(f"eval_every_epochs={config['eval_every_epochs']} (epochs are counted "
                        "by their validation rows: needs 1)")
    if problems:
        raise ValueError("the closed form is for the digamma likelihood with the KL on all "
                         "examples; this run has " + "; ".join(problems))


def optimum_for(config: dict, tau: float) -> Optimum:
    if config.get("prior_strength") == "adaptive":
        return optimum(tau, int(config["num_classes"]), c_w=float(config["c_w"]))
    num_classes = int(config["num_classes"])
    value = str(config["prior_strength_value"]).strip()   # a number, "K" or "<x>K" (R-EDL)
    w = (float(value[:-1] or 1.0) * num_classes) if value.endswith("K") else float(value)
    return optimum(tau, num_classes, prior_strength=w)


def display_name(run_dir: pathlib.Path) -> str:
    """The run's path as given when relative, else its last three parts (no machine paths in a
    report that may be committed)."""
    return str(run_dir) if not run_dir.is_absolute() else "/".join(run_dir.parts[-3:])


def read_run(run_dir: pathlib.Path) -> tuple[dict, list[dict]]:
    config_path, metrics_path = run_dir / "config.json", run_dir / "metrics.jsonl"
    for path in (config_path, metrics_path):
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: give a training workdir (the folder "
                                    "with config.json and metrics.jsonl)")
    config = json.loads(config_path.read_text())
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    return config, rows


class EpochRow(NamedTuple):
    epoch: int
    kl_weight: float
    strength: float
    prior_strength: float
    loss: float
    test_strength: float | None
    predicted: Optimum


# Below this KL weight an epoch is left out: without the KL the likelihood alone has no finite
# minimiser (and 1/weight overflows).
MIN_KL_WEIGHT = 1e-6


def _by_step(rows: list[dict], split: str) -> dict[int, dict]:
    """A split's rows keyed by step; a step logged twice (a run resumed from an earlier
    checkpoint logs it again) keeps its last row."""
    return {r["step"]: r for r in rows if r.get("split") == split}


def epoch_rows(config: dict, rows: list[dict]) -> list[EpochRow]:
    """One row per epoch end (each validation row): the last training log at or before it, and
    the per-epoch evaluation's test-set S where the run logged one (`epoch_eval`). A training
    log row is the mean over its logging window (the last 100 steps, or fewer at an epoch's
    end), so its 1/tau is that window's mean, not the value at the epoch's last step."""
    check_config(config)
    train = _by_step([r for r in rows if "kl_weight" in r], "train")
    if not train:
        raise ValueError("metrics.jsonl has no training rows with kl_weight: is this an "
                         "evidential run?")
    test_strength = {step: r["test_strength"] for step, r in _by_step(rows, "epoch_eval").items()
                     if "test_strength" in r}
    ends = sorted(_by_step(rows, "validation"))
    if not ends:
        raise ValueError("metrics.jsonl has no validation rows, which mark the epochs' ends: "
                         "is the run's first epoch finished?")
    out = []
    for epoch, end in enumerate(ends, start=1):
        before = [step for step in train if step <= end]
        if not before:
            continue
        last = train[max(before)]
        if last["kl_weight"] < MIN_KL_WEIGHT:
            continue   # (almost) no KL, e.g. EDL's annealing in epoch 0: no finite optimum
        tau = 1.0 / last["kl_weight"]
        out.append(EpochRow(epoch, last["kl_weight"], last["mean_strength"],
                            last["mean_prior_strength"], last["loss"],
                            test_strength.get(end), optimum_for(config, tau)))
    if not out:
        raise ValueError("no epoch of the log has a KL weight above "
                         f"{MIN_KL_WEIGHT}: the closed form needs the KL")
    return out


def best_epoch(rows: list[dict]) -> int | None:
    """The epoch of the best-validation-accuracy checkpoint the run evaluates (the first of
    equal accuracies: the trainer keeps a checkpoint only when accuracy improves)."""
    validation = _by_step(rows, "validation")
    best, best_accuracy = None, -1.0
    for epoch, step in enumerate(sorted(validation), start=1):
        if validation[step]["accuracy"] > best_accuracy:
            best, best_accuracy = epoch, validation[step]["accuracy"]
    return best


class Evaluated(NamedTuple):
    """The evaluated checkpoint beside the closed form at its epoch's tau."""

    epoch: int
    row: EpochRow
    accuracy: float
    test_strength: float | None
    ece: float | None

    @property
    def predicted_ece(self) -> float:
        """|accuracy - max probability at the optimum|: the ECE when every test confidence sits
        at the optimum's."""
        return abs(self.accuracy - self.row.predicted.max_probability)


def evaluated_checkpoint(epochs: list[EpochRow], best: int | None,
                         eval_results: dict) -> Evaluated | None:
    row = next((r for r in epochs if r.epoch == best), None)
    id_ = eval_results.get("id", {})
    if row is None or "accuracy" not in id_:
        return None
    return Evaluated(best, row, id_["accuracy"], id_.get("uncertainty", {}).get("strength"),
                     id_.get("ece"))


def _number(value: float | None, digits: int) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def evaluated_line(e: Evaluated) -> str:
    return (f"Evaluated checkpoint: epoch {e.epoch} (1/tau = {e.row.kl_weight:.3f}). Test-set "
            f"mean S: S* = {e.row.predicted.strength:.3f}, measured "
            f"{_number(e.test_strength, 3)}. ECE: |accuracy {e.accuracy:.4f} - max probability "
            f"at the optimum {e.row.predicted.max_probability:.4f}| = {e.predicted_ece:.4f}, "
            f"measured {_number(e.ece, 4)}.")


def summary_table(runs: list[tuple[str, list[EpochRow], Evaluated | None]]) -> list[str]:
    lines = ["| run | epochs | largest \\|S - S*\\| / S*, last half | evaluated epoch | 1/tau "
             "| S* | test S | \\|acc - p*\\| | ECE |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, rows, e in runs:
        gap = f"{max(map(relative_gap, rows[len(rows) // 2:])):.2%}"
        if e is None:
            lines.append(f"| {name} | {len(rows)} | {gap} | | | | | | |")
        else:
            lines.append(f"| {name} | {len(rows)} | {gap} | {e.epoch} | {e.row.kl_weight:.3f} "
                         f"| {e.row.predicted.strength:.3f} | {_number(e.test_strength, 3)} "
                         f"| {e.predicted_ece:.4f} | {_number(e.ece, 4)} |")
    return lines + [""]


# ---------------------------------------------------------------------------------------------
# The schedule, predicted: the optimum's strength fed back into Eq. tau_schedule


def _tau_of_sum(config: dict, cumulative: float) -> float:
    """Eq. tau_schedule's tau for an accumulated strength, in the run's form (as
    gedl_jax.evidential.schedules.gedl_tau): max(1, C_tau / sum), or max(1, sum / C_tau)."""
    c_tau = float(config["c_tau"])
    ratio = c_tau / cumulative if config["tau_form"] == "c_over_sum" else cumulative / c_tau
    return max(1.0, ratio)


def _solve_tau(config: dict, completed_sum: float) -> float:
    """tau in an epoch whose mean strength is the optimum's at that tau: the root of
    tau = tau_of_sum(completed_sum + S*(tau)). The root is unique in both forms (the right side
    falls as tau rises for c_over_sum, and rises with slope below 1 for sum_over_c); found by
    bisection."""
    def excess(tau):
        return tau - _tau_of_sum(config, completed_sum + optimum_for(config, tau).strength)
    if excess(1.0) >= 0:
        return 1.0
    lo, hi = 1.0, 2.0
    while excess(hi) < 0:
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if excess(mid) < 0 else (lo, mid)
    return 0.5 * (lo + hi)


def starting_sum(config: dict, rows: list[EpochRow], epoch: int) -> float:
    """The accumulated strength after `epoch`. Read back from its logged KL weight where tau > 1
    there (c_over_sum: C_tau / tau; sum_over_c: C_tau * tau); else, while tau sits at its floor,
    summed from the log's mean training S of each epoch so far (the epoch's last window stands
    for its mean: an approximation, exact only once S settles)."""
    row = next(r for r in rows if r.epoch == epoch)
    if row.kl_weight < 1.0:
        tau = 1.0 / row.kl_weight
        c_tau = float(config["c_tau"])
        return c_tau / tau if config["tau_form"] == "c_over_sum" else c_tau * tau
    return sum(r.strength for r in rows if r.epoch <= epoch)


def predicted_schedule(config: dict, epoch: int, completed_sum: float,
                       to_epoch: int) -> list[tuple[int, float, float]]:
    """(epoch, 1/tau, S*) for epochs epoch+1..to_epoch, if every later epoch's mean training
    strength is the optimum's, from the strength accumulated by the end of `epoch`
    (`starting_sum`). For the epoch reading of Eq. tau_schedule (`tau_reading=epoch`, either
    `tau_form`) without warm-up and with kl_weight 1."""
    if (config.get("kl_schedule"), config.get("tau_reading")) != ("gedl_tau", "epoch") \
            or config.get("tau_form") not in ("c_over_sum", "sum_over_c") \
            or config.get("warmup_epochs"):
        raise ValueError("the schedule is predicted for kl_schedule=gedl_tau with "
                         "tau_reading=epoch, without warm-up, only")
    if float(config.get("kl_weight", 1.0)) != 1.0:
        raise ValueError("the schedule is predicted for kl_weight=1 only")
    completed, out = float(completed_sum), []
    for t in range(epoch + 1, to_epoch + 1):
        tau = _solve_tau(config, completed)
        strength = optimum_for(config, tau).strength
        out.append((t, 1.0 / tau, strength))
        completed += strength
    return out


def schedule_report(config: dict, rows: list[EpochRow], start: int,
                    to_epoch: int, form: str | None = None,
                    evaluated: int | None = None) -> list[str]:
    """The predicted schedule from epoch `start` beside the log (every 5th epoch to 40, every
    20th after, the epoch the weight first reaches 1 and the last), with the largest difference
    from the log over every logged epoch. `form`: predict under that `tau_form` instead of the
    run's (then from the log's summed mean S, and beside no logged weight: the run had the
    other form). `evaluated`: the epoch of the run's evaluated checkpoint, shown in the table
    and, under another form, with the optimum it predicts there."""
    if not any(r.epoch == start for r in rows):
        return [f"(No epoch {start} in the log: no predicted schedule.)", ""]
    other = form is not None and form != config.get("tau_form")
    if other:
        completed = sum(r.strength for r in rows if r.epoch <= start)
        config = {**config, "tau_form": form}
        predicted = predicted_schedule(config, start, completed, to_epoch)
        logged: dict[int, EpochRow] = {}
    else:
        predicted = predicted_schedule(config, start, starting_sum(config, rows, start),
                                       to_epoch)
        logged = {r.epoch: r for r in rows}
    first_one = next((t for t, w, _ in predicted if w >= 1.0), None)
    left_one = next((t for t, w, _ in predicted
                     if w < 1.0 and first_one is not None and t > first_one), None)
    lines = [f"The schedule of tau_form={form} (not this run's), predicted from the strength "
             f"the log sums to by epoch {start} ({completed:.2f}); the logged columns stay empty:"
             if other else f"The schedule predicted from epoch {start}'s logged 1/tau alone:", "",
             "| epoch | 1/tau predicted | 1/tau logged | S* predicted | S logged |",
             "|---:|---:|---:|---:|---:|"]
    for t, weight, strength in predicted:
        every = 5 if t <= 40 else 20
        if t % every and t not in (first_one, left_one, to_epoch, start + 1, evaluated):
            continue
        row = logged.get(t)
        lines.append(f"| {t} | {weight:.3f} | {'' if row is None else f'{row.kl_weight:.3f}'} "
                     f"| {strength:.3f} | {'' if row is None else f'{row.strength:.3f}'} |")
    both = [(w, logged[t].kl_weight) for t, w, _ in predicted if t in logged]
    worst = max((abs(a - b) for a, b in both), default=None)
    lines.append("")
    if worst is not None:
        lines.append(f"Largest |1/tau predicted - logged| over the {len(both)} logged epochs "
                     f"after epoch {start}: {worst:.4f}.")
    if first_one is None:
        lines.append(f"The weight stays below 1 to epoch {to_epoch}.")
    elif left_one is None:
        lines.append(f"The weight reaches 1 at epoch {first_one} and stays there.")
    else:
        lines.append(f"The weight is 1 from epoch {first_one} and falls below it again at "
                     f"epoch {left_one}.")
    at = {t: (w, strength) for t, w, strength in predicted}
    if other and evaluated in at:
        weight, strength = at[evaluated]
        lines.append(f"At epoch {evaluated} (this run's evaluated checkpoint): 1/tau "
                     f"{weight:.3f}, S* {strength:.3f}, max probability "
                     f"{optimum_for(config, 1.0 / weight).max_probability:.3f}.")
    lines.append(f"At epoch {to_epoch}: 1/tau {predicted[-1][1]:.3f}, S* "
                 f"{predicted[-1][2]:.3f}, max probability "
                 f"{optimum_for(config, 1.0 / predicted[-1][1]).max_probability:.3f}.")
    return lines + [""]


def relative_gap(row: EpochRow) -> float:
    return abs(row.strength - row.predicted.strength) / row.predicted.strength


def report(name: str, config: dict, rows: list[EpochRow],
           extra: list[str] = ()) -> list[str]:
    """A markdown section: every epoch's logged and predicted values, and a summary line."""
    lines = [f"### {name}", "",
             "| epoch | 1/tau | S (train log) | S* | test S | W (train log) | W* "
             "| loss (train log) | loss* |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        test = "" if r.test_strength is None else f"{r.test_strength:.3f}"
        lines.append(f"| {r.epoch} | {r.kl_weight:.3f} | {r.strength:.3f} | "
                     f"{r.predicted.strength:.3f} | {test} | {r.prior_strength:.4f} | "
                     f"{r.predicted.prior_strength:.4f} | {r.loss:.4f} | "
                     f"{r.predicted.loss:.4f} |")
    lines.append("")
    below = [r.epoch for r in rows if r.kl_weight < 0.9999]
    full = [r for r in rows if r.epoch > max(below, default=0)]
    tail = rows[len(rows) // 2:]
    summary = [f"Largest |S - S*| / S* over the last {len(tail)} epochs: "
               f"{max(map(relative_gap, tail)):.2%}."]
    if full:
        end = optimum_for(config, 1.0)
        summary.append(
            f"1/tau = 1 from epoch {full[0].epoch} to the end; there S* = {end.strength:.4f}, "
            f"W* = {end.prior_strength:.4f}, u* = {end.uncertainty:.4f}, max probability "
            f"{end.max_probability:.4f}, loss* = {end.loss:.4f}; at the last epoch the log has "
            f"S = {rows[-1].strength:.4f}, W = {rows[-1].prior_strength:.4f}, loss "
            f"{rows[-1].loss:.4f}.")
    lines += [" ".join(summary), ""] + list(extra)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=pathlib.Path, help="training workdirs")
    parser.add_argument("--out", type=pathlib.Path, help="also write the report here")
    parser.add_argument("--predict_from", type=int, default=0,
                        help="also predict the KL weight schedule from this epoch's logged "
                             "1/tau on (0: no prediction)")
    parser.add_argument("--predict_to", type=int, default=200,
                        help="the last epoch of the predicted schedule")
    parser.add_argument("--predict_form", choices=("c_over_sum", "sum_over_c"),
                        help="predict the schedule under this tau_form instead of the run's")
    args = parser.parse_args(argv)
    runs = []
    for run_dir in args.runs:
        try:
            config, rows = read_run(run_dir)
            epochs = epoch_rows(config, rows)
        except (FileNotFoundError, ValueError) as e:
            print(f"fixed_point.py: {run_dir}: {e}", file=sys.stderr)
            return 2
        results_path = run_dir / "eval_results.json"
        evaluated = (evaluated_checkpoint(epochs, best_epoch(rows),
                                          json.loads(results_path.read_text()))
                     if results_path.is_file() else None)
        runs.append((display_name(run_dir), config, epochs, evaluated))
    lines = ["## The closed-form optimum beside the training log", "",
             "S*, W*, loss*, p*: the per-example minimiser of the objective at the logged 1/tau, "
             "and its max probability (`fixed_point.py`'s docstring); S, W, loss: the training "
             "log's means at the epoch's last log; test S: the mean strength on the test set "
             "(per epoch where the run logged `epoch_eval`; at the evaluated best-validation "
             "checkpoint from its eval_results.json); ECE: the evaluation's (15 bins).", ""]
    lines += summary_table([(name, epochs, e) for name, _, epochs, e in runs])
    for name, config, epochs, evaluated in runs:
        extra = [] if evaluated is None else [evaluated_line(evaluated), ""]
        if args.predict_from:
            try:
                extra += schedule_report(config, epochs, args.predict_from, args.predict_to,
                                         args.predict_form,
                                         evaluated.epoch if evaluated else None)
            except ValueError as e:
                extra += [f"(No predicted schedule: {e}.)", ""]
        lines += report(name, config, epochs, extra)
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
