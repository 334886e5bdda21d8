"""Plain-CuPy compositions of the ops' math: the baseline every cupykern kernel must beat.

The way one writes these ops without cupykern: several CuPy elementwise and reduction
launches with float32 temporaries, rounded once to the storage dtype at the end, so
they are checked against the float64 references like the kernels (up to fp32
summation order). The benchmarks time them beside the kernels (bench/), and the real
model runs on them with ``cupykern generate --ops plain`` (cupykern/llm/ops.py).
Signatures follow the ops'; in-place ops write their arguments as the kernels do.
"""

from __future__ import annotations

import cupy
import numpy as np


def _f32(a):
    return a.astype(np.float32)


def _store(y, out):
    """``y`` written into ``out`` when given, else returned as is."""
    if out is None:
        return y
    out[...] = y
    return out


def _rms(xf, weight, eps, weight_offset=0.0):
    scale = _f32(weight) + np.float32(weight_offset)  # Gemma's (1 + w), formed in fp32
    return xf * cupy.reciprocal(cupy.sqrt(cupy.mean(xf * xf, axis=-1, keepdims=True) + np.float32(eps))) * scale


def rms_norm(x, weight, eps=1e-6, *, weight_offset=0.0, out=None):
    """``x / sqrt(mean(x**2) + eps) * (weight + weight_offset)``."""
    return _store(_rms(_f32(x), weight, eps, weight_offset).astype(x.dtype), out)


def fused_add_rms_norm(x, residual, weight, eps=1e-6, *, weight_offset=0.0):
    """In place: ``residual <- round(x + residual)``, ``x <- rms_norm(residual)``."""
    residual[...] = (_f32(x) + _f32(residual)).astype(x.dtype)
    x[...] = _rms(_f32(residual), weight, eps, weight_offset).astype(x.dtype)
    return x, residual


def layer_norm(x, weight, bias, eps=1e-5, *, out=None):
    """``(x - mean) / sqrt(var + eps) * weight + bias`` (two-pass variance)."""
    xf = _f32(x)
    centered = xf - cupy.mean(xf, axis=-1, keepdims=True)
    y = centered * cupy.reciprocal(cupy.sqrt(cupy.mean(centered * centered, axis=-1, keepdims=True) + np.float32(eps)))
    if weight is not None:
        y = y * _f32(weight)
    if bias is not None:
        y = y + _f32(bias)
    return _store(y.astype(x.dtype), out)


def softmax(x, *, out=None):
    """Max-subtracted softmax over the last axis, float32 (or ``out``'s dtype)."""
    xf = _f32(x)
    e = cupy.exp(xf - cupy.max(xf, axis=-1, keepdims=True))
    return _store(e / cupy.sum(e, axis=-1, keepdims=True), out)


def silu_and_mul(x, *, out=None):
    """``silu(x[..., :d]) * x[..., d:]``."""
    d = x.shape[-1] // 2
    gate, up = _f32(x[..., :d]), _f32(x[..., d:])
    return _store((gate / (1 + cupy.exp(-gate)) * up).astype(x.dtype), out)


def _rotate(t, cos, sin, is_neox: bool):
    """In place: the pairs of t ``(tokens, heads, head_dim)`` rotated by cos/sin ``(tokens, rotary_dim / 2)``."""
    half = cos.shape[-1]
    first, second = (slice(0, half), slice(half, 2 * half)) if is_neox else (slice(0, 2 * half, 2),
                                                                            slice(1, 2 * half, 2))
    t1, t2 = _f32(t[..., first]), _f32(t[..., second])
    c, s = cos[:, None, :], sin[:, None, :]
    t[..., first] = (t1 * c - t2 * s).astype(t.dtype)
    t[..., second] = (t2 * c + t1 * s).astype(t.dtype)


def apply_rope(q, k, positions, cos_sin_cache, *, is_neox: bool = True):
    """In place on q ``(tokens, heads, head_dim)`` and k (or None): NeoX pairs (i, i + half)
    or GPT-J pairs (2i, 2i + 1), cos/sin gathered from the cache rows of ``positions``."""
    half = cos_sin_cache.shape[1] // 2
    rows = _f32(cos_sin_cache[positions])
    cos, sin = rows[:, :half], rows[:, half:]
    _rotate(q, cos, sin, is_neox)
    if k is not None:
        _rotate(k, cos, sin, is_neox)
    return q, k
