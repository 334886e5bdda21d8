"""Normalisation family: rms_norm, fused_add_rms_norm, layer_norm (kernels_cu/norm.cu)."""

from __future__ import annotations

import numpy as np

from cupykern import _arrays, _dtypes, launcher, plans
from cupykern.jit import KernelTemplate

__all__ = ["fused_add_rms_norm", "layer_norm", "rms_norm"]

RMS_NORM = KernelTemplate("norm.cu", "rms_norm_kernel")
FUSED_ADD_RMS_NORM = KernelTemplate("norm.cu", "fused_add_rms_norm_kernel")
LAYER_NORM = KernelTemplate("norm.cu", "layer_norm_kernel")


#: Each kernel's op, the key of its kExact rule (plans.EXACT_WALK).
_OPS = {RMS_NORM: "rms_norm", FUSED_ADD_RMS_NORM: "fused_add_rms_norm", LAYER_NORM: "layer_norm"}


def instantiations() -> dict[KernelTemplate, list[str]]:
    """Every instantiation of this family: dtype x row layout x kExact (plans.exact_choices)
    x kReread (plans.reread_choices: rms_norm_kernel's)."""
    return {t: [t.expr(*_args(_dtypes.c_type(d), layout, exact, reread)) for d in _dtypes.DTYPES
                for layout in plans.row_layouts(d) for exact in plans.exact_choices(op, layout)
                for reread in plans.reread_choices(op, layout, exact)]
            for t, op in _OPS.items()}


def _args(c_type: str, layout: plans.RowLayout, exact: bool, reread: bool) -> tuple:
    # kReread defaults to false in norm.cu and is named only when true, so the name of
    # every kernel that holds its row is what it was before kReread (the spill ledger's keys).
    return (c_type, *layout.template_args(), exact, *((True,) if reread else ()))


def _template_args(dtype, plan: plans.RowPlan) -> tuple:
    """(T, kThreadsPerRow, kVecWidth, kVecsPerThread, kWarpSize, kExact[, kReread]) of norm.cu's kernels."""
    return _args(_dtypes.c_type(dtype), plan.layout, plan.exact, plan.reread)


# ----------------------------------------------------------------- intake and plan
def _row_scalars(rows: _arrays.Rows, *row_strides: int) -> tuple:
    """num_rows, hidden_size and the row strides as the 64-bit arguments of
    fused_add_rms_norm_kernel and layer_norm_kernel (norm.cu says why they stay 64-bit)."""
    return (np.int64(rows.num_rows), np.int64(rows.hidden_size), *map(np.int64, row_strides))


def _prepare_rms_norm(a: launcher.Args) -> launcher.Launch:
    x, rows = _arrays.row_input(a.x)
    weight = _arrays.vector(a.weight, "weight", x.dtype, rows.hidden_size, what="the dtype of x")
    eps = _arrays.eps(a.eps)
    weight_offset = _arrays.finite(a.weight_offset, "weight_offset")
    out, allocate = launcher.output(a.out, "out", x.shape, x.dtype)
    out_rows = _arrays.written_rows(out, "out")
    if rows.num_rows == 0:
        return launcher.Launch(None, allocate=allocate, returns="out")
    scalars = _arrays.int32_row_args(rows, out_rows)  # before the plan, so the float64 twin checks them too
    aligned = _arrays.vector_aligned(_dtypes.vec_width(x.dtype), (x, rows.row_stride), (out, out_rows.row_stride),
                                     (weight, 0))
    plan = plans.plan_rows(rows.num_rows, rows.hidden_size, x.dtype, aligned=aligned, limits=a.limits,
                           op="rms_norm", overrides=a.overrides)
    return launcher.Launch(
        RMS_NORM, _template_args(x.dtype, plan), plan,
        pointers=("out", "x", "weight"),
        scalars=(*scalars, eps, weight_offset),
        allocate=allocate, returns="out",
        disjoint=(launcher.Disjoint("x", "out", allow_same=True, a_rows=rows, b_rows=out_rows),
                  launcher.Disjoint("weight", "out", b_rows=out_rows)))


