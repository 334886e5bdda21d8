"""Rotary position embedding: rope_cos_sin_cache, apply_rope, qk_rms_norm_rope (kernels_cu/rope.cu)."""

from __future__ import annotations

from functools import partial

import numpy as np

from cupykern import _arrays, _dtypes, launcher, plans
from cupykern import rope_scaling as _scaling
from cupykern.jit import KernelTemplate

__all__ = ["apply_rope", "qk_rms_norm_rope", "rope_cos_sin_cache"]

APPLY_ROPE = KernelTemplate("rope.cu", "apply_rope_kernel")
QK_RMS_NORM_ROPE = KernelTemplate("rope.cu", "qk_rms_norm_rope_kernel")
#: The wide layout (plans.ROPE_LAYOUT "wide"): same math, several heads in flight per thread.
APPLY_ROPE_WIDE = KernelTemplate("rope.cu", "apply_rope_wide_kernel")
QK_RMS_NORM_ROPE_WIDE = KernelTemplate("rope.cu", "qk_rms_norm_rope_wide_kernel")
#: qk_rms_norm_rope where plans.ROPE_NORM_TOKEN_HEADS says: the wide
#: kernel's bits and template arguments but the pass-through flag (full rotary only), one
#: token a block (bf16 only).
QK_RMS_NORM_ROPE_TOKEN = KernelTemplate("rope.cu", "qk_rms_norm_rope_token_kernel")
#: apply_rope in place with one position a token where plans.ROPE_TOKEN_HEADS says: the
#: wide kernel's bits, one token a block (16-bit q/k in 16-byte vectors, one unit a lane).
APPLY_ROPE_TOKEN = KernelTemplate("rope.cu", "apply_rope_token_kernel")

#: Position dtypes -> TPos (never reinterpreted: each has its own instantiation).
POSITION_TYPES = _dtypes.INDEX_C_TYPES

#: apply_rope's kMropeLayout: one position per token; M-RoPE sectioned (Qwen2-VL,
#: Qwen2.5-VL); M-RoPE interleaved (Qwen3-VL's ``mrope_interleaved``).
MROPE_NONE, MROPE_SECTIONED, MROPE_INTERLEAVED = 0, 1, 2
MROPE_LAYOUTS = (MROPE_NONE, MROPE_SECTIONED, MROPE_INTERLEAVED)


def _cache_dtypes(dtype) -> list:
    """Cache dtypes accepted with q of ``dtype``: float32, or q's own dtype."""
    return sorted({_dtypes.float32, np.dtype(dtype)}, key=str)


def instantiations() -> dict[KernelTemplate, list[str]]:
    """Every instantiation: dtype x cache dtype x position type x is_neox x vector width
    (x threads per head for qk_rms_norm_rope; x M-RoPE layout for apply_rope, the M-RoPE
    layouts with the NeoX pairing only), of the "steps" kernels and of the wide ones
    (x heads per thread, plans.ROPE_WIDE_HEADS_CHOICES / ROPE_WIDE_NORM_HEADS_CHOICES;
    apply_rope's also x in place or not, qk_rms_norm_rope's x pass-through dims or not),
    and the token kernels in 16-byte vectors (plans.ROPE_TOKEN_DTYPES): qk_rms_norm_rope's
    as its wide one without pass-through dims, apply_rope's as its wide one in place
    without M-RoPE and also at plans.ROPE_TOKEN_BAND_HEADS heads a thread
    (plans.rope_token_heads_compiled), x its row groups (plans.ROPE_NORM_THREADS_PER_HEAD),
    and at 6 lanes a head only at plans.ROPE_TOKEN_6_LANES_HEADS
    (plans.rope_token_kernels_compiled)."""
    spaces: dict[KernelTemplate, list[str]] = {APPLY_ROPE: [], QK_RMS_NORM_ROPE: [], APPLY_ROPE_WIDE: [],
                                               QK_RMS_NORM_ROPE_WIDE: [], QK_RMS_NORM_ROPE_TOKEN: [],
                                               APPLY_ROPE_TOKEN: []}
    for d in _dtypes.DTYPES:
        for c in _cache_dtypes(d):
            for p in POSITION_TYPES.values():
                for neox in (True, False):
                    lead = (_dtypes.c_type(d), _dtypes.c_type(c), p, neox)
                    for w in plans.rope_vec_widths(d, fused_norm=False):
                        for layout in (MROPE_LAYOUTS if neox else (MROPE_NONE,)):
                            spaces[APPLY_ROPE].append(APPLY_ROPE.expr(*lead, w, layout))
                            for heads in plans.rope_wide_heads_choices():
                                for in_place in (True, False):
                                    spaces[APPLY_ROPE_WIDE].append(
                                        APPLY_ROPE_WIDE.expr(*lead, w, layout, heads, in_place))
                    for w in plans.rope_vec_widths(d, fused_norm=True):
                        for g in (plans.rope_norm_row_groups() if w > 1 else (32,)):
                            spaces[QK_RMS_NORM_ROPE].append(QK_RMS_NORM_ROPE.expr(*lead, w, g))
                            for heads in plans.rope_wide_heads_choices(fused_norm=True):
                                for has_pass in (True, False):
                                    spaces[QK_RMS_NORM_ROPE_WIDE].append(
                                        QK_RMS_NORM_ROPE_WIDE.expr(*lead, w, g, heads, has_pass))
                                if np.dtype(d) in plans.rope_token_dtypes(True) and w > 1:
                                    spaces[QK_RMS_NORM_ROPE_TOKEN].append(QK_RMS_NORM_ROPE_TOKEN.expr(*lead, w, g, heads))
                    if np.dtype(d) in plans.rope_token_dtypes(False):
                        w = _dtypes.vec_width(d)
                        for g, heads in plans.rope_token_kernels_compiled():
                            spaces[APPLY_ROPE_TOKEN].append(APPLY_ROPE_TOKEN.expr(*lead, w, g, heads))
    return spaces


