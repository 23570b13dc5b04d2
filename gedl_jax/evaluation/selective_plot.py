"""PNG figure of risk-coverage curves (``gedl_jax.evaluation.selective``), one curve per score.

Drawn on its own ``matplotlib.figure.Figure`` with the Agg canvas (no pyplot, no global backend
switch, safe in threads and notebooks), like ``gedl_jax.evaluation.plots``; the PNG is written to
``path`` (parent folders are created) and the path is returned.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from gedl_jax.evaluation import selective

__all__ = ["risk_coverage_plot"]


def risk_coverage_plot(correct_N: Any, scores: Mapping[str, Any], path: str | Path, *,
                       generalized: bool = False, title: str | None = None,
                       oracle: bool = True) -> Path:
    """Risk-coverage curves of several confidence scores of the same predictions.

    Args:
      correct_N: (N,) bool, whether each prediction is correct.
      scores: {label: (N,) confidence score, higher = more confident}; one curve each, drawn as
        a step function through the curve's points (ties accepted together), with its AURC (or
        AUGRC) in the legend.
      path: the PNG to write.
      generalized: plot the generalized risk (errors accepted / N, AUGRC) instead of the
        selective risk (errors accepted / accepted, AURC).
      title: optional figure title.
      oracle: also draw the oracle score (all correct predictions first).

    Returns:
      ``path`` as a Path.
    """
    if not scores:
        raise ValueError("scores is empty: nothing to plot.")
    correct_N = np.asarray(correct_N)
    fig = Figure(figsize=(5.0, 4.0), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    area_name = "AUGRC" if generalized else "AURC"

    def draw(correct: np.ndarray, score: Any, label: str, **style) -> None:
        curve = selective.risk_coverage_curve(correct, score)
        risk = curve.generalized_risk if generalized else curve.selective_risk
        area = (selective.augrc if generalized else selective.aurc)(correct, score)
        # Each run of tied scores spans (c_{j-1}, c_j] at the risk of the whole run.
        ax.step(np.r_[0.0, curve.coverage] * 100, np.r_[risk[0], risk] * 100, where="pre",
                label=f"{label} ({area_name} {area * 100:.2f}%)", **style)

    for name, score_N in scores.items():
        draw(correct_N, score_N, str(name))
    if oracle:  # every correct prediction first, no ties
        num_correct = int(np.sum(correct_N.astype(bool)))
        oracle_correct = np.arange(correct_N.size) < num_correct
        draw(oracle_correct, -np.arange(correct_N.size, dtype=np.float64), "oracle",
             color="0.5", linestyle="--")
    ax.set_xlabel("coverage (%)")
    ax.set_ylabel(("generalized risk" if generalized else "selective risk") + " (%)")
    ax.set_xlim(0, 100)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    if title:
        ax.set_title(title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    from gedl_jax import files

    files.write_with(path, lambda f: fig.savefig(f, dpi=120, format="png"))
    return path
