"""Argument intake: foreign arrays to CuPy, row geometry, and the checks that raise.

Every public op funnels its arguments through here, so the error messages are uniform:
they name the argument and say what was expected and what was given. The geometry
helpers work on plain tuples and need no GPU, so CPU tests exercise them directly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cupy
import numpy as np

from cupykern import _dtypes

_DLPACK_CUDA_DEVICES = (2, 13)  # kDLCUDA, kDLCUDAManaged


@dataclass(frozen=True)
class Rows:
    """An array seen as ``num_rows`` rows of ``hidden_size`` elements.

    The last axis is unit-stride; consecutive rows start ``row_stride`` elements apart
    (the leading axes collapse into one stride).
    """

    num_rows: int
    hidden_size: int
    row_stride: int


#: rows_view's answers for geometries seen before (only valid ones: errors name the
#: argument). An op call asks 2 to 4 times; each answer cost ~4 us of Python.
_GEOMETRIES: dict = {}
_MAX_GEOMETRIES = 4096


def rows_view(shape, strides, itemsize: int, name: str) -> Rows:
    """Row geometry of an array from its shape and byte strides.

    Raises:
        ValueError: no axes; a non-unit stride along the last axis; leading axes that
            do not collapse into a single row stride; strides not a multiple of the
            item size.
    """
    shape, strides = tuple(shape), tuple(strides)
    key = (shape, strides, itemsize)
    found = _GEOMETRIES.get(key)
    if found is None:
        found = _rows_view(shape, strides, itemsize, name)
        if len(_GEOMETRIES) >= _MAX_GEOMETRIES:
            _GEOMETRIES.clear()
        _GEOMETRIES[key] = found
    return found


def _rows_view(shape: tuple, strides: tuple, itemsize: int, name: str) -> Rows:
    if not shape:
        raise ValueError(f"{name}: expected at least one axis (..., hidden_size), got a 0-d array")
    if 0 in shape:  # nothing to address: CuPy reports zero strides for empty arrays
        return Rows(math.prod(shape[:-1]), shape[-1], shape[-1])
    if any(s % itemsize for s in strides):
        raise ValueError(f"{name}: strides {strides} are not multiples of the item size {itemsize}")
    hidden_size = shape[-1]
    if hidden_size > 1 and strides[-1] != itemsize:
        raise ValueError(
            f"{name}: the last axis must be unit-stride (stride {itemsize} bytes), got stride "
            f"{strides[-1]} bytes; pass cupy.ascontiguousarray({name})")
    num_rows = math.prod(shape[:-1])
    lead = [(n, s // itemsize) for n, s in zip(shape[:-1], strides[:-1]) if n != 1]
    for (_, outer), (n_inner, inner) in zip(lead, lead[1:]):
        if outer != n_inner * inner:
            raise ValueError(
                f"{name}: leading axes of shape {shape[:-1]} with strides {strides[:-1]} do not flatten "
                f"into rows with one stride; pass cupy.ascontiguousarray({name})")
    row_stride = lead[-1][1] if lead else hidden_size
    return Rows(num_rows, hidden_size, row_stride)


def rows_of(arr, name: str) -> Rows:
    """:func:`rows_view` of a CuPy array."""
    return rows_view(arr.shape, arr.strides, arr.itemsize, name)


def as_device_array(obj, name: str) -> cupy.ndarray:
    """``obj`` as a ``cupy.ndarray`` on the current device, without copying.

    Accepts ``cupy.ndarray``, objects with ``__dlpack__`` on a CUDA device (JAX, PyTorch,
    ...) and objects with ``__cuda_array_interface__``.

    Raises:
        TypeError: a NumPy array or any host object, or an object that is not an array.
        ValueError: the array lives on another GPU than the current device.
    """
    if isinstance(obj, cupy.ndarray):
        arr = obj
    elif isinstance(obj, (np.ndarray, np.generic)):
        raise TypeError(
            f"{name}: expected a device array (cupy.ndarray, or an object with __dlpack__ or "
            f"__cuda_array_interface__), got a NumPy array; move it first with cupy.asarray({name})")
    elif hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        device_type = obj.__dlpack_device__()[0]
        if int(device_type) not in _DLPACK_CUDA_DEVICES:
            raise TypeError(f"{name}: expected an array on a CUDA device, got DLPack device type {device_type}")
        arr = cupy.from_dlpack(obj)
    elif hasattr(obj, "__cuda_array_interface__"):
        arr = cupy.asarray(obj)
    else:
        raise TypeError(f"{name}: expected a device array (cupy.ndarray), got {type(obj).__name__}")
    current = cupy.cuda.Device().id
    if arr.device.id != current:
        raise ValueError(
            f"{name}: array is on GPU {arr.device.id} but the current device is GPU {current}; "
            f"call inside `with cupy.cuda.Device({arr.device.id}):`")
    return arr


def check_dtype(arr, dtype, name: str, what: str) -> None:
    """Raises TypeError unless ``arr.dtype == dtype``; ``what`` says where it comes from."""
    if arr.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype} ({what}), got {arr.dtype}")


def check_shape(arr, shape, name: str) -> None:
    """Raises ValueError unless ``arr.shape == shape``."""
    if tuple(arr.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(arr.shape)}")


def check_hidden_size(rows: Rows, name: str) -> None:
    if rows.hidden_size < 1:
        raise ValueError(f"{name}: the last axis must have at least one element, got shape (..., 0)")


def output(out, shape, dtype, name: str = "out") -> cupy.ndarray:
    """``out`` checked against the expected shape and dtype, or a new array if None."""
    if out is None:
        return cupy.empty(shape, dtype=dtype)
    out = as_device_array(out, name)
    check_shape(out, shape, name)
    check_dtype(out, dtype, name, "the result dtype")
    return out


def byte_extent(arr) -> tuple[int, int]:
    """[lowest, highest + 1) byte address an array's elements occupy."""
    lo = hi = arr.data.ptr
    for n, s in zip(arr.shape, arr.strides):
        if n == 0:
            return lo, lo
        lo += min(0, (n - 1) * s)
        hi += max(0, (n - 1) * s)
    return lo, hi + arr.itemsize


