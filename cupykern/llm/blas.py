"""The forward's products ``x @ weight.T`` through cuBLAS with little host work.

``cupy.matmul`` spends tens of microseconds of Python and Cython per call before cuBLAS
runs (layout analysis, dtype rules, handle and workspace bookkeeping); a prefill makes
four such products per layer, so at SmolLM2's size the host, not the GPU, set the
prefill's time (bench/results/NOTES.md item 12). :func:`matmul_nt` calls cuBLAS's
``gemmEx`` directly for the one layout the model uses (C-contiguous 2-d float16 or
bfloat16 operands) and falls back to ``cupy.matmul`` for anything else.

Numerics as ``cupy.matmul``'s for these dtypes: fp32 accumulation
(``CUBLAS_COMPUTE_32F``), one rounding to the operands' dtype.

Source: cuBLAS, ``cublasGemmEx`` (row-major ``x @ w.T`` is the column-major product
``w^T-op(w) x``: transa = T, transb = N, m = n_out, n = rows, k).
"""

from __future__ import annotations

import numpy as np

from cupykern import _dtypes

# cudaDataType and cuBLAS enums (library_types.h, cublas_api.h).
_CUDA_TYPE = {np.dtype(np.float16): 2, np.dtype(_dtypes.bfloat16): 14}  # CUDA_R_16F, CUDA_R_16BF
_OP_N, _OP_T = 0, 1
_COMPUTE_32F = 68
_GEMM_DEFAULT = -1
_ONE = np.ones(1, np.float32)  # host scalars (the handle's pointer mode is host): alpha, beta
_ZERO = np.zeros(1, np.float32)


def matmul_nt(x, weight):
    """``x @ weight.T`` as a new array.

    x: ``(rows, k)`` and weight: ``(n_out, k)`` CuPy arrays of one dtype; float16 or
    bfloat16 and C-contiguous take the direct cuBLAS call, anything else
    ``cupy.matmul``. Returns ``(rows, n_out)`` of that dtype, on the current stream.
    Mutates nothing. Raises what ``cupy.matmul`` raises for mismatched shapes.
    """
    import cupy
    from cupy_backends.cuda.libs import cublas

    data_type = _CUDA_TYPE.get(x.dtype)
    if (data_type is None or weight.dtype != x.dtype or x.ndim != 2 or weight.ndim != 2
            or x.shape[1] != weight.shape[1] or not (x.flags.c_contiguous and weight.flags.c_contiguous)
            or 0 in x.shape or 0 in weight.shape):
        return x @ weight.T
    rows, k = x.shape
    n_out = weight.shape[0]
    out = cupy.empty((rows, n_out), x.dtype)
    handle = cupy.cuda.device.get_cublas_handle()
    cublas.setStream(handle, cupy.cuda.get_current_stream().ptr)
    cublas.gemmEx(handle, _OP_T, _OP_N, n_out, rows, k, _ONE.ctypes.data, weight.data.ptr, data_type, k,
                  x.data.ptr, data_type, k, _ZERO.ctypes.data, out.data.ptr, data_type, n_out, _COMPUTE_32F,
                  _GEMM_DEFAULT)
    return out
