"""Rotary position embedding: rope_cos_sin_cache, apply_rope, qk_rms_norm_rope (kernels_cu/rope.cu)."""

from __future__ import annotations

import numpy as np

from cupykern import _arrays, _dtypes, jit, launch
from cupykern import rope_scaling as _scaling
from cupykern.jit import KernelTemplate

APPLY_ROPE = KernelTemplate("rope.cu", "apply_rope_kernel")
QK_RMS_NORM_ROPE = KernelTemplate("rope.cu", "qk_rms_norm_rope_kernel")

#: Position dtypes -> TPos (never reinterpreted: each has its own instantiation).
POSITION_TYPES = {np.dtype(np.int32): "int", np.dtype(np.int64): "long long"}


def _cache_dtypes(dtype) -> list:
    """Cache dtypes accepted with q of ``dtype``: float32, or q's own dtype."""
    return sorted({_dtypes.float32, np.dtype(dtype)}, key=str)


def instantiations() -> dict[KernelTemplate, list[str]]:
    """Every instantiation: dtype x cache dtype x position type x is_neox x vector width
    (x threads per head for qk_rms_norm_rope)."""
    spaces: dict[KernelTemplate, list[str]] = {APPLY_ROPE: [], QK_RMS_NORM_ROPE: []}
    for d in _dtypes.DTYPES:
        for c in _cache_dtypes(d):
            for p in POSITION_TYPES.values():
                for neox in (True, False):
                    lead = (_dtypes.c_type(d), _dtypes.c_type(c), p, neox)
                    for w in launch.rope_vec_widths(d, fused_norm=False):
                        spaces[APPLY_ROPE].append(APPLY_ROPE.expr(*lead, w))
                    for w in launch.rope_vec_widths(d, fused_norm=True):
                        for g in (launch.ROPE_NORM_THREADS_PER_HEAD if w > 1 else (32,)):
                            spaces[QK_RMS_NORM_ROPE].append(QK_RMS_NORM_ROPE.expr(*lead, w, g))
    return spaces


# ----------------------------------------------------------------- checks without a GPU
def _collapse(shape, strides, name: str, what: str) -> int:
    """The one element stride that walks axes ``shape`` (row-major) in order; ValueError
    if they do not flatten (size-1 axes are ignored)."""
    lead = [(n, s) for n, s in zip(shape, strides) if n != 1]
    for (_, outer), (n_inner, inner) in zip(lead, lead[1:]):
        if outer != n_inner * inner:
            raise ValueError(f"{name}: {what} axes of shape {tuple(shape)} with strides {tuple(strides)} (elements) "
                             f"do not flatten to one stride; pass a contiguous copy")
    return lead[-1][1] if lead else 0


