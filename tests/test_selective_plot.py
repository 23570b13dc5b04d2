"""The risk-coverage figure is written as a PNG, for selective and generalized risk."""

import numpy as np
import pytest

from gedl_jax.evaluation import selective_plot


@pytest.mark.parametrize("generalized", [False, True])
def test_risk_coverage_plot_writes_png(tmp_path, generalized):
    rng = np.random.default_rng(0)
    correct = rng.random(200) < 0.8
    scores = {"mp": correct + rng.normal(size=200), "um": np.round(rng.normal(size=200), 1)}
    path = selective_plot.risk_coverage_plot(correct, scores, tmp_path / "sub" / "rc.png",
                                             generalized=generalized, title="test")
    assert path == tmp_path / "sub" / "rc.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_risk_coverage_plot_rejects_empty_and_nan(tmp_path):
    with pytest.raises(ValueError, match="empty"):
        selective_plot.risk_coverage_plot([True], {}, tmp_path / "x.png")
    with pytest.raises(ValueError, match="NaN"):
        selective_plot.risk_coverage_plot([True], {"mp": [np.nan]}, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()
