"""float64 references of kernels_cu/gemv.cu: gemv, gemv_add_residual, rms_norm_gemv,
rms_norm_gemv_silu_and_mul.

Values the kernels round to the storage dtype on the way (the normalised row, the gate
and up products) are rounded here at the same points; the final output is returned
unrounded.
"""

from __future__ import annotations

import numpy as np

from cupykern.reference._common import f64, host, round_to
from cupykern.reference.activation import silu_and_mul as _silu_and_mul
from cupykern.reference.norm import rms_norm as _rms_norm

__all__ = ["gemv", "gemv_add_residual", "rms_norm_gemv", "rms_norm_gemv_silu_and_mul"]


def gemv(x, weight, *, out=None, out_dtype=None) -> np.ndarray:
    """``x @ weight.T`` in float64 (``out``/``out_dtype`` only shape the kernel's output)."""
    return f64(x) @ f64(weight).T


def gemv_add_residual(x, weight, residual) -> np.ndarray:
    """``residual + x @ weight.T`` in float64: what the kernel writes to ``residual``."""
    return f64(residual) + gemv(x, weight)


def _normalised(x, norm_weight, eps) -> np.ndarray:
    """The normalised row as the kernels store it: rounded to x's dtype."""
    return round_to(_rms_norm(x, norm_weight, eps), host(x).dtype)


def rms_norm_gemv(x, norm_weight, weight, eps=1e-6, *, out=None, out_dtype=None) -> np.ndarray:
    """``round(rms_norm(x)) @ weight.T`` in float64 (RMSNorm, arXiv:1910.07467)."""
    return _normalised(x, norm_weight, eps) @ f64(weight).T


def rms_norm_gemv_silu_and_mul(x, norm_weight, gate_up_weight, eps=1e-6, *, out=None) -> np.ndarray:
    """``silu_and_mul(round(round(rms_norm(x)) @ gate_up_weight.T))`` in float64 (SwiGLU,
    arXiv:2002.05202)."""
    dtype = host(x).dtype
    product = round_to(_normalised(x, norm_weight, eps) @ f64(gate_up_weight).T, dtype)
    return _silu_and_mul(product)
