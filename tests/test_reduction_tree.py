"""The row reduction tree (kernels_cu/cupykern/reduce.cuh): every layout gives the same bits.

CPU: a NumPy emulation of each layout's schedule (tests/reduction_tree.py) builds the
same expression as the tree's definition for every threads_per_row the planner may
choose, every dtype and the row sizes of the model presets; float32 sums and maxima of
awkward data agree bit for bit; the planner only picks such layouts, at every num_tokens.
GPU (marked): every op that reduces rows gives identical bytes through every layout
(launched explicitly through launcher.overrides) and at every num_tokens, and row_reduce's
sum and max equal the float32 emulation of the tree bit for bit.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from cupykern import _dtypes, jit, models, plans
from cupykern.plans import H200_LIMITS
from tests import reduction_tree as rt
from tests.helpers import DTYPE_IDS, DTYPES

#: Row sizes: every preset's hidden_size, head_dim and intermediate_size, and edges:
#: one element, partial leaves, a row past MAX_TREE_COLUMNS leaves, a vocabulary.
PRESET_SIZES = sorted({s for m in models.PRESETS.values() for s in (m.hidden_size, m.head_dim, m.intermediate_size)})
EDGE_SIZES = [1, 3, 5, 8, 127, 1000, 4097, 16384, 65536 + 12, 128256]
SIZES = sorted(set(PRESET_SIZES + EDGE_SIZES))
#: num_tokens the planner sees: decode, the decode limit and past it, prefill.
NUM_TOKENS = [1, 16, plans.DECODE_MAX_ROWS, plans.DECODE_MAX_ROWS + 1, 4096, 16384]


# ----------------------------------------------------------------- CPU: the schedules
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_every_tree_layout_builds_the_trees_expression(size, dtype):
    leaves = list(range(plans.num_leaves(size, dtype)))
    want = rt.tree_root(leaves, size, dtype, rt.symbolic, rt.IDENTITY)
    threads = plans.tree_threads_per_row(size, dtype)
    assert threads and threads[-1] == plans.MAX_BLOCK_SIZE
    for p in threads:
        a = plans.tree_vecs_per_thread(size, dtype, p)
        assert rt.layout_root(leaves, size, dtype, p, a, rt.symbolic, rt.IDENTITY) == want, (p, a)


@pytest.mark.parametrize("size", [5, 127, 4096, 4097])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_wider_layouts_of_rows_up_to_the_widest_tree_build_it_too(size, dtype):
    """P * A above J: the extra columns hold the identity only (a row of at most
    MAX_TREE_COLUMNS leaves has one leaf per column), so the expression is the same."""
    leaves = list(range(plans.num_leaves(size, dtype)))
    want = rt.tree_root(leaves, size, dtype, rt.symbolic, rt.IDENTITY)
    for p in plans.THREADS_PER_ROW_CHOICES:
        for a in plans.VECS_PER_THREAD_CHOICES:
            if plans.tree_fits(size, dtype, p, a):
                assert rt.layout_root(leaves, size, dtype, p, a, rt.symbolic, rt.IDENTITY) == want, (p, a)


@pytest.mark.parametrize("size, dtype, threads_per_row, vecs_per_thread", [
    (4096, _dtypes.bfloat16, 32, 4),     # P * A = 128 = J / 4: four leaves per column in order
    (1000, np.float32, 8, 8),            # 64 = J / 4
    (127, np.float16, 1, 4),             # 4 = J / 4
    (65536, _dtypes.bfloat16, 1024, 4),  # 4096 > J = MAX_TREE_COLUMNS, a row of 8192 leaves
    (65536, _dtypes.bfloat16, 512, 2),   # J / 2 with several leaves per column
])
def test_the_emulation_sees_a_wrong_column_count(size, dtype, threads_per_row, vecs_per_thread):
    """The check has teeth: a layout that does not fit the tree builds another expression."""
    assert not plans.tree_fits(size, dtype, threads_per_row, vecs_per_thread)
    leaves = list(range(plans.num_leaves(size, dtype)))
    want = rt.tree_root(leaves, size, dtype, rt.symbolic, rt.IDENTITY)
    assert rt.layout_root(leaves, size, dtype, threads_per_row, vecs_per_thread, rt.symbolic, rt.IDENTITY) != want


def _awkward_row(rng, size, dtype):
    """Values across 2^-12 .. 2^12 of both signs (finite in fp16), so float32 sums depend
    on the order."""
    x = rng.standard_normal(size) * np.exp2(rng.integers(-12, 13, size))
    return x.astype(np.float32).astype(dtype)


@pytest.mark.parametrize("size", [5, 576, 3584, 4096, 5120, 8192, 16384, 65536 + 12])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_float32_sums_are_bit_identical_across_layouts(size, dtype):
    rng = np.random.default_rng(size)
    leaves = rt.leaf_sums(_awkward_row(rng, size, dtype))
    want = rt.tree_root(leaves, size, dtype, rt.f32_add, np.float32(-0.0))
    for p in plans.tree_threads_per_row(size, dtype):
        a = plans.tree_vecs_per_thread(size, dtype, p)
        lanes = rt.layout_lanes(leaves, size, dtype, p, a, rt.f32_add, np.float32(-0.0))
        got = np.array(lanes, np.float32)
        # Lane 0 holds the root; the others (b + a) are the same bits: IEEE addition commutes.
        assert (got.view(np.uint32) == np.float32(want).view(np.uint32)).all(), (p, a)


def test_the_float32_data_are_order_sensitive():
    """A sequential sum (one thread owning the row) differs from the tree's for most rows:
    the equalities above are not luck."""
    differ = 0
    for seed in range(20):
        leaves = rt.leaf_sums(_awkward_row(np.random.default_rng(seed), 4096, np.float32))
        sequential = np.float32(-0.0)
        for leaf in leaves:
            sequential = rt.f32_add(sequential, leaf)
        differ += sequential != rt.tree_root(leaves, 4096, np.float32, rt.f32_add, np.float32(-0.0))
    assert differ >= 10


def test_signed_zero_padding_is_exact():
    """-0.0 is the identity of IEEE addition; +0.0 is not (it would turn a -0.0 sum into +0.0)."""
    zero = np.float32(-0.0)
    for x in (np.float32(-0.0), np.float32(0.0), np.float32(1.5), np.float32(-3e-38)):
        assert rt.f32_add(zero, x).view(np.uint32) == x.view(np.uint32)
        assert rt.f32_add(x, zero).view(np.uint32) == x.view(np.uint32)
    assert rt.f32_add(np.float32(0.0), np.float32(-0.0)).view(np.uint32) != np.float32(-0.0).view(np.uint32)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_max_with_signed_zeros_and_nan_payloads_is_lane_zeros(dtype):
    """MaxOp does not commute on +-0 and on NaN payloads: lane 0 (broadcast by the kernel)
    holds the tree's root in every layout."""
    size = 1000
    row = np.where(np.arange(size) % 2, 0.0, -0.0).astype(np.float32)
    maxima = rt.leaf_maxes(row.astype(dtype))
    want = rt.tree_root(maxima, size, dtype, rt.f32_max, np.float32(-np.inf))
    for p in plans.tree_threads_per_row(size, dtype):
        a = plans.tree_vecs_per_thread(size, dtype, p)
        got = rt.layout_root(maxima, size, dtype, p, a, rt.f32_max, np.float32(-np.inf))
        assert np.float32(got).view(np.uint32) == np.float32(want).view(np.uint32), (p, a)