def _prepare_fused_add_rms_norm(a: launcher.Args) -> launcher.Launch:
    x, rows = _arrays.row_input(a.x)
    residual = _arrays.required(a.residual, "residual")
    _arrays.check_dtype(residual, x.dtype, "residual", "the dtype of x")
    _arrays.check_shape(residual, x.shape, "residual")
    _arrays.element_aligned(residual, "residual")
    res_rows = _arrays.written_rows(residual, "residual")
    _arrays.distinct_rows(rows, "x")
    weight = _arrays.vector(a.weight, "weight", x.dtype, rows.hidden_size, what="the dtype of x")
    eps = _arrays.eps(a.eps)
    weight_offset = _arrays.finite(a.weight_offset, "weight_offset")
    if rows.num_rows == 0:
        return launcher.Launch(None, returns=("x", "residual"))
    aligned = _arrays.vector_aligned(_dtypes.vec_width(x.dtype), (x, rows.row_stride),
                                     (residual, res_rows.row_stride), (weight, 0))
    plan = plans.plan_rows(rows.num_rows, rows.hidden_size, x.dtype, aligned=aligned, limits=a.limits,
                           op="fused_add_rms_norm", overrides=a.overrides)
    return launcher.Launch(
        FUSED_ADD_RMS_NORM, _template_args(x.dtype, plan), plan,
        pointers=("x", "residual", "weight"),
        scalars=(*_row_scalars(rows, rows.row_stride, res_rows.row_stride), eps, weight_offset),
        returns=("x", "residual"),
        disjoint=(launcher.Disjoint("x", "residual", a_rows=rows, b_rows=res_rows),
                  launcher.Disjoint("weight", "x", b_rows=rows),
                  launcher.Disjoint("weight", "residual", b_rows=res_rows)))


def _prepare_layer_norm(a: launcher.Args) -> launcher.Launch:
    x, rows = _arrays.row_input(a.x)
    weight = _arrays.vector(a.weight, "weight", x.dtype, rows.hidden_size, what="the dtype of x", optional=True)
    bias = _arrays.vector(a.bias, "bias", x.dtype, rows.hidden_size, what="the dtype of x", optional=True)
    eps = _arrays.eps(a.eps)
    out, allocate = launcher.output(a.out, "out", x.shape, x.dtype)
    out_rows = _arrays.written_rows(out, "out")
    if rows.num_rows == 0:
        return launcher.Launch(None, allocate=allocate, returns="out")
    aligned = _arrays.vector_aligned(_dtypes.vec_width(x.dtype), (x, rows.row_stride), (out, out_rows.row_stride),
                                     (weight, 0), (bias, 0))
    plan = plans.plan_rows(rows.num_rows, rows.hidden_size, x.dtype, aligned=aligned, limits=a.limits,
                           op="layer_norm", overrides=a.overrides)
    # An absent weight or bias is passed as a null pointer (the kernel skips it).
    return launcher.Launch(
        LAYER_NORM, _template_args(x.dtype, plan), plan,
        pointers=("out", "x", "weight", "bias"),
        scalars=(*_row_scalars(rows, rows.row_stride, out_rows.row_stride), eps),
        allocate=allocate, returns="out",
        disjoint=(launcher.Disjoint("x", "out", allow_same=True, a_rows=rows, b_rows=out_rows),
                  launcher.Disjoint("weight", "out", b_rows=out_rows),
                  launcher.Disjoint("bias", "out", b_rows=out_rows)))


_RMS_NORM = launcher.Op("rms_norm", arrays=("x", "weight", "out"), scalars=("eps", "weight_offset"),
                        prepare=_prepare_rms_norm, plan_kind="rows", launch_options=plans.ROW_OVERRIDE_KEYS)
_FUSED_ADD_RMS_NORM = launcher.Op("fused_add_rms_norm", arrays=("x", "residual", "weight"),
                                  scalars=("eps", "weight_offset"), prepare=_prepare_fused_add_rms_norm,
                                  plan_kind="rows", launch_options=plans.ROW_OVERRIDE_KEYS)
_LAYER_NORM = launcher.Op("layer_norm", arrays=("x", "weight", "bias", "out"), scalars=("eps",),
                          prepare=_prepare_layer_norm, plan_kind="rows", launch_options=plans.ROW_OVERRIDE_KEYS)


