"""Decode-size matrix products with fused norm and epilogue (kernels_cu/gemv.cu):
gemv, gemv_add_residual, rms_norm_gemv, rms_norm_gemv_silu_and_mul.

A decode step multiplies 1-16 token rows by each weight matrix; cuBLAS is slow to start
for so few rows and cannot run inside a CUDA graph that CuPy captures (its calls raise
during capture). These kernels read each weight row once with one warp, accumulate in
fp32 and fuse what sits around the product in a Llama layer: the RMSNorm before it (QKV,
gate/up, LM head), the SiLU gate after it, the residual add after it (o_proj, down).
"""

from __future__ import annotations

import numpy as np

from cupykern import _arrays, _dtypes, launcher, plans
from cupykern.jit import KernelTemplate
from cupykern.ops import attention as _attention
from cupykern.ops import rope as _rope

__all__ = ["gemv", "gemv_add_residual", "rms_norm_gemv", "rms_norm_gemv_rope_kv_append", "rms_norm_gemv_silu_and_mul"]

GEMV = KernelTemplate("gemv.cu", "gemv_kernel", dependent_launch=True)
QKV_ROPE = KernelTemplate("gemv.cu", "rms_norm_gemv_rope_kv_append_kernel", dependent_launch=True)

#: kEpilogue of gemv_kernel (gemv.cu).
GEMV_EPILOGUES = {"store": 0, "add_residual": 1, "silu_and_mul": 2}

#: (kNorm, epilogue, float32 output allowed) of each op.
_VARIANTS = {
    "gemv": (False, "store", True),
    "gemv_add_residual": (False, "add_residual", False),
    "rms_norm_gemv": (True, "store", True),
    "rms_norm_gemv_silu_and_mul": (True, "silu_and_mul", False),
}


def _template_args(dtype, out_dtype, norm: bool, epilogue: str, vec_width: int, max_tokens: int, ahead: int,
                   rows_per_warp: int) -> tuple:
    return (_dtypes.c_type(dtype), _dtypes.c_type(out_dtype), norm, GEMV_EPILOGUES[epilogue], vec_width, max_tokens,
            ahead, rows_per_warp)


def _warp_shapes(epilogue: str) -> list[tuple[int, int]]:
    """(kAhead, kRowsPerWarp) pairs plan_gemv can pick for an epilogue."""
    shapes = [(plans.GEMV_AHEAD, 1)]
    if epilogue != "silu_and_mul" and plans.GEMV_MANY_ROWS_PER_WARP > 1:
        shapes.append((plans.GEMV_MANY_ROWS_AHEAD, plans.GEMV_MANY_ROWS_PER_WARP))
    return shapes


def instantiations() -> dict[KernelTemplate, list[str]]:
    """Every instantiation of this family: variant x dtype (x float32 output) x vector x
    max tokens x rows per warp."""
    exprs = []
    for norm, epilogue, f32_out in _VARIANTS.values():
        for d in _dtypes.DTYPES:
            for out_dtype in sorted({d, _dtypes.float32} if f32_out else {d}, key=str):
                for v in sorted({1, _dtypes.vec_width(d)}):
                    exprs += [GEMV.expr(*_template_args(d, out_dtype, norm, epilogue, v, m, ahead, rows))
                              for m in plans.GEMV_MAX_TOKENS for ahead, rows in _warp_shapes(epilogue)]
    qkv_rope = [QKV_ROPE.expr(_dtypes.c_type(d), "float", idx, neox, v, m, plans.GEMV_AHEAD) for d in _dtypes.DTYPES
                for idx in _dtypes.INDEX_C_TYPES.values() for neox in (False, True)
                for v in sorted({1, _dtypes.vec_width(d)}) for m in plans.GEMV_MAX_TOKENS]
    return {GEMV: exprs, QKV_ROPE: qkv_rope}


# ----------------------------------------------------------------- intake and plan
def _weight(sig, name: str, dtype, k: int, rows: int, what: str) -> tuple[_arrays.Sig, int]:
    """A weight matrix ``(rows, k)`` of ``dtype`` with a unit-stride last axis; returns it
    and its row stride in elements."""
    sig = _arrays.required(sig, name, f"a device array ({what})")
    _arrays.check_dtype(sig, dtype, name, "the dtype of x")
    if len(sig.shape) != 2:
        raise ValueError(f"{name}: expected a 2-d array ({what}), got shape {tuple(sig.shape)}")
    _arrays.check_shape(sig, (rows, k), name)
    _arrays.element_aligned(sig, name)
    w_rows = _arrays.rows_of(sig, name)
    return sig, w_rows.row_stride


