"""What the pieces of one launch cost on this host, in nanoseconds (the launcher's budget).

The launcher's per-call work is a handful of attribute reads, a key, a cache lookup and
a kernel launch; bench/bench_host_overhead.py measures the whole against a bare launch,
this script the parts, so that a change can be predicted before it is made:

    python bench/host_costs.py [--out DIR]     # DIR/host_costs.txt gets the table too
"""

from __future__ import annotations

import functools
import sys
import time
from operator import itemgetter
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import HELP_OPTIONS, require_gpu  # noqa: E402


def per_call_ns(fn, calls: int = 20000) -> float:
    for _ in range(200):
        fn()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e9


@click.command(help=__doc__.splitlines()[0], context_settings=HELP_OPTIONS)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None, help="also write the table here")
def main(out) -> None:
    require_gpu("host_costs.py", "times launches")
    import cupy

    import cupykern
    from cupykern import _dtypes, launcher

    x = cupy.ones((1, 4096), dtype=_dtypes.bfloat16)
    w = cupy.ones(4096, dtype=_dtypes.bfloat16)
    y = cupy.empty_like(x)
    cupykern.rms_norm(x, w, out=y)
    with launcher.recording() as seen:
        cupykern.rms_norm(x, w, out=y)
    record = seen[-1]
    key = ((x.shape, x.dtype, 0), (w.shape, w.dtype, 0), (y.shape, y.dtype, 0), (1e-6, 0.0))
    cached = functools.lru_cache(maxsize=1024)(lambda k: k)
    cached(key)
    recipes = {key: None}
    pick = itemgetter(2, 0, 1)
    arrays = (x, w, y)
    rows = [
        ("x.shape", lambda: x.shape),
        ("x.strides", lambda: x.strides),
        ("x.dtype", lambda: x.dtype),
        ("x.data.ptr & 15", lambda: x.data.ptr & 15),
        ("type(x) is ndarray", lambda: type(x) is cupy.ndarray),
        ("runtime.getDevice()", cupy.cuda.runtime.getDevice),
        ("key of 3 arrays (list + tuple)", lambda: tuple([(a.shape, a.strides, a.dtype, a.data.ptr & 15)
                                                           for a in arrays])),
        ("key of 3 C-contiguous arrays (no strides)", lambda: tuple([(a.shape, a.dtype, a.data.ptr & 15)
                                                                      if a._c_contiguous else None for a in arrays])),
        ("x._shape (CuPy's vector as a list)", lambda: x._shape),
        ("key of 3 arrays from _shape", lambda: tuple([(a.dtype, a.data.ptr & 15, *a._shape)
                                                        if a._c_contiguous else None for a in arrays])),
        ("lru_cache hit on an rms_norm key", lambda: cached(key)),
        ("dict hit on an rms_norm key", lambda: recipes[key]),
        ("itemgetter(2, 0, 1)(arrays) + scalars", lambda: pick(arrays) + record.args[3:]),
        ("cupy.empty((1, 4096), bf16)", lambda: cupy.empty((1, 4096), dtype=_dtypes.bfloat16)),
        ("Function(grid, block, args)", lambda: record.function(record.grid, record.block, record.args)),
        ("RawKernel(grid, block, args)", lambda: record.kernel(record.grid, record.block, record.args)),
        ("cupykern.rms_norm(x, w, out=y)", lambda: cupykern.rms_norm(x, w, out=y)),
        ("cupykern.layer_norm(x, w, w, out=y)", lambda: cupykern.layer_norm(x, w, w, out=y)),
    ]
    lines = []
    for name, fn in rows:
        lines.append(f"{name:45s} {per_call_ns(fn):9.0f} ns")
        print(lines[-1])
        cupy.cuda.get_current_stream().synchronize()
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "host_costs.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
