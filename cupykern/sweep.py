"""The sweep engine: which points to measure, how one is measured, and what ``--tune`` keeps.

One engine for ``cupykern sweep`` (cupykern/cli.py parses and prints), the benchmarks
(bench/bench_*.py) and the peers comparison (bench/peers.py), so every result file has
one schema (:func:`result_document`):

* a header: ``format`` (:data:`RESULT_FORMAT`), ``suite``, ``model``, ``seed``,
  ``copy_gbps`` and ``environment`` (GPU, driver, CuPy, commit, date:
  cupykern.environment.describe), plus what a suite adds;
* ``points``: one :class:`Point` each, fields :data:`POINT_FIELDS`.

Measuring a point (:func:`measure`): the registry's seeded inputs (an ``out`` argument
allocated once beforehand, so the timed calls allocate nothing); one call validated
against the float64 reference (cupykern.validation) with its launches recorded, so the
point reports the plan that was launched (:func:`cupykern.launcher.recording`), not a
prediction; one call to count the device memory it allocates (:func:`alloc_bytes`);
then the timing (:func:`time_call`): CUDA-graph replay up to :data:`DECODE_MAX_TOKENS`
tokens, cold-L2 CUDA events above.

Which launch options apply to an op, and whether ``--tune`` tunes it, come from the
op's declaration (``launcher.ops()[name].launch_options`` and ``.plan_kind``); the
plan rule (cupykern/plans.py) turns the options into a plan and rejects illegal
combinations with ValueError, which skips that point (:class:`Skipped`).

``--tune`` (row kernels): :func:`tune_configs` gives the candidate layouts,
:func:`tuned_entries` keeps one layout per (op, dtype, size) over the num_tokens ladder
(:func:`choose`); cupykern.tuning stores them.
"""

from __future__ import annotations

import contextlib
import csv
import itertools
import json
import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np

from cupykern import _dtypes, launcher, plans, timing, tuning
from cupykern.registry import OpSpec, all_specs
from cupykern.validation import CheckResult, check_op

#: Shapes of at most this many tokens are decode-sized: timed by CUDA-graph replay
#: (their kernels take a few microseconds, less than the host's launch path).
DECODE_MAX_TOKENS = 64
#: The ``format`` of every result file this engine writes.
RESULT_FORMAT = "cupykern-results/1"


# ----------------------------------------------------------------- the point schema
@dataclass
class Point:
    """One measured (op, implementation, shape, dtype, launch options) point.

    Units: microseconds (``*_us``: median and 10th/90th percentiles of the timed
    samples), bytes (``min_bytes``: each input read once and each output written once;
    ``alloc_bytes``: device memory one call leaves allocated, 0 when ``out`` is given),
    GB/s (``gbps`` = min_bytes / median), percent (``pct_of_copy``: gbps over a
    device-to-device copy measured in the same run). ``check`` is the validation's
    message ("ok" or why not), ``max_*_err`` the largest absolute, relative and ulp
    error against the float64 reference (None where not finite: a failed check). The
    plan fields (:data:`cupykern.plans.PLAN_FIELDS`) are those of the plan launched,
    None for another implementation (peers) or a field the plan's kind lacks.
    """

    op: str
    impl: str
    model: str | None
    dtype: str
    size: int
    num_tokens: int
    median_us: float
    p10_us: float
    p90_us: float
    method: str
    min_bytes: int
    gbps: float
    pct_of_copy: float
    check: str
    check_ok: bool
    max_abs_err: float | None
    max_rel_err: float | None
    max_ulp_err: float | None
    alloc_bytes: int
    plan_kind: str | None = None
    origin: str | None = None
    grid: int | None = None
    block_size: int | None = None
    vec_width: int | None = None
    threads_per_row: int | None = None
    vecs_per_thread: int | None = None
    rows_per_block: int | None = None
    threads_per_head: int | None = None
    head_slots: int | None = None
    tokens_per_block: int | None = None
    max_tokens: int | None = None
    num_splits: int | None = None
    grid_stride: bool | None = None
    exact: bool | None = None
    reread: bool | None = None

    def as_dict(self) -> dict:
        """The point as a JSON-ready dict (non-finite floats as None: JSON has no inf)."""
        return {k: _finite_or_none(v) for k, v in asdict(self).items()}


