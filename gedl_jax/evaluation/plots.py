"""PNG figures of the evaluation: reliability diagram, ID-vs-OOD score histograms, and the paper's
distributional-uncertainty study (Fig. uncertainty: top row against log S, bottom row against
corruption severity next to an ensemble's epistemic uncertainty).

Each function draws on its own ``matplotlib.figure.Figure`` with the Agg canvas (no pyplot, no
global backend switch, safe in threads and notebooks), writes a PNG to ``path`` (parent folders
are created) and returns the path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from scipy import stats

from gedl_jax import files
from gedl_jax.evaluation import checks
from gedl_jax.evaluation import report as report_lib
from gedl_jax.evaluation import scores as scores_lib
from gedl_jax.evaluation.core import ensemble_epistemic_uncertainty
from gedl_jax.evaluation.metrics import CalibrationResult

__all__ = ["reliability_diagram", "smooth_reliability_diagram", "score_histograms",
           "distributional_uncertainty_study", "uncertainty_against_strength", "method_comparison",
           "corruption_severity_study", "ensemble_epistemic_uncertainty"]

_MEASURE_LABELS = {"u": "u = W/S", "mutual_information": "mutual information",
                   "variance_sum": r"$\sum_k$ Var[$\pi_k$]"}
_MEASURE_COLORS = {"u": "tab:red", "mutual_information": "tab:green",
                   "variance_sum": "tab:purple"}


def _new_figure(width: float, height: float, ncols: int = 1, nrows: int = 1, **kwargs):
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(nrows, ncols, squeeze=False, **kwargs)
    return fig, axes


def _save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    files.write_with(path, lambda f: fig.savefig(f, dpi=120, format="png"))
    return path


def _minmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    lo, hi = np.min(x), np.max(x)
    return np.zeros_like(x) if hi <= lo else (x - lo) / (hi - lo)


def reliability_diagram(calibration_result: CalibrationResult, path: str | Path,
                        title: str | None = None) -> Path:
    """Accuracy vs confidence per bin (top) and the bin counts (bottom) of a ``CalibrationResult``.

    Equal-width bins are drawn as bars over (lower, upper] with the gap to the mean confidence
    shaded; adaptive bins as points at (mean confidence, accuracy). The diagonal is perfect
    calibration.
    """
    r = calibration_result
    fig, axes = _new_figure(5, 6, nrows=2, sharex=True, height_ratios=[3, 1])
    ax, ax_count = axes[0, 0], axes[1, 0]
    full = r.bin_count > 0
    if r.binning == "equal_width":
        width = r.bin_upper - r.bin_lower
        ax.bar(r.bin_lower[full], r.bin_accuracy[full], width=width[full], align="edge",
               color="tab:blue", edgecolor="black", label="accuracy")
        ax.bar(r.bin_lower[full], (r.bin_confidence - r.bin_accuracy)[full], width=width[full],
               bottom=r.bin_accuracy[full], align="edge", color="tab:red", alpha=0.3,
               hatch="//", edgecolor="tab:red", label="gap to mean confidence")
        ax_count.bar(r.bin_lower, r.bin_count, width=width, align="edge", color="gray",
                     edgecolor="black")
    else:
        ax.plot(r.bin_confidence[full], r.bin_accuracy[full], "o-", color="tab:blue",
                label="accuracy (equal-mass bins)")
        ax_count.bar(r.bin_confidence[full], r.bin_count[full], width=0.01, color="gray")
    ax.plot([0, 1], [0, 1], "k--", lw=1, label="perfect calibration")
    ax.set(xlim=(0, 1), ylim=(0, 1), ylabel="accuracy",
           title=title or f"Reliability ({r.binning}, {r.bin_count.size} bins): "
                          f"ECE = {100 * r.ece:.2f}%\n(overconfident bins "
                          f"{100 * r.overconfidence:.2f}%, underconfident "
                          f"{100 * r.underconfidence:.2f}%)")
    ax.legend(loc="upper left", fontsize=8)
    ax_count.set(xlabel="confidence (max projected probability)", ylabel="count")
    if r.bin_count.max() > 0:
        ax_count.set_yscale("symlog")
    return _save(fig, path)


def smooth_reliability_diagram(result: Any, path: str | Path, title: str | None = None) -> Path:
    """SmoothECE's reliability diagram (`smooth_ece.SmoothEceResult`): the kernel-smoothed
    accuracy against the confidence (top; no bins) and the confidences' kernel density (bottom).
    The diagonal is perfect calibration."""
    fig, axes = _new_figure(5, 6, nrows=2, sharex=True, height_ratios=[3, 1])
    ax, ax_density = axes[0, 0], axes[1, 0]
    ax.plot(result.t_M, result.mean_outcome_M, color="tab:blue", lw=2,
            label="smoothed accuracy")
    ax.plot([0, 1], [0, 1], "k--", lw=1, label="perfect calibration")
    ax.set(xlim=(0, 1), ylim=(0, 1), ylabel="accuracy",
           title=title or f"SmoothECE = {100 * result.smooth_ece:.2f}%, "
                          f"bandwidth {result.sigma:.3f}")
    ax.legend(loc="upper left", fontsize=8)
    ax_density.fill_between(result.t_M, result.density_M, color="gray", alpha=0.5)
    ax_density.set(xlabel="confidence (max projected probability)", ylabel="density")
    return _save(fig, path)


def score_histograms(id_scores: Any, ood_scores: Mapping[str, Any], path: str | Path,
                     score_name: str, bins: int = 50, id_name: str = "ID") -> Path:
    """Density histograms of one confidence score on the ID set and each OOD set, shared bins."""
    sets = {id_name: np.asarray(id_scores, dtype=np.float64)}
    sets.update({k: np.asarray(v, dtype=np.float64) for k, v in ood_scores.items()})
    finite = np.concatenate([v[np.isfinite(v)] for v in sets.values()])
    if finite.size == 0:
        raise ValueError("No finite scores to plot.")
    edges = np.histogram_bin_edges(finite, bins=bins)
    fig, axes = _new_figure(6, 4)
    ax = axes[0, 0]
    for i, (name, values) in enumerate(sets.items()):
        ax.hist(values[np.isfinite(values)], bins=edges, density=True, histtype="step" if i else
                "stepfilled", alpha=1.0 if i else 0.35, lw=1.5, label=f"{name} (n={values.size})")
    ax.set(xlabel=f"{score_name} (higher = more in-distribution)", ylabel="density",
           title=f"{score_name}: {id_name} vs OOD")
    ax.legend(fontsize=8)
    return _save(fig, path)


def _spearman(x_N: np.ndarray, y_N: np.ndarray) -> float:
    """Spearman's rho, nan where it is undefined: fewer than 2 examples, or a constant input
    (a run collapsed to the prior has S = K everywhere). SciPy returns nan there too, but warns
    with a traceback-like line in the middle of an evaluation's output."""
    if x_N.size < 2 or np.ptp(x_N) == 0 or np.ptp(y_N) == 0:
        return float("nan")
    return float(stats.spearmanr(x_N, y_N).statistic)


