"""Host time per call at decode size: each op's Python path against a bare launch.

A decode step launches a few hundred small kernels whose GPU time is 2-3 us each, so
the host time of the Python wrapper (argument intake, the launcher's cached recipe,
the launch) sets the pace. For every op of the registry (the default model's shapes,
bf16, --num-tokens tokens, default 1) this reports host microseconds per call of:

* ``op``: the public function as a user calls it, with the arguments the registry's
  ``run`` passes it (captured once, so no dict lookups are timed; ``out``
  preallocated);
* ``RawKernel``: ``kernel(grid, block, args)``, the same ``cupy.RawKernel`` with the
  same grid, block and argument tuple, as ``launcher.recording()`` captured them;
* ``Function``: ``function(grid, block, args)``, its ``cupy.cuda.Function``, what the
  launcher itself calls;
* ``cupy x + y``: one CuPy elementwise op on float32 arrays of the op's row count x
  size, for scale.

The four are timed in alternating rounds (:data:`ROUNDS` rounds of ``--calls / ROUNDS``
back-to-back calls each, one stream sync at the end of each, after a warm-up); each
reports its median round. The ratios are the medians of the per-round ratios: the op
and its bare launch are timed one right after the other, so a slow stretch of the host
(other processes, frequency changes; the lent H200's host moved single timings by up
to 2x between runs) weighs on both sides of a ratio alike.

``op / RawKernel`` is the wrapper's overhead factor; the target is at most
:data:`TARGET_RATIO` (marked red above). This is a benchmark: ratios never fail the
run, only errors do (an op that raises or launches nothing: exit 1). ``--profile OP``
also prints cProfile's top functions over OP's calls.

    python bench/bench_host_overhead.py [--calls N] [--num-tokens N] [--profile OP] [--seed S] [--out DIR]
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time
import traceback
from pathlib import Path

import click
import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import DEFAULT_SEED, HELP_OPTIONS, require_gpu, save  # noqa: E402
import cupykern  # noqa: E402
from cupykern import _dtypes, environment, launcher, models, sweep  # noqa: E402
from cupykern.registry import all_specs  # noqa: E402

#: The acceptance target of issue "One launch path for every op": op / bare RawKernel.
TARGET_RATIO = 1.5
#: Untimed calls before the timed ones (compile, allocate, warm the caches).
WARMUP_CALLS = 20
#: Rounds the calls are split into, alternating between the callables timed.
ROUNDS = 40
DTYPE = _dtypes.bfloat16


def host_us_per_round(fns: dict, calls: int) -> dict:
    """Host microseconds per call of each ``fns[name]()`` in each of :data:`ROUNDS`
    rounds (``{name: [us per call of round 0, ...]}``): every round times every callable
    in turn over ``calls / ROUNDS`` back-to-back calls, one stream sync at the end,
    after :data:`WARMUP_CALLS` untimed calls of each."""
    per_round = max(1, calls // ROUNDS)
    for fn in fns.values():
        for _ in range(WARMUP_CALLS):
            fn()
    sweep.synchronize()
    rounds: dict = {name: [] for name in fns}
    for _ in range(ROUNDS):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(per_round):
                fn()
            sweep.synchronize()
            rounds[name].append((time.perf_counter() - t0) / per_round * 1e6)
    return rounds


def median_ratio(numerator: list, denominator: list) -> float:
    """The median over rounds of the per-round ratio (paired: same round, adjacent in time)."""
    return float(np.median(np.asarray(numerator) / np.asarray(denominator)))


def captured_call(spec, inputs):
    """``(function, args, kwargs)`` of the public op as ``spec.run(inputs)`` calls it.

    The registry's ``run`` adapters call ``<family module>.<op>(...)``; that attribute is
    wrapped for one run to record its arguments.
    """
    module = sys.modules[getattr(cupykern, spec.name).__module__]
    function = getattr(module, spec.name)
    seen = []

    def recorder(*args, **kwargs):
        seen.append((args, kwargs))
        return function(*args, **kwargs)

    setattr(module, spec.name, recorder)
    try:
        spec.run(inputs)
    finally:
        setattr(module, spec.name, function)
    if len(seen) != 1:
        raise RuntimeError(f"{spec.name}: the registry's run called the op {len(seen)} times, expected once")
    return function, *seen[0]


def captured_launch(spec, inputs) -> launcher.Launched:
    """The last launch of ``spec``'s op that ``spec.run(inputs)`` makes; RuntimeError if none."""
    with launcher.recording() as launched:
        spec.run(inputs)
    launch = sweep.last_launch(launched, spec.name)
    if launch is None:
        raise RuntimeError(f"{spec.name} launched no kernel of its own")
    return launch


