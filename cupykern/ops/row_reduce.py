"""Row reductions: sum, mean, max, min, sum of squares over the last axis (kernels_cu/row_reduce.cu)."""

from __future__ import annotations

import numpy as np

from cupykern import _arrays, _dtypes, _rowkernel, launch
from cupykern.jit import KernelTemplate

ROW_REDUCE = KernelTemplate("row_reduce.cu", "row_reduce_kernel")

#: op name -> kOp of the kernel; "mean" is "sum" scaled by 1 / n.
OPS = {"sum": 0, "mean": 0, "sumsq": 1, "max": 2, "min": 3}


def _layouts(dtype):
    """One-pass kernel: the register cache size does not apply."""
    return sorted({(lay.threads_per_row, lay.vec_width, lay.warp_size) for lay in launch.row_layouts(dtype)})


def instantiations() -> dict[KernelTemplate, list[str]]:
    return {ROW_REDUCE: [ROW_REDUCE.expr(k, _dtypes.c_type(d), *layout) for k in sorted(set(OPS.values()))
                         for d in _dtypes.DTYPES for layout in _layouts(d)]}


def row_reduce(x, op: str, *, out=None):
    """Reduces each row (last axis) to one float32 value.

    ``op``: ``"sum"``, ``"mean"``, ``"max"``, ``"min"`` or ``"sumsq"`` (sum of squares).

    Parameters:
        x: device array ``(..., n)``, float16, bfloat16 or float32, n >= 1, unit-stride
            last axis, leading axes flattening to one row stride.
        op: the reduction.
        out: optional float32 array of shape ``x.shape[:-1]`` (any stride).

    Returns:
        ``out``: float32, shape ``x.shape[:-1]``.

    Mutates: ``out`` only.

    Raises:
        TypeError: non-device ``x``/``out``, unsupported dtype, ``out`` not float32.
        ValueError: unknown ``op``, wrong ``out`` shape, bad strides, n == 0.

    Notes:
        fp32 accumulation (never in fp16/bf16); max and min propagate NaN as NumPy.

    References:
        ``numpy.sum``/``mean``/``max``/``min`` over ``axis=-1``.
    """
    if not isinstance(op, str) or op not in OPS:
        raise ValueError(f"op: expected one of {sorted(OPS)}, got {op!r}")
    x = _arrays.as_device_array(x, "x")
    _arrays.check_supported_dtype(x, "x")
    rows = _arrays.rows_of(x, "x")
    _arrays.check_hidden_size(rows, "x")
    out = _arrays.output(out, x.shape[:-1], _dtypes.float32)
    if rows.num_rows == 0:
        return out
    # out is (...,) with any strides: view it as rows of one element.
    out_stride = _arrays.rows_view(out.shape + (1,), out.strides + (out.itemsize,), out.itemsize, "out").row_stride
    aligned = _arrays.vector_aligned(_dtypes.vec_width(x.dtype), (x, rows.row_stride))
    plan = _rowkernel.plan(rows.num_rows, rows.hidden_size, x.dtype, aligned, op="row_reduce")
    scale = np.float32(1.0 / rows.hidden_size) if op == "mean" else np.float32(1.0)
    _rowkernel.run(ROW_REDUCE, (OPS[op], _dtypes.c_type(x.dtype)), plan, (
        out, x, np.int64(rows.num_rows), np.int64(rows.hidden_size), np.int64(rows.row_stride),
        np.int64(out_stride), scale), cache_vectors=False)
    return out