#: Every field of a point, in file and CSV column order.
POINT_FIELDS = tuple(f.name for f in fields(Point))
#: A point's plan fields when no launch of the op was recorded (another implementation).
NO_PLAN = dict.fromkeys(plans.PLAN_FIELDS)


def _finite_or_none(value):
    return None if isinstance(value, float) and not math.isfinite(value) else value


def make_point(spec: OpSpec, *, impl: str, model: str | None, num_tokens: int, size: int, dtype,
               timed: timing.Timing, checked: CheckResult, min_bytes: int, copy_gbps: float, alloc_bytes: int,
               plan_fields: dict | None = None) -> Point:
    """A :class:`Point` from its parts (``plan_fields``: a plan's ``fields()``, None: no plan)."""
    gbps = timing.gbps(min_bytes, timed)
    return Point(op=spec.name, impl=impl, model=model, dtype=_dtypes.short_name(dtype), size=size,
                 num_tokens=num_tokens, median_us=timed.median_us, p10_us=timed.p10_us, p90_us=timed.p90_us,
                 method=timed.method, min_bytes=min_bytes, gbps=gbps, pct_of_copy=100.0 * gbps / copy_gbps,
                 check=checked.message, check_ok=checked.ok, max_abs_err=_finite_or_none(checked.max_abs_err),
                 max_rel_err=_finite_or_none(checked.max_rel_err), max_ulp_err=_finite_or_none(checked.max_ulp_err),
                 alloc_bytes=int(alloc_bytes), **(plan_fields or NO_PLAN))


# ----------------------------------------------------------------- reading back what was launched
def last_launch(launched: list, op: str) -> launcher.Launched | None:
    """The last :class:`~cupykern.launcher.Launched` record of ``op`` in ``launched`` (a
    list filled by ``launcher.recording()``), or None if ``op`` launched nothing."""
    for record in reversed(launched):
        if record.op == op:
            return record
    return None


def plan_fields(launch: launcher.Launched | None) -> dict:
    """The plan fields of a point (:data:`cupykern.plans.PLAN_FIELDS`) from a recorded
    launch; all None without one."""
    return dict(NO_PLAN) if launch is None else launch.plan.fields()


# ----------------------------------------------------------------- measuring one point
def synchronize() -> None:
    """Waits for the current CUDA stream."""
    import cupy

    cupy.cuda.get_current_stream().synchronize()


def pool_bytes_in_use() -> int:
    """Bytes of CuPy's default device memory pool held by live arrays."""
    import cupy

    return cupy.get_default_memory_pool().used_bytes()


def alloc_bytes(call, bytes_in_use=None) -> int:
    """Device memory one ``call()`` allocates and still holds when it returns (its
    outputs; temporaries freed inside are not counted), in bytes: ``bytes_in_use()``
    (default: CuPy's default pool, :func:`pool_bytes_in_use`) after minus before, the
    stream synchronized first. CuPy's pool rounds each allocation up to 512 bytes, so a
    small output counts 512. Arrays from another allocator (a torch peer) need its own
    counter as ``bytes_in_use``."""
    bytes_in_use = bytes_in_use or pool_bytes_in_use
    synchronize()
    before = bytes_in_use()
    result = call()  # held until `after` is read: its outputs are what it allocated
    after = bytes_in_use()
    del result
    return after - before


def time_call(fn, num_tokens: int, repeat: int | None = None) -> timing.Timing:
    """GPU time of ``fn()``: graph replay up to :data:`DECODE_MAX_TOKENS` tokens, cold-L2
    events above; ``repeat`` timed samples (replays or calls; None: cupykern.timing's
    defaults)."""
    if num_tokens <= DECODE_MAX_TOKENS:
        return timing.time_graph(fn) if repeat is None else timing.time_graph(fn, replays=repeat)
    return timing.time_cold(fn) if repeat is None else timing.time_cold(fn, repeat=repeat)


