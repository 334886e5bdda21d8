"""cuBLAS products a CUDA graph can capture: ``out = x @ w.T``, called through ctypes.

CuPy refuses every cuBLAS call during stream capture (``NotImplementedError: calling
cuBLAS API during stream capture is currently unsupported``, from the ``setStream``
wrapper of ``cupy_backends/cuda/libs/cublas.pyx``), so ``cupy.matmul`` cannot be part of
a captured prefill. cuBLAS itself supports capture once the handle's stream and
workspace are set (cuBLAS documentation, "CUDA Graphs Support": a workspace given with
``cublasSetWorkspace`` keeps it from allocating). This module calls ``libcublas`` (the
library CuPy's own binding loaded) directly: one handle and one 32 MiB workspace per
(device, stream), made on first use and kept for the life of the process, since a
captured graph keeps their addresses.

The products are ``cublasGemmEx`` with fp16/bf16 inputs and output and fp32 accumulation
(``CUBLAS_COMPUTE_32F``, as CuPy uses for half precision), row-major arrays passed as
their column-major transposes. Linux only (``libcublas.so.<major>``, CUDA 13 with
cupy-cuda13x): the ``nvidia-cublas`` wheel of the ``llm`` extra (``pip install -e
'.[llm]'`` in the cupykern checkout) puts it in ``nvidia/cu13/lib`` of site-packages, where CuPy finds it
through cuda-pathfinder (then conda, then the system loader: ``LD_LIBRARY_PATH``, a CUDA
toolkit). Importing this module loads nothing; the first product does.

Source: cuBLAS API reference, ``cublasGemmEx``, ``cublasSetWorkspace`` and "CUDA Graphs
Support" (CUDA 12-13).
"""

from __future__ import annotations

import ctypes
from functools import lru_cache

import numpy as np

from cupykern import _arrays, _dtypes

#: Workspace bytes per handle: what the cuBLAS documentation recommends for Hopper.
WORKSPACE_BYTES = 32 * 1024 * 1024

# cublas_api.h / library_types.h enumerators.
_OP_N, _OP_T = 0, 1
_CUDA_DATA_TYPE = {np.dtype(np.float16): 2, _dtypes.bfloat16: 14}  # CUDA_R_16F, CUDA_R_16BF
_COMPUTE_32F = 68  # CUBLAS_COMPUTE_32F
_GEMM_DEFAULT = -1  # CUBLAS_GEMM_DEFAULT
_INT_MAX = 2**31 - 1  # cublasGemmEx's int arguments
_ALPHA, _BETA = ctypes.c_float(1.0), ctypes.c_float(0.0)  # host scalars, read at call (capture) time

_handles: dict = {}  # (device id, stream pointer) -> (handle, workspace memory)


def _open(major: int):
    """libcublas.so.<major>, loaded as CuPy loads it: importing CuPy's binding has
    cuda-pathfinder find the library (and libcublasLt) in the NVIDIA wheels of
    site-packages (``nvidia/cu13/lib`` of ``nvidia-cublas``; CUDA 12's
    ``nvidia/cublas/lib``), conda, or the system loader's path, and load it; opening the
    soname then returns that copy. ImportError or OSError if it cannot."""
    from cupy_backends.cuda.libs import cublas  # noqa: F401  (loads libcublas.so.<major>)

    return ctypes.CDLL(f"libcublas.so.{major}")


def _install_hint(major: int) -> str:
    """What to install for libcublas.so.<major> (the pip name changed with CUDA 13)."""
    wheel = f"nvidia-cublas=={major}.*" if major >= 13 else f"nvidia-cublas-cu{major}"
    return (f"install the llm extra, pip install -e '.[llm]' in the cupykern checkout (it brings cuBLAS as "
            f"the {wheel} wheel), or {wheel} alone, or put a CUDA {major} toolkit's libcublas.so.{major} on "
            "LD_LIBRARY_PATH")


