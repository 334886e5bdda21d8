"""CPU: argument intake on call signatures (cupykern/_arrays.py) and the launcher's
per-call overlap rules (cupykern/launcher.py), no GPU needed."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

import cupykern
from cupykern import _arrays, _dtypes, launcher
from cupykern._arrays import Heads, Rows, Sig
from cupykern.ops import norm, softmax
from tests.conftest import HAS_GPU
from tests.helpers import overlap_check, overlap_checker, prepare_args, sig

F16, F32, BF16 = _dtypes.float16, _dtypes.float32, _dtypes.bfloat16


# ----------------------------------------------------------------- signatures
def test_sig_contiguous():
    s = Sig.contiguous((2, 3, 8), np.float16)
    assert s == Sig((2, 3, 8), (48, 16, 2), np.dtype(np.float16), 0)
    assert s.itemsize == 2 and s.size == 48
    assert Sig.contiguous((4,), "float32", align=4) == Sig((4,), (4,), np.dtype(np.float32), 4)
    assert Sig.contiguous((), np.float32).size == 1
    # Empty axes count as one element for the strides (nothing is addressed anyway).
    assert Sig.contiguous((0, 8), np.float32).strides == (32, 4)
    assert sig(np.zeros((4, 16), np.float32)[:, 3:11], align=12) == Sig((4, 8), (64, 4), np.dtype(np.float32), 12)


def test_byte_extent():
    assert _arrays.byte_extent(Sig.contiguous((4, 8), np.float32)) == (0, 128)
    # A column slice of a (4, 16) float32 buffer: the last row ends 3 rows + 8 elements in.
    assert _arrays.byte_extent(Sig((4, 8), (64, 4), np.dtype(np.float32), 0)) == (0, 3 * 64 + 32)
    # Negative strides reach below the address.
    assert _arrays.byte_extent(Sig((4,), (-4,), np.dtype(np.float32), 0)) == (-12, 4)
    assert _arrays.byte_extent(Sig((0, 8), (32, 4), np.dtype(np.float32), 0)) == (0, 0)


# ----------------------------------------------------------------- rows
def test_rows_view_contiguous_and_strided():
    assert _arrays.rows_view((4, 8), (32, 4), 4, "x") == Rows(4, 8, 8)
    # A column slice of a wider buffer: rows 24 elements apart.
    assert _arrays.rows_view((4, 8), (96, 4), 4, "x") == Rows(4, 8, 24)
    # (batch, seq, hidden) that flattens; size-1 axes are ignored.
    assert _arrays.rows_view((2, 3, 8), (48, 16, 2), 2, "x") == Rows(6, 8, 8)
    assert _arrays.rows_view((1, 3, 8), (998, 16, 2), 2, "x") == Rows(3, 8, 8)
    assert _arrays.rows_view((8,), (2,), 2, "x") == Rows(1, 8, 8)
    assert _arrays.rows_view((0, 8), (16, 2), 2, "x").num_rows == 0
    assert _arrays.rows_of(Sig.contiguous((5, 7), np.float32), "x") == Rows(5, 7, 7)


def test_rows_view_rejects_bad_layouts():
    with pytest.raises(ValueError, match="x: the last axis must be unit-stride"):
        _arrays.rows_view((4, 8), (4, 32), 4, "x")
    with pytest.raises(ValueError, match="do not flatten"):
        _arrays.rows_view((2, 3, 8), (64, 16, 2), 2, "x")
    with pytest.raises(ValueError, match="0-d"):
        _arrays.rows_view((), (), 2, "x")
    with pytest.raises(ValueError, match="not multiples of the item size"):
        _arrays.rows_view((4, 8), (33, 4), 4, "x")


def test_collapse():
    assert _arrays.collapse((2, 3), (30, 10), "x", "leading") == 10
    assert _arrays.collapse((1, 1), (7, 9), "x", "leading") == 0
    assert _arrays.collapse((2, 1, 3), (30, 999, 10), "x", "leading") == 10
    with pytest.raises(ValueError, match="x: token axes of shape"):
        _arrays.collapse((2, 3), (40, 10), "x", "token")


def test_row_input():
    s, rows = _arrays.row_input(Sig.contiguous((2, 3, 64), BF16))
    assert rows == Rows(6, 64, 64) and s.dtype == BF16
    with pytest.raises(TypeError, match=r"x: expected a device array \(\.\.\., hidden_size\), got None"):
        _arrays.row_input(None)
    with pytest.raises(TypeError, match="x: unsupported dtype float64"):
        _arrays.row_input(Sig.contiguous((2, 8), np.float64))
    with pytest.raises(TypeError, match="gate: unsupported dtype int32"):
        _arrays.row_input(Sig.contiguous((2, 8), np.int32), "gate")
    with pytest.raises(ValueError, match="x: the last axis must have at least one element"):
        _arrays.row_input(Sig.contiguous((4, 0), F16))


def test_output():
    assert _arrays.output(None, "out", (4, 8), F16) == Sig.contiguous((4, 8), F16)
    given = Sig((4, 8), (64, 2), np.dtype(F16), 2)
    assert _arrays.output(given, "out", (4, 8), F16) is given
    with pytest.raises(ValueError, match=r"out: expected shape \(4, 8\), got \(4, 7\)"):
        _arrays.output(Sig.contiguous((4, 7), F16), "out", (4, 8), F16)
    with pytest.raises(TypeError, match=r"out: expected dtype float16 \(the result dtype\), got float32"):
        _arrays.output(Sig.contiguous((4, 8), F32), "out", (4, 8), F16)


def test_vector():
    w = Sig.contiguous((64,), F16)
    assert _arrays.vector(w, "weight", F16, 64, what="the dtype of x") is w
    assert _arrays.vector(None, "bias", F16, 64, what="the dtype of x", optional=True) is None
    with pytest.raises(TypeError, match=r"weight: expected a device array of shape \(64,\), got None"):
        _arrays.vector(None, "weight", F16, 64, what="the dtype of x")
    with pytest.raises(TypeError, match=r"weight: expected dtype float16 \(the dtype of x\), got float32"):
        _arrays.vector(Sig.contiguous((64,), F32), "weight", F16, 64, what="the dtype of x")
    with pytest.raises(ValueError, match=r"weight: expected shape \(64,\), got \(63,\)"):
        _arrays.vector(Sig.contiguous((63,), F16), "weight", F16, 64, what="the dtype of x")
    with pytest.raises(ValueError, match="weight: must be unit-stride, got stride 4 bytes"):
        _arrays.vector(Sig((64,), (4,), np.dtype(F16), 0), "weight", F16, 64, what="the dtype of x")
    # One element: any stride.
    _arrays.vector(Sig((1,), (4,), np.dtype(F16), 0), "weight", F16, 1, what="the dtype of x")


def test_vector_aligned():
    aligned = Sig.contiguous((4, 64), BF16, align=0)
    assert _arrays.vector_aligned(8, (aligned, 64))
    assert not _arrays.vector_aligned(8, (aligned, 65))                    # a row stride off the vector
    assert not _arrays.vector_aligned(8, (aligned._replace(align=2), 64))  # an address off 16 bytes
    assert _arrays.vector_aligned(4, (aligned._replace(align=8), 64))      # 8-byte accesses at 8 bytes
    assert _arrays.vector_aligned(8, (aligned, 64), (None, 0))             # absent arrays do not count
    assert _arrays.vector_aligned(1, (aligned._replace(align=2), 3))       # scalar accesses: any row stride
    assert not _arrays.vector_aligned(1, (aligned._replace(align=1), 3))   # an odd address of 2-byte elements


# ----------------------------------------------------------------- scalars
def test_subnormal_scalars_are_refused():
    """The kernels are compiled with -ftz=true: a nonzero float32 below the smallest normal
    (1.1754944e-38) would reach them as 0 (an eps of 1e-40 on an all-zero row: 0 * rsqrt(0))."""
    tiny = float(np.finfo(np.float32).tiny)
    assert _arrays.FLOAT32_TINY == tiny == np.float32(1.1754944e-38)
    assert _arrays.eps(tiny) == np.float32(tiny) and _arrays.eps(0.0) == 0 and _arrays.eps(-0.0) == 0
    for bad in (1e-40, 1e-44, 5e-324, tiny * (1 - 2**-20), 1e-50):  # subnormal in float32, or 0 once rounded
        with pytest.raises(ValueError, match=r"eps: .* is below the smallest normal float32 \(1.1754944e-38\), which "
                                             r"the kernels flush to 0 \(-ftz=true\); pass 0 or"):
            _arrays.eps(bad)
        with pytest.raises(ValueError, match="weight_offset: .* below the smallest normal float32"):
            _arrays.finite(-bad, "weight_offset")
    assert _arrays.finite(-tiny, "weight_offset") == np.float32(-tiny)


def test_eps_and_choice():
    assert _arrays.eps(1e-12) == np.float32(1e-12) and isinstance(_arrays.eps(0), np.float32)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="eps: expected a finite value >= 0"):
            _arrays.eps(bad)
    for huge in (1e300, 10**400, -1e39):  # finite, but not in float32
        with pytest.raises(ValueError, match="eps: .* is outside float32's range"):
            _arrays.eps(huge)
    with pytest.raises(ValueError, match="epsilon: expected a finite value"):
        _arrays.eps(-1, "epsilon")
    assert _arrays.choice("max", {"max": 2}, "op") == "max"
    assert _arrays.real(1 + 0j, "eps") == 1 and _arrays.real(True, "eps") == 1  # equal values, one verdict
    for bad in ("1e-6", 1j, [1e-6], np.ones(2), None):
        with pytest.raises(TypeError, match="eps: expected a real number"):
            _arrays.real(bad, "eps")
    with pytest.raises(ValueError, match="weight_offset: expected a finite value"):
        _arrays.finite(float("nan"), "weight_offset")
    assert _arrays.flag(True, "is_neox") is True and _arrays.flag(0, "is_neox") is False
    assert _arrays.flag(np.True_, "is_neox") is True and _arrays.flag(np.int8(1), "is_neox") is True
    # helper 63: 1.0, 1+0j, Decimal(1), Fraction(1) and 0-d arrays were taken as True
    for bad in ("False", None, 0.5, np.array([True, False]), 1.0, 1 + 0j, Decimal(1), Fraction(1), np.array(True), 2):
        with pytest.raises(TypeError, match="is_neox: expected a bool"):
            _arrays.flag(bad, "is_neox")
    for bad in ("median", None, 2, ["max"]):
        with pytest.raises(ValueError, match=r"op: expected one of \('max',\)"):
            _arrays.choice(bad, {"max": 2}, "op")


def test_written_arrays_need_distinct_rows_and_heads():
    _arrays.distinct_rows(Rows(4, 64, 64), "out")
    _arrays.distinct_rows(Rows(1, 64, 0), "out")  # one row: its stride is never used
    for row_stride in (0, 32, -63):
        with pytest.raises(ValueError, match="out: rows of 64 elements .* overlap each other"):
            _arrays.distinct_rows(Rows(4, 64, row_stride), "out")
    _arrays.distinct_heads(_arrays.Heads(3, 8, 64, 8 * 64, 64), "q")
    _arrays.distinct_heads(_arrays.Heads(0, 8, 64, 0, 0), "q")  # empty: nothing is written
    for heads in (_arrays.Heads(3, 8, 64, 512, 0), _arrays.Heads(3, 8, 64, 0, 64), _arrays.Heads(3, 8, 64, 256, 64)):
        with pytest.raises(ValueError, match="q: heads of 64 elements .* overlap each other"):
            _arrays.distinct_heads(heads, "q")
    # Head-major (a transposed (heads, tokens, head_dim) buffer): disjoint, refused as not token-major.
    with pytest.raises(ValueError, match=r"q: heads of 64 elements 192 apart, tokens 64 apart, are not token-major "
                                         r"\(a token stride of at least the 1408 elements"):
        _arrays.distinct_heads(_arrays.Heads(3, 8, 64, 64, 3 * 64), "q")


def test_addresses_must_be_multiples_of_the_item_size():
    _arrays.element_aligned(Sig.contiguous((4,), np.float32, align=4), "x")
    for align in (1, 2, 6):
        with pytest.raises(ValueError, match="x: the address must be a multiple of the item size 4"):
            _arrays.element_aligned(Sig.contiguous((4,), np.float32, align=align), "x")


# ----------------------------------------------------------------- heads
def test_heads_of_fused_qkv_view():
    """Token and head strides of a (tokens, heads, head_dim) slice of a fused QKV row."""
    hq, hkv, hd = 4, 2, 16
    buf = np.zeros((5, (hq + 2 * hkv) * hd), np.float16)
    k = buf[:, hq * hd:(hq + hkv) * hd].reshape(5, hkv, hd)
    assert _arrays.heads(sig(k), "k") == Heads(5, hkv, hd, (hq + 2 * hkv) * hd, hd)
    with pytest.raises(ValueError, match="q: the last axis .head_dim. must be unit-stride"):
        _arrays.heads(sig(buf.reshape(5, 8, 16)[..., ::2]), "q")
    with pytest.raises(ValueError, match="q: expected shape"):
        _arrays.heads(sig(buf), "q")
    assert _arrays.heads(sig(np.zeros((2, 6, hq, hd), np.float32)[:, ::2]), "q").token_stride == 2 * hq * hd
    # (batch, seq) that does not flatten: the first half of each sequence
    four = np.zeros((2, 6, hq, hd), np.float32)[:, :3]
    with pytest.raises(ValueError, match="flatten"):
        _arrays.heads(sig(four), "q")
    with pytest.raises(TypeError, match="q: expected a device array"):
        _arrays.heads(None, "q")
    with pytest.raises(TypeError, match="q: unsupported dtype float64"):
        _arrays.heads(Sig.contiguous((2, 4, 16), np.float64), "q")
    assert _arrays.heads(Sig.contiguous((0, 4, 16), F16), "q") == Heads(0, 4, 16, 0, 0)
    assert _arrays.heads(Sig.contiguous((3, 1, 16), F16), "q").head_stride == 0


def test_heads_as_rows():
    assert _arrays.heads_as_rows(Heads(5, 4, 16, 128, 16)) == Rows(5, 64, 128)
    assert _arrays.heads_as_rows(Heads(5, 1, 16, 128, 0)) == Rows(5, 16, 128)
    assert _arrays.heads_as_rows(Heads(5, 4, 16, 256, 32)) is None  # gaps between heads


# ----------------------------------------------------------------- devices
def test_check_device():
    _arrays.check_device(1, 1, "x")
    with pytest.raises(ValueError, match=r"x: array is on GPU 1 but the current device is GPU 0.*Device\(1\)"):
        _arrays.check_device(1, 0, "x")


# ----------------------------------------------------------------- overlap rules (per call)
def _rms_norm_overlap(monkeypatch, x: Sig, out: Sig, x_ptr: int, out_ptr: int):
    values = {"x": x, "weight": Sig.contiguous((x.shape[-1],), x.dtype), "out": out, "eps": 1e-6,
              "weight_offset": 0.0}
    launch = norm._prepare_rms_norm(prepare_args("rms_norm", **values))
    return overlap_check(monkeypatch, norm._RMS_NORM, launch, values,
                         {"x": x_ptr, "weight": 1 << 30, "out": out_ptr})


def test_interleaved_column_halves_are_disjoint(monkeypatch):
    """x and out as the two column halves of one (4, 16) float32 buffer: rows interleave."""
    half = Sig((4, 8), (64, 4), np.dtype(F32), 0)
    base = 1 << 20
    assert _rms_norm_overlap(monkeypatch, half, half, base, base + 32).data.ptr == base + 32
    assert _rms_norm_overlap(monkeypatch, half, half, base + 32, base).data.ptr == base


def test_shifted_views_overlap(monkeypatch):
    half = Sig((4, 8), (64, 4), np.dtype(F32), 0)
    base = 1 << 20
    with pytest.raises(ValueError, match=r"out overlaps x in memory \(in place is allowed only as out=x exactly\)"):
        _rms_norm_overlap(monkeypatch, half, half, base, base + 4)
    flat = Sig.contiguous((4, 64), F16)
    with pytest.raises(ValueError, match="out overlaps x"):
        _rms_norm_overlap(monkeypatch, flat, flat, base, base + 2)


def test_in_place_and_disjoint_extents_pass(monkeypatch):
    flat = Sig.contiguous((4, 64), F16)
    base = 1 << 20
    assert _rms_norm_overlap(monkeypatch, flat, flat, base, base).data.ptr == base  # out=x: in place
    assert _rms_norm_overlap(monkeypatch, flat, flat, base, base + 4 * 64 * 2).data.ptr == base + 512
    # The same address with another view is not "exactly x".
    with pytest.raises(ValueError, match="out overlaps x"):
        _rms_norm_overlap(monkeypatch, flat, Sig((4, 64), (256, 2), np.dtype(F16), 0), base, base)


def test_one_recipe_checks_every_new_set_of_addresses(monkeypatch):
    """Calls of one signature share a recipe, which remembers the addresses of the last call
    that passed: a call at other addresses is checked again, and a refused one is refused
    again (its addresses are not remembered). The extents' edges: adjacent passes, one
    element of overlap at either end is refused."""
    flat = Sig.contiguous((4, 64), F16)  # 512 bytes
    values = {"x": flat, "weight": Sig.contiguous((64,), F16), "out": flat, "eps": 1e-6, "weight_offset": 0.0}
    call = overlap_checker(monkeypatch, norm._RMS_NORM, norm._prepare_rms_norm(prepare_args("rms_norm", **values)),
                           values)
    base, weight = 1 << 20, 1 << 30
    for out_ptr, weight_ptr, refused in ((base + 512, weight, None), (base + 510, weight, "out overlaps x"),
                                         (base + 510, weight, "out overlaps x"), (base + 512, weight, None),
                                         (base - 512, weight, None), (base - 510, weight, "out overlaps x"),
                                         (base + 512, base + 1022, "out overlaps weight"),
                                         (base + 512, base + 1024, None), (base + 512, base + 512 - 128, None),
                                         (base + 512, base + 512 - 126, "out overlaps weight")):
        pointers = {"x": base, "weight": weight_ptr, "out": out_ptr}
        if refused is None:
            assert call(pointers).data.ptr == out_ptr
        else:
            with pytest.raises(ValueError, match=refused):
                call(pointers)


def test_weight_between_rows_of_a_strided_out(monkeypatch):
    """A weight in the gap between two rows of a strided out (a column half of a wider
    buffer) shares no element with it: taken. Reaching into a row, or past the first row's
    start, is refused (helper 57; the rule used to compare byte extents only)."""
    half = Sig((4, 8), (64, 4), np.dtype(F32), 0)  # rows of 32 bytes every 64
    values = {"x": Sig.contiguous((4, 8), F32), "weight": Sig.contiguous((8,), F32), "out": half, "eps": 1e-6,
              "weight_offset": 0.0}
    call = overlap_checker(monkeypatch, norm._RMS_NORM, norm._prepare_rms_norm(prepare_args("rms_norm", **values)),
                           values)
    out = 1 << 20
    for weight, refused in ((out + 32, False), (out + 64 + 32, False), (out + 2 * 64 + 32, False),
                            (out + 28, True), (out + 36, True), (out - 16, True), (out + 16, True)):
        pointers = {"x": 1 << 30, "weight": weight, "out": out}
        if refused:
            with pytest.raises(ValueError, match="out overlaps weight"):
                call(pointers)
        else:
            assert call(pointers).data.ptr == out
    # fused_add_rms_norm: the weight between rows of x and of residual, two column slices
    # of one buffer (x's rows at 0, residual's at 32, the weight in neither).
    quarter = Sig((4, 8), (96, 4), np.dtype(F32), 0)  # rows of 32 bytes every 96
    values = {"x": quarter, "residual": quarter, "weight": Sig.contiguous((8,), F32), "eps": 1e-6,
              "weight_offset": 0.0}
    call = overlap_checker(monkeypatch, norm._FUSED_ADD_RMS_NORM,
                           norm._prepare_fused_add_rms_norm(prepare_args("fused_add_rms_norm", **values)), values)
    assert call({"x": out, "residual": out + 32, "weight": out + 64}) is not None
    with pytest.raises(ValueError, match="residual overlaps weight"):
        call({"x": out, "residual": out + 32, "weight": out + 60})


def test_softmax_float32_out_over_x_overlaps(monkeypatch):
    x = Sig.contiguous((4, 64), F16)
    out = Sig.contiguous((4, 64), F32)
    values = {"x": x, "out": out, "temperature": 1.0}
    launch = softmax._prepare(prepare_args("softmax", **values))
    with pytest.raises(ValueError, match="out overlaps x"):
        overlap_check(monkeypatch, softmax._SOFTMAX, launch, values, {"x": 1 << 20, "out": 1 << 20})


# ----------------------------------------------------------------- public functions without a GPU
@pytest.mark.parametrize("call", [
    lambda x: cupykern.rms_norm(x, x[0]),
    lambda x: cupykern.fused_add_rms_norm(x, x, x[0]),
    lambda x: cupykern.layer_norm(x, None, None),
    lambda x: cupykern.softmax(x),
    lambda x: cupykern.row_reduce(x, "sum"),
])
def test_numpy_input_raises_type_error(call):
    x = np.ones((2, 8), dtype=np.float32)
    with pytest.raises(TypeError, match="x: expected a device array.*NumPy"):
        call(x)


def test_non_array_raises_type_error():
    with pytest.raises(TypeError, match="x: expected a device array"):
        cupykern.rms_norm([[1.0, 2.0]], None)


class _CudaArrayInterface:
    """A device array as another library hands it over (a pointer that is never read)."""

    @property
    def __cuda_array_interface__(self):
        return {"shape": (2, 8), "typestr": "<f4", "data": (1 << 20, False), "version": 3}


def test_cuda_error_while_taking_a_foreign_array_names_the_argument(monkeypatch):
    import cupy

    def no_driver(obj):
        raise cupy.cuda.runtime.CUDARuntimeError(35)  # cudaErrorInsufficientDriver

    monkeypatch.setattr(cupy, "asarray", no_driver)
    with pytest.raises(RuntimeError, match=r"x: CUDA cannot be used to take this device array \(cudaError"):
        cupykern.softmax(_CudaArrayInterface())


@pytest.mark.skipif(HAS_GPU, reason="needs a machine without a usable CUDA driver")
def test_cuda_array_interface_without_a_driver_is_a_clear_error():
    """The issue: a raw CUDARuntimeError before; now a RuntimeError naming the argument."""
    with pytest.raises(RuntimeError, match="x: CUDA cannot be used to take this device array"):
        cupykern.rms_norm(_CudaArrayInterface(), None)


def test_row_reduce_unknown_op_raises_before_touching_the_gpu():
    with pytest.raises(ValueError, match="op: expected one of"):
        cupykern.row_reduce(np.ones(3, np.float32), "median")


def test_launcher_declares_every_public_op():
    ops = launcher.ops()
    assert {"rms_norm", "fused_add_rms_norm", "layer_norm", "softmax", "row_reduce", "silu_and_mul", "gelu_and_mul",
            "swiglu", "apply_rope", "qk_rms_norm_rope"} <= set(ops)
    assert ops["rms_norm"].arrays == ("x", "weight", "out") and ops["rms_norm"].scalars == ("eps", "weight_offset")
    assert ops["apply_rope"].plan_kind == "rope" and ops["apply_rope"].launch_options == ()


def test_dtype_table():
    assert _dtypes.parse("bf16") == _dtypes.bfloat16
    assert _dtypes.c_type(np.float16) == "__half"
    assert _dtypes.vec_width(_dtypes.bfloat16) == 8
    with pytest.raises(ValueError, match="unsupported dtype"):
        _dtypes.parse("int8")
    with pytest.raises(TypeError, match="w: unsupported dtype float64"):
        _dtypes.check_supported(np.float64, "w")
