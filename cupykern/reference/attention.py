"""float64 references of kernels_cu/attention.cu: rope_kv_append, decode_attention,
prefill_attention.

Each checks its arguments with its kernel's own checks (reference/_common.py) first.
"""

from __future__ import annotations

import math

import numpy as np

from cupykern import _arrays
from cupykern.reference._common import check, f64, host, real64
from cupykern.ops import attention as _attention_ops
from cupykern.reference.rope import apply_rope

__all__ = ["decode_attention", "prefill_attention", "rope_kv_append"]


def rope_kv_append(q, k, v, positions, cos_sin_cache, k_cache, v_cache, *, is_neox=True, check_positions=True):
    """``(q_rotated, k_cache_after, v_cache_after)`` in float64: q and k rotated as
    :func:`~cupykern.reference.apply_rope`, k and v written to row ``positions[t]`` of
    copies of the caches. Tokens whose position is outside ``[0, min(max_position,
    max_tokens))`` raise the kernel's ValueError with ``check_positions``, else are left
    out (q unrotated, nothing written), as the kernel does; so do repeated positions,
    else the last token's row is written (the kernel's is then undefined)."""
    checking = _arrays.flag(check_positions, "check_positions")  # before the arrays, as the op
    check("rope_kv_append", q=q, k=k, v=v, positions=positions, cos_sin_cache=cos_sin_cache, k_cache=k_cache,
          v_cache=v_cache, is_neox=is_neox)
    pos = host(positions).astype(np.int64).reshape(-1)
    if checking:
        _attention_ops.check_cache_positions(pos, min(host(cos_sin_cache).shape[0], host(k_cache).shape[0]))
    return rope_append(q, k, v, positions, cos_sin_cache, k_cache, v_cache, is_neox=is_neox)


def rope_append(q, k, v, positions, cos_sin_cache, k_cache, v_cache, *, is_neox=True):
    """:func:`rope_kv_append`'s math without its argument checks, for references that
    compose it with float64 intermediates (which the kernel's checks would refuse)."""
    pos = host(positions).astype(np.int64).reshape(-1)
    limit = min(host(cos_sin_cache).shape[0], host(k_cache).shape[0])
    valid = (pos >= 0) & (pos < limit)
    q_out, k_rot = apply_rope(q, k, np.where(valid, pos, -1), cos_sin_cache, is_neox=is_neox, check_positions=False)
    k_after, v_after = f64(k_cache).copy(), f64(v_cache).copy()
    k_after[pos[valid]] = k_rot[valid]
    v_after[pos[valid]] = f64(v)[valid]
    return q_out, k_after, v_after


def decode_attention(q, k_cache, v_cache, positions, *, scale=None, out=None, workspace=None) -> np.ndarray:
    """Causal grouped-query attention over a cache in float64: token ``t`` attends to rows
    ``0 .. min(positions[t], max_tokens - 1)`` (none for a negative position: output 0);
    query head ``h`` reads kv head ``h // (num_heads // num_kv_heads)``; ``scale``
    defaults to ``1 / sqrt(head_dim)`` (Vaswani et al. 2017; GQA, arXiv:2305.13245)."""
    check("decode_attention", q=q, k_cache=k_cache, v_cache=v_cache, positions=positions, out=out, workspace=workspace,
          scale=scale)
    return attend(q, k_cache, v_cache, positions, scale)


def prefill_attention(q, k_cache, v_cache, positions, *, scale=None, out=None) -> np.ndarray:
    """:func:`decode_attention`'s float64 math (the same result for any tokens), after
    prefill_attention's own argument checks."""
    check("prefill_attention", q=q, k_cache=k_cache, v_cache=v_cache, positions=positions, out=out, scale=scale)
    return attend(q, k_cache, v_cache, positions, scale)


def attend(q, k_cache, v_cache, positions, scale=None) -> np.ndarray:
    """The attention of :func:`decode_attention` and :func:`prefill_attention` in float64,
    without argument checks."""
    q, keys, values = f64(q), f64(k_cache), f64(v_cache)
    num_tokens, num_heads, head_dim = q.shape
    group = num_heads // keys.shape[1]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else real64(scale)
    pos = host(positions).astype(np.int64).reshape(-1)
    result = np.zeros_like(q)
    for t in range(num_tokens):
        length = min(int(pos[t]) + 1, keys.shape[0])
        if length <= 0:
            continue
        kv_k = np.repeat(keys[:length], group, axis=1)  # (length, num_heads, head_dim)
        kv_v = np.repeat(values[:length], group, axis=1)
        scores = np.einsum("hd,phd->hp", q[t], kv_k) * scale
        scores -= scores.max(axis=1, keepdims=True)
        weights = np.exp(scores)
        weights /= weights.sum(axis=1, keepdims=True)
        result[t] = np.einsum("hp,phd->hd", weights, kv_v)
    return result
