"""Plan rules: every choice of threads, vector width and grid lives here.

Pure functions of sizes, dtypes, alignment, device limits and explicit overrides (no
CuPy calls except reading a device's limits), so CPU tests check them against an
H200's limits built by hand. The launcher (cupykern/launcher.py) calls them once per
call signature and caches the result.

Row kernels (norm, softmax, row_reduce and the quant family's norm ops) reduce each row
with one fixed tree whose shape depends on the row size and dtype alone
(kernels_cu/cupykern/reduce.cuh; :func:`tree_columns` here): 16-byte leaves, J columns,
recursive halving. Any power-of-two ``threads_per_row`` P with ``vecs_per_thread`` A = J /
P (or A = 1 and P >= J) computes that tree, so a row's bits do not depend on the layout,
and the layout may follow the batch:

* :class:`RowLayout` fixes how the threads of one row read it (threads per row, vector
  width, tree columns per thread = leaves kept in registers). :func:`row_layout` chooses
  it from the row size, dtype, alignment and num_rows: many threads per row at decode
  sizes (one block streams the row), few at prefill sizes (several rows per block).
* :class:`RowPlan` adds rows per block and the grid.

The heuristics' constants are named below, each with the measurement behind it (or
saying that there is none yet). Overrides (``launcher.overrides``, used by sweeps) come
in as a dict; each plan rule names the keys it takes and rejects the others.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, fields, replace
from fractions import Fraction
from functools import lru_cache

import numpy as np

from cupykern import _arrays, _dtypes, tuning

WARP_SIZE = 32
#: Threads of a block on every CUDA GPU so far (sweeps check --block-size against it).
MAX_BLOCK_SIZE = 1024
#: Register-cache sizes a kernel is compiled for (vectors per thread).
VECS_PER_THREAD_CHOICES = (1, 2, 4, 8)
THREADS_PER_ROW_CHOICES = tuple(2**i for i in range(11))  # 1 .. 1024

#: Bytes of one leaf of the row reduction tree: a 16-byte element group, 16 / itemsize
#: elements (kernels_cu/cupykern/rows.cuh::leaf_width).
LEAF_BYTES = 16
#: Most columns of the tree (reduce.cuh::kMaxTreeColumns): 1024 threads x 2 columns. A
#: 1024-thread block has at most 64 registers per thread, and 1024 x 4 (four leaves
#: cached) spilled there with ptxas for sm_90 (rms_norm 14 bytes, layer_norm 16,
#: fused_add_rms_norm 28); 1024 x 2 does not. Rows of more leaves fold several leaves
#: per column, in order, and re-read the leaves past the first round.
MAX_TREE_COLUMNS = 2048
#: Up to this many rows a call is decode-sized: a block per row does not fill the GPU
#: anyway, so each row gets many threads (DECODE_VECS_PER_THREAD leaves each): every
#: load of the row is issued before the first barrier, and the row stays in registers.
DECODE_MAX_ROWS = 64
#: Tree columns per thread at decode sizes: 8192-element bf16 rows get 512 threads (16
#: warps), 16384-element rows 1024 threads. Measured against 1 and 4 (cupykern sweep
#: --vecs-per-thread 1,2,4, llama-3.1-8b and -70b bf16 at 1-64 tokens, H200,
#: bench/results/NOTES.md item 16): 2 was fastest for rms_norm, fused_add_rms_norm and
#: layer_norm at both sizes (1 token: 1.78 against 1.95 and 2.38 us at 4096 elements).
DECODE_VECS_PER_THREAD = 2
#: Most threads a row gets at decode sizes, per op (else MAX_BLOCK_SIZE): softmax, whose
#: two reductions and exponentials favour fewer, fuller threads, was fastest with 256 at
#: both sizes (8192 elements, 1 token: 3.99 us with 256 x 4 against 4.36 with 512 x 2;
#: 4096: 2.77 with 256 x 2 against 2.91 with 128 x 4; same item).
DECODE_MAX_THREADS_PER_ROW = {"softmax": 256}
#: Past DECODE_MAX_ROWS rows the decode layout is kept while the rows' threads (num_rows x
#: its threads_per_row) fill at most this share of the GPU's resident threads (sm_count x
#: max_threads_per_sm), per op (else DECODE_FILL_SHARE_DEFAULT): with few rows a wave the
#: prefill layout's fewer threads a row leave SMs idle. Measured on the H200 (cupykern
#: sweep --vecs-per-thread 1,2,4,8, llama-3.1-8b and -70b bf16, 128-4096 tokens, cold L2,
#: bench/results/NOTES.md item 25): at half a wave or less the decode layout was faster
#: for rms_norm (8b 256 tokens 5.65 against 6.61 us) and layer_norm (6.08 against 7.97),
#: at a full wave slower (rms_norm 70b 512 tokens 8.64 against 8.26); timed against the
#: former rule: rms_norm -8..-21 % at 128-512 rows of 8b, the FP8 norms -1..-25 %.
#: softmax: a quarter, with its exact walk (EXACT_WALK): llama-3.1-8b's 256 x 2 exact at
#: 128 / 256 rows 6.42-6.46 / 7.90-7.94 us against the prefill layout's 7.10-7.17 /
#: 8.64-8.74 (-9 %), but from 512 rows the prefill layout wins (9.50-9.65 against
#: 10.50-10.53; item 27). row_reduce keeps 0 (70b 128-256 rows -0..+8 % with 2); the
#: fused add keeps the decode layout at any size, its exact walk (EXACT_WALK: at most 2
#: leaves) faster at every size timed (8b 1024 tokens -9..-12 %, 70b 16384 tokens -2 %).
DECODE_FILL_SHARE = {"softmax": 0.25, "row_reduce": 0.0, "fused_add_rms_norm": float("inf")}
DECODE_FILL_SHARE_DEFAULT = 0.5
#: DECODE_FILL_SHARE's value for the decode layouts that fill their rows, per op: {op:
#: (share, fewest elements, most elements a row)}, for the layouts timed alone: 16-byte
#: vectors, DECODE_VECS_PER_THREAD = 2 leaves a thread, every leaf a whole one
#: (RowLayout.fills), at most FILLED_MOST_THREADS threads a row. rms_norm's 256 x 2
#: (llama-3.1-8b, 4096 elements) on an H100 (bench/results/NOTES.md, item 61,
#: rms_rows_probe.py, cold L2; bf16 and fp16) 1.1-12.0 % faster than the prefill layout
#: at 768-4096 rows; on an H200 (item 64, three runs in the peers order) 10-12 % at 2048,
#: 2.5-5.9 % at 1536, 2-3 % at 4096, level at 768-1024 (-5.5..+3.8 % run to run).
#: 512 threads a row (70b's rows of 8192, fp32 rows of 4096) keep the default half: on
#: the H200 70b's 512 x 2 was 2.9-8.0 % slower at 768 rows in four rounds (1.3 % on
#: average at 1024) though 0.9-11.4 % faster on the H100. Rows the decode layout fills
#: only in part (qwen2.5-7b's 3584, phi-3-mini's 3072) up to 11 % slower on the H100,
#: hence "fills"; layer_norm and softmax slower (not in the table).
DECODE_FILL_SHARE_FILLED = {"rms_norm": (4.0, 4096, 4096)}
FILLED_MOST_THREADS = 256
#: Tree columns per thread at prefill sizes (more rows than DECODE_MAX_ROWS): 4, so a
#: 4096-element bf16 row gets 128 threads (the layout before the tree) and an
#: 8192-element one 256. On the H200, 16384 x 8192 bf16 rms_norm ran at 91.1% of copy
#: with 256 x 4 (every leaf in registers, the layout chosen now), 91.5% with the former
#: 128 threads x 4 cached + 4 re-read (an order the tree does not allow), 84.9% with
#: 128 x 8 and 41.9% with 1024 x 1 (bench/results/2026-11-29_sweep-layouts_NVIDIA-H200_c9ef6e6.json).
PREFILL_VECS_PER_THREAD = 4
#: Most threads a row gets at prefill sizes, per op (else MAX_BLOCK_SIZE), as many leaves a
#: thread as that takes up to the compiled 8 (DECODE_MAX_THREADS_PER_ROW's counterpart).
#: rms_norm: 128. Measured on the H200 (cupykern sweep --vecs-per-thread, cold L2,
#: bench/results/NOTES.md item 26), 1024 / 4096 / 16384 tokens, 8 leaves a thread against
#: 4: llama-3.1-70b's 8192-element bf16 rows (128 against 256 threads, two runs)
#: 11.71-11.89 against 12.77-12.94 us, 33.23-33.28 against 33.84-33.90, 129.3-129.5
#: against 130.6; 5120-element rows (not a power of two of leaves) 11.70 against 10.35,
#: 23.47 against 25.36, 81.89 against 91.42 (twice more: +5..+13 % at 512-1024 tokens,
#: -3..-7 % at 2048-4096); fp32 rows of 4096 -1.0..-0.1 %; rows of 2048
#: leaves (16384 bf16, 8192 fp32: 256 against 512 threads) -2.9..+1.6 %. llama-3.1-8b's
#: 4096-element bf16 rows keep 128 x 4.
PREFILL_MAX_THREADS_PER_ROW = {"rms_norm": 128}
#: Smallest block: rows narrower than this many threads share a block.
MIN_BLOCK_SIZE = 128


def max_block_size(threads_per_row: int) -> int:
    """The block size a row kernel is compiled for (its __launch_bounds__), as
    kernels_cu/cupykern/rows.cuh::max_block_size."""
    return max(threads_per_row, 256)


#: The largest count a CUDA device attribute (a C int) can hold.
_INT32_MAX = _arrays.INT32_LIMIT - 1
_is_int, _count = _arrays.is_int, _arrays.count


@dataclass(frozen=True)
class DeviceLimits:
    """What a plan must respect on a device; built from the device or by hand in tests.

    Checked where it is built, so that every plan may read the fields as they are: each
    count a Python int from 1 to 2**31 - 1, as CUDA reports them (NumPy ints converted;
    ValueError naming the field for a float, a bool, None or a count out of that range: a
    NaN sm_count made a float grid, a negative one flipped the decode layout's test, a
    zero one divided, one past 2**1023 overflowed a float), ``name`` a str (TypeError)."""

    name: str
    sm_count: int
    max_threads_per_block: int = 1024
    max_grid_x: int = 2**31 - 1
    max_grid_y: int = 65535
    warp_size: int = WARP_SIZE
    max_threads_per_sm: int = 2048

    def __post_init__(self):
        if not isinstance(self.name, str):
            raise TypeError(f"limits.name: expected a str, got {type(self.name).__name__}")
        for field in fields(self):
            if field.name != "name":  # frozen: set through object's own __setattr__
                object.__setattr__(self, field.name,
                                   _count(getattr(self, field.name), f"limits.{field.name}", 1, _INT32_MAX))

    @staticmethod
    @lru_cache(maxsize=None)
    def of_device(device_id: int) -> "DeviceLimits":
        """The limits of GPU ``device_id`` (read once per device). RuntimeError without a GPU."""
        import cupy

        from cupykern import environment

        environment.check_gpu("DeviceLimits.of_device")

        device = cupy.cuda.Device(device_id)
        attrs = device.attributes
        props = cupy.cuda.runtime.getDeviceProperties(device.id)
        return DeviceLimits(
            name=props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"]),
            sm_count=attrs["MultiProcessorCount"],
            max_threads_per_block=attrs["MaxThreadsPerBlock"],
            max_grid_x=attrs["MaxGridDimX"],
            max_grid_y=attrs["MaxGridDimY"],
            warp_size=attrs["WarpSize"],
            max_threads_per_sm=attrs["MaxThreadsPerMultiProcessor"],
        )


#: An H200 SXM as CuPy reports it, for CPU tests of the planner.
H200_LIMITS = DeviceLimits(name="NVIDIA H200", sm_count=132)


class PlanError(ValueError):
    """A launch plan that cannot run: a layout, block or grid outside the kernel's or the
    device's limits, or a plan constant of this module set to a bad value. The ops'
    refusals of a shape they do not take stay plain ValueErrors, so a caller can tell the
    two apart (covering._picks: a heuristic plan that fails its own checks is a bug)."""


#: Launch overrides that are a choice, not a count: their values are True or False.
FLAG_OVERRIDE_KEYS = ("grid_stride",)


def check_override_keys(overrides: dict, allowed, what: str) -> None:
    """ValueError if ``overrides`` has keys ``what``'s plan rule does not take (never
    ignored), or a value that is not a positive int (a count of threads, rows or
    elements), or for :data:`FLAG_OVERRIDE_KEYS` not a bool."""
    unknown = sorted(set(overrides) - set(allowed), key=repr)  # keys of any type: {1: 2, "a": 3}
    if unknown:
        takes = ", ".join(sorted(allowed)) or "none"
        raise ValueError(f"launch overrides {unknown} do not apply to {what} (its plan takes: {takes})")
    for key, value in overrides.items():
        if key in FLAG_OVERRIDE_KEYS:
            if not isinstance(value, (bool, np.bool_)):
                raise ValueError(f"launch override {key}: expected True or False, got {value!r}")
        elif isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"launch override {key}: expected a positive int, got {value!r}")


def given_overrides(overrides: dict | None) -> dict:
    """``overrides`` (a dict, or None for none) without its None values; TypeError naming
    ``overrides`` for anything else (a list of pairs or a string would fail deep in a plan
    rule, helper 71)."""
    if overrides is None:
        return {}
    if not isinstance(overrides, dict):
        raise TypeError(f"overrides: expected a dict of launch overrides or None, got {overrides!r}")
    return {k: v for k, v in overrides.items() if v is not None}


def checked_overrides(overrides: dict | None, allowed, what: str) -> dict:
    """``overrides`` without its None values, checked (:func:`check_override_keys`), with
    NumPy ints and bools as Python ones (the plan rules do int arithmetic on them)."""
    overrides = given_overrides(overrides)
    check_override_keys(overrides, allowed, what)
    return {k: bool(v) if k in FLAG_OVERRIDE_KEYS else int(v) for k, v in overrides.items()}


def _pow2(n: int) -> bool:
    return n >= 1 and not n & (n - 1)


def _constant(name: str, allowed=None, lowest: int = 1, allowed_by: str = "", highest: int | None = None) -> int:
    """The plan constant ``name`` of this module (read now, so a sweep or test may set it),
    ValueError naming it unless an int (not a bool) in ``allowed`` (or >= ``lowest`` and,
    if given, <= ``highest``); ``allowed_by`` names the constant that lists ``allowed``, if
    one does."""
    value = globals()[name]
    if allowed is not None:
        legal = _is_int(value) and value in allowed
    else:
        legal = _is_int(value) and lowest <= value and (highest is None or value <= highest)
    if not legal:
        listed = f"plans.{allowed_by} " if allowed_by else ""
        bounds = f"an int in [{lowest}, {highest}]" if highest is not None else f"an int >= {lowest}"
        want = f"one of {listed}{tuple(allowed)}" if allowed is not None else bounds
        raise PlanError(f"plans.{name} must be {want}, got {value!r}")
    return int(value)


@dataclass(frozen=True)
class RowLayout:
    """How the threads of one row group read and reduce their row: ``vecs_per_thread``
    is the number of tree columns per thread (the leaves of the first round, kept in
    registers between passes), fixed by the row size and ``threads_per_row``
    (:func:`tree_vecs_per_thread`)."""

    threads_per_row: int
    vec_width: int
    vecs_per_thread: int
    warp_size: int = WARP_SIZE

    def template_args(self) -> tuple[int, int, int, int]:
        """(kThreadsPerRow, kVecWidth, kVecsPerThread, kWarpSize) of a row kernel."""
        return (self.threads_per_row, self.vec_width, self.vecs_per_thread, self.warp_size)

    def fills(self, hidden_size: int, dtype) -> bool:
        """Whether a row of ``hidden_size`` elements is exactly this layout's first round of
        whole leaves (every thread ``vecs_per_thread`` of them, nothing left): the row
        kernels' kExact, a leaf walk without bounds (kernels_cu/cupykern/rows.cuh)."""
        return bool(hidden_size == self.threads_per_row * self.vecs_per_thread * leaf_width(dtype))


