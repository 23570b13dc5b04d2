"""The main table (the paper's layout: Acc, Conf.MP, then MP and UM per OOD set) and what each
row ran."""

from __future__ import annotations

from gedl_jax.evaluation.tables.context import Context, PAPER_SCORES, render, stat_at

__all__ = ["main_table", "method_descriptions"]


def main_table(ctx: Context) -> list[str]:
    """Method | Acc | Conf.MP | <set> MP | <set> UM | ... (the paper's layout)."""
    if ctx.latex:   # the set names go into the multicolumn group row, as in the paper
        header = ["Method", "Acc", "Conf.MP"] + [label for _ in ctx.ood_names
                                                 for _, label in PAPER_SCORES]
    else:            # markdown has no multi-row header: name the sets in the column titles
        header = ["Method", f"Acc ({ctx.id_name})", "Conf.MP"] + [
            f"{ctx.id_name}→{ctx.labels.get(o, o)} {label}" for o in ctx.ood_names
            for _, label in PAPER_SCORES]
    rows = []
    for name, agg in ctx.aggregates.items():
        pct = ctx.pct(name)
        cells = [pct(stat_at(agg, ("id", "accuracy"))),
                 pct(stat_at(agg, ("id", "misclassification", "mp", "aupr")))]
        cells += [pct(stat_at(agg, ("ood", o, "detection", s, "aupr_in")))
                  for o in ctx.ood_names for s, _ in PAPER_SCORES]
        rows.append([ctx.esc(name)] + cells)
    arrow = r"$\rightarrow$" if ctx.latex else "→"
    group_titles = [(f"{ctx.esc(ctx.id_name)} ID classification" if ctx.datasets_known
                     else "ID classification", 2)] + [
        (f"{ctx.esc(ctx.id_name)}{arrow}{ctx.set_label(o)}", 2) for o in ctx.ood_names]
    return [ctx.comment + f"Main table, mean ± sample std (ddof=1) over {ctx.seeds}; all "
            "values in %. Acc = top-1 accuracy. Conf.MP = misclassification detection "
            "(correct predictions positive). OOD columns: in-distribution positive. AUPR = "
            "average precision (step-wise, = sklearn average_precision_score). Scores higher "
            "= more confident: MP = max_k p_k (alpha_k/S for a Dirichlet); UM = the method's "
            "precision score" + ctx.um_note + "." + ctx.calibrated_note
            + ctx.labels_note,
            render(header, rows, ctx.latex, group_titles if ctx.latex else None)]


def method_descriptions(ctx: Context) -> list[str]:
    """What each row ran, as its results record it (`Method.describe()`: the reading,
    protocol or source, and a Prior Network's OOD training data); nothing for results
    written before they recorded it."""
    described = {name: list(dict.fromkeys(str(r["method"]) for r in runs if r.get("method")))
                 for name, runs in ctx.groups.items() if name not in ctx.calibrated_rows}
    if not any(described.values()):
        return []
    lines = [f"{ctx.comment}Rows: what each method ran (as its runs' results record it)."]
    for name, texts in described.items():
        if texts:
            lines.append(f"{'% ' if ctx.latex else '- '}{ctx.esc(name)}: "
                         f"{ctx.esc('; '.join(texts))}")
    return ["\n".join(lines)]