# ----------------------------------------------------------------- intake and plan
def _qk(a: launcher.Args) -> tuple:
    """q and k (k may be None) with their head geometry; dtypes, token axes and head_dim agree."""
    q = _arrays.required(a.q, "q", "a device array (num_tokens, num_q_heads, head_dim)")
    q_heads = _arrays.heads(q, "q")
    k = a.k
    if k is None:
        return q, q_heads, None, None
    _arrays.check_dtype(k, q.dtype, "k", "the dtype of q")
    k_heads = _arrays.heads(k, "k")
    if k.shape[:-2] != q.shape[:-2]:
        raise ValueError(f"k: expected the token axes of q {tuple(q.shape[:-2])}, got {tuple(k.shape[:-2])}")
    if k_heads.head_dim != q_heads.head_dim:
        raise ValueError(f"k: expected head_dim {q_heads.head_dim} (q's), got {k_heads.head_dim}")
    return q, q_heads, k, k_heads


def _qk_disjoint(q_heads, k_heads, *, inplace: bool, read=("positions", "cos_sin_cache")) -> tuple:
    """In place, the overlap rules of q and k against each other and against the arrays
    every block reads (another block may already have written them). Out of place q and
    k are only read and the outputs are new: no rule."""
    if not inplace:
        return ()
    # Exact for heads laid out contiguously within a token (slices of one fused QKV row:
    # q against k, and a read array between two tokens' rows), conservative otherwise.
    q_rows, k_rows = _arrays.heads_as_rows(q_heads), None if k_heads is None else _arrays.heads_as_rows(k_heads)
    rules = tuple(launcher.Disjoint(r, w, b_rows=w_rows) for w, w_rows in (("q", q_rows), ("k", k_rows)) for r in read)
    if k_heads is None:
        return rules
    return (launcher.Disjoint("q", "k", a_rows=q_rows, b_rows=k_rows), *rules)