#: Where each row op's kernel takes kExact, the leaf walk without bounds, when the layout
#: fills the row (RowLayout.fills): (most leaves a thread it is built for, most rows it is
#: taken for; None: any). The same bits either way; measured on the H200
#: (bench/results/NOTES.md, item 22): rms_norm 0.08-0.13 us less a call at 1-64 tokens and
#: 2.2-4.9 % less at 4096 (its 8-leaf walks compile without spills, untimed);
#: fused_add_rms_norm's and layer_norm's 4-leaf exact walks spill to local memory (fp16 12
#: bytes, fp32 8: test_jit_compile's spill check), so theirs stop at 2; softmax's was 0.06-
#: 0.17 us faster at 1-16 tokens but 20-27 % slower at 4096 (8b 128 x 4, 70b 256 x 4, 40
#: registers against 48; cause not found), so it takes it up to 256 rows: there 0-12 %
#: faster in every layout of llama-3.1-8b and -70b but one (70b's 256 x 4 at 256 rows,
#: -2..+4 %), and 8-17 % slower in their prefill layouts (8b 128 x 4, 70b 256 x 4) at
#: 512 rows (item 27).
EXACT_WALK = {"rms_norm": (8, None), "fused_add_rms_norm": (2, None), "layer_norm": (2, None),
              "softmax": (8, 256)}


def exact_choices(op: str, layout: RowLayout) -> tuple[bool, ...]:
    """The kExact values ``op``'s kernel is built for in ``layout`` (:data:`EXACT_WALK`)."""
    return (False, True) if layout.vecs_per_thread <= EXACT_WALK[op][0] else (False,)


def exact_walk(op: str, layout: RowLayout, num_rows: int, hidden_size: int, dtype) -> bool:
    """kExact for ``op``'s launch: the layout fills the row, the kernel is built with it and
    ``num_rows`` is within the op's limit (:data:`EXACT_WALK`)."""
    most_rows = EXACT_WALK[op][1]
    return bool(layout.fills(hidden_size, dtype) and True in exact_choices(op, layout)
                and (most_rows is None or num_rows <= most_rows))


#: Where an op's kernel reads its row again from L2 in pass 2 instead of holding it in
#: registers (kReread, kernels_cu/cupykern/rms_norm_rows.cuh): {op: (fewest rows, fewest
#: elements, most elements a row)}, in :func:`reread_layout`'s 2 leaves a thread
#: (Inductor's 16 elements a thread for 16-bit rows) where that layout fills the row (the
#: exact walk). Measured on the 132-SM H200 alone (cupykern sweep, cold L2;
#: bench/results/NOTES.md, item 28, call B): rms_norm from 8192 rows of llama-3.1-8b and
#: -70b (4096 and 8192 elements; bf16, and fp32 rows of 4096; fp16 untimed, the same bytes
#: and instructions as bf16's), 1.5-3.8 % faster than the prefill layout holding the row
#: in registers (70b bf16 at 16384 tokens 129.1 -> 125.8 us; against the fastest of every
#: layout holding it -3.8..+0.8 %): on sm_90 16-bit rows take 40-64 registers a thread holding
#: it and 32 rereading, so more threads are resident (fp32's 512 x 2 went 31 -> 32 and gained
#: anyway). At 4096 rows -1..+4 %, at 1024-2048 rows of 70b 3-8 % slower, where the fewer
#: resident threads still cover the latency. fp32 rows of 8192 gained 1.3-1.8 % in 512 x
#: 4, not built: those kernels ran under no sanitizer; in 2 leaves a thread (1024 x 2) they
#: took 6-20 % longer, hence REREAD_MAX_THREADS_PER_ROW. Not the fused add: rereading its
#: stored sum measured 0 to +1.2 % (call A).
REREAD = {"rms_norm": (8192, 4096, 8192)}
REREAD_MAX_THREADS_PER_ROW = 512


def reread_limits(op: str) -> tuple[int, int, int]:
    """REREAD[op] as (fewest rows, fewest elements, most elements), PlanError naming it
    unless REREAD is a dict of ops of REREAD_OPS holding ``op`` and the value is three
    ints >= 1 with fewest elements <= most."""
    table = _reread_table()
    if op not in table:
        raise PlanError(f"plans.REREAD has no entry for {op!r} (its ops: {sorted(table)})")
    value = table[op]
    if (not isinstance(value, tuple) or len(value) != 3 or not all(_is_int(v) and v >= 1 for v in value)
            or value[1] > value[2]):
        raise PlanError(f"plans.REREAD[{op!r}] must be (fewest rows, fewest elements, most elements): ints >= 1, "
                        f"the fewest elements at most the most, got {value!r}")
    return int(value[0]), int(value[1]), int(value[2])


#: The ops whose kernel has a kReread pass (rms_norm_rows.cuh: not the fused add's).
REREAD_OPS = ("rms_norm",)


def _reread_table() -> dict:
    """REREAD, PlanError unless a dict whose keys are ops of REREAD_OPS."""
    if not isinstance(REREAD, dict) or not set(REREAD) <= set(REREAD_OPS):
        raise PlanError(f"plans.REREAD must be a dict of op -> (fewest rows, fewest elements, most elements) "
                        f"with ops of {REREAD_OPS} (the kernels built with kReread), got {REREAD!r}")
    return REREAD


def reread_choices(op: str, layout: RowLayout, exact: bool) -> tuple[bool, ...]:
    """The kReread values ``op``'s kernel is built for in ``layout`` with kExact ``exact``:
    (False, True) where ``layout`` is on 16-byte vectors, walks without bounds, is
    :func:`reread_layout`'s for the row it fills, of the op's elements (:data:`REREAD`),
    and has at most REREAD_MAX_THREADS_PER_ROW threads a row; else (False,). Only rows
    the layout fills reread: the rows timed were such rows, and the bounded walk took
    49-64 registers, not 32."""
    if op not in _reread_table() or layout.vec_width == 1 or not exact:
        return (False,)
    _, fewest, most = reread_limits(op)
    built = (layout.vecs_per_thread == 2 and fewest <= 2 * layout.threads_per_row * layout.vec_width <= most
             and layout.threads_per_row <= _constant("REREAD_MAX_THREADS_PER_ROW", THREADS_PER_ROW_CHOICES))
    return (False, True) if built else (False,)


def _rereads_rows(op: str | None, num_rows: int, hidden_size: int) -> bool:
    """Whether ``num_rows`` rows of ``hidden_size`` elements are where ``op`` rereads (:data:`REREAD`)."""
    if op not in _reread_table():
        return False
    fewest_rows, fewest, most = reread_limits(op)
    return num_rows >= fewest_rows and fewest <= hidden_size <= most


