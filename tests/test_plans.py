"""CPU: plan rules (cupykern/plans.py) against an H200's limits, and the launcher's
override context (cupykern/launcher.py)."""

from __future__ import annotations

import inspect
from dataclasses import replace

import numpy as np
import pytest

from cupykern import _dtypes, families, launcher, plans
from cupykern.plans import H200_LIMITS, DeviceLimits

HIDDEN_SIZES = [1, 5, 64, 127, 128, 4096, 5120, 8192, 14336, 16384, 65536, 131072]


@pytest.mark.parametrize("hidden_size", HIDDEN_SIZES)
@pytest.mark.parametrize("dtype", _dtypes.DTYPES, ids=_dtypes.short_name)
@pytest.mark.parametrize("aligned", [True, False])
def test_plan_rows_is_valid_and_compiled(hidden_size, dtype, aligned):
    plan = plans.plan_rows(3, hidden_size, dtype, aligned=aligned, limits=H200_LIMITS)
    assert plan.layout in plans.row_layouts(dtype)
    assert plan.block_size % 32 == 0 and plan.block_size <= plans.max_block_size(plan.layout.threads_per_row)
    if not aligned:
        assert plan.layout.vec_width == 1
    # The chosen instantiation is in the declared (and CPU-compiled) space.
    from cupykern.ops import norm

    exact = plan.layout.fills(hidden_size, dtype)
    expr = norm.RMS_NORM.expr(_dtypes.c_type(dtype), *plan.layout.template_args(), exact)
    assert expr in families.instantiations()["norm.cu"]


@pytest.mark.parametrize("hidden_size", HIDDEN_SIZES)
def test_row_layouts_at_every_num_rows_compute_the_tree(hidden_size):
    """Batch invariance by construction: the layout follows num_rows, but every layout the
    planner picks computes the row's one reduction tree (tests/test_reduction_tree.py)."""
    plans_ = [plans.plan_rows(n, hidden_size, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS)
              for n in (1, 7, 64, 4097, 100_000)]
    for plan in plans_:
        layout = plan.layout
        assert plans.tree_fits(hidden_size, _dtypes.bfloat16, layout.threads_per_row, layout.vecs_per_thread)
    if hidden_size >= 64:
        assert len({p.layout for p in plans_}) == 2  # decode and prefill


@pytest.mark.parametrize("hidden_size", HIDDEN_SIZES)
@pytest.mark.parametrize("dtype", _dtypes.DTYPES, ids=_dtypes.short_name)
def test_softmax_decode_layout_is_capped_and_computes_the_tree(hidden_size, dtype):
    """softmax gets at most DECODE_MAX_THREADS_PER_ROW["softmax"] threads a row at decode
    sizes, in a compiled layout that still computes the row's tree (so its bits are those
    of every other layout); the other row ops keep J / DECODE_VECS_PER_THREAD."""
    from cupykern.ops import softmax

    cap = plans.DECODE_MAX_THREADS_PER_ROW["softmax"]
    for num_rows in (1, plans.DECODE_MAX_ROWS):
        plan = plans.plan_rows(num_rows, hidden_size, dtype, aligned=True, limits=H200_LIMITS, op="softmax")
        layout = plan.layout
        assert layout.threads_per_row <= cap
        assert plans.tree_fits(hidden_size, dtype, layout.threads_per_row, layout.vecs_per_thread)
        expr = softmax.SOFTMAX.expr(_dtypes.c_type(dtype), _dtypes.c_type(dtype), *layout.template_args(),
                                    layout.fills(hidden_size, dtype))
        assert expr in families.instantiations()["softmax.cu"]
        uncapped = plans.row_layout(hidden_size, dtype, True, num_rows=num_rows)
        assert layout == uncapped or uncapped.threads_per_row > cap
        assert plans.plan_rows(num_rows, hidden_size, dtype, aligned=True, limits=H200_LIMITS,
                               op="rms_norm").layout == uncapped


@pytest.mark.parametrize("value", [0, 3, 2048, True, 256.0, None])
def test_bad_decode_thread_caps_are_refused_by_name(monkeypatch, value):
    monkeypatch.setitem(plans.DECODE_MAX_THREADS_PER_ROW, "softmax", value)
    with pytest.raises(ValueError, match=r"plans.DECODE_MAX_THREADS_PER_ROW\['softmax'\] must be one of"):
        plans.plan_rows(1, 8192, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, op="softmax")
    # Prefill sizes read it too (the decode layout's threads decide whether it still fits
    # the GPU: plans.DECODE_FILL_SHARE); other ops do not.
    with pytest.raises(ValueError, match=r"plans.DECODE_MAX_THREADS_PER_ROW\['softmax'\] must be one of"):
        plans.plan_rows(4096, 8192, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, op="softmax")
    plans.plan_rows(1, 8192, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, op="rms_norm")
    monkeypatch.setattr(plans, "DECODE_MAX_THREADS_PER_ROW", [256])
    with pytest.raises(ValueError, match="plans.DECODE_MAX_THREADS_PER_ROW must be a dict"):
        plans.plan_rows(1, 8192, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, op="softmax")


@pytest.mark.parametrize("cap", [1, 32, 64, 128])
def test_a_small_decode_cap_still_gives_a_compiled_layout(monkeypatch, cap):
    """A cap below J / 8 threads gave threads_per_row 128 for 14336 fp32 (no compiled
    vecs_per_thread fits the tree there) and, at 1, RowLayout(1, 8, 512)."""
    from cupykern.ops import softmax

    monkeypatch.setitem(plans.DECODE_MAX_THREADS_PER_ROW, "softmax", cap)
    for dtype in _dtypes.DTYPES:
        for hidden_size in (5120, 8192, 14336, 16384):
            layout = plans.plan_rows(1, hidden_size, dtype, aligned=True, limits=H200_LIMITS, op="softmax").layout
            assert layout.vecs_per_thread in plans.VECS_PER_THREAD_CHOICES
            assert plans.tree_fits(hidden_size, dtype, layout.threads_per_row, layout.vecs_per_thread)
            expr = softmax.SOFTMAX.expr(_dtypes.c_type(dtype), _dtypes.c_type(dtype), *layout.template_args(),
                                        layout.fills(hidden_size, dtype))
            assert expr in families.instantiations()["softmax.cu"]


@pytest.mark.parametrize("op", [["softmax"], {}, 5, b"softmax"])
def test_row_plans_refuse_an_op_that_is_not_a_name(op):
    """A list raised a bare "unhashable type" at decode sizes; 5 was taken as an op."""
    for num_rows in (1, 4096):
        with pytest.raises(TypeError, match="op: expected an op name"):
            plans.plan_rows(num_rows, 8192, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, op=op)
        with pytest.raises(TypeError, match="op: expected an op name"):
            plans.row_layout(8192, _dtypes.bfloat16, True, num_rows=num_rows, op=op)


def test_large_row_counts_fit_the_grid():
    small = DeviceLimits(name="tiny", sm_count=2, max_grid_x=65535)
    plan = plans.plan_rows(10_000_000, 4096, _dtypes.float16, aligned=True, limits=small)
    assert plan.grid[0] == 65535  # the kernel walks the remaining rows grid-stride


def test_row_layout_heuristic_examples():
    # 8192 bf16 = 1024 leaves: at prefill 256 threads x 4 leaves, all in registers; at
    # decode 512 x 2.
    assert plans.row_layout(8192, _dtypes.bfloat16, True, num_rows=4096) == plans.RowLayout(256, 8, 4)
    assert plans.row_layout(8192, _dtypes.bfloat16, True, num_rows=1) == plans.RowLayout(512, 8, 2)
    # Past 64 rows the decode layout stays while the rows' threads fill at most half of an
    # H200's resident threads (DECODE_FILL_SHARE_DEFAULT: 132 SMs x 2048 / 2 = 512 x 264).
    assert plans.row_layout(8192, _dtypes.bfloat16, True, num_rows=264) == plans.RowLayout(512, 8, 2)
    assert plans.row_layout(8192, _dtypes.bfloat16, True, num_rows=265) == plans.RowLayout(256, 8, 4)
    # 1024 bf16 = 128 leaves: 32 threads x 4 leaves, 4 rows per 128-thread block.
    plan = plans.plan_rows(4096, 1024, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS)
    assert plan.layout == plans.RowLayout(32, 8, 4) and plan.rows_per_block == 4
    # Unaligned rows fall back to scalar accesses (the same leaves).
    assert plans.row_layout(8192, _dtypes.bfloat16, False, num_rows=1).vec_width == 1
    # Tiny rows share a 128-thread block: 5 fp32 = 2 leaves, one thread holds both.
    plan = plans.plan_rows(100, 5, _dtypes.float32, aligned=False, limits=H200_LIMITS)
    assert plan.layout.threads_per_row == 1 and plan.rows_per_block == 128


