"""Argument intake: what each argument of an op must be, checked on its signature.

The launcher (cupykern/launcher.py) hands an op's intake spec a :class:`Sig` per array
argument, never the array: shape, strides in bytes, dtype and the address modulo 16.
Everything checked here depends on that alone, so it is checked once per call
signature and the answer cached; checks that depend on the addresses themselves
(overlap, done per call by the launcher) use the geometry computed here. Every error
names the argument and says what was expected and what was given. Nothing here needs
a GPU, so CPU tests build signatures by hand (:meth:`Sig.contiguous`).

:func:`as_device_array` is the one place foreign arrays (DLPack, CUDA array interface)
become CuPy arrays and host arrays are refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from cupykern import _dtypes

_DLPACK_CUDA_DEVICES = (2, 13)  # kDLCUDA, kDLCUDAManaged


class Sig(NamedTuple):
    """What the intake checks may look at of one array: its call signature."""

    shape: tuple
    strides: tuple  # bytes
    dtype: np.dtype
    align: int  # the data address modulo 16, in bytes

    @staticmethod
    def contiguous(shape, dtype, align: int = 0) -> "Sig":
        """The signature of a C-contiguous array (CPU tests; freshly allocated outputs)."""
        dtype = np.dtype(dtype)
        shape = tuple(int(n) for n in shape)
        strides, step = [], dtype.itemsize
        for n in reversed(shape):
            strides.append(step)
            step *= max(n, 1)
        return Sig(shape, tuple(reversed(strides)), dtype, align)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Rows:
    """An array seen as ``num_rows`` rows of ``hidden_size`` elements.

    The last axis is unit-stride; consecutive rows start ``row_stride`` elements apart
    (the leading axes collapse into one stride).
    """

    num_rows: int
    hidden_size: int
    row_stride: int


# ----------------------------------------------------------------- foreign arrays
def as_device_array(obj, name: str):
    """``obj`` as a ``cupy.ndarray`` on the current device, without copying.

    Accepts ``cupy.ndarray``, objects with ``__dlpack__`` on a CUDA device (JAX, PyTorch,
    ...) and objects with ``__cuda_array_interface__``.

    Raises:
        TypeError: a NumPy array or any host object, or an object that is not an array.
        ValueError: the array lives on another GPU than the current device.
        RuntimeError: CUDA cannot be used here (no driver, no GPU) to take the array,
            naming the argument and CUDA's reason.
    """
    import cupy

    if isinstance(obj, (np.ndarray, np.generic)):
        raise TypeError(
            f"{name}: expected a device array (cupy.ndarray, or an object with __dlpack__ or "
            f"__cuda_array_interface__), got a NumPy array; move it first with cupy.asarray({name})")
    foreign = not isinstance(obj, cupy.ndarray)
    if foreign and not (hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__")) and \
            not hasattr(obj, "__cuda_array_interface__"):
        raise TypeError(f"{name}: expected a device array (cupy.ndarray), got {type(obj).__name__}")
    try:
        arr = _from_foreign(obj, name) if foreign else obj
        check_device(arr.data.device_id, cupy.cuda.runtime.getDevice(), name)
    except (cupy.cuda.runtime.CUDARuntimeError, cupy.cuda.driver.CUDADriverError) as exc:
        # Without a driver CuPy raises its raw error here; say which argument and why.
        raise RuntimeError(f"{name}: CUDA cannot be used to take this device array ({exc}); is there a GPU "
                           f"and a CUDA 13 driver? (`cupykern info` shows what CuPy sees)") from None
    return arr


def _from_foreign(obj, name: str):
    """A DLPack or CUDA-array-interface object as a cupy.ndarray (no copy)."""
    import cupy

    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        device_type = obj.__dlpack_device__()[0]
        if int(device_type) not in _DLPACK_CUDA_DEVICES:
            raise TypeError(f"{name}: expected an array on a CUDA device, got DLPack device type {device_type}")
        return cupy.from_dlpack(obj)
    return cupy.asarray(obj)


def check_device(array_device: int, current_device: int, name: str) -> None:
    """ValueError unless the array lives on the current device."""
    if array_device != current_device:
        raise ValueError(
            f"{name}: array is on GPU {array_device} but the current device is GPU {current_device}; "
            f"call inside `with cupy.cuda.Device({array_device}):`")


# ----------------------------------------------------------------- arrays
def required(sig: Sig | None, name: str, expected: str = "a device array") -> Sig:
    """``sig``, or TypeError if the argument was None."""
    if sig is None:
        raise TypeError(f"{name}: expected {expected}, got None")
    return sig


def supported_dtype(sig: Sig, name: str) -> np.dtype:
    """The array's dtype if it is float32, float16 or bfloat16, else TypeError."""
    return _dtypes.check_supported(sig.dtype, name)


