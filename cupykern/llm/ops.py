"""The per-op switch of the GPU forward: cupykern's kernels, or plain-CuPy compositions.

Both sets compute the same math with the same numerics (fp32 arithmetic, one rounding
to the storage dtype per output), so swapping them changes speed, not results (up to
fp32 summation order inside a reduction). Each set has:

* ``rms_norm(x, weight, eps) -> y`` (new array);
* ``fused_add_rms_norm(x, residual, weight, eps) -> (x, residual)``, in place:
  ``residual <- round(x + residual)``, ``x <- rms_norm(residual)``;
* ``apply_rope(q, k, positions, cos_sin_cache)``: in place on q ``(T, H, D)`` and k
  ``(T, KV, D)`` (views of the fused QKV buffer), GGUF/GPT-J pairs (2i, 2i+1)
  (``is_neox=False``);
* ``silu_and_mul(x) -> silu(x[:, :d]) * x[:, d:]`` (new array);
* ``softmax(x) -> float32`` over the last axis (attention probabilities).

``KERNELS`` runs one cupykern launch per op; ``PLAIN`` is the same math as several
CuPy elementwise/reduction launches (the way one would write it without cupykern).
"""

from __future__ import annotations

import numpy as np


class KernelOps:
    """cupykern's fused kernels (``cupykern.rms_norm`` and friends)."""

    name = "cupykern"

    @staticmethod
    def rms_norm(x, weight, eps):
        import cupykern

        return cupykern.rms_norm(x, weight, eps)

    @staticmethod
    def fused_add_rms_norm(x, residual, weight, eps):
        import cupykern

        return cupykern.fused_add_rms_norm(x, residual, weight, eps)

    @staticmethod
    def apply_rope(q, k, positions, cos_sin_cache):
        import cupykern

        # Positions come from the KV-cache length and are checked against the table
        # once per forward by the model, so the per-call min/max sync is skipped.
        return cupykern.apply_rope(q, k, positions, cos_sin_cache, is_neox=False, check_positions=False)

    @staticmethod
    def silu_and_mul(x):
        import cupykern

        return cupykern.silu_and_mul(x)

    @staticmethod
    def softmax(x):
        import cupykern

        return cupykern.softmax(x)


def _f32(a):
    return a.astype(np.float32)


def _rms(xf, weight, eps):
    import cupy

    return xf * cupy.reciprocal(cupy.sqrt(cupy.mean(xf * xf, axis=-1, keepdims=True) + np.float32(eps))) * _f32(weight)


def _rotate_pairs(t, cos, sin):
    """In place: adjacent pairs (2i, 2i+1) of t ``(T, heads, D)`` rotated by cos/sin ``(T, rotary_dim/2)``."""
    rotary = 2 * cos.shape[-1]
    even, odd = _f32(t[..., 0:rotary:2]), _f32(t[..., 1:rotary:2])
    c, s = cos[:, None, :], sin[:, None, :]
    t[..., 0:rotary:2] = (even * c - odd * s).astype(t.dtype)
    t[..., 1:rotary:2] = (odd * c + even * s).astype(t.dtype)


class PlainOps:
    """The same ops as CuPy compositions (several launches each, fp32 temporaries)."""

    name = "plain CuPy"

    @staticmethod
    def rms_norm(x, weight, eps):
        return _rms(_f32(x), weight, eps).astype(x.dtype)

    @staticmethod
    def fused_add_rms_norm(x, residual, weight, eps):
        residual[...] = (_f32(x) + _f32(residual)).astype(x.dtype)
        x[...] = _rms(_f32(residual), weight, eps).astype(x.dtype)
        return x, residual

    @staticmethod
    def apply_rope(q, k, positions, cos_sin_cache):
        half = cos_sin_cache.shape[1] // 2
        rows = _f32(cos_sin_cache[positions])
        cos, sin = rows[:, :half], rows[:, half:]
        _rotate_pairs(q, cos, sin)
        _rotate_pairs(k, cos, sin)
        return q, k

    @staticmethod
    def silu_and_mul(x):
        import cupy

        d = x.shape[-1] // 2
        gate, up = _f32(x[..., :d]), _f32(x[..., d:])
        return (gate / (1 + cupy.exp(-gate)) * up).astype(x.dtype)

    @staticmethod
    def softmax(x):
        import cupy

        xf = _f32(x)
        e = cupy.exp(xf - cupy.max(xf, axis=-1, keepdims=True))
        return e / cupy.sum(e, axis=-1, keepdims=True)


KERNELS = KernelOps()
PLAIN = PlainOps()

#: ``--ops`` names -> op set.
OP_SETS = {"cupykern": KERNELS, "plain": PLAIN}