def reread_layout(hidden_size: int, dtype, vec_width: int) -> RowLayout:
    """The layout of a rereading launch: 2 leaves a thread (a compiled layout for rows of
    2 to 2048 leaves; :func:`reread_choices` says where the kernel is built with kReread)."""
    threads = max(1, tree_columns(hidden_size, dtype) // 2)
    return RowLayout(threads, vec_width, tree_vecs_per_thread(hidden_size, dtype, threads))


def reread(op: str, layout: RowLayout, num_rows: int, hidden_size: int, dtype, exact: bool) -> bool:
    """kReread for ``op``'s launch with kExact ``exact``: the rows are where it rereads
    (:data:`REREAD`), the layout is :func:`reread_layout`'s (the one timed; other layouts
    hold their rows, also when a sweep overrides them), it fills the row and the kernel is
    built with it (:func:`reread_choices`, which builds it with the exact walk only)."""
    return bool(_rereads_rows(op, num_rows, hidden_size)
                and layout == reread_layout(hidden_size, dtype, layout.vec_width)
                and layout.fills(hidden_size, dtype) and True in reread_choices(op, layout, exact))


@dataclass(frozen=True)
class RowPlan:
    """How a row kernel is launched: the row layout, rows per block, the grid, whether the
    kernel walks its leaves without bounds (``exact``: kExact, :func:`exact_walk`) and
    whether it reads the row again from L2 in its second pass (``reread``: kReread,
    :func:`reread`)."""

    layout: RowLayout
    rows_per_block: int
    grid: tuple[int, int, int]
    origin: str  # "heuristic", "tuned" or "override"
    exact: bool = False
    reread: bool = False

    kind = "rows"
    shared_mem_bytes = 0

    @property
    def block_size(self) -> int:
        return self.layout.threads_per_row * self.rows_per_block

    @property
    def block(self) -> tuple[int, int, int]:
        return (self.block_size, 1, 1)

    def fields(self) -> dict:
        """The plan as flat fields of a sweep point (:data:`PLAN_FIELDS`)."""
        layout = self.layout
        return {**dict.fromkeys(PLAN_FIELDS), "plan_kind": self.kind, "origin": self.origin, "grid": self.grid[0],
                "block_size": self.block_size, "threads_per_row": layout.threads_per_row,
                "vec_width": layout.vec_width, "vecs_per_thread": layout.vecs_per_thread,
                "rows_per_block": self.rows_per_block, "exact": self.exact, "reread": self.reread}


#: Every field a plan of any kind reports (None where a kind has no such field).
PLAN_FIELDS = ("plan_kind", "origin", "grid", "block_size", "vec_width", "threads_per_row", "vecs_per_thread",
               "rows_per_block", "threads_per_head", "head_slots", "tokens_per_block", "max_tokens", "num_splits",
               "grid_stride", "exact", "reread")


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _pow2_floor(n: int) -> int:
    """The largest power of two <= n (n >= 1)."""
    return 1 << (n.bit_length() - 1)


def row_layouts(dtype) -> list[RowLayout]:
    """Every layout the row kernels are compiled for, for one storage dtype."""
    return [RowLayout(t, v, n) for t in THREADS_PER_ROW_CHOICES for v in sorted({1, _dtypes.vec_width(dtype)})
            for n in VECS_PER_THREAD_CHOICES]


def leaf_width(dtype) -> int:
    """Elements of ``dtype`` per leaf of the reduction tree (8 for 16-bit dtypes, 4 for fp32)."""
    return LEAF_BYTES // np.dtype(dtype).itemsize


def num_leaves(hidden_size: int, dtype) -> int:
    """Leaves of a row of ``hidden_size`` elements (the last one may be partial)."""
    return max(1, -(-hidden_size // leaf_width(dtype)))


def tree_columns(hidden_size: int, dtype) -> int:
    """J, the columns of the row's reduction tree: the leaf count rounded up to a power of
    two, at most MAX_TREE_COLUMNS (reduce.cuh)."""
    return min(_next_pow2(num_leaves(hidden_size, dtype)), MAX_TREE_COLUMNS)


def _one_leaf_per_column(hidden_size: int, dtype) -> bool:
    return tree_columns(hidden_size, dtype) == _next_pow2(num_leaves(hidden_size, dtype))


def tree_fits(hidden_size: int, dtype, threads_per_row: int, vecs_per_thread: int) -> bool:
    """Whether P threads with A columns each compute the row's tree: P * A = J always; for
    a row of at most MAX_TREE_COLUMNS leaves (one leaf per column) also any P * A > J (the
    extra columns hold the identity only, and halving over them is exact) and P * A = J / 2
    (two leaves per column, folded in order: exactly the tree's first halving stage)."""
    columns = tree_columns(hidden_size, dtype)
    width = threads_per_row * vecs_per_thread
    if _one_leaf_per_column(hidden_size, dtype):
        return width >= columns or 2 * width == columns
    return width == columns


def tree_vecs_per_thread(hidden_size: int, dtype, threads_per_row: int) -> int:
    """The planner's vecs_per_thread for ``threads_per_row``: J / P (every leaf of a row of
    one leaf per column in registers), or 1 when P >= J; J / 2P when J / P is past the
    compiled choices and the tree allows it (:func:`tree_fits`). A compiled layout only
    if the result is in VECS_PER_THREAD_CHOICES."""
    vecs = max(1, tree_columns(hidden_size, dtype) // threads_per_row)
    if vecs > max(VECS_PER_THREAD_CHOICES) and _one_leaf_per_column(hidden_size, dtype):
        vecs //= 2
    return vecs


def tree_threads_per_row(hidden_size: int, dtype) -> tuple[int, ...]:
    """Every compiled threads_per_row that computes the row's tree with its
    :func:`tree_vecs_per_thread`, up to 1024."""
    return tuple(t for t in THREADS_PER_ROW_CHOICES
                 if tree_vecs_per_thread(hidden_size, dtype, t) in VECS_PER_THREAD_CHOICES)


def tree_layouts(hidden_size: int, dtype, aligned: bool) -> list[RowLayout]:
    """Every layout the row kernels are compiled for that gives rows of ``hidden_size``
    elements the tree's bits: each threads_per_row of :func:`tree_threads_per_row`, each
    vector width the alignment allows."""
    widths = sorted({1, _dtypes.vec_width(dtype)}) if aligned else [1]
    return [RowLayout(t, v, tree_vecs_per_thread(hidden_size, dtype, t))
            for t in tree_threads_per_row(hidden_size, dtype) for v in widths]


def _dtype_and_alignment(dtype, aligned) -> tuple[np.dtype, bool]:
    """``dtype`` as a supported NumPy dtype and ``aligned`` as a bool, TypeError naming
    either otherwise (a bare KeyError of the plan tables, or "no" read as True)."""
    return _dtypes.check_supported(dtype, "dtype"), _arrays.flag(aligned, "aligned")


def _check_op(op) -> None:
    """TypeError unless ``op`` is an op name (str) or None."""
    if op is not None and not isinstance(op, str):
        raise TypeError(f"op: expected an op name (str) or None, got {op!r}")


#: The ops whose launches :func:`plan_rows` plans (ops/norm.py, softmax.py, row_reduce.py,
#: quant.py: the registered ops of plan_kind "rows", a test holds the two equal): the keys
#: the per-op tables below may have, so a misspelt one is refused rather than ignored.
ROW_OPS = ("rms_norm", "fused_add_rms_norm", "layer_norm", "softmax", "row_reduce", "rms_norm_quant",
           "fused_add_rms_norm_quant", "rms_norm_dynamic_per_token_quant",
           "fused_add_rms_norm_dynamic_per_token_quant")


def _row_op_keys(table: str, mapping: dict) -> None:
    """PlanError naming plans.<table> if ``mapping`` has a key that is not of ROW_OPS."""
    unknown = [op for op in mapping if op not in ROW_OPS]
    if unknown:
        raise PlanError(f"plans.{table} has entries for ops no row kernel plans: {unknown!r} (the row ops: {ROW_OPS})")


def _per_op_constant(table: str, op: str | None, default: str, convert, expected: str):
    """convert(value) of the per-op plan constant plans.<table> (a dict) for ``op``; an op
    it does not name gets plans.<default>. ValueError naming the constant the value came
    from unless the table is a dict keyed by ops of :data:`ROW_OPS` and convert accepts the value (returns other than
    None; ``expected`` says what it accepts). Read at each plan, so a sweep or test may
    set them; the ops keep each shape's plan, so after setting one call
    ``launcher.clear_caches()`` (helper 111)."""
    mapping = globals()[table]
    if not isinstance(mapping, dict):
        raise PlanError(f"plans.{table} must be a dict of op -> {expected}, got {mapping!r}")
    _row_op_keys(table, mapping)
    named = op in mapping
    value = mapping[op] if named else globals()[default]
    converted = convert(value)
    if converted is None:
        raise PlanError(f"plans.{f'{table}[{op!r}]' if named else default} must be {expected}, got {value!r}")
    return converted


def _compiled_threads_per_row(value) -> int | None:
    return int(value) if _is_int(value) and value in THREADS_PER_ROW_CHOICES else None


def _share(value) -> float | None:
    """A real number >= 0 (inf: any size) as a float, else None."""
    if not isinstance(value, numbers.Real) or isinstance(value, (bool, np.bool_)):
        return None
    try:
        share = float(value)
    except OverflowError:
        return None
    return share if share >= 0 else None


def _decode_max_threads_per_row(op: str | None) -> int:
    """DECODE_MAX_THREADS_PER_ROW[op] (MAX_BLOCK_SIZE for an op it does not name)."""
    return _per_op_constant("DECODE_MAX_THREADS_PER_ROW", op, "MAX_BLOCK_SIZE", _compiled_threads_per_row,
                            f"one of {THREADS_PER_ROW_CHOICES}")


def _decode_fill_share(op: str | None) -> float:
    """DECODE_FILL_SHARE[op] (DECODE_FILL_SHARE_DEFAULT for an op it does not name)."""
    return _per_op_constant("DECODE_FILL_SHARE", op, "DECODE_FILL_SHARE_DEFAULT", _share, "a number >= 0")


def _filled_table() -> dict:
    """DECODE_FILL_SHARE_FILLED with every entry checked (whichever op or row is planned,
    so a bad entry cannot wait for the rows it names): PlanError naming the constant or
    the entry unless a dict of op name (of :data:`ROW_OPS`) -> (share >= 0, fewest
    elements, most elements), the counts ints >= 1, the fewest at most the most."""
    table = DECODE_FILL_SHARE_FILLED
    if not isinstance(table, dict) or not all(isinstance(op, str) for op in table):
        raise PlanError(f"plans.DECODE_FILL_SHARE_FILLED must be a dict of op name -> (share, fewest elements, "
                        f"most elements), got {table!r}")
    _row_op_keys("DECODE_FILL_SHARE_FILLED", table)
    for op, value in table.items():
        if (not isinstance(value, tuple) or len(value) != 3 or _share(value[0]) is None
                or not all(_is_int(v) and v >= 1 for v in value[1:]) or value[1] > value[2]):
            raise PlanError(f"plans.DECODE_FILL_SHARE_FILLED[{op!r}] must be (share, fewest elements, most elements): "
                            f"a number >= 0, then ints >= 1, the fewest at most the most, got {value!r}")
    return table


def _fill_share(op: str | None, layout: RowLayout, hidden_size: int, dtype) -> float:
    """The share of resident threads up to which ``op`` keeps its decode ``layout`` past
    DECODE_MAX_ROWS rows: DECODE_FILL_SHARE_FILLED's where ``layout`` is of those timed
    (16-byte vectors, 2 leaves a thread filling the row of ``hidden_size`` elements within
    the entry's, at most FILLED_MOST_THREADS threads), else :func:`_decode_fill_share`."""
    table = _filled_table()
    most_threads = _constant("FILLED_MOST_THREADS", THREADS_PER_ROW_CHOICES)
    default = _decode_fill_share(op)  # checked here too, as on rows the entry does not name (helper 107)
    if op in table and layout.vec_width > 1 and layout.vecs_per_thread == 2 and layout.fills(hidden_size, dtype):
        share, fewest, most = table[op]
        if fewest <= hidden_size <= most and layout.threads_per_row <= most_threads:
            return _share(share)
    return default


def _prefill_max_threads_per_row(op: str | None) -> int:
    """PREFILL_MAX_THREADS_PER_ROW[op] (MAX_BLOCK_SIZE for an op it does not name)."""
    return _per_op_constant("PREFILL_MAX_THREADS_PER_ROW", op, "MAX_BLOCK_SIZE", _compiled_threads_per_row,
                            f"one of {THREADS_PER_ROW_CHOICES}")


def _device_limits(limits) -> DeviceLimits:
    """``limits``, TypeError unless a DeviceLimits (whose counts its constructor checked)."""
    if not isinstance(limits, DeviceLimits):
        raise TypeError(f"limits: expected a plans.DeviceLimits, got {type(limits).__name__}")
    return limits


def _fixed_block(limits, block_size: int, what: str) -> DeviceLimits:
    """``limits`` (checked as :func:`_device_limits`), PlanError unless a kernel written
    for 32-lane warps in blocks of ``block_size`` threads (``what``) fits them."""
    limits = _device_limits(limits)
    if limits.warp_size != WARP_SIZE:
        raise PlanError(f"{what} are written for {WARP_SIZE}-lane warps; the device's are {limits.warp_size}")
    if block_size > limits.max_threads_per_block:
        raise PlanError(f"{what} take blocks of {block_size} threads; the device's hold at most "
                        f"{limits.max_threads_per_block}")
    return limits


def _row_threads_cap(limits: DeviceLimits) -> int:
    """The most threads a row may take on ``limits``: its max_threads_per_block within
    MAX_BLOCK_SIZE, rounded down to a power of two (THREADS_PER_ROW_CHOICES are powers of
    two)."""
    return _pow2_floor(min(MAX_BLOCK_SIZE, limits.max_threads_per_block))


def row_layout(hidden_size: int, dtype, aligned: bool, *, num_rows: int, op: str | None = None,
               limits: DeviceLimits = H200_LIMITS) -> RowLayout:
    """Heuristic layout for ``num_rows`` rows of ``hidden_size`` elements of ``dtype`` on a
    GPU of ``limits`` (default: an H200's).

    16-byte vectors when ``aligned``; DECODE_VECS_PER_THREAD tree columns per thread (at
    most DECODE_MAX_THREADS_PER_ROW[op] threads a row) up to DECODE_MAX_ROWS rows, and
    beyond while the rows' threads fill at most DECODE_FILL_SHARE[op] of the GPU's
    resident threads (DECODE_FILL_SHARE_FILLED[op]'s share for the filled layouts it
    names); PREFILL_VECS_PER_THREAD otherwise (threads_per_row = J / that, at
    most PREFILL_MAX_THREADS_PER_ROW[op], within the compiled range), but where ``op``
    reads its rows again from L2 (:data:`REREAD`'s rows, 16-byte vectors) 2 leaves a
    thread (:func:`reread_layout`) if that layout fills the row with the exact walk, has at
    most REREAD_MAX_THREADS_PER_ROW and ``limits.max_threads_per_block`` threads a row
    (:func:`reread_choices`); otherwise the prefill layout. No layout takes more threads a
    row than ``limits.max_threads_per_block`` (a row whose leaves need more raises
    PlanError in :func:`validate`). Every choice computes the same tree, so the rows' bits
    do not depend on ``num_rows``. An unsupported ``dtype``, or ``aligned`` not a bool,
    raises TypeError naming it; a bad plan constant PlanError naming it, at any shape.
    """
    hidden_size, num_rows = _count(hidden_size, "hidden_size", 1), _count(num_rows, "num_rows", 0)
    dtype, aligned = _dtype_and_alignment(dtype, aligned)  # public: None read as float64 (helper 111)
    _check_op(op)
    decode_rows = _constant("DECODE_MAX_ROWS", lowest=0)
    decode, prefill = (_constant(name, VECS_PER_THREAD_CHOICES)
                       for name in ("DECODE_VECS_PER_THREAD", "PREFILL_VECS_PER_THREAD"))
    vec_width = _dtypes.vec_width(dtype) if aligned else 1
    columns = tree_columns(hidden_size, dtype)
    limits = _device_limits(limits)
    resident = limits.sm_count * limits.max_threads_per_sm
    # Never fewer threads than the compiled leaves a thread allow, whatever the cap; never
    # more than a block of the device holds.
    fewest = max(1, columns // max(VECS_PER_THREAD_CHOICES))
    block_cap = _row_threads_cap(limits)

    def threads_for(per_thread: int, most: int) -> int:
        return min(block_cap, max(fewest, min(most, columns // per_thread)))

    threads = threads_for(decode, _decode_max_threads_per_row(op))
    decode_layout = RowLayout(threads, vec_width, tree_vecs_per_thread(hidden_size, dtype, threads))
    # Every constant the choice below reads is read at every shape, so a bad value never
    # waits for the rows that reach it (helper 111: a decode-only caller never saw one).
    fill_share = _fill_share(op, decode_layout, hidden_size, dtype)
    prefill_threads = threads_for(prefill, _prefill_max_threads_per_row(op))
    rereads = _rereads_rows(op, num_rows, hidden_size)
    if num_rows > decode_rows and num_rows * threads > fill_share * resident:
        threads = prefill_threads
        if vec_width > 1 and rereads:
            layout = reread_layout(hidden_size, dtype, vec_width)
            exact = exact_walk(op, layout, num_rows, hidden_size, dtype)
            if layout.threads_per_row <= block_cap and reread(
                    op, layout, num_rows, hidden_size, dtype, exact):
                return layout
        return RowLayout(threads, vec_width, tree_vecs_per_thread(hidden_size, dtype, threads))
    return decode_layout


def default_rows_per_block(threads_per_row: int) -> int:
    """Rows per block of the heuristic: blocks of MIN_BLOCK_SIZE threads, or one row."""
    return max(1, MIN_BLOCK_SIZE // threads_per_row)


def validate(plan: RowPlan, dtype, aligned: bool, limits: DeviceLimits, hidden_size: int) -> RowPlan:
    """Returns ``plan`` if it can run on rows of ``hidden_size`` elements and gives them
    the tree's bits, else raises PlanError (a ValueError) saying what is wrong."""
    limits = _device_limits(limits)
    layout = plan.layout
    if layout.threads_per_row not in THREADS_PER_ROW_CHOICES:
        raise PlanError(f"threads_per_row must be one of {THREADS_PER_ROW_CHOICES}, got {layout.threads_per_row}")
    allowed = (1, _dtypes.vec_width(dtype)) if aligned else (1,)
    if layout.vec_width not in allowed:
        why = "" if aligned else " (the arrays are not 16-byte aligned)"
        raise PlanError(f"vec_width must be one of {allowed} for {_dtypes.short_name(dtype)}{why}, got {layout.vec_width}")
    if layout.warp_size != limits.warp_size:
        raise PlanError(f"layout warp size {layout.warp_size} != device warp size {limits.warp_size}")
    if not _pow2(plan.rows_per_block):
        raise PlanError(f"rows_per_block must be a power of two, got {plan.rows_per_block}")
    block = plan.block_size
    most = min(limits.max_threads_per_block, max_block_size(layout.threads_per_row))
    if block > most or block % limits.warp_size:
        raise PlanError(
            f"block size threads_per_row * rows_per_block = {block} must be a multiple of "
            f"{limits.warp_size} and at most {most}")
    columns = tree_columns(hidden_size, dtype)
    fits = tree_threads_per_row(hidden_size, dtype)
    what = f"rows of {hidden_size} {_dtypes.short_name(dtype)} elements (a reduction tree of {columns} columns)"
    if layout.threads_per_row not in fits:
        raise PlanError(f"threads_per_row {layout.threads_per_row} cannot compute the tree of {what}: "
                         f"threads_per_row must be one of {fits}")
    if layout.vecs_per_thread not in VECS_PER_THREAD_CHOICES:
        raise PlanError(f"vecs_per_thread must be one of {VECS_PER_THREAD_CHOICES}, got {layout.vecs_per_thread}")
    if not tree_fits(hidden_size, dtype, layout.threads_per_row, layout.vecs_per_thread):
        want = tree_vecs_per_thread(hidden_size, dtype, layout.threads_per_row)
        more = " (or more, or half)" if _one_leaf_per_column(hidden_size, dtype) else ""
        raise PlanError(f"vecs_per_thread must be {want}{more} with threads_per_row {layout.threads_per_row} for "
                         f"{what}, got {layout.vecs_per_thread}")
    if not 1 <= plan.grid[0] <= limits.max_grid_x:
        raise PlanError(f"grid {plan.grid} exceeds the device limit {limits.max_grid_x}")
    return plan


def _row_grid(num_rows: int, rows_per_block: int, limits: DeviceLimits) -> tuple[int, int, int]:
    # Blocks walk the rows grid-stride (rows.cuh), so the grid may stop at the limit.
    return (min(max(1, -(-num_rows // rows_per_block)), limits.max_grid_x), 1, 1)


def _tuned_plan(op: str, num_rows: int, hidden_size: int, dtype, aligned: bool,
                limits: DeviceLimits) -> RowPlan | None:
    """The plan from the user's tuned file (cupykern/tuning.py) for ``op`` on this GPU, or
    None: no entry, a vectorised entry for unaligned rows, or a layout that does not
    validate (one written before the reduction tree may not compute it). A bucket's
    rows_per_block that does not validate gives way to the default one, so whether the
    tuned layout applies never depends on ``num_rows``."""
    entry = tuning.lookup(op, _dtypes.short_name(dtype), hidden_size, limits.name)
    if entry is None or (entry.vec_width > 1 and not aligned):
        return None
    if entry.threads_per_row not in THREADS_PER_ROW_CHOICES:  # a hand-edited file: fall back
        return None
    layout = RowLayout(entry.threads_per_row, entry.vec_width, entry.vecs_per_thread)
    default = default_rows_per_block(layout.threads_per_row)
    for rows_per_block in dict.fromkeys((entry.rows_per_block_for(num_rows) or default, default)):
        try:
            return validate(RowPlan(layout, rows_per_block, _row_grid(num_rows, rows_per_block, limits), "tuned"),
                            dtype, aligned, limits, hidden_size)
        except ValueError:
            continue
    return None


#: Launch overrides the row kernels take. ``block_size`` sets
#: ``rows_per_block = block_size / threads_per_row`` (excludes ``rows_per_block``).
ROW_OVERRIDE_KEYS = ("threads_per_row", "vec_width", "vecs_per_thread", "rows_per_block", "block_size")


def plan_rows(num_rows: int, hidden_size: int, dtype, *, aligned: bool, limits: DeviceLimits,
              op: str | None = None, overrides: dict | None = None) -> RowPlan:
    """Plan for a row kernel (rms_norm, fused_add_rms_norm, layer_norm, softmax, row_reduce,
    the quant family's norm ops).

    ``overrides`` (keys :data:`ROW_OVERRIDE_KEYS`) replace the heuristic's choices; a
    threads_per_row without vecs_per_thread takes the tree's (:func:`tree_vecs_per_thread`),
    a vecs_per_thread alone the threads_per_row that goes with it. The result is
    validated (ValueError, also for a layout that would not compute the row's tree;
    TypeError for an ``op`` that is not a name, for ``overrides`` neither a dict nor None).
    With ``op`` and no override, an entry of the tuned file for (op, dtype, hidden_size,
    ``limits.name``) is used first (origin ``"tuned"``); otherwise the heuristic
    :func:`row_layout`, which follows ``num_rows``. Every valid plan gives a row the same
    bits. ``exact`` is :func:`exact_walk`'s answer for an ``op`` of :data:`EXACT_WALK`, else
    False (the kernel's bounded walk); ``reread`` is :func:`reread`'s: only on REREAD's
    rows in :func:`reread_layout`'s layout, whatever chose it (an overridden or tuned
    layout that is that one rereads; any other holds its row).
    """
    dtype = _dtypes.check_supported(dtype, "dtype")  # exact_walk and reread below take it too ("bf16")
    plan = _plan_row_launch(num_rows, hidden_size, dtype, aligned=aligned, limits=limits, op=op, overrides=overrides)
    if op in EXACT_WALK:
        plan = replace(plan, exact=exact_walk(op, plan.layout, num_rows, hidden_size, dtype))
    return replace(plan, reread=reread(op, plan.layout, num_rows, hidden_size, dtype, plan.exact))


def _plan_row_launch(num_rows: int, hidden_size: int, dtype, *, aligned: bool, limits: DeviceLimits,
                     op: str | None, overrides: dict | None) -> RowPlan:
    """:func:`plan_rows` up to the walk: the tuned, overridden or heuristic launch."""
    limits = _device_limits(limits)
    overrides = checked_overrides(overrides, ROW_OVERRIDE_KEYS, op or "a row kernel")
    hidden_size, num_rows = _count(hidden_size, "hidden_size", 1), _count(num_rows, "num_rows", 0)
    dtype, aligned = _dtype_and_alignment(dtype, aligned)
    _check_op(op)
    if op is not None and not overrides:
        tuned = _tuned_plan(op, num_rows, hidden_size, dtype, aligned, limits)
        if tuned is not None:
            return tuned
    layout = row_layout(hidden_size, dtype, aligned, num_rows=num_rows, op=op, limits=limits)
    threads, vecs = overrides.get("threads_per_row"), overrides.get("vecs_per_thread")
    if threads is None and vecs in VECS_PER_THREAD_CHOICES:
        threads = min(MAX_BLOCK_SIZE, max(1, tree_columns(hidden_size, dtype) // vecs))
    elif threads is None and vecs is not None:
        threads = layout.threads_per_row  # validate names the bad vecs_per_thread
    if threads is not None:
        layout = replace(layout, threads_per_row=threads,
                         vecs_per_thread=vecs if vecs is not None else tree_vecs_per_thread(hidden_size, dtype, threads))
    if "vec_width" in overrides:
        layout = replace(layout, vec_width=overrides["vec_width"])
    rows_per_block = overrides.get("rows_per_block")
    block_size = overrides.get("block_size")
    if block_size is not None:
        if rows_per_block is not None:
            raise ValueError("block_size and rows_per_block set the same thing (block size = threads_per_row x "
                             "rows_per_block); give one of them")
        if block_size % layout.threads_per_row or not _pow2(block_size // layout.threads_per_row):
            raise ValueError(f"block size {block_size} is not threads_per_row {layout.threads_per_row} times a power "
                             f"of two (rows_per_block = block_size / threads_per_row)")
        rows_per_block = block_size // layout.threads_per_row
    default = default_rows_per_block(layout.threads_per_row)
    if rows_per_block is None:
        rows_per_block = default
    origin = "override" if overrides else "heuristic"
    return validate(RowPlan(layout, rows_per_block, _row_grid(num_rows, rows_per_block, limits), origin),
                    dtype, aligned, limits, hidden_size)


# ----------------------------------------------------------------- activation family
# act_and_mul_kernel (kernels_cu/activation.cu) is elementwise: no reduction order to
# protect, so its plan is just a block size, a vector width and a grid over (row,
# chunk) work items, a chunk being block_size consecutive vectors of one row: a block
# per item where the grid's limits allow it (rows up to max_grid_y), rows are whole
# vectors and either one wave holds every item or the vectors are 16 bytes wide; else
# one wave walking them grid-stride.

#: The gated kernels' __launch_bounds__ (cupykern/gated_rows.cuh::kActMaxBlockSize).
ACTIVATION_MAX_BLOCK_SIZE = 1024
#: Default block: 256 threads, one 16-byte vector of gate and of up each (at most 256
#: threads of 4- or 8-byte vectors at decode sizes, _narrow_vector_plan). Eight such
#: blocks fill an SM's 2048 threads with 64 KiB of loads in flight, above the ~25 KiB
#: per SM that covers HBM latency at an H200's 4.8 TB/s (bandwidth x ~700 ns / 132 SMs).
#: At prefill sizes on the block-per-item grid against 1024 threads (cupykern sweep
#: --block-size, bf16, H200, bench/results/NOTES.md item 26): silu_and_mul within 0.6 %,
#: gelu_and_mul 9-10 % faster with 256 at 4096 and 16384 tokens of llama-3.1-8b.
ACTIVATION_BLOCK_SIZE = 256
#: Decode-sized work (fewer chunks than SMs) of 16-byte vectors halves the block down to
#: this, spreading the few vectors over more SMs (the narrow-vector plan of decode sizes
#: does not). 128 against 32, 64 and 256 (cupykern sweep --block-size, llama-3.1-70b bf16,
#: H200, bench/results/NOTES.md item 16): 1.49, 1.54, 1.50 and 1.58 us for silu_and_mul
#: at 1 token, 1.90, 2.39, 2.00 and 1.93 at 16.
ACTIVATION_MIN_BLOCK_SIZE = 128


@dataclass(frozen=True)
class ActivationPlan:
    """How act_and_mul_kernel is launched: a 1-D block, a vector width and a grid, 1-D
    walked grid-stride (``grid_stride``, kGridStride) or (chunks_per_row, num_rows)."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    vec_width: int
    origin: str  # "heuristic" or "override"
    grid_stride: bool

    kind = "activation"
    shared_mem_bytes = 0

    @property
    def block_size(self) -> int:
        return self.block[0]

    def fields(self) -> dict:
        """The plan as flat fields of a sweep point (:data:`PLAN_FIELDS`); ``grid`` counts
        the blocks launched (x times y)."""
        return {**dict.fromkeys(PLAN_FIELDS), "plan_kind": self.kind, "origin": self.origin,
                "grid": self.grid[0] * self.grid[1], "block_size": self.block_size, "vec_width": self.vec_width,
                "grid_stride": self.grid_stride}


#: Outputs a row of act_and_mul_kernel must stay below: its in-row indices are 32-bit
#: (cupykern/gated_rows.cuh), and a vector's end index, i + vec_width, must not wrap.
ACTIVATION_MAX_ROW = 2**31 - 16
#: Launch overrides the activation kernel takes (``grid_stride``: True for the 1-D
#: grid-stride walk, False for a block per work item).
ACTIVATION_OVERRIDE_KEYS = ("block_size", "vec_width", "grid_stride")


def activation_vec_widths(dtype) -> tuple[int, ...]:
    """Elements per access act_and_mul_kernel is built for: 1, and 4-, 8- and 16-byte vectors."""
    widest = _dtypes.vec_width(dtype)
    return tuple(sorted({1, max(1, widest // 4), widest // 2, widest}))


def activation_decode_vec_widths(dtype) -> tuple[int, ...]:
    """The narrower vectors of decode sizes, in the order :func:`_narrow_vector_plan` tries
    them: 4-byte ones where they hold 2 elements or more (16-bit dtypes), then 8-byte ones."""
    widest = _dtypes.vec_width(dtype)
    return tuple(w for w in (widest // 4, widest // 2) if w >= 2)


def _activation_block(slots_per_row: int, widest: int, limits: DeviceLimits) -> int:
    """As many threads as a row's vectors, a power of two from one warp, at most ``widest``."""
    return min(widest, max(limits.warp_size, _next_pow2(slots_per_row)))


def _resident_blocks(limits: DeviceLimits, block_size: int) -> int:
    """Blocks of ``block_size`` threads one wave holds on the device (at least one an SM)."""
    return limits.sm_count * max(1, limits.max_threads_per_sm // block_size)


def activation_chunks(num_rows: int, d: int, block_size: int, vec_width: int) -> int:
    """Work items of act_and_mul_kernel: rows x ceil(ceil(d / vec_width) / block_size)."""
    slots_per_row = -(-d // vec_width)
    return num_rows * -(-slots_per_row // block_size)


def _narrow_vector_plan(num_rows: int, d: int, dtype, most: int,
                        limits: DeviceLimits) -> tuple[int, int, int] | None:
    """(vec_width, block_size, chunks_per_row) of narrower vectors on the block-per-item
    grid for 16-byte aligned rows (:func:`activation_decode_vec_widths`): quarter-width
    ones (4 bytes: 2 elements of a 16-bit dtype, as Inductor takes at one token; not for
    fp32, where they would be single elements, unmeasured) where their grid fills at most
    half a wave of resident blocks, else half-width ones (8 bytes) where theirs fits one
    wave; None where neither covers d exactly or fits the grid's limits. The block is as many threads as
    vectors rounded up to a power of two from one warp, then capped at
    ACTIVATION_BLOCK_SIZE and ``most`` (the device's block limit).

    Measured on the H200 (bench/results/NOTES.md): 8-byte against 16-byte vectors, 0.02-0.15
    us less a call at 1-64 tokens of llama-3.1-8b and -70b (item 20); 4-byte against 8-byte
    (item 22, two calls), at one token 0.01-0.09 us less for gelu_and_mul and 0.03-0.06 for
    silu_and_mul of 70b (8b's: within the noise), at 16 tokens of 8b (448 blocks) 0.00-0.05
    less, but 0.05-0.08 us more for 70b's gelu_and_mul at 16 tokens, whose 896 blocks fill
    85 % of a wave: hence half a wave for them."""
    if num_rows == 0 or num_rows > limits.max_grid_y:
        return None
    widest = min(_constant("ACTIVATION_BLOCK_SIZE", (32, 64, 128, 256, 512, 1024)), most)
    for narrow in activation_decode_vec_widths(dtype):
        waves = 0.5 if narrow * np.dtype(dtype).itemsize == 4 else 1.0
        if d % narrow:
            continue
        block_size = _activation_block(-(-d // narrow), widest, limits)
        chunks_per_row = activation_chunks(1, d, block_size, narrow)
        if num_rows * chunks_per_row <= waves * _resident_blocks(limits, block_size) \
                and chunks_per_row <= limits.max_grid_x:
            return narrow, block_size, chunks_per_row
    return None


def plan_activation(num_rows: int, d: int, dtype, *, aligned: bool, limits: DeviceLimits,
                    overrides: dict | None = None, op: str = "act_and_mul") -> ActivationPlan:
    """Plan for act_and_mul_kernel (silu_and_mul, gelu_and_mul, swiglu) on rows of ``d`` outputs.

    Where every row is a whole number of 4-byte vectors (16-bit dtypes) whose grid fills
    at most half a wave of resident blocks, or of 8-byte vectors (half the 16-byte width)
    that fit one wave (decode sizes), and neither ``block_size`` nor ``vec_width`` is
    overridden nor ``grid_stride`` forced True: those vectors, a block per (row, chunk)
    item (grid (chunks_per_row, num_rows), ``grid_stride`` False), as many threads as
    vectors up to ACTIVATION_BLOCK_SIZE (:func:`_narrow_vector_plan`).
    Else 16-byte vectors when ``aligned``; ACTIVATION_BLOCK_SIZE threads, fewer for narrow
    rows (no more threads than vectors, a power of two from one warp) and halved down
    to ACTIVATION_MIN_BLOCK_SIZE while there are fewer work items than SMs; a block per
    item where the grid fits ``limits.max_grid_y`` (rows) and ``limits.max_grid_x``
    (chunks of a row) and d is a multiple of the vector width (that kernel has no scalar
    tail), and either one wave holds every item or the vectors are 16 bytes wide (at any
    number of items); else one wave of blocks (at most
    ``limits.max_grid_x``) walks the items grid-stride, as it does for zero rows
    whatever the override (nothing is launched then). ``overrides`` (keys
    :data:`ACTIVATION_OVERRIDE_KEYS`: ``block_size``, ``vec_width``, and ``grid_stride``
    to force either grid) replace the heuristic's choices; the result is validated:
    ValueError for a bad override, for ``grid_stride=False`` on a grid past the device's
    limits, or with a d that is not a multiple of ``vec_width``; TypeError for
    ``overrides`` neither a dict nor None.
    """
    overrides = checked_overrides(overrides, ACTIVATION_OVERRIDE_KEYS, op)
    limits = _device_limits(limits)
    num_rows, d = _count(num_rows, "num_rows", 0), _count(d, "d", 1)
    dtype, aligned = _dtype_and_alignment(dtype, aligned)
    if d >= ACTIVATION_MAX_ROW:
        raise ValueError(f"d: expected 1 .. {ACTIVATION_MAX_ROW - 1} outputs a row (the kernel's in-row indices are "
                         f"32-bit), got {d}")
    block_size, vec_width = overrides.get("block_size"), overrides.get("vec_width")
    origin = "override" if overrides else "heuristic"
    allowed = activation_vec_widths(dtype) if aligned else (1,)
    if vec_width is None:
        vec_width = allowed[-1]
    if vec_width not in allowed:
        why = "" if aligned else " (the arrays are not 16-byte aligned)"
        raise ValueError(f"vec_width must be one of {allowed} for {_dtypes.short_name(dtype)}{why}, got {vec_width}")
    if block_size is None:
        slots_per_row = -(-d // vec_width)
        sizes = (32, 64, 128, 256, 512, 1024)
        widest, narrowest = (_constant(name, sizes) for name in ("ACTIVATION_BLOCK_SIZE", "ACTIVATION_MIN_BLOCK_SIZE"))
        block_size = _activation_block(slots_per_row, widest, limits)
        while (block_size > narrowest
               and activation_chunks(num_rows, d, block_size, vec_width) < limits.sm_count):
            block_size //= 2
    most = min(limits.max_threads_per_block, ACTIVATION_MAX_BLOCK_SIZE)
    if not 0 < block_size <= most or block_size % limits.warp_size:
        raise PlanError(f"block_size must be a multiple of {limits.warp_size} and at most {most}, got {block_size}")
    grid_stride = overrides.get("grid_stride")
    if grid_stride is not True and not {"vec_width", "block_size"} & set(overrides):
        # vec_width is the 16-byte width where the rows are aligned, else 1 (no narrower one)
        narrow = _narrow_vector_plan(num_rows, d, dtype, most, limits) if vec_width > 1 else None
        if narrow is not None:  # decode sizes: 4- or 8-byte vectors, a block per item
            vec_width, block_size, chunks_per_row = narrow
            return ActivationPlan((chunks_per_row, num_rows, 1), (block_size, 1, 1), vec_width, origin, False)
    chunks_per_row = activation_chunks(1, d, block_size, vec_width)
    chunks = num_rows * chunks_per_row
    resident = _resident_blocks(limits, block_size)
    fits_2d = num_rows <= limits.max_grid_y and chunks_per_row <= limits.max_grid_x
    whole_vectors = d % vec_width == 0  # the block-per-item kernel has no scalar tail
    if grid_stride is None:
        # A block per item where one wave holds every item, and with 16-byte vectors at
        # any number: 3.5-6 % faster than the walk at 1024-16384 tokens (silu_and_mul 70b
        # at 16384: 679.5 -> 640.9 us, 103 % of copy). The scalar path's block per item
        # was 9-10 % slower there (bench/results/NOTES.md item 26): it walks past a wave.
        sixteen_bytes = vec_width == _dtypes.vec_width(dtype)
        grid_stride = not ((chunks <= resident or sixteen_bytes) and fits_2d and whole_vectors)
    elif not grid_stride and not fits_2d:
        raise ValueError(f"grid_stride=False launches a (chunks_per_row, num_rows) grid: {chunks_per_row} x "
                         f"{num_rows} exceeds the device's {limits.max_grid_x} x {limits.max_grid_y}")
    elif not grid_stride and not whole_vectors and num_rows > 0:
        raise ValueError(f"grid_stride=False needs d a multiple of vec_width (the block-per-item kernel has no "
                         f"scalar tail): d = {d}, vec_width = {vec_width}; pass a vec_width that divides d "
                         f"(1 always does)")
    if not grid_stride and num_rows > 0:
        # A block per chunk, no walk: the walk's divisions and loop came before the
        # first load (bench/results/NOTES.md, item 18).
        return ActivationPlan((chunks_per_row, num_rows, 1), (block_size, 1, 1), vec_width, origin, False)
    # One wave of resident blocks walking the chunks grid-stride: rows past the grid's
    # limits, rows with a scalar tail, scalar rows past a wave, and zero rows (nothing
    # is launched then).
    grid = (max(1, min(chunks, resident, limits.max_grid_x)), 1, 1)
    return ActivationPlan(grid, (block_size, 1, 1), vec_width, origin, True)


# ----------------------------------------------------------------- rope family
# apply_rope_kernel and qk_rms_norm_rope_kernel (kernels_cu/rope.cu) give each head a
# group of threads_per_head threads (one "unit" of vec_width pairs each), head_slots
# groups per token walking its heads, tokens_per_block tokens per block. A thread
# loads its cos/sin once per token and reuses them for the heads it walks, so more
# heads per thread means fewer cache reads, fewer threads means fewer blocks.

#: __launch_bounds__ of both kernels (rope.cu::kRopeMaxBlockSize).
ROPE_MAX_BLOCK_SIZE = 256
#: Heads a thread rotates per token once there are enough tokens to fill the GPU: 4
#: reuses each cos/sin load 4 times (the Llama-3 shape, 32 + 8 heads, splits evenly
#: into 10 slots) and keeps ~1000 threads x 32 bytes of q/k loads in flight per SM at
#: the 64 registers apply_rope_kernel is held to, above the ~25 KiB per SM that covers
#: HBM latency on an H200 (bandwidth x ~700 ns / 132 SMs). Not yet tuned by a
#: measurement in bench/results.
ROPE_HEADS_PER_THREAD = 4
#: Decode-sized batches (fewer tokens than this many per SM) give each head its own
#: slot instead, spreading the few tokens' work over more threads.
ROPE_MIN_TOKENS_PER_SM = 4
#: Kernel layout: "wide" (apply_rope_wide_kernel / qk_rms_norm_rope_wide_kernel: a
#: thread requests all of its heads' q/k vectors before it waits on the position and
#: cos/sin, and stores after) or "steps" (apply_rope_kernel / qk_rms_norm_rope_kernel:
#: one head (16-byte vectors) or two between stores, one position -> cos/sin -> q/k
#: -> store chain after another). Same bits either way (tests/test_rope_layouts.py).
ROPE_LAYOUT = "wide"
#: kHeadsPerThread choices of apply_rope_wide_kernel (compiled for each).
ROPE_WIDE_HEADS_CHOICES = (2, 3, 4, 5)
#: The wide layout's heads per thread (_rope_wide_heads): at prefill sizes each op takes
#: the choice from ROPE_WIDE_HEADS_PER_THREAD (apply_rope) / ROPE_WIDE_NORM_HEADS_PER_THREAD
#: (qk_rms_norm_rope) up whose 256-thread block of whole tokens would be fullest (the
#: blocks launched then fill ROPE_WIDE_BLOCK_THREADS); at decode sizes (fewer than
#: ROPE_MIN_TOKENS_PER_SM tokens per SM: more threads on the few tokens) the fewest from
#: ROPE_WIDE_DECODE_HEADS_PER_THREAD up; either among the choices that give every head of
#: a token a slot in one block, else the steps kernel (the wide kernels hold one round of
#: heads only). Measured (bench_rope.py --variants, llama-3.1-8b bf16, H200, cold L2,
#: bench/results/NOTES.md item 15): qk_rms_norm_rope 110 us with 4 against 135 us with 2
#: at 16,384 tokens; at 1-64 tokens 2 heads beat 4 (2.1 against 2.3 us). In one round
#: (item 31): 8b 4 heads (101 us) over 3 (106), 70b 3 (189 us) over 4 (219); item 33: 8b
#: 5 heads (a full block) over 4 by 10 % at 1024 tokens, 1-2 % at 16384, level at 4096
#: (4-12 % with rotary_dim 64), 70b 3 over 5 (0.9 of a block) by 3-8 %.
ROPE_WIDE_HEADS_PER_THREAD = 2
ROPE_WIDE_NORM_HEADS_PER_THREAD = 3
ROPE_WIDE_DECODE_HEADS_PER_THREAD = 2
#: kHeadsPerThread choices of qk_rms_norm_rope_wide_kernel (compiled for each; in 16-bit
#: 2 to 5 heads fit its 128 registers without a spill, rope.cu::kQkWideMinBlocksPerSm;
#: fp32's 5 heads with pass-through dims spill 20-80 bytes).
ROPE_WIDE_NORM_HEADS_CHOICES = (2, 3, 4, 5)
#: The most heads a thread qk_rms_norm_rope plans for fp32 q/k, whatever the constants
#: (the 5-heads fp32 kernel with pass-through dims spills; 5 were measured in bf16 only).
ROPE_WIDE_NORM_FP32_MOST_HEADS = 4
#: qk_rms_norm_rope's choices from this many heads a thread up are taken at prefill only
#: where they fill the block (every thread slot holds a head): at 119-128 registers an SM
#: holds 2 of their blocks, where 3 of the 192-thread blocks of 3 heads fit (96 registers),
#: so llama-3.1-70b's 72 heads at 5 (0.9 of a block) lost 3-8 % to 3 (item 33).
ROPE_WIDE_NORM_FULL_BLOCK_HEADS = 5
#: The wide layout's grid, apply_rope and qk_rms_norm_rope: 0 = a block per group of
#: tokens_per_block tokens (the hardware hands out blocks as others finish); n >= 1 = at
#: most n waves of resident blocks, walking the tokens grid-stride. Measured as above:
#: qk_rms_norm_rope at 16,384 tokens 101 us in 2 waves against 110 us in a block per 3
#: tokens; apply_rope 170 us against 159 us (4 heads).
ROPE_WIDE_GRID_WAVES = 0
ROPE_WIDE_NORM_GRID_WAVES = 2
#: Threads a block of the wide kernels fills with whole tokens (at least one token a block,
#: however many threads it takes; fewer tokens where ceil(num_tokens / SMs) is fewer).
#: apply_rope 64: one token a block for llama-3.1-8b's 40 heads at 5 a thread (64 threads)
#: and 70b's 72 (120 of 128); its 256-thread blocks filled with 4 (8b) or 2 (70b) tokens
#: took 3.0 / 3.9 % longer at 16,384 tokens, 3.6 / 4.0 % at 8192, 1.0 / 2.9 % at 4096, 0 /
#: 1.2-1.9 % at 1024-2048. qk_rms_norm_rope 128: two tokens of 8b (4 blocks an SM, in its
#: 2 waves), one of 70b (192 threads); 8b's 4-token blocks took 2.8 / 2.9 / 0.4 % longer
#: at 4096 / 8192 / 16,384 tokens, and a block per token group without waves up to 8 %
#: (8b) and 12 % (70b) longer than 2 waves. Measured on the H200, bf16
#: (bench/results/NOTES.md, item 34); in threads, not tokens, so that models of few heads
#: (SmolLM2-135M: 16 threads a token at prefill) still fill whole warps (those sizes untimed).
ROPE_WIDE_BLOCK_THREADS = 64
ROPE_WIDE_NORM_BLOCK_THREADS = 128
#: Heads a thread at which qk_rms_norm_rope's plan launches rope.cu's token kernel (one
#: token a block, a block per token, no token loop and no guards: the wide kernel's bits)
#: instead of the wide kernel, at any batch size, where its shape is full
#: (:func:`_rope_token_full`: bf16 in 16-byte vectors, full rotary with one unit a lane,
#: every slot holding this many heads, whole warps of at least 64 threads a token).
#: Measured on the H200 (bf16): at prefill sizes (cold L2, bench/results/NOTES.md item 38,
#: calls E and J) llama-3.1-8b's 5 heads 11.7 / 6.0 / 5.5 % less than the wide kernel at
#: 1024 / 4096 / 16384 tokens, -70b's 3 heads 12 / 6 / 3 % less; at decode sizes (graph
#: replay, item 39, call B) 8b's 2 heads 1.79 / 1.86 / 1.91 us at 1 / 16 / 64 tokens against
#: 2.18 / 2.27 / 2.33, 70b's 3 heads 2.06 / 2.16 / 2.24 against 2.65 / 2.72 / 2.81. fp16's
#: 5 heads spill 16 bytes under the kernel's 96 registers (fp16 untimed: it keeps the wide
#: kernel); SmolLM2-135M's 32-thread tokens keep it too (the rule wants 64 threads a token).
ROPE_NORM_TOKEN_HEADS = (2, 3, 5)
#: The same for apply_rope's token kernel, at decode sizes (fewer than
#: ROPE_MIN_TOKENS_PER_SM tokens an SM), in place with one position a token (no M-RoPE):
#: the wide layout's heads a thread where the shape is full (:func:`_rope_token_full`:
#: 16-bit in 16-byte vectors, one unit a lane, 8 to 32 lanes a head; dims past rotary_dim
#: are not touched in place): llama-3.1-8b 2 heads (160 threads), -70b 3 (192). Measured on
#: the H200 (bf16, graph replay, bench/results/NOTES.md item 39, call A): 8b 1.59 / 1.65 /
#: 1.74 us at 1 / 16 / 64 tokens against the wide kernel's 1.83 / 1.91 / 1.97, 70b 1.81 /
#: 1.90 / 2.02 against 1.92 / 2.03 / 2.16; cold L2 at 256 tokens 8b -3 %, 70b level. At
#: prefill sizes it was level or slower (8b's 5 heads +1.1 % at 16384 tokens, 70b's 3 heads
#: +3 % at 1024): the wide kernel there, except in the prefill layout's heads below
#: ROPE_TOKEN_MAX_TOKENS_PER_SM tokens an SM, and in the window (ROPE_TOKEN_WINDOW_*).
ROPE_TOKEN_HEADS = (2, 3, 5)
#: apply_rope's token kernel also runs past the decode sizes, below this many tokens an SM
#: (1,584 tokens on 132 SMs), in the prefill layout's heads a thread where the shape is
#: full as above: llama-3.1-8b's 5 heads (64 threads a token), gemma-2-9b's 3 (16 lanes a
#: head, 128 threads); -70b's 72 heads do not split into 5s and keep the wide kernel.
#: Measured (bf16, cold L2, bit for bit the wide kernel's; bench/results/NOTES.md item 44,
#: two runs on an H100): 8b 3.1-3.6 / 5.6-6.3 / 4.9-5.3 % less than the wide kernel at 768 /
#: 1024 / 1536 tokens, gemma 7.7-8.5 / 1.6-2.3 / 1.9-3.4 %; from 2048 tokens 0.5-1.7 % (item
#: 43: 2 % more at 16384). On the H200 8b's was level at 1024 (9.63-9.65 against 9.60-9.71
#: us, item 39 call A; 1536 and gemma untimed there), so the rule costs the H200 nothing
#: measured and gains the H100 its 3-6 %. fp16 untimed in this band. What the token kernel
#: drops is the wide kernel's token loop and guards.
ROPE_TOKEN_MAX_TOKENS_PER_SM = 12
#: The token kernel runs again from this many tokens an SM to below
#: ROPE_TOKEN_WINDOW_TO_TOKENS_PER_SM (2,244-3,035 tokens on 132 SMs; an empty window where
#: neither this end nor the 8-lane end below is past the start), where the prefill layout's
#: heads fill it, and there in the decode layout's heads where those fill it too
#: (llama-3.1-8b 2 heads in 160 threads, gemma-2-9b 2 in 192). A block per token leaves a
#: last wave of blocks on some SMs only:
#: 8b's 5-heads token kernel holds 12 blocks an SM by its 76 registers (80 since item 59,
#: the same 12; 1,584 tokens a wave), and past one wave it gains where the last wave is
#: at least 0.4 full and the waves are fewer than about two (items 49-50: 8b's 5 heads
#: 2.5-5.9 % less than the wide kernel on both cards at 2,224-2,864 tokens, -2.3..+2.4 %
#: at 1,712-2,096, past the first end).
#: The decode heads, measured against the prefill heads and the wide kernel (bf16, cold L2,
#: bit for bit the wide kernel's; bench/results/NOTES.md items 51-52, six H100 runs and two
#: H200 runs): in the window 8b 0.2-1.8 % faster than its 5 heads on the H100 and 0.5 %
#: faster to 0.8 % slower on the H200, gemma's 2 heads 0.1 % slower to 2.6 % faster than its
#: 3; at 2,904 tokens both 1.8-4.7 % less than the wide kernel on both cards, at 3,100
#: gemma's gain falls under 2 % on both (1.8-2.3 %), so the window ends at 23 by item 44's
#: rule (one card gains 2 % in every run, the other loses no more than 1 %; decode heads of
#: 8 lanes have their own end, below). fp16 and the other shapes the token kernel fills
#: (12-96 heads) untimed there; those whose decode heads do not fill it (80 heads of 128, 40
#: of 256: 3 heads a thread in 27 or 14 slots hold 81 or 42) keep the prefill heads, untimed
#: from 22 tokens an SM.
ROPE_TOKEN_WINDOW_FROM_TOKENS_PER_SM = 17
ROPE_TOKEN_WINDOW_TO_TOKENS_PER_SM = 23
#: The window's end where its decode heads are 8 lanes a head (rotary_dim 128, 16-bit;
#: llama-3.1-8b's 2 heads in 160 threads): 2,244-4,091 tokens on 132 SMs. Measured against
#: the wide kernel (bf16, cold L2, bit for bit its bytes; bench/results/NOTES.md item 52,
#: calls 1, 5 and 6, two runs a card): 8b 2.0-4.2 % less on the H200 from 3,100 to 3,960
#: tokens (1.4-2.1 % at 3,036) and 0.9-3.3 % less on the H100 from 3,036 to 3,960; at 4,092
#: (31.0 tokens an SM) neither card gains 2 % in both runs (H200 1.9-2.0 %, H100 1.2-1.7 %),
#: so it ends at 31 by item 44's rule. Gemma-2-9b's 16-lane heads gain under 2 % from 3,100
#: (the window's own end). The other shapes whose decode heads fill the token kernel at 8
#: lanes (on 132 SMs 24, 48, 84, 96, 140 and 160 heads of 128) are timed on the H100 only
#: (items 54-55: 2-3 decode heads a thread 0.7-6.9 % less than the wide kernel from 2,700
#: tokens, 5 a thread 0.6-1.9 % more).
ROPE_TOKEN_WINDOW_8_LANES_TO_TOKENS_PER_SM = 31
#: Where the prefill layout's heads a thread do not fill the token kernel's shape, it takes
#: this many heads a thread instead where they fill it (0: none), from 4 tokens an SM to
#: ROPE_TOKEN_BAND_MAX_TOKENS_PER_SM:
#: llama-3.1-70b's 72 heads in 12 slots of 6 (96 threads a token at 80 registers, 8 tokens
#: an SM by registers, where the wide kernel's 5 heads hold 4 at 112). A thread holding
#: more heads carries its 16 cos/sin registers over more data. Measured (H100, bf16, cold
#: L2, bit for bit the wide kernel's; bench/results/NOTES.md item 47, two runs): 70b at
#: 1024 tokens 5.5-5.9 % less than the wide kernel (13.94-14.19 against 14.66-14.94 us;
#: Liger 13.71-13.87), at 256 level; at 2048 2.9 % less, at 4096 0.7 % more and at 16384
#: 2 % more. Compiled for the token kernel alone (:func:`rope_token_heads_compiled`).
ROPE_TOKEN_BAND_HEADS = 6
#: The band heads' own end, from ROPE_MIN_TOKENS_PER_SM tokens an SM to below this many
#: (3,564 tokens on 132 SMs): past the prefill heads' 12, where 8b's 5 heads lose up to 2 %
#: on the H200 at 1792 tokens, 70b's 6 still gain. Measured (bf16, cold L2, bit for bit the
#: wide kernel's; bench/results/NOTES.md items 48 and 51, two runs a card): 70b at 1584 /
#: 1792 / 2048 tokens 3.1-3.5 / 2.6-3.7 / 1.9-2.4 % less than the wide kernel on an H100,
#: 1.5-2.5 / 4.2-4.5 / 2.2-2.8 % on an H200; from 2,240 to 3,300 the H200 3.0-4.2 % less
#: (2,304-3,300) and the H100 level (1.9 % less to 0.1 % more), so the band runs to 27 by
#: item 44's rule (one card gains in both runs, the other is level): at 3,584 an H100 run was
#: 3.0 % slower; at 4,096 the H200 gains 2.7-2.9 % and the H100 is 0.2 % faster to 0.7 %
#: slower; at 4,608 the H200's gain falls to 0.9-1.8 %.
ROPE_TOKEN_BAND_MAX_TOKENS_PER_SM = 27
#: apply_rope's token kernel also runs at 6 lanes a head (rotary_dim 96 in 16-bit vectors:
#: phi-3-mini's 32 + 32 heads of 96), compiled at these heads a thread alone and planned
#: where plan_rope's rule picks them (heads of :data:`ROPE_TOKEN_HEADS` or the band's).
#: phi-3-mini's decode layout (2 heads a thread, 32 slots of 6 lanes, 192 threads) takes it
#: at decode sizes, and past them to the window's end (its prefill heads, 5, and the band's
#: 6 do not divide its 64 heads, so plan_rope's decode heads do; 3035 tokens on 132 SMs).
#: Measured (bf16, bit for bit the wide kernel's; bench/results/NOTES.md items 60, 63, 64):
#: 56 registers against the wide kernel's 76; on an H100 15.7 / 15.3 / 11.7 % less at 1 /
#: 16 / 64 tokens (graph replay), 5.0 / 2.9 % at 256 / 527 (cold L2); on an H200 15.8 /
#: 14.1 / 13.5 %, 6.5 / 1.9 %, and 4.4-8.4 % at 528-3035. 3 heads a thread at 6 lanes spill 8 bytes
#: on sm_80 (cache in q's dtype; 8 lanes do not, nor 6 lanes at 2, 4, 5 or 6 heads), so
#: the entries are from (2, 4, 5, 6) (:func:`rope_token_6_lanes_heads`). The same plan
#: takes 32 heads of 96 (16 slots, 96 threads: a q-only call) and rotary_dim 96 under a
#: larger head_dim (in place, the dims past it are not touched), untimed.
ROPE_TOKEN_6_LANES_HEADS = (2,)
#: Past every end above (the window's, its 8-lane end's, the band's), apply_rope's token kernel
#: runs again to below this many tokens an SM, in the prefill layout's heads where they fill
#: it (llama-3.1-8b's 5, gemma-2-9b's 3), else in the decode layout's (llama-3.1-70b's 3,
#: qwen2.5-7b's 2, phi-3-mini's 2 at 6 lanes). A block per token drops the wide kernel's
#: token loop; its tail of last blocks is a smaller share of the kernel the more waves
#: there are, so the gain fades with size. Measured (bf16, cold L2, bit for bit the wide
#: kernel's; bench/results/NOTES.md item 64, calls 8-11): on the H200 8b's prefill heads
#: 3.5-6.2 % less than the wide kernel at 4,096-8,192 tokens, 1.4-1.6 % at 10,240-12,288;
#: 70b's decode heads 3.1-5.1 % at 3,584-5,120, 1.8-2.5 % at 6,144-8,192. 0 (off) until the
#: H100 reads the same map (item 44's rule; item 65).
ROPE_TOKEN_FAR_TO_TOKENS_PER_SM = 0
_ROPE_TOKEN_6_LANES_SPILL_FREE_HEADS = (2, 4, 5, 6)  # not a knob: what ptxas compiles without a spill
#: Resident 256-thread blocks an SM a wave counts where the kernel's own count is not known
#: (planning without a GPU), scaled to the plan's block (4 of 128 threads, the same 512
#: threads an SM: the 5-heads kernels' 112-128 registers). The ops pass the CUDA
#: occupancy API's count for the kernel they launch (:func:`rope_resident_grid`): its
#: registers decide it, 2 or 3 for the same block size.
#: llama-3.1-70b's qk_rms_norm_rope (192-thread blocks of 96 registers, 3 an SM) took 185
#: us at 16,384 tokens with this estimate's 528 blocks (396 ran, then 132 alone), 158 us
#: with 2 waves of its 3 (bench/results/NOTES.md, item 33).
ROPE_WIDE_BLOCKS_PER_SM = 2


def rope_vec_widths(dtype, *, fused_norm: bool) -> tuple[int, ...]:
    """Vector widths (elements) the rope kernels are compiled for: 1, 8 and 16 bytes for
    apply_rope; 1 and 16 bytes for qk_rms_norm_rope."""
    full = _dtypes.vec_width(dtype)
    return (1, full) if fused_norm else (1, full // 2, full)


#: kThreadsPerHead of qk_rms_norm_rope_kernel: the row group that reduces one head.
ROPE_NORM_THREADS_PER_HEAD = (8, 16, 32)


def rope_norm_row_groups() -> tuple[int, ...]:
    """:data:`ROPE_NORM_THREADS_PER_HEAD`, the row groups (lanes a head) the rope kernels
    are compiled for, as ints; PlanError naming it unless a tuple of the ints 8, 16, 32:
    :func:`rope_norm_threads_per_head` picks any of the three (by vec_width, head_dim and
    rotary_dim) for qk_rms_norm_rope, so each must be compiled (a table to read, not to
    tune; for apply_rope's token kernel it also bounds the lanes a head it may run at)."""
    value = ROPE_NORM_THREADS_PER_HEAD
    if type(value) is not tuple or not all(_is_int(g) for g in value) or tuple(int(g) for g in value) != (8, 16, 32):
        raise PlanError(f"plans.ROPE_NORM_THREADS_PER_HEAD must be (8, 16, 32), got {value!r}")
    return (8, 16, 32)


def rope_norm_threads_per_head(vec_width: int, head_dim: int, rotary_dim: int) -> int:
    """qk_rms_norm_rope's row group: enough lanes for one unit (and one pass-through
    vector) each, 8 to 32; the scalar path always takes a full warp."""
    if vec_width == 1:
        return 32
    work = max(rotary_dim // 2 // vec_width, (head_dim - rotary_dim) // vec_width, 1)
    return min(32, max(8, _next_pow2(work)))


@dataclass(frozen=True)
class RopePlan:
    """How apply_rope_kernel / qk_rms_norm_rope_kernel are launched (the grouping above)."""

    vec_width: int
    threads_per_head: int
    head_slots: int
    tokens_per_block: int
    grid: tuple[int, int, int]
    origin: str = "heuristic"  # the rope rule takes no overrides and has no tuned file
    #: 0: the "steps" kernels; >= 1: the wide kernels, holding this many heads per thread.
    heads_per_thread: int = 0
    #: 0: a block per group of tokens_per_block tokens; n >= 1: grid-stride, the grid
    #: capped at n waves of resident blocks (:func:`rope_resident_grid`).
    grid_waves: int = 0
    #: The token kernel (qk_rms_norm_rope: :data:`ROPE_NORM_TOKEN_HEADS`; apply_rope:
    #: :data:`ROPE_TOKEN_HEADS`, :data:`ROPE_TOKEN_BAND_HEADS`, at 6 lanes a head
    #: :data:`ROPE_TOKEN_6_LANES_HEADS`): heads_per_thread heads a thread, one token a
    #: block and exactly one block per token, every thread busy.
    token_kernel: bool = False

    kind = "rope"
    shared_mem_bytes = 0

    def fields(self) -> dict:
        """The plan as flat fields of a sweep point (:data:`PLAN_FIELDS`)."""
        return {**dict.fromkeys(PLAN_FIELDS), "plan_kind": self.kind, "origin": self.origin, "grid": self.grid[0],
                "block_size": self.block_size, "vec_width": self.vec_width, "threads_per_head": self.threads_per_head,
                "head_slots": self.head_slots, "tokens_per_block": self.tokens_per_block}

    @property
    def block_size(self) -> int:
        """Active threads rounded up to whole warps."""
        active = self.threads_per_head * self.head_slots * self.tokens_per_block
        return -(-active // WARP_SIZE) * WARP_SIZE

    @property
    def block(self) -> tuple[int, int, int]:
        return (self.block_size, 1, 1)


def plan_rope(num_tokens: int, num_heads: int, head_dim: int, rotary_dim: int, dtype, *, max_vec_width: int,
              fused_norm: bool, limits: DeviceLimits, overrides: dict | None = None, op: str = "apply_rope",
              in_place: bool = False, mrope: bool = False) -> RopePlan:
    """Plan for apply_rope_kernel (``fused_norm=False``) or qk_rms_norm_rope_kernel.

    ``num_heads`` counts q and k heads; ``max_vec_width`` is the widest access every
    pointer and stride allows (the caller checks alignment). The vector width is the
    widest compiled one that also divides rotary_dim / 2 and head_dim. For
    qk_rms_norm_rope the row group (threads_per_head) depends on head_dim, rotary_dim
    and the vector width only, so a head's reduction order never depends on the batch.
    A bf16 qk_rms_norm_rope whose wide layout holds a number of
    :data:`ROPE_NORM_TOKEN_HEADS` heads a thread in a shape every thread fills takes the
    token kernel (``token_kernel``: one token a block, a block per token, no waves); so
    does a 16-bit apply_rope of :data:`ROPE_TOKEN_HEADS` at decode sizes (and below
    :data:`ROPE_TOKEN_MAX_TOKENS_PER_SM` tokens an SM or in the window from
    :data:`ROPE_TOKEN_WINDOW_FROM_TOKENS_PER_SM` to :data:`ROPE_TOKEN_WINDOW_TO_TOKENS_PER_SM`
    tokens an SM, there in the decode layout's heads where those fill it too, and decode
    heads of 8 lanes to :data:`ROPE_TOKEN_WINDOW_8_LANES_TO_TOKENS_PER_SM`; where the
    prefill layout's heads do not fill it, at :data:`ROPE_TOKEN_BAND_HEADS` below
    :data:`ROPE_TOKEN_BAND_MAX_TOKENS_PER_SM`, and where the band's do not either, in the
    decode layout's heads up to the window's end; past every one of those ends, from the
    window's start to :data:`ROPE_TOKEN_FAR_TO_TOKENS_PER_SM` (0: off), in the prefill
    layout's heads where they fill it, else the decode layout's; heads of 6 lanes at
    :data:`ROPE_TOKEN_6_LANES_HEADS` alone) when the call is ``in_place`` without
    ``mrope`` (M-RoPE's positions; both flags are apply_rope's alone:
    qk_rms_norm_rope is always in place). The rule takes no launch overrides: any raise
    ValueError (never ignored); ``fused_norm``, ``in_place`` and ``mrope`` not bools, and
    ``overrides`` neither a dict nor None, raise TypeError naming them; ``max_vec_width``
    not an int >= 1 ValueError; a device whose warps are not 32 lanes, PlanError.
    """
    dtype = _dtypes.check_supported(dtype, "dtype")
    check_override_keys(given_overrides(overrides), (), op)
    for name, flag in (("fused_norm", fused_norm), ("in_place", in_place), ("mrope", mrope)):
        if not isinstance(flag, (bool, np.bool_)):  # "no" or NaN would read as True
            raise TypeError(f"{name}: expected a bool, got {flag!r}")
    fused_norm, in_place, mrope = bool(fused_norm), bool(in_place), bool(mrope)
    # Python ints from here on (NumPy's unsigned and small ints wrapped in -(-n // h)).
    num_tokens, num_heads = _count(num_tokens, "num_tokens", 0), _count(num_heads, "num_heads", 1)
    head_dim, rotary_dim = _count(head_dim, "head_dim", 2), _count(rotary_dim, "rotary_dim", 2)
    max_vec_width = _count(max_vec_width, "max_vec_width", 1)  # 1 (scalar access) always fits
    limits = _fixed_block(limits, WARP_SIZE, "RoPE's kernels")
    sm_count = limits.sm_count
    # Every size below fits the device's blocks as well as the kernels' launch bounds:
    # a GPU of 128-thread blocks gets fewer tokens (or head slots) a block, not a refusal.
    # In whole warps, as RopePlan.block_size rounds the active threads up to them (a cap
    # of 214 planned 224-thread blocks and refused them: helpers 60 and 78).
    block_cap = min(limits.max_threads_per_block, ROPE_MAX_BLOCK_SIZE) // WARP_SIZE * WARP_SIZE
    if rotary_dim > head_dim or rotary_dim % 2:
        raise ValueError(f"rotary_dim: expected an even number <= head_dim ({head_dim}), got {rotary_dim}")
    half = rotary_dim // 2
    vec_width = max(w for w in rope_vec_widths(dtype, fused_norm=fused_norm)
                    if w <= max_vec_width and half % w == 0 and head_dim % w == 0)
    units = half // vec_width
    if fused_norm:
        threads_per_head = rope_norm_threads_per_head(vec_width, head_dim, rotary_dim)
    else:
        threads_per_head = min(units, block_cap)
    decode_sizes_end = _constant("ROPE_MIN_TOKENS_PER_SM") * sm_count
    few_tokens = num_tokens < decode_sizes_end
    steps_heads = _constant("ROPE_HEADS_PER_THREAD")  # read at every shape, so a bad value never waits for one
    wide = rope_wide(fused_norm, units, (head_dim - rotary_dim) // vec_width, threads_per_head)
    sixteen_bit = np.dtype(dtype).itemsize == 2
    if wide:
        heads_per_thread, waves, block_threads = _rope_wide_constants(few_tokens, fused_norm)
        heads_per_thread = _rope_wide_heads(num_heads, threads_per_head, heads_per_thread, few_tokens, fused_norm,
                                            sixteen_bit, block_cap)
        wide = heads_per_thread > 0
    if not wide:
        heads_per_thread, waves, block_threads = (1 if few_tokens else steps_heads), 0, ROPE_MAX_BLOCK_SIZE
    token_heads = rope_token_heads(fused_norm)  # read at every shape too, as the two tables below
    rope_token_dtypes(fused_norm), rope_norm_row_groups(), rope_token_6_lanes_heads()
    band_heads = 0 if fused_norm else rope_token_band_heads()
    window_start = _constant("ROPE_TOKEN_WINDOW_FROM_TOKENS_PER_SM") * sm_count
    window_end = _constant("ROPE_TOKEN_WINDOW_TO_TOKENS_PER_SM") * sm_count
    window_end_8_lanes = _constant("ROPE_TOKEN_WINDOW_8_LANES_TO_TOKENS_PER_SM") * sm_count
    below_first_end = num_tokens < _constant("ROPE_TOKEN_MAX_TOKENS_PER_SM") * sm_count
    band_end = 0 if fused_norm else _constant("ROPE_TOKEN_BAND_MAX_TOKENS_PER_SM") * sm_count
    far_end = _constant("ROPE_TOKEN_FAR_TO_TOKENS_PER_SM", lowest=0) * sm_count
    head_slots = _rope_head_slots(num_heads, heads_per_thread, threads_per_head, block_cap)
    threads_per_token = threads_per_head * head_slots
    # Fill the block (the wide kernels' block_threads of it) with tokens, but keep at least
    # one block per SM while tokens last.
    tokens_per_block = max(1, min(min(block_threads, block_cap) // threads_per_token,
                                  -(-num_tokens // sm_count)))
    # Where each token kernel was measured faster than the wide one (items 38, 39, 44, 47-52):
    # qk at every size, apply_rope at decode sizes, a little past them and in the window.
    one_position_in_place = in_place and not mrope  # apply_rope's token kernel: one position a token
    token_call = fused_norm or ((few_tokens or below_first_end) and one_position_in_place)
    grid_fits = 1 <= num_tokens <= limits.max_grid_x  # a block per token
    layout_fills = (wide and heads_per_thread in token_heads
                    and _rope_token_full(dtype, vec_width, head_dim, rotary_dim, units, threads_per_head, head_slots,
                                         heads_per_thread, num_heads, fused_norm))
    token_kernel = token_call and layout_fills and grid_fits

    if not token_kernel and not fused_norm and one_position_in_place and wide and grid_fits:
        # Past the decode sizes the token kernel runs again in the first of the ranges below
        # that holds num_tokens, in its heads a thread and slots (None: they do not fill it).
        decode_heads = _rope_wide_heads(num_heads, threads_per_head, _rope_wide_constants(True, False)[0], True,
                                        False, sixteen_bit, block_cap)
        decode_slots = _rope_head_slots(num_heads, decode_heads, threads_per_head, block_cap) if decode_heads else 0
        decode = ((decode_heads, decode_slots) if decode_heads in token_heads and _rope_token_full(
            dtype, vec_width, head_dim, rotary_dim, units, threads_per_head, decode_slots, decode_heads, num_heads,
            False) else None)
        # Decode heads of 8 lanes run to their own end (8b; item 52, calls 5-6).
        decode_end = window_end_8_lanes if decode and threads_per_head == 8 else window_end
        band_slots = num_heads // band_heads if band_heads else 0  # _rope_token_full refuses heads left over
        band = ((band_heads, band_slots) if band_slots and band_slots * threads_per_head <= block_cap
                and _rope_token_full(dtype, vec_width, head_dim, rotary_dim, units, threads_per_head, band_slots,
                                     band_heads, num_heads, False) else None)
        if layout_fills:
            ranges = (
                # The window (items 50, 52): in the decode layout's heads where they fill it
                # too (more threads a token: 8b's 2 heads in 160 threads, gemma-2-9b's 2 in 192).
                (window_start, decode_end, decode or (heads_per_thread, head_slots)),
                # Past it, the prefill heads (item 64's H200 map; 12 to 17 tokens an SM stay
                # the wide kernel's, item 50).
                (window_start, far_end, (heads_per_thread, head_slots)))
        else:
            ranges = (
                # Where the prefill heads do not fill it, the band heads may, to their own
                # end (70b's 6; items 47-48, 51).
                (decode_sizes_end, band_end, band),
                # Where neither do, the decode heads to the window's end (16, 32, 56, 64
                # heads of 128: 4 heads a thread in the wide kernel, 2 in the token kernel;
                # H100 items 54-56 and 63, 0.4-13.9 % less than the wide kernel at 528-4091
                # tokens; H200 item 64, qwen2.5-7b 3.4-9.6 %; and phi-3-mini's 6 lanes to
                # 3035, H200 4.4-8.4 %). A mechanism, not a 4-heads case: on blocks of
                # 96-192 threads the decode heads are 3 and take the same path (untimed;
                # helper 96).
                (decode_sizes_end, 0 if band else decode_end, decode),
                # Past every end, the decode heads (70b's 3; item 64's H200 map).
                (window_start, far_end, decode))
        for first, last, heads in ranges:
            if heads and first <= num_tokens < last:
                token_kernel, (heads_per_thread, head_slots) = True, heads
                break
    if token_kernel:  # a block per token
        tokens_per_block, waves = 1, 0
    plan = RopePlan(vec_width, threads_per_head, head_slots, tokens_per_block, (1, 1, 1),
                    heads_per_thread=heads_per_thread if wide else 0, grid_waves=waves, token_kernel=token_kernel)
    if plan.block_size > block_cap:  # a head's threads alone past a very small device's blocks
        raise PlanError(f"rope block of {plan.block_size} threads exceeds {block_cap}")
    estimate = max(1, _constant("ROPE_WIDE_BLOCKS_PER_SM") * ROPE_MAX_BLOCK_SIZE // plan.block_size)
    return rope_resident_grid(plan, num_tokens, estimate, limits)


def _rope_head_slots(num_heads: int, heads_per_thread: int, threads_per_head: int, block_cap: int) -> int:
    """Head slots a token's threads hold: enough for every head at ``heads_per_thread`` a
    slot, no more than ``block_cap`` threads' worth, at least one."""
    return max(1, min(-(-num_heads // heads_per_thread), block_cap // threads_per_head))


def rope_resident_grid(plan: RopePlan, num_tokens: int, blocks_per_sm: int, limits: DeviceLimits) -> RopePlan:
    """``plan`` with its grid: a block per group of tokens_per_block tokens, capped at
    plan.grid_waves waves of ``blocks_per_sm`` resident blocks an SM where grid_waves >= 1
    (the wide kernels walk the tokens grid-stride). ``blocks_per_sm`` is the kernel's own
    count (the CUDA occupancy API's, for plan.block_size threads: ops/rope.py) or, without
    the kernel, ROPE_WIDE_BLOCKS_PER_SM. A grid that is not a whole number of waves runs
    its last blocks at a fraction of the SMs' slots (item 33). ValueError naming the
    argument (or the plan's field) unless each count is an int, >= 0 for num_tokens and
    plan.grid_waves, >= 1 otherwise; TypeError for a plan that is not a RopePlan or
    limits that are not DeviceLimits; PlanError for a token-kernel plan whose grid would
    not be exactly num_tokens blocks (waves, tokens a block, 0 tokens, or past max_grid_x)."""
    if not isinstance(plan, RopePlan):
        raise TypeError(f"plan: expected a plans.RopePlan, got {type(plan).__name__}")
    limits = _device_limits(limits)
    num_tokens = _count(num_tokens, "num_tokens", 0)
    blocks_per_sm = _count(blocks_per_sm, "blocks_per_sm", 1)
    waves = _count(plan.grid_waves, "plan.grid_waves", 0)
    blocks = max(1, -(-num_tokens // _count(plan.tokens_per_block, "plan.tokens_per_block", 1)))
    if plan.token_kernel and not (waves == 0 and plan.tokens_per_block == 1 and 1 <= num_tokens <= limits.max_grid_x):
        # no token loop and no guard: block b is token b, so the grid must be the tokens exactly (helper 71)
        raise PlanError(f"a token-kernel plan launches one block per token, without waves: {num_tokens} tokens "
                        f"(grid_waves {waves}, tokens_per_block {plan.tokens_per_block}) do not fit a grid of 1 to "
                        f"{limits.max_grid_x} blocks")
    if waves:
        blocks = min(blocks, waves * blocks_per_sm * limits.sm_count)
    return replace(plan, grid=(min(blocks, limits.max_grid_x), 1, 1))


#: q/k dtypes of each token kernel (qk_rms_norm_rope's fp16 5 heads spill 16 bytes under its
#: 96 registers; apply_rope's hold no weights).
ROPE_TOKEN_DTYPES = {True: (_dtypes.bfloat16,), False: (_dtypes.bfloat16, _dtypes.float16)}


def rope_token_dtypes(fused_norm: bool) -> tuple[np.dtype, ...]:
    """:data:`ROPE_TOKEN_DTYPES` ``[fused_norm]`` as numpy dtypes. PlanError naming it
    unless a dict of the keys True and False, True to a tuple of cupykern.bfloat16 at most
    and False to a tuple of cupykern.bfloat16 / numpy.float16 (each entry may leave some
    out: fewer token kernels, not wrong ones). Those are the dtypes the token kernels were
    compiled and timed at: qk_rms_norm_rope's fp16 token kernel spills (the comment above).
    TypeError unless ``fused_norm`` is a bool."""
    if type(fused_norm) is not bool:
        raise TypeError(f"fused_norm must be a bool, got {fused_norm!r}")
    value = ROPE_TOKEN_DTYPES
    bf16, fp16 = np.dtype(_dtypes.bfloat16), np.dtype(_dtypes.float16)
    most = {True: (bf16,), False: (bf16, fp16)}
    read = {}
    if type(value) is dict and len(value) == 2 and all(type(key) is bool for key in value):
        for key, entry in value.items():
            try:  # np.dtype runs an entry's own conversion (its .dtype, its __index__), whatever it raises
                dtypes = tuple(np.dtype(d) for d in entry) if type(entry) is tuple else None
            except Exception:
                dtypes = None
            if dtypes is not None and all(d in most[key] for d in dtypes):
                read[key] = dtypes
    if len(read) != 2:  # both entries, so a bad table fails at every call, not only at calls of its bad half
        raise PlanError("plans.ROPE_TOKEN_DTYPES must map True to a tuple of cupykern.bfloat16 at most and False "
                        f"to a tuple of cupykern.bfloat16 / numpy.float16, got {value!r}")
    return read[fused_norm]


def _rope_token_full(dtype, vec_width: int, head_dim: int, rotary_dim: int, units: int, threads_per_head: int,
                     head_slots: int, heads_per_thread: int, num_heads: int, fused_norm: bool) -> bool:
    """Whether a token kernel may run this shape (its launch contract, rope.cu): q/k of
    :data:`ROPE_TOKEN_DTYPES` in 16-byte vectors, one unit a lane of a compiled row group
    (:data:`ROPE_NORM_THREADS_PER_HEAD`; apply_rope's also 6 lanes at
    :data:`ROPE_TOKEN_6_LANES_HEADS`: :func:`rope_token_kernels_compiled`), every slot holding heads_per_thread heads, a
    token's threads whole warps, at least 64 of them (the shapes timed); qk_rms_norm_rope's
    with full rotary (no pass-through dims)."""
    threads = threads_per_head * head_slots
    compiled = (threads_per_head in rope_norm_row_groups() if fused_norm
                else (threads_per_head, heads_per_thread) in rope_token_kernels_compiled())
    return (np.dtype(dtype) in rope_token_dtypes(fused_norm) and vec_width * np.dtype(dtype).itemsize == LEAF_BYTES
            and (rotary_dim == head_dim or not fused_norm) and units == threads_per_head and compiled
            and head_slots * heads_per_thread == num_heads and threads % WARP_SIZE == 0 and threads >= 64)


def rope_token_band_heads() -> int:
    """:data:`ROPE_TOKEN_BAND_HEADS`, PlanError naming it unless an int in [0, 10]: 10 is the
    most heads a thread item 47 compiled and timed (ptxas, sm_90: apply_rope's token kernel
    at 10 heads takes 134 registers, no spill)."""
    return _constant("ROPE_TOKEN_BAND_HEADS", lowest=0, highest=10)


def rope_token_6_lanes_heads() -> tuple[int, ...]:
    """:data:`ROPE_TOKEN_6_LANES_HEADS` as ints, PlanError naming it unless a tuple of
    distinct ints of (2, 4, 5, 6) (empty: no 6-lane token kernel; 3 heads spill on sm_80)."""
    value = ROPE_TOKEN_6_LANES_HEADS
    allowed = _ROPE_TOKEN_6_LANES_SPILL_FREE_HEADS
    if (type(value) is not tuple or not all(_is_int(h) and int(h) in allowed for h in value)
            or len({int(h) for h in value}) != len(value)):
        raise PlanError(f"plans.ROPE_TOKEN_6_LANES_HEADS must be a tuple of distinct ints of {allowed}, got {value!r}")
    return tuple(int(h) for h in value)


def rope_token_kernels_compiled() -> tuple[tuple[int, int], ...]:
    """(lanes a head, heads a thread) of every apply_rope_token_kernel compiled: each row
    group (:func:`rope_norm_row_groups`) at :func:`rope_token_heads_compiled`, and 6 lanes
    at :func:`rope_token_6_lanes_heads`; PlanError for a bad table."""
    return (tuple((g, h) for g in rope_norm_row_groups() for h in rope_token_heads_compiled())
            + tuple((6, h) for h in rope_token_6_lanes_heads()))


def rope_token_heads_compiled() -> tuple[int, ...]:
    """kHeadsPerThread choices apply_rope_token_kernel is compiled for: the wide kernel's
    (:func:`rope_wide_heads_choices`, which :data:`ROPE_TOKEN_HEADS` picks from) and
    :data:`ROPE_TOKEN_BAND_HEADS` unless 0; PlanError for a bad constant."""
    band = rope_token_band_heads()
    return tuple(sorted(set(rope_wide_heads_choices()) | ({band} if band else set())))


def rope_token_heads(fused_norm: bool) -> tuple[int, ...]:
    """:data:`ROPE_NORM_TOKEN_HEADS` (qk_rms_norm_rope) or :data:`ROPE_TOKEN_HEADS`
    (apply_rope), PlanError naming it unless a tuple of choices of the wide kernel's
    (:func:`rope_wide_heads_choices`: the token kernels are compiled for those)."""
    name = "ROPE_NORM_TOKEN_HEADS" if fused_norm else "ROPE_TOKEN_HEADS"
    value, allowed = globals()[name], rope_wide_heads_choices(fused_norm)
    if not isinstance(value, tuple) or not all(_is_int(h) and h in allowed for h in value):
        choices = "ROPE_WIDE_NORM_HEADS_CHOICES" if fused_norm else "ROPE_WIDE_HEADS_CHOICES"
        raise PlanError(f"plans.{name} must be a tuple of plans.{choices} {allowed}, got {value!r}")
    return value


def rope_wide(fused_norm: bool, units: int, pass_vecs: int, threads_per_head: int) -> bool:
    """Whether plan_rope may take the wide kernels: ROPE_LAYOUT is "wide" and each lane
    holds at most one unit (qk_rms_norm_rope: and one pass-through vector) of a head, as
    the wide kernels keep them in registers. Both also need a token's heads to fit one
    round (:func:`_rope_wide_heads`)."""
    if ROPE_LAYOUT not in ("wide", "steps"):
        raise PlanError(f"ROPE_LAYOUT must be 'wide' or 'steps', got {ROPE_LAYOUT!r}")
    if ROPE_LAYOUT != "wide":
        return False
    return units <= threads_per_head and (not fused_norm or pass_vecs <= threads_per_head)


def rope_wide_heads_choices(fused_norm: bool = False) -> tuple[int, ...]:
    """Heads a thread of the wide kernels may hold, the kHeadsPerThread choices compiled:
    ROPE_WIDE_HEADS_CHOICES (apply_rope) or ROPE_WIDE_NORM_HEADS_CHOICES
    (qk_rms_norm_rope); PlanError naming it unless a non-empty ascending tuple of distinct
    ints 1 .. 8 (1 .. 5 for qk_rms_norm_rope: the most compiled and measured, its 16-bit
    kernel at 119-128 of its 128 registers without a spill; fp32's spills there with
    pass-through dims, so :func:`_rope_wide_heads` plans fp32 at most
    ROPE_WIDE_NORM_FP32_MOST_HEADS)."""
    name, most = ("ROPE_WIDE_NORM_HEADS_CHOICES", 5) if fused_norm else ("ROPE_WIDE_HEADS_CHOICES", 8)
    choices = globals()[name]
    if (not isinstance(choices, tuple) or not choices or not all(_is_int(h) and 1 <= h <= most for h in choices)
            or list(choices) != sorted(set(choices))):
        raise PlanError(f"plans.{name} must be a non-empty ascending tuple of distinct ints 1 .. {most}, "
                        f"got {choices!r}")
    return tuple(int(h) for h in choices)


def _rope_one_round_heads(num_heads: int, threads_per_head: int, fewest: int, fused_norm: bool,
                          block_cap: int) -> list[int]:
    """The choices >= ``fewest`` that give every head of a token a slot in one block of at
    most ``block_cap`` threads (ceil(num_heads / h) slots of threads_per_head threads),
    ascending."""
    return [h for h in rope_wide_heads_choices(fused_norm)
            if h >= fewest and -(-num_heads // h) * threads_per_head <= block_cap]


def _rope_wide_heads(num_heads: int, threads_per_head: int, fewest: int, few_tokens: bool,
                     fused_norm: bool, sixteen_bit: bool, block_cap: int) -> int:
    """Heads a thread of the wide kernels holds, 0 if none fits their launch contract
    (every head of a token in one round: a second round is one more position -> cos/sin ->
    q/k chain; the steps kernel then). Among the compiled choices >= ``fewest`` that fit:
    at decode sizes the fewest (more threads on the few tokens); above, the one whose
    256-thread block of whole tokens would hold a head in the largest share of its thread x
    head slots (ties: more heads, more bytes in flight a thread), the share these
    measurements chose by; the blocks launched since item 34 hold fewer tokens
    (ROPE_WIDE_BLOCK_THREADS, ROPE_WIDE_NORM_BLOCK_THREADS). Measured (H200, bf16, 16384
    tokens, bench/results/NOTES.md): apply_rope (item 17, each choice alone),
    llama-3.1-8b's 40 heads at 2 / 3 / 4 / 5 heads a thread (block share 0.62 / 0.83 /
    0.94 / 1.0) reached 76 / 73 / 80 / 86 % of copy, llama-3.1-70b's 72 at 3 / 4 / 5 69 /
    79 / 85 % (rule: 5 for both); qk_rms_norm_rope (item 31), 8b at 3 / 4 (0.83 / 0.94)
    76 / 80 %, 70b at 3 / 4 (0.75 / 0.56) 76 / 65 %; (item 33, grids of whole waves) 8b at
    4 / 5 (0.94 / 1.0) 86.3 / 87.4-88.5 %, 70b at 3 / 5 (0.75 / 0.9) 90.6-91.3 / 87.8-88.0 %.
    qk_rms_norm_rope's choices from ROPE_WIDE_NORM_FULL_BLOCK_HEADS up count at prefill
    only where they fill the block (share 1) or nothing else fits (rule: 5 for 8b, 3 for
    70b); for fp32 q/k (not ``sixteen_bit``) none above ROPE_WIDE_NORM_FP32_MOST_HEADS
    (fp32's 5-heads kernel with pass-through dims spills 20-80 bytes)."""
    fitting = _rope_one_round_heads(num_heads, threads_per_head, fewest, fused_norm, block_cap)
    if fused_norm:  # read at every batch size, as the other constants
        full_block_heads = _constant("ROPE_WIDE_NORM_FULL_BLOCK_HEADS")
        if not sixteen_bit:
            fitting = [h for h in fitting if h <= ROPE_WIDE_NORM_FP32_MOST_HEADS]
    if not fitting:
        return 0
    if few_tokens:
        return fitting[0]

    def share(h: int) -> Fraction:
        threads_per_token = -(-num_heads // h) * threads_per_head
        tokens = ROPE_MAX_BLOCK_SIZE // threads_per_token
        return Fraction(tokens * num_heads * threads_per_head, ROPE_MAX_BLOCK_SIZE * h)

    if fused_norm:
        fitting = [h for h in fitting if h < full_block_heads or share(h) == 1] or fitting
    return max(fitting, key=lambda h: (share(h), h))


def _rope_wide_constants(few_tokens: bool, fused_norm: bool) -> tuple[int, int, int]:
    """(heads per thread, grid waves or 0 for a block per token group, threads a block
    fills with tokens) of the wide kernels. Every constant the op reads is checked at every
    batch size (a bad one never waits for the batch that reads it, and never makes a
    plan): heads per thread as compiled (apply_rope: ROPE_WIDE_HEADS_CHOICES;
    qk_rms_norm_rope: ROPE_WIDE_NORM_HEADS_CHOICES), waves >= 0 and block threads >= 1
    (ROPE_WIDE_BLOCKS_PER_SM, >= 1, is checked by plan_rope)."""
    allowed = rope_wide_heads_choices(fused_norm)
    listed_by = "ROPE_WIDE_NORM_HEADS_CHOICES" if fused_norm else "ROPE_WIDE_HEADS_CHOICES"
    prefill_name = "ROPE_WIDE_NORM_HEADS_PER_THREAD" if fused_norm else "ROPE_WIDE_HEADS_PER_THREAD"
    prefill_heads, decode_heads = (_constant(name, allowed, allowed_by=listed_by)
                                   for name in (prefill_name, "ROPE_WIDE_DECODE_HEADS_PER_THREAD"))
    waves = _constant("ROPE_WIDE_NORM_GRID_WAVES" if fused_norm else "ROPE_WIDE_GRID_WAVES", lowest=0)
    block_threads = _constant("ROPE_WIDE_NORM_BLOCK_THREADS" if fused_norm else "ROPE_WIDE_BLOCK_THREADS")
    return (decode_heads if few_tokens else prefill_heads), waves, block_threads


# ----------------------------------------------------------------- decode kernels
# gemv.cu, attention.cu and tokens.cu: fixed launch shapes, read off the sizes alone (no
# overrides, no tuned file), so a captured graph and an eager call launch the same thing.

#: kGemvWarps of gemv_kernel (gemv.cu): one warp per output feature, 4 per block.
GEMV_WARPS = 4
#: kAhead of the GEMV kernels: 16-byte weight vectors per lane requested before the
#: norm (and, in a dependent launch, before the wait for the kernel before): 6 hold a
#: 1536-element row of 16-bit weights (SmolLM2's down projection). With dependent
#: launches 6 measured 20 us a step faster than 4, 8 slower (register pressure;
#: bench/bench_decode_step.py --variants, bench/results/NOTES.md item 12).
GEMV_AHEAD = 6
#: kMaxTokens choices of gemv_kernel: registers per lane grow with it, so the plan takes
#: the smallest that holds num_tokens.
GEMV_MAX_TOKENS = (1, 4, 16)
#: From this many output features (the LM head) a gemv_kernel warp computes
#: GEMV_MANY_ROWS_PER_WARP of them at once (kRowsPerWarp), their weight loads in flight
#: together, requesting GEMV_MANY_ROWS_AHEAD vectors per row and lane before the norm
#: (3 hold a 576-element row; 4 rows x 4 would cost the occupancy that the rows buy):
#: a warp per feature left the LM head at half the copy bandwidth, its blocks limited by
#: registers to 8 an SM (bench/results/NOTES.md item 12). 1 turns it off.
GEMV_MANY_ROWS = 16384
GEMV_MANY_ROWS_PER_WARP = 4
GEMV_MANY_ROWS_AHEAD = 3
#: kAttnWarps of decode_attention_kernel (attention.cu). With dependent launches in the
#: decode graph 16 measured 9-11 us a step faster than 8 in two runs (bench/results/NOTES.md
#: item 12); without them, about the same (item 11).
ATTENTION_WARPS = 16
#: Cache rows below which decode attention runs as one split: one block per (head,
#: token) walks them in a few microseconds, less than a second launch (the combine) costs.
ATTENTION_ONE_SPLIT_ROWS = 1024
#: Fewest cache rows a split takes when the cache is split.
ATTENTION_MIN_SPLIT_ROWS = 256
#: kWarps of prefill_attention_kernel (attention.cu): the warps of a block, which split
#: the keys of the block's query rows (key tile j to warp j % kWarps). Fixed, as a row's
#: bits depend on it (batch invariance).
PREFILL_ATTENTION_WARPS = 4
#: kLanesPerRow of prefill_attention_kernel: lanes holding one query row (head_dim / 2
#: dims of q and of its accumulator each), so a block takes 16 query rows. Two lanes, not
#: one, double the blocks of a short prefill (SmolLM2's 512 tokens x 3 heads a kv head
#: make 96 tiles of 16) and keep head_dim 128 in registers.
PREFILL_ATTENTION_LANES_PER_ROW = 2
#: kSampleThreads of sample_tokens_kernel (tokens.cu).
SAMPLE_THREADS = 1024
#: Threads per block of rope_kv_append_kernel and embedding_kernel.
TOKEN_BLOCK_SIZE = 256


@dataclass(frozen=True)
class DecodePlan:
    """How a decode kernel is launched: ``kind`` is ``"gemv"``, ``"attention"`` or ``"tokens"``."""

    kind: str
    grid: tuple[int, int, int]
    block_size: int
    vec_width: int = 1
    max_tokens: int | None = None  # gemv: kMaxTokens
    rows_per_warp: int = 1  # gemv: kRowsPerWarp; prefill attention: query rows of a block (each warp holds all)
    ahead: int | None = None  # gemv: kAhead
    num_splits: int | None = None  # attention: cache splits (1: no combine launch)
    split_size: int | None = None  # attention: cache rows per split
    origin: str = "heuristic"

    shared_mem_bytes = 0

    @property
    def block(self) -> tuple[int, int, int]:
        return (self.block_size, 1, 1)

    def fields(self) -> dict:
        """The plan as flat fields of a sweep point (:data:`PLAN_FIELDS`)."""
        return {**dict.fromkeys(PLAN_FIELDS), "plan_kind": self.kind, "origin": self.origin, "grid": self.grid[0],
                "block_size": self.block_size, "vec_width": self.vec_width, "max_tokens": self.max_tokens,
                "num_splits": self.num_splits}


def gemv_token_choices() -> tuple[int, ...]:
    """:data:`GEMV_MAX_TOKENS`, PlanError unless a non-empty tuple of ints >= 1 in rising
    order (the ops refuse more rows than its last; the plan takes the first that holds)."""
    choices = GEMV_MAX_TOKENS
    if not (isinstance(choices, tuple) and choices and all(_is_int(m) and m >= 1 for m in choices)
            and list(choices) == sorted(set(choices))):
        raise PlanError(f"plans.GEMV_MAX_TOKENS must be a non-empty tuple of ints >= 1 in rising order, got {choices!r}")
    return tuple(int(m) for m in choices)


def gemv_max_tokens(num_tokens: int) -> int:
    """The smallest kMaxTokens that holds ``num_tokens``; ValueError past the largest."""
    choices = gemv_token_choices()
    for m in choices:
        if num_tokens <= m:
            return m
    raise ValueError(f"num_tokens: the decode GEMV takes at most {choices[-1]} tokens, got {num_tokens} "
                     f"(use a GEMM, e.g. cupy.matmul, for more)")


def plan_gemv(num_tokens: int, n_out: int, dtype, *, aligned: bool, limits: DeviceLimits,
              overrides: dict | None = None, op: str = "gemv", many_rows: bool = False) -> DecodePlan:
    """Plan for gemv_kernel: one warp per output feature, or with ``many_rows`` (a
    kernel that takes several features a warp) per :data:`GEMV_MANY_ROWS_PER_WARP` of them
    from :data:`GEMV_MANY_ROWS` features on; blocks of :data:`GEMV_WARPS` warps, 16-byte
    vectors when ``aligned`` (the caller checks pointers, strides and that the row length
    is a multiple of the vector). Takes no overrides.

    Raises:
        ValueError: a count that is not an int >= 0, more than GEMV_MAX_TOKENS[-1] tokens;
            PlanError (a ValueError) for a device whose warps are not 32 lanes or whose
            blocks hold fewer than GEMV_WARPS warps, or for a GEMV_* constant out of its range.
        TypeError: ``limits`` not a DeviceLimits, ``overrides`` neither a dict nor None,
            ``many_rows`` not a bool, ``op`` not a str.
    """
    check_override_keys(given_overrides(overrides), (), op)
    _check_op(op)
    if not isinstance(many_rows, (bool, np.bool_)):  # "no" or NaN would read as True
        raise TypeError(f"many_rows: expected a bool, got {many_rows!r}")
    warps = _constant("GEMV_WARPS", allowed=(4,))  # gemv.cu's kGemvWarps is not a template parameter
    ahead, many_ahead = _constant("GEMV_AHEAD", lowest=0), _constant("GEMV_MANY_ROWS_AHEAD", lowest=0)  # 0: off
    many_from, many_per_warp = _constant("GEMV_MANY_ROWS"), _constant("GEMV_MANY_ROWS_PER_WARP")
    limits = _fixed_block(limits, warps * WARP_SIZE, "the GEMV kernels")
    num_tokens, n_out = _count(num_tokens, "num_tokens", 0), _count(n_out, "n_out", 0)
    dtype, aligned = _dtype_and_alignment(dtype, aligned)
    rows = many_per_warp if many_rows and n_out >= many_from else 1
    units = -(-n_out // rows)
    blocks = max(1, min(-(-units // warps), limits.max_grid_x))
    return DecodePlan("gemv", (blocks, 1, 1), warps * WARP_SIZE,
                      vec_width=_dtypes.vec_width(dtype) if aligned else 1, max_tokens=gemv_max_tokens(num_tokens),
                      rows_per_warp=rows, ahead=many_ahead if rows > 1 else ahead)


#: gridDim.z's limit on every CUDA device (DeviceLimits does not carry it): the splits of
#: decode attention stay below it however many SMs a hand-built DeviceLimits claims.
CUDA_MAX_GRID_Z = 65535


def plan_attention(num_tokens: int, num_heads: int, cache_rows: int, dtype, *, limits: DeviceLimits,
                   overrides: dict | None = None, op: str = "decode_attention") -> DecodePlan:
    """Plan for decode_attention_kernel: a block per (head, token, split). The cache is
    split (then combined by a second launch) only past :data:`ATTENTION_ONE_SPLIT_ROWS`
    rows, into enough splits for about two blocks per SM, each at least
    :data:`ATTENTION_MIN_SPLIT_ROWS` rows, at most :data:`CUDA_MAX_GRID_Z` of them. The
    split depends on the cache's capacity, not on the positions (which live on the
    device), so a captured graph fits every step.

    Raises:
        ValueError: a count that is not an int >= 0; PlanError (a ValueError) for heads or
            tokens past the device's grid, warps not of 32 lanes, or blocks of fewer than
            ATTENTION_WARPS warps, or for a constant of this rule out of its range.
        TypeError: ``limits`` not a DeviceLimits, ``overrides`` neither a dict nor None.
    """
    dtype = _dtypes.check_supported(dtype, "dtype")
    check_override_keys(given_overrides(overrides), (), op)
    warps, one_split_rows = _constant("ATTENTION_WARPS"), _constant("ATTENTION_ONE_SPLIT_ROWS", lowest=0)
    min_split_rows = _constant("ATTENTION_MIN_SPLIT_ROWS")
    max_splits = _constant("CUDA_MAX_GRID_Z", highest=65535)  # a lower cap is a test's; a higher one no GPU's
    limits = _fixed_block(limits, warps * WARP_SIZE, "the decode attention kernels")
    num_tokens, num_heads = _count(num_tokens, "num_tokens", 0), _count(num_heads, "num_heads", 0)
    cache_rows = _count(cache_rows, "cache_rows", 0)
    if num_heads > limits.max_grid_x or num_tokens > limits.max_grid_y:
        raise PlanError(f"a (head, token, split) grid of {num_heads} x {num_tokens} exceeds the device's "
                        f"{limits.max_grid_x} x {limits.max_grid_y}")
    num_splits = 1
    if cache_rows > one_split_rows:
        wanted = -(-2 * limits.sm_count // max(1, num_heads * num_tokens))
        num_splits = max(1, min(wanted, cache_rows // min_split_rows, max_splits))
    split_size = -(-cache_rows // num_splits)
    return DecodePlan("attention", (num_heads, num_tokens, num_splits), warps * WARP_SIZE,
                      vec_width=_dtypes.vec_width(dtype), num_splits=num_splits, split_size=split_size)


def plan_prefill_attention(num_tokens: int, num_heads: int, num_kv_heads: int, dtype, *, limits: DeviceLimits,
                           overrides: dict | None = None, op: str = "prefill_attention") -> DecodePlan:
    """Plan for prefill_attention_kernel: a block of :data:`PREFILL_ATTENTION_WARPS` warps
    per tile of ``32 / PREFILL_ATTENTION_LANES_PER_ROW`` query rows of one kv head (a row
    is a (token, query head of the group) pair), a 1-D grid of tiles x kv heads. The
    shape depends on the sizes alone (the positions live on the device), so a captured
    graph fits any positions; takes no overrides.

    Raises:
        ValueError: more blocks than the grid's x dimension holds; a count that is not an
            int (>= 0 tokens, >= 1 heads), num_heads not a multiple of num_kv_heads;
            PlanError (a ValueError) for warps not of 32 lanes or blocks of fewer than
            PREFILL_ATTENTION_WARPS warps, or for PREFILL_ATTENTION_* out of its range.
        TypeError: ``limits`` not a DeviceLimits, ``overrides`` neither a dict nor None.
    """
    dtype = _dtypes.check_supported(dtype, "dtype")
    check_override_keys(given_overrides(overrides), (), op)
    warps = _constant("PREFILL_ATTENTION_WARPS")
    lanes_per_row = _constant("PREFILL_ATTENTION_LANES_PER_ROW", allowed=(1, 2, 4, 8, 16, 32))  # they split a warp
    limits = _fixed_block(limits, warps * WARP_SIZE, "the prefill attention kernels")
    num_tokens = _count(num_tokens, "num_tokens", 0)
    num_heads, num_kv_heads = _count(num_heads, "num_heads", 1), _count(num_kv_heads, "num_kv_heads", 1)
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads: expected a multiple of num_kv_heads ({num_kv_heads}), got {num_heads}")
    rows_per_tile = WARP_SIZE // lanes_per_row
    group = num_heads // num_kv_heads
    blocks = -(-num_tokens * group // rows_per_tile) * num_kv_heads
    if blocks > limits.max_grid_x:
        raise ValueError(f"q: {op} takes at most {limits.max_grid_x // num_kv_heads * rows_per_tile // group} "
                         f"tokens per call here (the grid's x dimension), got {num_tokens}; split the call")
    return DecodePlan("attention", (blocks, 1, 1), warps * WARP_SIZE,
                      vec_width=_dtypes.vec_width(dtype), rows_per_warp=rows_per_tile, num_splits=1)
