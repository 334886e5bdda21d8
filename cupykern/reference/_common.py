"""Helpers shared by the float64 references."""

from __future__ import annotations

import numpy as np


def host(a) -> np.ndarray:
    """A NumPy array from a NumPy or CuPy (or other ``.get()``-able) array, unchanged dtype."""
    if a is None:
        return None
    if hasattr(a, "get") and not isinstance(a, np.ndarray):
        return a.get()
    return np.asarray(a)


def f64(a) -> np.ndarray:
    """``a`` on the host as float64."""
    return host(a).astype(np.float64)


def round_to(values: np.ndarray, dtype) -> np.ndarray:
    """float64 values rounded (to nearest even) to ``dtype`` and back to float64."""
    return values.astype(dtype).astype(np.float64)
