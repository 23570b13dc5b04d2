"""Calibration on the test set: NLL, Brier, the ECEs; post-hoc calibration before and after; the
calibrators side by side."""

from __future__ import annotations

from gedl_jax.evaluation.tables.context import Context, node_at, render, stat_at

__all__ = ["calibration_table", "posthoc_calibration", "calibrators"]


def calibration_table(ctx: Context) -> list[str]:
    """NLL, Brier, Brier-L2, the ECE and its parts, the adaptive ECE on the test set."""
    header = ["Method", "NLL", "Brier", "Brier-L2", "ECE", "ECE-over", "ECE-under",
              "ECE-adaptive"]
    keys = ("nll", "brier", "brier_l2", "ece", "ece_overconfidence", "ece_underconfidence",
            "ece_adaptive")
    rows = [[ctx.esc(name)] + [ctx.fmt(name)(stat_at(agg, ("id", k)), 1, 4) for k in keys]
            for name, agg in ctx.aggregates.items()]
    return [ctx.comment + f"Calibration on the {ctx.id_name} test set, mean ± sample std "
            f"(ddof=1) over {ctx.seeds}; fractions, lower is better. Brier = mean_i sum_k "
            "(p_ik - y_ik)^2 (standard); Brier-L2 = mean_i ||p_i - y_i||_2 (the I-EDL/R-EDL "
            "code's un-squared variant). ECE: 15 equal-width bins (lower, upper] on the max "
            "predictive probability, split into ECE-over + ECE-under = ECE, the part from the "
            "bins whose mean confidence is above (below) their accuracy; ECE-adaptive: 15 "
            "equal-mass bins. NLL: natural log.",
            render(header, rows, ctx.latex)]


def posthoc_calibration(ctx: Context) -> list[str]:
    """Post-hoc calibration: fitted value, NLL / ECE / Brier before and after on the test
    set, and the scores whose OOD ranking changed."""
    names = [n for n in ctx.aggregates if n not in ctx.calibrated_rows
             and node_at(ctx.aggregates[n], ("posthoc_calibration",)) is not None]
    if not names:
        return []
    header = ["Method", "Calibrator", "Fitted", "NLL before", "NLL after", "ECE before",
              "ECE after", "Brier before", "Brier after", "OOD ranking changed"]
    rows = []
    for name in names:
        agg, runs = ctx.aggregates[name], ctx.groups[name]
        fmt = ctx.fmt(name)
        fits = [r["posthoc_calibration"]["fit"] for r in runs if "posthoc_calibration" in r]
        kind = "/".join(dict.fromkeys(str(f.get("calibrator")) for f in fits))
        param = "temperature" if "temperature" in kind else "scale"
        changed = sorted({s for r in runs for s in
                          r.get("posthoc_calibration", {}).get("ood_ranking_changed", [])})
        fitted = stat_at(agg, ("posthoc_calibration", "fit", param))
        cells = [ctx.esc(kind), f"{param} " + fmt(fitted, 1, 4)]
        for k in ("nll", "ece", "brier"):
            cells += [fmt(stat_at(agg, ("posthoc_calibration", "test", when, k)), 1, 4)
                      for when in ("before", "after")]
        cells.append(ctx.esc(", ".join(changed) or "none"))
        rows.append([ctx.esc(name)] + cells)
    return [ctx.comment + f"Post-hoc calibration fitted on the validation split (never the "
            f"test set); {ctx.id_name} test set before / after, mean ± sample std (ddof=1) "
            f"over {ctx.seeds}; fractions. temperature: p = softmax(log p / T); "
            "evidence_scale: alpha = s e + W a (keeps the UM ranking). Last column: the "
            "scores whose pooled ID+OOD ranking changed on some set (any seed).",
            render(header, rows, ctx.latex)]


def calibrators(ctx: Context) -> list[str]:
    """The calibrators side by side (results' "calibrators"): NLL, ECE, SmoothECE and Brier
    on the test set before and after each, and whether it kept the predicted classes and
    the max-probability ranking in every seed."""
    names = [n for n in ctx.aggregates if n not in ctx.calibrated_rows
             and node_at(ctx.aggregates[n], ("calibrators",)) is not None]
    if not names:
        return []
    metrics_ = ("nll", "ece", "smooth_ece", "ece_classwise", "brier")
    header = ["Method", "Calibrator", "NLL", "ECE", "SmoothECE", "Classwise-ECE", "Brier",
              "Keeps class", "Keeps MP ranking"]
    rows = []
    for name in names:
        agg, runs = ctx.aggregates[name], ctx.groups[name]
        fmt = ctx.fmt(name)
        rows.append([ctx.esc(name), "none"]
                    + [fmt(stat_at(agg, ("calibrators", "before", k)), 1, 4) for k in metrics_]
                    + ["–", "–"])   # an en dash in LaTeX too, as these tables always printed
        fitted = node_at(ctx.aggregates[name], ("calibrators", "after")) or {}
        for calibrator in fitted:
            flags = [[r["calibrators"]["after"][calibrator].get(k) for r in runs
                      if calibrator in r.get("calibrators", {}).get("after", {})]
                     for k in ("keeps_predicted_class", "keeps_mp_ranking")]
            rows.append(
                [ctx.esc(name), ctx.esc(calibrator)]
                + [fmt(stat_at(agg, ("calibrators", "after", calibrator, k)), 1, 4)
                   for k in metrics_]
                + [("yes" if all(f) else "no" if not any(f) else "some seeds")
                   for f in flags])
    return [ctx.comment + f"Calibrators fitted on the validation split's log predictive "
            f"probabilities (never the test set), {ctx.id_name} test set; mean ± sample "
            f"std (ddof=1) over {ctx.seeds}; fractions. SmoothECE: kernel-smoothed "
            "top-label ECE at its own bandwidth (Blasiok & Nakkiran 2023). Classwise-ECE: "
            "the mean over classes of each class probability's 15-bin ECE (Kull et al. "
            "2019). Keeps class / MP "
            "ranking: every test example's predicted class, and the order of the examples "
            "by max probability (what MP detection and selective prediction read).",
            render(header, rows, ctx.latex)]
