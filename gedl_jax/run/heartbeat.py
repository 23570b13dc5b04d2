"""Lines for the waits a command would otherwise sit through in silence: loading and decoding
the data, and XLA compiling the steps (the first run of a command spends most of its first
half-minute there).

A wait shorter than `SLOW_AFTER_S` prints nothing; a longer one prints `<what> ...` while it
runs (from a timer thread) and `<what>: done in 4.2 s` when it ends, so no command is silent for
more than a few seconds. Only process 0 of a multi-host run prints.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

SLOW_AFTER_S = 3.0
_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"   # jax._src.dispatch's event


def log(message: str) -> None:
    """Print a line of a run's output, from process 0 of a multi-host run only (every module
    that talks to the user prints through this)."""
    import jax

    if jax.process_index() == 0:
        print(message, flush=True)


class _Wait:
    """One wait: announced by a timer after `after` seconds; `end()` says how long it took if
    it was announced."""

    def __init__(self, what: str, after: float):
        self.what, self.start = what, time.time()
        self.timer = threading.Timer(after, self._announce)
        self.timer.daemon = True
        self.announced = False
        self.timer.start()

    def _announce(self) -> None:
        self.announced = True
        log(f"{self.what} ...")

    def end(self) -> None:
        self.timer.cancel()
        if self.announced:
            log(f"{self.what}: done in {time.time() - self.start:.1f} s")


@contextlib.contextmanager
def announced(what: str, after: float = SLOW_AFTER_S) -> Iterator[None]:
    """The block; when it takes longer than `after` seconds, `what ...` while it runs and
    `what: done in X s` at its end."""
    wait = _Wait(what, after)
    try:
        yield
    finally:
        wait.end()


@contextlib.contextmanager
def compilations_announced(after: float = SLOW_AFTER_S) -> Iterator[None]:
    """While the block runs, an XLA compilation that takes longer than `after` seconds is
    announced (`compiling <function> (XLA) ...`, then how long it took), through JAX's
    monitoring events at the start and the end of each backend compilation."""
    import jax

    waits: dict[str, _Wait] = {}

    def started(event: str, value: float, **kwargs) -> None:
        del value
        if event == _BACKEND_COMPILE:
            name = str(kwargs.get("fun_name", "a step"))
            waits[name] = _Wait(f"compiling {name} (XLA; once per command)", after)

    def ended(event: str, duration: float, **kwargs) -> None:
        del duration
        if event == _BACKEND_COMPILE:
            wait = waits.pop(str(kwargs.get("fun_name", "a step")), None)
            if wait is not None:
                wait.end()

    monitoring = jax.monitoring
    needed = ("register_scalar_listener", "unregister_scalar_listener",
              "register_event_duration_secs_listener", "unregister_event_duration_listener")
    if not all(hasattr(monitoring, name) for name in needed):   # an older JAX: no lines
        yield
        return
    monitoring.register_scalar_listener(started)
    monitoring.register_event_duration_secs_listener(ended)
    try:
        yield
    finally:
        monitoring.unregister_scalar_listener(started)
        monitoring.unregister_event_duration_listener(ended)
        for wait in waits.values():
            wait.end()