def _out_dtype(value, dtype, f32_allowed: bool):
    if value is None:
        return dtype
    try:
        out_dtype = np.dtype(value)
    except TypeError:
        raise TypeError(f"out_dtype: expected None, x's dtype or float32, got {value!r}") from None
    if out_dtype != dtype and not (f32_allowed and out_dtype == _dtypes.float32):
        raise TypeError(f"out_dtype: expected None, float32 or x's dtype ({dtype}), got {out_dtype}")
    return out_dtype


def _prepare(op: str):
    norm, epilogue, f32_allowed = _VARIANTS[op]
    silu = epilogue == "silu_and_mul"
    residual_out = epilogue == "add_residual"
    weight_name = "gate_up_weight" if silu else "weight"

    def prepare(a: launcher.Args) -> launcher.Launch:
        x, rows = _arrays.row_input(a.x)
        if x.dtype not in _dtypes.DTYPES:
            _arrays.supported_dtype(x, "x")
        k = rows.hidden_size
        w_sig = _arrays.required(getattr(a, weight_name), weight_name, "a device array (n, k)")
        if len(w_sig.shape) != 2:
            raise ValueError(f"{weight_name}: expected a 2-d array (out_features, {k}), got shape "
                             f"{tuple(w_sig.shape)}")
        n_rows = w_sig.shape[0]
        if silu and n_rows % 2:
            raise ValueError(f"{weight_name}: expected an even number of rows (gate rows, then up rows), got "
                             f"{n_rows}")
        n_out = n_rows // 2 if silu else n_rows
        what = f"{'2 * d' if silu else 'out_features'}, {k}"
        weight, w_stride = _weight(w_sig, weight_name, x.dtype, k, n_rows, what)
        norm_weight = (_arrays.vector(a.norm_weight, "norm_weight", x.dtype, k, what="the dtype of x")
                       if norm else None)
        eps = _arrays.eps(a.eps) if norm else np.float32(0)
        out_shape = (*x.shape[:-1], n_out)
        if residual_out:
            out = _arrays.required(a.residual, "residual", f"a device array {out_shape}")
            _arrays.check_dtype(out, x.dtype, "residual", "the dtype of x")
            _arrays.check_shape(out, out_shape, "residual")
            _arrays.element_aligned(out, "residual")
            out_name, allocate = "residual", ()
        else:
            out_dtype = _out_dtype(a.out_dtype, x.dtype, True) if f32_allowed else x.dtype
            out, allocate = launcher.output(a.out, "out", out_shape, out_dtype)
            out_name = "out"
        out_rows = _arrays.written_rows(out, out_name)
        most_rows = plans.gemv_token_choices()[-1]
        if rows.num_rows > most_rows:
            raise ValueError(f"x: {op} takes at most {most_rows} rows (decode-size batches), got "
                             f"{rows.num_rows}; use cupy.matmul for more")
        disjoint = tuple(launcher.Disjoint(name, out_name) for name in ("x", weight_name, "norm_weight")
                         if name != "norm_weight" or norm)
        if rows.num_rows == 0 or n_out == 0:
            return launcher.Launch(None, allocate=allocate, returns=out_name)
        vw = _dtypes.vec_width(x.dtype)
        aligned = k % vw == 0 and _arrays.vector_aligned(vw, (x, rows.row_stride), (weight, w_stride),
                                                         (norm_weight, 0))
        plan = plans.plan_gemv(rows.num_rows, n_out, x.dtype, aligned=aligned, limits=a.limits,
                               overrides=a.overrides, op=op, many_rows=not silu)
        return launcher.Launch(
            GEMV, _template_args(x.dtype, out.dtype, norm, epilogue, plan.vec_width, plan.max_tokens, plan.ahead,
                                 plan.rows_per_warp),
            plan,
            pointers=(out_name, "x", weight_name, "norm_weight" if norm else "x"),
            scalars=(np.int32(rows.num_rows), *map(np.int64, (k, n_out, rows.row_stride, w_stride,
                                                              out_rows.row_stride)), eps),
            allocate=allocate, returns=out_name, disjoint=disjoint)
    return prepare