def measure(spec: OpSpec, num_tokens: int, size: int, dtype, *, seed: int, copy_gbps: float, model=None,
            impl: str = "cupykern", run=None, repeat: int | None = None) -> Point:
    """Validates ``run`` (default: the op itself) against the float64 reference, then times it.

    ``spec``: the op's registry entry; ``model``: a cupykern.models preset whose
    constants are bound into the inputs (None: the registry's defaults); ``size``: the
    row size (hidden_size, d or head_dim); ``dtype``: a dtype or short name. ``run(inputs)``
    times another implementation of the op on the same inputs (a benchmark's
    composition), checked the same way first. ``repeat``: timed samples (see
    :func:`time_call`). The launch overrides in force (``launcher.overrides``) apply.

    Returns the :class:`Point`, its plan fields read back from the validated call's
    launches (None where ``run`` launched no kernel of this op). Raises what the call
    raises: ValueError for a launch configuration the plan rule rejects for this shape.
    """
    run = run or spec.run
    dtype = _dtypes.parse(dtype)
    bound = spec.for_model(model)
    inputs = bound.make_inputs(np.random.default_rng(seed), num_tokens, size, dtype)
    if "out" in inputs and inputs["out"] is None:
        first = bound.run(inputs)
        inputs["out"] = first[0]  # allocated once, outside the timed region and alloc_bytes
        if "scales" in inputs and inputs["scales"] is None:  # the per-token scales of the quant family
            inputs["scales"] = first[1]
    with launcher.recording() as launched:
        checked = check_op(bound.with_run(run), num_tokens, size, dtype, seed, inputs=inputs)
    allocated = alloc_bytes(lambda: run(inputs))
    timed = time_call(lambda: run(inputs), num_tokens, repeat)
    synchronize()
    return make_point(bound, impl=impl, model=getattr(model, "name", None), num_tokens=num_tokens, size=size,
                      dtype=dtype, timed=timed, checked=checked, min_bytes=bound.min_bytes(inputs),
                      copy_gbps=copy_gbps, alloc_bytes=allocated,
                      plan_fields=plan_fields(last_launch(launched, spec.name)))


# ----------------------------------------------------------------- which points
def launch_options(op: str) -> tuple[str, ...]:
    """The launch override keys ``op``'s plan rule takes (none for RoPE and the decode ops)."""
    return launcher.ops()[op].launch_options


def tunable(op: str) -> bool:
    """Whether ``--tune`` tunes ``op``: a row kernel (the tuned file holds row layouts)."""
    return launcher.ops()[op].plan_kind == "rows"


def crossed(options: dict) -> list[dict]:
    """Every combination of the option lists (``{key: [values] or None}``), as override
    dicts without the unset keys; ``[{}]`` when none is set."""
    lists = {k: v for k, v in options.items() if v}
    return [dict(zip(lists, combo)) for combo in itertools.product(*lists.values())]


def ignored_options(op: str, options: dict) -> list[str]:
    """The set option keys that ``op``'s plan rule does not take (they are not applied)."""
    return [k for k, v in options.items() if v and k not in launch_options(op)]