# ----------------------------------------------------------------- CPU: the planner
def test_constants_mirror_the_kernels():
    text = (Path(jit.__file__).resolve().parent.parent / "kernels_cu" / "cupykern" / "reduce.cuh").read_text()
    assert int(re.search(r"kMaxTreeColumns = (\d+);", text).group(1)) == plans.MAX_TREE_COLUMNS
    assert plans.MAX_TREE_COLUMNS <= plans.MAX_BLOCK_SIZE * max(plans.VECS_PER_THREAD_CHOICES)
    for dtype in DTYPES:
        assert plans.leaf_width(dtype) == _dtypes.vec_width(dtype)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("aligned", [True, False])
def test_the_planner_picks_tree_layouts_at_every_num_tokens(size, dtype, aligned):
    layouts = set(plans.tree_layouts(size, dtype, aligned))
    compiled = set(plans.row_layouts(dtype))
    assert layouts <= compiled
    picked = {plans.plan_rows(n, size, dtype, aligned=aligned, limits=H200_LIMITS).layout for n in NUM_TOKENS}
    assert picked <= layouts
    for layout in layouts:  # each one can be asked for explicitly
        plan = plans.plan_rows(100, size, dtype, aligned=aligned, limits=H200_LIMITS,
                               overrides={"threads_per_row": layout.threads_per_row, "vec_width": layout.vec_width})
        assert plan.layout == layout


def test_the_layout_follows_num_tokens():
    bf16 = _dtypes.bfloat16

    def layout(n, size):
        plan = plans.plan_rows(n, size, bf16, aligned=True, limits=H200_LIMITS)
        return plan.layout.threads_per_row, plan.layout.vecs_per_thread, plan.rows_per_block

    # Decode: half a row's leaves per thread, one row per block; past 64 rows too while the
    # rows' threads fill at most half of the GPU's (plans.DECODE_FILL_SHARE: 132 SMs x 2048 / 2).
    assert layout(1, 4096) == layout(64, 4096) == layout(528, 4096) == (256, 2, 1)
    assert layout(1, 8192) == layout(264, 8192) == (512, 2, 1)
    assert layout(16, 16384) == layout(132, 16384) == (1024, 2, 1)
    # Prefill: four leaves per thread, as before the tree for 4096.
    assert layout(529, 4096) == layout(16384, 4096) == (128, 4, 1)
    assert layout(265, 8192) == layout(4096, 8192) == (256, 4, 1)
    assert layout(4096, 576) == (32, 4, 4)  # 72 leaves: a tree of 128 columns


