"""float64 reference of kernels_cu/softmax.cu."""

from __future__ import annotations

import numpy as np

from cupykern.reference._common import check, f64, real64

__all__ = ["softmax"]


def softmax(x, *, temperature: float = 1.0) -> np.ndarray:
    """Max-subtracted softmax of ``x / temperature`` over the last axis, float64.

    All -inf rows give NaN (-inf - -inf); NaN anywhere in a row makes the row NaN.

    Raises: what :func:`cupykern.softmax` raises for such arguments (a temperature that
    is not finite and positive, or outside the kernel's range, is a ValueError).
    """
    check("softmax", x=x, temperature=temperature)
    z = f64(x) / real64(temperature)
    with np.errstate(invalid="ignore"):
        e = np.exp(z - np.max(z, axis=-1, keepdims=True))
        return e / np.sum(e, axis=-1, keepdims=True)
