"""float64 references of kernels_cu/rope.cu: rope_cos_sin_cache, apply_rope, qk_rms_norm_rope.

The rotation is written as complex multiplication, ``(x1 + i x2) * (cos + i sin)``, on
pairs gathered by NumPy slicing: independent of the kernel's per-unit indexing. Arguments
are checked with the kernels' own checks (reference/_common.py: same errors, same messages).
"""

from __future__ import annotations

import math

import numpy as np

from cupykern import _arrays
from cupykern import rope_scaling as _scaling
from cupykern.ops import rope as _kernels
from cupykern.reference._common import check, f64, host
from cupykern.reference.norm import _rms_norm

__all__ = ["apply_rope", "qk_rms_norm_rope", "rope_cos_sin_cache"]


def rope_cos_sin_cache(max_position: int, rotary_dim: int, base: float = 10000.0, *, rope_scaling=None) -> np.ndarray:
    """The ``(max_position, rotary_dim)`` cos/sin table in float64, unrounded
    (cupykern/rope_scaling.py; RoFormer arXiv:2104.09864 and the HF scalings)."""
    return _scaling.cos_sin_table(max_position, rotary_dim, base, rope_scaling, dtype=np.float64)


def _rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, is_neox: bool) -> np.ndarray:
    """x ``(tokens, heads, head_dim)`` float64 with its first ``2 * cos.shape[1]`` dims
    rotated by the per-token angles (cos, sin ``(tokens, rotary_dim / 2)``)."""
    half = cos.shape[-1]
    rotary = 2 * half
    if is_neox:
        z = x[..., :half] + 1j * x[..., half:rotary]
    else:
        z = x[..., 0:rotary:2] + 1j * x[..., 1:rotary:2]
    z = z * (cos + 1j * sin)[:, None, :]
    out = x.copy()
    if is_neox:
        out[..., :half], out[..., half:rotary] = z.real, z.imag
    else:
        out[..., 0:rotary:2], out[..., 1:rotary:2] = z.real, z.imag
    return out


def _check_positions(positions, cos_sin_cache) -> None:
    pos = host(positions)
    if pos.size:
        _kernels.check_position_range(int(pos.min()), int(pos.max()), host(cos_sin_cache).shape[0])


def apply_rope(q, k, positions, cos_sin_cache, *, is_neox: bool = True, check_positions: bool = True,
               mrope_section=None, mrope_interleaved: bool = False):
    """Rotary embedding in float64: ``(q_out, k_out)`` (``k_out`` None when ``k`` is None).

    q ``(num_tokens, num_q_heads, head_dim)`` or ``(batch, seq_len, heads, head_dim)``
    with positions of the leading shape; the cache's own values (as stored, e.g.
    rounded to float32) give cos and sin. Pairs are (i, i + rotary_dim/2) for NeoX,
    (2i, 2i+1) otherwise (RoFormer, arXiv:2104.09864). Dims past rotary_dim are
    returned unchanged, and so are tokens whose position is outside
    ``[0, max_position)`` with ``check_positions=False`` (else a ValueError, as the kernel).

    M-RoPE (``mrope_section = (t, h, w)``, positions ``(3, *token_shape)``): the three
    rows' cache rows are gathered and spliced as Hugging Face does it: sectioned,
    ``cat([cos_r[..., sec_r] for r in 0, 1, 2])`` over consecutive sections
    (``apply_multimodal_rotary_pos_emb`` of HF Qwen2-VL); interleaved, the temporal row
    with indices ``1:3h:3`` from the height row and ``2:3w:3`` from the width row
    (``apply_interleaved_mrope`` of HF Qwen3-VL). A token any of whose positions is
    out of range is unchanged.

    Raises: what :func:`cupykern.apply_rope` with ``inplace=False`` raises for such
    arguments (the reference writes nothing).
    """
    if isinstance(mrope_section, list):
        mrope_section = tuple(mrope_section)
    checking = _arrays.flag(check_positions, "check_positions")  # before the arrays, as the op
    check("apply_rope", q=q, k=k, positions=positions, cos_sin_cache=cos_sin_cache, is_neox=is_neox, inplace=False,
          mrope_section=mrope_section, mrope_interleaved=mrope_interleaved)
    if checking:
        _check_positions(positions, cos_sin_cache)
    return _apply_rope(q, k, positions, cos_sin_cache, is_neox, mrope_section, bool(mrope_interleaved))