_GEMV = launcher.Op("gemv", arrays=("x", "weight", "out"), scalars=("out_dtype",), prepare=_prepare("gemv"),
                    plan_kind="gemv")
_GEMV_ADD_RESIDUAL = launcher.Op("gemv_add_residual", arrays=("x", "weight", "residual"),
                                 prepare=_prepare("gemv_add_residual"), plan_kind="gemv")
_RMS_NORM_GEMV = launcher.Op("rms_norm_gemv", arrays=("x", "norm_weight", "weight", "out"),
                             scalars=("eps", "out_dtype"), prepare=_prepare("rms_norm_gemv"), plan_kind="gemv")
_RMS_NORM_GEMV_SILU_AND_MUL = launcher.Op("rms_norm_gemv_silu_and_mul",
                                          arrays=("x", "norm_weight", "gate_up_weight", "out"), scalars=("eps",),
                                          prepare=_prepare("rms_norm_gemv_silu_and_mul"), plan_kind="gemv")


def _prepare_qkv_rope(a: launcher.Args) -> launcher.Launch:
    op = "rms_norm_gemv_rope_kv_append"
    x, rows = _arrays.row_input(a.x)
    k = rows.hidden_size
    norm_weight = _arrays.vector(a.norm_weight, "norm_weight", x.dtype, k, what="the dtype of x")
    kc_sig = _arrays.required(a.k_cache, "k_cache", "a device array (max_tokens, num_kv_heads, head_dim)")
    if len(kc_sig.shape) != 3 or kc_sig.shape[1] < 1 or kc_sig.shape[2] < 2 or kc_sig.shape[2] % 2:
        raise ValueError(f"k_cache: expected shape (max_tokens, num_kv_heads, head_dim) with an even head_dim, got "
                         f"{tuple(kc_sig.shape)}")
    _, num_kv_heads, head_dim = kc_sig.shape
    w_sig = _arrays.required(a.qkv_weight, "qkv_weight", "a device array ((num_heads + 2 * num_kv_heads) * head_dim, k)")
    rows_w = w_sig.shape[0] if len(w_sig.shape) == 2 else 0
    num_heads = rows_w // head_dim - 2 * num_kv_heads if rows_w % head_dim == 0 else 0
    if num_heads < 1:
        raise ValueError(f"qkv_weight: expected ((num_heads + 2 * {num_kv_heads}) * {head_dim}, {k}) rows (q, k, v "
                         f"heads of k_cache's head_dim), got shape {tuple(w_sig.shape)}")
    weight, w_stride = _weight(w_sig, "qkv_weight", x.dtype, k, rows_w, f"(num_heads + 2 * num_kv_heads) * head_dim, {k}")
    kc, vc = _attention._kv_caches(kc_sig, a.v_cache, x.dtype, num_kv_heads, head_dim, "the dtype of x")
    positions = _attention._positions(a.positions, rows.num_rows)
    table, rotary_dim, table_stride = _rope._cache(a.cos_sin_cache, x.dtype, head_dim)
    if table.dtype != _dtypes.float32 or table_stride != rotary_dim:
        raise ValueError(f"cos_sin_cache: expected C-contiguous float32 rows of {rotary_dim} values, got dtype "
                         f"{table.dtype} and a row stride of {table_stride}")
    eps = _arrays.eps(a.eps)
    is_neox = _arrays.flag(a.is_neox, "is_neox")
    q_out, allocate = launcher.output(a.q_out, "q_out", (*x.shape[:-1], num_heads, head_dim), x.dtype)
    if len(q_out.shape) != 3:
        raise ValueError(f"x: expected shape (num_tokens, k), got {tuple(x.shape)}")
    qh = _arrays.heads(q_out, "q_out")
    _arrays.distinct_heads(qh, "q_out")
    most_rows = plans.gemv_token_choices()[-1]
    if rows.num_rows > most_rows:
        raise ValueError(f"x: {op} takes at most {most_rows} rows (decode-size batches), got {rows.num_rows}")
    written = ("q_out", "k_cache", "v_cache")
    disjoint = (*(launcher.Disjoint(r, w) for w in written
                  for r in ("x", "norm_weight", "qkv_weight", "positions", "cos_sin_cache")),
                launcher.Disjoint("q_out", "k_cache"), launcher.Disjoint("q_out", "v_cache"),
                launcher.Disjoint("k_cache", "v_cache"))
    if rows.num_rows == 0:
        return launcher.Launch(None, allocate=allocate, returns=written)
    units = (num_heads + 2 * num_kv_heads) * head_dim // 2
    vw = _dtypes.vec_width(x.dtype)
    aligned = k % vw == 0 and _arrays.vector_aligned(vw, (x, rows.row_stride), (weight, w_stride), (norm_weight, 0))
    plan = plans.plan_gemv(rows.num_rows, units, x.dtype, aligned=aligned, limits=a.limits, overrides=a.overrides,
                           op=op)
    return launcher.Launch(
        QKV_ROPE, (_dtypes.c_type(x.dtype), "float", _dtypes.INDEX_C_TYPES[positions.dtype], is_neox,
                   plan.vec_width, plan.max_tokens, plans.GEMV_AHEAD), plan,
        pointers=("q_out", "k_cache", "v_cache", "x", "qkv_weight", "norm_weight", "positions", "cos_sin_cache"),
        scalars=(np.int32(rows.num_rows), np.int64(k), *map(np.int32, (num_heads, num_kv_heads, head_dim, rotary_dim)),
                 *map(np.int64, (rows.row_stride, w_stride, qh.token_stride, qh.head_stride, kc.token_stride,
                                 kc.head_stride, vc.token_stride, vc.head_stride, table.shape[0], kc.num_tokens)),
                 eps),
        allocate=allocate, returns=written, disjoint=disjoint)


