"""GPU timing: CUDA events with a cold L2, CUDA-graph replay, copy bandwidth baseline.

* :func:`time_cold` records an event pair around every call, after reading a buffer
  eight times the L2 size (so inputs come from DRAM and no dirty lines are left to
  write back), with no host sync inside the loop and the whole loop queued behind a
  spinning kernel (so no launch gap of the host is timed); the median of many calls is
  reported (Triton's ``do_bench`` pattern, with a read instead of its zero-fill, plus
  nvbench's blocking kernel).
* :func:`time_graph` captures ``ops_per_graph`` calls in one CUDA graph and times its
  replays: GPU time per op for decode-sized shapes, without launch gaps.
* :func:`copy_bandwidth` times a device-to-device ``cudaMemcpyAsync`` the same way:
  the practical roofline for memory-bound kernels, measured in the same run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from cupykern import _arrays


@dataclass(frozen=True)
class Timing:
    """Microseconds per call: median and the 10th/90th percentiles of the runs, and the
    runs themselves in the order they ran (``samples_us``; ``samples`` counts them)."""

    median_us: float
    p10_us: float
    p90_us: float
    method: str  # "events, cold L2" or "graph replay"
    samples_us: tuple[float, ...] = field(repr=False, compare=False)

    @property
    def samples(self) -> int:
        return len(self.samples_us)

    @staticmethod
    def of(samples_us, method: str) -> "Timing":
        """The statistics of ``samples_us`` (a non-empty 1-D sequence of finite real
        microseconds >= 0, in the order they ran) timed by ``method`` (a str); TypeError or
        ValueError naming the argument otherwise."""
        if not isinstance(method, str):
            raise TypeError(f"Timing.of: method must be a str, got {type(method).__name__} {method!r}")
        raw = np.asarray(samples_us)  # a str or bytes is 0-d
        if raw.ndim != 1 or raw.dtype.kind not in "iuf":
            raise TypeError(f"Timing.of: samples_us must be a 1-D sequence of real numbers, got {samples_us!r}")
        s = raw.astype(np.float64)
        if s.size == 0 or not np.all(np.isfinite(s)) or np.any(s < 0):
            raise ValueError(f"Timing.of: samples_us must be non-empty, finite and >= 0, got {samples_us!r}")
        return Timing(float(np.median(s)), float(np.percentile(s, 10)), float(np.percentile(s, 90)), method,
                      tuple(s.tolist()))


class _L2Flusher:
    def __init__(self):
        import cupy

        # Twice L2 evicts it; the rest keeps the GPU busy (~0.1 ms) between timed calls.
        l2 = cupy.cuda.Device().attributes["L2CacheSize"]
        self.buffer = cupy.zeros(max(8 * l2, 256 << 20), dtype=np.uint8)

    def flush(self, stream):
        # Read, don't write: a memset leaves L2 full of dirty lines, and writing them
        # back to DRAM would be charged to the kernel timed next.
        with stream:
            self.buffer.max()


_SPIN_SOURCE = r"""
extern "C" __global__ void spin_ns(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}
"""


def hold_gpu(seconds: float, stream) -> None:
    """Enqueues a one-thread kernel that spins for ``seconds`` of GPU time on ``stream``.

    Work enqueued behind it then runs back to back, whatever the host's pace: the way
    to time calls whose Python launch path is slower than their kernels (nvbench's
    blocking kernel does the same).
    """
    import cupy

    kernel = cupy.RawKernel(_SPIN_SOURCE, "spin_ns")
    kernel((1,), (1,), (np.uint64(int(seconds * 1e9)),), stream=stream)


#: hold_gpu covers the host's enqueueing of the whole timed loop this many times over.
_HOLD_MARGIN = 2.0


#: time_cold's untimed flush-and-call pairs before the timed ones (see its docstring).
#: 0, as measured: on an H100 100 of them moved no point of the peers run's rms_norm and
#: fused add (256-4096 tokens, 8b and 70b) past its run-to-run spread (two runs each way:
#: -1.2..+1.6 % on average, -3.4..+2.5 % run against run; the peers' spread is larger;
#: bench/results/NOTES.md item 63, call 10). The knob stays for probes.
FLUSHED_WARMUP = 0
#: The most calls time_cold takes for any of its counts: past it a call would run for
#: minutes (each flush reads eight times the L2) or hold a million CUDA events.
MAX_COUNT = 100_000


def _count(where: str, name: str, value, lowest: int) -> int:
    """``value`` as an int in [``lowest``, MAX_COUNT] (:func:`cupykern._arrays.count`), a
    TypeError for a value that is not an int at all."""
    if not _arrays.is_int(value):
        raise TypeError(f"{where}: {name} must be an int in [{lowest}, {MAX_COUNT}], got {type(value).__name__} {value!r}")
    return _arrays.count(value, f"{where}: {name}", lowest, MAX_COUNT)


def default_flushed_warmup() -> int:
    """:data:`FLUSHED_WARMUP`, checked as time_cold checks its counts (what it uses when
    given None, and what a result file records)."""
    return _count("time_cold", "timing.FLUSHED_WARMUP", FLUSHED_WARMUP, 0)


def time_cold(fn, *, warmup: int = 5, repeat: int = 50, flushed_warmup: int | None = None) -> Timing:
    """Median GPU time of ``fn()`` with L2 flushed before each call (current stream).

    The loop is enqueued behind :func:`hold_gpu`, sized from the host time of one
    flush-and-call, so the GPU never waits for the host between a start event and the
    kernel it times. Without it, a call whose Python path (~100 us on the H200 host)
    outlasts the flush was charged the host's launch gap (apply_rope at 256 to 4096
    tokens read 23 to 83 us in runs of the same commit).

    ``warmup`` calls run first without flushes (compiles, allocations); then
    ``flushed_warmup`` flush-and-call pairs (None: :data:`FLUSHED_WARMUP`) run untimed
    behind the same hold, right before the ``repeat`` timed ones. TypeError for an
    ``fn`` that is not callable; TypeError or ValueError for a count that is not an int
    in [0, MAX_COUNT] (``repeat``: from 1); RuntimeError without a GPU.
    """
    import cupy

    from cupykern import environment

    if not callable(fn):
        raise TypeError(f"time_cold: fn must be callable, got {type(fn).__name__} {fn!r}")
    warmup, repeat = _count("time_cold", "warmup", warmup, 0), _count("time_cold", "repeat", repeat, 1)
    flushed_warmup = (_count("time_cold", "flushed_warmup", flushed_warmup, 0) if flushed_warmup is not None
                      else default_flushed_warmup())
    environment.check_gpu("time_cold")
    stream = cupy.cuda.get_current_stream()
    flusher = _L2Flusher()
    for _ in range(warmup):
        fn()
    stream.synchronize()
    t0 = time.perf_counter()
    flusher.flush(stream)
    fn()
    host_s = time.perf_counter() - t0
    pairs = [(cupy.cuda.Event(), cupy.cuda.Event()) for _ in range(repeat)]
    hold_gpu(min(_HOLD_MARGIN * (flushed_warmup + repeat) * host_s + 1e-3, 2.0), stream)
    for _ in range(flushed_warmup):
        flusher.flush(stream)
        fn()
    for start, end in pairs:
        flusher.flush(stream)
        start.record(stream)
        fn()
        end.record(stream)
    pairs[-1][1].synchronize()
    return Timing.of([cupy.cuda.get_elapsed_time(s, e) * 1e3 for s, e in pairs], "events, cold L2")


def time_graph(fn, *, ops_per_graph: int = 100, replays: int = 20) -> Timing:
    """GPU time per call of ``fn()`` from replays of a graph holding ``ops_per_graph`` calls.

    ``fn`` must only launch kernels on the current stream on buffers allocated before
    (no host syncs, no allocation that outlives the capture).
    """
    import cupy

    fn()  # compile and allocate outside the capture
    cupy.cuda.get_current_stream().synchronize()  # the capture stream does not wait for it
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        for _ in range(ops_per_graph):
            fn()
        graph = stream.end_capture()
        graph.upload(stream)
        for _ in range(3):
            graph.launch(stream)
        samples = []
        for _ in range(replays):
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(stream)
            graph.launch(stream)
            end.record(stream)
            end.synchronize()
            samples.append(cupy.cuda.get_elapsed_time(start, end) * 1e3 / ops_per_graph)
    return Timing.of(samples, "graph replay")


def copy_bandwidth(nbytes: int = 1 << 30, *, repeat: int = 20) -> float:
    """Device-to-device copy bandwidth in GB/s (bytes read + bytes written), cold L2.
    RuntimeError without a GPU."""
    import cupy

    from cupykern import environment

    environment.check_gpu("copy_bandwidth")

    src = cupy.ones(nbytes, dtype=np.uint8)
    dst = cupy.empty_like(src)
    runtime = cupy.cuda.runtime
    kind = runtime.memcpyDeviceToDevice

    def copy():
        runtime.memcpyAsync(dst.data.ptr, src.data.ptr, nbytes, kind, cupy.cuda.get_current_stream().ptr)

    timing = time_cold(copy, warmup=3, repeat=repeat)
    return 2 * nbytes / (timing.median_us * 1e-6) / 1e9


def gbps(nbytes: int, timing: Timing) -> float:
    return nbytes / (timing.median_us * 1e-6) / 1e9
