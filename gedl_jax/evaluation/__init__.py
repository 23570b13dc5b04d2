"""Evaluation of Dirichlet outputs: confidence scores, all metrics of the paper, tables and plots.

Usable on plain arrays, without model code::

    from gedl_jax.evaluation import ModelOutputs, evaluate_outputs, results_table
    res = evaluate_outputs(ModelOutputs(alpha_NxK, W_N, labels_N),
                           {"SVHN": ModelOutputs(alpha_ood_MxK, W_ood_M)})
    print(results_table([res_seed0, res_seed1, ...]))

Modules: ``scores`` (confidence scores, higher = more confident; UM = -W/S), ``core``
(``ModelOutputs``, ``evaluate_outputs``, the stated ``CONVENTIONS``), ``report`` (markdown /
LaTeX tables of seeds' results, backs bin/report.py; ``aggregation`` the mean ± std, ``tables``
one module per table section), ``checks`` (every input check, once), ``plots`` (PNG figures;
imported on demand: ``from gedl_jax.evaluation import plots``). The metrics themselves are in
``gedl_jax.evaluation.metrics``. Beyond the paper: ``selective`` (AURC, risk-coverage),
``conformal`` (LAC / APS / RAPS sets), ``calibration`` (temperature / evidence scale, fitted on
validation data), ``ood_aupr`` (OpenOOD's trapezoidal AUPR), ``bootstrap`` (intervals of a
single run's metrics over resampled test and OOD examples), ``compare`` (two runs' paired
bootstrap, bin/compare_runs.py), ``sections`` (how the results
hold them), ``saved`` (``predictions.npz``), and ``evaluate_model`` (``any_model``: any model's
predict function, run in padded jitted batches; imported on first use).
"""

from gedl_jax.evaluation.core import (
    CALIBRATORS,
    CONVENTIONS,
    EvaluationOptions,
    ModelOutputs,
    Predictions,
    calibrated_predictions,
    dirichlet_predictions,
    ensemble_epistemic_uncertainty,
    evaluate_outputs,
    evaluate_predictions,
    rank_correlations,
    severity_summary,
    summarise_measures,
)
from gedl_jax.evaluation.report import aggregate, load_runs, main_table_values, results_table
from gedl_jax.evaluation.saved import load_posthoc_scores, load_predictions, save_predictions
from gedl_jax.evaluation.scores import (
    DIRICHLET_SCORE_NAMES,
    MEASURE_NAMES,
    SCORE_NAMES,
    categorical_scores,
    confidence_scores,
    sampled_scores,
    uncertainty_measures,
)

__all__ = [
    "CALIBRATORS", "CONVENTIONS", "DIRICHLET_SCORE_NAMES", "MEASURE_NAMES", "SCORE_NAMES",
    "EvaluationOptions", "ModelOutputs", "Predictions", "aggregate", "calibrated_predictions",
    "categorical_scores", "confidence_scores",
    "dirichlet_predictions", "ensemble_epistemic_uncertainty", "evaluate_model",
    "evaluate_outputs", "evaluate_predictions", "load_posthoc_scores", "load_predictions",
    "load_runs",
    "sampled_scores", "save_predictions",
    "main_table_values",
    "rank_correlations", "results_table", "severity_summary", "summarise_measures",
    "uncertainty_measures",
]


def __getattr__(name: str):
    """`evaluate_model` (any_model.py) is imported on first use: it reads the dataset registry
    (near / far OOD groups), which the scoring of arrays does not need."""
    if name in ("evaluate_model", "ModelEvaluation"):
        from gedl_jax.evaluation import any_model

        return getattr(any_model, name)
    raise AttributeError(f"module 'gedl_jax.evaluation' has no attribute {name!r}")