_QKV_ROPE = launcher.Op("rms_norm_gemv_rope_kv_append",
                        arrays=("x", "norm_weight", "qkv_weight", "positions", "cos_sin_cache", "k_cache", "v_cache",
                                "q_out"),
                        scalars=("eps", "is_neox"), prepare=_prepare_qkv_rope, plan_kind="gemv")


# ----------------------------------------------------------------- public API
def gemv(x, weight, *, out=None, out_dtype=None):
    """Decode-size matrix product ``out = x @ weight.T`` (1-16 rows; fp32 accumulation).

    Parameters:
        x: device array ``(..., k)`` with at most 16 rows (the leading axes' product),
            float16, bfloat16 or float32; unit-stride last axis, rows one stride apart.
        weight: ``(n, k)`` of x's dtype (a ``torch.nn.Linear`` weight: out_features x
            in_features), unit-stride rows, any row stride.
        out: optional ``(..., n)`` array to write into (of ``out_dtype``).
        out_dtype: None (x's dtype) or float32 (unrounded fp32 sums, e.g. logits).

    Returns:
        ``out`` (allocated if not given), shape ``(..., n)``.

    Mutates: ``out`` only.

    Raises:
        TypeError: a non-device or NumPy array; dtypes that differ or are unsupported;
            an ``out_dtype`` other than x's dtype or float32.
        ValueError: ``weight`` not 2-d or of another ``k``; more than 16 rows; a wrong
            ``out`` shape; layouts as :func:`cupykern.rms_norm` (but for its ``2**31``
            limits); ``out`` overlapping an
            input; an array on another GPU.

    Notes:
        fp32 accumulation: each lane sums its 16-byte slices of the row in index order,
        then a butterfly over the warp adds the 32 lanes, an order fixed by ``k`` alone:
        a token's result is the same bits in any batch (1 to 16 rows). Rounded once to
        the output dtype. Runs in a captured CUDA graph (no cuBLAS).

    References:
        The decode GEMV of vLLM and llama.cpp's ``mul_mat_vec`` (one warp per output row).
    """
    return _GEMV((x, weight, out), (out_dtype,))


