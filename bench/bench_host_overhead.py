"""Host time per call at decode size: each op's Python path against a bare launch.

A decode step launches a few hundred small kernels whose GPU time is 2-3 us each, so
the host time of the Python wrapper (argument checks, planning, kernel lookup) sets
the pace. For every op of the registry at one token (the default model's shapes,
bf16) this reports host microseconds per call, averaged over many back-to-back calls
with one sync at the end:

* ``op``: the public function, as a user calls it (``registry`` inputs, ``out`` given);
* ``bare``: the same ``cupy.RawKernel`` with the same grid, block and arguments, as
  the op last launched it (captured by wrapping ``jit.get_kernel``);
* ``cupy x + y``: one CuPy elementwise op on a same-size array, for scale.

``op / bare`` is the wrapper's overhead factor (target: at most 1.5). ``--profile``
also prints cProfile's top functions for one op.

    python bench/bench_host_overhead.py [--calls N] [--profile OP] [--out DIR]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import DEFAULT_SEED, save  # noqa: E402
from cupykern import environment, jit, models  # noqa: E402
from cupykern.registry import all_specs  # noqa: E402


def host_us_per_call(fn, calls: int) -> float:
    import cupy

    for _ in range(20):
        fn()
    cupy.cuda.get_current_stream().synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    cupy.cuda.get_current_stream().synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def captured_launch(run, inputs):
    """``(kernel, grid, block, args)`` of the launch ``run(inputs)`` makes (its last one)."""
    real = jit.get_kernel
    seen = []

    class Recorder:
        def __init__(self, kernel):
            self.kernel = kernel

        def __call__(self, grid, block, args, **kw):
            seen.append((self.kernel, grid, block, args))
            return self.kernel(grid, block, args, **kw)

    jit.get_kernel = lambda *a: Recorder(real(*a))
    try:
        run(inputs)
    finally:
        jit.get_kernel = real
    return seen[-1]


def main() -> None:
    import cupy

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--num-tokens", type=int, default=1)
    parser.add_argument("--profile", default=None, help="an op to profile with cProfile")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    if not environment.gpu_available():
        parser.exit(2, "bench_host_overhead.py times kernel launches and needs a CUDA GPU\n")

    model = models.get(models.DEFAULT_MODEL)
    console = Console(width=140)
    rows = []
    for name, spec in all_specs().items():
        spec = spec.for_model(model)
        size = spec.size_for_model(model)
        inputs = spec.make_inputs(np.random.default_rng(DEFAULT_SEED), args.num_tokens, size, "bfloat16")
        if "out" in inputs:
            inputs["out"] = spec.run(inputs)[0]
        kernel, grid, block, kargs = captured_launch(spec.run, inputs)
        a = cupy.ones(max(1, size * args.num_tokens), dtype=cupy.float32)
        op_us = host_us_per_call(lambda: spec.run(inputs), args.calls)
        bare_us = host_us_per_call(lambda: kernel(grid, block, kargs), args.calls)
        cupy_us = host_us_per_call(lambda: a + a, args.calls)
        rows.append(dict(op=name, num_tokens=args.num_tokens, size=size, dtype="bf16", op_us=op_us, bare_us=bare_us,
                         cupy_add_us=cupy_us, ratio=op_us / bare_us))
        if name == args.profile:
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(args.calls):
                spec.run(inputs)
            profiler.disable()
            pstats.Stats(profiler).sort_stats("tottime").print_stats(25)

    env = environment.describe()
    table = Table(title=f"host us per call, {args.num_tokens} token(s), bf16, {args.calls} calls, on {env.get('gpu')}")
    for column in ("op", "size", "op us", "bare RawKernel us", "op / bare", "cupy x + y us"):
        table.add_column(column, justify="left" if column == "op" else "right")
    for r in rows:
        table.add_row(r["op"], str(r["size"]), f"{r['op_us']:.1f}", f"{r['bare_us']:.1f}", f"{r['ratio']:.2f}",
                      f"{r['cupy_add_us']:.1f}")
    console.print(table)
    save({"suite": "host_overhead", "seed": DEFAULT_SEED, "environment": env, "calls": args.calls, "points": rows},
         args.out)


if __name__ == "__main__":
    main()
