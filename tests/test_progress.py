"""The progress line's rate and ETA (`progress.MetricsBuffer`) on a clock the test sets: the first
interval starts when the first call has been dispatched (so after its compilation), later ETAs
use the mean rate since the first fetch, not the last interval's."""

import numpy as np
import pytest

from gedl_jax.run import progress


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = _Clock()
    monkeypatch.setattr(progress.time, "time", c)
    return c


def _metrics(num_steps):
    return {"loss": np.full(num_steps, 0.5, np.float32), "nonfinite": np.zeros(num_steps, bool)}


def test_the_first_rate_and_eta_leave_out_the_compile_and_later_etas_use_the_mean_rate(clock):
    written = []
    buffer = progress.MetricsBuffer([0], lambda i, step, m: written.append((i, step, m)),
                                    on_nonfinite=lambda: None, where="w", steps_per_epoch=100)
    images, total = 128, 1000
    clock.now = 30.0                       # the first call compiled for 30 s, then was dispatched
    buffer.add(100, _metrics(100), num_steps=100)
    clock.now = 31.0                       # its 100 steps ran in 1 s
    assert buffer.flush() == {"loss": 0.5}
    rate, eta = buffer.rate_and_eta(images, total - 100)
    assert rate == pytest.approx(100 * images / 1.0)   # not 100 * 128 / 31
    assert eta == "0:00:09"                # 900 steps at 10 ms

    buffer.add(300, _metrics(200), num_steps=200)
    clock.now = 33.0
    buffer.flush()
    assert buffer.rate_and_eta(images, total - 300) == (pytest.approx(200 * images / 2.0),
                                                        "0:00:07")
    buffer.add(400, _metrics(100), num_steps=100)
    clock.now = 43.0                       # an epoch end: 100 steps in 10 s
    buffer.flush()
    rate, eta = buffer.rate_and_eta(images, total - 400)
    assert rate == pytest.approx(100 * images / 10.0)
    assert eta == "0:00:24"                # 600 steps at the mean (43 - 31) / (400 - 100) s
    assert [step for _, step, _ in written] == [100, 300, 400]


def test_a_later_call_does_not_restart_the_first_interval(clock):
    buffer = progress.MetricsBuffer([0, 1], lambda *a: None, on_nonfinite=lambda: None,
                                    where="w", steps_per_epoch=10)
    clock.now = 5.0
    buffer.add(1, {"loss": np.zeros(2), "nonfinite": np.zeros(2, bool)})   # one step, 2 seeds
    clock.now = 6.0
    buffer.add(2, {"loss": np.zeros(2), "nonfinite": np.zeros(2, bool)})
    clock.now = 7.0
    buffer.flush()
    rate, _ = buffer.rate_and_eta(10, 8)
    assert rate == pytest.approx(2 * 10 / 2.0)   # from the first add (t=5), not the second
