"""Helpers shared by the float64 references: host arrays, rounding, and the argument checks
they share with the kernels."""

from __future__ import annotations

import numpy as np

from cupykern import _arrays, launcher

_FLOAT64, _FLOAT32 = np.dtype(np.float64), np.dtype(np.float32)


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


def real64(value) -> float:
    """A scalar the checks took (eps, weight_offset, temperature: a real number, or a
    complex one with no imaginary part, a Fraction, a Decimal, a 0-d array, NumPy's long
    double) as a Python float, so that the reference computes in float64 (helper 76: a
    complex eps made the result complex128, a Fraction one failed inside NumPy)."""
    return float(np.real(value))


def round_to(values: np.ndarray, dtype) -> np.ndarray:
    """float64 values rounded (to nearest even) to ``dtype`` and back to float64."""
    return values.astype(dtype).astype(np.float64)


# ----------------------------------------------------------------- argument checks
def signature(a, name: str) -> _arrays.Sig | None:
    """What the kernels' intake checks see of a NumPy or CuPy array: shape, byte strides,
    dtype and address modulo 16 (None stays None).

    A float64 array, the references' own precision (their outputs fed back in, the
    float64 model of cupykern.llm), is checked as the float32 array (the kernels'
    compute type) of the same shape and element strides; every other dtype as it is (so
    an integer x is refused as the kernel refuses it).

    Raises:
        TypeError: ``a`` is not a NumPy or CuPy array (a list, a scalar, ...), or is a
            NumPy masked array (its mask would be ignored).
        ValueError: a float64 array whose strides are not whole elements.
    """
    if a is None:
        return None
    if isinstance(a, np.ma.MaskedArray):  # helper 76: the mask was dropped without a word
        raise TypeError(f"{name}: expected a NumPy or CuPy array, got a masked array, whose mask the "
                        f"references would ignore; pass {name}.filled(value) or {name}.data")
    if isinstance(a, np.ndarray):
        address = a.ctypes.data
    elif hasattr(a, "strides") and hasattr(getattr(a, "data", None), "ptr"):  # cupy.ndarray
        address = a.data.ptr
    else:
        raise TypeError(f"{name}: expected a NumPy or CuPy array, got {type(a).__name__}")
    dtype, strides = np.dtype(a.dtype), tuple(a.strides)
    if dtype == _FLOAT64:
        if any(s % dtype.itemsize for s in strides):
            raise ValueError(f"{name}: strides {strides} are not multiples of the item size {dtype.itemsize}")
        dtype, strides = _FLOAT32, tuple(s // 2 for s in strides)
    return _arrays.Sig(tuple(a.shape), strides, dtype, address % 16)


def check(op_name: str, **values) -> None:
    """Checks a reference call's arguments with the kernel op's own intake
    (:meth:`cupykern.launcher.Op.check`): the same TypeError/ValueError, with the same
    message, as ``cupykern.<op_name>`` given device arrays of those signatures. Arrays are
    NumPy or CuPy (:func:`signature`); a name not given (``out``) is None. Nothing is
    planned or launched, and no GPU is needed.

    A float64 array is checked as the float32 array of its shape and element strides
    (:func:`signature`), so messages about one say so: a refused dtype is named float64
    (an index array: ``positions``, ``token_ids``), as the op names it, byte counts
    (strides) get a note that they are the float32 array's, and a message naming float32
    (another array's dtype checked against it) names the float64 arrays.

    The ops are declared when the cupykern package is imported (``cupykern/__init__.py``
    imports every family's ops module), which happens before any reference module runs.
    """
    op = launcher.ops()[op_name]
    try:
        op.check({name: signature(value, name) if name in op.arrays else value for name, value in values.items()})
    except (TypeError, ValueError) as exc:
        # (np.dtype(None) is float64: an absent array must not compare equal to it)
        wide = [name for name in op.arrays if getattr(values.get(name), "dtype", _FLOAT32) == _FLOAT64]
        if not wide:
            raise
        message = str(exc)
        name = message.split(":", 1)[0]
        if name in wide and isinstance(exc, TypeError) and message.endswith("got float32"):
            raise TypeError(message.removesuffix("float32") + "float64") from None
        if name in wide and " bytes" in message:  # helper 63: "got stride 8 bytes" for a float64 stride of 16
            raise type(exc)(f"{message} (bytes of the float32 array this float64 one is checked as: half its "
                            f"own)") from None
        if "float32" in message:  # helper 62: "weight: expected dtype float32 (the dtype of x)" for a float64 x
            raise type(exc)(f"{message} ({', '.join(wide)}: float64, checked as float32)") from None
        raise