@pytest.mark.parametrize("overrides, message", [
    ({"threads_per_row": 32}, r"threads_per_row 32 cannot compute the tree of rows of 8192 bf16 elements"),
    ({"threads_per_row": 256, "vecs_per_thread": 1},
     r"vecs_per_thread must be 4 \(or more, or half\) with threads_per_row 256"),
    ({"threads_per_row": 128, "vecs_per_thread": 4}, None),
    ({"threads_per_row": 1024, "vecs_per_thread": 4}, None),
])
def test_layouts_off_the_tree_are_refused(overrides, message):
    if message is None:  # twice or half the tree's width: fine for a row of at most MAX_TREE_COLUMNS leaves
        plans.plan_rows(100, 8192, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, overrides=overrides)
        with pytest.raises(ValueError, match=r"(vecs_per_thread must be \d|threads_per_row \d+ cannot compute the tree) .*rows of 65536"):
            plans.plan_rows(100, 65536, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, overrides=overrides)
        return
    with pytest.raises(ValueError, match=message):
        plans.plan_rows(100, 8192, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS, overrides=overrides)


def test_vecs_per_thread_alone_picks_its_threads_per_row():
    plan = plans.plan_rows(100, 8192, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS,
                           overrides={"vecs_per_thread": 8})
    assert plan.layout == plans.RowLayout(128, 8, 8)


# ----------------------------------------------------------------- GPU
def _gpu_cases():
    """(size, dtype) for the bit-identity tests: every preset hidden size, and edges (a
    partial leaf, several leaves per column with a partial one, the widest tree)."""
    sizes = sorted({m.hidden_size for m in models.PRESETS.values()} | {5, 16384 + 3, 65536})
    return [(s, d) for s in sizes for d in DTYPES]


GPU_OPS = ["rms_norm", "fused_add_rms_norm", "layer_norm", "softmax", "softmax_same_dtype", "row_reduce_sum",
           "row_reduce_mean", "row_reduce_sumsq", "row_reduce_max", "row_reduce_min", "rms_norm_quant",
           "fused_add_rms_norm_quant", "rms_norm_dynamic_per_token_quant",
           "fused_add_rms_norm_dynamic_per_token_quant"]


def _copy(a):
    """A copy of ``a`` at the same offset from 16-byte alignment (the scalar path stays scalar)."""
    import cupy

    offset = (a.data.ptr % 16) // a.itemsize
    view = cupy.empty(a.size + offset, dtype=a.dtype)[offset:].reshape(a.shape)
    view[...] = a
    return view


def _run(op, x, residual, w, scale):
    """The op's outputs as host byte arrays (fresh copies of the inputs it mutates)."""
    import cupy

    import cupykern

    x, residual = _copy(x), _copy(residual)
    if op == "rms_norm":
        outs = (cupykern.rms_norm(x, w, 1e-6, weight_offset=1.0),)
    elif op == "fused_add_rms_norm":
        outs = cupykern.fused_add_rms_norm(x, residual, w, 1e-6)
    elif op == "layer_norm":
        outs = (cupykern.layer_norm(x, w, w),)
    elif op == "softmax":
        outs = (cupykern.softmax(x, temperature=0.7),)
    elif op == "softmax_same_dtype":
        outs = (cupykern.softmax(x, out=cupy.empty_like(x)),)
    elif op.startswith("row_reduce_"):
        outs = (cupykern.row_reduce(x, op.removeprefix("row_reduce_")),)
    elif op == "rms_norm_quant":
        outs = (cupykern.rms_norm_quant(x, w, scale),)
    elif op == "fused_add_rms_norm_quant":
        outs = cupykern.fused_add_rms_norm_quant(x, residual, w, scale)
    elif op == "rms_norm_dynamic_per_token_quant":
        outs = cupykern.rms_norm_dynamic_per_token_quant(x, w)
    else:
        outs = cupykern.fused_add_rms_norm_dynamic_per_token_quant(x, residual, w)
    return [np.ascontiguousarray(o.get()).view(np.uint8) for o in outs]