def test_the_decode_layout_stays_while_the_rows_fill_half_the_gpu():
    """Past DECODE_MAX_ROWS the decode layout stays while num_rows x its threads_per_row
    fill at most DECODE_FILL_SHARE[op] of sm_count x max_threads_per_sm."""
    def vecs(op, num_rows, limits=H200_LIMITS):
        return plans.plan_rows(num_rows, 4096, _dtypes.bfloat16, aligned=True, limits=limits, op=op).layout.vecs_per_thread

    # 4096 bf16 rows: the decode layout's 256 threads a row fill half of 132 x 2048 at 528 rows
    # (rms_norm's filled rows keep it longer: DECODE_FILL_SHARE_FILLED, below).
    for op in ("layer_norm", "rms_norm_quant", "fused_add_rms_norm_dynamic_per_token_quant", None):
        assert (vecs(op, 65), vecs(op, 528), vecs(op, 529)) == (2, 2, 4), op
        assert vecs(op, 264, replace(H200_LIMITS, sm_count=66)) == 2 and vecs(op, 265, replace(H200_LIMITS, sm_count=66)) == 4
    assert (vecs("row_reduce", 64), vecs("row_reduce", 65)) == (2, 4)  # share 0: prefill from 65 rows
    # softmax's share is a quarter: 256-thread rows to 264 (132 x 2048 / 4 / 256).
    assert (vecs("softmax", 264), vecs("softmax", 265)) == (2, 4)
    assert vecs("fused_add_rms_norm", 10**6) == 2  # any size


def test_rms_norm_takes_at_most_128_threads_a_row_at_prefill_sizes():
    """PREFILL_MAX_THREADS_PER_ROW: rms_norm's prefill rows take at most 128 threads, as
    many leaves a thread as that needs up to 8; other ops keep 4 leaves a thread."""
    def layout(op, hidden_size, dtype=_dtypes.bfloat16, num_rows=6000):  # past DECODE_FILL_SHARE_FILLED's rows
        return plans.row_layout(hidden_size, dtype, True, num_rows=num_rows, op=op)

    assert layout("rms_norm", 8192) == plans.RowLayout(128, 8, 8)        # llama-3.1-70b
    assert layout("rms_norm", 16384) == plans.RowLayout(256, 8, 8)       # 8 leaves at most
    assert layout("rms_norm", 4096) == plans.RowLayout(128, 8, 4)        # llama-3.1-8b: as before
    assert layout("rms_norm", 1024) == plans.RowLayout(32, 8, 4)
    assert layout("rms_norm", 4096, _dtypes.float32) == plans.RowLayout(128, 4, 8)
    for op in ("layer_norm", "rms_norm_quant", "softmax", None):
        assert layout(op, 8192) == plans.RowLayout(256, 8, 4), op
    assert layout("rms_norm", 8192, num_rows=64) == plans.RowLayout(512, 8, 2)  # decode: unchanged


@pytest.mark.parametrize("value", [3, 100, True, 128.0, "128", None])
def test_bad_prefill_thread_caps_are_refused_by_name(monkeypatch, value):
    monkeypatch.setitem(plans.PREFILL_MAX_THREADS_PER_ROW, "rms_norm", value)
    with pytest.raises(ValueError, match=r"plans.PREFILL_MAX_THREADS_PER_ROW\['rms_norm'\] must be one of"):
        plans.plan_rows(4096, 8192, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, op="rms_norm")
    for num_rows in (1, 64):  # read at every row count, not only where it decides (helper 111)
        with pytest.raises(ValueError, match=r"plans.PREFILL_MAX_THREADS_PER_ROW\['rms_norm'\] must be one of"):
            plans.plan_rows(num_rows, 8192, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, op="rms_norm")
    monkeypatch.setattr(plans, "PREFILL_MAX_THREADS_PER_ROW", [128])
    with pytest.raises(ValueError, match="plans.PREFILL_MAX_THREADS_PER_ROW must be a dict"):
        plans.plan_rows(4096, 8192, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, op="layer_norm")


_LIMIT_FIELDS = ("sm_count", "max_threads_per_block", "max_grid_x", "max_grid_y", "warp_size", "max_threads_per_sm")


class _LyingInt(int):
    """An int whose comparisons say it is never below anything (helper 63)."""
    def __lt__(self, other):
        return False


@pytest.mark.parametrize("field", _LIMIT_FIELDS)
@pytest.mark.parametrize("value", [0, -1, float("nan"), None, 2048.0, 132.5, True, "132", 2**31, 2**1100,
                                   np.uint64(2**63), _LyingInt(-5)])
def test_device_limits_refuse_bad_counts_where_built(field, value):
    """Every count is checked once, where the limits are built, so no plan reads a bad
    one: a negative sm_count flipped the fused add (share inf) to the prefill layout, a
    NaN kept softmax (share 0) on the decode layout at 4096 rows, a NaN
    max_threads_per_block passed plan_rope's min() (helper 59), a NaN or fractional
    sm_count made the activations' grid a float (helper 44), and the row, activation and
    attention plans read the fields unchecked (item 40); one past 2**1023 overflowed a
    float in the row plans, and an int subclass compared as it chose (helper 63)."""
    with pytest.raises(ValueError, match=rf"limits.{field}: expected an int in \[1, 2147483647\], got "):
        replace(H200_LIMITS, **{field: value})


def test_device_limits_hold_python_ints():
    """A NumPy count becomes a Python int (a numpy.uint8 sm_count wrapped in -(-n // sm_count))."""
    limits = DeviceLimits(name="numpy", sm_count=np.uint8(132), max_threads_per_block=np.int64(1024))
    assert type(limits.sm_count) is int and type(limits.max_threads_per_block) is int
    assert limits == replace(H200_LIMITS, name="numpy")
    with pytest.raises(TypeError, match="limits.name: expected a str, got NoneType"):
        DeviceLimits(name=None, sm_count=132)


def _planners() -> dict:
    """Each plan rule that takes limits, as a call of them with everything else valid."""
    bf16 = _dtypes.bfloat16
    row_plan = plans.plan_rows(1, 4096, bf16, aligned=True, limits=H200_LIMITS)
    rope_plan = plans.plan_rope(4096, 40, 128, 128, bf16, max_vec_width=8, fused_norm=False, limits=H200_LIMITS)
    return {
        "row_layout": lambda limits: plans.row_layout(4096, bf16, True, num_rows=1, limits=limits),
        "plan_rows": lambda limits: plans.plan_rows(1, 4096, bf16, aligned=True, limits=limits, op="rms_norm"),
        "validate": lambda limits: plans.validate(row_plan, bf16, True, limits, 4096),
        "plan_activation": lambda limits: plans.plan_activation(16, 14336, bf16, aligned=True, limits=limits),
        "plan_rope": lambda limits: plans.plan_rope(1, 40, 128, 128, bf16, max_vec_width=8, fused_norm=False,
                                                    in_place=True, limits=limits),
        "rope_resident_grid": lambda limits: plans.rope_resident_grid(rope_plan, 4096, 3, limits),
        "plan_gemv": lambda limits: plans.plan_gemv(1, 4096, bf16, aligned=True, limits=limits),
        "plan_attention": lambda limits: plans.plan_attention(1, 32, 8192, bf16, limits=limits),
        "plan_prefill_attention": lambda limits: plans.plan_prefill_attention(16, 32, 8, bf16, limits=limits),
    }


def test_decode_plans_check_their_counts_and_the_device():
    """Helper 63: plan_prefill_attention divided by a zero num_kv_heads, plan_gemv wrapped a
    numpy.uint8 n_out (242 blocks for 200 features), plan_attention made a float grid of
    1.5 tokens, and none of them (nor plan_rope) looked at the device's block size or warp
    width."""
    f32 = _dtypes.float32
    with pytest.raises(ValueError, match="num_kv_heads: expected an int >= 1, got 0"):
        plans.plan_prefill_attention(16, 16, 0, f32, limits=H200_LIMITS)
    with pytest.raises(ValueError, match="num_heads: expected a multiple of num_kv_heads"):
        plans.plan_prefill_attention(16, 12, 8, f32, limits=H200_LIMITS)
    assert plans.plan_gemv(1, np.uint8(200), f32, aligned=True, limits=H200_LIMITS).grid == (50, 1, 1)
    for bad in (1.5, -1, None, "4"):
        with pytest.raises(ValueError, match="num_tokens: expected an int >= 0, got "):
            plans.plan_attention(bad, 16, 8192, f32, limits=H200_LIMITS)
        with pytest.raises(ValueError, match="n_out: expected an int >= 0, got "):
            plans.plan_gemv(1, bad, f32, aligned=True, limits=H200_LIMITS)
    with pytest.raises(plans.PlanError, match=r"grid of 32 x 4096 exceeds the device's 2147483647 x 1"):
        plans.plan_attention(4096, 32, 8192, f32, limits=replace(H200_LIMITS, max_grid_y=1))
    # helper 67: 2**31 - 1 SMs wanted 134 million splits, past gridDim.z's 65535
    huge = plans.plan_attention(1, 32, 2**31 - 1, f32, limits=replace(H200_LIMITS, sm_count=2**31 - 1))
    assert huge.grid == (32, 1, plans.CUDA_MAX_GRID_Z) == (32, 1, huge.num_splits)
    small, wide = replace(H200_LIMITS, max_threads_per_block=64), replace(H200_LIMITS, warp_size=64)
    planners = _planners()
    for name in ("plan_gemv", "plan_attention", "plan_prefill_attention"):
        with pytest.raises(plans.PlanError, match=r"take blocks of \d+ threads; the device's hold at most 64"):
            planners[name](small)
        with pytest.raises(plans.PlanError, match="written for 32-lane warps; the device's are 64"):
            planners[name](wide)
    with pytest.raises(plans.PlanError, match="RoPE's kernels are written for 32-lane warps"):
        planners["plan_rope"](wide)