@lru_cache(maxsize=None)
def _library():
    """libcublas with the signatures used here (:func:`_open`: the copy CuPy uses).

    Raises:
        ImportError, OSError: libcublas.so.<major> cannot be found or loaded; the message
            says what to install (:func:`_install_hint`).
    """
    import cupy

    major = cupy.cuda.runtime.runtimeGetVersion() // 1000
    try:
        lib = _open(major)
    except (ImportError, OSError) as exc:
        raise type(exc)(f"cuBLAS (libcublas.so.{major}) could not be loaded: {_install_hint(major)}.\n"
                        f"The loader said: {exc}") from exc
    handle_p, void_p, i32, f_p = ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p
    signatures = {
        "cublasCreate_v2": [ctypes.POINTER(ctypes.c_void_p)],
        "cublasSetStream_v2": [handle_p, void_p],
        "cublasSetWorkspace_v2": [handle_p, void_p, ctypes.c_size_t],
        "cublasGemmEx": [handle_p, i32, i32, i32, i32, i32, f_p, void_p, i32, i32, void_p, i32, i32, f_p, void_p,
                         i32, i32, i32, i32],
    }
    for name, argtypes in signatures.items():
        function = getattr(lib, name)
        function.restype, function.argtypes = ctypes.c_int, argtypes
    return lib


def load() -> None:
    """Loads cuBLAS now, as the first :func:`matmul_nt` would, so that a missing library is
    reported before any work (``cupykern generate`` calls it before the model loads).

    Raises:
        ImportError, OSError: as :func:`matmul_nt` (the message says what to install).
    """
    _library()


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"{what} failed with cublasStatus_t {status}")


def _handle(stream_ptr: int):
    """The handle for the current device and ``stream_ptr``, its workspace set."""
    import cupy

    key = (cupy.cuda.Device().id, stream_ptr)
    entry = _handles.get(key)
    if entry is None:
        lib = _library()
        handle = ctypes.c_void_p()
        _check(lib.cublasCreate_v2(ctypes.byref(handle)), "cublasCreate")
        # Straight from cudaMalloc, not from whatever pool is current (a graph's private one).
        workspace = cupy.cuda.Memory(WORKSPACE_BYTES)
        _check(lib.cublasSetStream_v2(handle, stream_ptr), "cublasSetStream")
        _check(lib.cublasSetWorkspace_v2(handle, workspace.ptr, WORKSPACE_BYTES), "cublasSetWorkspace")
        entry = _handles[key] = (handle, workspace)
    return entry[0]


def _row_stride(a, name: str) -> int:
    """Elements between rows of a 2-d array whose rows are contiguous (a single row's
    stride is ignored: ``v[None]`` has stride 0)."""
    item = a.dtype.itemsize
    if a.shape[0] == 1 and a.strides[1] == item:
        return a.shape[1]
    if a.strides[1] != item or a.strides[0] % item or a.strides[0] < a.shape[1] * item:
        raise ValueError(f"{name}: expected a 2-d array with contiguous rows, got strides {a.strides}")
    return a.strides[0] // item


def _check_disjoint(out, ldo: int, name: str, a, lda: int) -> None:
    """ValueError if ``out`` shares memory with input ``a`` (cuBLAS would read what it
    writes), unless both are row views of one buffer whose rows interleave (column slices)."""
    item = out.dtype.itemsize
    out_lo, a_lo = out.data.ptr, a.data.ptr
    out_hi = out_lo + ((out.shape[0] - 1) * ldo + out.shape[1]) * item
    a_hi = a_lo + ((a.shape[0] - 1) * lda + a.shape[1]) * item
    if out_lo < a_hi and a_lo < out_hi:
        period = lda * item if lda == ldo and min(a.shape[0], out.shape[0]) > 1 else 0
        _arrays.check_interleaved(out_lo - a_lo, period, a.shape[1] * item, out.shape[1] * item,
                                  f"out overlaps {name} in memory")