def _cos_sin(positions, cos_sin_cache, mrope_section=None, mrope_interleaved: bool = False):
    """(cos, sin, valid): ``(tokens, rotary_dim / 2)`` float64 angles' cos/sin of each
    token (1 and 0 where invalid) and whether the token is rotated."""
    cache = f64(cos_sin_cache)
    half = cache.shape[1] // 2
    pos = host(positions).astype(np.int64)
    pos = pos.reshape(3, -1) if mrope_section is not None else pos.reshape(1, -1)
    valid = ((pos >= 0) & (pos < cache.shape[0])).all(axis=0)
    if cache.shape[0] == 0:  # no row to gather: every token is out of range (helper 76)
        cache = np.zeros((1, cache.shape[1]))
    rows = cache[np.where(valid[None, :], pos, 0)]  # (1 or 3, tokens, rotary_dim)
    cos_r, sin_r = rows[..., :half], rows[..., half:]
    if mrope_section is None:
        cos, sin = cos_r[0], sin_r[0]
    elif not mrope_interleaved:
        bounds = np.cumsum((0, *mrope_section))
        cos = np.concatenate([cos_r[r][:, bounds[r]:bounds[r + 1]] for r in range(3)], axis=-1)
        sin = np.concatenate([sin_r[r][:, bounds[r]:bounds[r + 1]] for r in range(3)], axis=-1)
    else:
        cos, sin = cos_r[0].copy(), sin_r[0].copy()
        for r, offset in ((1, 1), (2, 2)):
            cut = slice(offset, 3 * mrope_section[r], 3)
            cos[:, cut], sin[:, cut] = cos_r[r][:, cut], sin_r[r][:, cut]
    cos = np.where(valid[:, None], cos, 1.0)
    sin = np.where(valid[:, None], sin, 0.0)
    return cos, sin, valid


def _apply_rope(q, k, positions, cos_sin_cache, is_neox: bool, mrope_section=None, mrope_interleaved: bool = False):
    cos, sin, valid = _cos_sin(positions, cos_sin_cache, mrope_section, mrope_interleaved)

    def one(x):
        if x is None:
            return None
        x = f64(x)
        flat = x.reshape(math.prod(x.shape[:-2]), *x.shape[-2:])  # -1 is ambiguous with no heads
        out = _rotate(flat, cos, sin, is_neox)
        out[~valid] = flat[~valid]  # exact pass-through, even for inf/NaN inputs
        return out.reshape(x.shape)

    return one(q), one(k)


def qk_rms_norm_rope(q, k, q_weight, k_weight, positions, cos_sin_cache, eps: float = 1e-6, *,
                     is_neox: bool = True, check_positions: bool = True):
    """Per-head RMSNorm (over head_dim, with q_weight / k_weight) then :func:`apply_rope`,
    float64: ``(q_out, k_out)``. With ``check_positions=False``, tokens with an
    out-of-range position are unchanged (not normalised either), as the kernel leaves them.

    Raises: what :func:`cupykern.qk_rms_norm_rope` raises for such arguments.
    """
    checking = _arrays.flag(check_positions, "check_positions")  # before the arrays, as the op
    check("qk_rms_norm_rope", q=q, k=k, q_weight=q_weight, k_weight=k_weight, positions=positions,
          cos_sin_cache=cos_sin_cache, eps=eps, is_neox=is_neox)
    if checking:
        _check_positions(positions, cos_sin_cache)
    pos = host(positions).astype(np.int64)
    valid = ((pos >= 0) & (pos < host(cos_sin_cache).shape[0]))[..., None, None]
    q_norm = np.where(valid, _rms_norm(q, q_weight, eps, 0.0), f64(q))
    k_norm = np.where(valid, _rms_norm(k, k_weight, eps, 0.0), f64(k))
    return _apply_rope(q_norm, k_norm, positions, cos_sin_cache, is_neox)