def distributional_uncertainty_study(alpha_NxK: Any, prior_strength_N: Any, path: str | Path,
                                     mask_N: Any = None, max_points: int = 4000, seed: int = 0,
                                     title: str | None = None) -> Path:
    """The paper's Fig. uncertainty, top row: u = W/S, mutual information and variance sum
    against log S on one test set.

    Left, rank view: each measure's normalised rank against the normalised rank of log S (a
    measure that decreases monotonically in S lies on the anti-diagonal). Right, value view: each
    measure min-max normalised to [0, 1] against log S. The legend gives Spearman's rho with
    log S over all examples; at most ``max_points`` random examples are drawn.
    """
    alpha_NxK, prior_strength_N = np.asarray(alpha_NxK), np.asarray(prior_strength_N)
    if mask_N is not None:
        mask_N = np.asarray(mask_N, dtype=bool)
        alpha_NxK = alpha_NxK[mask_N]
        prior_strength_N = (prior_strength_N[mask_N] if prior_strength_N.ndim
                            else prior_strength_N)
    names = ("u", "mutual_information", "variance_sum")
    m = scores_lib.uncertainty_measures(alpha_NxK, prior_strength_N,
                                        names=names + ("log_strength",))
    n = m["log_strength"].size
    rng = np.random.default_rng(seed)
    shown = rng.choice(n, size=min(n, max_points), replace=False)
    log_s = m["log_strength"]
    fig, axes = _new_figure(10, 4.2, ncols=2)
    ax_rank, ax_value = axes[0, 0], axes[0, 1]
    rank_s = stats.rankdata(log_s) / n
    for name in names:
        rho = _spearman(m[name], log_s)
        label = f"{_MEASURE_LABELS[name]} (rho={rho:+.3f})"
        kw = dict(s=4, alpha=0.5, color=_MEASURE_COLORS[name], label=label, rasterized=True,
                  zorder=3 if name == "u" else 2)   # u on top: it is the thinnest curve
        ax_rank.scatter(rank_s[shown], (stats.rankdata(m[name]) / n)[shown], **kw)
        ax_value.scatter(log_s[shown], _minmax(m[name])[shown], **kw)
    ax_rank.set(xlabel="rank of log S (normalised)", ylabel="rank of measure (normalised)",
                title="rank view")
    ax_value.set(xlabel="log S", ylabel="measure (min-max normalised)", title="value view")
    for ax in (ax_rank, ax_value):
        ax.legend(fontsize=8, markerscale=3)
    fig.suptitle(title or f"Distributional uncertainty vs log S (N={n})")
    return _save(fig, path)


