"""float64 references of kernels_cu/norm.cu: rms_norm, fused_add_rms_norm, layer_norm.

Each checks its arguments with its kernel's own checks (reference/_common.py: same
errors, same messages), then computes in float64.
"""

from __future__ import annotations

import numpy as np

from cupykern.reference._common import check, f64, host, real64, round_to

__all__ = ["fused_add_rms_norm", "layer_norm", "rms_norm"]


def _rms_norm(x, weight, eps, weight_offset) -> np.ndarray:
    x = f64(x)
    inv_rms = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + real64(eps))
    return x * inv_rms * (f64(weight) + real64(weight_offset))


def rms_norm(x, weight, eps: float = 1e-6, *, weight_offset: float = 0.0) -> np.ndarray:
    """``x / sqrt(mean(x**2) + eps) * (weight + weight_offset)`` in float64 (arXiv:1910.07467).

    Raises: what :func:`cupykern.rms_norm` raises for such arguments (TypeError,
    ValueError naming the argument). An all-zero row with ``eps=0`` gives NaN.
    """
    check("rms_norm", x=x, weight=weight, eps=eps, weight_offset=weight_offset)
    return _rms_norm(x, weight, eps, weight_offset)


def fused_add_rms_norm(x, residual, weight, eps: float = 1e-6, *, weight_offset: float = 0.0):
    """``(rms_norm(s), s)`` with ``s = x + residual`` rounded to x's dtype (vLLM's semantics).

    Returns float64 arrays: what the kernel writes to ``x`` and to ``residual``. Writes
    nothing. Raises: what :func:`cupykern.fused_add_rms_norm` raises for such arguments.
    """
    check("fused_add_rms_norm", x=x, residual=residual, weight=weight, eps=eps, weight_offset=weight_offset)
    summed = round_to(f64(x) + f64(residual), host(x).dtype)
    return _rms_norm(summed, weight, eps, weight_offset), summed


def layer_norm(x, weight, bias, eps: float = 1e-5) -> np.ndarray:
    """``(x - mean) / sqrt(var + eps) * weight + bias``, biased variance, float64 (arXiv:1607.06450).

    Raises: what :func:`cupykern.layer_norm` raises for such arguments.
    """
    check("layer_norm", x=x, weight=weight, bias=bias, eps=eps)
    x = f64(x)
    centered = x - np.mean(x, axis=-1, keepdims=True)
    y = centered / np.sqrt(np.mean(centered * centered, axis=-1, keepdims=True) + real64(eps))
    if weight is not None:
        y = y * f64(weight)
    if bias is not None:
        y = y + f64(bias)
    return y