def _positions(sig, token_shape) -> tuple[_arrays.Sig, int]:
    sig = _arrays.required(sig, "positions", "a device array of int32 or int64 positions")
    if sig.dtype not in POSITION_TYPES:
        raise TypeError(f"positions: expected dtype int32 or int64, got {sig.dtype}")
    if tuple(sig.shape) != tuple(token_shape):
        raise ValueError(f"positions: expected shape {tuple(token_shape)} (one position per token), got "
                         f"{tuple(sig.shape)}")
    _arrays.element_aligned(sig, "positions")
    if any(s % sig.itemsize for s in sig.strides):
        raise ValueError(f"positions: strides {sig.strides} are not multiples of the item size {sig.itemsize}")
    stride = _arrays.collapse(sig.shape, [s // sig.itemsize for s in sig.strides], "positions", "token")
    return sig, stride


def _mrope_positions(sig, token_shape) -> tuple[_arrays.Sig, int, int]:
    """M-RoPE positions ``(3, *token_shape)``: (signature, token stride, row stride), in elements."""
    sig = _arrays.required(sig, "positions", "a device array of int32 or int64 positions")
    if sig.dtype not in POSITION_TYPES:
        raise TypeError(f"positions: expected dtype int32 or int64, got {sig.dtype}")
    expected = (3, *token_shape)
    if tuple(sig.shape) != expected:
        raise ValueError(f"positions: with mrope_section, expected shape {expected} (temporal, height and width "
                         f"rows of one position per token), got {tuple(sig.shape)}")
    _arrays.element_aligned(sig, "positions")
    if any(s % sig.itemsize for s in sig.strides):
        raise ValueError(f"positions: strides {sig.strides} are not multiples of the item size {sig.itemsize}")
    strides = [s // sig.itemsize for s in sig.strides]
    stride = _arrays.collapse(sig.shape[1:], strides[1:], "positions", "token")
    return sig, stride, strides[0]


def mrope_layout(mrope_section, mrope_interleaved, rotary_dim: int, is_neox: bool) -> tuple[int, tuple]:
    """``(kMropeLayout, (t, h, w))`` of apply_rope's M-RoPE arguments; ``(0, (0, 0, 0))``
    without ``mrope_section``.

    Raises:
        ValueError: ``mrope_section`` not 3 ints >= 0 summing to ``rotary_dim / 2``, or
            interleaved with a height or width section of 2**31 / 3 or more;
            ``mrope_interleaved`` True without ``mrope_section``; M-RoPE with
            ``is_neox=False`` (compiled for the NeoX pairing of HF/vLLM only).
        TypeError: ``mrope_interleaved`` not a bool (nor 1 or 0).
    """
    # A flag as is_neox and inplace are (_arrays.flag: True, False, 1, 0, NumPy bools; else TypeError).
    interleaved = False if mrope_interleaved is None else _arrays.flag(mrope_interleaved, "mrope_interleaved")
    if mrope_section is None:
        if interleaved:
            raise ValueError("mrope_interleaved: True needs mrope_section (the (t, h, w) split of rotary_dim / 2)")
        return MROPE_NONE, (0, 0, 0)
    half = rotary_dim // 2
    if not isinstance(mrope_section, (tuple, list)) or len(mrope_section) != 3 or \
            not all(_arrays.is_int(v) and v >= 0 for v in mrope_section):
        raise ValueError(f"mrope_section: expected 3 ints >= 0 (temporal, height, width sections of rotary_dim / 2 "
                         f"= {half}), got {mrope_section!r}")
    sections = tuple(int(v) for v in mrope_section)
    if sum(sections) != half:
        raise ValueError(f"mrope_section: the sections must sum to rotary_dim / 2 = {half} (cos_sin_cache.shape[1] "
                         f"/ 2), got {sections} (sum {sum(sections)})")
    if interleaved and 3 * max(sections[1:]) >= _arrays.INT32_LIMIT:
        # rope.cu's mrope_row compares the index with 3 * h and 3 * w in 32 bits.
        raise ValueError(f"mrope_section: interleaved sections must be below 2**31 / 3 (the kernel's 32-bit "
                         f"3 * h and 3 * w), got {sections}")
    if not is_neox:
        raise ValueError("is_neox: M-RoPE (mrope_section) is compiled for the NeoX pairing only (HF Qwen2-VL, "
                         "Qwen2.5-VL, Qwen3-VL and vLLM's MRotaryEmbedding rotate halves); pass is_neox=True")
    return (MROPE_INTERLEAVED if interleaved else MROPE_SECTIONED), sections


class _Unkeyed(tuple):
    """A tuple the launcher's recipe cache cannot key (unhashable): its checks run on every call."""

    __hash__ = None


def mrope_key(mrope_section):
    """``mrope_section`` as apply_rope passes it to the launcher: 3 ints as a tuple of
    Python ints (a config's list too); any other tuple or list unkeyed.

    The recipe cache compares keys with ``==``, and ``(16.0, 24, 24) == (16, 24, 24)``
    (``(True, 1, 1) == (1, 1, 1)``): such a section, which :func:`mrope_layout` refuses,
    would otherwise be taken from the recipe of an earlier call with ints. Everything
    else is passed as is (a string is hashable but equals no valid section; an array is
    unhashable) and refused by :func:`mrope_layout`.
    """
    if isinstance(mrope_section, (tuple, list)):
        if len(mrope_section) == 3 and all(map(_arrays.is_int, mrope_section)):
            return tuple(int(v) for v in mrope_section)
        return _Unkeyed(mrope_section)
    return mrope_section


def _cache(sig, dtype, head_dim: int) -> tuple[_arrays.Sig, int, int]:
    """The cos/sin table with its rotary_dim and row stride (elements)."""
    cache = _arrays.required(sig, "cos_sin_cache", "a device array (max_position, rotary_dim)")
    if cache.dtype not in _cache_dtypes(dtype):
        allowed = "float32 (q's dtype)" if np.dtype(dtype) == np.float32 else f"float32 or q's dtype {dtype}"
        raise TypeError(f"cos_sin_cache: expected dtype {allowed}, got {cache.dtype}")
    if len(cache.shape) != 2:
        raise ValueError(f"cos_sin_cache: expected shape (max_position, rotary_dim), got {tuple(cache.shape)}")
    rows, rotary_dim = cache.shape
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(f"cos_sin_cache: rotary_dim = shape[1] must be even and >= 2, got {rotary_dim}")
    if rotary_dim > head_dim:
        raise ValueError(f"cos_sin_cache: rotary_dim ({rotary_dim}) must be <= head_dim ({head_dim})")
    if rows >= 1 and cache.strides[1] != cache.itemsize:
        raise ValueError(f"cos_sin_cache: the last axis must be unit-stride, got stride {cache.strides[1]} bytes")
    _arrays.element_aligned(cache, "cos_sin_cache")
    if cache.strides[0] % cache.itemsize:
        raise ValueError(f"cos_sin_cache: row stride {cache.strides[0]} bytes is not a multiple of the item size")
    row_stride = cache.strides[0] // cache.itemsize if rows > 1 else rotary_dim
    return cache, rotary_dim, row_stride


def _max_vec_width(dtype, fused_norm: bool, cache: _arrays.Sig, cache_stride: int, *sigs_and_strides) -> int:
    """Widest compiled vector width all addresses and strides allow (the cache is read in
    accesses of at most 16 bytes)."""
    for w in reversed(plans.rope_vec_widths(dtype, fused_norm=fused_norm)):
        cache_w = max(1, min(w, 16 // cache.itemsize))
        if _arrays.vector_aligned(w, *sigs_and_strides) and _arrays.vector_aligned(cache_w, (cache, cache_stride)):
            return w
    return 1


def _int32_sizes(qh, num_kv_heads: int, k_strides, rotary_dim: int, max_position: int, pos_stride: int,
                 cache_stride: int, out_strides=()) -> tuple[np.int32, ...]:
    """rope.cu's 32-bit size and stride arguments in the kernels' order (q and k's sizes,
    positions' stride, q's and k's strides, apply_rope's ``out_strides`` of q_out and k_out,
    the cache's row stride), after the q + kv heads the kernels add in 32 bits. Checked
    before the plan, so that the float64 twins check them too. ``k_strides`` None: no k.

    Raises:
        ValueError: naming the array whose size or stride is 2**31 or more in magnitude.
    """
    _arrays.int32_args(("q" if k_strides is None else "q and k", "num_q_heads + num_kv_heads",
                        qh.num_heads + num_kv_heads))
    k_ts, k_hs = k_strides or (0, 0)
    outs = zip(("q_out", "q_out", "k_out", "k_out"), ("token stride", "head stride") * 2, out_strides)
    return _arrays.int32_args(
        ("q", "num_tokens", qh.num_tokens), ("q", "num_heads", qh.num_heads), ("k", "num_kv_heads", num_kv_heads),
        ("q", "head_dim", qh.head_dim), ("cos_sin_cache", "rotary_dim", rotary_dim),
        ("cos_sin_cache", "max_position", max_position), ("positions", "stride", pos_stride),
        ("q", "token stride", qh.token_stride), ("q", "head stride", qh.head_stride), ("k", "token stride", k_ts),
        ("k", "head stride", k_hs), *outs, ("cos_sin_cache", "row stride", cache_stride))


def _regrid(plan: plans.RopePlan, num_tokens: int, limits: plans.DeviceLimits):
    """The launcher's :attr:`~cupykern.launcher.Launch.regrid` of a grid-stride plan: whole
    waves of the blocks an SM holds of the kernel it launches (the occupancy API's count,
    where plan_rope could only estimate it). None for a block per token group, and for
    grids no count could cap (at most a block an SM a wave: decode sizes)."""
    if not plan.grid_waves or -(-num_tokens // plan.tokens_per_block) <= plan.grid_waves * limits.sm_count:
        return None
    return partial(plans.rope_resident_grid, plan, num_tokens, limits=limits)


def _prepare_apply_rope(a: launcher.Args) -> launcher.Launch:
    q, qh, k, kh = _qk(a)
    if a.mrope_section is None:
        if a.positions is not None and tuple(a.positions.shape) == (3, *q.shape[:-2]):
            raise ValueError(f"positions: shape {tuple(a.positions.shape)} holds M-RoPE (temporal, height, width) "
                             f"rows; pass mrope_section (a rope_scaling's 'mrope_section'), or positions of shape "
                             f"{tuple(q.shape[:-2])}")
        positions, pos_stride = _positions(a.positions, q.shape[:-2])
        row_stride = 0
    else:
        positions, pos_stride, row_stride = _mrope_positions(a.positions, q.shape[:-2])
    cache, rotary_dim, cache_stride = _cache(a.cos_sin_cache, q.dtype, qh.head_dim)
    is_neox, inplace = _arrays.flag(a.is_neox, "is_neox"), _arrays.flag(a.inplace, "inplace")
    layout, sections = mrope_layout(a.mrope_section, a.mrope_interleaved, rotary_dim, is_neox)
    if inplace:  # q and k are written
        _arrays.distinct_heads(qh, "q")
        if k is not None:
            _arrays.distinct_heads(kh, "k")
    num_kv_heads, k_ts, k_hs = (kh.num_heads, kh.token_stride, kh.head_stride) if k is not None else (0, 0, 0)
    if inplace:
        names, allocate = ("q", "k"), ()
        q_out, k_out, qo_ts, qo_hs, ko_ts, ko_hs = q, k, qh.token_stride, qh.head_stride, k_ts, k_hs
    else:  # new C-contiguous outputs
        names = ("q_out", "k_out")
        allocate = (("q_out", q.shape, q.dtype),) + ((("k_out", k.shape, k.dtype),) if k is not None else ())
        q_out = _arrays.Sig.contiguous(q.shape, q.dtype)
        k_out = _arrays.Sig.contiguous(k.shape, k.dtype) if k is not None else None
        qo_ts, qo_hs, ko_ts, ko_hs = qh.num_heads * qh.head_dim, qh.head_dim, num_kv_heads * qh.head_dim, qh.head_dim
        if qh.num_tokens == 1:  # never used, as _qk's own for one token (no 32-bit limit on it)
            qo_ts = ko_ts = 0
    if qh.num_tokens == 0 or qh.num_heads + num_kv_heads == 0:
        return launcher.Launch(None, allocate=allocate, returns=names)
    sizes = _int32_sizes(qh, num_kv_heads, None if k is None else (k_ts, k_hs), rotary_dim, cache.shape[0], pos_stride,
                         cache_stride, out_strides=(qo_ts, qo_hs, ko_ts, ko_hs))
    positions_row_stride, = _arrays.int32_args(("positions", "row stride", row_stride))  # M-RoPE's, last
    strided = [(q, qh.token_stride), (q, qh.head_stride), (q_out, qo_ts), (q_out, qo_hs)]
    if k is not None:
        strided += [(k, k_ts), (k, k_hs), (k_out, ko_ts), (k_out, ko_hs)]
    max_vec = _max_vec_width(q.dtype, False, cache, cache_stride, *strided)
    plan = plans.plan_rope(qh.num_tokens, qh.num_heads + num_kv_heads, qh.head_dim, rotary_dim, q.dtype,
                           max_vec_width=max_vec, fused_norm=False, limits=a.limits, overrides=a.overrides,
                           op="apply_rope", in_place=inplace, mrope=layout != MROPE_NONE)
    targs = (_dtypes.c_type(q.dtype), _dtypes.c_type(cache.dtype), POSITION_TYPES[positions.dtype], is_neox,
             plan.vec_width)
    if plan.token_kernel:
        template, targs = APPLY_ROPE_TOKEN, (*targs, plan.threads_per_head, plan.heads_per_thread)
    elif plan.heads_per_thread:
        template, targs = APPLY_ROPE_WIDE, (*targs, layout, plan.heads_per_thread, inplace)
    else:
        template, targs = APPLY_ROPE, (*targs, layout)
    return launcher.Launch(
        template, targs, plan, regrid=_regrid(plan, qh.num_tokens, a.limits),
        pointers=(*names, "q", "k", "positions", "cos_sin_cache"),
        scalars=(*sizes,
                 *map(np.int32, (plan.threads_per_head, plan.head_slots, plan.tokens_per_block, 0 if inplace else 1)),
                 positions_row_stride, *map(np.int32, sections)),
        allocate=allocate, returns=names, disjoint=_qk_disjoint(qh, kh, inplace=inplace))


def _prepare_qk_rms_norm_rope(a: launcher.Args) -> launcher.Launch:
    if a.k is None:
        raise TypeError("k: expected a device array (num_tokens, num_kv_heads, head_dim), got None")
    q, qh, k, kh = _qk(a)
    q_weight = _arrays.vector(a.q_weight, "q_weight", q.dtype, qh.head_dim, what="the dtype of q")
    k_weight = _arrays.vector(a.k_weight, "k_weight", q.dtype, qh.head_dim, what="the dtype of q")
    positions, pos_stride = _positions(a.positions, q.shape[:-2])
    cache, rotary_dim, cache_stride = _cache(a.cos_sin_cache, q.dtype, qh.head_dim)
    eps = _arrays.eps(a.eps)
    is_neox = _arrays.flag(a.is_neox, "is_neox")
    _arrays.distinct_heads(qh, "q")
    _arrays.distinct_heads(kh, "k")
    if qh.num_tokens == 0 or qh.num_heads + kh.num_heads == 0:
        return launcher.Launch(None, returns=("q", "k"))
    sizes = _int32_sizes(qh, kh.num_heads, (kh.token_stride, kh.head_stride), rotary_dim, cache.shape[0], pos_stride,
                         cache_stride)
    max_vec = _max_vec_width(q.dtype, True, cache, cache_stride, (q, qh.token_stride), (q, qh.head_stride),
                             (k, kh.token_stride), (k, kh.head_stride), (q_weight, 0), (k_weight, 0))
    plan = plans.plan_rope(qh.num_tokens, qh.num_heads + kh.num_heads, qh.head_dim, rotary_dim, q.dtype,
                           max_vec_width=max_vec, fused_norm=True, limits=a.limits, overrides=a.overrides,
                           op="qk_rms_norm_rope")
    targs = (_dtypes.c_type(q.dtype), _dtypes.c_type(cache.dtype), POSITION_TYPES[positions.dtype], is_neox,
             plan.vec_width, plan.threads_per_head)
    if plan.token_kernel:
        template, targs = QK_RMS_NORM_ROPE_TOKEN, (*targs, plan.heads_per_thread)
    elif plan.heads_per_thread:
        template, targs = QK_RMS_NORM_ROPE_WIDE, (*targs, plan.heads_per_thread, rotary_dim < qh.head_dim)
    else:
        template = QK_RMS_NORM_ROPE
    return launcher.Launch(
        template, targs, plan, regrid=_regrid(plan, qh.num_tokens, a.limits),
        pointers=("q", "k", "q_weight", "k_weight", "positions", "cos_sin_cache"),
        scalars=(*sizes, eps, np.int32(plan.head_slots), np.int32(plan.tokens_per_block)),
        returns=("q", "k"),
        disjoint=_qk_disjoint(qh, kh, inplace=True, read=("q_weight", "k_weight", "positions", "cos_sin_cache")))


_APPLY_ROPE = launcher.Op("apply_rope", arrays=("q", "k", "positions", "cos_sin_cache", "q_out", "k_out"),
                          scalars=("is_neox", "inplace", "mrope_section", "mrope_interleaved"),
                          prepare=_prepare_apply_rope, plan_kind="rope")
_QK_RMS_NORM_ROPE = launcher.Op("qk_rms_norm_rope",
                                arrays=("q", "k", "q_weight", "k_weight", "positions", "cos_sin_cache"),
                                scalars=("eps", "is_neox"), prepare=_prepare_qk_rms_norm_rope, plan_kind="rope")


def check_position_range(lo: int, hi: int, max_position: int, what: str = "the rows of cos_sin_cache") -> None:
    """ValueError unless the smallest and largest position, ``lo`` and ``hi``, are in
    ``[0, max_position)`` (``what`` says what bounds it; the float64 reference checks its
    host positions with this too)."""
    if lo < 0 or hi >= max_position:
        raise ValueError(f"positions: expected values in [0, {max_position}) ({what}), got "
                         f"min {lo}, max {hi}; pass check_positions=False to leave such tokens unchanged")


def _check_positions_in_range(positions, max_position: int, what: str = "the rows of cos_sin_cache") -> None:
    """ValueError if a position is outside [0, max_position): one min/max reduction and a sync."""
    import cupy

    if positions.size == 0:
        return
    lo, hi = (int(v) for v in cupy.stack((positions.min(), positions.max())).get())
    check_position_range(lo, hi, max_position, what)


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
            attention factor multiplies cos and sin); ``"longrope"`` (or ``"su"``:
            ``short_factor``, ``long_factor``, lists of ``rotary_dim / 2``;
            ``original_max_position_embeddings``, which Phi-3's configs keep beside
            ``rope_scaling``: put it in the dict; optional ``factor`` and
            ``attention_factor``): the long factors when ``max_position`` exceeds the
            original length, so a model keeps a short and a long table; ``"mrope"``
            (Qwen2-VL's name, as HF: ``"default"``); any type may carry M-RoPE's
            ``mrope_section`` (3 ints summing to ``rotary_dim / 2``) and
            ``mrope_interleaved``, which leave the table as it is and are checked
            (pass them to :func:`apply_rope`: ``cupykern.rope_scaling.mrope_parameters``).
            The formulas are in cupykern/rope_scaling.py.
        dtype: float32 (default), float16 or bfloat16; values are rounded once to it.

    Returns:
        A new C-contiguous device array ``(max_position, rotary_dim)`` of ``dtype``
        (vLLM's and FlashInfer's ``cos_sin_cache`` layout).

    Mutates: nothing.

    Raises:
        ValueError: ``max_position`` < 0, odd or too small ``rotary_dim``, ``base`` <= 0
            or 1, an unknown rope_type or missing keys (named), non-positive factors, a
            bad ``mrope_section`` (named).
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
               check_positions: bool = True, mrope_section=None, mrope_interleaved: bool = False):
    """Rotary position embedding of q and k, one launch for both (M-RoPE included).

    For each token at position p and each pair (x1, x2) of a head, with
    ``c = cos_sin_cache[p, i]`` and ``s = cos_sin_cache[p, rotary_dim/2 + i]``:
    ``x1' = x1 * c - x2 * s``, ``x2' = x2 * c + x1 * s``. ``is_neox=True`` pairs dims
    ``(i, i + rotary_dim/2)``; ``False`` pairs ``(2i, 2i + 1)``. Dims past rotary_dim
    pass through unchanged.

    M-RoPE (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): with ``mrope_section = (t, h, w)``,
    ``positions`` holds three rows (temporal, height, width) and frequency index i in
    ``[0, rotary_dim/2)`` takes its cos/sin from ``cos_sin_cache[positions[r(i), token]]``:
    sectioned (default), ``r(i) = 0`` for ``i < t``, 1 for ``t <= i < t + h``, 2 above;
    interleaved (``mrope_interleaved=True``), ``r(i) = 1`` if ``i % 3 == 1 and i < 3h``,
    2 if ``i % 3 == 2 and i < 3w``, else 0. With the three rows equal this is plain RoPE.

    Parameters:
        q: device array ``(num_tokens, num_q_heads, head_dim)`` or
            ``(batch, seq_len, num_q_heads, head_dim)``, float16, bfloat16 or float32.
            Only head_dim must be unit-stride: token and head strides are honoured (q
            may be a view of a fused QKV buffer); the token axes must flatten to one stride.
        k: ``(..., num_kv_heads, head_dim)`` with q's token axes, head_dim and dtype
            (num_kv_heads may differ: GQA/MQA), its own strides; or None. In place q
            and k must not share memory, with each other, ``positions`` or
            ``cos_sin_cache`` (out of place they are only read: any may share memory).
        positions: ``(num_tokens,)`` or ``(batch, seq_len)``, int32 or int64: each token's
            position (a row of the cache); any order, repeats allowed. With
            ``mrope_section``: ``(3, num_tokens)`` or ``(3, batch, seq_len)``, the
            temporal, height and width positions (any strides in whole elements; the
            token axes must flatten to one stride).
        cos_sin_cache: ``(max_position, rotary_dim)``, float32 or q's dtype, from
            :func:`rope_cos_sin_cache`: cos in columns ``[0, rotary_dim/2)``, sin in
            ``[rotary_dim/2, rotary_dim)``. rotary_dim is even and <= head_dim; unit
            last stride.
        is_neox: NeoX/Llama (HF) pairing if True, GPT-J/GGUF interleaved pairing if False.
        inplace: rotate q and k in place (default), or return new contiguous arrays.
        check_positions: raise if a position is outside ``[0, max_position)``. Costs one
            small min/max reduction and a device-to-host sync; pass False in hot loops
            and under CUDA-graph capture, where such tokens are left unchanged (with
            M-RoPE, a token any of whose three positions is out of range).
        mrope_section: None (one position per token), or 3 ints ``(t, h, w)`` >= 0
            summing to ``rotary_dim / 2``: a HF config's ``rope_scaling["mrope_section"]``
            (Qwen2.5-VL-7B: ``(16, 24, 24)``; :func:`cupykern.rope_scaling.mrope_parameters`
            reads it). Needs ``is_neox=True``.
        mrope_interleaved: the interleaved layout (Qwen3-VL's
            ``rope_scaling["mrope_interleaved"]``) instead of consecutive sections.

    Returns:
        ``(q_out, k_out)``: q and k themselves when ``inplace``, else new C-contiguous
        arrays of their shapes and dtype; ``k_out`` is None when ``k`` is None.

    Mutates: in place, dims ``[0, rotary_dim)`` of q and k (dims past rotary_dim and
        tokens with out-of-range positions are not written at all). Out of place,
        nothing but the new arrays (every dim written; bad-position tokens copied as is).

    Raises:
        TypeError: q/k/positions/cos_sin_cache not on the device (e.g. NumPy arrays:
            pass ``cupy.asarray(...)``), unsupported dtype, k or cache of another dtype
            than allowed, positions not int32/int64, ``is_neox``, ``inplace``,
            ``check_positions`` or ``mrope_interleaved`` not a bool.
        ValueError: wrong number of axes, non-unit head_dim stride, token axes that do
            not flatten, q/k with different token axes or head_dim, positions of the
            wrong shape (``(3, num_tokens)`` positions without ``mrope_section`` say
            so), odd rotary_dim or rotary_dim > head_dim, a position out of range (with
            ``check_positions``), an array on another GPU; ``mrope_section`` not 3 ints
            >= 0 summing to rotary_dim / 2, ``mrope_interleaved`` set without
            ``mrope_section``, M-RoPE with ``is_neox=False``; a size or stride
            (in elements) of 2**31 or more (the kernels' arguments are 32-bit); in place,
            q and k sharing memory with each other, ``positions`` or ``cos_sin_cache``.

    Notes:
        fp32 math from the cache's values, one rounding to the dtype per output
        element. Each token is independent of the batch it comes in. M-RoPE reads
        cos/sin one element at a time (an index's row depends on the index).

    References:
        RoFormer, Su et al. 2021 (arXiv:2104.09864); cos_sin_cache layout and pairings
        of vLLM's ``rotary_embedding`` and FlashInfer's
        ``apply_rope_with_cos_sin_cache``; GPT-J pairing as llama.cpp's ``rope``.
        M-RoPE: Qwen2-VL (Wang et al. 2024, arXiv:2409.12191); sectioned rule of HF
        transformers ``models/qwen2_vl/modeling_qwen2_vl.py``
        ``apply_multimodal_rotary_pos_emb`` and vLLM
        ``model_executor/layers/rotary_embedding/mrope.py`` ``MRotaryEmbedding``;
        interleaved rule of HF ``models/qwen3_vl/modeling_qwen3_vl.py``
        ``Qwen3VLTextRotaryEmbedding.apply_interleaved_mrope`` and vLLM's
        ``apply_interleaved_rope`` (same file as MRotaryEmbedding).
    """
    if mrope_section is not None:
        mrope_section = mrope_key(mrope_section)
    arrays, scalars = (q, k, positions, cos_sin_cache, None, None), (is_neox, inplace, mrope_section,
                                                                     mrope_interleaved)
    if _arrays.flag(check_positions, "check_positions"):
        arrays = _APPLY_ROPE.intake(arrays, scalars)
        _check_positions_in_range(arrays[2], arrays[3].shape[0])
    return _APPLY_ROPE(arrays, scalars)


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
        q_weight, k_weight: ``(head_dim,)`` of q's dtype, unit-stride. Neither they,
            ``positions`` nor ``cos_sin_cache`` may share memory with q or k (written).
        positions, cos_sin_cache, is_neox, check_positions: as in :func:`apply_rope`.
        eps: added to the mean square in fp32; 0 or at least 1.1754944e-38, the
            smallest normal float32 (a smaller one would be flushed to 0 on the GPU).

    Returns:
        ``(q, k)``, the same arrays, updated.

    Mutates: every dim of q and k (normalised; the first rotary_dim dims also rotated),
        except tokens whose position is out of range, which are left unchanged (not
        normalised either) when ``check_positions`` is False.

    Raises:
        TypeError: as :func:`apply_rope`; a weight of another dtype; k None.
        ValueError: as :func:`apply_rope`; a weight not of shape ``(head_dim,)`` or not
            unit-stride; ``eps`` < 0, not finite, or nonzero below 1.1754944e-38; q or k
            sharing memory with a weight, ``positions`` or ``cos_sin_cache``.

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
    arrays, scalars = (q, k, q_weight, k_weight, positions, cos_sin_cache), (eps, is_neox)
    if _arrays.flag(check_positions, "check_positions"):
        arrays = _QK_RMS_NORM_ROPE.intake(arrays, scalars)
        _check_positions_in_range(arrays[4], arrays[5].shape[0])
    return _QK_RMS_NORM_ROPE(arrays, scalars)
