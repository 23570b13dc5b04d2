"""A single run's bootstrap intervals: the test set's numbers, then each score's detection."""

from __future__ import annotations

from collections.abc import Mapping

from gedl_jax.evaluation.tables.context import Context, PAPER_SCORES, node_at, render

__all__ = ["bootstrap_intervals"]


def bootstrap_intervals(ctx: Context) -> list[str]:
    """The bootstrap intervals (results' "bootstrap") of the methods with one run each:
    value [low, high] at the run's confidence; a calibrated row's from its results'
    "calibrated" section. Over several seeds each run's intervals stay in its
    eval_results.json (their mean is no interval)."""
    single = {}
    for name, runs in ctx.groups.items():
        if len(runs) != 1:
            continue
        run = runs[0]["calibrated"] if name in ctx.calibrated_rows else runs[0]
        if isinstance(run.get("bootstrap"), Mapping):
            single[name] = run
    if not single:
        return []
    dash = ctx.dash

    def cell(value, bounds, scale):
        if value is None or not isinstance(bounds, Mapping) or bounds.get("low") is None:
            return dash
        digits = 2 if scale == 100 else 4
        return (f"{value * scale:.{digits}f} [{bounds['low'] * scale:.{digits}f}, "
                f"{bounds['high'] * scale:.{digits}f}]")

    id_keys = (("accuracy", "Acc", 100), ("nll", "NLL", 1), ("brier", "Brier", 1),
               ("ece", "ECE", 1), ("ece_overconfidence", "ECE-over", 1),
               ("ece_underconfidence", "ECE-under", 1),
               ("ece_classwise", "Classwise-ECE", 1))
    id_rows, rows = [], []
    for name, run in single.items():
        boot, esc = run["bootstrap"], ctx.esc
        id_rows.append([esc(name)] + [cell(node_at(run, ("id", k)), node_at(boot, ("id", k)),
                                           scale) for k, _, scale in id_keys])
        # the method's own MP and UM, then the post-hoc scores with intervals: (score,
        # label, its values, their intervals, the misclassification path in both)
        scored = [(s, label, run, boot, ("id", "misclassification"))
                  for s, label in PAPER_SCORES]
        post = node_at(run, ("posthoc",)) if name not in ctx.calibrated_rows else None
        if post is not None and isinstance(post.get("bootstrap"), Mapping):
            scored += [(s, s, post, post["bootstrap"], ("misclassification",))
                       for s in post["scores"]]
        for s, label, values, bounds, conf in scored:
            if node_at(values, conf + (s,)) is not None:
                rows.append([esc(name), "Conf.", esc(label)] + [
                    cell(node_at(values, conf + (s, k)), node_at(bounds, conf + (s, k)), 100)
                    if k else dash for k in ("aupr", None, "auroc", None)])
        for o in ctx.ood_names:
            for s, label, values, bounds, _ in scored:
                path = ("ood", o, "detection", s)
                if node_at(values, path) is not None:
                    rows.append([esc(name), ctx.set_label(o), esc(label)] + [
                        cell(node_at(values, path + (k,)), node_at(bounds, ("ood", o, s, k)),
                             100) for k in ("aupr_in", "aupr_out", "auroc", "fpr95")])
    settings = {(r["bootstrap"]["settings"]["samples"],
                 r["bootstrap"]["settings"]["confidence"],
                 r["bootstrap"]["settings"].get("method", "percentile"))
                for r in single.values()}
    level = "; ".join(f"{c:.0%} over {b:,} replicates, {m} method"
                      for b, c, m in sorted(settings))
    note = (f"Bootstrap intervals of each single run ({level}): the test "
            f"examples and, independently, each OOD set's examples drawn with replacement; "
            f"value [low, high]")
    return [ctx.comment + note + ". Acc in %, NLL, Brier and the ECEs (15 equal-width "
            "bins; ECE-over + ECE-under = ECE; Classwise-ECE: every class's probability) "
            "as fractions; a dash where the results hold no interval (written before "
            "them).",
            render([ctx.esc(h) for h in ["Method"] + [label for _, label, _ in id_keys]],
                   id_rows, ctx.latex),
            ctx.comment + note + "; in %. Scores by name (energy, ...): the post-hoc "
            "OOD scores, on the same draws as MP and UM. Conf.: correct positive; AUPR-in "
            "/ AUROC: in-distribution positive; AUPR-out: OOD positive; FPR95 lower is "
            "better.",
            render([ctx.esc(h) for h in ["Method", "Set", "Score", "AUPR-in", "AUPR-out",
                                          "AUROC", "FPR95"]], rows, ctx.latex)]
