"""Norm family: rms_norm, fused_add_rms_norm, layer_norm (kernels_cu/norm.cu).

CPU: reference properties. GPU (marked): kernels against the float64 reference on
fresh seeded inputs, outputs poisoned and guarded, over dtypes, shapes and layouts.
"""

from __future__ import annotations

import cupy
import numpy as np
import pytest

import cupykern
from cupykern import _dtypes, launch, reference
from cupykern.reference._common import round_to
from tests.helpers import DTYPES, DTYPE_IDS, Guarded, assert_close, poisoned, random_device

NUM_TOKENS = [0, 1, 3, 64, 4097]
HIDDEN_SIZES = [1, 5, 64, 127, 128, 4096, 5120, 8192, 16384, 65536]


def _shapes():
    """rows x hidden grid, pruned so float64 references stay under ~40M elements."""
    for rows in NUM_TOKENS:
        for hidden in HIDDEN_SIZES:
            if rows * hidden <= 40_000_000:
                yield rows, hidden
    yield 3, 131072


SHAPES = list(_shapes())


# ----------------------------------------------------------------- CPU: reference
def test_reference_rms_norm_of_constant_row():
    c, eps = 3.0, 1e-6
    x = np.full((2, 16), c)
    w = np.linspace(0.5, 1.5, 16)
    np.testing.assert_allclose(reference.rms_norm(x, w, eps), np.broadcast_to(w * c / np.sqrt(c * c + eps), (2, 16)))


def test_reference_gemma_offset_adds_one():
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((3, 8)), rng.standard_normal(8)
    np.testing.assert_allclose(reference.rms_norm(x, w, weight_offset=1.0), reference.rms_norm(x, w + 1.0))


def test_reference_fused_add_rounds_the_residual():
    x = np.array([[1.0, 2.0**-9]], dtype=_dtypes.bfloat16)
    r = np.array([[1.0, 1.0]], dtype=_dtypes.bfloat16)
    _, summed = reference.fused_add_rms_norm(x, r, np.ones(2, dtype=_dtypes.bfloat16))
    # 1 + 2**-9 is not a bfloat16: the stored residual is rounded (to even: 1.0).
    np.testing.assert_array_equal(summed, [[2.0, 1.0]])


def test_reference_layer_norm_is_stable_with_large_mean():
    rng = np.random.default_rng(1)
    x = 1e4 + rng.standard_normal((4, 1024))
    y = reference.layer_norm(x, None, None, eps=0.0)
    np.testing.assert_allclose(y.mean(axis=-1), 0, atol=1e-9)
    np.testing.assert_allclose(y.std(axis=-1), 1, rtol=1e-9)


# ----------------------------------------------------------------- GPU helpers
def _rms_inputs(rng, rows, hidden, dtype, scale=1.0):
    x = random_device(rng, (rows, hidden), dtype, scale=scale)
    w = random_device(rng, (hidden,), dtype, scale=0.1, loc=1.0)
    return x, w


