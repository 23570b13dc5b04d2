"""The progress line's rate and ETA (`progress.MetricsBuffer`) on a clock the test sets: the first
interval starts once the first call has run (its compile and the device's warm-up are not
steps), the ETA uses the mean rate of the run so far, not the last interval's, and that mean
leaves out the one-time costs of the first epoch end (the first validation's compile). On a
simulated device whose calls finish at times the test sets, a host that falls behind (a slow
checkpoint, a stalled log line) never makes a line report more than the device did."""

import jax
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


@pytest.fixture
def fetches_wait(monkeypatch):
    """Every fetch finds its call still running (an accelerator that the host keeps ahead of):
    the host's clock at the fetch is the call's completion time."""
    monkeypatch.setattr(progress, "_is_ready", lambda tree: False)


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


def test_the_first_line_times_the_steps_after_the_first_call(monkeypatch, clock, fetches_wait):
    written = []
    buffer = progress.MetricsBuffer([0], lambda i, step, m: written.append((i, step, m)),
                                    on_nonfinite=lambda: None, where="w", steps_per_epoch=300)
    _warm_up(monkeypatch, clock, 3.0)   # a GPU's first call of one step: 3 s, once
    buffer.add(1, _metrics(1), num_steps=1)
    rate, eta = _line(buffer, clock, 100, 99, 0.99)
    assert rate == pytest.approx(99 * 128 / 0.99)   # not 100 * 128 / 3.99
    assert eta == "0:00:08"                          # 850 steps at 10 ms
    assert [step for _, step, _ in written] == [100]   # one record for both calls


def test_the_eta_leaves_out_the_first_epoch_ends_one_time_costs(monkeypatch, clock, fetches_wait):
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


def test_a_later_call_does_not_restart_the_first_interval(monkeypatch, clock, fetches_wait):
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


def test_a_first_line_with_only_the_first_call_reports_that_calls_rate(monkeypatch, clock,
                                                                       fetches_wait):
    buffer = progress.MetricsBuffer([0], lambda *a: None, on_nonfinite=lambda: None,
                                    where="w", steps_per_epoch=10)
    _warm_up(monkeypatch, clock, 2.0)
    rate, eta = _line(buffer, clock, 1, 1, 0.0, images=10, total=11)
    assert (rate, eta) == (pytest.approx(10 / 2.0), "0:00:20")   # 10 steps at 2 s


# ------------------------------------------------------------------ a simulated device and loop

class _DeviceArray:
    """A call's metrics on a simulated device: computed at `done` on the test's clock."""

    def __init__(self, value, done, clock):
        self.value, self.done, self.clock = value, done, clock

    def is_ready(self):
        return self.clock.now >= self.done


class _Device:
    """Runs calls in order, each `seconds_per_step` a step, a validation `seconds` long."""

    def __init__(self, clock, seconds_per_step):
        self.clock, self.seconds_per_step, self.free_at = clock, seconds_per_step, 0.0

    def _occupy(self, seconds):
        self.free_at = max(self.free_at, self.clock.now) + seconds
        return self.free_at

    def steps(self, count):
        done = self._occupy(count * self.seconds_per_step)
        return {"loss": _DeviceArray(np.full(count, 0.5, np.float32), done, self.clock),
                "nonfinite": _DeviceArray(np.zeros(count, bool), done, self.clock)}

    def validate(self, seconds):
        return self._occupy(seconds)

    def wait(self, tree):
        """What a host fetch does: return once every array of `tree` is computed."""
        leaves = [x for x in jax.tree.leaves(tree) if isinstance(x, _DeviceArray)]
        self.clock.now = max([self.clock.now, *[x.done for x in leaves]])
        return jax.tree.map(lambda x: x.value if isinstance(x, _DeviceArray) else x, tree)


def _simulated_run(monkeypatch, clock, host_stalls, epochs=4):
    """The deferred-epoch-end loop of `training._run_loop` (an accelerator's) on the simulated
    device, at the H200 CIFAR-10 run's shape: 371 steps an epoch, a line every 100 steps, 3.3 ms
    a step, calls cut at the events; the first call one step after a 2 s compile. The host
    stalls `host_stalls[step]` seconds before the line of `step` (a checkpoint's host work, a
    slow write), and 0.2 s at each epoch end's host work. Returns [(step, img/s, after the
    first validation)] and the run's mean img/s after the first validation."""
    device = _Device(clock, 3.3e-3)
    monkeypatch.setattr(progress.jax, "device_get", device.wait)

    def first_call_compiles(tree):
        clock.now += 2.0
        return device.wait(tree)
    monkeypatch.setattr(progress.jax, "block_until_ready", first_call_compiles)
    spe, every, batch = 371, 100, 128
    total = spe * epochs
    buffer = progress.MetricsBuffer([0], lambda *a: None, on_nonfinite=lambda: None,
                                    where="w", steps_per_epoch=spe)
    lines, step, calls, log_after, epoch_end, validated = [], 0, 0, None, None, None

    def line(at):
        clock.now += host_stalls.get(at, 0.0)
        buffer.flush(keep_last=True)
        rate, _ = buffer.rate_and_eta(batch, total - at)
        lines.append((at, rate, validated is not None))
        clock.now += 1e-3   # printing the line

    while step < total:
        count = 1 if calls == 0 else min((step // spe + 1) * spe,
                                         (step // every + 1) * every, total) - step
        step += count
        buffer.add(step, device.steps(count), num_steps=count)
        calls += 1
        clock.now += 2e-4   # dispatching the call
        if epoch_end is not None:   # the epoch end before this call, while this call runs
            end, validation_done = epoch_end
            line(end)
            clock.now = max(clock.now, validation_done) + 0.2   # validation records, saves
            buffer.restart_mean()
            validated = validated or (clock.now, end)
            epoch_end = None
        if log_after is not None:
            line(log_after)
            log_after = None
        if step % spe == 0 and step < total:
            epoch_end = (step, device.validate(0.05))
        elif step % every == 0 or step == total:
            log_after = step
    buffer.flush()
    start_time, start_step = validated
    return lines, (total - start_step) * batch / (clock.now - start_time)


def test_no_line_reports_more_than_the_device_did_when_the_host_falls_behind(monkeypatch,
                                                                              clock):
    """A host stall after the device finished the call a line fetches: its fetch does not wait,
    and the device runs the next call meanwhile. Timed from such a fetch, the next line's span
    was too short (on an H200: 4,632,590 img/s for a loop at about 39,000)."""
    device_rate = 128 / 3.3e-3
    stalls = {600: 0.5, 1100: 0.4, 1400: 0.3}
    lines, mean = _simulated_run(monkeypatch, clock, stalls)
    after = [rate for _, rate, late in lines if late]
    assert len(after) > 10
    assert max(after) <= 3 * mean, (mean, lines)
    assert max(rate for _, rate, _ in lines) <= device_rate * 1.001, lines
    # a host that keeps up: most lines are the device's rate; the lines after an epoch end,
    # whose span holds the validation and the host's epoch-end work, are lower
    clock.now = 0.0
    lines, mean = _simulated_run(monkeypatch, clock, {})
    rates = [rate for _, rate, _ in lines]
    assert max(rates) <= device_rate * 1.001
    assert np.median(rates) == pytest.approx(device_rate, rel=1e-3), lines
