"""Row reductions: sum, mean, max, min, sum of squares over the last axis (kernels_cu/row_reduce.cu)."""

from __future__ import annotations

import numpy as np

from cupykern import _arrays, _dtypes, launcher, plans
from cupykern.jit import KernelTemplate

__all__ = ["row_reduce"]

ROW_REDUCE = KernelTemplate("row_reduce.cu", "row_reduce_kernel")

#: kOp values of row_reduce_kernel (kernels_cu/row_reduce.cu).
K_SUM, K_SUMSQ, K_MAX, K_MIN = 0, 1, 2, 3
#: op name -> kOp; "mean" is the sum scaled by 1 / n.
OPS = {"sum": K_SUM, "mean": K_SUM, "sumsq": K_SUMSQ, "max": K_MAX, "min": K_MIN}


def _layouts(dtype):
    """The kernel's layouts: threads per row, vector width, tree columns per thread."""
    return [lay.template_args() for lay in plans.row_layouts(dtype)]


def instantiations() -> dict[KernelTemplate, list[str]]:
    return {ROW_REDUCE: [ROW_REDUCE.expr(k, _dtypes.c_type(d), *layout) for k in sorted(set(OPS.values()))
                         for d in _dtypes.DTYPES for layout in _layouts(d)]}


def _prepare(a: launcher.Args) -> launcher.Launch:
    op = _arrays.choice(a.op, OPS, "op")
    x, rows = _arrays.row_input(a.x)
    out, allocate = launcher.output(a.out, "out", x.shape[:-1], _dtypes.float32)
    if rows.num_rows == 0:
        return launcher.Launch(None, allocate=allocate, returns="out")
    if any(s % out.itemsize for s in out.strides):
        raise ValueError(f"out: strides {out.strides} are not multiples of the item size {out.itemsize}")
    # out is (...,) with any strides: one element per row, out_stride elements apart.
    out_stride = _arrays.collapse(out.shape, [s // out.itemsize for s in out.strides], "out", "the") if out.shape else 1
    out_rows = _arrays.Rows(rows.num_rows, 1, out_stride)
    _arrays.distinct_rows(out_rows, "out")
    # row_reduce_kernel's 32-bit sizes and strides, before the plan so the float64 twin checks them too
    sizes = _arrays.int32_row_args(rows, out_rows)
    aligned = _arrays.vector_aligned(_dtypes.vec_width(x.dtype), (x, rows.row_stride))
    plan = plans.plan_rows(rows.num_rows, rows.hidden_size, x.dtype, aligned=aligned, limits=a.limits,
                           op="row_reduce", overrides=a.overrides)
    scale = np.float32(1.0 / rows.hidden_size) if op == "mean" else np.float32(1.0)
    return launcher.Launch(
        ROW_REDUCE, (OPS[op], _dtypes.c_type(x.dtype), *plan.layout.template_args()), plan,
        pointers=("out", "x"),
        scalars=(*sizes, scale),
        allocate=allocate, returns="out",
        disjoint=(launcher.Disjoint("x", "out"),))


#: One pass, nothing kept in registers: vecs_per_thread (the tree's columns per thread)
#: only ever follows threads_per_row, so it is not offered.
LAUNCH_OPTIONS = tuple(k for k in plans.ROW_OVERRIDE_KEYS if k != "vecs_per_thread")

_ROW_REDUCE = launcher.Op("row_reduce", arrays=("x", "out"), scalars=("op",), prepare=_prepare, plan_kind="rows",
                          launch_options=LAUNCH_OPTIONS)


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
        ValueError: unknown ``op``, wrong ``out`` shape, bad strides, n == 0, ``out``
            overlapping ``x``.

    Notes:
        fp32 accumulation (never in fp16/bf16); max and min propagate NaN as NumPy.

    References:
        ``numpy.sum``/``mean``/``max``/``min`` over ``axis=-1``.
    """
    return _ROW_REDUCE((x, out), (op,))
