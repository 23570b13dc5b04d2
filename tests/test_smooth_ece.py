"""SmoothECE (gedl_jax.evaluation.smooth_ece) against the definition evaluated directly (the
reflected Gaussian kernel summed over its images, on a fine mesh) and against the authors'
``relplot`` package on generated data; hand-made cases with known answers; the diagram data."""

import doctest

import numpy as np
import pytest
import relplot  # the authors' package: the oracle, in the dev extra (pyproject.toml)
from scipy import special

from gedl_jax.evaluation import smooth_ece as se

# relplot discretises differently (module docstring); on data away from the ends of [0, 1]
# the two agree to this absolute tolerance (observed: <= 3.5e-4 on these datasets).
RELPLOT_ATOL = 1e-3


def test_docstring_examples_run():
    result = doctest.testmod(se, extraglobs={"np": np}, report=True)
    assert result.attempted > 0 and result.failed == 0


def reflected_kernel(t, f, sigma):
    """K(t_j, f_i) (M, N): the reflected Gaussian, its images summed directly (no grid)."""
    t = np.asarray(t)[:, None]
    kernel = sum(np.exp(-0.5 * ((t - f - 2 * m) / sigma) ** 2)
                 + np.exp(-0.5 * ((t + f - 2 * m) / sigma) ** 2) for m in range(-2, 3))
    return kernel / (np.sqrt(2 * np.pi) * sigma)


def definition(f, y, sigma, mesh=8001):
    """int_0^1 |1/N sum_i K(t, f_i)(f_i - y_i)| dt on a trapezoidal mesh of t."""
    h = reflected_kernel(np.linspace(0.0, 1.0, mesh), f, sigma) @ (f - y) / f.size
    return np.trapezoid(np.abs(h), dx=1.0 / (mesh - 1))


def dataset(rng, n, kind):
    f = rng.beta(5, 2, size=n)
    true_p = {"calibrated": f, "overconfident": f ** 2, "underconfident": np.sqrt(f),
              "shifted": np.clip(f - 0.2, 0, 1),
              "crossing": np.clip(0.5 + 1.6 * (f - 0.7), 0, 1)}[kind]
    return f, (rng.random(n) < true_p).astype(float)


KINDS = ["calibrated", "overconfident", "underconfident", "shifted", "crossing"]


@pytest.mark.parametrize("sigma", [0.02, 0.05, 0.2])
def test_smece_at_a_bandwidth_is_the_definition(sigma):
    rng = np.random.default_rng(0)
    for kind in KINDS:
        f, y = dataset(rng, 300, kind)
        f[:3] = [0.0, 1.0, 1.0]          # points at the ends: their images coincide
        assert se.smooth_ece_at(f, y, sigma) == pytest.approx(definition(f, y, sigma),
                                                              abs=2e-5)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [400, 3000])
def test_smooth_ece_agrees_with_relplot(kind, n):
    f, y = dataset(np.random.default_rng(n), n, kind)
    ours = se.smooth_ece(f, y)
    reference, reference_sigma = relplot.smECE(f, y, return_width=True)
    assert ours.smooth_ece == pytest.approx(reference, abs=RELPLOT_ATOL)
    # relplot's sigma* is the upper end of a bisection bracket of width 1/1024.
    assert abs(ours.sigma - reference_sigma) <= 1 / 1024 + RELPLOT_ATOL
    assert ours.smooth_ece == pytest.approx(ours.sigma, abs=1e-8)   # the fixed point
    assert se.smooth_ece_at(f, y, 0.05) == pytest.approx(relplot.smECE_sigma(f, y, 0.05),
                                                         abs=RELPLOT_ATOL)


def test_top_label_pairs_agree_with_relplot():
    rng = np.random.default_rng(3)
    logits = rng.normal(scale=3.0, size=(500, 6))
    labels = rng.integers(0, 6, size=500)
    f, y = se.top_label_confidences(special.softmax(logits, axis=1), labels)
    ref_f, ref_y = relplot.multiclass_logits_to_confidences(logits, labels)
    np.testing.assert_allclose(f, ref_f, rtol=1e-12)
    np.testing.assert_array_equal(y, ref_y)


def test_hand_made_cases():
    # Perfectly calibrated on every confidence level: smECE at the 1e-3 floor, ~0.
    f = np.repeat([0.2, 0.5, 0.9], 1000)
    y = np.r_[np.ones(200), np.zeros(800), np.ones(500), np.zeros(500), np.ones(900),
              np.zeros(100)]
    result = se.smooth_ece(f, y)
    assert result.sigma == se.SIGMA_MIN and result.smooth_ece < 1e-12
    # Always wrong at confidence 1: the residual is 1 everywhere, smECE_sigma = 1 for every
    # sigma, so the fixed point is sigma* = 1.
    result = se.smooth_ece(np.ones(50), np.zeros(50))
    assert result.sigma == 1.0 and result.smooth_ece == pytest.approx(1.0, abs=1e-12)
    # A residual of one sign everywhere: |h| = h, so smECE_sigma = mean(f - y) at any sigma
    # (here 0.1: outcomes as frequencies 0.1 below the confidence).
    f = np.linspace(0.3, 0.9, 200)
    for sigma in (0.01, 0.3):
        assert se.smooth_ece_at(f, f - 0.1, sigma) == pytest.approx(0.1, abs=1e-12)


def test_the_diagram_data():
    rng = np.random.default_rng(4)
    f, y = dataset(rng, 5000, "overconfident")
    result = se.smooth_ece(f, y)
    assert np.trapezoid(result.density_M, result.t_M) == pytest.approx(1.0, abs=1e-12)
    # The curve and the density are the kernel regression and density of the definition.
    t = np.linspace(0.0, 1.0, 21)
    kernel = reflected_kernel(t, f, result.sigma)
    np.testing.assert_allclose(np.interp(t, result.t_M, result.mean_outcome_M),
                               kernel @ y / kernel.sum(axis=1), atol=1e-5)
    np.testing.assert_allclose(np.interp(t, result.t_M, result.density_M),
                               kernel.mean(axis=1), rtol=1e-4)
    # Overconfident data (accuracy f^2): the curve lies below the diagonal where data are.
    dense = (result.t_M > 0.5) & (result.t_M < 0.9)
    assert np.all(result.mean_outcome_M[dense] < result.t_M[dense])
    as_dict = result.to_dict(num_points=11)
    assert len(as_dict["t"]) == len(as_dict["mean_outcome"]) == len(as_dict["density"]) == 11
    assert as_dict["smooth_ece"] == result.smooth_ece


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="confidence_N must lie"):
        se.smooth_ece(np.array([0.5, 1.5]), np.array([1, 0]))
    with pytest.raises(ValueError, match="outcome_N"):
        se.smooth_ece(np.array([0.5, 0.5]), np.array([2, 0]))
    with pytest.raises(ValueError, match="equal shape"):
        se.smooth_ece(np.array([0.5, 0.5]), np.array([1]))
    with pytest.raises(ValueError, match="has no examples"):
        se.smooth_ece(np.array([]), np.array([]))
    with pytest.raises(ValueError, match="sigma"):
        se.smooth_ece_at(np.array([0.5]), np.array([1]), 0.0)
    with pytest.raises(ValueError, match="integer class"):
        se.top_label_confidences(np.array([[0.5, 0.5]]), np.array([0.0]))