# ----------------------------------------------------------------- public API
def rms_norm(x, weight, eps: float = 1e-6, *, weight_offset: float = 0.0, out=None):
    """Root-mean-square normalisation over the last axis.

    ``y = x / sqrt(mean(x**2) + eps) * (weight + weight_offset)``

    Parameters:
        x: device array ``(..., hidden_size)``, float16, bfloat16 or float32. The last
            axis must be unit-stride; leading axes must flatten to one row stride
            (slices of wider buffers are fine).
        weight: ``(hidden_size,)``, same dtype as ``x``, unit-stride.
        eps: added to the mean square, in fp32 (so 1e-12 survives): 0, or at least
            1.1754944e-38, the smallest normal float32 (the kernels are compiled with
            -ftz=true and would flush a smaller eps to 0). With 0 an all-zero row
            gives NaN (0 / 0), as the float64 reference does.
        weight_offset: added to ``weight`` in fp32; ``1.0`` gives Gemma's ``(1 + w)``.
            Finite; 0 or of magnitude at least 1.1754944e-38, like eps.
        out: optional ``(..., hidden_size)`` array of x's dtype to write into; may be
            ``x`` itself (in place); must not overlap ``weight``.

    Returns:
        ``out`` (allocated if not given), x's shape and dtype.

    Mutates: ``out`` only.

    Raises:
        TypeError: ``x``/``weight``/``out`` is a NumPy or non-array object, or has an
            unsupported or mismatched dtype.
        ValueError: wrong ``weight``/``out`` shape, non-unit last stride, rows that do
            not share one stride, an empty last axis, ``eps`` < 0 or not finite,
            ``eps``/``weight_offset`` nonzero below 1.1754944e-38 in magnitude or
            beyond float32's range, ``out`` partially overlapping ``x`` or overlapping
            ``weight``, ``2**31`` rows
            or more, rows of ``2**31`` elements or more or as far apart (its kernel's
            arguments are 32-bit), or an array on another GPU.

    Notes:
        Sum of squares in fp32, result rounded once to the dtype. A row's result does
        not depend on how many rows are processed with it (batch invariance).

    References:
        Zhang & Sennrich, "Root Mean Square Layer Normalization", 2019
        (arXiv:1910.07467); Gemma's offset as in Hugging Face ``GemmaRMSNorm``;
        semantics of vLLM's ``rms_norm`` and FlashInfer's ``rmsnorm``.
    """
    return _RMS_NORM((x, weight, out), (eps, weight_offset))


def fused_add_rms_norm(x, residual, weight, eps: float = 1e-6, *, weight_offset: float = 0.0):
    """Residual add then RMSNorm, in place: the pre-norm transformer block's junction.

    ``residual <- round(x + residual)``; ``x <- residual / sqrt(mean(residual**2) + eps) * (weight + weight_offset)``

    Parameters:
        x: device array ``(..., hidden_size)``, float16, bfloat16 or float32; the
            sub-layer output. Overwritten with the normalised sum.
        residual: same shape and dtype as ``x``; overwritten with ``x + residual``
            (added in fp32, rounded once to the dtype; this rounded value is what gets
            normalised).
        weight, eps, weight_offset: as in :func:`rms_norm`; ``weight`` must not overlap
            ``x`` or ``residual``.

    Returns:
        ``(x, residual)``, the same arrays, updated.

    Mutates: ``x`` and ``residual``.

    Raises:
        TypeError: as :func:`rms_norm`, and ``residual`` of another dtype than ``x``.
        ValueError: as :func:`rms_norm` but for its ``2**31`` limits (this kernel's
            arguments are 64-bit); ``residual`` of another shape than ``x``, or
            sharing memory with it; ``weight`` sharing memory with ``x`` or ``residual``.

    References:
        vLLM ``fused_add_rms_norm`` and FlashInfer ``fused_add_rmsnorm`` (same
        semantics); RMSNorm, arXiv:1910.07467.
    """
    return _FUSED_ADD_RMS_NORM((x, residual, weight), (eps, weight_offset))


def layer_norm(x, weight, bias, eps: float = 1e-5, *, out=None):
    """Layer normalisation over the last axis.

    ``y = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias`` (biased variance)

    Parameters:
        x: device array ``(..., hidden_size)``, float16, bfloat16 or float32 (same
            layout rules as :func:`rms_norm`).
        weight: ``(hidden_size,)`` of x's dtype, or None for a scale of 1.
        bias: ``(hidden_size,)`` of x's dtype, or None for a shift of 0.
        eps: added to the variance in fp32; 0 or at least 1.1754944e-38 (as in
            :func:`rms_norm`).
        out: optional output of x's shape and dtype; may be ``x`` (in place); must
            not overlap ``weight`` or ``bias``.

    Returns:
        ``out`` (allocated if not given).

    Mutates: ``out`` only.

    Raises:
        TypeError, ValueError: as :func:`rms_norm`, for ``weight`` and ``bias`` alike
            (``out`` overlapping either), but for its ``2**31`` limits (layer_norm's
            kernel arguments are 64-bit).

    Notes:
        Mean and variance in fp32, two passes over the row held in registers (the
        variance is the mean squared deviation, not E[x^2] - E[x]^2, so a large mean
        does not cancel it away).

    References:
        Ba, Kiros & Hinton, "Layer Normalization", 2016 (arXiv:1607.06450);
        ``torch.nn.functional.layer_norm`` semantics.
    """
    return _LAYER_NORM((x, weight, bias, out), (eps,))