@pytest.mark.parametrize("planner", ["row_layout", "plan_rows", "validate", "plan_activation", "plan_rope",
                                     "rope_resident_grid", "plan_gemv", "plan_attention", "plan_prefill_attention"])
def test_planners_refuse_limits_that_are_not_device_limits(planner):
    """A dict of the same fields is not taken (plan_rows read its .name for the tuned
    file first: AttributeError); each rule plans on the H200's own limits."""
    call = _planners()[planner]
    assert call(H200_LIMITS) is not None
    for bad in ({"sm_count": 132}, None):
        with pytest.raises(TypeError, match=f"limits: expected a plans.DeviceLimits, got {type(bad).__name__}"):
            call(bad)


@pytest.mark.parametrize("name", ["fused_norm", "in_place", "mrope"])
@pytest.mark.parametrize("value", ["no", float("nan"), None, 0, 1.0])
def test_plan_rope_flags_are_bools(name, value):
    """Helper 60: in_place="no" or NaN planned apply_rope's in-place token kernel, a
    fused_norm of None raised a bare KeyError."""
    kwargs = {"fused_norm": False, "in_place": True, "mrope": False, name: value}
    for n in (1, 4096):
        with pytest.raises(TypeError, match=f"{name}: expected a bool, got {value!r}"):
            plans.plan_rope(n, 40, 128, 128, _dtypes.bfloat16, max_vec_width=8, limits=H200_LIMITS, **kwargs)
    assert plans.plan_rope(1, 40, 128, 128, _dtypes.bfloat16, max_vec_width=8, fused_norm=np.bool_(False),
                           in_place=np.bool_(True), limits=H200_LIMITS).token_kernel


@pytest.mark.parametrize("fused_norm", [False, True])
def test_plan_rope_takes_numpy_device_limits(fused_norm):
    """Helper 59: a numpy.uint8 sm_count wrapped in -(-num_tokens // sm_count); NumPy ints
    plan as Python ints do."""
    small = replace(H200_LIMITS, sm_count=100, max_threads_per_block=512)
    as_numpy = replace(small, sm_count=np.uint8(100), max_threads_per_block=np.uint16(512))
    for n in (1, 64, 399, 400, 4096, 300000):
        want = plans.plan_rope(n, 40, 128, 128, _dtypes.bfloat16, max_vec_width=8, fused_norm=fused_norm,
                               in_place=True, limits=small)
        assert plans.plan_rope(n, 40, 128, 128, _dtypes.bfloat16, max_vec_width=8, fused_norm=fused_norm,
                               in_place=True, limits=as_numpy) == want


@pytest.mark.parametrize("value", [np.float32(0.5), np.int64(1), 1])
def test_decode_fill_shares_take_any_real_number(monkeypatch, value):
    monkeypatch.setitem(plans.DECODE_FILL_SHARE, "rms_norm", value)
    assert plans.plan_rows(4096, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, op="rms_norm")


@pytest.mark.parametrize("value", [-1, float("nan"), True, np.bool_(True), "0.5", None, 10**400])
def test_bad_decode_fill_shares_are_refused_by_name(monkeypatch, value):
    monkeypatch.setitem(plans.DECODE_FILL_SHARE, "rms_norm", value)
    with pytest.raises(ValueError, match=r"plans.DECODE_FILL_SHARE\['rms_norm'\] must be a number >= 0"):
        plans.plan_rows(4096, 3584, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, op="rms_norm")
    for num_rows in (1, 64):  # read at every row count, not only where it decides (helper 111)
        with pytest.raises(ValueError, match=r"plans.DECODE_FILL_SHARE\['rms_norm'\] must be a number >= 0"):
            plans.plan_rows(num_rows, 3584, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, op="rms_norm")
    with pytest.raises(ValueError, match=r"plans.DECODE_FILL_SHARE\['rms_norm'\] must be a number >= 0"):
        # rows DECODE_FILL_SHARE_FILLED names: read and checked all the same (helper 107)
        plans.plan_rows(4096, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, op="rms_norm")
    monkeypatch.setattr(plans, "DECODE_FILL_SHARE_DEFAULT", value)
    with pytest.raises(ValueError, match=r"plans.DECODE_FILL_SHARE_DEFAULT must be a number >= 0"):
        plans.plan_rows(4096, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, op="layer_norm")
    monkeypatch.setattr(plans, "DECODE_FILL_SHARE", [0.5])
    with pytest.raises(ValueError, match="plans.DECODE_FILL_SHARE must be a dict"):
        plans.plan_rows(4096, 3584, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, op="rms_norm")


def _rms_layout(num_rows, hidden_size=4096, dtype=_dtypes.bfloat16, aligned=True, op="rms_norm", limits=H200_LIMITS):
    return plans.row_layout(hidden_size, dtype, aligned, num_rows=num_rows, op=op, limits=limits)


def test_rms_norm_keeps_its_filled_decode_layout_to_four_times_the_resident_threads(monkeypatch):
    """DECODE_FILL_SHARE_FILLED: rms_norm's decode layout stays, where it fills rows of
    4096 elements in 16-byte vectors with at most 256 threads (llama-3.1-8b's 256 x 2),
    until the rows' threads are 4 x 132 x 2048 (4224 rows); 512 threads a row (-70b's
    rows of 8192, fp32 rows of 4096: slower on the H200, item 64) keep half of them."""
    assert (_rms_layout(4224), _rms_layout(4225)) == (plans.RowLayout(256, 8, 2), plans.RowLayout(128, 8, 4))
    assert _rms_layout(4224, dtype=_dtypes.float16) == plans.RowLayout(256, 8, 2)
    assert (_rms_layout(264, 8192), _rms_layout(265, 8192)) == (plans.RowLayout(512, 8, 2), plans.RowLayout(128, 8, 8))
    assert (_rms_layout(264, dtype=_dtypes.float32), _rms_layout(265, dtype=_dtypes.float32)) == (
        plans.RowLayout(512, 4, 2), plans.RowLayout(128, 4, 8))
    # Half the resident threads, as main, where the entry does not apply: rows the layout fills
    # in part (qwen2.5-7b's 3584), scalar accesses, 1024 threads (fp32 rows of 8192), other
    # sizes (2048), other ops, and a GPU of 66 SMs at its own half and 4 times.
    assert (_rms_layout(528, 3584), _rms_layout(529, 3584)) == (plans.RowLayout(256, 8, 2), plans.RowLayout(128, 8, 4))
    assert _rms_layout(529, aligned=False).threads_per_row == 128
    assert (_rms_layout(132, 8192, _dtypes.float32).vecs_per_thread, _rms_layout(133, 8192, _dtypes.float32).vecs_per_thread) == (2, 8)
    assert (_rms_layout(1056, 2048).vecs_per_thread, _rms_layout(1057, 2048).vecs_per_thread) == (2, 4)
    assert _rms_layout(529, op="layer_norm").vecs_per_thread == 4
    small = replace(H200_LIMITS, sm_count=66)
    assert (_rms_layout(2112, limits=small), _rms_layout(2113, limits=small)) == (
        plans.RowLayout(256, 8, 2), plans.RowLayout(128, 8, 4))
    # The two bounds are the knobs: 512 threads and rows of 8192 (item 61's H100 rule) reach 70b.
    monkeypatch.setattr(plans, "FILLED_MOST_THREADS", 512)
    assert _rms_layout(2112, dtype=_dtypes.float32) == plans.RowLayout(512, 4, 2)  # fp32 rows of 4096
    assert _rms_layout(265, 8192).vecs_per_thread == 8  # 8192 is past the entry's most
    monkeypatch.setitem(plans.DECODE_FILL_SHARE_FILLED, "rms_norm", (4.0, 4096, 8192))
    assert (_rms_layout(2112, 8192), _rms_layout(2113, 8192)) == (plans.RowLayout(512, 8, 2), plans.RowLayout(128, 8, 8))