def _inputs(rng, rows, size, dtype, *, misalign=False):
    import cupy

    from tests.helpers import random_device

    def dev(shape, scale=1.0, loc=0.0):
        a = random_device(rng, shape, dtype, scale=scale, loc=loc)
        if not misalign:
            return a
        flat = cupy.empty(a.size + 1, dtype=a.dtype)
        view = flat[1:].reshape(a.shape)  # one element off: the scalar path
        view[...] = a
        return view

    x, residual = dev((rows, size), 2.0), dev((rows, size))
    w = dev((size,), 0.1, 1.0)
    return x, residual, w, cupy.asarray([0.05], dtype=np.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("op", GPU_OPS)
@pytest.mark.parametrize("size, dtype", _gpu_cases(), ids=lambda v: _dtypes.short_name(v) if not isinstance(v, int)
                         else str(v))
def test_every_layout_gives_the_same_bytes(rng, op, size, dtype):
    """Each tree layout (every threads_per_row, 1 and more rows per block), launched
    explicitly, gives a row the bytes of the heuristic's plan; so does the scalar path of
    rows one element off 16-byte alignment. (The vector width of the layouts is the
    16-byte one, which keeps the kernels compiled to about 15 per op and dtype.)"""
    from cupykern import launcher

    rows = 7
    inputs = _inputs(rng, rows, size, dtype)
    want = _run(op, *inputs)
    checked = 0
    layouts = plans.tree_layouts(size, dtype, aligned=size % _dtypes.vec_width(dtype) == 0)
    widest = max(layout.vec_width for layout in layouts)
    for layout in layouts:
        if layout.vec_width != widest:
            continue
        for rows_per_block in sorted({1, plans.default_rows_per_block(layout.threads_per_row)}):
            if (layout.threads_per_row * rows_per_block) % plans.WARP_SIZE:
                continue
            with launcher.recording() as launched, launcher.overrides(
                    threads_per_row=layout.threads_per_row, vec_width=layout.vec_width,
                    rows_per_block=rows_per_block):
                got = _run(op, *inputs)
            assert launched and launched[0].plan.layout == layout
            for g, w_ in zip(got, want):
                np.testing.assert_array_equal(g, w_, err_msg=f"{op} {size} {layout} x{rows_per_block} seed {rng.seed}")
            checked += 1
    assert checked
    for g, w_ in zip(_run(op, *_inputs(np.random.default_rng(rng.seed), rows, size, dtype, misalign=True)), want):
        np.testing.assert_array_equal(g, w_, err_msg=f"{op} {size} misaligned seed {rng.seed}")


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["rms_norm", "fused_add_rms_norm", "layer_norm", "softmax", "row_reduce_sumsq",
                                "fused_add_rms_norm_dynamic_per_token_quant"])
@pytest.mark.parametrize("size", [3584, 4096, 8192, 16384])
def test_batch_invariant_across_num_tokens(rng, op, size):
    """A row alone (decode layout), among 64 and among 6144 rows (prefill layout; past
    rms_norm's plans.DECODE_FILL_SHARE_FILLED) gives the same bytes; the planner's
    layouts differ across these batches."""
    dtype = _dtypes.bfloat16
    rows = 6144
    x, residual, w, scale = _inputs(rng, rows, size, dtype)
    layouts = {plans.plan_rows(n, size, dtype, aligned=True, limits=H200_LIMITS).layout for n in (1, 64, rows)}
    assert len(layouts) > 1
    full = _run(op, x, residual, w, scale)
    for first, count in ((0, 1), (rows - 1, 1), (100, 64), (rows // 2, 16)):
        part = _run(op, x[first:first + count], residual[first:first + count], w, scale)
        for p, f in zip(part, full):
            per_row = f.reshape(rows, -1)
            np.testing.assert_array_equal(p.reshape(count, -1), per_row[first:first + count],
                                          err_msg=f"{op} {size} rows {first}+{count} seed {rng.seed}")


@pytest.mark.gpu
@pytest.mark.parametrize("size", [5, 576, 4096, 8192, 16384 + 3, 65536])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_row_reduce_is_the_trees_float32_value(rng, size, dtype):
    """The kernels compute the tree of tests/reduction_tree.py: row_reduce's sum and max
    equal its float32 emulation bit for bit, at decode and prefill layouts."""
    import cupy

    import cupykern

    host = _awkward_row(rng, size, dtype)
    for rows in (1, 200):
        x = cupy.asarray(np.broadcast_to(host, (rows, size)).copy())
        got_sum = cupykern.row_reduce(x, "sum").get()
        got_max = cupykern.row_reduce(x, "max").get()
        want_sum = rt.tree_root(rt.leaf_sums(host), size, dtype, rt.f32_add, np.float32(-0.0))
        want_max = rt.tree_root(rt.leaf_maxes(host), size, dtype, rt.f32_max, np.float32(-np.inf))
        assert (got_sum.view(np.uint32) == np.float32(want_sum).view(np.uint32)).all(), (rows, rng.seed)
        assert (got_max == want_max).all(), (rows, rng.seed)
