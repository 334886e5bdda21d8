"""Softmax over the last axis (kernels_cu/softmax.cu)."""

from __future__ import annotations

import numpy as np

from cupykern import _arrays, _dtypes, launcher, plans
from cupykern.jit import KernelTemplate

__all__ = ["softmax"]

SOFTMAX = KernelTemplate("softmax.cu", "softmax_kernel")

#: The largest temperature: 1 / temperature, the kernel's scale, is then the smallest
#: normal float32 (the smallest temperature is that float32 itself, _arrays.FLOAT32_TINY).
MAX_TEMPERATURE = 1 / _arrays.FLOAT32_TINY  # 8.507059e37


def _dtype_pairs():
    """(input, output) dtypes: float32 output for every input, or the input's own dtype."""
    return sorted({(d, o) for d in _dtypes.DTYPES for o in (_dtypes.float32, d)}, key=str)


def instantiations() -> dict[KernelTemplate, list[str]]:
    """Every instantiation: (input, output) dtype x row layout x kExact (plans.exact_choices)."""
    return {SOFTMAX: [SOFTMAX.expr(_dtypes.c_type(d), _dtypes.c_type(o), *layout.template_args(), exact)
                      for d, o in _dtype_pairs() for layout in plans.row_layouts(d)
                      for exact in plans.exact_choices("softmax", layout)]}


def _prepare(a: launcher.Args) -> launcher.Launch:
    x, rows = _arrays.row_input(a.x)
    temperature = _arrays.real(a.temperature, "temperature")
    if not (np.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature: expected a finite value > 0, got {a.temperature!r}")
    # The kernel multiplies by 1 / temperature in fp32. A normal temperature (_arrays.real) keeps
    # it finite; a subnormal one would be flushed to 0 (-ftz=true), and a -inf logit give NaN.
    scale = np.float32(1.0 / temperature)
    if scale < _arrays.FLOAT32_TINY:
        raise ValueError(f"temperature: expected at most {MAX_TEMPERATURE:.7g} (1 / temperature must be a normal "
                         f"float32: the kernels flush smaller values to 0), got {a.temperature!r}")
    out_dtype = _dtypes.float32 if a.out is None else a.out.dtype
    if out_dtype not in (_dtypes.float32, x.dtype):
        raise TypeError(f"out: expected dtype float32 or x's dtype ({x.dtype}), got {out_dtype}")
    out, allocate = launcher.output(a.out, "out", x.shape, out_dtype)
    out_rows = _arrays.written_rows(out, "out")
    if rows.num_rows == 0:
        return launcher.Launch(None, allocate=allocate, returns="out")
    # softmax_kernel's 32-bit sizes and strides, before the plan so the float64 twin checks them too
    sizes = _arrays.int32_row_args(rows, out_rows)
    aligned = _arrays.vector_aligned(_dtypes.vec_width(x.dtype), (x, rows.row_stride), (out, out_rows.row_stride))
    plan = plans.plan_rows(rows.num_rows, rows.hidden_size, x.dtype, aligned=aligned, limits=a.limits, op="softmax",
                           overrides=a.overrides)
    return launcher.Launch(
        SOFTMAX, (_dtypes.c_type(x.dtype), _dtypes.c_type(out_dtype), *plan.layout.template_args(), plan.exact), plan,
        pointers=("out", "x"),
        scalars=(*sizes, scale),
        allocate=allocate, returns="out",
        disjoint=(launcher.Disjoint("x", "out", allow_same=True, a_rows=rows, b_rows=out_rows),))


_SOFTMAX = launcher.Op("softmax", arrays=("x", "out"), scalars=("temperature",), prepare=_prepare, plan_kind="rows",
                       launch_options=plans.ROW_OVERRIDE_KEYS)


def softmax(x, *, temperature: float = 1.0, out=None):
    """Softmax over the last axis, max-subtracted.

    ``y = exp((x - max(x)) / temperature) / sum(exp((x - max(x)) / temperature))``

    Parameters:
        x: device array ``(..., n)``, float16, bfloat16 or float32, unit-stride last
            axis, leading axes flattening to one row stride.
        temperature: divides the logits (the kernel multiplies by ``1 / temperature``
            in fp32): from 1.1754944e-38 to 8.507059e37, so that it and its inverse are
            normal float32s (the kernels flush subnormals to 0); an error outside.
        out: optional ``(..., n)`` array, float32 or x's dtype (in place when it is
            ``x``). Defaults to a new float32 array.

    Returns:
        ``out``: float32 unless an ``out`` of x's dtype was given.

    Mutates: ``out`` only.

    Raises:
        TypeError: non-device or unsupported-dtype ``x``; ``out`` of another dtype than
            float32 or x's.
        ValueError: wrong ``out`` shape, bad strides, an empty last axis, a temperature
            that is not finite and positive or outside the range above, partial overlap
            of ``out`` and ``x``.

    Notes:
        fp32 math, one rounding (``expf`` for a float32 output, ``__expf`` for a
        16-bit one, whose error the rounding hides). A row of all -inf gives NaN (as NumPy's float64
        computation does); -inf entries of an otherwise finite row give exact 0; a NaN
        makes its row NaN and no other.

    References:
        The standard numerically stable softmax (Goodfellow, Bengio & Courville, Deep
        Learning, 2016, sec. 4.1); ``torch.softmax`` semantics.
    """
    return _SOFTMAX((x, out), (temperature,))
