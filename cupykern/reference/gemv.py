"""float64 references of kernels_cu/gemv.cu: gemv, gemv_add_residual, rms_norm_gemv,
rms_norm_gemv_silu_and_mul.

The normalised row is rounded to the storage dtype, as the kernels (and rms_norm) store
it; products go unrounded into the epilogue (residual add, SiLU gate, rotation), and the
final output is returned unrounded. Each checks its arguments with its kernel's own
checks (reference/_common.py: same errors, same messages) first.
"""

from __future__ import annotations

import numpy as np

from cupykern import _arrays
from cupykern.ops import attention as _attention_ops
from cupykern.reference._common import check, f64, host, round_to
from cupykern.reference.activation import _act_and_mul, _halves
from cupykern.reference.attention import rope_append as _rope_append
from cupykern.reference.norm import rms_norm as _rms_norm

__all__ = ["gemv", "gemv_add_residual", "rms_norm_gemv", "rms_norm_gemv_rope_kv_append", "rms_norm_gemv_silu_and_mul"]


def gemv(x, weight, *, out=None, out_dtype=None) -> np.ndarray:
    """``x @ weight.T`` in float64 (``out``/``out_dtype`` only shape the kernel's output)."""
    check("gemv", x=x, weight=weight, out=out, out_dtype=out_dtype)
    return _product(x, weight)


def _product(x, weight) -> np.ndarray:
    return f64(x) @ f64(weight).T


def gemv_add_residual(x, weight, residual) -> np.ndarray:
    """``residual + x @ weight.T`` in float64: what the kernel writes to ``residual``."""
    check("gemv_add_residual", x=x, weight=weight, residual=residual)
    return f64(residual) + _product(x, weight)


def _normalised(x, norm_weight, eps) -> np.ndarray:
    """The normalised row as the kernels store it: rounded to x's dtype."""
    return round_to(_rms_norm(x, norm_weight, eps), host(x).dtype)


def rms_norm_gemv(x, norm_weight, weight, eps=1e-6, *, out=None, out_dtype=None) -> np.ndarray:
    """``round(rms_norm(x)) @ weight.T`` in float64 (RMSNorm, arXiv:1910.07467)."""
    check("rms_norm_gemv", x=x, norm_weight=norm_weight, weight=weight, eps=eps, out=out, out_dtype=out_dtype)
    return _normalised(x, norm_weight, eps) @ f64(weight).T


def rms_norm_gemv_silu_and_mul(x, norm_weight, gate_up_weight, eps=1e-6, *, out=None) -> np.ndarray:
    """``silu_and_mul(round(rms_norm(x)) @ gate_up_weight.T)`` in float64 (SwiGLU,
    arXiv:2002.05202)."""
    check("rms_norm_gemv_silu_and_mul", x=x, norm_weight=norm_weight, gate_up_weight=gate_up_weight, eps=eps, out=out)
    # The gate halves without silu_and_mul's own checks, which refuse the (..., 0)
    # product of an empty gate_up_weight that the kernel takes.
    return _act_and_mul("silu", *_halves(_normalised(x, norm_weight, eps) @ f64(gate_up_weight).T))


def rms_norm_gemv_rope_kv_append(x, norm_weight, qkv_weight, positions, cos_sin_cache, k_cache, v_cache, eps=1e-6, *,
                                 is_neox=True, q_out=None, check_positions=True):
    """``(q_out, k_cache_after, v_cache_after)`` in float64: :func:`rms_norm_gemv` (not
    rounded) split into q, k and v heads (the caches give num_kv_heads and head_dim),
    then :func:`~cupykern.reference.rope_kv_append` on copies of the caches. With
    ``check_positions``, a position outside ``[0, min(max_position, max_tokens))`` or a
    repeated one raises the kernel's ValueError; without, such a token's q is left unrotated and nothing is
    written, as the kernel does."""
    checking = _arrays.flag(check_positions, "check_positions")  # before the arrays, as the op
    check("rms_norm_gemv_rope_kv_append", x=x, norm_weight=norm_weight, qkv_weight=qkv_weight, positions=positions,
          cos_sin_cache=cos_sin_cache, k_cache=k_cache, v_cache=v_cache, q_out=q_out, eps=eps, is_neox=is_neox)
    _, num_kv_heads, head_dim = host(k_cache).shape
    pos = host(positions).astype(np.int64).reshape(-1)
    if checking:
        _attention_ops.check_cache_positions(pos, min(host(cos_sin_cache).shape[0], host(k_cache).shape[0]))
    qkv = _normalised(x, norm_weight, eps) @ f64(qkv_weight).T
    qkv = qkv.reshape(qkv.shape[0], qkv.shape[1] // head_dim, head_dim)  # -1 cannot be inferred for 0 tokens
    num_heads = qkv.shape[1] - 2 * num_kv_heads
    q, k, v = qkv[:, :num_heads], qkv[:, num_heads:num_heads + num_kv_heads], qkv[:, num_heads + num_kv_heads:]
    return _rope_append(q, k, v, positions, cos_sin_cache, k_cache, v_cache, is_neox=is_neox)