def gemv_add_residual(x, weight, residual):
    """``residual += x @ weight.T`` in place, rounded once.

    ``residual = round(residual + x @ weight.T)`` with the fp32 product: the residual
    update of a Llama layer after o_proj and down_proj (the add half of vLLM's
    ``fused_add_rms_norm``, moved into the GEMV's epilogue). An unfused GEMM + add
    rounds twice (the product to the dtype, then the sum); one rounding is closer to
    the exact value, by up to a unit in the last place of the product where the add
    cancels.

    Parameters:
        x: device array ``(..., k)``, at most 16 rows, float16, bfloat16 or float32.
        weight: ``(n, k)`` of x's dtype, unit-stride rows.
        residual: ``(..., n)`` of x's dtype, updated in place; must not overlap x or weight.

    Returns:
        ``residual``.

    Mutates: ``residual`` only.

    Raises:
        TypeError, ValueError: as :func:`gemv` (``residual`` in place of ``out``).

    Notes:
        fp32 accumulation: each lane sums its 16-byte slices of the row in index order,
        then a butterfly over the warp adds the 32 lanes, an order fixed by ``k`` alone:
        a token's result is the same bits in any batch (1 to 16 rows).

    References:
        Residual stream of Llama (Touvron et al. 2023, arXiv:2302.13971); the epilogue
        fusion of the "no bubbles" megakernel (Hazy Research, 2025).
    """
    return _GEMV_ADD_RESIDUAL((x, weight, residual))


def rms_norm_gemv(x, norm_weight, weight, eps=1e-6, *, out=None, out_dtype=None):
    """``out = rms_norm(x, norm_weight, eps) @ weight.T`` in one launch (1-16 rows).

    The normalised row ``xn = round(x / sqrt(mean(x**2) + eps) * norm_weight)`` is rounded
    to x's dtype as :func:`cupykern.rms_norm` stores it, then multiplied with fp32
    accumulation: the QKV projection after a layer's input norm, or the LM head after
    the final norm (``out_dtype=float32``: logits not rounded to 16 bits).

    Parameters:
        x: device array ``(..., k)``, at most 16 rows, float16, bfloat16 or float32.
        norm_weight: ``(k,)`` of x's dtype, the RMSNorm weight.
        weight: ``(n, k)`` of x's dtype, unit-stride rows.
        eps: finite, >= 0 (added to the mean square).
        out: optional ``(..., n)`` of ``out_dtype``.
        out_dtype: None (x's dtype) or float32.

    Returns:
        ``out`` (allocated if not given), shape ``(..., n)``.

    Mutates: ``out`` only.

    Raises:
        TypeError, ValueError: as :func:`gemv`; a ``norm_weight`` of another dtype or
            length; a bad ``eps``.

    Notes:
        The mean square is reduced by one warp per row in an order fixed by ``k``.
        fp32 accumulation: each lane sums its 16-byte slices of the row in index order,
        then a butterfly over the warp adds the 32 lanes, an order fixed by ``k`` alone:
        a token's result is the same bits in any batch (1 to 16 rows).

    References:
        RMSNorm, Zhang & Sennrich 2019 (arXiv:1910.07467); the fused norm + QKV
        instruction of the "no bubbles" megakernel (Hazy Research, 2025).
    """
    return _RMS_NORM_GEMV((x, norm_weight, weight, out), (eps, out_dtype))


def rms_norm_gemv_silu_and_mul(x, norm_weight, gate_up_weight, eps=1e-6, *, out=None):
    """A Llama MLP's first half in one launch: ``silu_and_mul(rms_norm(x) @ gate_up_weight.T)``.

    ``xn = round(rms_norm(x))`` as in :func:`rms_norm_gemv`; then for each ``j < d``
    ``out[..., j] = round(silu(g) * u)`` with the fp32 products ``g = xn .
    gate_up_weight[j]`` and ``u = xn . gate_up_weight[d + j]``: one rounding, where a
    GEMM writing the gate_up product followed by :func:`cupykern.silu_and_mul` rounds
    g and u first.

    Parameters:
        x: device array ``(..., k)``, at most 16 rows, float16, bfloat16 or float32.
        norm_weight: ``(k,)`` of x's dtype (the post-attention norm).
        gate_up_weight: ``(2 * d, k)`` of x's dtype: the d gate rows, then the d up rows.
        eps: finite, >= 0.
        out: optional ``(..., d)`` of x's dtype.

    Returns:
        ``out`` (allocated if not given), shape ``(..., d)``.

    Mutates: ``out`` only.

    Raises:
        TypeError, ValueError: as :func:`rms_norm_gemv`; an odd number of rows in
            ``gate_up_weight``.

    Notes:
        SiLU as :func:`cupykern.silu_and_mul` (fast intrinsics for 16-bit dtypes).
        fp32 accumulation: each lane sums its 16-byte slices of the row in index order,
        then a butterfly over the warp adds the 32 lanes, an order fixed by ``k`` alone:
        a token's result is the same bits in any batch (1 to 16 rows).

    References:
        SwiGLU, Shazeer 2020 (arXiv:2002.05202); RMSNorm, Zhang & Sennrich 2019
        (arXiv:1910.07467).
    """
    return _RMS_NORM_GEMV_SILU_AND_MUL((x, norm_weight, gate_up_weight, out), (eps,))