def test_the_filled_table_takes_other_values_and_ops(monkeypatch):
    monkeypatch.setitem(plans.DECODE_FILL_SHARE_FILLED, "rms_norm", (1.0, 4096, 4096))
    assert (_rms_layout(1056), _rms_layout(1057)) == (plans.RowLayout(256, 8, 2), plans.RowLayout(128, 8, 4))
    assert _rms_layout(529, 8192).vecs_per_thread == 8  # 8192: past the entry's most
    monkeypatch.setitem(plans.DECODE_FILL_SHARE_FILLED, "layer_norm", (float("inf"), 4096, 8192))
    assert _rms_layout(10**6, op="layer_norm") == plans.RowLayout(256, 8, 2)
    monkeypatch.setattr(plans, "FILLED_MOST_THREADS", 128)
    assert _rms_layout(529, op="layer_norm").vecs_per_thread == 4  # 256 threads: not of those timed
    monkeypatch.setattr(plans, "DECODE_FILL_SHARE_FILLED", {})
    assert _rms_layout(529).vecs_per_thread == 4  # main's rule


@pytest.mark.parametrize("value", [(-1, 4096, 8192), (float("nan"), 4096, 8192), (True, 4096, 8192),
                                   (4.0, 0, 8192), (4.0, 8192, 4096), (4.0, 4096.0, 8192), (4.0, 4096),
                                   [4.0, 4096, 8192], None])
def test_bad_filled_entries_are_refused_by_name_for_any_row(monkeypatch, value):
    """Checked at every plan (any row count: helper 111), also for rows and ops the entry
    does not name."""
    monkeypatch.setitem(plans.DECODE_FILL_SHARE_FILLED, "layer_norm", value)
    for op, hidden_size in (("rms_norm", 4096), ("softmax", 3584)):
        for num_rows in (1, 64, 1000):
            with pytest.raises(ValueError, match=r"^plans.DECODE_FILL_SHARE_FILLED\['layer_norm'\] must be \(share, "):
                _rms_layout(num_rows, hidden_size, op=op)
    monkeypatch.setattr(plans, "DECODE_FILL_SHARE_FILLED", [("rms_norm", (4.0, 4096, 8192))])
    with pytest.raises(ValueError, match=r"^plans.DECODE_FILL_SHARE_FILLED must be a dict"):
        _rms_layout(1000)
    monkeypatch.setattr(plans, "DECODE_FILL_SHARE_FILLED", {1: (4.0, 4096, 8192)})
    with pytest.raises(ValueError, match=r"^plans.DECODE_FILL_SHARE_FILLED must be a dict"):
        _rms_layout(1000)


@pytest.mark.parametrize("value", [0, 384, 512.0, True, None])
def test_bad_filled_thread_caps_are_refused_by_name(monkeypatch, value):
    monkeypatch.setattr(plans, "FILLED_MOST_THREADS", value)
    for num_rows in (1, 64, 529):  # read at every row count (helper 111)
        with pytest.raises(ValueError, match=r"^plans.FILLED_MOST_THREADS must be one of"):
            _rms_layout(num_rows)


def test_row_ops_are_the_ops_plan_rows_plans():
    """plans.ROW_OPS, the per-op tables' keys, are the registered ops of plan kind "rows"."""
    assert sorted(plans.ROW_OPS) == sorted(name for name, op in launcher.ops().items() if op.plan_kind == "rows")


@pytest.mark.parametrize("table, value", [("DECODE_FILL_SHARE", 0.5), ("DECODE_MAX_THREADS_PER_ROW", 256),
                                          ("PREFILL_MAX_THREADS_PER_ROW", 128),
                                          ("DECODE_FILL_SHARE_FILLED", (4.0, 4096, 4096))])
@pytest.mark.parametrize("key", ["rmsnorm", "", "silu_and_mul", 1])
def test_per_op_tables_refuse_ops_no_row_kernel_plans(monkeypatch, table, value, key):
    """A misspelt or foreign op name in a per-op table is a PlanError naming the table, at
    any shape and for any op planned (helper 111: it was ignored)."""
    monkeypatch.setitem(getattr(plans, table), key, value)
    pattern = r"^plans\.DECODE_FILL_SHARE_FILLED must be a dict" if table == "DECODE_FILL_SHARE_FILLED" and key == 1 \
        else rf"^plans\.{table} has entries for ops no row kernel plans: \[{key!r}\]"
    for num_rows, op in ((1, "rms_norm"), (64, "softmax"), (5000, "layer_norm"), (1, None)):
        with pytest.raises(ValueError, match=pattern):
            _rms_layout(num_rows, op=op)


@pytest.mark.parametrize("dtype, aligned, error", [(None, True, "dtype"), (np.int32, True, "dtype"),
                                                   (_dtypes.bfloat16, "no", "aligned"), (_dtypes.bfloat16, 1.0, "aligned")])
def test_row_layout_checks_dtype_and_aligned(dtype, aligned, error):
    """The public row_layout refuses what plan_rows refuses (helper 111: None was read as
    float64 and "no" as True), naming the argument."""
    with pytest.raises(TypeError, match=rf"^{error}: "):
        plans.row_layout(4096, dtype, aligned, num_rows=1000)
    assert plans.row_layout(4096, "bf16", True, num_rows=1) == plans.row_layout(4096, _dtypes.bfloat16, True, num_rows=1)


@pytest.mark.parametrize("name", ["DECODE_VECS_PER_THREAD", "PREFILL_VECS_PER_THREAD", "DECODE_MAX_ROWS"])
@pytest.mark.parametrize("value", [-1, 3, True, 2.0, None])
def test_bad_row_constants_are_refused_by_name(monkeypatch, name, value):
    """DECODE_VECS_PER_THREAD 0 raised ZeroDivisionError, 3 "threads_per_row must be one
    of ..., got 682" (naming no constant), None a TypeError from a comparison."""
    if name == "DECODE_MAX_ROWS" and value == 3:
        value = "3"  # any int >= 0 is a legal threshold
    monkeypatch.setattr(plans, name, value)
    for num_rows in (1, 4096):
        with pytest.raises(ValueError, match=f"plans.{name} must be "):
            plans.row_layout(4096, _dtypes.bfloat16, True, num_rows=num_rows)
        with pytest.raises(ValueError, match=f"plans.{name} must be "):
            plans.plan_rows(num_rows, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS)


@pytest.mark.parametrize("num_rows, hidden_size, message", [
    (-1, 4096, "num_rows: expected an int >= 0, got -1"), (True, 4096, "num_rows: expected an int >= 0, got True"),
    (2.0, 4096, "num_rows: expected an int >= 0, got 2.0"), (1, 0, "hidden_size: expected an int >= 1, got 0"),
    (1, -8, "hidden_size: expected an int >= 1, got -8"), (1, True, "hidden_size: expected an int >= 1, got True")])
def test_row_plans_refuse_bad_sizes(num_rows, hidden_size, message):
    """num_rows -1 planned a decode layout and a grid of one block; hidden_size -8 or True
    the layout of a one-element row."""
    with pytest.raises(ValueError, match=message):
        plans.row_layout(hidden_size, _dtypes.bfloat16, True, num_rows=num_rows)
    for op in (None, "rms_norm"):
        with pytest.raises(ValueError, match=message):
            plans.plan_rows(num_rows, hidden_size, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, op=op)


def test_row_plans_take_odd_sizes_and_numpy_ints():
    import numpy as np

    for hidden_size in (1, 7, 65537, 2**20, np.int64(4096)):
        for num_rows in (0, 1, np.int32(64), 65, 2**40):
            plan = plans.plan_rows(num_rows, hidden_size, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS)
            assert plan.layout == plans.row_layout(int(hidden_size), _dtypes.bfloat16, True, num_rows=int(num_rows))
            assert 1 <= plan.grid[0] <= H200_LIMITS.max_grid_x


def test_row_layout_template_args():
    layout = plans.RowLayout(64, 8, 2)
    assert layout.template_args() == (64, 8, 2, 32)


@pytest.mark.parametrize("choices, message", [
    (dict(threads_per_row=48), "threads_per_row"),
    (dict(vec_width=8), "vec_width"),
    (dict(vecs_per_thread=3), "vecs_per_thread"),
    (dict(threads_per_row=1024, rows_per_block=2), "block size"),
    (dict(threads_per_row=1, rows_per_block=8), "block size"),
    (dict(rows_per_block=3), "rows_per_block"),
    (dict(threads_per_row=64, block_size=96), "block size 96 is not threads_per_row 64 times a power of two"),
    (dict(threads_per_row=64, block_size=2048), "block size"),
])
def test_illegal_overrides_raise(choices, message):
    with pytest.raises(ValueError, match=message):
        plans.plan_rows(4, 4096, _dtypes.float32, aligned=False, limits=H200_LIMITS, overrides=choices)


def test_plan_rows_overrides_are_a_dict():
    plan = plans.plan_rows(4, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS,
                           overrides={"threads_per_row": 256, "vecs_per_thread": 2, "rows_per_block": 1})
    assert plan.layout == plans.RowLayout(256, 8, 2) and plan.rows_per_block == 1 and plan.origin == "override"
    # None values are "not given": the heuristic's plan.
    plan = plans.plan_rows(4, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS,
                           overrides={"threads_per_row": None})
    assert plan.origin == "heuristic"
    assert "overrides" in inspect.signature(plans.plan_rows).parameters
    with pytest.raises(TypeError):
        plans.plan_rows(4, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, threads_per_row=64)