def measure_op(spec, model, num_tokens: int, calls: int, seed: int) -> dict:
    """One point of the table: host us per call of the op, its bare RawKernel and
    Function launches and a CuPy add, the ratios, the launched plan and alloc_bytes."""
    import cupy

    spec = spec.for_model(model)
    size = spec.size_for_model(model)
    inputs = spec.make_inputs(np.random.default_rng(seed), num_tokens, size, DTYPE)
    if "out" in inputs and inputs["out"] is None:
        inputs["out"] = spec.run(inputs)[0]
    launch = captured_launch(spec, inputs)
    kernel, function, grid, block, args = launch.kernel, launch.function, launch.grid, launch.block, launch.args
    op, op_args, op_kwargs = captured_call(spec, inputs)
    x = cupy.ones(max(1, num_tokens * size), dtype=cupy.float32)
    y = cupy.ones_like(x)
    rounds = host_us_per_round({"op": lambda: op(*op_args, **op_kwargs), "kernel": lambda: kernel(grid, block, args),
                                "function": lambda: function(grid, block, args), "add": lambda: x + y}, calls)
    op_us, kernel_us, function_us, add_us = (float(np.median(rounds[k])) for k in ("op", "kernel", "function", "add"))
    return {"op": spec.name, "impl": "cupykern", "model": model.name, "dtype": _dtypes.short_name(DTYPE),
            "size": size, "num_tokens": num_tokens, "calls": calls, "op_us": op_us, "raw_kernel_us": kernel_us,
            "function_us": function_us, "cupy_add_us": add_us, "op_over_raw_kernel": median_ratio(rounds["op"], rounds["kernel"]),
            "op_over_function": median_ratio(rounds["op"], rounds["function"]),
            "alloc_bytes": sweep.alloc_bytes(lambda: spec.run(inputs)), **sweep.plan_fields(launch)}


def profile(spec, model, num_tokens: int, calls: int, seed: int) -> None:
    """Prints cProfile's top 25 functions (by own time) over ``calls`` calls of the op."""
    spec = spec.for_model(model)
    inputs = spec.make_inputs(np.random.default_rng(seed), num_tokens, spec.size_for_model(model), DTYPE)
    if "out" in inputs and inputs["out"] is None:
        inputs["out"] = spec.run(inputs)[0]
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        spec.run(inputs)
    profiler.disable()
    sweep.synchronize()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(25)


def _ratio_text(ratio: float) -> str:
    return f"[red]{ratio:.2f}[/]" if ratio > TARGET_RATIO else f"[green]{ratio:.2f}[/]"


def print_table(console: Console, points: list, title: str) -> None:
    """The points as a rich table, ratios above :data:`TARGET_RATIO` in red."""
    table = Table(title=title)
    columns = ("op", "size", "plan", "op us", "RawKernel us", "Function us", "op / RawKernel", "op / Function",
               "cupy x + y us")
    for column in columns:
        table.add_column(column, justify="left" if column in ("op", "plan") else "right")
    for p in points:
        table.add_row(p["op"], str(p["size"]), f"{p['plan_kind']} b{p['block_size']} g{p['grid']}", f"{p['op_us']:.2f}",
                      f"{p['raw_kernel_us']:.2f}", f"{p['function_us']:.2f}", _ratio_text(p["op_over_raw_kernel"]),
                      _ratio_text(p["op_over_function"]), f"{p['cupy_add_us']:.2f}")
    console.print(table)


def _op_name(ctx, param, value):
    if value is not None and value not in all_specs():
        raise click.BadParameter(f"unknown op {value!r}; known: {', '.join(all_specs())}")
    return value


@click.command(help=__doc__.splitlines()[0], context_settings=HELP_OPTIONS)
@click.option("--calls", type=click.IntRange(min=1), default=4000, show_default=True,
              help="timed back-to-back calls per measurement")
@click.option("--num-tokens", type=click.IntRange(min=1), default=1, show_default=True, help="rows of every op")
@click.option("--profile", "profile_op", callback=_op_name, default=None, help="an op to profile with cProfile")
@click.option("--seed", type=click.IntRange(min=0), default=DEFAULT_SEED, show_default=True, help="seed of the inputs")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None, help="also write the JSON here")
def main(calls, num_tokens, profile_op, seed, out) -> None:
    """Measures every op; exits 1 if one raised or launched nothing, 2 without a GPU or
    on bad arguments, else 0 (ratios above the target are reported, not failed)."""
    require_gpu("bench_host_overhead.py", "times kernel launches")
    model = models.get(models.DEFAULT_MODEL)
    console = Console(width=160)
    points, errors = [], []
    for name, spec in all_specs().items():
        try:
            points.append(measure_op(spec, model, num_tokens, calls, seed))
            if name == profile_op:
                profile(spec, model, num_tokens, calls, seed)
        except Exception as exc:  # noqa: BLE001 - one broken op must not hide the others' numbers
            errors.append({"op": name, "error": f"{exc.__class__.__name__}: {exc}",
                           "traceback": traceback.format_exc(limit=5)})
            console.print(f"[red]{name}: {exc.__class__.__name__}: {exc}[/]")
    env = environment.describe()
    print_table(console, points, f"host us per call, {num_tokens} token(s), {model.name}, bf16, {calls} calls, "
                                 f"on {env.get('gpu')} (target: op / RawKernel <= {TARGET_RATIO})")
    suite = "host_overhead" if num_tokens == 1 else f"host_overhead-{num_tokens}tokens"
    result = sweep.result_document(suite, environment=env, seed=seed, copy_gbps=None, points=points,
                                   model=model.name, calls=calls, target_ratio=TARGET_RATIO, errors=errors)
    console.print(f"saved {save(result, out)}")
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
