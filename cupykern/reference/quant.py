"""float64 references of kernels_cu/quant.cu: the FP8 (E4M3FN) outputs of RMSNorm and SiLU-and-mul.

Each checks its arguments with its kernel's own checks (reference/_common.py: same
errors, same messages), computes the op's value y in float64 (the norm and activation
references' own functions), and models the kernel's quantisation: y times the float32
reciprocal of the scale (``float32(1) / float32(scale)``, as ``__frcp_rn``), rounded once,
to nearest even, to E4M3FN with saturation (reference/_fp8.py, exact from float64). They
return float64 arrays of E4M3FN values (NaN where NaN); ``reference._fp8.e4m3fn_bits``
gives the bit patterns the kernels write. The kernels' y is fp32, so an element whose
y * (1 / scale) lies within a few fp32 units of an E4M3FN rounding boundary may round to
the neighbour: tests allow a counted, bounded number of one-unit differences.
"""

from __future__ import annotations

import numpy as np

from cupykern.ops.quant import scale_upper_bound
from cupykern.reference._common import check, f64, host, round_to
from cupykern.reference._fp8 import E4M3FN_MAX, round_e4m3fn
from cupykern.reference.activation import _act_and_mul, _halves
from cupykern.reference.norm import _rms_norm

__all__ = ["fused_add_rms_norm_dynamic_per_token_quant", "fused_add_rms_norm_quant",
           "rms_norm_dynamic_per_token_quant", "rms_norm_quant", "silu_and_mul_quant"]

#: vLLM's min_scaling_factor for E4M3FN: the smallest per-token scale.
MIN_SCALE = 1.0 / (E4M3FN_MAX * 512.0)


def _inverse(scale) -> np.ndarray:
    """The kernel's float32 reciprocal of float32 scales, as float64."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return (np.float32(1.0) / np.asarray(scale, dtype=np.float32)).astype(np.float64)


def _quantise_static(y: np.ndarray, scale) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        return round_e4m3fn(y * _inverse(f64(scale)[0]))


def _quantise_per_token(y: np.ndarray, scale_ub) -> tuple[np.ndarray, np.ndarray]:
    """(E4M3FN values, scales (..., 1)) with vLLM's per-token scale; NaN propagates."""
    absmax = np.max(np.abs(y), axis=-1, keepdims=True) if y.shape[-1] else np.zeros((*y.shape[:-1], 1))
    if scale_ub is not None:  # the kernel's float32 bound (a complex 2+0j or a 0-d array as the op reads it)
        absmax = np.minimum(absmax, float(scale_upper_bound(scale_ub)))
    scales = np.maximum(absmax / E4M3FN_MAX, MIN_SCALE)
    with np.errstate(invalid="ignore", over="ignore"):
        return round_e4m3fn(y * _inverse(scales)), scales


def rms_norm_quant(x, weight, scale, eps: float = 1e-6, *, weight_offset: float = 0.0) -> np.ndarray:
    """``round_e4m3fn(rms_norm(x) * float32(1 / scale))`` from float64 (vLLM's rms_norm_static_fp8_quant).

    Raises: what :func:`cupykern.rms_norm_quant` raises for such arguments.
    """
    check("rms_norm_quant", x=x, weight=weight, scale=scale, eps=eps, weight_offset=weight_offset)
    return _quantise_static(_rms_norm(x, weight, eps, weight_offset), scale)


def fused_add_rms_norm_quant(x, residual, weight, scale, eps: float = 1e-6, *, weight_offset: float = 0.0):
    """``(rms_norm_quant of s, s)`` with ``s = x + residual`` rounded to x's dtype.

    Returns float64 arrays: what the kernel writes to ``out`` and to ``residual``.
    Raises: what :func:`cupykern.fused_add_rms_norm_quant` raises for such arguments.
    """
    check("fused_add_rms_norm_quant", x=x, residual=residual, weight=weight, scale=scale, eps=eps,
          weight_offset=weight_offset)
    summed = round_to(f64(x) + f64(residual), host(x).dtype)
    return _quantise_static(_rms_norm(summed, weight, eps, weight_offset), scale), summed


def rms_norm_dynamic_per_token_quant(x, weight, eps: float = 1e-6, *, scale_ub=None, weight_offset: float = 0.0):
    """``(out, scales)`` of vLLM's rms_norm_dynamic_per_token_quant, from float64.

    ``scales = max(min(max|y|, scale_ub) / 448, 1 / (448 * 512))`` per row, shape
    ``(..., 1)``; ``out = round_e4m3fn(y * float32(1 / float32(scales)))``.
    Raises: what :func:`cupykern.rms_norm_dynamic_per_token_quant` raises for such arguments.
    """
    check("rms_norm_dynamic_per_token_quant", x=x, weight=weight, eps=eps, scale_ub=scale_ub,
          weight_offset=weight_offset)
    return _quantise_per_token(_rms_norm(x, weight, eps, weight_offset), scale_ub)


def fused_add_rms_norm_dynamic_per_token_quant(x, residual, weight, eps: float = 1e-6, *, scale_ub=None,
                                               weight_offset: float = 0.0):
    """``(out, scales, s)``: :func:`rms_norm_dynamic_per_token_quant` of ``s = x + residual``
    rounded to x's dtype, and ``s`` (what the kernel writes to ``residual``).

    Raises: what :func:`cupykern.fused_add_rms_norm_dynamic_per_token_quant` raises for such arguments.
    """
    check("fused_add_rms_norm_dynamic_per_token_quant", x=x, residual=residual, weight=weight, eps=eps,
          scale_ub=scale_ub, weight_offset=weight_offset)
    summed = round_to(f64(x) + f64(residual), host(x).dtype)
    return (*_quantise_per_token(_rms_norm(summed, weight, eps, weight_offset), scale_ub), summed)


def silu_and_mul_quant(x, scale) -> np.ndarray:
    """``round_e4m3fn(silu(x[..., :d]) * x[..., d:] * float32(1 / scale))`` from float64 (vLLM's silu_and_mul_quant).

    Raises: what :func:`cupykern.silu_and_mul_quant` raises for such arguments.
    """
    check("silu_and_mul_quant", x=x, scale=scale)
    return _quantise_static(_act_and_mul("silu", *_halves(x)), scale)
