"""Selective prediction on the test set, and with each OOD set in the pool (SCOD)."""

from __future__ import annotations

from gedl_jax.evaluation.tables.context import Context, node_at, render, stat_at

__all__ = ["selective", "scod"]


def selective(ctx: Context) -> list[str]:
    """Selective prediction of MP and UM on the test set (every score is in the JSON)."""
    if not ctx.has("id", "selective"):
        return []
    keys = [("aurc", "AURC"), ("e_aurc", "E-AURC"), ("augrc", "AUGRC"),
            ("risk_at_coverage_0.8", "Risk@80%"), ("risk_at_coverage_0.9", "Risk@90%"),
            ("risk_at_coverage_0.95", "Risk@95%"), ("coverage_at_risk_0.01", "Cov@1%"),
            ("coverage_at_risk_0.05", "Cov@5%")]
    rows = []
    for name, agg in ctx.aggregates.items():
        pct = ctx.pct(name)
        for s, label in ctx.score_labels(agg, ("id", "selective")):
            rows.append([ctx.esc(name), label] + [
                pct(stat_at(agg, ("id", "selective", s, k))) for k, _ in keys])
    return [ctx.comment + f"Selective prediction on the {ctx.id_name} test set (abstain "
            f"on the least confident), mean ± sample std (ddof=1) over {ctx.seeds}; in %, "
            "lower is better except Cov. Risk = error rate among the accepted; ties "
            "accepted together; AURC / AUGRC = mean selective / generalized risk at "
            "coverages 1/N..N/N; E-AURC = AURC - oracle AURC; Risk@c: first point with "
            "coverage >= c; Cov@r: largest coverage with risk <= r.",
            render([ctx.esc(h) for h in ["Method", "Score"] + [h for _, h in keys]], rows,
                   ctx.latex)]


def scod(ctx: Context) -> list[str]:
    """Selective prediction with each OOD set in the pool (SCOD), MP and UM."""
    if not any(node_at(agg, ("ood", o, "scod")) is not None
               for agg in ctx.aggregates.values() for o in ctx.ood_names):
        return []
    keys = [("aurc", "AURC"), ("e_aurc", "E-AURC"), ("risk_at_coverage_0.25", "Risk@25%"),
            ("risk_at_coverage_0.5", "Risk@50%"), ("coverage_at_risk_0.05", "Cov@5%")]
    rows = []
    for name, agg in ctx.aggregates.items():
        pct = ctx.pct(name)
        for o in ctx.ood_names:
            for s, label in ctx.score_labels(agg, ("ood", o, "scod")):
                rows.append([ctx.esc(name), ctx.set_label(o), label] + [
                    pct(stat_at(agg, ("ood", o, "scod", s, k))) for k, _ in keys])
    if not rows:
        return []
    return [ctx.comment + f"Selective prediction with OOD inputs in the pool (SCOD): the "
            f"{ctx.id_name} test set plus one OOD set, ranked by the score; an accepted "
            f"OOD input counts as an error. Mean ± sample std (ddof=1) over {ctx.seeds}; "
            "in %, lower is better except Cov; definitions as in the selective table.",
            render([ctx.esc(h) for h in ["Method", "OOD set", "Score"]
                    + [h for _, h in keys]], rows, ctx.latex)]
