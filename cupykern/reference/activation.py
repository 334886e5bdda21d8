"""float64 references of kernels_cu/activation.cu: silu_and_mul, gelu_and_mul, swiglu.

A gate of -inf gives the activation's limit -0 (not -inf * 0 = NaN), as the kernel
does; any finite gate follows the formula. NumPy has no erf, so the erf GELU uses
``math.erfc`` per element; for 2-byte dtypes each activation is tabulated once over
all 65536 values and looked up, which is exact and fast. Arguments are checked with the
kernels' own checks (reference/_common.py: same errors, same messages).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from cupykern.reference._common import check, f64, host

__all__ = ["gelu_and_mul", "silu_and_mul", "swiglu"]

_SQRT_HALF = math.sqrt(0.5)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_erfc = np.frompyfunc(math.erfc, 1, 1)


def _silu(g: np.ndarray) -> np.ndarray:
    """``g / (1 + exp(-g))`` (Elfwing et al. 2017, arXiv:1702.03118)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return g / (1.0 + np.exp(-g))


def _gelu_erf(g: np.ndarray) -> np.ndarray:
    """``g * Phi(g) = 0.5 * g * erfc(-g / sqrt(2))`` (Hendrycks & Gimpel 2016, arXiv:1606.08415)."""
    with np.errstate(invalid="ignore"):
        return 0.5 * g * _erfc(-g * _SQRT_HALF).astype(np.float64)


def _gelu_tanh(g: np.ndarray) -> np.ndarray:
    """``0.5 * g * (1 + tanh(sqrt(2 / pi) * (g + 0.044715 * g**3)))`` (arXiv:1606.08415)."""
    with np.errstate(over="ignore", invalid="ignore"):
        # 0.5 * (1 + tanh(u)) == 1 / (1 + exp(-2u)): the same function without the
        # cancellation of 1 + tanh(u) for u << 0 (gates below about -7).
        return g / (1.0 + np.exp(-2.0 * _SQRT_2_OVER_PI * (g + 0.044715 * g**3)))


_ACTIVATIONS = {"silu": _silu, "gelu": _gelu_erf, "gelu_tanh": _gelu_tanh}
_GELU_APPROXIMATIONS = {"none": "gelu", "tanh": "gelu_tanh"}


def _with_limits(fn, g: np.ndarray) -> np.ndarray:
    y = np.asarray(fn(g), dtype=np.float64)
    return np.where(np.isneginf(g), -0.0, y)


@lru_cache(maxsize=None)
def _table(activation: str, dtype: np.dtype) -> np.ndarray:
    """The activation of every value of a 2-byte dtype, indexed by its bits."""
    with np.errstate(invalid="ignore"):  # the NaN bit patterns
        values = np.arange(2**16, dtype=np.uint16).view(dtype).astype(np.float64)
    return _with_limits(_ACTIVATIONS[activation], values)


def _activate(activation: str, gate) -> np.ndarray:
    """float64 activation of each element of ``gate`` (any float dtype)."""
    gate = host(gate)
    if gate.dtype.itemsize == 2 and gate.dtype.kind in "fV":
        return _table(activation, gate.dtype)[gate.view(np.uint16)]
    return _with_limits(_ACTIVATIONS[activation], f64(gate))


def _act_and_mul(activation: str, gate, up) -> np.ndarray:
    return _activate(activation, gate) * f64(up)


def _halves(x):
    x = host(x)
    d = x.shape[-1] // 2
    return x[..., :d], x[..., d:]


def silu_and_mul(x) -> np.ndarray:
    """``silu(x[..., :d]) * x[..., d:]`` in float64 (vLLM's silu_and_mul; arXiv:2002.05202).

    Raises: what :func:`cupykern.silu_and_mul` raises for such arguments (an odd or empty
    last axis is a ValueError).
    """
    check("silu_and_mul", x=x)
    return _act_and_mul("silu", *_halves(x))


def gelu_and_mul(x, *, approximate: str = "none") -> np.ndarray:
    """``gelu(x[..., :d]) * x[..., d:]`` in float64; ``approximate`` "none" (erf) or "tanh".

    Raises: what :func:`cupykern.gelu_and_mul` raises for such arguments.
    """
    check("gelu_and_mul", x=x, approximate=approximate)
    return _act_and_mul(_GELU_APPROXIMATIONS[approximate], *_halves(x))


def swiglu(gate, up) -> np.ndarray:
    """``silu(gate) * up`` in float64 (Shazeer 2020, arXiv:2002.05202).

    Raises: what :func:`cupykern.swiglu` raises for such arguments.
    """
    check("swiglu", gate=gate, up=up)
    return _act_and_mul("silu", gate, up)