_EVERY_PLANNER = {
    "rows": lambda overrides: plans.plan_rows(4, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS,
                                              overrides=overrides),
    "activation": lambda overrides: plans.plan_activation(4, 14336, _dtypes.bfloat16, aligned=True,
                                                          limits=H200_LIMITS, overrides=overrides),
    "rope": lambda overrides: plans.plan_rope(4, 40, 128, 128, _dtypes.bfloat16, max_vec_width=8, fused_norm=False,
                                              limits=H200_LIMITS, overrides=overrides),
    "gemv": lambda overrides: plans.plan_gemv(1, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS,
                                              overrides=overrides),
    "attention": lambda overrides: plans.plan_attention(1, 32, 4096, _dtypes.bfloat16, limits=H200_LIMITS,
                                                        overrides=overrides),
    "prefill_attention": lambda overrides: plans.plan_prefill_attention(16, 32, 8, _dtypes.bfloat16,
                                                                        limits=H200_LIMITS, overrides=overrides),
}


@pytest.mark.parametrize("planner", sorted(_EVERY_PLANNER))
@pytest.mark.parametrize("overrides", [[("block_size", 128)], "block_size", 128, ("vec_width",)])
def test_overrides_that_are_not_a_dict_are_refused_by_name(planner, overrides):
    """Helper 71: a list of pairs reached ``.items()`` (AttributeError) in the plan rules."""
    with pytest.raises(TypeError, match=r"overrides: expected a dict of launch overrides or None"):
        _EVERY_PLANNER[planner](overrides)
    _EVERY_PLANNER[planner](None)  # and no overrides plan as before
    _EVERY_PLANNER[planner]({})


@pytest.mark.parametrize("threads_per_row, block_size", [(32, 256), (64, 256), (256, 256), (128, 128), (32, 32)])
def test_block_size_override_sets_rows_per_block(threads_per_row, block_size):
    """A row op takes block_size = threads_per_row x rows_per_block (sweeps' --block-size)."""
    plan = plans.plan_rows(1000, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS,
                           overrides={"threads_per_row": threads_per_row, "block_size": block_size})
    assert plan.rows_per_block == block_size // threads_per_row
    assert plan.block_size == block_size and plan.block == (block_size, 1, 1)
    assert plan.origin == "override"


def test_block_size_override_with_the_heuristic_layout():
    layout = plans.row_layout(4096, _dtypes.bfloat16, True, num_rows=1000)
    plan = plans.plan_rows(1000, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS,
                           overrides={"block_size": 256})
    assert plan.layout == layout and plan.rows_per_block == 256 // layout.threads_per_row


def test_block_size_and_rows_per_block_together_raise():
    with pytest.raises(ValueError, match="block_size and rows_per_block"):
        plans.plan_rows(1000, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS,
                        overrides={"threads_per_row": 64, "block_size": 256, "rows_per_block": 4})


@pytest.mark.parametrize("key, value", [("threads_per_row", 64), ("rows_per_block", 2), ("vecs_per_thread", 2)])
def test_activation_plan_rejects_row_override_keys(key, value):
    with pytest.raises(ValueError, match=key):
        plans.plan_activation(4, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, overrides={key: value},
                              op="silu_and_mul")


@pytest.mark.parametrize("d", [2**31 - 16, 2**31 - 7, 2**31 - 1, 2**31, 2**40])
def test_activation_plan_refuses_rows_past_the_kernel_s_32_bit_indices(d):
    """The kernel's last vector of a row ends at i + vec_width in 32 bits: with d = 2**31 - 1
    and 8-wide vectors that sum wrapped and the vector path wrote past the row (helper-24)."""
    with pytest.raises(ValueError, match=r"^d: expected 1 \.\. 2147483631 outputs a row"):
        plans.plan_activation(1, d, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, op="silu_and_mul")
    assert plans.plan_activation(1, 2**31 - 17, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS).vec_width == 8


@pytest.mark.parametrize("num_rows, d, message", [(1, 0, "d: expected an int >= 1"), (1, True, "d: expected an int"),
                                                  (1, 4096.0, "d: expected an int"), (-1, 8, "num_rows: expected")])
def test_activation_plan_reads_its_counts_as_ints(num_rows, d, message):
    with pytest.raises(ValueError, match=message):
        plans.plan_activation(num_rows, d, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS)
    plan = plans.plan_activation(np.uint32(3), np.int64(4096), _dtypes.bfloat16, aligned=True, limits=H200_LIMITS)
    assert plan == plans.plan_activation(3, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS)


def test_unknown_row_override_key_raises():
    with pytest.raises(ValueError, match=r"\['head_slots'\] do not apply to rms_norm"):
        plans.plan_rows(4, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, op="rms_norm",
                        overrides={"head_slots": 2})


def test_check_override_keys():
    plans.check_override_keys({}, (), "apply_rope")
    plans.check_override_keys({"vec_width": 1}, plans.ACTIVATION_OVERRIDE_KEYS, "swiglu")
    with pytest.raises(ValueError, match=r"\['block_size'\] do not apply to apply_rope \(its plan takes: none\)"):
        plans.check_override_keys({"block_size": 64}, (), "apply_rope")


# ----------------------------------------------------------------- rope plans
@pytest.mark.parametrize("fused_norm, op", [(False, "apply_rope"), (True, "qk_rms_norm_rope")])
@pytest.mark.parametrize("key, value", [("block_size", 128), ("vec_width", 1), ("threads_per_row", 32),
                                        ("rows_per_block", 1), ("vecs_per_thread", 1)])
def test_rope_plan_rejects_every_override(fused_norm, op, key, value):
    """The rope rule takes no overrides: any key is an error naming it, never ignored."""
    with pytest.raises(ValueError, match=key):
        plans.plan_rope(64, 40, 128, 128, _dtypes.bfloat16, max_vec_width=8, fused_norm=fused_norm,
                        limits=H200_LIMITS, overrides={key: value}, op=op)


@pytest.mark.parametrize("value", [0, -8, 8.0, True, "8"])
def test_rope_plan_refuses_a_max_vec_width_that_is_not_an_int_of_one_or_more(value):
    """Helper 71: 0 reached ``max()`` of no widths (ValueError: max() arg is an empty sequence)."""
    with pytest.raises(ValueError, match=r"max_vec_width: expected an int >= 1"):
        plans.plan_rope(64, 40, 128, 128, _dtypes.bfloat16, max_vec_width=value, fused_norm=False,
                        limits=H200_LIMITS)
    # 1 (scalar access) and widths between the compiled ones plan the widest that fits.
    widths = [plans.plan_rope(64, 40, 128, 128, _dtypes.bfloat16, max_vec_width=w, fused_norm=False,
                              limits=H200_LIMITS).vec_width for w in (1, 3, 4, 8, 64)]
    assert widths == [1, 1, 4, 8, 8]


def test_rope_plan_without_overrides():
    for overrides in (None, {}):
        plan = plans.plan_rope(64, 40, 128, 128, _dtypes.bfloat16, max_vec_width=8, fused_norm=False,
                               limits=H200_LIMITS, overrides=overrides)
        assert plan.origin == "heuristic"


