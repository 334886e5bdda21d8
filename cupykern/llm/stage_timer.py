"""Time per forward stage: CUDA events on the GPU, ``perf_counter`` on the CPU.

A timer is called with a stage name and used as a context manager around the work of
that stage (``with timer("norm"): ...``); :meth:`totals_ms` sums each stage over all
uses. Stages: ``norm``, ``rope``, ``activation``, ``matmul``, ``attention`` (KV-cache
write, scores, softmax, weighted sum) and ``other`` (embedding lookup).

The CUDA timer records an event pair on the current stream per use and never
synchronises until :meth:`CudaStageTimer.totals_ms`. The time between the events is
the stage's GPU time when the GPU is the bottleneck (prefill of many tokens); when the
host is (one-token decode: kernels of 2-3 us, Python launch paths of tens of us), the
GPU idles between launches and the pair measures mostly the host's launch time. The
extra event records cost host time, so tokens/s are measured on a run without it.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager, nullcontext

STAGES = ("norm", "rope", "activation", "matmul", "attention", "other")

_NULL = nullcontext()


def no_timer(stage: str):
    """The timer that times nothing (a reusable null context)."""
    return _NULL


class CudaStageTimer:
    """GPU milliseconds per stage from CUDA event pairs on CuPy's current stream."""

    def __init__(self):
        self._pairs = defaultdict(list)

    @contextmanager
    def __call__(self, stage: str):
        import cupy

        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        try:
            yield
        finally:
            end.record()
            self._pairs[stage].append((start, end))

    def totals_ms(self) -> dict[str, float]:
        """``{stage: total ms}`` in :data:`STAGES` order (synchronises on the last event)."""
        import cupy

        for pairs in self._pairs.values():
            pairs[-1][1].synchronize()
        return {s: sum(cupy.cuda.get_elapsed_time(a, b) for a, b in self._pairs[s])
                for s in STAGES if s in self._pairs}


class CpuStageTimer:
    """Wall-clock milliseconds per stage (for the NumPy reference forward)."""

    def __init__(self):
        self._ms = defaultdict(float)

    @contextmanager
    def __call__(self, stage: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._ms[stage] += (time.perf_counter() - t0) * 1e3

    def totals_ms(self) -> dict[str, float]:
        return {s: self._ms[s] for s in STAGES if s in self._ms}
