"""Validate-then-time one (op, shape, dtype) point: the row of a sweep or bench table."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from cupykern import _dtypes, timing
from cupykern.registry import OpSpec
from cupykern.validation import check_op

#: Shapes of at most this many tokens are decode-sized: timed by CUDA-graph replay.
DECODE_MAX_TOKENS = 64


@dataclass
class Point:
    op: str
    impl: str
    num_tokens: int
    size: int
    dtype: str
    median_us: float
    p10_us: float
    p90_us: float
    method: str
    min_bytes: int
    gbps: float
    pct_of_copy: float
    check: str
    check_ok: bool

    def as_dict(self) -> dict:
        return asdict(self)


def time_call(fn, num_tokens: int, repeat: int | None = None) -> timing.Timing:
    """Graph replay for decode sizes, cold-L2 events otherwise; ``repeat`` timed samples
    (replays or calls; None: the timing module's defaults)."""
    if num_tokens <= DECODE_MAX_TOKENS:
        return timing.time_graph(fn) if repeat is None else timing.time_graph(fn, replays=repeat)
    return timing.time_cold(fn) if repeat is None else timing.time_cold(fn, repeat=repeat)


def measure(spec: OpSpec, num_tokens: int, size: int, dtype, *, seed: int, copy_gbps: float,
            impl: str = "cupykern", run=None, repeat: int | None = None) -> Point:
    """Checks ``run`` (default: the op itself) against the reference, then times it.

    ``run(inputs)`` lets a bench time another implementation of the same op on the
    same inputs (it is checked the same way first). ``repeat``: timed samples (see
    :func:`time_call`).
    """
    import cupy

    run = run or spec.run
    dtype = _dtypes.parse(dtype)
    inputs = spec.make_inputs(np.random.default_rng(seed), num_tokens, size, dtype)
    if "out" in inputs:
        outputs = spec.run(inputs)  # allocate the output once, outside any timed region
        inputs["out"] = outputs[0]
    checked = check_op(spec.with_run(run), num_tokens, size, dtype, seed, inputs=inputs)
    t = time_call(lambda: run(inputs), num_tokens, repeat)
    nbytes = spec.min_bytes(inputs)
    gbps = timing.gbps(nbytes, t)
    cupy.cuda.get_current_stream().synchronize()
    return Point(spec.name, impl, num_tokens, size, _dtypes.short_name(dtype), t.median_us, t.p10_us, t.p90_us,
                 t.method, nbytes, gbps, 100.0 * gbps / copy_gbps, checked.message, checked.ok)