def uncertainty_against_strength(alpha_NxK: Any, prior_strength_N: Any, path: str | Path,
                                 max_points: int = 4000, seed: int = 0,
                                 title: str | None = None) -> Path:
    """u = W/S, mutual information and variance sum against S on log-log axes, with the
    asymptote (K - 1)/(2S) of the mutual information (Eq. dist_MI; Appendix proposition u).

    All three measures fall like 1/S for large S (slope -1 here); the mutual information meets
    its asymptote as S grows. The legend gives the median ratio MI / ((K - 1)/(2S)) over the
    examples with the largest 10% of S. At most ``max_points`` random examples are drawn.
    """
    from gedl_jax import evidential

    alpha_NxK, prior_strength_N = checks.dirichlet(alpha_NxK, prior_strength_N)
    names = ("u", "mutual_information", "variance_sum")
    m = scores_lib.uncertainty_measures(alpha_NxK, prior_strength_N,
                                        names=names + ("strength",))
    strength = np.asarray(m["strength"], np.float64)
    asymptote = np.asarray(evidential.mutual_information_asymptote(
        np.asarray(alpha_NxK, np.float64)), np.float64)
    n = strength.size
    top = strength >= np.quantile(strength, 0.9)
    ratio = float(np.median(np.asarray(m["mutual_information"], np.float64)[top] / asymptote[top]))
    shown = np.random.default_rng(seed).choice(n, size=min(n, max_points), replace=False)
    fig, axes = _new_figure(6, 4.5)
    ax = axes[0, 0]
    for name in names:
        ax.scatter(strength[shown], np.asarray(m[name], np.float64)[shown], s=4, alpha=0.5,
                   color=_MEASURE_COLORS[name], label=_MEASURE_LABELS[name], rasterized=True)
    order = np.argsort(strength)
    k = np.shape(alpha_NxK)[-1]
    ax.plot(strength[order], asymptote[order], "k--", lw=1.5,
            label=f"(K-1)/(2S), K={k}; MI/asymptote at top 10% S: {ratio:.3f}")
    ax.set(xscale="log", yscale="log", xlabel="S (Dirichlet strength)",
           ylabel="uncertainty measure", title=title or f"Uncertainty vs S (N={n})")
    ax.legend(fontsize=8, markerscale=3)
    return _save(fig, path)


