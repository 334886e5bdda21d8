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


def _rms(xf, w, eps):
    return xf * cupy.reciprocal(cupy.sqrt(cupy.mean(xf * xf, axis=-1, keepdims=True) + np.float32(eps))) * _f32(w)


def rms_norm(i):
    out = _rms(_f32(i["x"]), i["weight"], i["eps"]).astype(i["x"].dtype)
    if i.get("out") is not None:
        i["out"][...] = out
        out = i["out"]
    return (out,)


def fused_add_rms_norm(i):
    x, residual = i["x"], i["residual"]
    residual[...] = (_f32(x) + _f32(residual)).astype(x.dtype)
    x[...] = _rms(_f32(residual), i["weight"], i["eps"]).astype(x.dtype)
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


#: op name -> composition
COMPOSITIONS = {
    "rms_norm": rms_norm,
    "fused_add_rms_norm": fused_add_rms_norm,
    "layer_norm": layer_norm,
    "softmax": softmax,
}
