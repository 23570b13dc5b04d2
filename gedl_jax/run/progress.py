"""Step metrics on their way to the host: fetched one step late, checked, logged, timed.

The loop hands each call's metrics (device arrays: one step's, or the rows of several steps run
in one call) to `MetricsBuffer.add` and goes on dispatching. `flush(keep_last=True)` fetches
every pending call but the newest, so the device is never idle while Python logs; `flush()`
fetches all (a stop, a mid-epoch checkpoint, an epoch end where the loop waits: a CPU's).

Rate and ETA leave out what a run pays once. The loop's first call is one step, and the buffer
waits for it (the one host wait of the run): it carries the compilation and the device's
first-run costs (on an H200, when the first interval still held them, the main job's first line
read 4,307 img/s and the next two 149,362 and 188,669), so the first line's interval starts
after it. The ETA divides the steps left by the mean rate of the run so far, not by the last
interval's rate, which an epoch end would swing: until the first validation is done (its
program compiles on first use) the mean runs from the first fetch, and a line at an epoch end
keeps the estimate of the line before; after it (`restart_mean`), the mean runs from the next
fetch on, with every later validation and checkpoint in it.

The img/s of a line is the rate of the steps the device completed since the last point where
the host saw it complete one: a fetch that had to wait for its call (the call was still
running when the host asked) returns when the device finishes it, so its time is that step's
completion time. A fetch whose call had already finished says only that it finished by then:
the host was behind (a checkpoint, a validation's host work), and the device may have run the
next call too. Timing the next line from such a fetch divided its steps by too short a span:
on an H200 the lines around epoch ends read from 386 to 4,632,590 img/s for a loop whose steps
ran at about 39,000. So a line's span starts at the last fetch that waited and ends now: its
rate is never above what the device did, and where the host held the device up it is the
lower rate the run really had.
A non-finite step (its update was skipped in the graph) stops the run with an error naming the
steps and seeds, after the checkpoints already written are safe on disk.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import jax
import numpy as np


class NonFiniteLossError(RuntimeError):
    pass


def format_eta(seconds: float) -> str:
    """`seconds` as H:MM:SS ("?" when not finite)."""
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class MetricsBuffer:
    """Pending step metrics of S seeds; `write(i, step, averages)` receives seed i's means."""

    def __init__(self, seeds: Sequence[int], write: Callable[[int, int, dict], None],
                 on_nonfinite: Callable[[], None], where: str, steps_per_epoch: int):
        self.seeds, self.write, self.on_nonfinite = list(seeds), write, on_nonfinite
        self.where, self.steps_per_epoch = where, steps_per_epoch
        # (last step, number of steps or None for a single step's metrics, metrics)
        self.pending: list[tuple[int, int | None, dict]] = []
        self.last_fetched = 0   # the newest step whose metrics reached the host
        self.calls = 0
        self.first_call: tuple[float, int] | None = None   # (dispatch time, steps)
        # (time, step) where the host last saw the device complete a step: the end of the
        # first call, then every fetch that waited for its call; a line's span starts here
        self.anchor: tuple[float, int] | None = None
        self.waited: tuple[float, int] | None = None   # this line's fetch, if it waited
        # (time, step) the ETA's mean rate runs from: the first fetch, then the first fetch
        # after the first validation (`restart_mean`)
        self.mean_start: tuple[float, int] | None = None
        self.mean_restarted = False
        self.seconds_per_step: float | None = None   # the ETA's latest estimate

    def add(self, step: int, metrics: dict, num_steps: int | None = None) -> None:
        """Queue the metrics of the call that ended at `step` (device arrays, fetched at the
        next `flush`): one step's, or with `num_steps` the first `num_steps` rows of a
        several-step call (`steps.multi_step`)."""
        self.pending.append((step, num_steps, metrics))
        self.calls += 1
        if self.calls == 1:
            # the first call of this process: its compile and the device's warm-up are paid
            # once it has run, and the first interval starts then
            dispatched = time.time()
            jax.block_until_ready(metrics)
            self.anchor = (time.time(), step)
            self.first_call = (dispatched, num_steps or 1)

    def flush(self, keep_last: bool = False) -> dict[str, float] | None:
        """Fetch pending metrics (all but the newest call with `keep_last`), write each seed's
        averages, return the seeds' mean (None if nothing was pending)."""
        split = len(self.pending) - 1 if keep_last else len(self.pending)
        ready, self.pending = self.pending[:split], self.pending[split:]
        if not ready:
            return None
        steps, fetched = [], []
        waits = not _is_ready(ready[-1][2])   # then it returns when the device finishes it
        for (last, count, _), values in zip(ready, jax.device_get([m for *_, m in ready])):
            if count is None:
                steps.append(last)
                fetched.append(values)
                continue
            steps.extend(range(last - count + 1, last + 1))
            fetched.extend({k: v[row] for k, v in values.items()} for row in range(count))
        self._check_finite(steps, fetched)
        self.last_fetched = steps[-1]
        per_seed = []
        for i in range(len(self.seeds)):
            averaged = {k: float(np.mean([np.atleast_1d(m[k])[i] for m in fetched]))
                        for k in fetched[0] if k != "nonfinite"}
            self.write(i, steps[-1], averaged)
            per_seed.append(averaged)
        if waits:
            self.waited = (time.time(), steps[-1])
        if self.mean_start is None:
            self.mean_start = (time.time(), steps[-1])
        return {k: float(np.mean([a[k] for a in per_seed])) for k in per_seed[0]}

    def _check_finite(self, steps: list[int], fetched: list[dict]) -> None:
        nonfinite = np.stack([np.atleast_1d(m["nonfinite"]) for m in fetched])  # steps x S
        if not nonfinite.any():
            return
        bad_steps, bad_seeds = np.nonzero(nonfinite)
        first, last = steps[bad_steps.min()], steps[bad_steps.max()]
        saved = self.on_nonfinite()   # False: no checkpoint was written before this step
        seeds = sorted({self.seeds[i] for i in bad_seeds})
        kept = ("No checkpoint had been saved yet, so there is nothing to resume from."
                if saved is False else f"The last good checkpoint in {self.where} is intact.")
        raise NonFiniteLossError(
            f"the run diverged: non-finite loss or gradient at step(s) {first}..{last}: try a "
            f"lower learning rate, config.grad_clip_norm, or config.compute_dtype='float32'\n"
            f"  (epoch {(first - 1) // self.steps_per_epoch}, seed(s) {seeds}) The update was "
            f"skipped and training stopped. {kept}")

    def restart_mean(self) -> None:
        """The first validation is done: the ETA's mean rate runs from the next fetch on, past
        the one-time costs of the run's first epoch ends (only the first call counts)."""
        if not self.mean_restarted:
            self.mean_start, self.mean_restarted = None, True

    def rate_and_eta(self, images_per_step: int, steps_left: int) -> tuple[float, str]:
        """img/s of the steps completed since the last fetch that waited for its call (the
        module's docstring), and the time left at the mean rate of the run so far
        (`restart_mean`; the latest estimate where no span is timed yet, or where the interval
        ends at an epoch end before the first validation; this interval's rate at the first
        line)."""
        now = time.time()
        start_time, start_step = self.anchor or (now, self.last_fetched)
        end_time = self.waited[0] if self.waited else now
        rate = (self.last_fetched - start_step) * images_per_step / max(end_time - start_time,
                                                                          1e-9)
        if self.last_fetched <= start_step and self.first_call:   # only the first call ran
            dispatched, steps = self.first_call
            rate = steps * images_per_step / max(now - dispatched, 1e-9)
        if self.waited:
            self.anchor, self.waited = self.waited, None
        start_time, start_step = self.mean_start or (now, self.last_fetched)
        epoch_end_before_restart = not self.mean_restarted and \
            self.last_fetched % self.steps_per_epoch == 0
        if self.last_fetched > start_step and not epoch_end_before_restart:
            self.seconds_per_step = (now - start_time) / (self.last_fetched - start_step)
        elif self.seconds_per_step is None and rate:
            self.seconds_per_step = images_per_step / rate
        seconds = math.inf if self.seconds_per_step is None else self.seconds_per_step
        return rate, format_eta(steps_left * seconds)


def _is_ready(tree) -> bool:
    """Whether every array of `tree` is computed (host arrays always are)."""
    return all(getattr(x, "is_ready", lambda: True)() for x in jax.tree.leaves(tree))