# ----------------------------------------------------------------- GPU: values
@pytest.mark.gpu
@pytest.mark.parametrize("rows, hidden", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_rms_norm_matches_reference(rng, rows, hidden, dtype):
    x, w = _rms_inputs(rng, rows, hidden, dtype)
    out = Guarded((rows, hidden), dtype)
    result = cupykern.rms_norm(x, w, 1e-6, out=out.view)
    assert result is out.view
    assert_close(out.view, reference.rms_norm(x, w, 1e-6), dtype, seed=rng.seed)
    out.check_margins()


@pytest.mark.gpu
@pytest.mark.parametrize("rows, hidden", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_fused_add_rms_norm_matches_reference(rng, rows, hidden, dtype):
    x, w = _rms_inputs(rng, rows, hidden, dtype)
    residual = random_device(rng, (rows, hidden), dtype)
    want_x, want_residual = reference.fused_add_rms_norm(x, residual, w, 1e-6)
    got_x, got_residual = cupykern.fused_add_rms_norm(x, residual, w, 1e-6)
    assert got_x is x and got_residual is residual
    # The stored residual is the correctly rounded sum: bit-exact.
    np.testing.assert_array_equal(got_residual.get().astype(np.float64), want_residual)
    assert_close(x, want_x, dtype, seed=rng.seed)


@pytest.mark.gpu
@pytest.mark.parametrize("rows, hidden", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_layer_norm_matches_reference(rng, rows, hidden, dtype):
    x, w = _rms_inputs(rng, rows, hidden, dtype)
    b = random_device(rng, (hidden,), dtype, scale=0.1)
    out = Guarded((rows, hidden), dtype)
    cupykern.layer_norm(x, w, b, 1e-5, out=out.view)
    assert_close(out.view, reference.layer_norm(x, w, b, 1e-5), dtype, seed=rng.seed)
    out.check_margins()


@pytest.mark.gpu
@pytest.mark.parametrize("use_weight, use_bias", [(False, False), (True, False), (False, True)])
def test_layer_norm_optional_affine(rng, use_weight, use_bias):
    dtype = _dtypes.float16
    x, w = _rms_inputs(rng, 33, 1000, dtype)
    b = random_device(rng, (1000,), dtype)
    w, b = (w if use_weight else None), (b if use_bias else None)
    assert_close(cupykern.layer_norm(x, w, b), reference.layer_norm(x, w, b), dtype, seed=rng.seed)


@pytest.mark.gpu
def test_layer_norm_large_mean_keeps_variance(rng):
    """A one-pass E[x^2] - E[x]^2 loses the variance of 1e4 + N(0, 1) in fp32."""
    x = random_device(rng, (64, 4096), np.float32, loc=1e4)
    assert_close(cupykern.layer_norm(x, None, None, 1e-6), reference.layer_norm(x, None, None, 1e-6),
                 np.float32, seed=rng.seed, rtol=2e-3, atol=2e-3)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_rms_norm_gemma_offset(rng, dtype):
    x, w = _rms_inputs(rng, 17, 2304, dtype)
    w = random_device(rng, (2304,), dtype, scale=0.05)  # Gemma stores w near 0 and scales by 1 + w
    assert_close(cupykern.rms_norm(x, w, weight_offset=1.0), reference.rms_norm(x, w, weight_offset=1.0),
                 dtype, seed=rng.seed)


# ----------------------------------------------------------------- GPU: layouts
@pytest.mark.gpu
@pytest.mark.parametrize("hidden", [5, 128, 4096, 5120])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_rms_norm_strided_and_misaligned_rows(rng, hidden, dtype):
    wide = random_device(rng, (37, hidden + 24), dtype)
    x = wide[:, 3:3 + hidden]                          # strided rows, misaligned start
    flat = random_device(rng, (37 * hidden + 1,), dtype)
    x_shifted = flat[1:].reshape(37, hidden)           # contiguous, offset by one element
    w = random_device(rng, (hidden,), dtype, loc=1.0)
    for view in (x, x_shifted):
        out = Guarded((37, hidden), dtype, misalign=1)
        cupykern.rms_norm(view, w, out=out.view)
        assert_close(out.view, reference.rms_norm(view, w), dtype, seed=rng.seed)
        out.check_margins()


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("hidden", [127, 8192, 131072])
def test_in_place_out_equals_x(rng, op, hidden):
    dtype = _dtypes.bfloat16
    x, w = _rms_inputs(rng, 9, hidden, dtype)
    want = reference.rms_norm(x, w) if op == "rms_norm" else reference.layer_norm(x, w, None)
    fn = (lambda: cupykern.rms_norm(x, w, out=x)) if op == "rms_norm" else (lambda: cupykern.layer_norm(x, w, None, out=x))
    assert fn() is x
    assert_close(x, want, dtype, seed=rng.seed)


@pytest.mark.gpu
def test_fused_add_rms_norm_strided_views_of_one_buffer(rng):
    """x and residual as column halves of one (tokens, 2 * hidden) buffer."""
    dtype, hidden = _dtypes.float16, 4096
    both = random_device(rng, (65, 2 * hidden), dtype)
    x, residual = both[:, :hidden], both[:, hidden:]
    w = random_device(rng, (hidden,), dtype, loc=1.0)
    want_x, want_res = reference.fused_add_rms_norm(x, residual, w)
    cupykern.fused_add_rms_norm(x, residual, w)
    np.testing.assert_array_equal(residual.get().astype(np.float64), want_res)
    assert_close(x, want_x, dtype, seed=rng.seed)


@pytest.mark.gpu
def test_three_dimensional_input(rng):
    dtype = _dtypes.bfloat16
    x = random_device(rng, (2, 5, 256), dtype)
    w = random_device(rng, (256,), dtype, loc=1.0)
    out = cupykern.rms_norm(x, w)
    assert out.shape == (2, 5, 256)
    assert_close(out, reference.rms_norm(x, w), dtype, seed=rng.seed)


# ----------------------------------------------------------------- GPU: numerics
@pytest.mark.gpu
def test_rms_norm_fp16_large_values_do_not_overflow(rng):
    """Magnitude ~300: the sum of squares (~9e4 per element) overflows fp16, not fp32."""
    x, w = _rms_inputs(rng, 16, 4096, _dtypes.float16, scale=300.0)
    assert_close(cupykern.rms_norm(x, w), reference.rms_norm(x, w), _dtypes.float16, seed=rng.seed)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_rms_norm_constant_rows_with_tiny_eps(dtype):
    x = cupy.full((4, 1000), 1e-3, dtype=np.float32).astype(dtype)
    w = cupy.full((1000,), 0.5, dtype=np.float32).astype(dtype)
    got = cupykern.rms_norm(x, w, eps=1e-12)
    assert_close(got, reference.rms_norm(x, w, 1e-12), dtype, seed=0)


@pytest.mark.gpu
def test_nan_stays_in_its_row(rng):
    dtype = _dtypes.bfloat16
    x, w = _rms_inputs(rng, 8, 4096, dtype)
    x[3, 17] = np.nan
    for got in (cupykern.rms_norm(x, w), cupykern.layer_norm(x, w, None), cupykern.softmax(x)):
        got = got.get().astype(np.float64)
        assert np.isnan(got[3]).all()
        assert not np.isnan(np.delete(got, 3, axis=0)).any()


@pytest.mark.gpu
def test_more_than_65535_rows(rng):
    dtype = _dtypes.float16
    x, w = _rms_inputs(rng, 70_001, 8, dtype)
    out = Guarded((70_001, 8), dtype)
    cupykern.rms_norm(x, w, out=out.view)
    assert_close(out.view, reference.rms_norm(x, w), dtype, seed=rng.seed)
    out.check_margins()


@pytest.mark.gpu
@pytest.mark.parametrize("hidden", [5, 4096, 8192, 65536])
@pytest.mark.parametrize("op", ["rms_norm", "fused_add_rms_norm", "layer_norm", "softmax"])
def test_batch_invariance(rng, op, hidden):
    """A row alone and inside 4096 rows gives identical bits."""
    dtype = _dtypes.bfloat16
    rows = 4096 if hidden <= 8192 else 64
    x, w = _rms_inputs(rng, rows, hidden, dtype)
    residual = random_device(rng, (rows, hidden), dtype)

    def run(xs, rs):
        xs, rs = xs.copy(), rs.copy()
        if op == "rms_norm":
            return cupykern.rms_norm(xs, w)
        if op == "layer_norm":
            return cupykern.layer_norm(xs, w, None)
        if op == "softmax":
            return cupykern.softmax(xs)
        return cupykern.fused_add_rms_norm(xs, rs, w)[0]

    full = run(x, residual).get()
    for i in (0, rows // 2 + 1, rows - 1):
        alone = run(x[i:i + 1], residual[i:i + 1]).get()
        np.testing.assert_array_equal(alone.view(np.uint8), full[i:i + 1].view(np.uint8))


@pytest.mark.gpu
@pytest.mark.parametrize("threads_per_row", [1, 32, 64, 256, 1024])
@pytest.mark.parametrize("vecs_per_thread", [1, 8])
def test_overridden_layouts_stay_correct(rng, threads_per_row, vecs_per_thread):
    """Every layout a sweep may choose computes the same function."""
    dtype = _dtypes.bfloat16
    x, w = _rms_inputs(rng, 300, 3000, dtype)
    rows_per_block = max(1, 32 // threads_per_row)
    with launch.overrides(threads_per_row=threads_per_row, vecs_per_thread=vecs_per_thread,
                          rows_per_block=rows_per_block):
        got = cupykern.rms_norm(x, w)
    assert_close(got, reference.rms_norm(x, w), dtype, seed=rng.seed)


# ----------------------------------------------------------------- GPU: streams and graphs
@pytest.mark.gpu
def test_runs_on_current_stream_and_under_graph_capture(rng):
    dtype = _dtypes.bfloat16
    x, w = _rms_inputs(rng, 16, 4096, dtype)
    residual = random_device(rng, (16, 4096), dtype)
    want = reference.rms_norm(x, w)
    want_fx, want_res = reference.fused_add_rms_norm(x, residual, w)
    stream = cupy.cuda.Stream(non_blocking=True)
    out = poisoned((16, 4096), dtype)
    cupy.cuda.Device().synchronize()  # the poison fill ran on the null stream
    with stream:
        cupykern.rms_norm(x, w, out=out)
        stream.synchronize()
    assert_close(out, want, dtype, seed=rng.seed)

    out = poisoned((16, 4096), dtype)
    cupykern.rms_norm(x, w, out=out)  # compile outside the capture
    cupykern.fused_add_rms_norm(x.copy(), residual.copy(), w)
    out[...] = np.nan
    x_graph, res_graph = x.copy(), residual.copy()
    with stream:
        stream.begin_capture()
        cupykern.rms_norm(x, w, out=out)
        cupykern.fused_add_rms_norm(x_graph, res_graph, w)
        graph = stream.end_capture()
    assert np.isnan(out.get().astype(np.float32)).all()  # captured, not run
    graph.launch(stream=stream)
    stream.synchronize()
    assert_close(out, want, dtype, seed=rng.seed)
    assert_close(x_graph, want_fx, dtype, seed=rng.seed)
    np.testing.assert_array_equal(res_graph.get().astype(np.float64), want_res)


# ----------------------------------------------------------------- GPU: argument errors
@pytest.mark.gpu
def test_argument_errors_name_the_argument():
    x = cupy.ones((4, 64), dtype=np.float16)
    w = cupy.ones(64, dtype=np.float16)
    with pytest.raises(TypeError, match="weight: expected dtype float16"):
        cupykern.rms_norm(x, w.astype(np.float32))
    with pytest.raises(ValueError, match=r"weight: expected shape \(64,\)"):
        cupykern.rms_norm(x, cupy.ones(63, dtype=np.float16))
    with pytest.raises(TypeError, match="x: unsupported dtype float64"):
        cupykern.rms_norm(x.astype(np.float64), w)
    with pytest.raises(ValueError, match="x: the last axis must be unit-stride"):
        cupykern.rms_norm(cupy.ones((64, 4), dtype=np.float16).T, w)
    with pytest.raises(ValueError, match=r"out: expected shape"):
        cupykern.rms_norm(x, w, out=cupy.empty((4, 63), dtype=np.float16))
    with pytest.raises(TypeError, match="out: expected dtype float16"):
        cupykern.rms_norm(x, w, out=cupy.empty((4, 64), dtype=np.float32))
    with pytest.raises(ValueError, match="out overlaps x"):
        buf = cupy.ones(4 * 64 + 1, dtype=np.float16)
        cupykern.rms_norm(buf[:-1].reshape(4, 64), w, out=buf[1:].reshape(4, 64))
    with pytest.raises(ValueError, match="eps"):
        cupykern.rms_norm(x, w, eps=-1.0)
    with pytest.raises(ValueError, match="residual overlaps x"):
        cupykern.fused_add_rms_norm(x, x, w)
    with pytest.raises(ValueError, match="residual: expected shape"):
        cupykern.fused_add_rms_norm(x, cupy.ones((4, 32), dtype=np.float16), w)
    with pytest.raises(ValueError, match="x: the last axis must have at least one element"):
        cupykern.rms_norm(cupy.ones((4, 0), dtype=np.float16), cupy.ones(0, dtype=np.float16))


@pytest.mark.gpu
def test_zero_rows_launch_nothing():
    x = cupy.ones((0, 4096), dtype=np.float16)
    w = cupy.ones(4096, dtype=np.float16)
    assert cupykern.rms_norm(x, w).shape == (0, 4096)
    assert cupykern.fused_add_rms_norm(x, x.copy(), w)[0].shape == (0, 4096)
    assert cupykern.layer_norm(x, w, None).shape == (0, 4096)


@pytest.mark.gpu
def test_dlpack_and_cuda_array_interface_inputs(rng):
    dtype = np.float32
    x, w = _rms_inputs(rng, 4, 256, dtype)

    class CAIOnly:
        def __init__(self, a):
            self.__cuda_array_interface__ = a.__cuda_array_interface__

    class DLPackOnly:
        def __init__(self, a):
            self._a = a

        def __dlpack__(self, **kw):
            return self._a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self._a.__dlpack_device__()

    want = reference.rms_norm(x, w)
    assert_close(cupykern.rms_norm(CAIOnly(x), w), want, dtype, seed=rng.seed)
    assert_close(cupykern.rms_norm(DLPackOnly(x), DLPackOnly(w)), want, dtype, seed=rng.seed)
    # In place through DLPack writes the caller's memory.
    out = cupy.empty_like(x)
    cupykern.rms_norm(x, w, out=DLPackOnly(out))
    assert_close(out, want, dtype, seed=rng.seed)