def check_dtype(sig: Sig, dtype, name: str, what: str) -> None:
    """TypeError unless the array has ``dtype``; ``what`` says where that comes from."""
    if sig.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype} ({what}), got {sig.dtype}")


def check_shape(sig: Sig, shape, name: str) -> None:
    """ValueError unless the array has ``shape``."""
    if tuple(sig.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(sig.shape)}")


def rows_view(shape, strides, itemsize: int, name: str) -> Rows:
    """Row geometry of an array from its shape and byte strides.

    Raises:
        ValueError: no axes; a non-unit stride along the last axis; leading axes that
            do not collapse into a single row stride; strides not a multiple of the
            item size.
    """
    shape, strides = tuple(shape), tuple(strides)
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
    lead = [(n, s // itemsize) for n, s in zip(shape[:-1], strides[:-1]) if n != 1]
    row_stride = collapse(shape[:-1], [s // itemsize for s in strides[:-1]], name, "leading")
    return Rows(math.prod(shape[:-1]), hidden_size, row_stride if lead else hidden_size)


#: Kernels that take sizes and strides as 32-bit ints (activation.cu, quant.cu's
#: act_and_mul_quant_kernel, norm.cu's rms_norm_kernel, softmax.cu, row_reduce.cu, rope.cu)
#: take values of magnitude below this.
INT32_LIMIT = 2**31


def is_int(value) -> bool:
    """Whether ``value`` is a Python or NumPy int, and not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def count(value, name: str, lowest: int, highest: int | None = None) -> int:
    """``value`` as a Python int, ValueError naming ``name`` unless an int (not a bool) >=
    ``lowest`` (and <= ``highest`` if given). Converted before it is compared, so that an
    int subclass compares as the int it holds and a NumPy one cannot wrap later."""
    number = int(value) if is_int(value) else None
    if number is None or number < lowest or (highest is not None and number > highest):
        want = f"an int >= {lowest}" if highest is None else f"an int in [{lowest}, {highest}]"
        raise ValueError(f"{name}: expected {want}, got {value!r}")
    return number


def int32_rows(rows: Rows, name: str) -> tuple[np.int32, np.int32]:
    """``(num_rows, hidden_size)`` as a kernel's 32-bit arguments.

    Raises:
        ValueError: ``2**31`` rows or more, or rows of ``2**31`` elements or more.
    """
    if rows.num_rows >= INT32_LIMIT or rows.hidden_size >= INT32_LIMIT:
        raise ValueError(f"{name}: {rows.num_rows} row(s) of {rows.hidden_size} elements; expected fewer than "
                         f"2**31 of each (32-bit kernel arguments)")
    return np.int32(rows.num_rows), np.int32(rows.hidden_size)


def int32_row_stride(rows: Rows, name: str) -> np.int32:
    """``rows.row_stride`` as a kernel's 32-bit argument (0 for one row: never used).

    Raises:
        ValueError: rows ``2**31`` elements or more apart.
    """
    if rows.num_rows <= 1:
        return np.int32(0)
    if not -INT32_LIMIT < rows.row_stride < INT32_LIMIT:
        raise ValueError(f"{name}: rows {rows.row_stride} elements apart; expected fewer than 2**31 elements "
                         f"between rows (the kernel's row strides are 32-bit)")
    return np.int32(rows.row_stride)


def int32_row_args(rows: Rows, out_rows: Rows) -> tuple[np.int32, ...]:
    """num_rows, hidden_size and the row strides of x (``rows``) and out as a row
    kernel's 32-bit arguments (rms_norm, softmax, row_reduce).

    Raises:
        ValueError: naming x or out, for a value of ``2**31`` or more.
    """
    return (*int32_rows(rows, "x"), int32_row_stride(rows, "x"), int32_row_stride(out_rows, "out"))


def int32_args(*args: tuple[str, str, int]) -> tuple[np.int32, ...]:
    """Each ``(name, what, value)``'s value as a kernel's 32-bit argument, in order.

    Raises:
        ValueError: naming the array and what of it is 2**31 or more in magnitude.
    """
    for name, what, value in args:
        if not -INT32_LIMIT < value < INT32_LIMIT:
            raise ValueError(f"{name}: {what} {value}; expected less than 2**31 in magnitude (the kernel's sizes and "
                             f"strides are 32-bit)")
    return tuple(np.int32(value) for _, _, value in args)


def element_aligned(sig: Sig, name: str) -> None:
    """ValueError unless the array's address is a multiple of its item size (a misaligned
    element access would fault on the GPU)."""
    if sig.align % min(sig.itemsize, 16):
        raise ValueError(f"{name}: the address must be a multiple of the item size {sig.itemsize} bytes, "
                         f"got {sig.align} mod 16; pass a copy")


def distinct_rows(rows: Rows, name: str) -> None:
    """ValueError if the rows of an array that is written share elements (a row stride
    shorter than a row: every row would race on the same bytes)."""
    if rows.num_rows > 1 and abs(rows.row_stride) < rows.hidden_size:
        raise ValueError(f"{name}: rows of {rows.hidden_size} elements {rows.row_stride} elements apart overlap "
                         f"each other; an array that is written needs distinct rows (pass a contiguous one)")


def collapse(shape, strides, name: str, what: str) -> int:
    """The one element stride that walks axes ``shape`` (row-major) in order; ValueError
    if they do not flatten (size-1 axes are ignored). 0 when no axis is longer than 1."""
    lead = [(n, s) for n, s in zip(shape, strides) if n != 1]
    for (_, outer), (n_inner, inner) in zip(lead, lead[1:]):
        if outer != n_inner * inner:
            raise ValueError(f"{name}: {what} axes of shape {tuple(shape)} with strides {tuple(strides)} "
                             f"(elements) do not flatten into one stride; pass cupy.ascontiguousarray({name})")
    return lead[-1][1] if lead else 0


def row_input(sig: Sig | None, name: str = "x") -> tuple[Sig, Rows]:
    """A row-wise input ``(..., hidden_size)``: a device array of a supported dtype whose
    rows share one stride and are not empty."""
    sig = required(sig, name, "a device array (..., hidden_size)")
    supported_dtype(sig, name)
    element_aligned(sig, name)
    rows = rows_view(sig.shape, sig.strides, sig.itemsize, name)
    if rows.hidden_size < 1:
        raise ValueError(f"{name}: the last axis must have at least one element, got shape (..., 0)")
    return sig, rows


def output(sig: Sig | None, name: str, shape, dtype) -> Sig:
    """An output checked against the expected shape and dtype; None (the op allocates
    one) gives the signature of a fresh C-contiguous array."""
    if sig is None:
        return Sig.contiguous(shape, dtype)
    check_shape(sig, shape, name)
    check_dtype(sig, dtype, name, "the result dtype")
    element_aligned(sig, name)
    return sig


def rows_of(sig: Sig, name: str) -> Rows:
    """:func:`rows_view` of a signature."""
    return rows_view(sig.shape, sig.strides, sig.itemsize, name)


def written_rows(sig: Sig, name: str) -> Rows:
    """:func:`rows_of` an array the kernel writes, whose rows must not share elements
    (:func:`distinct_rows`)."""
    rows = rows_of(sig, name)
    distinct_rows(rows, name)
    return rows


def vector(sig: Sig | None, name: str, dtype, length: int, *, what: str, optional: bool = False) -> Sig | None:
    """A per-element parameter such as a norm weight or bias: ``(length,)`` of ``dtype``,
    unit-stride. ``what`` names where the dtype comes from (``"the dtype of x"``)."""
    if sig is None:
        if optional:
            return None
        raise TypeError(f"{name}: expected a device array of shape ({length},), got None")
    check_dtype(sig, dtype, name, what)
    check_shape(sig, (length,), name)
    element_aligned(sig, name)
    if length > 1 and sig.strides[0] != sig.itemsize:
        raise ValueError(f"{name}: must be unit-stride, got stride {sig.strides[0]} bytes")
    return sig


def index_vector(sig: Sig | None, name: str, length: int | None = None, dtypes=_dtypes.INDEX_C_TYPES) -> Sig:
    """A unit-stride 1-d device vector of positions or token ids, of one of ``dtypes``
    (int32 or int64 by default) and ``length`` elements when given."""
    expected = " or ".join(str(d) for d in dtypes)
    sig = required(sig, name, f"a device array of {expected}")
    if sig.dtype not in dtypes:
        raise TypeError(f"{name}: expected dtype {expected}, got {sig.dtype}")
    if len(sig.shape) != 1 or (length is not None and sig.shape[0] != length):
        want = f"shape ({length},)" if length is not None else "a 1-d array"
        raise ValueError(f"{name}: expected {want}, got shape {tuple(sig.shape)}")
    element_aligned(sig, name)
    if sig.shape[0] > 1 and sig.strides[0] != sig.itemsize:
        raise ValueError(f"{name}: must be unit-stride, got stride {sig.strides[0]} bytes")
    return sig


def vector_aligned(vec_width: int, *sigs_and_strides) -> bool:
    """Whether ``vec_width``-element accesses are aligned for every (signature, row_stride).

    Each array's address must be a multiple of ``vec_width * itemsize`` bytes (at most
    16, which the signature's address class covers) and its row stride a multiple of
    ``vec_width`` elements, so every row starts aligned.
    """
    for sig, row_stride in sigs_and_strides:
        if sig is not None and (sig.align % (vec_width * sig.itemsize) or row_stride % vec_width):
            return False
    return True


def check_interleaved(offset: int, period: int, a_width: int, b_width: int, message: str) -> None:
    """Two arrays whose byte extents intersect, ``b`` starting ``offset`` bytes after ``a``:
    ValueError(``message``) unless both repeat rows every ``period`` bytes and b's rows sit
    in the gaps between a's (two column slices of one wide buffer). The launcher's overlap
    rules and cupykern.llm.blas call it."""
    if not period:
        raise ValueError(message)
    offset %= period
    if not (offset >= a_width and offset + b_width <= period):
        raise ValueError(message)


# ----------------------------------------------------------------- scalars
# The launcher caches a verdict per key, and keys compare scalars with ``==``: so every
# check here gives one verdict for values that compare equal (1, 1.0, True and 1+0j alike).

#: The smallest normal float32. The kernels are compiled with -ftz=true, which flushes
#: smaller (subnormal) values to 0: an eps of 1e-40 would be 0 on the GPU, and an
#: all-zero row would then give 0 * rsqrt(0) = NaN. So no nonzero scalar below it is taken.
FLOAT32_TINY = float(np.finfo(np.float32).tiny)  # 1.1754944e-38


def real(value, name: str, *, zero_allowed: bool = True) -> np.float32:
    """A real number (Python, NumPy or 0-d array; a complex one with no imaginary part) as
    the kernel's float32. TypeError for anything else; ValueError outside float32's range
    and for a nonzero value of magnitude below :data:`FLOAT32_TINY`, which the GPU would
    flush to 0 (0 itself is exact; the message offers it unless ``zero_allowed`` is False,
    for a caller that refuses 0)."""
    if isinstance(value, (str, bytes)) or np.ndim(value) != 0:
        raise TypeError(f"{name}: expected a real number, got {value!r}")
    if isinstance(value, (complex, np.complexfloating)):
        if value.imag != 0:
            raise TypeError(f"{name}: expected a real number, got {value!r}")
        value = value.real
    try:
        as_float = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected a real number, got {value!r}") from None
    except OverflowError:
        raise ValueError(f"{name}: {value!r} is outside float32's range") from None
    with np.errstate(over="ignore"):
        value32 = np.float32(as_float)
    if np.isinf(value32) and np.isfinite(as_float):
        raise ValueError(f"{name}: {value!r} is outside float32's range (|x| < 3.4e38)")
    if as_float != 0 and abs(value32) < FLOAT32_TINY:
        instead = "pass 0 or " if zero_allowed else "pass "
        raise ValueError(f"{name}: {value!r} is below the smallest normal float32 ({FLOAT32_TINY:.8g}), which "
                         f"the kernels flush to 0 (-ftz=true); {instead}a magnitude of at least {FLOAT32_TINY:.8g}")
    return value32


def finite(value, name: str) -> np.float32:
    """A finite real number as the kernel's float32."""
    value32 = real(value, name)
    if not np.isfinite(value32):
        raise ValueError(f"{name}: expected a finite value, got {value!r}")
    return value32


def eps(value, name: str = "eps") -> np.float32:
    """A finite value >= 0 as the kernel's float32: 0, or at least :data:`FLOAT32_TINY`
    (a subnormal eps would be flushed to 0 on the GPU). An eps of 0 is exact: it gives
    NaN for an all-zero row (0 / 0), as the float64 references do."""
    eps32 = real(value, name)
    if not (np.isfinite(eps32) and eps32 >= 0):
        raise ValueError(f"{name}: expected a finite value >= 0, got {value!r}")
    return eps32


def flag(value, name: str) -> bool:
    """True or False, or a NumPy bool, or an int (Python or NumPy) equal to 1 or 0;
    TypeError naming ``name`` otherwise (a float, a string, an array: helper 63 found 1.0,
    1+0j and Decimal(1) taken as True)."""
    if value is True or value is False:  # the common case, first: ops check a flag per call
        return value
    if isinstance(value, np.bool_) or (isinstance(value, (int, np.integer)) and value in (0, 1)):
        return bool(value)
    raise TypeError(f"{name}: expected a bool, got {value!r}")


def choice(value, choices, name: str):
    """``value`` if it is one of ``choices`` (a dict's keys or a sequence), else ValueError."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name}: expected one of {tuple(choices)}, got {value!r}")
    return value


# ----------------------------------------------------------------- attention heads
class Heads(NamedTuple):
    """q or k as ``(num_tokens, num_heads, head_dim)`` with strides in elements."""

    num_tokens: int
    num_heads: int
    head_dim: int
    token_stride: int
    head_stride: int


def heads(sig: Sig | None, name: str) -> Heads:
    """An attention input ``(num_tokens, num_heads, head_dim)`` or ``(batch, seq_len,
    num_heads, head_dim)``: head_dim unit-stride, token axes flattening to one stride."""
    sig = required(sig, name, "a device array (num_tokens, num_heads, head_dim)")
    shape = sig.shape
    if len(shape) not in (3, 4):
        raise ValueError(f"{name}: expected shape (num_tokens, num_heads, head_dim) or (batch, seq_len, num_heads, "
                         f"head_dim), got {tuple(shape)}")
    supported_dtype(sig, name)
    element_aligned(sig, name)
    if shape[-1] < 1:
        raise ValueError(f"{name}: head_dim (the last axis) must be at least 1, got shape {tuple(shape)}")
    num_tokens = math.prod(shape[:-2])
    if sig.size == 0:  # nothing to address (CuPy reports zero strides for empty arrays)
        return Heads(num_tokens, shape[-2], shape[-1], 0, 0)
    if any(s % sig.itemsize for s in sig.strides):
        raise ValueError(f"{name}: strides {sig.strides} are not multiples of the item size {sig.itemsize}")
    strides = [s // sig.itemsize for s in sig.strides]
    head_dim = shape[-1]
    if head_dim > 1 and strides[-1] != 1:
        raise ValueError(f"{name}: the last axis (head_dim) must be unit-stride, got stride {sig.strides[-1]} bytes")
    token_stride = collapse(shape[:-2], strides[:-2], name, "token")
    head_stride = strides[-2] if shape[-2] > 1 else 0
    return Heads(num_tokens, shape[-2], head_dim, token_stride, head_stride)


def _heads_overlap(h: Heads) -> bool:
    """Whether two (token, head) pairs share an element, either axis outermost: each axis
    of more than one entry, the shorter stride first, must step past the span before it."""
    span = h.head_dim
    for stride, count in sorted((abs(s), n) for s, n in ((h.head_stride, h.num_heads), (h.token_stride, h.num_tokens))
                                if n > 1):
        if stride < span:
            return True
        span += (count - 1) * stride
    return False


def distinct_heads(h: Heads, name: str) -> None:
    """ValueError unless the heads of an array that is written are distinct and
    token-major: a head stride of at least a head, a token stride of at least a token's
    heads (head-major views, disjoint but not token-major, are refused too; their message
    says so rather than claim an overlap)."""
    if not (h.num_tokens and h.num_heads and h.head_dim):  # empty: nothing is written
        return
    token_span = (h.num_heads - 1) * abs(h.head_stride) + h.head_dim
    if (h.num_heads > 1 and abs(h.head_stride) < h.head_dim) or (h.num_tokens > 1 and abs(h.token_stride) < token_span):
        what = ("overlap each other" if _heads_overlap(h) else
                f"are not token-major (a token stride of at least the {token_span} elements of a token's heads)")
        raise ValueError(f"{name}: heads of {h.head_dim} elements {h.head_stride} apart, tokens {h.token_stride} "
                         f"apart, {what}; an array that is written needs distinct heads, token-major (pass a "
                         f"contiguous one)")


def heads_as_rows(h: Heads) -> Rows | None:
    """The heads of each token as one row, when they are contiguous within the token."""
    if h.num_heads == 1 or h.head_stride == h.head_dim:
        return Rows(h.num_tokens, h.num_heads * h.head_dim, h.token_stride)
    return None


# ----------------------------------------------------------------- memory footprint
def byte_extent(sig: Sig) -> tuple[int, int]:
    """[lowest, highest + 1) byte offsets from the array's address that its elements occupy."""
    lo = hi = 0
    for n, s in zip(sig.shape, sig.strides):
        if n == 0:
            return 0, 0
        lo += min(0, (n - 1) * s)
        hi += max(0, (n - 1) * s)
    return lo, hi + sig.itemsize