def _heads(x, name: str) -> tuple[int, int, int, int, int]:
    """``(num_tokens, num_heads, head_dim, token_stride, head_stride)`` of q or k, strides in elements."""
    if x.ndim not in (3, 4):
        raise ValueError(f"{name}: expected shape (num_tokens, num_heads, head_dim) or (batch, seq_len, num_heads, "
                         f"head_dim), got {tuple(x.shape)}")
    num_tokens = int(np.prod(x.shape[:-2]))
    if x.size == 0:  # nothing to address (CuPy reports zero strides for empty arrays)
        return num_tokens, x.shape[-2], x.shape[-1], 0, 0
    if any(s % x.itemsize for s in x.strides):
        raise ValueError(f"{name}: strides {x.strides} are not multiples of the item size {x.itemsize}")
    strides = [s // x.itemsize for s in x.strides]
    head_dim = x.shape[-1]
    if head_dim > 1 and strides[-1] != 1:
        raise ValueError(f"{name}: the last axis (head_dim) must be unit-stride, got stride {x.strides[-1]} bytes")
    token_stride = _collapse(x.shape[:-2], strides[:-2], name, "token")
    head_stride = strides[-2] if x.shape[-2] > 1 else 0
    return num_tokens, x.shape[-2], head_dim, token_stride, head_stride


def _positions(positions, token_shape, name: str = "positions"):
    positions = _arrays.as_device_array(positions, name)
    if positions.dtype not in POSITION_TYPES:
        raise TypeError(f"{name}: expected dtype int32 or int64, got {positions.dtype}")
    if tuple(positions.shape) != tuple(token_shape):
        raise ValueError(f"{name}: expected shape {tuple(token_shape)} (one position per token), got "
                         f"{tuple(positions.shape)}")
    stride = _collapse(positions.shape, [s // positions.itemsize for s in positions.strides], name, "token")
    return positions, stride


def _cache(cos_sin_cache, dtype, head_dim: int):
    cache = _arrays.as_device_array(cos_sin_cache, "cos_sin_cache")
    if cache.dtype not in _cache_dtypes(dtype):
        raise TypeError(f"cos_sin_cache: expected dtype float32 or q's dtype {dtype}, got {cache.dtype}")
    if cache.ndim != 2:
        raise ValueError(f"cos_sin_cache: expected shape (max_position, rotary_dim), got {tuple(cache.shape)}")
    rotary_dim = cache.shape[1]
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(f"cos_sin_cache: rotary_dim = shape[1] must be even and >= 2, got {rotary_dim}")
    if rotary_dim > head_dim:
        raise ValueError(f"cos_sin_cache: rotary_dim ({rotary_dim}) must be <= head_dim ({head_dim})")
    if cache.shape[0] > 1 and cache.strides[1] != cache.itemsize:
        raise ValueError(f"cos_sin_cache: the last axis must be unit-stride, got stride {cache.strides[1]} bytes")
    if cache.strides[0] % cache.itemsize:
        raise ValueError(f"cos_sin_cache: row stride {cache.strides[0]} bytes is not a multiple of the item size")
    cache_stride = cache.strides[0] // cache.itemsize if cache.shape[0] > 1 else rotary_dim
    return cache, rotary_dim, cache_stride


def _qk(q, k, name_k: str = "k"):
    """q and k (or None) as device arrays with their geometry; checks dtypes and shapes agree."""
    q = _arrays.as_device_array(q, "q")
    _arrays.check_supported_dtype(q, "q")
    q_geo = _heads(q, "q")
    if k is None:
        return q, q_geo, None, None
    k = _arrays.as_device_array(k, name_k)
    _arrays.check_dtype(k, q.dtype, name_k, "the dtype of q")
    k_geo = _heads(k, name_k)
    if k.shape[:-2] != q.shape[:-2]:
        raise ValueError(f"{name_k}: expected the token axes of q {tuple(q.shape[:-2])}, got {tuple(k.shape[:-2])}")
    if k_geo[2] != q_geo[2]:
        raise ValueError(f"{name_k}: expected head_dim {q_geo[2]} (q's), got {k_geo[2]}")
    if q.size and k.size and _heads_overlap(q.data.ptr, q_geo, _arrays.byte_extent(q), k.data.ptr, k_geo,
                                            _arrays.byte_extent(k), q.itemsize):
        raise ValueError(f"{name_k} overlaps q in memory: both are rotated in place by one launch")
    return q, q_geo, k, k_geo


def _heads_overlap(q_ptr: int, q_geo, q_extent, k_ptr: int, k_geo, k_extent, itemsize: int) -> bool:
    """Whether q and k (``_heads`` geometries) may share an element. Exact for heads laid
    out contiguously within a token (slices of one fused QKV row), conservative otherwise."""
    def rows(geo):
        num_tokens, num_heads, head_dim, token_stride, head_stride = geo
        contiguous = num_heads == 1 or head_stride == head_dim
        return _arrays.Rows(num_tokens, num_heads * head_dim, token_stride) if contiguous else None

    q_rows, k_rows = rows(q_geo), rows(k_geo)
    if q_rows is None or k_rows is None:
        return not (q_extent[1] <= k_extent[0] or k_extent[1] <= q_extent[0])
    return _arrays.rows_overlap(q_ptr, q_rows, itemsize, k_ptr, k_rows, itemsize, q_extent, k_extent)


def _max_vec_width(dtype, fused_norm: bool, cache, cache_stride: int, *arrays_and_strides) -> int:
    """Widest compiled vector width all pointers and strides allow (the cache is read in
    accesses of at most 16 bytes)."""
    for w in reversed(launch.rope_vec_widths(dtype, fused_norm=fused_norm)):
        cache_w = max(1, min(w, 16 // cache.itemsize))
        if (_arrays.vector_aligned(w, *arrays_and_strides)
                and _arrays.vector_aligned(cache_w, (cache, cache_stride))):
            return w
    return 1


def _check_positions_in_range(positions, max_position: int) -> None:
    """ValueError if a position is outside [0, max_position): one min/max reduction and a sync."""
    import cupy

    lo, hi = (int(v) for v in cupy.stack((positions.min(), positions.max())).get())
    if lo < 0 or hi >= max_position:
        raise ValueError(f"positions: expected values in [0, {max_position}) (the rows of cos_sin_cache), got "
                         f"min {lo}, max {hi}; pass check_positions=False to leave such tokens unchanged")


def _null():
    return np.uint64(0)


# ----------------------------------------------------------------- public API
def rope_cos_sin_cache(max_position: int, rotary_dim: int, base: float = 10000.0, *, rope_scaling=None,
                       dtype=np.float32):
    """The cos/sin table that :func:`apply_rope` reads, built in float64 on the host.

    ``cache[p, i] = a * cos(p * inv_freq[i])``, ``cache[p, rotary_dim/2 + i] = a * sin(p * inv_freq[i])``,
    ``inv_freq[i] = base ** (-2 i / rotary_dim)`` before scaling, ``a`` the attention factor.

    Parameters:
        max_position: rows (positions 0 .. max_position - 1), int >= 0.
        rotary_dim: columns, even, >= 2: the rotated dims of a head (<= head_dim).
        base: ``rope_theta`` of the model (e.g. 10000, 500000 for Llama 3).
        rope_scaling: a Hugging Face config's ``rope_scaling`` dict as is, or None.
            ``rope_type`` (or the older ``type``) selects:
            ``"default"``; ``"linear"`` (``factor``: inv_freq / factor);
            ``"dynamic"`` (NTK: ``factor``, ``original_max_position_embeddings``; base
            stretched for a sequence of ``max_position`` tokens, as vLLM's dynamic-NTK
            cache); ``"llama3"`` (``factor``, ``low_freq_factor``, ``high_freq_factor``,
            ``original_max_position_embeddings``); ``"yarn"`` (``factor``,
            ``original_max_position_embeddings``, optional ``beta_fast``, ``beta_slow``,
            ``mscale``, ``mscale_all_dim``, ``attention_factor``, ``truncate``; the
            attention factor multiplies cos and sin). The formulas are in
            cupykern/rope_scaling.py.
        dtype: float32 (default), float16 or bfloat16; values are rounded once to it.

    Returns:
        A new C-contiguous device array ``(max_position, rotary_dim)`` of ``dtype``
        (vLLM's and FlashInfer's ``cos_sin_cache`` layout).

    Mutates: nothing.

    Raises:
        ValueError: ``max_position`` < 0, odd or too small ``rotary_dim``, ``base`` <= 0
            or 1, an unknown rope_type or missing keys (named), non-positive factors.
        TypeError: unsupported ``dtype``.
        RuntimeError: no CUDA GPU (after the argument checks).

    Notes:
        Angles ``p * inv_freq`` and their cos/sin are evaluated in float64 (NumPy's
        correctly range-reduced cos/sin), so the table is as accurate at position
        1,000,000 as at 1: the only error is the final rounding to ``dtype``.

    References:
        RoFormer, Su et al. 2021 (arXiv:2104.09864); Hugging Face transformers
        ``modeling_rope_utils.py`` ``_compute_{default,linear_scaling,dynamic_ntk,llama3,yarn}_parameters``
        (Llama 3 scaling from Meta's reference code; NTK dynamic from HF); YaRN, Peng et
        al. 2023 (arXiv:2309.00071); vLLM ``rotary_embedding`` (``_compute_cos_sin_cache``).
    """
    import cupy

    from cupykern import environment

    dtype = _dtypes.check_supported(dtype, "dtype")
    table = _scaling.cos_sin_table(max_position, rotary_dim, base, rope_scaling, dtype=dtype)
    if not environment.gpu_available():
        raise RuntimeError("rope_cos_sin_cache: no CUDA GPU is visible to put the table on (the float64 "
                           "table itself is cupykern.rope_scaling.cos_sin_table)")
    return cupy.asarray(table)


def apply_rope(q, k, positions, cos_sin_cache, *, is_neox: bool = True, inplace: bool = True,
               check_positions: bool = True):
    """Rotary position embedding of q and k, one launch for both.

    For each token at position p and each pair (x1, x2) of a head, with
    ``c = cos_sin_cache[p, i]`` and ``s = cos_sin_cache[p, rotary_dim/2 + i]``:
    ``x1' = x1 * c - x2 * s``, ``x2' = x2 * c + x1 * s``. ``is_neox=True`` pairs dims
    ``(i, i + rotary_dim/2)``; ``False`` pairs ``(2i, 2i + 1)``. Dims past rotary_dim
    pass through unchanged.

    Parameters:
        q: device array ``(num_tokens, num_q_heads, head_dim)`` or
            ``(batch, seq_len, num_q_heads, head_dim)``, float16, bfloat16 or float32.
            Only head_dim must be unit-stride: token and head strides are honoured (q
            may be a view of a fused QKV buffer); the token axes must flatten to one stride.
        k: ``(..., num_kv_heads, head_dim)`` with q's token axes, head_dim and dtype
            (num_kv_heads may differ: GQA/MQA), its own strides; or None. q and k must
            not share memory.
        positions: ``(num_tokens,)`` or ``(batch, seq_len)``, int32 or int64: each token's
            position (a row of the cache); any order, repeats allowed.
        cos_sin_cache: ``(max_position, rotary_dim)``, float32 or q's dtype, from
            :func:`rope_cos_sin_cache`: cos in columns ``[0, rotary_dim/2)``, sin in
            ``[rotary_dim/2, rotary_dim)``. rotary_dim is even and <= head_dim; unit
            last stride.
        is_neox: NeoX/Llama (HF) pairing if True, GPT-J/GGUF interleaved pairing if False.
        inplace: rotate q and k in place (default), or return new contiguous arrays.
        check_positions: raise if a position is outside ``[0, max_position)``. Costs one
            small min/max reduction and a device-to-host sync; pass False in hot loops
            and under CUDA-graph capture, where such tokens are left unchanged.

    Returns:
        ``(q_out, k_out)``: q and k themselves when ``inplace``, else new C-contiguous
        arrays of their shapes and dtype; ``k_out`` is None when ``k`` is None.

    Mutates: in place, dims ``[0, rotary_dim)`` of q and k (dims past rotary_dim and
        tokens with out-of-range positions are not written at all). Out of place,
        nothing but the new arrays (every dim written; bad-position tokens copied as is).

    Raises:
        TypeError: q/k/positions/cos_sin_cache not on the device (e.g. NumPy arrays:
            pass ``cupy.asarray(...)``), unsupported dtype, k or cache of another dtype
            than allowed, positions not int32/int64.
        ValueError: wrong number of axes, non-unit head_dim stride, token axes that do
            not flatten, q/k with different token axes or head_dim, positions of the
            wrong shape, odd rotary_dim or rotary_dim > head_dim, a position out of
            range (with ``check_positions``), an array on another GPU.

    Notes:
        fp32 math from the cache's values, one rounding to the dtype per output
        element. Each token is independent of the batch it comes in.

    References:
        RoFormer, Su et al. 2021 (arXiv:2104.09864); cos_sin_cache layout and pairings
        of vLLM's ``rotary_embedding`` and FlashInfer's
        ``apply_rope_with_cos_sin_cache``; GPT-J pairing as llama.cpp's ``rope``.
    """
    import cupy

    q, (num_tokens, num_q_heads, head_dim, q_ts, q_hs), k, k_geo = _qk(q, k)
    positions, pos_stride = _positions(positions, q.shape[:-2])
    cache, rotary_dim, cache_stride = _cache(cos_sin_cache, q.dtype, head_dim)
    num_kv_heads, k_ts, k_hs = (k_geo[1], k_geo[3], k_geo[4]) if k is not None else (0, 0, 0)
    if inplace:
        q_out, k_out, qo_ts, qo_hs, ko_ts, ko_hs = q, k, q_ts, q_hs, k_ts, k_hs
    else:
        q_out = cupy.empty(q.shape, q.dtype)
        k_out = cupy.empty(k.shape, k.dtype) if k is not None else None
        qo_ts, qo_hs = num_q_heads * head_dim, head_dim
        ko_ts, ko_hs = num_kv_heads * head_dim, head_dim
    if num_tokens == 0 or num_q_heads + num_kv_heads == 0:
        return q_out, k_out
    if check_positions:
        _check_positions_in_range(positions, cache.shape[0])

    strided = [(q, q_ts), (q, q_hs), (q_out, qo_ts), (q_out, qo_hs)]
    if k is not None:
        strided += [(k, k_ts), (k, k_hs), (k_out, ko_ts), (k_out, ko_hs)]
    max_vec = _max_vec_width(q.dtype, False, cache, cache_stride, *strided)
    plan = launch.plan_rope(num_tokens, num_q_heads + num_kv_heads, head_dim, rotary_dim, q.dtype,
                            max_vec_width=max_vec, fused_norm=False,
                            limits=launch.DeviceLimits.of_device(cupy.cuda.Device().id))
    kernel = jit.get_kernel(APPLY_ROPE, _dtypes.c_type(q.dtype), _dtypes.c_type(cache.dtype),
                            POSITION_TYPES[positions.dtype], bool(is_neox), plan.vec_width)
    kernel(plan.grid, plan.block, (
        q_out, k_out if k is not None else _null(), q, k if k is not None else _null(), positions, cache,
        np.int64(num_tokens), np.int64(num_q_heads), np.int64(num_kv_heads), np.int64(head_dim),
        np.int64(rotary_dim), np.int64(cache.shape[0]), np.int64(pos_stride),
        np.int64(q_ts), np.int64(q_hs), np.int64(k_ts), np.int64(k_hs),
        np.int64(qo_ts), np.int64(qo_hs), np.int64(ko_ts), np.int64(ko_hs), np.int64(cache_stride),
        np.int32(plan.threads_per_head), np.int32(plan.head_slots), np.int32(plan.tokens_per_block),
        np.int32(0 if inplace else 1)))
    return q_out, k_out


def _norm_weight(weight, name: str, dtype, head_dim: int):
    weight = _arrays.as_device_array(weight, name)
    _arrays.check_dtype(weight, dtype, name, "the dtype of q")
    _arrays.check_shape(weight, (head_dim,), name)
    if head_dim > 1 and weight.strides[0] != weight.itemsize:
        raise ValueError(f"{name}: must be unit-stride, got stride {weight.strides[0]} bytes")
    return weight


def qk_rms_norm_rope(q, k, q_weight, k_weight, positions, cos_sin_cache, eps: float = 1e-6, *,
                     is_neox: bool = True, check_positions: bool = True):
    """QK-norm then rotary embedding, in place, one pass over q and k.

    Per head h of each token: ``y = x / sqrt(mean(x**2) + eps) * w`` over all head_dim
    dims (``w = q_weight`` for q heads, ``k_weight`` for k heads), then the rotation of
    :func:`apply_rope` on dims ``[0, rotary_dim)`` of y. As Qwen3, OLMo2 and Gemma 3
    attention do (per-head RMSNorm of q and k, then RoPE).

    Parameters:
        q: device array ``(num_tokens, num_q_heads, head_dim)`` or
            ``(batch, seq_len, num_q_heads, head_dim)``, float16, bfloat16 or float32;
            strides as in :func:`apply_rope`.
        k: ``(..., num_kv_heads, head_dim)``, q's token axes, head_dim and dtype.
        q_weight, k_weight: ``(head_dim,)`` of q's dtype, unit-stride.
        positions, cos_sin_cache, is_neox, check_positions: as in :func:`apply_rope`.
        eps: added to the mean square in fp32.

    Returns:
        ``(q, k)``, the same arrays, updated.

    Mutates: every dim of q and k (normalised; the first rotary_dim dims also rotated),
        except tokens whose position is out of range, which are left unchanged (not
        normalised either) when ``check_positions`` is False.

    Raises:
        TypeError: as :func:`apply_rope`; a weight of another dtype; k None.
        ValueError: as :func:`apply_rope`; a weight not of shape ``(head_dim,)`` or not
            unit-stride; ``eps`` < 0 or not finite.

    Notes:
        The sum of squares, the scaling and the rotation stay in fp32; each output is
        rounded once to the dtype (the normalised value is not rounded before the
        rotation). The reference is float64 ``rms_norm`` then ``apply_rope``. A head's
        reduction order depends on head_dim, rotary_dim and the dtype only, never on
        the batch.

    References:
        RMSNorm, Zhang & Sennrich 2019 (arXiv:1910.07467); RoFormer (arXiv:2104.09864);
        QK-norm placement as in Hugging Face's Qwen3Attention, Olmo2Attention and
        Gemma3Attention.
    """
    import cupy

    if k is None:
        raise TypeError("k: expected a device array (num_tokens, num_kv_heads, head_dim), got None")
    q, (num_tokens, num_q_heads, head_dim, q_ts, q_hs), k, (_, num_kv_heads, _, k_ts, k_hs) = _qk(q, k)
    q_weight = _norm_weight(q_weight, "q_weight", q.dtype, head_dim)
    k_weight = _norm_weight(k_weight, "k_weight", q.dtype, head_dim)
    positions, pos_stride = _positions(positions, q.shape[:-2])
    cache, rotary_dim, cache_stride = _cache(cos_sin_cache, q.dtype, head_dim)
    eps32 = np.float32(eps)
    if not (np.isfinite(eps32) and eps32 >= 0):
        raise ValueError(f"eps: expected a finite value >= 0, got {eps!r}")
    if num_tokens == 0 or num_q_heads + num_kv_heads == 0:
        return q, k
    if check_positions:
        _check_positions_in_range(positions, cache.shape[0])

    max_vec = _max_vec_width(q.dtype, True, cache, cache_stride, (q, q_ts), (q, q_hs), (k, k_ts), (k, k_hs),
                             (q_weight, 0), (k_weight, 0))
    plan = launch.plan_rope(num_tokens, num_q_heads + num_kv_heads, head_dim, rotary_dim, q.dtype,
                            max_vec_width=max_vec, fused_norm=True,
                            limits=launch.DeviceLimits.of_device(cupy.cuda.Device().id))
    kernel = jit.get_kernel(QK_RMS_NORM_ROPE, _dtypes.c_type(q.dtype), _dtypes.c_type(cache.dtype),
                            POSITION_TYPES[positions.dtype], bool(is_neox), plan.vec_width, plan.threads_per_head)
    kernel(plan.grid, plan.block, (
        q, k, q_weight, k_weight, positions, cache,
        np.int64(num_tokens), np.int64(num_q_heads), np.int64(num_kv_heads), np.int64(head_dim),
        np.int64(rotary_dim), np.int64(cache.shape[0]), np.int64(pos_stride),
        np.int64(q_ts), np.int64(q_hs), np.int64(k_ts), np.int64(k_hs), np.int64(cache_stride),
        eps32, np.int32(plan.head_slots), np.int32(plan.tokens_per_block)))
    return q, k
