"""Normalisation family: rms_norm, fused_add_rms_norm, layer_norm (kernels_cu/norm.cu)."""

from __future__ import annotations

import numpy as np

from cupykern import _arrays, _dtypes, _rowkernel, launch
from cupykern.jit import KernelTemplate

RMS_NORM = KernelTemplate("norm.cu", "rms_norm_kernel")
FUSED_ADD_RMS_NORM = KernelTemplate("norm.cu", "fused_add_rms_norm_kernel")
LAYER_NORM = KernelTemplate("norm.cu", "layer_norm_kernel")


def instantiations() -> dict[KernelTemplate, list[str]]:
    """Every instantiation of this family: dtype x row layout."""
    return {t: [t.expr(_dtypes.c_type(d), *layout.template_args()) for d in _dtypes.DTYPES
                for layout in launch.row_layouts(d)]
            for t in (RMS_NORM, FUSED_ADD_RMS_NORM, LAYER_NORM)}


def _checked_weight(weight, name: str, x, hidden_size: int):
    if weight is None:
        return None
    weight = _arrays.as_device_array(weight, name)
    _arrays.check_dtype(weight, x.dtype, name, "the dtype of x")
    _arrays.check_shape(weight, (hidden_size,), name)
    if hidden_size > 1 and weight.strides[0] != weight.itemsize:
        raise ValueError(f"{name}: must be unit-stride, got stride {weight.strides[0]} bytes")
    return weight


def _input(x, name: str = "x"):
    x = _arrays.as_device_array(x, name)
    _arrays.check_supported_dtype(x, name)
    rows = _arrays.rows_of(x, name)
    _arrays.check_hidden_size(rows, name)
    return x, rows


def _check_eps(eps) -> np.float32:
    eps32 = np.float32(eps)
    if not (np.isfinite(eps32) and eps32 >= 0):
        raise ValueError(f"eps: expected a finite value >= 0, got {eps!r}")
    return eps32


def rms_norm(x, weight, eps: float = 1e-6, *, weight_offset: float = 0.0, out=None):
    """Root-mean-square normalisation over the last axis.

    ``y = x / sqrt(mean(x**2) + eps) * (weight + weight_offset)``

    Parameters:
        x: device array ``(..., hidden_size)``, float16, bfloat16 or float32. The last
            axis must be unit-stride; leading axes must flatten to one row stride
            (slices of wider buffers are fine).
        weight: ``(hidden_size,)``, same dtype as ``x``, unit-stride.
        eps: added to the mean square, in fp32 (so 1e-12 survives).
        weight_offset: added to ``weight`` in fp32; ``1.0`` gives Gemma's ``(1 + w)``.
        out: optional ``(..., hidden_size)`` array of x's dtype to write into; may be
            ``x`` itself (in place).

    Returns:
        ``out`` (allocated if not given), x's shape and dtype.

    Mutates: ``out`` only.

    Raises:
        TypeError: ``x``/``weight``/``out`` is a NumPy or non-array object, or has an
            unsupported or mismatched dtype.
        ValueError: wrong ``weight``/``out`` shape, non-unit last stride, rows that do
            not share one stride, an empty last axis, ``eps`` < 0 or not finite,
            ``out`` partially overlapping ``x``, or an array on another GPU.

    Notes:
        Sum of squares in fp32, result rounded once to the dtype. A row's result does
        not depend on how many rows are processed with it (batch invariance).

    References:
        Zhang & Sennrich, "Root Mean Square Layer Normalization", 2019
        (arXiv:1910.07467); Gemma's offset as in Hugging Face ``GemmaRMSNorm``;
        semantics of vLLM's ``rms_norm`` and FlashInfer's ``rmsnorm``.
    """
    x, rows = _input(x)
    weight = _checked_weight(weight, "weight", x, rows.hidden_size)
    if weight is None:
        raise TypeError("weight: expected a device array of shape (hidden_size,), got None")
    eps32 = _check_eps(eps)
    out = _arrays.output(out, x.shape, x.dtype)
    _arrays.check_no_overlap(x, "x", out, "out", allow_same=True)
    if rows.num_rows == 0:
        return out
    out_rows = _arrays.rows_of(out, "out")
    aligned = _arrays.vector_aligned(_dtypes.vec_width(x.dtype), (x, rows.row_stride), (out, out_rows.row_stride),
                                     (weight, 0))
    plan = _rowkernel.plan(rows.num_rows, rows.hidden_size, x.dtype, aligned, op="rms_norm")
    _rowkernel.run(RMS_NORM, (_dtypes.c_type(x.dtype),), plan, (
        out, x, weight, np.int64(rows.num_rows), np.int64(rows.hidden_size), np.int64(rows.row_stride),
        np.int64(out_rows.row_stride), eps32, np.float32(weight_offset)))
    return out


