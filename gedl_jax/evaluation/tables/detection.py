"""OOD and misclassification detection beyond the main table: every metric per set and score, the
post-hoc OOD scores, near / far means, OpenOOD's trapezoidal AUPR."""

from __future__ import annotations

from gedl_jax.evaluation.ood_aupr import AUPR_TRAPEZOIDAL_HEADER
from gedl_jax.evaluation.tables.context import Context, PAPER_SCORES, node_at, render, stat_at

__all__ = ["detection_details", "posthoc_scores", "ood_groups", "trapezoidal_aupr"]


def detection_details(ctx: Context) -> list[str]:
    """Misclassification (Conf.) and every OOD set's detection by MP and UM: AUPR-in,
    AUPR-out, AUROC, FPR95."""
    header = ["Method", "Set", "Score", "AUPR-in", "AUPR-out", "AUROC", "FPR95"]
    rows = []
    dash = ctx.dash
    for name, agg in ctx.aggregates.items():
        pct, esc = ctx.pct(name), ctx.esc
        for s, label in PAPER_SCORES:
            conf = ("id", "misclassification", s)
            rows.append([esc(name), "Conf.", label, pct(stat_at(agg, conf + ("aupr",))), dash,
                         pct(stat_at(agg, conf + ("auroc",))), dash])
        for o in ctx.ood_names:
            for s, label in PAPER_SCORES:
                rows.append([esc(name), ctx.set_label(o), label] + [
                    pct(stat_at(agg, ("ood", o, "detection", s, k)))
                    for k in ("aupr_in", "aupr_out", "auroc", "fpr95")])
    return [ctx.comment + f"Detection details, mean ± sample std (ddof=1) over "
            f"{ctx.seeds}; in %. Conf.: correct positive (AUPR-in column = AUPR). AUPR-in / "
            "AUROC: in-distribution positive; AUPR-out: OOD positive with the negated score; "
            "FPR95: fraction of OOD accepted at the first threshold keeping >= 95% of ID "
            "(lower is better).", render(header, rows, ctx.latex)]


def posthoc_scores(ctx: Context) -> list[str]:
    """The post-hoc OOD scores (results' "posthoc"): AUPR (in-distribution positive) and
    AUROC per OOD set, beside the method's own MP and UM rows of the main table."""
    names = [n for n in ctx.aggregates if node_at(ctx.aggregates[n], ("posthoc",))]
    if not names:
        return []
    header = ["Method", "Score"] + [f"{ctx.set_label(o)} {what}" for o in ctx.ood_names
                                    for what in ("AUPR", "AUROC")]
    rows = []
    for name in names:
        agg, runs = ctx.aggregates[name], ctx.groups[name]
        pct = ctx.pct(name)
        own = [(s, label, ("ood",)) for s, label in PAPER_SCORES]
        scores = next((r["posthoc"]["scores"] for r in runs if "posthoc" in r), [])
        extra = [(s, s, ("posthoc", "ood")) for s in scores]
        for s, label, root in own + extra:
            cells = [pct(stat_at(agg, (*root, o, "detection", s, k)))
                     for o in ctx.ood_names for k in ("aupr_in", "auroc")]
            if any(c not in ("–", "--") for c in cells):
                rows.append([ctx.esc(name), ctx.esc(label)] + cells)
    return [ctx.comment + f"Post-hoc OOD scores of the network's logits and features "
            "(evaluation.posthoc: msp, max_logit, energy at T = 1, neg_entropy; "
            "neg_mahalanobis, neg_knn_distance (k = 50) and vim fitted on the training "
            "split) beside the method's own MP and UM, in-distribution positive; mean ± "
            f"sample std (ddof=1) over {ctx.seeds}; in %.",
            render(header, rows, ctx.latex)]


def ood_groups(ctx: Context) -> list[str]:
    """Near / far OOD: unweighted means over each group's sets (OpenOOD protocol)."""
    groups = [g for g in ("near", "far") if ctx.has("ood_groups", g)]
    if not groups:
        return []
    keys = (("aupr_in", "AUPR-in"), ("auroc", "AUROC"), ("fpr95", "FPR95"))
    header = ["Method", "Score"] + [f"{g.capitalize()} {h}" for g in groups for _, h in keys]
    rows = []
    for name, agg in ctx.aggregates.items():
        pct = ctx.pct(name)
        for s, label in PAPER_SCORES:
            cells = [pct(stat_at(agg, ("ood_groups", g, "detection", s, k)))
                     for g in groups for k, _ in keys]
            if any(c not in ("–", "--") for c in cells):
                rows.append([ctx.esc(name), label] + cells)
    members = {g: list(dict.fromkeys(n for runs in ctx.groups.values() for r in runs
                                     for n in ((r.get("ood_groups") or {}).get(g) or {})
                                     .get("sets", [])))
               for g in groups}
    sets = "; ".join(f"{g}: {', '.join(ctx.labels.get(n, n) for n in members[g])}"
                     for g in groups)
    return [ctx.comment + f"Near / far OOD (OpenOOD protocol), unweighted mean over the "
            f"sets of each group ({ctx.esc(sets)}), mean ± sample std (ddof=1) over "
            f"{ctx.seeds}; in %. In-distribution positive; FPR95 lower is better.",
            render(header, rows, ctx.latex)]


def trapezoidal_aupr(ctx: Context) -> list[str]:
    """OpenOOD's trapezoidal AUPR, only where the results hold it (aupr_trapezoidal=True)."""
    present = any(stat_at(agg, ("ood", o, "detection", s, "aupr_in_trapezoidal")) is not None
                  for agg in ctx.aggregates.values() for o in ctx.ood_names
                  for s, _ in PAPER_SCORES)
    if not present:
        return []
    header = ["Method", "Set", "Score", f"AUPR-in, {AUPR_TRAPEZOIDAL_HEADER}",
              f"AUPR-out, {AUPR_TRAPEZOIDAL_HEADER}"]
    header = [ctx.esc(h) for h in header]
    rows = []
    for name, agg in ctx.aggregates.items():
        pct = ctx.pct(name)
        for o in ctx.ood_names:
            for s, label in PAPER_SCORES:
                cells = [pct(stat_at(agg, ("ood", o, "detection", s, k)))
                         for k in ("aupr_in_trapezoidal", "aupr_out_trapezoidal")]
                rows.append([ctx.esc(name), ctx.set_label(o), label] + cells)
    return [ctx.comment + f"{AUPR_TRAPEZOIDAL_HEADER}: sklearn.metrics.auc(recall, "
            "precision) through precision_recall_curve's points, as OpenOOD v1.5 computes "
            "it (the other tables' AUPR is average precision); mean ± sample std (ddof=1) "
            f"over {ctx.seeds}; in %.", render(header, rows, ctx.latex)]