def candidate_configs(size: int, dtype, vec_width: int, *, vecs_choices=plans.VECS_PER_THREAD_CHOICES) -> list[dict]:
    """The default ``--tune`` search space for rows of ``size`` elements of ``dtype`` read
    ``vec_width`` at a time.

    Every threads_per_row that computes the row's reduction tree (plans.tree_threads_per_row)
    with the vecs_per_thread that goes with it, when that is one of ``vecs_choices``;
    rows_per_block giving blocks of MIN_BLOCK_SIZE (the heuristic's) and 256 threads.
    Every dict has the keys threads_per_row, vec_width, vecs_per_thread and rows_per_block.
    """
    configs = []
    for threads in plans.tree_threads_per_row(size, dtype):
        v = plans.tree_vecs_per_thread(size, dtype, threads)
        if v not in vecs_choices:
            continue
        blocks = sorted({b for b in (plans.MIN_BLOCK_SIZE, 256, threads)
                         if b >= threads and b % plans.WARP_SIZE == 0 and b <= plans.max_block_size(threads)})
        for block in blocks:
            configs.append(dict(threads_per_row=threads, vec_width=vec_width, vecs_per_thread=v,
                                rows_per_block=block // threads))
    return configs


def tune_configs(spec: OpSpec, size: int, dtype, *, model=None, seed: int = 0) -> list[dict]:
    """The launch configurations ``--tune`` measures for a row op: the op's own choice
    (``{}``) and :func:`candidate_configs` for the heuristic's vector width, each limited
    to the options the op takes (row_reduce does not take vecs_per_thread: its plan
    derives it from threads_per_row, as for every row op)."""
    dtype = _dtypes.parse(dtype)
    aligned = size % _dtypes.vec_width(dtype) == 0  # the registry's inputs are fresh contiguous arrays
    vec_width = _dtypes.vec_width(dtype) if aligned else 1
    takes = launch_options(spec.name)
    configs = [{k: v for k, v in c.items() if k in takes} for c in candidate_configs(size, dtype, vec_width)]
    return [{}] + configs


@dataclass(frozen=True)
class Case:
    """One point to measure: op, dtype, row size, num_tokens and the launch overrides
    asked for (``{}``: the op's own choice, tuned or heuristic)."""

    op: str
    dtype: np.dtype
    size: int
    num_tokens: int
    overrides: dict = field(default_factory=dict)

    def describe(self) -> str:
        """``rms_norm 8x4096 bf16 {'block_size': 64}``, for messages."""
        text = f"{self.op} {self.num_tokens}x{self.size} {_dtypes.short_name(self.dtype)}"
        return f"{text} {self.overrides}" if self.overrides else text


@dataclass(frozen=True)
class Skipped:
    """A case whose launch configuration the plan rule rejected (``reason``: its ValueError)."""

    case: Case
    reason: str


def plan_cases(ops, *, sizes: dict, dtypes, num_tokens, options: dict, tune: bool = False, model=None,
               seed: int = 0) -> list[Case]:
    """The cases of a sweep, in order op, dtype, size, configuration, num_tokens.

    ``sizes``: {op: [row sizes]}; ``options``: {override key: [values] or None} as
    given on the command line, each applied to the ops whose plan rule takes it and
    crossed. With ``tune`` and none of its own options set (another op's, such as the
    activations' ``grid_stride``, leave it be), a tunable op gets :func:`tune_configs`
    (which runs it: needs a GPU).
    """
    specs = all_specs()
    cases = []
    for op in ops:
        own = {k: v for k, v in options.items() if k in launch_options(op)}
        for dtype in map(_dtypes.parse, dtypes):
            for size in sizes[op]:
                if tune and tunable(op) and not any(own.values()):
                    configs = tune_configs(specs[op], size, dtype, model=model, seed=seed)
                else:
                    configs = crossed(own)
                cases += [Case(op, dtype, size, n, config) for config in configs for n in num_tokens
                          if specs[op].takes_tokens(n)]
    return cases


def run_cases(cases, *, seed: int, copy_gbps: float, model=None, repeat: int | None = None,
              ignore_tuned: bool = False) -> Iterator[Point | Skipped]:
    """Measures each case (:func:`measure` under its overrides); yields its Point, or
    Skipped where the plan rule rejects the overrides asked for. ``ignore_tuned``:
    plan without the tuned file (``--tune`` measures the heuristic as it is)."""
    specs = all_specs()
    with tuning.suspended() if ignore_tuned else contextlib.nullcontext():
        for case in cases:
            try:
                with launcher.overrides(**case.overrides):
                    point = measure(specs[case.op], case.num_tokens, case.size, case.dtype, seed=seed,
                                    copy_gbps=copy_gbps, model=model, repeat=repeat)
            except ValueError as exc:
                if not case.overrides:  # the op's own plan: a real error, not a configuration to skip
                    raise
                yield Skipped(case, str(exc))
                continue
            yield point


def current_device_id() -> int:
    """The current CUDA device's id."""
    import cupy

    return cupy.cuda.runtime.getDevice()


def current_device_limits() -> plans.DeviceLimits:
    """The plan limits (name, SMs, ...) of the current GPU; its name keys tuned entries."""
    return plans.DeviceLimits.of_device(current_device_id())


# ----------------------------------------------------------------- choosing (--tune)
@dataclass(frozen=True)
class Measured:
    """One validated timing of a row layout: what :func:`choose` ranks."""

    threads_per_row: int
    vec_width: int
    vecs_per_thread: int
    rows_per_block: int
    num_tokens: int
    median_us: float


def choose(measured, ladder, *, gpu: str, op: str, dtype: str, size: int, commit: str = "",
           date: str = "") -> tuning.TunedEntry | None:
    """The tuned entry for one (op, dtype short name, size) from validated timings, or None.

    A layout competes only if it was measured (and validated) at every num_tokens of
    ``ladder``. Its score is the mean over the ladder of its time (with its best
    rows_per_block) divided by the fastest time of any configuration at that
    num_tokens, so decode and prefill sizes weigh alike; the lowest score wins (ties:
    lowest total time), and its fastest rows_per_block is kept per num_tokens.
    """
    ladder = sorted(set(int(n) for n in ladder))
    best_at: dict = {}
    per_layout: dict = {}
    for m in measured:
        if m.num_tokens not in ladder:
            continue
        layout = (m.threads_per_row, m.vec_width, m.vecs_per_thread)
        best_at[m.num_tokens] = min(best_at.get(m.num_tokens, float("inf")), m.median_us)
        slot = per_layout.setdefault(layout, {})
        if m.num_tokens not in slot or m.median_us < slot[m.num_tokens][0]:
            slot[m.num_tokens] = (m.median_us, m.rows_per_block)
    ranked = []
    for layout, slot in per_layout.items():
        if set(slot) != set(ladder):
            continue
        score = sum(slot[n][0] / best_at[n] for n in ladder) / len(ladder)
        ranked.append((score, sum(slot[n][0] for n in ladder), layout))
    if not ranked:
        return None
    score, _, layout = min(ranked)
    slot = per_layout[layout]
    return tuning.TunedEntry(gpu=gpu, op=op, dtype=dtype, size=int(size), threads_per_row=layout[0],
                             vec_width=layout[1], vecs_per_thread=layout[2],
                             rows_per_block=tuple((n, slot[n][1]) for n in ladder), score=round(score, 4),
                             median_us=tuple((n, round(slot[n][0], 3)) for n in ladder), commit=commit, date=date)


def tuned_entries(points, ladder, *, gpu: str, commit: str = "", date: str = "") -> tuple[list, list]:
    """``(entries, untuned)`` from a ``--tune`` sweep's points (dicts or Points): one
    :class:`~cupykern.tuning.TunedEntry` per (op, dtype, size) of a row kernel whose
    validated points cover ``ladder``, and the (op, dtype, size) keys where none did."""
    measured: dict = {}
    for p in points:
        p = p.as_dict() if isinstance(p, Point) else p
        if p["plan_kind"] != "rows" or not p["check_ok"]:
            continue
        measured.setdefault((p["op"], p["dtype"], p["size"]), []).append(Measured(
            p["threads_per_row"], p["vec_width"], p["vecs_per_thread"], p["rows_per_block"], p["num_tokens"],
            p["median_us"]))
    entries, untuned = [], []
    for (op, dtype, size), ms in measured.items():
        entry = choose(ms, ladder, gpu=gpu, op=op, dtype=dtype, size=size, commit=commit, date=date)
        if entry is None:
            untuned.append((op, dtype, size))
        else:
            entries.append(entry)
    return entries, untuned


# ----------------------------------------------------------------- result files
def result_document(suite: str, *, environment: dict, seed: int, copy_gbps: float | None, points,
                    model: str | None = None, **extra) -> dict:
    """A result file's content: the header (see the module docstring), ``extra`` keys of
    the suite, and ``points`` (Points or dicts of :data:`POINT_FIELDS`)."""
    return {"format": RESULT_FORMAT, "suite": suite, "model": model, "seed": seed, "copy_gbps": copy_gbps,
            "environment": environment, **extra,
            "points": [p.as_dict() if isinstance(p, Point) else p for p in points]}


def write_json(path: Path, document: dict) -> Path:
    """Writes ``document`` as JSON (strict: no NaN or inf) to ``path``; returns it."""
    path = Path(path)
    path.write_text(json.dumps(document, indent=1, allow_nan=False) + "\n")
    return path


def write_csv(path: Path, points) -> Path:
    """Writes the points (Points or dicts), one row each with the :data:`POINT_FIELDS`
    columns, to ``path``; returns it."""
    path = Path(path)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(POINT_FIELDS), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(p.as_dict() if isinstance(p, Point) else p for p in points)
    return path
