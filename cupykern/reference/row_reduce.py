"""float64 reference of kernels_cu/row_reduce.cu."""

from __future__ import annotations

import numpy as np

from cupykern.reference._common import f64

__all__ = ["row_reduce"]

_OPS = {
    "sum": lambda x: np.sum(x, axis=-1),
    "mean": lambda x: np.mean(x, axis=-1),
    "sumsq": lambda x: np.sum(x * x, axis=-1),
    "max": lambda x: np.max(x, axis=-1),
    "min": lambda x: np.min(x, axis=-1),
}


def row_reduce(x, op: str) -> np.ndarray:
    """``op`` ("sum", "mean", "sumsq", "max", "min") over the last axis, float64, NaN-propagating.

    Raises ValueError for an unknown ``op``.
    """
    if not isinstance(op, str) or op not in _OPS:
        raise ValueError(f"op: expected one of {sorted(_OPS)}, got {op!r}")
    return _OPS[op](f64(x))
