"""cupykern/timing.py: the parts that need no GPU (NVRTC compile of the spin kernel,
the statistics), and on a GPU, that hold_gpu holds the stream and time_cold's loop
does not charge host time to the timed call."""

from __future__ import annotations

import time

import numpy as np
import pytest

from cupykern import timing
from tests.conftest import HAS_GPU


def test_spin_kernel_compiles_with_nvrtc():
    from cupy_backends.cuda.libs import nvrtc

    prog = nvrtc.createProgram(timing._SPIN_SOURCE, "spin.cu", (), ())
    try:
        nvrtc.compileProgram(prog, ["-arch=compute_90"])
        assert "globaltimer" in nvrtc.getPTX(prog).decode()
    finally:
        nvrtc.destroyProgram(prog)


def test_timing_statistics():
    t = timing.Timing.of([3.0, 1.0, 2.0, 4.0, 100.0], "x")
    assert (t.median_us, t.samples, t.method) == (3.0, 5, "x")
    assert t.samples_us == (3.0, 1.0, 2.0, 4.0, 100.0)  # in the order they ran
    assert t.p10_us == pytest.approx(np.percentile([1, 2, 3, 4, 100], 10))
    assert timing.gbps(2_000_000, t) == pytest.approx(2e6 / 3e-6 / 1e9)


@pytest.mark.gpu
def test_hold_gpu_delays_the_stream():
    import cupy

    stream = cupy.cuda.Stream(non_blocking=True)
    # Compiled before the timed window: a first call with an empty kernel cache compiles
    # the spin kernel between the two events (356 ms on item 63's fresh H100).
    timing.hold_gpu(0.0, stream)
    stream.synchronize()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record(stream)
    timing.hold_gpu(0.02, stream)
    end.record(stream)
    end.synchronize()
    assert 19.0 <= cupy.cuda.get_elapsed_time(start, end) <= 200.0


@pytest.mark.gpu
def test_time_cold_does_not_time_host_gaps():
    """A call whose host path sleeps 1 ms around a tiny kernel still times as the kernel."""
    import cupy

    x = cupy.ones(1024, dtype=np.float32)

    def slow_host_call():
        time.sleep(1e-3)
        x.__iadd__(1)

    t = timing.time_cold(slow_host_call, warmup=2, repeat=10)
    assert t.median_us < 100.0, t


@pytest.mark.parametrize("kwargs, error, message", [
    ({"repeat": 0}, ValueError, r"time_cold: repeat: expected an int in \[1, 100000\], got 0"),
    ({"warmup": -1}, ValueError, r"time_cold: warmup: expected an int in \[0, 100000\], got -1"),
    ({"flushed_warmup": -2}, ValueError, r"time_cold: flushed_warmup: expected an int in \[0, 100000\], got -2"),
    ({"flushed_warmup": 10**30}, ValueError, r"time_cold: flushed_warmup: expected an int in \[0, 100000\], got 1000000000000000000000000000000"),
    ({"repeat": np.uint64(2**64 - 1)}, ValueError, r"time_cold: repeat: expected an int in \[1, 100000\], got np.uint64\(18446744073709551615\)"),
    ({"flushed_warmup": 1.5}, TypeError, r"time_cold: flushed_warmup must be an int in \[0, 100000\], got float 1.5"),
    ({"repeat": True}, TypeError, r"time_cold: repeat must be an int in \[1, 100000\], got bool True"),
])
def test_time_cold_refuses_bad_counts_before_any_call(kwargs, error, message):
    """Checked before the GPU is touched: on a machine without one, too; a huge count
    would run for minutes or hold millions of CUDA events (helper 107)."""
    def never():
        raise AssertionError("called")

    with pytest.raises(error, match=f"^{message}$"):
        timing.time_cold(never, **kwargs)


def test_time_cold_checks_the_module_default_by_its_name(monkeypatch):
    monkeypatch.setattr(timing, "FLUSHED_WARMUP", -1)
    with pytest.raises(ValueError, match=r"^time_cold: timing.FLUSHED_WARMUP: expected an int in \[0, 100000\], got -1$"):
        timing.time_cold(lambda: None)
    with pytest.raises(ValueError, match=r"^time_cold: timing.FLUSHED_WARMUP: expected an int"):
        timing.default_flushed_warmup()
    monkeypatch.setattr(timing, "FLUSHED_WARMUP", np.int64(3))
    assert type(timing.default_flushed_warmup()) is int  # what a result file's strict JSON takes


def test_time_cold_refuses_what_it_cannot_call():
    with pytest.raises(TypeError, match=r"^time_cold: fn must be callable, got int 0$"):
        timing.time_cold(0)


@pytest.mark.parametrize("samples, method, error, message", [
    ([], "x", ValueError, "samples_us must be non-empty, finite and >= 0"),
    ([1.0, float("nan")], "x", ValueError, "samples_us must be non-empty, finite and >= 0"),
    ([float("inf")], "x", ValueError, "samples_us must be non-empty, finite and >= 0"),
    ([-5.0], "x", ValueError, "samples_us must be non-empty, finite and >= 0"),
    ([None], "x", TypeError, "samples_us must be a 1-D sequence of real numbers"),
    (["1.5"], "x", TypeError, "samples_us must be a 1-D sequence of real numbers"),
    ("12", "x", TypeError, "samples_us must be a 1-D sequence of real numbers"),
    ([True, False], "x", TypeError, "samples_us must be a 1-D sequence of real numbers"),
    ([[1.0, 2.0]], "x", TypeError, "samples_us must be a 1-D sequence of real numbers"),
    (5.0, "x", TypeError, "samples_us must be a 1-D sequence of real numbers"),
    ([1.0], None, TypeError, "method must be a str"),
])
def test_timing_of_refuses_what_is_not_a_run_of_times(samples, method, error, message):
    """helper 107: an empty list raised IndexError, NaN gave a NaN median silently."""
    with pytest.raises(error, match=f"^Timing.of: {message}"):
        timing.Timing.of(samples, method)


@pytest.mark.gpu
@pytest.mark.parametrize("flushed_warmup, constant, expected", [(4, 0, 4), (None, 3, 3), (None, 0, 0)])
def test_time_cold_calls_the_flushed_warmup_untimed(monkeypatch, flushed_warmup, constant, expected):
    """Its calls: ``warmup`` plain ones, one to size the hold, the flushed warm-up (None:
    timing.FLUSHED_WARMUP), then ``repeat`` timed ones, the only samples."""
    import cupy

    monkeypatch.setattr(timing, "FLUSHED_WARMUP", constant)
    x = cupy.ones(1024, dtype=np.float32)
    calls = []

    def counted():
        calls.append(1)
        x.__iadd__(1)

    t = timing.time_cold(counted, warmup=2, repeat=7, flushed_warmup=flushed_warmup)
    assert (len(calls), t.samples, len(t.samples_us)) == (2 + 1 + expected + 7, 7, 7)
    assert float(x[0]) == 1 + len(calls)


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU message")
def test_copy_bandwidth_and_device_limits_without_a_gpu_say_so():
    """helper 67: CuPy's cudaErrorInsufficientDriver, which names the wrong problem."""
    from cupykern import plans

    with pytest.raises(RuntimeError, match="^copy_bandwidth: no CUDA GPU is visible"):
        timing.copy_bandwidth()
    with pytest.raises(RuntimeError, match="^time_cold: no CUDA GPU is visible"):
        timing.time_cold(lambda: None)
    with pytest.raises(RuntimeError, match="^DeviceLimits.of_device: no CUDA GPU is visible"):
        plans.DeviceLimits.of_device(0)
