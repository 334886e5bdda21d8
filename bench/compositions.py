"""Plain-CuPy compositions of the same math: the baseline every cupykern op must beat.

Each takes the op's registry inputs and returns the same outputs (fp32 math, one
rounding to the dtype), so it is checked against the float64 reference like the
kernel before it is timed.
"""

from __future__ import annotations

import cupy
import numpy as np


def _f32(a):
    return a.astype(np.float32)


def _rms(xf, w, eps, weight_offset=0.0):
    scale = _f32(w) + np.float32(weight_offset)  # Gemma's (1 + w), formed in fp32
    return xf * cupy.reciprocal(cupy.sqrt(cupy.mean(xf * xf, axis=-1, keepdims=True) + np.float32(eps))) * scale


def rms_norm(i):
    out = _rms(_f32(i["x"]), i["weight"], i["eps"], i.get("weight_offset", 0.0)).astype(i["x"].dtype)
    if i.get("out") is not None:
        i["out"][...] = out
        out = i["out"]
    return (out,)


def fused_add_rms_norm(i):
    x, residual = i["x"], i["residual"]
    residual[...] = (_f32(x) + _f32(residual)).astype(x.dtype)
    x[...] = _rms(_f32(residual), i["weight"], i["eps"], i.get("weight_offset", 0.0)).astype(x.dtype)
    return x, residual


def layer_norm(i):
    xf = _f32(i["x"])
    centered = xf - cupy.mean(xf, axis=-1, keepdims=True)
    y = centered * cupy.reciprocal(cupy.sqrt(cupy.mean(centered * centered, axis=-1, keepdims=True)
                                             + np.float32(i["eps"])))
    y = (y * _f32(i["weight"]) + _f32(i["bias"])).astype(i["x"].dtype)
    if i.get("out") is not None:
        i["out"][...] = y
        y = i["out"]
    return (y,)


def softmax(i):
    xf = _f32(i["x"])
    e = cupy.exp(xf - cupy.max(xf, axis=-1, keepdims=True))
    y = e / cupy.sum(e, axis=-1, keepdims=True)
    if i.get("out") is not None:
        i["out"][...] = y
        y = i["out"]
    return (y,)


def silu_and_mul(i):
    x = i["x"]
    d = x.shape[-1] // 2
    gate, up = _f32(x[..., :d]), _f32(x[..., d:])
    y = (gate / (1 + cupy.exp(-gate)) * up).astype(x.dtype)
    if i.get("out") is not None:
        i["out"][...] = y
        y = i["out"]
    return (y,)


def _rotate_neox(t, cos, sin):
    """In-place NeoX rotation of t (tokens, heads, head_dim) by per-token cos/sin (tokens, half)."""
    half = cos.shape[-1]
    t1, t2 = _f32(t[..., :half]), _f32(t[..., half:2 * half])
    c, s = cos[:, None, :], sin[:, None, :]
    t[..., :half] = (t1 * c - t2 * s).astype(t.dtype)
    t[..., half:2 * half] = (t2 * c + t1 * s).astype(t.dtype)


def apply_rope(i):
    cache, positions = i["cos_sin_cache"], i["positions"]
    half = cache.shape[1] // 2
    rows = cache[positions]
    cos, sin = rows[:, :half], rows[:, half:]
    _rotate_neox(i["q"], cos, sin)
    _rotate_neox(i["k"], cos, sin)
    return i["q"], i["k"]


def qk_rms_norm_then_apply_rope(i):
    """The unfused split: cupykern.rms_norm per head, then cupykern.apply_rope."""
    from cupykern import apply_rope as rope, rms_norm as norm

    norm(i["q"], i["q_weight"], i["eps"], out=i["q"])
    norm(i["k"], i["k_weight"], i["eps"], out=i["k"])
    return rope(i["q"], i["k"], i["positions"], i["cos_sin_cache"], check_positions=False)


#: op name -> composition
COMPOSITIONS = {
    "rms_norm": rms_norm,
    "fused_add_rms_norm": fused_add_rms_norm,
    "layer_norm": layer_norm,
    "softmax": softmax,
    "silu_and_mul": silu_and_mul,
    "apply_rope": apply_rope,
    "qk_rms_norm_rope": qk_rms_norm_then_apply_rope,
}

#: How each composition is labelled in tables.
LABELS = {"qk_rms_norm_rope": "rms_norm then apply_rope"}
