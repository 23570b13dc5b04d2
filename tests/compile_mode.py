"""`fast_compilation()`: XLA's optimisations mostly off within, for tests that compile in-process
(seconds, not tens of seconds, per program; the same numbers up to float32 rounding).

jax's in-memory executable caches are not keyed on `jax_disable_most_optimizations`: a jitted
function compiled under one setting is run again under the other, so two evaluations of the same
model in one process could differ in the last bits, depending on which tests ran before (a test
comparing them exactly then fails in one order and passes in another). The caches are cleared
whenever the setting changes, on the way in and on the way out; the persistent compilation cache
the tests share is keyed on the compile options, so what is recompiled is loaded from it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import jax

FLAG = "jax_disable_most_optimizations"


@contextlib.contextmanager
def fast_compilation() -> Iterator[None]:
    previous = jax.config.read(FLAG)
    if not previous:
        jax.clear_caches()
    jax.config.update(FLAG, True)
    try:
        yield
    finally:
        jax.config.update(FLAG, previous)
        if not previous:
            jax.clear_caches()
