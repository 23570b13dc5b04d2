"""The progress line's rate and ETA (`progress.MetricsBuffer`) on a clock the test sets: the first
interval starts once the first call has run (its compile and the device's warm-up are not
steps), the ETA uses the mean rate of the run so far, not the last interval's, and that mean
leaves out the one-time costs of the first epoch end (the first validation's compile)."""

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


def _warm_up(monkeypatch, clock, seconds):
    """Waiting for the first call takes `seconds` (its compile and the device's warm-up)."""
    def wait(tree):
        clock.now += seconds
        return tree
    monkeypatch.setattr(progress.jax, "block_until_ready", wait)


def _metrics(num_steps):
    return {"loss": np.full(num_steps, 0.5, np.float32), "nonfinite": np.zeros(num_steps, bool)}


def _line(buffer, clock, step, num_steps, seconds, images=128, total=950):
    buffer.add(step, _metrics(num_steps), num_steps=num_steps)
    clock.now += seconds
    buffer.flush()
    return buffer.rate_and_eta(images, total - step)


def test_the_first_line_times_the_steps_after_the_first_call(monkeypatch, clock):
    written = []
    buffer = progress.MetricsBuffer([0], lambda i, step, m: written.append((i, step, m)),
                                    on_nonfinite=lambda: None, where="w", steps_per_epoch=300)
    _warm_up(monkeypatch, clock, 3.0)   # a GPU's first call of one step: 3 s, once
    buffer.add(1, _metrics(1), num_steps=1)
    rate, eta = _line(buffer, clock, 100, 99, 0.99)
    assert rate == pytest.approx(99 * 128 / 0.99)   # not 100 * 128 / 3.99
    assert eta == "0:00:08"                          # 850 steps at 10 ms
    assert [step for _, step, _ in written] == [100]   # one record for both calls


def test_the_eta_leaves_out_the_first_epoch_ends_one_time_costs(monkeypatch, clock):
    buffer = progress.MetricsBuffer([0], lambda *a: None, on_nonfinite=lambda: None,
                                    where="w", steps_per_epoch=300)
    _warm_up(monkeypatch, clock, 3.0)
    buffer.add(1, _metrics(1), num_steps=1)
    assert _line(buffer, clock, 100, 99, 0.99)[1] == "0:00:08"   # 850 x 10 ms
    assert _line(buffer, clock, 200, 100, 1.0)[1] == "0:00:07"   # mean since step 100
    # the epoch end's interval holds the first validation's 5 s compile: the ETA keeps its
    # estimate (the mean through it would say 650 x 35 ms = 22 s)
    rate, eta = _line(buffer, clock, 300, 100, 6.0)
    assert (rate, eta) == (pytest.approx(100 * 128 / 6.0), "0:00:06")
    buffer.restart_mean()                 # the first validation is done
    buffer.restart_mean()                 # (only the first counts)
    # 2 s of the first validation's host work, then the mean runs from this fetch on
    assert _line(buffer, clock, 400, 100, 3.0)[1] == "0:00:05"   # 550 x 10 ms, kept
    assert _line(buffer, clock, 500, 100, 1.0)[1] == "0:00:04"   # 450 x 10 ms
    # later epoch ends count: 0.5 s of validation in the mean (200 steps in 2.5 s)
    assert _line(buffer, clock, 600, 100, 1.5)[1] == "0:00:04"   # 350 x 12.5 ms
    assert _line(buffer, clock, 700, 100, 1.3)[1] == "0:00:03"   # 250 x 3.8 / 300 s


def test_a_later_call_does_not_restart_the_first_interval(monkeypatch, clock):
    buffer = progress.MetricsBuffer([0, 1], lambda *a: None, on_nonfinite=lambda: None,
                                    where="w", steps_per_epoch=10)
    _warm_up(monkeypatch, clock, 0.5)
    clock.now = 5.0
    buffer.add(1, {"loss": np.zeros(2), "nonfinite": np.zeros(2, bool)})   # one step, 2 seeds
    clock.now = 6.0
    buffer.add(2, {"loss": np.zeros(2), "nonfinite": np.zeros(2, bool)})
    clock.now = 7.0
    buffer.flush()
    rate, _ = buffer.rate_and_eta(10, 8)
    assert rate == pytest.approx(1 * 10 / 1.5)   # step 2 from the first call's end (t=5.5)


def test_a_first_line_with_only_the_first_call_reports_that_calls_rate(monkeypatch, clock):
    buffer = progress.MetricsBuffer([0], lambda *a: None, on_nonfinite=lambda: None,
                                    where="w", steps_per_epoch=10)
    _warm_up(monkeypatch, clock, 2.0)
    rate, eta = _line(buffer, clock, 1, 1, 0.0, images=10, total=11)
    assert (rate, eta) == (pytest.approx(10 / 2.0), "0:00:20")   # 10 steps at 2 s