def matmul_nt(x, w, out=None):
    """``out = x @ w.T`` on the current stream by ``cublasGemmEx``, capturable in a CUDA graph.

    Parameters:
        x: device array ``(num_tokens, in_features)``, float16 or bfloat16, rows
            contiguous (a row stride of at least ``in_features`` elements).
        w: device array ``(out_features, in_features)`` of x's dtype, rows contiguous
            (a linear layer's weight, as PyTorch and GGUF store it).
        out: optional ``(num_tokens, out_features)`` of x's dtype, rows contiguous.

    Returns:
        ``out`` (allocated if not given): fp32 sums of products, rounded once to the dtype.

    Mutates: ``out`` only.

    Raises:
        TypeError: a non-CuPy array, or dtypes that differ or are not float16/bfloat16.
        ValueError: shapes that disagree, rows not contiguous, an empty dimension, a
            size or row stride past 2**31 - 1 elements, ``out`` overlapping x or w.
        RuntimeError: cuBLAS refused the call (its status).
        ImportError, OSError: cuBLAS (``libcublas.so.<major>``) cannot be found or loaded
            (on the first call; after the argument checks): the message says what to
            install, ``pip install -e '.[llm]'`` in the cupykern checkout (the ``nvidia-cublas`` wheel).
    """
    import cupy

    for name, a in (("x", x), ("w", w), ("out", out)):
        if (a is not None or name != "out") and not isinstance(a, cupy.ndarray):
            raise TypeError(f"{name}: expected a cupy.ndarray, got {type(a).__name__}")
    if x.dtype not in _CUDA_DATA_TYPE:
        raise TypeError(f"x: expected float16 or bfloat16, got {x.dtype}")
    if w.dtype != x.dtype or (out is not None and out.dtype != x.dtype):
        raise TypeError(f"w, out: expected x's dtype {x.dtype}, got {w.dtype}"
                        f"{'' if out is None else f' and {out.dtype}'}")
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"x, w: expected (num_tokens, k) and (out_features, k), got {x.shape} and {w.shape}")
    m, k = x.shape
    n = w.shape[0]
    if min(m, n, k) == 0:
        raise ValueError(f"x, w: expected non-empty dimensions, got {x.shape} and {w.shape}")
    if out is None:
        out = cupy.empty((m, n), x.dtype)
    elif out.shape != (m, n):
        raise ValueError(f"out: expected shape {(m, n)}, got {out.shape}")
    ldx, ldw, ldo = _row_stride(x, "x"), _row_stride(w, "w"), _row_stride(out, "out")
    # cublasGemmEx takes int sizes: ctypes would wrap a larger one silently.
    for what, value in (("x.shape[0]", m), ("w.shape[0]", n), ("x.shape[1]", k), ("x's row stride", ldx),
                        ("w's row stride", ldw), ("out's row stride", ldo)):
        if value > _INT_MAX:
            raise ValueError(f"x, w, out: cuBLAS takes sizes and row strides up to {_INT_MAX} elements, "
                             f"got {what} {value}")
    _check_disjoint(out, ldo, "x", x, ldx)
    _check_disjoint(out, ldo, "w", w, ldw)
    stream = cupy.cuda.get_current_stream().ptr
    handle = _handle(stream)  # one per stream, its stream set once
    lib = _library()
    kind = _CUDA_DATA_TYPE[x.dtype]
    # Column-major view: out^T (n x m) = w (n x k, w^T stored) @ x^T (k x m).
    _check(lib.cublasGemmEx(handle, _OP_T, _OP_N, n, m, k, ctypes.byref(_ALPHA), w.data.ptr, kind, ldw, x.data.ptr,
                            kind, ldx, ctypes.byref(_BETA), out.data.ptr, kind, ldo, _COMPUTE_32F, _GEMM_DEFAULT),
           "cublasGemmEx")
    return out