def same_view(a, b) -> bool:
    """True when ``a`` and ``b`` are the same elements in the same order."""
    return a.data.ptr == b.data.ptr and a.shape == b.shape and a.strides == b.strides and a.dtype == b.dtype


def rows_overlap(a_ptr: int, a_rows: Rows, a_itemsize: int, b_ptr: int, b_rows: Rows, b_itemsize: int,
                 a_extent: tuple[int, int], b_extent: tuple[int, int]) -> bool:
    """Whether two row views may touch a common byte (exact for equal row strides)."""
    if a_extent[1] <= b_extent[0] or b_extent[1] <= a_extent[0]:
        return False
    stride = a_rows.row_stride * a_itemsize
    if a_rows.num_rows > 1 and b_rows.num_rows > 1 and stride == b_rows.row_stride * b_itemsize and stride > 0:
        # Rows of both repeat with the same period: disjoint iff b's rows sit in the
        # gap between a's rows (e.g. two column slices of one wide buffer).
        offset = (b_ptr - a_ptr) % stride
        a_width = a_rows.hidden_size * a_itemsize
        b_width = b_rows.hidden_size * b_itemsize
        return not (offset >= a_width and offset + b_width <= stride)
    return True


def check_no_overlap(a, a_name: str, b, b_name: str, *, allow_same: bool) -> None:
    """Raises ValueError if ``a`` and ``b`` share memory, except an exact alias when
    ``allow_same`` (in-place use); a partial overlap would race inside the kernel."""
    if allow_same and same_view(a, b):
        return
    if a.size == 0 or b.size == 0:
        return
    overlap = rows_overlap(a.data.ptr, rows_of(a, a_name), a.itemsize, b.data.ptr, rows_of(b, b_name),
                           b.itemsize, byte_extent(a), byte_extent(b))
    if overlap:
        hint = f" (in place is allowed only as {b_name}={a_name} exactly)" if allow_same else ""
        raise ValueError(f"{b_name} overlaps {a_name} in memory{hint}")


def vector_aligned(vec_width: int, *arrays_and_strides) -> bool:
    """Whether ``vec_width``-element accesses are aligned for every (array, row_stride).

    Each array's base pointer must be a multiple of ``vec_width * itemsize`` bytes and
    its row stride a multiple of ``vec_width`` elements, so every row starts aligned.
    """
    for arr, row_stride in arrays_and_strides:
        if arr.data.ptr % (vec_width * arr.itemsize) or row_stride % vec_width:
            return False
    return True


def check_supported_dtype(arr, name: str):
    return _dtypes.check_supported(arr.dtype, name)
