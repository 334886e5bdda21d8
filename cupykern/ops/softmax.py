"""Softmax over the last axis (kernels_cu/softmax.cu)."""

from __future__ import annotations

import numpy as np

from cupykern import _arrays, _dtypes, _rowkernel, launch
from cupykern.jit import KernelTemplate

SOFTMAX = KernelTemplate("softmax.cu", "softmax_kernel")


def _dtype_pairs():
    """(input, output) dtypes: float32 output for every input, or the input's own dtype."""
    return sorted({(d, o) for d in _dtypes.DTYPES for o in (_dtypes.float32, d)}, key=str)


def instantiations() -> dict[KernelTemplate, list[str]]:
    return {SOFTMAX: [SOFTMAX.expr(_dtypes.c_type(d), _dtypes.c_type(o), *layout.template_args())
                      for d, o in _dtype_pairs() for layout in launch.row_layouts(d)]}


def softmax(x, *, temperature: float = 1.0, out=None):
    """Softmax over the last axis, max-subtracted.

    ``y = exp((x - max(x)) / temperature) / sum(exp((x - max(x)) / temperature))``

    Parameters:
        x: device array ``(..., n)``, float16, bfloat16 or float32, unit-stride last
            axis, leading axes flattening to one row stride.
        temperature: divides the logits; finite and > 0.
        out: optional ``(..., n)`` array, float32 or x's dtype (in place when it is
            ``x``). Defaults to a new float32 array.

    Returns:
        ``out``: float32 unless an ``out`` of x's dtype was given.

    Mutates: ``out`` only.

    Raises:
        TypeError: non-device or unsupported-dtype ``x``; ``out`` of another dtype than
            float32 or x's.
        ValueError: wrong ``out`` shape, bad strides, an empty last axis, a temperature
            that is not finite and positive, partial overlap of ``out`` and ``x``.

    Notes:
        fp32 math, one rounding (``expf`` for a float32 output, ``__expf`` for a
        16-bit one, whose error the rounding hides). A row of all -inf gives NaN (as NumPy's float64
        computation does); -inf entries of an otherwise finite row give exact 0; a NaN
        makes its row NaN and no other.

    References:
        The standard numerically stable softmax (Goodfellow, Bengio & Courville, Deep
        Learning, 2016, sec. 4.1); ``torch.softmax`` semantics.
    """
    x = _arrays.as_device_array(x, "x")
    _arrays.check_supported_dtype(x, "x")
    rows = _arrays.rows_of(x, "x")
    _arrays.check_hidden_size(rows, "x")
    temperature32 = np.float32(temperature)
    if not (np.isfinite(temperature32) and temperature32 > 0):
        raise ValueError(f"temperature: expected a finite value > 0, got {temperature!r}")
    if out is not None:
        out = _arrays.as_device_array(out, "out")
        if out.dtype not in (_dtypes.float32, x.dtype):
            raise TypeError(f"out: expected dtype float32 or {x.dtype} (x's), got {out.dtype}")
    out = _arrays.output(out, x.shape, out.dtype if out is not None else _dtypes.float32)
    _arrays.check_no_overlap(x, "x", out, "out", allow_same=True)
    if rows.num_rows == 0:
        return out
    out_rows = _arrays.rows_of(out, "out")
    aligned = _arrays.vector_aligned(_dtypes.vec_width(x.dtype), (x, rows.row_stride), (out, out_rows.row_stride))
    plan = _rowkernel.plan(rows.num_rows, rows.hidden_size, x.dtype, aligned, op="softmax")
    _rowkernel.run(SOFTMAX, (_dtypes.c_type(x.dtype), _dtypes.c_type(out.dtype)), plan, (
        out, x, np.int64(rows.num_rows), np.int64(rows.hidden_size), np.int64(rows.row_stride),
        np.int64(out_rows.row_stride), np.float32(1.0 / temperature32)))
    return out
