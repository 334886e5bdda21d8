"""CPU: argument intake and row geometry (cupykern/_arrays.py)."""

from __future__ import annotations

import numpy as np
import pytest

import cupykern
from cupykern import _arrays, _dtypes
from cupykern._arrays import Rows


def test_rows_view_contiguous_and_strided():
    assert _arrays.rows_view((4, 8), (32, 4), 4, "x") == Rows(4, 8, 8)
    # A column slice of a wider buffer: rows 24 elements apart.
    assert _arrays.rows_view((4, 8), (96, 4), 4, "x") == Rows(4, 8, 24)
    # (batch, seq, hidden) that flattens; size-1 axes are ignored.
    assert _arrays.rows_view((2, 3, 8), (48, 16, 2), 2, "x") == Rows(6, 8, 8)
    assert _arrays.rows_view((1, 3, 8), (998, 16, 2), 2, "x") == Rows(3, 8, 8)
    assert _arrays.rows_view((8,), (2,), 2, "x") == Rows(1, 8, 8)
    assert _arrays.rows_view((0, 8), (16, 2), 2, "x").num_rows == 0


def test_rows_view_rejects_bad_layouts():
    with pytest.raises(ValueError, match="x: the last axis must be unit-stride"):
        _arrays.rows_view((4, 8), (4, 32), 4, "x")
    with pytest.raises(ValueError, match="do not flatten"):
        _arrays.rows_view((2, 3, 8), (64, 16, 2), 2, "x")
    with pytest.raises(ValueError, match="0-d"):
        _arrays.rows_view((), (), 2, "x")


def test_overlap_rules():
    a = Rows(4, 8, 16)
    # Two column halves of one (4, 16) fp32 buffer: interleaved rows, disjoint.
    assert not _arrays.rows_overlap(0, a, 4, 32, a, 4, (0, 256), (32, 288))
    # Shifted by one element: overlapping.
    assert _arrays.rows_overlap(0, a, 4, 4, a, 4, (0, 256), (4, 260))
    # Disjoint extents.
    assert not _arrays.rows_overlap(0, a, 4, 1000, a, 4, (0, 256), (1000, 1256))


@pytest.mark.parametrize("call", [
    lambda x: cupykern.rms_norm(x, x[0]),
    lambda x: cupykern.fused_add_rms_norm(x, x, x[0]),
    lambda x: cupykern.layer_norm(x, None, None),
    lambda x: cupykern.softmax(x),
    lambda x: cupykern.row_reduce(x, "sum"),
])
def test_numpy_input_raises_type_error(call):
    x = np.ones((2, 8), dtype=np.float32)
    with pytest.raises(TypeError, match="x: expected a device array.*NumPy"):
        call(x)


def test_non_array_raises_type_error():
    with pytest.raises(TypeError, match="x: expected a device array"):
        cupykern.rms_norm([[1.0, 2.0]], None)


def test_row_reduce_unknown_op_raises_before_touching_the_gpu():
    with pytest.raises(ValueError, match="op: expected one of"):
        cupykern.row_reduce(np.ones(3, np.float32), "median")


def test_dtype_table():
    assert _dtypes.parse("bf16") == _dtypes.bfloat16
    assert _dtypes.c_type(np.float16) == "__half"
    assert _dtypes.vec_width(_dtypes.bfloat16) == 8
    with pytest.raises(ValueError, match="unsupported dtype"):
        _dtypes.parse("int8")
    with pytest.raises(TypeError, match="w: unsupported dtype float64"):
        _dtypes.check_supported(np.float64, "w")