def rms_norm_gemv_rope_kv_append(x, norm_weight, qkv_weight, positions, cos_sin_cache, k_cache, v_cache, eps=1e-6, *,
                                 is_neox=True, q_out=None, check_positions=True):
    """The attention block's first launch: RMSNorm, the QKV product, RoPE and the KV-cache append.

    ``qkv = round(rms_norm(x)) @ qkv_weight.T`` split into ``num_heads`` q heads,
    ``num_kv_heads`` k heads and as many v heads of ``head_dim``; then, for token ``t``
    at ``p = positions[t]``: ``q_out[t] = rope(q)``, ``k_cache[p] = rope(k)``,
    ``v_cache[p] = v``, the fp32 products rotated and rounded once (the unfused
    :func:`rms_norm_gemv` then :func:`cupykern.rope_kv_append` round the product first).
    One warp computes both rows of a rotary pair, so the rotation happens in its
    epilogue.

    Parameters:
        x: device array ``(num_tokens, k)``, 1-16 rows, float16, bfloat16 or float32.
        norm_weight: ``(k,)`` of x's dtype (the layer's input norm).
        qkv_weight: ``((num_heads + 2 * num_kv_heads) * head_dim, k)`` of x's dtype: the
            q rows, then k, then v (Llama's fused QKV weight).
        positions: ``(num_tokens,)`` int32 or int64 device array.
        cos_sin_cache: ``(max_position, rotary_dim)`` float32, C-contiguous
            (:func:`cupykern.rope_cos_sin_cache`).
        k_cache, v_cache: ``(max_tokens, num_kv_heads, head_dim)`` of x's dtype; they
            give num_kv_heads and head_dim (even), and num_heads follows from qkv_weight.
        eps: finite, >= 0.
        is_neox: rotary pairs ``(i, i + rotary_dim / 2)`` (True) or ``(2i, 2i + 1)``
            (False, GGUF's permuted weights).
        q_out: optional ``(num_tokens, num_heads, head_dim)`` of x's dtype.
        check_positions: as :func:`cupykern.rope_kv_append` (False in a captured graph:
            a token outside the table or cache then gets its q unrotated and writes
            nothing; positions must then be distinct all the same).

    Returns:
        ``(q_out, k_cache, v_cache)`` (q_out allocated if not given).

    Mutates: ``q_out``, and row ``positions[t]`` of ``k_cache`` and ``v_cache``.

    Raises:
        TypeError: as :func:`rms_norm_gemv`; positions not int32/int64; ``is_neox`` not a
            bool; a cos_sin_cache of another dtype when x is float32 (ValueError below
            for a 16-bit x).
        ValueError: shapes that disagree (qkv_weight's rows not a whole number of heads
            of the caches' head_dim); a cos_sin_cache that is not float32 or not
            contiguous, or whose rotary_dim is odd or beyond head_dim; more than 16 rows;
            written arrays overlapping inputs or each other; a position out of range or
            repeated (with ``check_positions``).

    References:
        The "no bubbles" megakernel's first instruction (RMSNorm + QKV + RoPE + KV
        append; Hazy Research, 2025); RoPE, Su et al. 2021 (arXiv:2104.09864); vLLM's
        ``rotary_embedding`` + ``reshape_and_cache``.
    """
    arrays = (x, norm_weight, qkv_weight, positions, cos_sin_cache, k_cache, v_cache, q_out)
    scalars = (eps, is_neox)
    if _arrays.flag(check_positions, "check_positions"):
        checked = _QKV_ROPE.intake(arrays, scalars)
        _attention._check_cache_positions(checked[3], min(checked[4].shape[0], checked[5].shape[0]))
    return _QKV_ROPE(arrays, scalars)
