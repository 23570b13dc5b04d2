"""Conformal prediction sets: coverage and mean set size of LAC, APS and RAPS."""

from __future__ import annotations

from gedl_jax.evaluation.tables.context import Context, render, stat_at

__all__ = ["conformal_sets"]


def conformal_sets(ctx: Context) -> list[str]:
    """Conformal sets: coverage and mean set size of LAC, APS and RAPS."""
    if not ctx.has("conformal", "sets"):
        return []
    methods = (("lac", "LAC"), ("aps", "APS"), ("raps", "RAPS"))
    header = ["Method", "alpha"] + [f"{m} {what}" for _, m in methods
                                    for what in ("coverage (%)", "set size")]
    rows = []
    for name, agg in ctx.aggregates.items():
        fmt = ctx.fmt(name)
        cells = [fmt(stat_at(agg, ("conformal", "alpha")), 1, 3)]
        for m, _ in methods:
            cells += [fmt(stat_at(agg, ("conformal", "sets", m, "coverage")), 100, 2),
                      fmt(stat_at(agg, ("conformal", "sets", m, "mean_set_size")), 1, 3)]
        rows.append([ctx.esc(name)] + cells)
    return [ctx.comment + f"Conformal prediction sets on the {ctx.id_name} test set, "
            f"calibrated on the validation split, mean ± sample std (ddof=1) over "
            f"{ctx.seeds}. Target coverage >= 1 - alpha; set size = mean number of labels "
            "(smaller is better at the same coverage). LAC: E = 1 - p_y; APS (randomized): "
            "cumulative mass; RAPS: APS + 0.01 (rank - 1)^+.",
            render([ctx.esc(h) for h in header], rows, ctx.latex)]
