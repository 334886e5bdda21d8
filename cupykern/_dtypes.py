"""The one table of supported storage dtypes: NumPy dtype <-> CUDA C type <-> size.

bfloat16 is ``ml_dtypes.bfloat16``, which CuPy 14 accepts as an array dtype; in the
kernels it is ``__nv_bfloat16`` from ``<cuda_bf16.h>`` (same 2-byte layout).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

bfloat16 = np.dtype(ml_dtypes.bfloat16)
float16 = np.dtype(np.float16)
float32 = np.dtype(np.float32)

#: FP8 E4M3FN: an output format only (the quant family), never an input dtype. CuPy 14
#: has no float8 device dtype, so the kernels write its bit patterns into uint8 arrays;
#: this is the host view of them (``cupy.asnumpy(out).view(float8_e4m3fn)``).
float8_e4m3fn = np.dtype(ml_dtypes.float8_e4m3fn)
#: The device storage of E4M3FN outputs.
FP8_STORAGE = np.dtype(np.uint8)

#: Supported storage dtypes, in the order tests and sweeps list them.
DTYPES = (float32, float16, bfloat16)

_C_TYPES = {float32: "float", float16: "__half", bfloat16: "__nv_bfloat16"}
#: Integer dtypes of positions and token ids, with their CUDA C spelling (a kernel's IdxT).
INDEX_C_TYPES = {np.dtype(np.int32): "int", np.dtype(np.int64): "long long"}

#: Short names used by the CLI and result files.
_SHORT_NAMES = {float32: "fp32", float16: "fp16", bfloat16: "bf16"}
_BY_NAME = {
    "fp32": float32, "float32": float32,
    "fp16": float16, "float16": float16, "half": float16,
    "bf16": bfloat16, "bfloat16": bfloat16,
}


def c_type(dtype) -> str:
    """CUDA C spelling of a supported dtype (``'__nv_bfloat16'`` for bfloat16)."""
    return _C_TYPES[np.dtype(dtype)]


def short_name(dtype) -> str:
    """``'fp32'``, ``'fp16'`` or ``'bf16'``."""
    return _SHORT_NAMES[np.dtype(dtype)]


def parse(name_or_dtype) -> np.dtype:
    """A supported dtype from a name (``'bf16'``, ``'float16'``, ...) or dtype-like.

    Raises:
        ValueError: the name or dtype is not one of float32, float16, bfloat16.
    """
    if isinstance(name_or_dtype, str) and name_or_dtype.lower() in _BY_NAME:
        return _BY_NAME[name_or_dtype.lower()]
    try:
        dtype = np.dtype(name_or_dtype)
    except TypeError:
        dtype = None
    if dtype not in _C_TYPES:
        raise ValueError(f"unsupported dtype {name_or_dtype!r}: expected one of fp32, fp16, bf16 (float32, float16, "
                         f"bfloat16)")
    return dtype


def check_supported(dtype, name: str) -> np.dtype:
    """``dtype`` (a dtype-like or a name such as ``'bf16'``) if supported, else TypeError naming the argument."""
    if isinstance(dtype, str) and dtype.lower() in _BY_NAME:
        return _BY_NAME[dtype.lower()]
    try:
        resolved = np.dtype(dtype)
    except TypeError:
        resolved = None
    if resolved not in _C_TYPES:
        shown = resolved if resolved is not None else repr(dtype)
        raise TypeError(f"{name}: unsupported dtype {shown}; expected float32, float16 or bfloat16")
    return resolved


def vec_width(dtype) -> int:
    """Elements in one 16-byte access."""
    return 16 // np.dtype(dtype).itemsize
