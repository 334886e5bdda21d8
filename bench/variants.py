"""Variants of one call side by side, for the experiments kept under bench/results/ (each
a script run on the device through bench/gpu_session.sh's BENCHES): cupykern.plans'
constants set per variant, outputs compared bit for bit, timing rounds interleaved so that
a drift over the call (a few hundredths of a microsecond: bench/results/NOTES.md, items
16-19) falls on every variant alike.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from cupykern import launcher, plans, timing


@contextlib.contextmanager
def plan_constants(values: dict):
    """cupykern.plans' constants set to ``values`` inside the block, the launcher's recipe
    caches emptied on entry and on exit (so the calls inside plan again). AttributeError
    for a name plans does not have."""
    saved = {name: getattr(plans, name) for name in values}
    try:
        for name, value in values.items():
            setattr(plans, name, value)
        launcher.clear_caches()
        yield
    finally:
        for name, value in saved.items():
            setattr(plans, name, value)
        launcher.clear_caches()


def under(values: dict, fn: Callable) -> Callable:
    """``fn`` as a callable that runs under :func:`plan_constants` ``values``. Each call plans
    again (host time in the hundreds of microseconds): time it behind
    :func:`cupykern.timing.time_cold`'s hold or in a graph, not by host clocks."""
    def call():
        with plan_constants(values):
            return fn()
    return call


def same_bits(a: tuple, b: tuple) -> bool:
    """Whether two tuples of device arrays have the same shapes, dtypes and bytes."""
    import cupy

    return len(a) == len(b) and all(
        x.shape == y.shape and x.dtype == y.dtype
        and bool((cupy.ascontiguousarray(x).view(cupy.uint8) == cupy.ascontiguousarray(y).view(cupy.uint8)).all())
        for x, y in zip(a, b))


def time_rounds(fns: dict[str, Callable], timer: Callable | dict[str, Callable] = timing.time_cold,
                rounds: int = 3) -> dict[str, list[float]]:
    """Median microseconds of each of ``fns`` in each of ``rounds`` rounds, by ``timer(fn) ->
    timing.Timing`` (one timer for all, or one by name); the order turns by one each round,
    so no variant always runs first."""
    timers = timer if isinstance(timer, dict) else dict.fromkeys(fns, timer)
    names = list(fns)
    medians: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            medians[name].append(timers[name](fns[name]).median_us)
    return medians
