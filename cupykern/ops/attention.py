"""The KV-cache side of a decode step (kernels_cu/attention.cu): rope_kv_append,
decode_attention; and a prompt's attention over the cache, prefill_attention.

All read token positions from a device array, so a captured CUDA graph replays them
step after step while the graph itself advances the position (see
:func:`cupykern.append_tokens`); the cache is a static ``(max_tokens, num_kv_heads,
head_dim)`` buffer per layer, as FlashInfer's and vLLM's non-paged layouts.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from cupykern import _arrays, _dtypes, launcher, plans
from cupykern.jit import KernelTemplate
from cupykern.ops import rope as _rope

__all__ = ["decode_attention", "prefill_attention", "rope_kv_append"]

ROPE_KV_APPEND = KernelTemplate("attention.cu", "rope_kv_append_kernel", dependent_launch=True)
DECODE_ATTENTION = KernelTemplate("attention.cu", "decode_attention_kernel", dependent_launch=True)
ATTENTION_COMBINE = KernelTemplate("attention.cu", "attention_combine_kernel", dependent_launch=True)
# A plain launch: the prefill is one graph node among large GEMMs, where a dependent
# launch gains little (its kernel has no start_dependent_part()).
PREFILL_ATTENTION = KernelTemplate("attention.cu", "prefill_attention_kernel")

#: head_dim values decode_attention is compiled for.
HEAD_DIMS = (64, 128)
#: Most tokens one decode_attention call takes: its grid is (heads, tokens, splits), and
#: a grid's y dimension holds at most 65535 blocks on every CUDA GPU.
MAX_TOKENS = 65535


def instantiations() -> dict[KernelTemplate, list[str]]:
    """Every instantiation of this family."""
    rope = [ROPE_KV_APPEND.expr(_dtypes.c_type(d), _dtypes.c_type(c), idx, neox)
            for d in _dtypes.DTYPES for c in sorted({d, _dtypes.float32}, key=str)
            for idx in _dtypes.INDEX_C_TYPES.values() for neox in (False, True)]
    attention = [DECODE_ATTENTION.expr(_dtypes.c_type(d), idx, hd, split, plans.ATTENTION_WARPS)
                 for d in _dtypes.DTYPES for idx in _dtypes.INDEX_C_TYPES.values() for hd in HEAD_DIMS for split in (False, True)]
    combine = [ATTENTION_COMBINE.expr(_dtypes.c_type(d), hd) for d in _dtypes.DTYPES for hd in HEAD_DIMS]
    prefill = [PREFILL_ATTENTION.expr(_dtypes.c_type(d), idx, hd, plans.PREFILL_ATTENTION_LANES_PER_ROW,
                                      plans.PREFILL_ATTENTION_WARPS)
               for d in _dtypes.DTYPES for idx in _dtypes.INDEX_C_TYPES.values() for hd in HEAD_DIMS]
    return {ROPE_KV_APPEND: rope, DECODE_ATTENTION: attention, ATTENTION_COMBINE: combine, PREFILL_ATTENTION: prefill}


# ----------------------------------------------------------------- intake
def _positions(sig, num_tokens: int) -> _arrays.Sig:
    """``(num_tokens,)`` int32 or int64, unit-stride (a graph's position counter is one)."""
    return _arrays.index_vector(sig, "positions", num_tokens)


def _heads3(sig, name: str, shape: str) -> _arrays.Heads:
    """The head geometry of a 3-d attention array, its dimension count checked first:
    :func:`cupykern._arrays.heads` also takes 4-d ``(batch, seq_len, heads, head_dim)``,
    which these ops do not, so a 2-d or 4-d array is told the one ``shape`` they take
    (e.g. ``"(num_tokens, num_heads, head_dim)"``). TypeError if it is missing."""
    sig = _arrays.required(sig, name, f"a device array {shape}")
    if len(sig.shape) != 3:
        raise ValueError(f"{name}: expected shape {shape}, got {tuple(sig.shape)}")
    return _arrays.heads(sig, name)


def _cache(sig, name: str, dtype, num_kv_heads: int, head_dim: int,
           what: str = "the dtype of q") -> _arrays.Heads:
    """A KV cache ``(max_tokens, num_kv_heads, head_dim)`` of ``dtype`` with distinct heads
    (``what`` says where the dtype comes from)."""
    cache = _heads3(sig, name, "(max_tokens, num_kv_heads, head_dim)")
    _arrays.check_dtype(sig, dtype, name, what)
    if (cache.num_heads, cache.head_dim) != (num_kv_heads, head_dim):
        raise ValueError(f"{name}: expected shape (max_tokens, {num_kv_heads}, {head_dim}), got {tuple(sig.shape)}")
    _arrays.distinct_heads(cache, name)
    return cache


def _kv_caches(k_sig, v_sig, dtype, num_kv_heads: int, head_dim: int,
               what: str = "the dtype of q") -> tuple[_arrays.Heads, _arrays.Heads]:
    """k_cache and v_cache (each :func:`_cache`) of the same rows: the kernels bound a
    position by k_cache's rows alone, so a shorter v_cache would be written past its end."""
    kc = _cache(k_sig, "k_cache", dtype, num_kv_heads, head_dim, what)
    vc = _cache(v_sig, "v_cache", dtype, num_kv_heads, head_dim, what)
    if vc.num_tokens != kc.num_tokens:
        raise ValueError(f"v_cache: expected shape {tuple(k_sig.shape)} (as k_cache), got {tuple(v_sig.shape)}")
    return kc, vc


def check_cache_positions(positions: np.ndarray, max_position: int) -> None:
    """ValueError unless the host positions ``positions`` are in ``[0, max_position)`` and
    distinct: tokens at one position would write the same cache row at once (a row mixing
    their elements). The float64 references check their positions with this too."""
    if positions.size == 0:
        return
    _rope.check_position_range(int(positions.min()), int(positions.max()), max_position,
                               "the rows of cos_sin_cache and of k_cache")
    values, counts = np.unique(positions, return_counts=True)
    if counts.max() > 1:
        raise ValueError(f"positions: expected distinct values (token t writes cache row positions[t]), got "
                         f"{int(values[counts.argmax()])} {int(counts.max())} times")


def _check_cache_positions(positions, max_position: int) -> None:
    """:func:`check_cache_positions` of device positions (one copy to the host, a sync)."""
    if positions.size:
        check_cache_positions(positions.get(), max_position)


def _prepare_rope_kv_append(a: launcher.Args) -> launcher.Launch:
    q, qh = a.q, _heads3(a.q, "q", "(num_tokens, num_heads, head_dim)")
    k, kh = a.k, _heads3(a.k, "k", f"({qh.num_tokens}, num_kv_heads, {qh.head_dim})")
    v, vh = a.v, _heads3(a.v, "v", f"({qh.num_tokens}, num_kv_heads, {qh.head_dim})")
    for name, sig, h in (("k", k, kh), ("v", v, vh)):
        _arrays.check_dtype(sig, q.dtype, name, "the dtype of q")
        if h.num_tokens != qh.num_tokens or h.head_dim != qh.head_dim:
            raise ValueError(f"{name}: expected shape ({qh.num_tokens}, num_kv_heads, {qh.head_dim}), got "
                             f"{tuple(sig.shape)}")
    if vh.num_heads != kh.num_heads:
        raise ValueError(f"v: expected shape {tuple(k.shape)} (as k), got {tuple(v.shape)}")
    positions = _positions(a.positions, qh.num_tokens)
    table, rotary_dim, table_stride = _rope._cache(a.cos_sin_cache, q.dtype, qh.head_dim)
    kc, vc = _kv_caches(a.k_cache, a.v_cache, q.dtype, kh.num_heads, qh.head_dim)
    is_neox = _arrays.flag(a.is_neox, "is_neox")
    _arrays.distinct_heads(qh, "q")
    if table_stride != rotary_dim:
        raise ValueError(f"cos_sin_cache: expected C-contiguous rows of {rotary_dim} values, got a row stride of "
                         f"{table_stride}")
    # q is written in place; the caches are written; k, v and the table are read. k and v
    # may be views of one fused QKV buffer beside q: with their row geometries, heads that
    # interleave token by token are told apart exactly.
    q_rows, k_rows, v_rows = _arrays.heads_as_rows(qh), _arrays.heads_as_rows(kh), _arrays.heads_as_rows(vh)
    disjoint = (launcher.Disjoint("k_cache", "v_cache"),
                launcher.Disjoint("k", "q", a_rows=k_rows, b_rows=q_rows),
                launcher.Disjoint("v", "q", a_rows=v_rows, b_rows=q_rows),
                *(launcher.Disjoint(r, w) for w in ("k_cache", "v_cache") for r in ("k", "v")),
                *(launcher.Disjoint(r, w) for w in ("q", "k_cache", "v_cache") for r in ("positions", "cos_sin_cache")),
                launcher.Disjoint("q", "k_cache"), launcher.Disjoint("q", "v_cache"))
    if qh.num_tokens == 0:
        return launcher.Launch(None, returns=("q", "k_cache", "v_cache"))
    plan = plans.DecodePlan("attention", (qh.num_tokens, 1, 1), plans.TOKEN_BLOCK_SIZE)
    return launcher.Launch(
        ROPE_KV_APPEND, (_dtypes.c_type(q.dtype), _dtypes.c_type(table.dtype), _dtypes.INDEX_C_TYPES[positions.dtype],
                         is_neox), plan,
        pointers=("q", "k_cache", "v_cache", "k", "v", "positions", "cos_sin_cache"),
        scalars=(*map(np.int32, (qh.num_heads, kh.num_heads, qh.head_dim, rotary_dim)),
                 *map(np.int64, (qh.token_stride, qh.head_stride, kh.token_stride, kh.head_stride, vh.token_stride,
                                 vh.head_stride, kc.token_stride, kc.head_stride, vc.token_stride, vc.head_stride,
                                 table.shape[0], kc.num_tokens))),
        returns=("q", "k_cache", "v_cache"), disjoint=disjoint)


def _scale(value, head_dim: int) -> np.float32:
    if value is None:
        return np.float32(1.0 / math.sqrt(head_dim))
    scale = _arrays.finite(value, "scale")
    # The kernel scales by scale * log2(e) in float32: that product must stay finite.
    if not (scale > 0 and float(scale) * math.log2(math.e) <= float(np.finfo(np.float32).max)):
        raise ValueError(f"scale: expected a value > 0 whose product with log2(e) is a finite float32 (below "
                         f"{float(np.finfo(np.float32).max) / math.log2(math.e):.4g}), got {value!r}")
    return scale


class _AttentionCall(NamedTuple):
    """What :func:`_attention_intake` checked: the signatures and head geometries of a
    decode_attention or prefill_attention call."""

    q: _arrays.Sig
    qh: _arrays.Heads
    kc: _arrays.Heads
    vc: _arrays.Heads
    positions: _arrays.Sig
    scale: np.float32
    out: _arrays.Sig
    oh: _arrays.Heads
    allocate: tuple
    disjoint: tuple
    num_kv_heads: int


def _attention_intake(a: launcher.Args, op: str, max_tokens: int | None) -> _AttentionCall:
    """The argument checks decode_attention and prefill_attention share (``op`` names the
    op in messages; ``max_tokens``: the most tokens it takes, None for no limit)."""
    q = a.q
    qh = _heads3(q, "q", "(num_tokens, num_heads, head_dim)")  # before heads(), which also takes 4-d arrays
    if qh.head_dim not in HEAD_DIMS:
        raise ValueError(f"q: head_dim {qh.head_dim} is not supported; expected one of {HEAD_DIMS}")
    kc_sig = _arrays.required(a.k_cache, "k_cache", "a device array (max_tokens, num_kv_heads, head_dim)")
    if len(kc_sig.shape) != 3:
        raise ValueError(f"k_cache: expected shape (max_tokens, num_kv_heads, head_dim), got "
                         f"{tuple(kc_sig.shape)}")
    num_kv_heads = kc_sig.shape[1]
    if num_kv_heads < 1 or qh.num_heads % num_kv_heads:
        raise ValueError(f"k_cache: num_kv_heads ({num_kv_heads}) must divide q's num_heads ({qh.num_heads})")
    k_cache, v_cache = kc_sig, a.v_cache
    kc, vc = _kv_caches(k_cache, v_cache, q.dtype, num_kv_heads, qh.head_dim)
    positions = _positions(a.positions, qh.num_tokens)
    if max_tokens is not None and qh.num_tokens > max_tokens:
        raise ValueError(f"q: {op} takes at most {max_tokens} tokens per call (the grid's y dimension), "
                         f"got {qh.num_tokens}; split the call")
    scale = _scale(a.scale, qh.head_dim)
    out, allocate = launcher.output(a.out, "out", q.shape, q.dtype)
    oh = _arrays.heads(out, "out")
    _arrays.distinct_heads(oh, "out")
    vw = _dtypes.vec_width(q.dtype)
    for name, sig, strides in (("q", q, (qh.token_stride, qh.head_stride)), ("out", out, (oh.token_stride,
                                                                                         oh.head_stride)),
                               ("k_cache", k_cache, (kc.token_stride, kc.head_stride)),
                               ("v_cache", v_cache, (vc.token_stride, vc.head_stride))):
        if not _arrays.vector_aligned(vw, *[(sig, s) for s in strides]):
            raise ValueError(f"{name}: {op} reads 16-byte vectors: the address and the token and head "
                             f"strides must be multiples of 16 bytes")
    disjoint = tuple(launcher.Disjoint(r, "out") for r in ("q", "k_cache", "v_cache", "positions"))
    return _AttentionCall(q, qh, kc, vc, positions, scale, out, oh, allocate, disjoint, num_kv_heads)


def _prepare_decode_attention(a: launcher.Args) -> launcher.Launch:
    q, qh, kc, vc, positions, scale, out, oh, allocate, disjoint, num_kv_heads = _attention_intake(
        a, "decode_attention", MAX_TOKENS)
    workspace = a.workspace
    if workspace is not None:  # checked whether or not this device's plan splits the cache
        _arrays.check_dtype(workspace, _dtypes.float32, "workspace", "float32")
        if len(workspace.shape) != 1 or (workspace.shape[0] > 1 and workspace.strides[0] != 4):
            raise ValueError(f"workspace: expected a unit-stride float32 vector (cupykern.ops.attention.workspace_size "
                             f"elements), got shape {tuple(workspace.shape)} and strides {tuple(workspace.strides)}")
        _arrays.element_aligned(workspace, "workspace")
    if qh.num_tokens == 0 or qh.num_heads == 0:
        return launcher.Launch(None, allocate=allocate, returns="out")
    plan = plans.plan_attention(qh.num_tokens, qh.num_heads, kc.num_tokens, q.dtype, limits=a.limits,
                                overrides=a.overrides)
    split = plan.num_splits > 1
    if split:
        # Per-split outputs then log2-sum-exps, float32, one buffer; the caller may pass it
        # (a captured graph must not allocate).
        rows = qh.num_tokens * qh.num_heads * plan.num_splits
        need = rows * (qh.head_dim + 1)
        if workspace is None:
            allocate = (*allocate, ("workspace", (need,), _dtypes.float32))
        else:
            if workspace.shape[0] < need:
                raise ValueError(f"workspace: expected a unit-stride float32 vector of at least {need} elements "
                                 f"(cupykern.ops.attention.workspace_size), got shape {tuple(workspace.shape)}")
            disjoint = (*disjoint, *(launcher.Disjoint(r, "workspace") for r in ("q", "k_cache", "v_cache",
                                                                                 "positions", "out")))
        lse_offset = ("workspace", rows * qh.head_dim * 4)
    group = qh.num_heads // num_kv_heads
    scale_log2 = np.float32(float(scale) * math.log2(math.e))  # the kernel works in base 2 (exp2f)
    then = None
    if split:
        combine_plan = plans.DecodePlan("attention", (qh.num_heads, qh.num_tokens, 1), qh.head_dim)
        then = launcher.Launch(ATTENTION_COMBINE, (_dtypes.c_type(q.dtype), qh.head_dim), combine_plan,
                               pointers=("out", "workspace", lse_offset),
                               scalars=(np.int32(plan.num_splits), np.int64(oh.token_stride),
                                        np.int64(oh.head_stride)))
    return launcher.Launch(
        DECODE_ATTENTION, (_dtypes.c_type(q.dtype), _dtypes.INDEX_C_TYPES[positions.dtype], qh.head_dim, split,
                           plan.block_size // plans.WARP_SIZE), plan,
        pointers=("out", "workspace" if split else "out", lse_offset if split else "out", "q", "k_cache", "v_cache",
                  "positions"),
        scalars=(np.int32(group), *map(np.int64, (qh.token_stride, qh.head_stride, kc.token_stride, kc.head_stride,
                                                  vc.token_stride, vc.head_stride, oh.token_stride, oh.head_stride,
                                                  kc.num_tokens, plan.split_size)), scale_log2),
        allocate=allocate, returns="out", disjoint=disjoint, then=then)


def _prepare_prefill_attention(a: launcher.Args) -> launcher.Launch:
    q, qh, kc, vc, positions, scale, out, oh, allocate, disjoint, num_kv_heads = _attention_intake(
        a, "prefill_attention", None)
    if qh.num_tokens == 0 or qh.num_heads == 0:
        return launcher.Launch(None, allocate=allocate, returns="out")
    plan = plans.plan_prefill_attention(qh.num_tokens, qh.num_heads, num_kv_heads, q.dtype, limits=a.limits,
                                        overrides=a.overrides)
    group = qh.num_heads // num_kv_heads
    scale_log2 = np.float32(float(scale) * math.log2(math.e))  # the kernel works in base 2 (exp2f)
    return launcher.Launch(
        PREFILL_ATTENTION, (_dtypes.c_type(q.dtype), _dtypes.INDEX_C_TYPES[positions.dtype], qh.head_dim,
                            plans.WARP_SIZE // plan.rows_per_warp, plan.block_size // plans.WARP_SIZE), plan,
        pointers=("out", "q", "k_cache", "v_cache", "positions"),
        scalars=(np.int32(group), np.int32(num_kv_heads),
                 *map(np.int64, (qh.num_tokens * group, qh.token_stride, qh.head_stride, kc.token_stride,
                                 kc.head_stride, vc.token_stride, vc.head_stride, oh.token_stride, oh.head_stride,
                                 kc.num_tokens)), scale_log2),
        allocate=allocate, returns="out", disjoint=disjoint)


def workspace_size(num_tokens: int, num_heads: int, head_dim: int, max_tokens: int, *, limits=None) -> int:
    """float32 elements of the ``workspace`` decode_attention needs for these sizes (0 when
    it runs unsplit). ``max_tokens``: the cache's rows (``k_cache.shape[0]``). ``limits``:
    the device's (:class:`cupykern.plans.DeviceLimits`), the current GPU's by default,
    so without a GPU pass ``limits``. Not exported at the top level:
    ``cupykern.ops.attention.workspace_size``.

    Raises:
        ValueError: a size that is not an int >= 0.
        RuntimeError: ``limits`` None and no CUDA GPU visible.
    """
    # Python ints: a NumPy uint8 wrapped in the product below (helper 63).
    num_tokens, num_heads, head_dim, max_tokens = (
        _arrays.count(value, name, 0) for name, value in (("num_tokens", num_tokens), ("num_heads", num_heads),
                                                          ("head_dim", head_dim), ("max_tokens", max_tokens)))
    if limits is None:
        import cupy

        from cupykern import environment

        environment.check_gpu("workspace_size", "without one pass limits= (a cupykern.plans.DeviceLimits, e.g. "
                                                "cupykern.plans.H200_LIMITS)")
        limits = plans.DeviceLimits.of_device(cupy.cuda.runtime.getDevice())
    plan = plans.plan_attention(num_tokens, num_heads, max_tokens, _dtypes.float32, limits=limits)
    return 0 if plan.num_splits == 1 else num_tokens * num_heads * plan.num_splits * (head_dim + 1)


_ROPE_KV_APPEND = launcher.Op("rope_kv_append",
                              arrays=("q", "k", "v", "positions", "cos_sin_cache", "k_cache", "v_cache"),
                              scalars=("is_neox",), prepare=_prepare_rope_kv_append, plan_kind="attention")
_DECODE_ATTENTION = launcher.Op("decode_attention",
                                arrays=("q", "k_cache", "v_cache", "positions", "out", "workspace"),
                                scalars=("scale",), prepare=_prepare_decode_attention, plan_kind="attention")
_PREFILL_ATTENTION = launcher.Op("prefill_attention", arrays=("q", "k_cache", "v_cache", "positions", "out"),
                                 scalars=("scale",), prepare=_prepare_prefill_attention, plan_kind="attention")


# ----------------------------------------------------------------- public API
def rope_kv_append(q, k, v, positions, cos_sin_cache, k_cache, v_cache, *, is_neox=True, check_positions=True):
    """RoPE on q and k, and k and v appended to the KV cache at each token's position, in one launch.

    For token ``t`` at ``p = positions[t]``: ``q[t]`` is rotated in place;
    ``k_cache[p] = rope(k[t])`` and ``v_cache[p] = v[t]``. The rotation is
    :func:`cupykern.apply_rope`'s (``x0 * cos - x1 * sin``, ``x1 * cos + x0 * sin`` in fp32,
    one rounding; dims past ``rotary_dim`` unchanged), what vLLM's ``rotary_embedding``
    followed by ``reshape_and_cache`` do, for a contiguous (non-paged) cache.

    Parameters:
        q: device array ``(num_tokens, num_heads, head_dim)``, float16, bfloat16 or
            float32; head_dim unit-stride (q may be a view of a fused QKV buffer).
        k, v: ``(num_tokens, num_kv_heads, head_dim)`` of q's dtype (views allowed).
        positions: ``(num_tokens,)`` int32 or int64 on the device: each token's position,
            the cache row it is written to and the cos_sin_cache row it is rotated by.
        cos_sin_cache: ``(max_position, rotary_dim)`` float32 or q's dtype, C-contiguous
            rows ``[cos | sin]`` (:func:`cupykern.rope_cos_sin_cache`).
        k_cache, v_cache: ``(max_tokens, num_kv_heads, head_dim)`` of q's dtype.
        is_neox: pairs ``(i, i + rotary_dim / 2)`` (True, GPT-NeoX / Hugging Face) or
            ``(2i, 2i + 1)`` (False, GPT-J / GGUF).
        check_positions: check that every position is in ``[0, min(max_position,
            max_tokens))`` and that no two tokens share one (a device-to-host copy).
            False skips it, as a captured graph must: a token whose position is outside
            is then left alone (q unrotated, nothing written), and a cache row that two
            tokens share gets elements of either.

    Returns:
        ``(q, k_cache, v_cache)``.

    Mutates: ``q``, and row ``positions[t]`` of ``k_cache`` and ``v_cache`` for each token.

    Raises:
        TypeError: a non-device array; dtypes that differ or are unsupported; positions
            not int32/int64; ``is_neox`` not a bool.
        ValueError: shapes that disagree; a rotary_dim that is odd or beyond head_dim;
            heads of a written array overlapping; written arrays overlapping inputs or
            each other; a position out of range or repeated (with ``check_positions``).

    References:
        Su et al., "RoFormer", 2021 (arXiv:2104.09864); vLLM's ``rotary_embedding`` and
        ``reshape_and_cache``; FlashInfer's ``apply_rope_with_cos_sin_cache_inplace`` and
        ``append_paged_kv_cache``.
    """
    arrays, scalars = (q, k, v, positions, cos_sin_cache, k_cache, v_cache), (is_neox,)
    if _arrays.flag(check_positions, "check_positions"):
        # Before the launch, on checked arrays: a bad position must not reach the cache.
        q, k, v, positions, cos_sin_cache, k_cache, v_cache = _ROPE_KV_APPEND.intake(arrays, scalars)
        _check_cache_positions(positions, min(cos_sin_cache.shape[0], k_cache.shape[0]))
    return _ROPE_KV_APPEND(arrays, scalars)


def decode_attention(q, k_cache, v_cache, positions, *, scale=None, out=None, workspace=None):
    """Causal grouped-query attention of a few new tokens over a KV cache (flash-decoding).

    ``out[t, h] = sum_{p <= positions[t]} softmax_p(scale * q[t, h] . k_cache[p, g]) v_cache[p, g]``
    with ``g = h // (num_heads // num_kv_heads)``: token ``t`` attends to cache rows
    ``0 .. positions[t]`` (its own row included: append it first, e.g. with
    :func:`rope_kv_append`). fp32 math, one rounding to q's dtype.

    Parameters:
        q: device array ``(num_tokens, num_heads, head_dim)``, float16, bfloat16 or
            float32, head_dim 64 or 128; token and head strides multiples of 16 bytes;
            at most 65535 tokens (``cupykern.ops.attention.MAX_TOKENS``).
        k_cache, v_cache: ``(max_tokens, num_kv_heads, head_dim)`` of q's dtype,
            num_kv_heads dividing num_heads; strides multiples of 16 bytes.
        positions: ``(num_tokens,)`` int32 or int64 on the device (read by the kernel,
            so a captured graph sees each step's value). Rows past ``max_tokens - 1``
            are clamped to the cache; a negative position attends to nothing (output 0).
        scale: the logit scale, default ``1 / sqrt(head_dim)``; > 0 and below about
            2.359e38 (its product with log2(e) must be a finite float32).
        out: optional ``(num_tokens, num_heads, head_dim)`` of q's dtype.
        workspace: optional float32 vector of at least
            ``cupykern.ops.attention.workspace_size(num_tokens, num_heads, head_dim,
            max_tokens)`` elements, unit-stride, its address a multiple of 4 bytes, for long caches (more than
            1024 rows), which are split over blocks and combined by a second launch;
            allocated per call if not given (a captured graph must pass it). Checked
            (dtype, layout) whenever given, its length only where the cache is split.

    Returns:
        ``out`` (allocated if not given).

    Mutates: ``out`` (and ``workspace``) only.

    Raises:
        TypeError: a non-device array; dtypes that differ or are unsupported; positions
            not int32/int64; a workspace not float32.
        ValueError: shapes that disagree; more than 65535 tokens; an unsupported
            head_dim; num_kv_heads not dividing num_heads; misaligned strides; a bad
            ``scale``; a workspace not a unit-stride vector, misaligned or too small;
            ``out`` overlapping an input.

    Notes:
        The online softmax runs in base 2 (``exp2f`` of logits times ``scale *
        log2(e)``); states merge in a fixed order (lane groups, warps, then splits). A
        cache of up to 1024 rows runs as one split, so a token's result is the same bits
        in any batch; past that the number of splits follows tokens x heads (about two
        blocks per SM), and a token's bits can differ with the batch size.

    References:
        Dao et al., "Flash-Decoding for long-context inference", 2023; Milakov &
        Gimelshein, "Online normalizer calculation for softmax", 2018
        (arXiv:1805.02867); Ainslie et al., "GQA", 2023 (arXiv:2305.13245).
    """
    return _DECODE_ATTENTION((q, k_cache, v_cache, positions, out, workspace), (scale,))


def prefill_attention(q, k_cache, v_cache, positions, *, scale=None, out=None):
    """Causal grouped-query attention of many tokens over a KV cache at once (a prompt's
    prefill; flash-attention tiles).

    ``out[t, h] = sum_{p <= positions[t]} softmax_p(scale * q[t, h] . k_cache[p, g]) v_cache[p, g]``
    with ``g = h // (num_heads // num_kv_heads)``: :func:`decode_attention`'s contract
    and math, for any number of tokens. Token ``t`` attends to cache rows ``0 ..
    positions[t]`` (its own row included: append the prompt's k and v first, e.g. with
    :func:`rope_kv_append`). fp32 math, one rounding to q's dtype. Positions may come in
    any order and need not be consecutive; consecutive ones are fastest (a block's rows
    then share their key range).

    Parameters:
        q: device array ``(num_tokens, num_heads, head_dim)``, float16, bfloat16 or
            float32, head_dim 64 or 128; token and head strides multiples of 16 bytes
            (q may be a view of a fused QKV buffer).
        k_cache, v_cache: ``(max_tokens, num_kv_heads, head_dim)`` of q's dtype,
            num_kv_heads dividing num_heads; strides multiples of 16 bytes.
        positions: ``(num_tokens,)`` int32 or int64 on the device (read by the kernel,
            never by the host, so a captured graph sees the values of each replay).
            Rows past ``max_tokens - 1`` are clamped to the cache; a negative position
            (a padding row) attends to nothing: its output is 0.
        scale: the logit scale, default ``1 / sqrt(head_dim)``; > 0 and below about
            2.359e38 (its product with log2(e) must be a finite float32).
        out: optional ``(num_tokens, num_heads, head_dim)`` of q's dtype (a captured
            graph must pass it: nothing else is allocated).

    Returns:
        ``out`` (allocated if not given).

    Mutates: ``out`` only.

    Raises:
        TypeError: a non-device array; dtypes that differ or are unsupported; positions
            not int32/int64.
        ValueError: shapes that disagree; an unsupported head_dim; num_kv_heads not
            dividing num_heads; misaligned strides; a bad ``scale``; ``out`` overlapping
            an input; more tokens than the grid holds (about 2**31 / num_heads x 16).

    Notes:
        A block holds 16 query rows ((token, head) pairs of one kv head) and its 4 warps
        split the keys up to the block's largest position in fixed tiles (tile j to warp
        j % 4); each warp runs the online softmax in base 2 (``exp2f`` of logits times
        ``scale * log2(e)``) over its tiles, skipping a row's keys past its position, and
        the warps' states merge in warp order. A row's result is therefore the same bits
        whatever the other tokens of the call (batch invariant); the bits may differ from
        :func:`decode_attention`'s (another summation order). Safe under CUDA-graph
        capture (no allocation given ``out``, no host synchronisation).

    References:
        Dao et al., "FlashAttention", 2022 (arXiv:2205.14135); Milakov & Gimelshein,
        "Online normalizer calculation for softmax", 2018 (arXiv:1805.02867); Ainslie et
        al., "GQA", 2023 (arXiv:2305.13245).
    """
    return _PREFILL_ATTENTION((q, k_cache, v_cache, positions, out), (scale,))
