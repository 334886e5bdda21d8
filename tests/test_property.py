"""Property test on the GPU: random argument combinations against the float64 references.

Each case draws an op, a dtype, a token count from 0 up, a row size (odd ones too), and
for every array a layout: contiguous, rows farther apart than their length, or starting
a few elements into its buffer (so 16-byte vectors do not line up). Every array is a
view into its own buffer with guard bands around it, filled with finite noise. The case
passes when the outputs match the reference within the dtype's tolerance and nothing
outside the documented outputs changed: every byte of every buffer other than the
written views is compared with its copy from before the call.

Seeded: ``--seed`` (conftest) moves every case; a failure names the case's seed and its
draw, and ``_run_case(seed)`` replays that one case.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import cupy
import numpy as np
import pytest

import cupykern
from cupykern import _dtypes, reference, validation
from cupykern.reference._common import host

#: Cases per test run: a few thousand small calls (each a few milliseconds).
NUM_CASES = 2000
GUARD = 40  # elements of noise before and after each view, and between rows


@dataclass
class Buffer:
    """A view of ``shape`` inside a noisy buffer: rows ``row_pad`` elements apart beyond
    their length, starting ``offset`` elements after a guard band."""

    data: cupy.ndarray
    view: cupy.ndarray
    before: np.ndarray  # the buffer's bytes before the call

    @staticmethod
    def make(rng, shape, dtype, *, row_pad=0, offset=0, scale=1.0, loc=0.0):
        shape = tuple(shape)
        last = shape[-1] if shape else 1
        rows = math.prod(shape[:-1]) if len(shape) > 1 else 1
        width = last + row_pad
        n = GUARD + offset + rows * width + GUARD
        values = (rng.standard_normal(n) * scale + loc).astype(np.float32)
        data = cupy.asarray(values.astype(dtype))
        body = data[GUARD + offset: GUARD + offset + rows * width]
        if not shape:
            view = body[:1].reshape(())
        else:
            view = body.reshape(rows, width)[:, :last].reshape(shape)
        return Buffer(data, view, host(data).copy())

    def unchanged_outside(self, written: bool) -> str | None:
        """None if the buffer kept its bytes (outside the view when ``written``)."""
        now = host(self.data)
        mask = np.ones(now.shape, dtype=bool)
        if written and self.view.size:
            itemsize = self.data.itemsize
            base = self.data.data.ptr
            # Element indices of the view inside the buffer.
            index = np.zeros(self.view.shape, dtype=np.int64) + (self.view.data.ptr - base) // itemsize
            for axis, (n, s) in enumerate(zip(self.view.shape, self.view.strides)):
                shape = [1] * self.view.ndim
                shape[axis] = n
                index = index + (np.arange(n) * (s // itemsize)).reshape(shape)
            mask[index.ravel()] = False
        same = now.view(np.uint8).reshape(now.size, -1) == self.before.view(np.uint8).reshape(now.size, -1)
        bad = np.flatnonzero(~same.all(axis=1) & mask)  # bytes compared: NaN patterns too
        return None if bad.size == 0 else f"{bad.size} elements outside the written view changed (first at {bad[0]})"


def _layout(rng) -> dict:
    kind = rng.integers(3)
    return {"row_pad": int(rng.integers(1, 9)) if kind == 1 else 0, "offset": int(rng.integers(1, 8)) if kind == 2 else 0}


def _case_rows(rng, op, dtype):
    """(call, expected outputs, buffers, written buffers, rtol scale) of a row op; every
    case builder returns these, the expected outputs computed before the call."""
    num_tokens = int(rng.choice([0, 1, 2, 3, 7, 16, 33]))
    hidden = int(rng.choice([1, 5, 64, 127, 256, 577]))
    x = Buffer.make(rng, (num_tokens, hidden), dtype, **_layout(rng))
    weight = Buffer.make(rng, (hidden,), dtype, scale=0.1, loc=1.0, offset=int(rng.integers(0, 3)))
    eps = float(rng.choice([1e-6, 1e-5, 0.25]))
    give_out = op != "fused_add_rms_norm" and bool(rng.integers(2))  # fused_add_rms_norm works in place
    out = Buffer.make(rng, (num_tokens, hidden), dtype, **_layout(rng)) if give_out else None
    buffers, written = [x, weight], []
    if out is not None:
        buffers.append(out)
        written.append(out)
    if op == "rms_norm":
        def call():
            return (cupykern.rms_norm(x.view, weight.view, eps, out=out.view if out else None),)
        expected = (reference.rms_norm(x.view, weight.view, eps),)
    elif op == "layer_norm":
        bias = Buffer.make(rng, (hidden,), dtype, scale=0.1, offset=int(rng.integers(0, 3)))
        buffers.append(bias)

        def call():
            return (cupykern.layer_norm(x.view, weight.view, bias.view, eps, out=out.view if out else None),)
        expected = (reference.layer_norm(x.view, weight.view, bias.view, eps),)
    elif op == "fused_add_rms_norm":
        residual = Buffer.make(rng, (num_tokens, hidden), dtype, **_layout(rng))
        buffers.append(residual)
        written[:] = [x, residual]

        def call():
            return cupykern.fused_add_rms_norm(x.view, residual.view, weight.view, eps)
        expected = reference.fused_add_rms_norm(x.view, residual.view, weight.view, eps)
    else:  # softmax
        temperature = float(rng.uniform(0.5, 2.0))

        def call():
            return (cupykern.softmax(x.view, temperature=temperature, out=out.view if out else None),)
        expected = (reference.softmax(x.view, temperature=temperature),)
    return call, expected, buffers, written, 1.0


def _case_activation(rng, op, dtype):
    num_tokens = int(rng.choice([0, 1, 3, 16, 40]))
    d = int(rng.choice([1, 3, 8, 127, 1536]))
    x = Buffer.make(rng, (num_tokens, 2 * d), dtype, **_layout(rng))
    out = Buffer.make(rng, (num_tokens, d), dtype, **_layout(rng)) if rng.integers(2) else None
    buffers, written = [x] + ([out] if out else []), [out] if out else []

    def call():
        fn = cupykern.silu_and_mul if op == "silu_and_mul" else cupykern.gelu_and_mul
        return (fn(x.view, out=out.view if out else None),)
    ref = reference.silu_and_mul if op == "silu_and_mul" else reference.gelu_and_mul
    return call, (ref(x.view),), buffers, written, 1.0


def _case_gemv(rng, op, dtype):
    num_tokens = int(rng.choice([0, 1, 2, 5, 16]))
    k = int(rng.choice([8, 33, 64, 576, 1000]))
    n = int(rng.choice([1, 7, 64, 200]))
    x = Buffer.make(rng, (num_tokens, k), dtype, **_layout(rng))
    rows = 2 * n if op == "rms_norm_gemv_silu_and_mul" else n
    weight = Buffer.make(rng, (rows, k), dtype, scale=1 / math.sqrt(k), **_layout(rng))
    norm_weight = Buffer.make(rng, (k,), dtype, scale=0.1, loc=1.0)
    eps = float(rng.choice([1e-6, 1e-5]))
    buffers = [x, weight, norm_weight]
    if op == "gemv_add_residual":
        residual = Buffer.make(rng, (num_tokens, n), dtype, **_layout(rng))
        buffers.append(residual)
        expected = (reference.gemv_add_residual(x.view, weight.view, residual.view),)
        return (lambda: (cupykern.gemv_add_residual(x.view, weight.view, residual.view),)), expected, buffers, \
            [residual], 2.5 / 1.5
    out = Buffer.make(rng, (num_tokens, n), dtype, **_layout(rng)) if rng.integers(2) else None
    buffers += [out] if out else []
    if op == "gemv":
        expected = (reference.gemv(x.view, weight.view),)

        def call():
            return (cupykern.gemv(x.view, weight.view, out=out.view if out else None),)
    elif op == "rms_norm_gemv":
        expected = (reference.rms_norm_gemv(x.view, norm_weight.view, weight.view, eps),)

        def call():
            return (cupykern.rms_norm_gemv(x.view, norm_weight.view, weight.view, eps, out=out.view if out else None),)
    else:
        expected = (reference.rms_norm_gemv_silu_and_mul(x.view, norm_weight.view, weight.view, eps),)

        def call():
            return (cupykern.rms_norm_gemv_silu_and_mul(x.view, norm_weight.view, weight.view, eps,
                                                        out=out.view if out else None),)
    # The normalised row is rounded where the reference rounds it: 2.5 ulp (test_gemv.py).
    return call, expected, buffers, [out] if out else [], 2.5 / 1.5


def _case_attention(rng, op, dtype):
    head_dim = int(rng.choice([64, 128]))
    kv_heads = int(rng.choice([1, 2, 3]))
    heads = kv_heads * int(rng.choice([1, 2, 3]))
    rows = int(rng.choice([5, 40, 300, 1100]))
    num_tokens = int(rng.integers(0, 5))
    positions = cupy.asarray(rng.choice(rows, num_tokens, replace=False).astype(np.int32))
    # Caches keep 16-byte rows (decode_attention reads vectors): pad rows by whole vectors.
    vec = 16 // np.dtype(dtype).itemsize
    pad = vec * int(rng.integers(0, 2))
    k_cache = Buffer.make(rng, (rows, kv_heads, head_dim), dtype, row_pad=pad)
    v_cache = Buffer.make(rng, (rows, kv_heads, head_dim), dtype, row_pad=pad)
    q = Buffer.make(rng, (num_tokens, heads, head_dim), dtype, row_pad=vec * int(rng.integers(0, 2)))
    if op == "decode_attention":
        expected = (reference.decode_attention(q.view, k_cache.view, v_cache.view, positions),)
        return (lambda: (cupykern.decode_attention(q.view, k_cache.view, v_cache.view, positions),)), expected, \
            [q, k_cache, v_cache], [], 1.0
    k = Buffer.make(rng, (num_tokens, kv_heads, head_dim), dtype, **_layout(rng))
    v = Buffer.make(rng, (num_tokens, kv_heads, head_dim), dtype, **_layout(rng))
    table = cupykern.rope_cos_sin_cache(rows, head_dim, 10000.0)
    is_neox = bool(rng.integers(2))
    want = reference.rope_kv_append(q.view, k.view, v.view, positions, table, k_cache.view, v_cache.view,
                                    is_neox=is_neox)

    def call():
        return cupykern.rope_kv_append(q.view, k.view, v.view, positions, table, k_cache.view, v_cache.view,
                                       is_neox=is_neox)
    return call, want, [q, k, v, k_cache, v_cache], [q, k_cache, v_cache], 1.0


CASES = {
    "rms_norm": _case_rows, "layer_norm": _case_rows, "fused_add_rms_norm": _case_rows, "softmax": _case_rows,
    "silu_and_mul": _case_activation, "gelu_and_mul": _case_activation,
    "gemv": _case_gemv, "gemv_add_residual": _case_gemv, "rms_norm_gemv": _case_gemv,
    "rms_norm_gemv_silu_and_mul": _case_gemv,
    "rope_kv_append": _case_attention, "decode_attention": _case_attention,
}


def _run_case(seed: int) -> str | None:
    """One case; None when it passes, else what went wrong."""
    rng = np.random.default_rng(seed)
    op = str(rng.choice(sorted(CASES)))
    dtype = _dtypes.DTYPES[int(rng.integers(len(_dtypes.DTYPES)))]
    call, expected, buffers, written, rtol_scale = CASES[op](rng, op, dtype)
    what = f"{op} {_dtypes.short_name(dtype)} {[tuple(b.view.shape) for b in buffers]}"
    outputs = call()
    cupy.cuda.get_current_stream().synchronize()
    for i, (got, want) in enumerate(zip(outputs, expected)):
        out_dtype = np.dtype(got.dtype)
        tol = validation.tolerance(out_dtype)
        result = validation.compare_array(got, want, out_dtype, rtol=tol["rtol"] * rtol_scale, what=f"output {i}")
        if not result.ok:
            return f"{what}: {result.message}"
    for b in buffers:
        problem = b.unchanged_outside(written=any(b is w for w in written))
        if problem:
            return f"{what}: buffer {tuple(b.view.shape)}: {problem}"
    return None


@pytest.mark.gpu
def test_random_calls_match_the_reference_and_write_only_their_outputs(request):
    base = request.config.getoption("--seed")
    failures = []
    for case in range(NUM_CASES):
        seed = base * 1_000_003 + case
        problem = _run_case(seed)
        if problem:
            failures.append(f"case seed {seed}: {problem}")
    assert not failures, f"{len(failures)} of {NUM_CASES} cases failed (base seed {base}):\n" + "\n".join(failures[:20])
