"""CPU: launch planning rules (cupykern/launch.py) against an H200's limits."""

from __future__ import annotations

import pytest

from cupykern import _dtypes, jit, launch
from cupykern.launch import H200_LIMITS, DeviceLimits

HIDDEN_SIZES = [1, 5, 64, 127, 128, 4096, 5120, 8192, 14336, 16384, 65536, 131072]


@pytest.mark.parametrize("hidden_size", HIDDEN_SIZES)
@pytest.mark.parametrize("dtype", _dtypes.DTYPES, ids=_dtypes.short_name)
@pytest.mark.parametrize("aligned", [True, False])
def test_plan_rows_is_valid_and_compiled(hidden_size, dtype, aligned):
    plan = launch.plan_rows(3, hidden_size, dtype, aligned=aligned, limits=H200_LIMITS)
    assert plan.layout in launch.row_layouts(dtype)
    assert plan.block_size % 32 == 0 and plan.block_size <= launch.max_block_size(plan.layout.threads_per_row)
    if not aligned:
        assert plan.layout.vec_width == 1
    # The chosen instantiation is in the declared (and CPU-compiled) space.
    from cupykern.ops import norm

    expr = norm.RMS_NORM.expr(_dtypes.c_type(dtype), *plan.layout.template_args())
    assert expr in jit.instantiations()["norm.cu"]


@pytest.mark.parametrize("hidden_size", HIDDEN_SIZES)
def test_row_layout_does_not_depend_on_num_rows(hidden_size):
    """Batch invariance by construction: only rows_per_block and the grid vary with rows."""
    layouts = {launch.plan_rows(n, hidden_size, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS).layout
               for n in (1, 7, 64, 4097, 100_000)}
    assert len(layouts) == 1


def test_large_row_counts_fit_the_grid():
    small = DeviceLimits(name="tiny", sm_count=2, max_grid_x=65535)
    plan = launch.plan_rows(10_000_000, 4096, _dtypes.float16, aligned=True, limits=small)
    assert plan.grid[0] == 65535  # the kernel walks the remaining rows grid-stride


def test_row_layout_heuristic_examples():
    # 8192 bf16 = 1024 vectors: 128 threads, 4 vectors each cached, 4 re-read.
    assert launch.row_layout(8192, _dtypes.bfloat16, True) == launch.RowLayout(128, 8, 4)
    # 1024 bf16 = 128 vectors: 32 threads x 4 vectors, 4 rows per 128-thread block.
    plan = launch.plan_rows(10, 1024, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS)
    assert plan.layout == launch.RowLayout(32, 8, 4) and plan.rows_per_block == 4
    # Unaligned rows fall back to scalar accesses.
    assert launch.row_layout(8192, _dtypes.bfloat16, False).vec_width == 1
    # Tiny rows share a 128-thread block.
    plan = launch.plan_rows(100, 5, _dtypes.float32, aligned=False, limits=H200_LIMITS)
    assert plan.layout.threads_per_row == 2 and plan.rows_per_block == 64


@pytest.mark.parametrize("choices, message", [
    (dict(threads_per_row=48), "threads_per_row"),
    (dict(vec_width=8), "vec_width"),
    (dict(vecs_per_thread=3), "vecs_per_thread"),
    (dict(threads_per_row=1024, rows_per_block=2), "block size"),
    (dict(threads_per_row=1, rows_per_block=8), "block size"),
    (dict(rows_per_block=3), "rows_per_block"),
])
def test_illegal_overrides_raise(choices, message):
    with pytest.raises(ValueError, match=message):
        launch.plan_rows(4, 4096, _dtypes.float32, aligned=False, limits=H200_LIMITS, **choices)


def test_override_context_is_scoped():
    with launch.overrides(threads_per_row=64):
        assert launch.current_overrides() == {"threads_per_row": 64}
        with launch.overrides(rows_per_block=2):
            assert launch.current_overrides() == {"threads_per_row": 64, "rows_per_block": 2}
    assert launch.current_overrides() == {}
    with pytest.raises(TypeError):
        launch.overrides(block=3)