@pytest.mark.parametrize("fused_norm", [False, True])
@pytest.mark.parametrize("num_heads", [1, 5, 40, 72, 96, 136, 200])
def test_rope_decode_plans_give_every_head_a_slot_in_one_round(fused_norm, num_heads):
    """At decode sizes the wide layout raises heads_per_thread to the fewest compiled choice
    that fits every head of a token in one block (llama-3.1-70b's 64 + 8 heads took a second
    round with 2 a thread); where none fits, both take the steps kernel (their wide kernels
    hold one round only)."""
    allowed = plans.ROPE_WIDE_NORM_HEADS_CHOICES if fused_norm else plans.ROPE_WIDE_HEADS_CHOICES
    for num_tokens in (1, 64):
        plan = plans.plan_rope(num_tokens, num_heads, 128, 128, _dtypes.bfloat16, max_vec_width=8,
                               fused_norm=fused_norm, limits=H200_LIMITS)
        fits = [h for h in allowed if h >= plans.ROPE_WIDE_DECODE_HEADS_PER_THREAD
                and -(-num_heads // h) * plan.threads_per_head <= plans.ROPE_MAX_BLOCK_SIZE]
        if fits:
            assert plan.heads_per_thread == min(fits)
            assert plan.head_slots * plan.heads_per_thread >= num_heads  # one round
        else:
            assert plan.heads_per_thread == 0
    examples = {(72, False): 3, (72, True): 3, (40, False): 2, (136, False): 5, (200, False): 0, (136, True): 5}
    if (num_heads, fused_norm) in examples:
        plan = plans.plan_rope(1, num_heads, 128, 128, _dtypes.bfloat16, max_vec_width=8, fused_norm=fused_norm,
                               limits=H200_LIMITS)
        assert plan.heads_per_thread == examples[num_heads, fused_norm]


@pytest.mark.parametrize("num_heads, head_dim, heads_per_thread", [
    (40, 128, 5),   # llama-3.1-8b: 8 slots of 8 lanes, 4 tokens a 256-thread block, every thread x head slot used
    (72, 128, 5),   # llama-3.1-70b: 15 slots (75 head slots for 72 heads), 2 tokens a 256-thread block
    (32, 128, 4),   # 2 and 4 heads fill a block alike: the tie goes to more heads a thread
    (12, 64, 3),    # SmolLM2-135M (9 + 3 heads, 4 lanes a head): 16 tokens a 256-thread block
    (1, 128, 2),    # one head: a thread holds it whatever the choice, so the fewest leaves least idle
    (200, 128, 0),  # no choice fits 200 heads in a block: the steps kernel
])
def test_apply_rope_prefill_plans_take_the_fullest_block(num_heads, head_dim, heads_per_thread):
    """apply_rope at prefill sizes: among the compiled choices that fit one round, the one
    whose block of whole tokens rotates a head in the largest share of its thread x head
    slots, every head of a token in one round (bench/results/NOTES.md item 17)."""
    for num_tokens in (4096, 16384):
        plan = plans.plan_rope(num_tokens, num_heads, head_dim, head_dim, _dtypes.bfloat16, max_vec_width=8,
                               fused_norm=False, limits=H200_LIMITS)
        assert plan.heads_per_thread == heads_per_thread
        if heads_per_thread:
            assert plan.head_slots * heads_per_thread >= num_heads
            assert plan.block_size <= plans.ROPE_MAX_BLOCK_SIZE
    # qk_rms_norm_rope by the same rule from its constant (3) up, among its choices (2-5),
    # 5 only where it fills the block: llama-3.1-8b's 40 heads 5 a thread (block share 1.0
    # against 0.94 for 4), 70b's 72 3 (0.75 against 0.56 for 4; 5 fills 0.9), as measured
    # best (bench/results/NOTES.md items 31 and 33).
    for num_heads, heads_per_thread in ((40, 5), (72, 3), (48, 3)):
        plan = plans.plan_rope(16384, num_heads, 128, 128, _dtypes.bfloat16, max_vec_width=8, fused_norm=True,
                               limits=H200_LIMITS)
        assert plan.heads_per_thread == heads_per_thread


@pytest.mark.parametrize("max_threads_per_block", [128, 64, 32, 214, 33])
def test_rope_plans_respect_a_smaller_block_limit(max_threads_per_block):
    """A GPU whose blocks hold fewer threads than ROPE_MAX_BLOCK_SIZE gets fewer tokens or
    head slots a block, never a refusal (helper 56: 128-thread blocks refused llama-3.1-8b's
    40 heads at 4096 tokens, sized for 256; helpers 60 and 78: a limit of 214, not whole
    warps, planned 224-thread blocks and refused them), while the threads of one head fit; blocks of
    ROPE_MAX_BLOCK_SIZE threads or more plan exactly as the H200 (the rule reads the limit
    only through the cap)."""
    small = replace(H200_LIMITS, max_threads_per_block=max_threads_per_block)
    for fused_norm in (False, True):
        for dtype, max_vec in ((_dtypes.bfloat16, 8), (np.dtype(np.float32), 4), (_dtypes.bfloat16, 1)):
            for num_heads in (1, 12, 40, 72, 136, 200):
                for head_dim, rotary_dim in ((64, 64), (128, 128), (128, 64), (256, 256)):
                    for num_tokens in (1, 64, 4096, 16384):
                        args = (num_tokens, num_heads, head_dim, rotary_dim, dtype)
                        kwargs = dict(max_vec_width=max_vec, fused_norm=fused_norm)
                        plan = plans.plan_rope(*args, **kwargs, limits=small)
                        assert plan.block_size <= max_threads_per_block, (args, kwargs, plan)
                        assert plan.head_slots * plan.threads_per_head <= max_threads_per_block
                        for cap in (plans.ROPE_MAX_BLOCK_SIZE, 1024):
                            assert plans.plan_rope(*args, **kwargs, limits=replace(H200_LIMITS,
                                                                                    max_threads_per_block=cap)) \
                                == plans.plan_rope(*args, **kwargs, limits=H200_LIMITS)
    eight_b = plans.plan_rope(4096, 40, 128, 128, _dtypes.bfloat16, max_vec_width=8, fused_norm=False, limits=small)
    assert eight_b.tokens_per_block >= 1 and eight_b.block_size <= max_threads_per_block


def test_rope_plan_reads_counts_as_python_ints():
    """np.uint32(40) heads planned 32 slots (block 256) where 40 planned 20: -(-n // h)
    wrapped around in the unsigned type."""
    import numpy as np

    for fused_norm in (False, True):
        want = plans.plan_rope(1, 40, 128, 128, _dtypes.bfloat16, max_vec_width=8, fused_norm=fused_norm,
                               limits=H200_LIMITS)
        for kind in (np.uint32, np.uint16, np.int16, np.int64):
            got = plans.plan_rope(kind(1), kind(40), kind(128), kind(128), _dtypes.bfloat16, max_vec_width=8,
                                  fused_norm=fused_norm, limits=H200_LIMITS)
            assert got == want and all(type(v) is int for v in (got.head_slots, got.heads_per_thread))


@pytest.mark.parametrize("args, message", [
    ((1, 0, 128, 128), "num_heads: expected an int >= 1, got 0"),
    ((-1, 40, 128, 128), "num_tokens: expected an int >= 0, got -1"),
    ((1.5, 40, 128, 128), "num_tokens: expected an int >= 0, got 1.5"),
    ((1, 40, 0, 128), "head_dim: expected an int >= 2, got 0"),
    ((1, 40, 128, 0), "rotary_dim: expected an int >= 2, got 0"),
    ((1, 40, 128, 256), r"rotary_dim: expected an even number <= head_dim \(128\), got 256"),
    ((1, 40, 128, 63), r"rotary_dim: expected an even number <= head_dim \(128\), got 63"),
])
def test_rope_plan_refuses_bad_counts(args, message):
    """These raised ZeroDivisionError or returned a plan (rotary_dim 256 of head_dim 128)."""
    for fused_norm in (False, True):
        with pytest.raises(ValueError, match=message):
            plans.plan_rope(*args, _dtypes.bfloat16, max_vec_width=8, fused_norm=fused_norm, limits=H200_LIMITS)


@pytest.mark.parametrize("name", ["ACTIVATION_BLOCK_SIZE", "ACTIVATION_MIN_BLOCK_SIZE"])
@pytest.mark.parametrize("value", [-5, 0, 96, True, 1.0, None])
def test_bad_activation_constants_are_refused_by_name(monkeypatch, name, value):
    """ACTIVATION_MIN_BLOCK_SIZE -5 raised ZeroDivisionError; 96 halved past itself to 64."""
    monkeypatch.setattr(plans, name, value)
    with pytest.raises(ValueError, match=f"plans.{name} must be one of"):
        plans.plan_activation(1, 8, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS)


def test_rope_plan_fields():
    plan = plans.plan_rope(16384, 40, 128, 128, _dtypes.bfloat16, max_vec_width=8, fused_norm=False,
                           limits=H200_LIMITS)
    fields = plan.fields()
    assert set(fields) == set(plans.PLAN_FIELDS)
    assert fields["plan_kind"] == "rope" and fields["origin"] == "heuristic"
    assert fields["vec_width"] == plan.vec_width == 8
    assert fields["threads_per_head"] == plan.threads_per_head
    assert fields["head_slots"] == plan.head_slots
    assert fields["tokens_per_block"] == plan.tokens_per_block
    assert fields["grid"] == plan.grid[0] and fields["block_size"] == plan.block_size
    assert fields["threads_per_row"] is None and fields["rows_per_block"] is None
    assert None not in (fields["threads_per_head"], fields["head_slots"], fields["tokens_per_block"])


def test_row_and_activation_plan_fields():
    row = plans.plan_rows(4096, 1024, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS)
    assert row.fields() == {**dict.fromkeys(plans.PLAN_FIELDS), "plan_kind": "rows", "origin": "heuristic",
                            "grid": row.grid[0], "block_size": 128, "threads_per_row": 32, "vec_width": 8,
                            "vecs_per_thread": 4, "rows_per_block": 4, "exact": False, "reread": False}
    act = plans.plan_activation(4096, 14336, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS)
    fields = act.fields()
    assert set(fields) == set(plans.PLAN_FIELDS)
    assert (fields["plan_kind"], fields["origin"], fields["block_size"], fields["vec_width"]) == \
        ("activation", "heuristic", 256, 8)
    assert fields["threads_per_row"] is None and fields["threads_per_head"] is None


@pytest.mark.parametrize("op, num_rows, exact", [
    ("rms_norm", 1, True), ("rms_norm", 4096, True),  # every layout of rms_norm (EXACT_WALK)
    ("fused_add_rms_norm", 1, True), ("fused_add_rms_norm", 4096, True),  # 2 leaves at any size (DECODE_FILL_SHARE)
    ("layer_norm", 1, True), ("layer_norm", 4096, False),  # 4 leaves a thread at 4096
    ("softmax", 1, True), ("softmax", 256, True), ("softmax", 257, False),  # up to 256 rows
    ("row_reduce", 1, False), ("rms_norm_quant", 1, False), (None, 1, False),  # bounded walk only
])
def test_row_plan_records_the_exact_walk(op, num_rows, exact):
    """plan_rows answers exact_walk for the ops of EXACT_WALK (the kernels' kExact, and the
    sweep point's `exact` field), False for the rest."""
    plan = plans.plan_rows(num_rows, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, op=op)
    assert plan.layout.fills(4096, _dtypes.bfloat16)
    assert plan.exact is exact and plan.fields()["exact"] is exact


@pytest.mark.parametrize("dtype, hidden_size, threads", [
    (_dtypes.bfloat16, 4096, 256), (_dtypes.float16, 8192, 512), (_dtypes.float32, 4096, 512),
])
def test_rms_norm_rereads_from_8192_rows_in_the_layout_timed(dtype, hidden_size, threads):
    """rms_norm reads its rows again from L2 (kReread) from REREAD's 8192 rows of 4096 to
    8192 elements, in 2 leaves a thread, where that layout fills the row; one row short it
    holds them in its prefill layout, and the kernel it launches is built."""
    from cupykern.ops import norm

    fewest_rows = plans.REREAD["rms_norm"][0]
    plan = plans.plan_rows(fewest_rows, hidden_size, dtype, aligned=True, limits=H200_LIMITS, op="rms_norm")
    assert (plan.layout.threads_per_row, plan.layout.vecs_per_thread) == (threads, 2)
    assert plan.reread and plan.exact and plan.fields()["reread"] is True
    args = norm._template_args(dtype, plan)
    assert args[-2:] == (True, True) and norm.RMS_NORM.expr(*args) in families.instantiations()["norm.cu"]
    short = plans.plan_rows(fewest_rows - 1, hidden_size, dtype, aligned=True, limits=H200_LIMITS, op="rms_norm")
    assert not short.reread and short.layout.vecs_per_thread in (4, 8)
    assert norm._template_args(dtype, short)[-1] is True  # kExact, and kReread left at its default


@pytest.mark.parametrize("case", ["fused_add_rms_norm", "layer_norm", "unaligned", "5120 elements", "2048 elements",
                                  "16384 elements", "fp32 2048 elements", "fp32 8192 elements", "override 4 leaves",
                                  "override 8 leaves"])
def test_rereading_stays_where_it_was_timed(case):
    """No kReread for the other ops, the scalar path, rows the layout does not fill (5120
    bf16: 640 leaves), rows of fewer or more elements than REREAD's, fp32 rows of 8192
    (reread_layout's 1024 x 2 is past REREAD_MAX_THREADS_PER_ROW; 512 x 4 was not
    sanitized), or a layout a sweep overrides to other than the one timed; the override
    that names it rereads."""
    n, dtype = 16384, _dtypes.bfloat16
    op, hidden_size, aligned, overrides = "rms_norm", 4096, True, None
    if case in ("fused_add_rms_norm", "layer_norm"):
        op = case
    elif case == "unaligned":
        aligned = False
    elif case.endswith("elements"):
        dtype = _dtypes.float32 if case.startswith("fp32") else dtype
        hidden_size = int(case.split()[-2])
    else:
        overrides = {"vecs_per_thread": int(case.split()[1])}
    plan = plans.plan_rows(n, hidden_size, dtype, aligned=aligned, limits=H200_LIMITS, op=op, overrides=overrides)
    assert plan.reread is False
    named = plans.plan_rows(n, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, op="rms_norm",
                            overrides={"vecs_per_thread": 2})
    assert named.reread is True and named.origin == "override"


def test_no_reread_without_the_exact_walk_or_past_the_block_limit(monkeypatch):
    """The rereading kernels are built with the exact walk alone, so a row limit of
    EXACT_WALK that turns it off turns the reread off (the layout holds its row); and a GPU
    whose blocks hold fewer threads than reread_layout's row gets the prefill layout."""
    from cupykern.ops import norm

    small = replace(H200_LIMITS, max_threads_per_block=256)
    plan = plans.plan_rows(16384, 8192, _dtypes.bfloat16, aligned=True, limits=small, op="rms_norm")
    assert not plan.reread and plan.layout.threads_per_row <= 256 and plan.block_size <= 256
    monkeypatch.setitem(plans.EXACT_WALK, "rms_norm", (8, 4096))
    plan = plans.plan_rows(16384, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, op="rms_norm")
    assert not plan.exact and not plan.reread and plan.layout.vecs_per_thread in (4, 8)
    # An override naming the rereading layout: the bounded walk, so the kernel holds its row.
    named = plans.plan_rows(16384, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, op="rms_norm",
                            overrides={"vecs_per_thread": 2})
    assert not named.exact and not named.reread
    built = families.instantiations()["norm.cu"]
    for p in (plan, named):
        assert norm.RMS_NORM.expr(*norm._template_args(_dtypes.bfloat16, p)) in built


@pytest.mark.parametrize("max_threads_per_block", [512, 256, 64])
def test_row_plans_respect_a_smaller_block_limit(max_threads_per_block):
    """A GPU whose blocks hold fewer threads than the layout row_layout would pick gets a
    narrower layout of the same tree (helper 46 found 512- and 1024-thread rows planned for
    a 256-thread device, refused by validate): every row op plans every size within the
    limit, and on blocks of at least 256 threads refuses none."""
    small = replace(H200_LIMITS, max_threads_per_block=max_threads_per_block)
    for op in ("rms_norm", "fused_add_rms_norm", "layer_norm", "softmax", "row_reduce"):
        for dtype in (_dtypes.bfloat16, np.dtype(np.float32)):
            for hidden in (1000, 4096, 8192, 16384, 131072):
                for rows in (1, 64, 1024, 16384):
                    try:
                        plan = plans.plan_rows(rows, hidden, dtype, aligned=True, limits=small, op=op)
                    except plans.PlanError:
                        assert max_threads_per_block < 256, (op, hidden, rows)
                        continue
                    assert plan.block_size <= max_threads_per_block, (op, hidden, rows, plan)
                    assert plan.layout.threads_per_row in plans.tree_threads_per_row(hidden, dtype)


def test_reread_is_built_for_its_layouts_only():
    """The rereading kernels: the exact walk on 16-byte vectors in 256 x 2 and 512 x 2 for
    16-bit rows, 512 x 2 for fp32's (rows of 4096 and 8192 elements), rms_norm_kernel's
    alone: the 5 instantiations that ran under the sanitizers."""
    from cupykern.ops import norm

    built = [e for e in norm.instantiations()[norm.RMS_NORM] if e.endswith(", true, true>")]
    assert not any(e.endswith(", false, true>") for e in norm.instantiations()[norm.RMS_NORM])
    assert sorted(built) == sorted(f"rms_norm_kernel<{t}, {p}, {w}, 2, 32, true, true>" for t, w, p in (
        ("__nv_bfloat16", 8, 256), ("__nv_bfloat16", 8, 512), ("__half", 8, 256), ("__half", 8, 512),
        ("float", 4, 512)))
    layout = plans.RowLayout(256, 8, 2)
    assert plans.reread_choices("fused_add_rms_norm", layout, True) == (False,)
    assert plans.reread_choices("rms_norm", layout, False) == (False,)
    assert plans.reread_choices("rms_norm", plans.RowLayout(256, 1, 2), True) == (False,)


@pytest.mark.parametrize("value", [(8192, 4096), (0, 4096, 8192), (8192.0, 4096, 8192), (8192, 4096, True),
                                   (8192, 8192, 4096), "8192", None])
def test_bad_reread_constant_is_a_plan_error(monkeypatch, value):
    monkeypatch.setitem(plans.REREAD, "rms_norm", value)
    with pytest.raises(plans.PlanError, match=r"plans.REREAD\['rms_norm'\] must be"):
        plans.plan_rows(16384, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, op="rms_norm")


def test_bad_reread_table_or_thread_cap_is_a_plan_error(monkeypatch):
    monkeypatch.setattr(plans, "REREAD_MAX_THREADS_PER_ROW", 384)
    with pytest.raises(plans.PlanError, match="plans.REREAD_MAX_THREADS_PER_ROW must be one of"):
        plans.plan_rows(16384, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, op="rms_norm")
    monkeypatch.setattr(plans, "REREAD_MAX_THREADS_PER_ROW", 512)
    for table in ([("rms_norm", (8192, 4096, 8192))], {"layer_norm": (8192, 4096, 8192)}):
        monkeypatch.setattr(plans, "REREAD", table)
        with pytest.raises(plans.PlanError, match=r"plans.REREAD must be a dict .* with ops of \('rms_norm',\)"):
            plans.plan_rows(16384, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, op="rms_norm")
        with pytest.raises(plans.PlanError, match="plans.REREAD must be a dict"):
            plans.reread_limits("rms_norm")
    monkeypatch.setattr(plans, "REREAD", {})
    with pytest.raises(plans.PlanError, match="plans.REREAD has no entry for 'rms_norm'"):
        plans.reread_limits("rms_norm")


# ----------------------------------------------------------------- device limits
def test_device_limits_of_device_requires_a_device_id():
    """Limits are per GPU: no default id (it used to cache device 0's under None)."""
    parameter = inspect.signature(DeviceLimits.of_device).parameters["device_id"]
    assert parameter.default is inspect.Parameter.empty
    with pytest.raises(TypeError):
        DeviceLimits.of_device()


def test_limits_constants():
    assert plans.MAX_BLOCK_SIZE == 1024 and not hasattr(plans, "MAX_THREADS_PER_ROW")
    assert H200_LIMITS.sm_count == 132 and H200_LIMITS.max_threads_per_block == plans.MAX_BLOCK_SIZE


# ----------------------------------------------------------------- launcher override context
def test_override_context_is_scoped():
    with launcher.overrides(threads_per_row=64):
        assert launcher.current_overrides() == {"threads_per_row": 64}
        with launcher.overrides(rows_per_block=2):
            assert launcher.current_overrides() == {"threads_per_row": 64, "rows_per_block": 2}
        assert launcher.current_overrides() == {"threads_per_row": 64}
    assert launcher.current_overrides() == {}
    with pytest.raises(TypeError):
        launcher.overrides(block=3)


def test_override_context_keys():
    assert launcher.overrides.KEYS == {"threads_per_row", "vec_width", "vecs_per_thread", "rows_per_block",
                                       "block_size", "grid_stride"}
    with launcher.overrides(block_size=256, vec_width=None):  # None: not given
        assert launcher.current_overrides() == {"block_size": 256}
    assert launcher.current_overrides() == {}


def test_override_context_is_per_thread():
    import threading

    seen = {}
    with launcher.overrides(threads_per_row=64):
        thread = threading.Thread(target=lambda: seen.setdefault("other", launcher.current_overrides()))
        thread.start()
        thread.join()
    assert seen["other"] == {}


def test_row_layout_fills_exactly_its_first_round():
    """kExact's condition: hidden_size == threads_per_row x vecs_per_thread x leaf width, a
    Python bool for NumPy sizes too (KernelTemplate.expr spells only bool as true/false)."""
    layout = plans.RowLayout(256, 8, 2)
    bf16 = _dtypes.bfloat16
    assert layout.fills(4096, bf16) is True and layout.fills(np.int64(4096), bf16) is True
    assert layout.fills(4088, bf16) is False and layout.fills(np.int64(4104), bf16) is False
    assert plans.RowLayout(256, 4, 2).fills(2048, _dtypes.float32) is True  # fp32 leaves of 4


@pytest.mark.parametrize("dtype", [np.float64, np.int8, None, "bogus"])
def test_every_plan_names_a_dtype_it_cannot_plan(dtype):
    """helper 67: plan_rows raised a bare KeyError: dtype('float64'), and NumPy's words for
    "bf16"-like names it does not know."""
    calls = [
        lambda: plans.plan_rows(16, 4096, dtype, aligned=True, limits=H200_LIMITS, op="rms_norm"),
        lambda: plans.plan_activation(16, 4096, dtype, aligned=True, limits=H200_LIMITS),
        lambda: plans.plan_rope(16, 40, 128, 128, dtype, max_vec_width=8, fused_norm=False, limits=H200_LIMITS),
        lambda: plans.plan_gemv(1, 4096, dtype, aligned=True, limits=H200_LIMITS),
        lambda: plans.plan_attention(1, 32, 4096, dtype, limits=H200_LIMITS),
        lambda: plans.plan_prefill_attention(64, 32, 8, dtype, limits=H200_LIMITS),
    ]
    for call in calls:
        with pytest.raises(TypeError, match="dtype: unsupported dtype .*expected float32, float16 or bfloat16"):
            call()


def test_plan_rows_takes_dtype_names_for_every_op():
    """helper 68: "bf16" passed the dtype check but reached exact_walk raw for rms_norm and softmax."""
    for op in ("rms_norm", "softmax", "fused_add_rms_norm", None):
        named = plans.plan_rows(16, 4096, "bf16", aligned=True, limits=H200_LIMITS, op=op)
        assert named == plans.plan_rows(16, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, op=op)


@pytest.mark.parametrize("aligned", ["no", 1.0, None])
def test_plans_take_aligned_as_a_bool_only(aligned):
    """helper 67: aligned="no" planned 16-byte vectors."""
    for call in (lambda: plans.plan_rows(16, 4096, np.float16, aligned=aligned, limits=H200_LIMITS),
                 lambda: plans.plan_activation(16, 4096, np.float16, aligned=aligned, limits=H200_LIMITS),
                 lambda: plans.plan_gemv(1, 4096, np.float16, aligned=aligned, limits=H200_LIMITS)):
        with pytest.raises(TypeError, match="aligned: expected a bool"):
            call()


@pytest.mark.parametrize("name, value, planner", [
    ("GEMV_WARPS", 0, "gemv"), ("GEMV_WARPS", 2, "gemv"), ("GEMV_WARPS", 8, "gemv"), ("GEMV_AHEAD", -1, "gemv"),
    ("GEMV_MANY_ROWS", None, "gemv"), ("GEMV_MANY_ROWS_PER_WARP", 2.0, "gemv"), ("GEMV_MANY_ROWS_AHEAD", True, "gemv"),
    ("GEMV_MAX_TOKENS", (), "gemv"), ("GEMV_MAX_TOKENS", None, "gemv"), ("GEMV_MAX_TOKENS", (1, 4, 16.5), "gemv"),
    ("GEMV_MAX_TOKENS", (16, 4, 1), "gemv"), ("GEMV_MAX_TOKENS", [1, 4, 16], "gemv"),
    ("ATTENTION_WARPS", 0, "attention"), ("ATTENTION_ONE_SPLIT_ROWS", -1, "attention"),
    ("ATTENTION_MIN_SPLIT_ROWS", 0, "attention"), ("CUDA_MAX_GRID_Z", 0, "attention"),
    ("CUDA_MAX_GRID_Z", 65536, "attention"),
    ("PREFILL_ATTENTION_WARPS", 0, "prefill_attention"), ("PREFILL_ATTENTION_LANES_PER_ROW", 3, "prefill_attention"),
    ("PREFILL_ATTENTION_LANES_PER_ROW", 64, "prefill_attention"),
])
def test_bad_decode_constants_are_refused_by_name(monkeypatch, name, value, planner):
    """Helper 71: the decode family's constants were read unchecked (0 warps divided by zero,
    3 lanes a row planned tiles the kernel's static_assert refuses), as the row and RoPE
    constants are not. Helper 74: GEMV_WARPS other than gemv.cu's fixed kGemvWarps (4)
    would leave features unwritten, and GEMV_MAX_TOKENS went unchecked."""
    monkeypatch.setattr(plans, name, value)
    with pytest.raises(plans.PlanError, match=rf"plans\.{name} must be"):
        _EVERY_PLANNER[planner](None)


def test_legal_decode_constants_still_plan(monkeypatch):
    monkeypatch.setattr(plans, "ATTENTION_ONE_SPLIT_ROWS", 0)  # split from the first row
    assert plans.plan_attention(1, 32, 4096, _dtypes.bfloat16, limits=H200_LIMITS).num_splits > 1
    monkeypatch.setattr(plans, "PREFILL_ATTENTION_LANES_PER_ROW", 4)
    assert plans.plan_prefill_attention(16, 32, 8, _dtypes.bfloat16, limits=H200_LIMITS).rows_per_warp == 8


def test_legal_gemv_constants_still_plan(monkeypatch):
    """0 turns the look-ahead off (gemv.cu's kAhead)."""
    monkeypatch.setattr(plans, "GEMV_AHEAD", 0)
    monkeypatch.setattr(plans, "GEMV_MAX_TOKENS", (2, 8))
    plan = plans.plan_gemv(3, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS)
    assert plan.ahead == 0 and plan.max_tokens == 8


@pytest.mark.parametrize("kwargs, match", [(dict(many_rows="no"), r"many_rows: expected a bool"),
                                           (dict(many_rows=float("nan")), r"many_rows: expected a bool"),
                                           (dict(op=5), r"op: expected an op name")])
def test_plan_gemv_refuses_flags_that_are_not_bools_and_ops_that_are_not_names(kwargs, match):
    """Helper 74: ``many_rows="no"`` read as True."""
    with pytest.raises(TypeError, match=match):
        plans.plan_gemv(1, 32768, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, **kwargs)


def test_unknown_override_keys_of_mixed_types_are_named():
    """Helper 74: sorting {1, "a"} raised "'<' not supported" instead of naming the keys."""
    with pytest.raises(ValueError, match=r"launch overrides \['a', 1\] do not apply"):
        plans.plan_rows(4, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, overrides={1: 2, "a": 3})