def method_comparison(results: Sequence[Mapping[str, Any]] | Mapping[str, Sequence[Mapping]],
                      path: str | Path, ood_names: Sequence[str] | None = None,
                      title: str | None = None) -> Path:
    """Grouped bars of the main table's columns (Acc, Conf.MP, <set> MP / UM AUPR, in %) per
    method, with the sample std over seeds as error bars where there are several seeds.

    ``results`` and ``ood_names`` as in ``report.results_table`` (``{method: [results of its
    seeds]}`` keeps the given order)."""
    columns, values = report_lib.main_table_values(results, ood_names)
    methods = list(values)
    fig, axes = _new_figure(max(6.0, 1.1 * len(columns) + 0.25 * len(methods) * len(columns)),
                            4.2)
    ax = axes[0, 0]
    width = 0.8 / len(methods)
    x = np.arange(len(columns))
    lows = []
    for i, name in enumerate(methods):
        means = np.array([np.nan if m is None else m for m, _ in values[name]])
        stds = np.array([0.0 if s is None else s for _, s in values[name]])
        ax.bar(x + (i - (len(methods) - 1) / 2) * width, means, width=width, label=name,
               yerr=stds if np.any(stds > 0) else None, capsize=2)
        lows.append(np.nanmin(means) if np.any(np.isfinite(means)) else 0.0)
    ax.set_xticks(x, columns, rotation=20, ha="right")
    ax.set(ylabel="%", ylim=(max(0.0, min(lows) - 5.0), 100.5),
           title=title or "Methods compared (AUPR for Conf./OOD columns)")
    ax.legend(fontsize=8, ncols=min(len(methods), 5))
    return _save(fig, path)


def corruption_severity_study(per_severity: Mapping[Any, Mapping[str, float]], path: str | Path,
                              ensemble_epistemic: Mapping[Any, float] | Sequence[float] | None
                              = None,
                              measures: Sequence[str] = ("u", "mutual_information", "variance_sum"),
                              normalize: bool = True, title: str | None = None) -> Path:
    """The paper's Fig. uncertainty, bottom row: mean uncertainty measures against corruption
    severity (0 = clean, 1..5 = CIFAR-10-C levels), with the ensemble's epistemic uncertainty as
    a dashed light-blue curve.

    Args:
      per_severity: {severity: {measure: mean value}} (e.g. ``core.severity_summary``).
      ensemble_epistemic: {severity: mean epistemic uncertainty of the seeds' ensemble} (e.g. the
        mean of ``ensemble_epistemic_uncertainty``), or a sequence aligned with the sorted
        severities; optional.
      normalize: min-max normalise each curve over the severities, so that trends of measures on
        different scales are comparable (the y label says so).
    """
    severities = sorted(per_severity)
    if not severities:
        raise ValueError("per_severity is empty.")
    fig, axes = _new_figure(5.5, 4)
    ax = axes[0, 0]
    scale = _minmax if normalize else (lambda v: np.asarray(v, dtype=np.float64))
    for name in measures:
        values = [per_severity[s][name] for s in severities]
        ax.plot(severities, scale(values), "o-", color=_MEASURE_COLORS.get(name),
                label=_MEASURE_LABELS.get(name, name))
    if ensemble_epistemic is not None:
        if isinstance(ensemble_epistemic, Mapping):
            values = [ensemble_epistemic[s] for s in severities]
        else:
            values = list(ensemble_epistemic)
            if len(values) != len(severities):
                raise ValueError(f"ensemble_epistemic has {len(values)} values for "
                                 f"{len(severities)} severities.")
        ax.plot(severities, scale(values), "--", color="lightskyblue", lw=2,
                label="ensemble epistemic (MI)")
    ax.set(xlabel="corruption severity", xticks=severities,
           ylabel="mean value (min-max normalised)" if normalize else "mean value",
           title=title or "Uncertainty vs corruption severity")
    ax.legend(fontsize=8)
    return _save(fig, path)