def fused_add_rms_norm(x, residual, weight, eps: float = 1e-6, *, weight_offset: float = 0.0):
    """Residual add then RMSNorm, in place: the pre-norm transformer block's junction.

    ``residual <- round(x + residual)``; ``x <- residual / sqrt(mean(residual**2) + eps) * (weight + weight_offset)``

    Parameters:
        x: device array ``(..., hidden_size)``, float16, bfloat16 or float32; the
            sub-layer output. Overwritten with the normalised sum.
        residual: same shape and dtype as ``x``; overwritten with ``x + residual``
            (added in fp32, rounded once to the dtype; this rounded value is what gets
            normalised).
        weight, eps, weight_offset: as in :func:`rms_norm`.

    Returns:
        ``(x, residual)``, the same arrays, updated.

    Mutates: ``x`` and ``residual``.

    Raises:
        TypeError: as :func:`rms_norm`, and ``residual`` of another dtype than ``x``.
        ValueError: as :func:`rms_norm`; ``residual`` of another shape than ``x``, or
            sharing memory with it.

    References:
        vLLM ``fused_add_rms_norm`` and FlashInfer ``fused_add_rmsnorm`` (same
        semantics); RMSNorm, arXiv:1910.07467.
    """
    x, rows = _input(x)
    residual = _arrays.as_device_array(residual, "residual")
    _arrays.check_dtype(residual, x.dtype, "residual", "the dtype of x")
    _arrays.check_shape(residual, x.shape, "residual")
    res_rows = _arrays.rows_of(residual, "residual")
    _arrays.check_no_overlap(x, "x", residual, "residual", allow_same=False)
    weight = _checked_weight(weight, "weight", x, rows.hidden_size)
    if weight is None:
        raise TypeError("weight: expected a device array of shape (hidden_size,), got None")
    eps32 = _check_eps(eps)
    if rows.num_rows == 0:
        return x, residual
    aligned = _arrays.vector_aligned(_dtypes.vec_width(x.dtype), (x, rows.row_stride),
                                     (residual, res_rows.row_stride), (weight, 0))
    plan = _rowkernel.plan(rows.num_rows, rows.hidden_size, x.dtype, aligned, op="fused_add_rms_norm")
    _rowkernel.run(FUSED_ADD_RMS_NORM, (_dtypes.c_type(x.dtype),), plan, (
        x, residual, weight, np.int64(rows.num_rows), np.int64(rows.hidden_size), np.int64(rows.row_stride),
        np.int64(res_rows.row_stride), eps32, np.float32(weight_offset)))
    return x, residual


def layer_norm(x, weight, bias, eps: float = 1e-5, *, out=None):
    """Layer normalisation over the last axis.

    ``y = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias`` (biased variance)

    Parameters:
        x: device array ``(..., hidden_size)``, float16, bfloat16 or float32 (same
            layout rules as :func:`rms_norm`).
        weight: ``(hidden_size,)`` of x's dtype, or None for a scale of 1.
        bias: ``(hidden_size,)`` of x's dtype, or None for a shift of 0.
        eps: added to the variance in fp32.
        out: optional output of x's shape and dtype; may be ``x`` (in place).

    Returns:
        ``out`` (allocated if not given).

    Mutates: ``out`` only.

    Raises:
        TypeError, ValueError: as :func:`rms_norm`, for ``weight`` and ``bias`` alike.

    Notes:
        Mean and variance in fp32, two passes over the row held in registers (the
        variance is the mean squared deviation, not E[x^2] - E[x]^2, so a large mean
        does not cancel it away).

    References:
        Ba, Kiros & Hinton, "Layer Normalization", 2016 (arXiv:1607.06450);
        ``torch.nn.functional.layer_norm`` semantics.
    """
    x, rows = _input(x)
    weight = _checked_weight(weight, "weight", x, rows.hidden_size)
    bias = _checked_weight(bias, "bias", x, rows.hidden_size)
    eps32 = _check_eps(eps)
    out = _arrays.output(out, x.shape, x.dtype)
    _arrays.check_no_overlap(x, "x", out, "out", allow_same=True)
    if rows.num_rows == 0:
        return out
    out_rows = _arrays.rows_of(out, "out")
    aligned = _arrays.vector_aligned(_dtypes.vec_width(x.dtype), (x, rows.row_stride), (out, out_rows.row_stride),
                                     *[(a, 0) for a in (weight, bias) if a is not None])
    plan = _rowkernel.plan(rows.num_rows, rows.hidden_size, x.dtype, aligned, op="layer_norm")
    null = np.uint64(0)  # a null pointer for an absent weight or bias
    _rowkernel.run(LAYER_NORM, (_dtypes.c_type(x.dtype),), plan, (
        out, x, weight if weight is not None else null, bias if bias is not None else null,
        np.int64(rows.num_rows), np.int64(rows.hidden_size), np.int64(rows.row_stride),
        np.int64(out_rows.row_stride), eps32))
    return out
