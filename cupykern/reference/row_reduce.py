"""float64 reference of kernels_cu/row_reduce.cu."""

from __future__ import annotations

import numpy as np

from cupykern.reference._common import check, f64

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

    Raises: what :func:`cupykern.row_reduce` raises for such arguments (an unknown ``op``
    is a ValueError).
    """
    check("row_reduce", x=x, op=op)
    return _OPS[op](f64(x))
