"""Quant family: FP8 E4M3FN outputs of RMSNorm and SiLU-and-mul (kernels_cu/quant.cu).

CPU: the reference's exact float64 -> E4M3FN rounding (known values, midpoints, the
double rounding of ml_dtypes, saturation, NaN, subnormals), the references'
properties, each op's intake spec and plan rule on call signatures, and the
references refusing what the kernels refuse. GPU (marked): kernels against the float64
reference bit for bit, with a counted, bounded number of one-unit differences (fp32
evaluation can move a value across a rounding boundary), and bit-exact against the
fp32 value the family's own unquantised kernels produce; outputs poisoned and guarded,
strided and misaligned views, zero rows, every dtype, graph capture.
"""

from __future__ import annotations

import cupy
import ml_dtypes
import numpy as np
import pytest

import cupykern
from cupykern import _dtypes, launcher, plans, reference
from cupykern._arrays import Sig
from cupykern.ops import quant
from cupykern.reference._common import host
from cupykern.reference._fp8 import decode, e4m3fn_bits, round_e4m3fn
from cupykern.reference.quant import MIN_SCALE
from tests.helpers import (DTYPES, DTYPE_IDS, assert_close, assert_same_error, contiguous,
                           kernel_and_reference_errors, prepare_args, random_device)

F16, F32, BF16 = _dtypes.float16, _dtypes.float32, _dtypes.bfloat16
U8 = np.dtype(np.uint8)
heuristic_plans = pytest.mark.usefixtures("tune_file")

#: One-unit differences allowed against the float64 reference: a fraction of the
#: elements (the fp32 y is within ~1e-5 relative of float64 for the norms, 2**-16 for
#: the 16-bit activations' intrinsics; an E4M3FN unit is 2**-4..2**-3 relative, so about
#: 1e-4..5e-4 of the elements lie that close to a rounding boundary), plus a few.
ONE_UNIT_FRACTION, ONE_UNIT_SLACK = 2e-3, 4


# ----------------------------------------------------------------- CPU: exact rounding
@pytest.mark.parametrize("value, bits", [
    (0.0, 0x00), (-0.0, 0x80), (1.0, 0x38), (-1.0, 0xB8), (1.125, 0x39), (448.0, 0x7E), (-448.0, 0xFE),
    (2.0**-6, 0x08), (2.0**-9, 0x01), (7 * 2.0**-9, 0x07), (0.875 * 2.0**-6, 0x07), (240.0, 0x77), (256.0, 0x78),
])
def test_e4m3fn_bits_of_representable_values(value, bits):
    assert e4m3fn_bits(value) == bits
    assert decode(np.uint8(bits)) == value


def test_e4m3fn_bits_round_trip_every_finite_pattern():
    patterns = np.arange(256, dtype=np.uint8)
    values = decode(patterns)
    finite = ~np.isnan(values)
    np.testing.assert_array_equal(e4m3fn_bits(values[finite]), patterns[finite])
    assert set(patterns[~finite]) == {0x7F, 0xFF}


@pytest.mark.parametrize("value, bits", [
    (1.0625, 0x38),                # midpoint of 1 (even) and 1.125: to even
    (1.1875, 0x3A),                # midpoint of 1.125 and 1.25 (even)
    (1.0625 + 2.0**-40, 0x39),     # just above a midpoint: up
    (1.0625 - 2.0**-40, 0x38),
    (-1.1875, 0xBA),
    (2.0**-10, 0x00),              # half the smallest subnormal: to even (0)
    (2.0**-10 + 2.0**-60, 0x01),
    (3 * 2.0**-10, 0x02),          # midpoint of 1 and 2 subnormal units: to even (2)
    (5 * 2.0**-10, 0x02),          # midpoint of 2 and 3 units: to 2
    (7.5 * 2.0**-9, 0x08),         # rounds up from the subnormals to the smallest normal
    (2.0**-12, 0x00), (-2.0**-12, 0x80),
])
def test_e4m3fn_rounds_to_nearest_even(value, bits):
    assert e4m3fn_bits(value) == bits


def test_e4m3fn_one_rounding_where_ml_dtypes_rounds_twice():
    """ml_dtypes converts float64 through float32: 1.0625 + 2**-40 becomes the midpoint
    1.0625 in float32, then 1.0 (to even); rounded once it is 1.125. The reference is
    the one rounding, as the kernels' fp32 -> E4M3FN conversion of an fp32 value is."""
    value = 1.0625 + 2.0**-40
    assert e4m3fn_bits(value) == 0x39
    assert np.array(value).astype(ml_dtypes.float8_e4m3fn).view(np.uint8) in (0x38, 0x39)  # 0x38 in 0.5-0.6


@pytest.mark.parametrize("value, bits", [
    (448.0 + 2.0**-40, 0x7E), (464.0, 0x7E), (479.0, 0x7E), (480.0, 0x7E), (1e30, 0x7E), (np.inf, 0x7E),
    (-500.0, 0xFE), (-np.inf, 0xFE), (np.nan, 0x7F), (-np.nan, 0x7F),
])
def test_e4m3fn_saturates_and_keeps_nan(value, bits):
    assert e4m3fn_bits(value) == bits


def test_e4m3fn_matches_ml_dtypes_on_float32_values():
    """From float32 there is one rounding either way: ml_dtypes (saturated by hand) agrees."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(200_000) * np.exp2(rng.integers(-14, 11, 200_000))).astype(np.float32)
    want = np.clip(x, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    np.testing.assert_array_equal(e4m3fn_bits(x.astype(np.float64)), want)


# ----------------------------------------------------------------- CPU: reference properties
def _scale(value):
    return np.array([value], dtype=np.float32)


def test_reference_rms_norm_quant_is_rounded_rms_norm():
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((4, 64)).astype(F32), (1 + 0.1 * rng.standard_normal(64)).astype(F32)
    scale = _scale(3.0 / 448)
    want = round_e4m3fn(reference.rms_norm(x, w) * float(np.float32(1) / np.float32(scale[0])))
    np.testing.assert_array_equal(reference.rms_norm_quant(x, w, scale), want)
    assert np.abs(want).max() == 448.0  # the largest values saturate at this scale


def test_reference_dynamic_scales_and_zero_rows():
    x = np.zeros((3, 16), dtype=F32)
    x[1] = np.linspace(-2, 2, 16)
    x[2, 3] = np.nan
    w = np.ones(16, dtype=F32)
    out, scales = reference.rms_norm_dynamic_per_token_quant(x, w)
    assert scales.shape == (3, 1)
    assert scales[0, 0] == MIN_SCALE and (out[0] == 0).all()  # vLLM's floor: no 0 / 0
    y = reference.rms_norm(x[1:2], w)
    np.testing.assert_allclose(scales[1, 0], np.abs(y).max() / 448, rtol=1e-15)
    assert np.abs(out[1]).max() == 448.0
    assert np.isnan(scales[2, 0]) and np.isnan(out[2]).all()  # a NaN row stays NaN
    _, bounded = reference.rms_norm_dynamic_per_token_quant(x[1:2], w, scale_ub=0.5)
    assert bounded[0, 0] == 0.5 / 448


def test_reference_fused_ops_return_the_rounded_residual():
    x = np.array([[1.0, 2.0**-9]], dtype=BF16)
    r = np.array([[1.0, 1.0]], dtype=BF16)
    w = np.ones(2, dtype=BF16)
    _, summed = reference.fused_add_rms_norm_quant(x, r, w, _scale(1.0))
    np.testing.assert_array_equal(summed, [[2.0, 1.0]])
    out, scales, summed = reference.fused_add_rms_norm_dynamic_per_token_quant(x, r, w)
    np.testing.assert_array_equal(summed, [[2.0, 1.0]])
    assert out.shape == (1, 2) and scales.shape == (1, 1)


def test_reference_silu_and_mul_quant():
    x = np.array([[0.0, 1.0, -1.0, 2.0, 3.0, 4.0, 5.0, 6.0]], dtype=F32)
    want = round_e4m3fn(reference.silu_and_mul(x) * float(np.float32(1) / np.float32(0.25)))
    np.testing.assert_array_equal(reference.silu_and_mul_quant(x, _scale(0.25)), want)


# ----------------------------------------------------------------- CPU: intake and plan
def _norm(op, *, x=None, weight=None, residual="default", scale="default", out=None, scales=None, eps=1e-6,
          weight_offset=0.0, scale_ub=None):
    x = contiguous((4, 64), BF16) if x is None else x
    weight = contiguous((x.shape[-1],), x.dtype) if weight is None else weight
    values = dict(x=x, weight=weight, out=out, eps=eps, weight_offset=weight_offset)
    if op.startswith("fused_add"):
        values["residual"] = contiguous(x.shape, x.dtype) if residual == "default" else residual
    if "dynamic" in op:
        values.update(scales=scales, scale_ub=scale_ub)
    else:
        values["scale"] = contiguous((1,), F32) if scale == "default" else scale
    return launcher.ops()[op].prepare(prepare_args(op, **values))


@heuristic_plans
def test_rms_norm_quant_launch():
    launch = _norm("rms_norm_quant", weight_offset=1.0)
    want_plan = plans.plan_rows(4, 64, BF16, aligned=True, limits=plans.H200_LIMITS, op="rms_norm_quant")
    assert launch.template is quant.RMS_NORM_QUANT
    assert launch.template_args == ("__nv_bfloat16", *want_plan.layout.template_args())
    assert launch.plan == want_plan and launch.plan.layout.vec_width == 8
    assert launch.pointers == ("out", "x", "weight", "scale")
    assert launch.allocate == (("out", (4, 64), U8),) and launch.returns == "out"
    assert launch.scalars == (4, 64, 64, 64, np.float32(1e-6), np.float32(1.0))


@heuristic_plans
def test_fused_add_rms_norm_quant_launch():
    launch = _norm("fused_add_rms_norm_quant")
    assert launch.template is quant.FUSED_ADD_RMS_NORM_QUANT
    assert launch.pointers == ("out", "x", "residual", "weight", "scale")
    assert launch.returns == ("out", "residual")
    assert launch.scalars[:5] == (4, 64, 64, 64, 64)


@heuristic_plans
def test_dynamic_launches_allocate_out_and_scales():
    launch = _norm("rms_norm_dynamic_per_token_quant", x=contiguous((2, 3, 64), F16), scale_ub=2.0)
    assert launch.template is quant.RMS_NORM_DYNAMIC
    assert launch.pointers == ("out", "scales", "x", "weight")
    assert launch.allocate == (("out", (2, 3, 64), U8), ("scales", (2, 3, 1), F32))
    assert launch.returns == ("out", "scales")
    assert launch.scalars == (6, 64, 64, 64, 1, np.float32(1e-6), np.float32(0.0), np.float32(2.0))
    fused = _norm("fused_add_rms_norm_dynamic_per_token_quant")
    assert fused.pointers == ("out", "scales", "x", "residual", "weight")
    assert fused.scalars[-1] == np.float32(np.inf)  # no bound


@heuristic_plans
def test_unaligned_fp8_output_gives_scalar_accesses():
    """The FP8 output is written kVecWidth bytes at a time: an out 4 bytes off 16 is too little for bf16's 8."""
    out = Sig.contiguous((4, 64), U8, 4)
    assert _norm("rms_norm_quant", out=out).plan.layout.vec_width == 1
    assert _norm("rms_norm_quant", out=Sig.contiguous((4, 64), U8, 8)).plan.layout.vec_width == 8


@heuristic_plans
def test_silu_and_mul_quant_launch():
    op = launcher.ops()["silu_and_mul_quant"]
    launch = op.prepare(prepare_args("silu_and_mul_quant", x=contiguous((3, 256), F16), scale=contiguous((1,), F32),
                                     out=None))
    assert launch.template is quant.ACT_AND_MUL_QUANT
    assert launch.template_args == ("__half", 0, 2, False)  # 4-byte vectors at decode
    assert launch.pointers == ("out", "x", ("x", 128 * 2), "scale")
    assert launch.allocate == (("out", (3, 128), U8),)
    assert launch.scalars == (128, 256, 256, 128, 3)  # d, 32-bit row strides (x, x, out), num_rows


def test_silu_and_mul_quant_row_strides_are_32_bit():
    """As silu_and_mul's: x's rows (2 * d apart when contiguous) and out's must be fewer
    than 2**31 elements apart; one row passes whatever its stride."""
    op = launcher.ops()["silu_and_mul_quant"]

    def prepare(x, out=None):
        return op.prepare(prepare_args("silu_and_mul_quant", x=x, scale=contiguous((1,), F32), out=out))

    d = 2**30  # a contiguous x's rows are 2 * d = 2**31 elements apart
    with pytest.raises(ValueError, match=r"x: rows 2147483648 elements apart; expected fewer than 2\*\*31"):
        prepare(contiguous((2, 2 * d), F16))
    with pytest.raises(ValueError, match=r"out: rows 2147483648 elements apart"):
        prepare(contiguous((2, 256), F16), out=Sig((2, 128), (2**31, 1), np.dtype(U8), 0))
    assert prepare(contiguous((1, 2 * d), F16)).scalars == (d, 0, 0, 0, 1)
    assert prepare(contiguous((2, 2 * (d - 8)), F16)).scalars[1:3] == (2 * (d - 8), 2 * (d - 8))


def test_zero_rows_launch_nothing():
    launch = _norm("rms_norm_dynamic_per_token_quant", x=contiguous((0, 64), F32))
    assert launch.template is None
    assert launch.allocate == (("out", (0, 64), U8), ("scales", (0, 1), F32))


@pytest.mark.parametrize("op, kwargs, error, message", [
    ("rms_norm_quant", dict(scale=None), TypeError, r"scale: expected a device float32 array of shape \(1,\), got None"),
    ("rms_norm_quant", dict(scale=contiguous((1,), F16)), TypeError,
     r"scale: expected dtype float32 \(a per-tensor scale\), got float16"),
    ("rms_norm_quant", dict(scale=contiguous((2,), F32)), ValueError, r"scale: expected shape \(1,\)"),
    ("rms_norm_quant", dict(scale=contiguous((), F32)), ValueError, r"scale: expected shape \(1,\)"),
    ("fused_add_rms_norm_quant", dict(scale=contiguous((1, 1), F32)), ValueError, r"scale: expected shape \(1,\)"),
    ("rms_norm_quant", dict(out=contiguous((4, 64), BF16)), TypeError,
     r"out: expected dtype uint8 \(the result dtype\), got bfloat16"),
    ("rms_norm_quant", dict(out=contiguous((4, 32), U8)), ValueError, "out: expected shape"),
    ("rms_norm_dynamic_per_token_quant", dict(scale_ub=0.0), ValueError, "scale_ub: expected a finite value > 0"),
    ("rms_norm_dynamic_per_token_quant", dict(scale_ub=-1.0), ValueError, "scale_ub: expected a finite value > 0"),
    ("rms_norm_dynamic_per_token_quant", dict(scale_ub=float("inf")), ValueError, "scale_ub: expected a finite"),
    ("rms_norm_dynamic_per_token_quant", dict(scale_ub=float("nan")), ValueError, "scale_ub: expected a finite"),
    ("rms_norm_dynamic_per_token_quant", dict(scale_ub=1e-40), ValueError,
     r"scale_ub: 1e-40 is below the smallest .*; pass a magnitude of at least"),  # not "pass 0": 0 is refused too
    ("rms_norm_dynamic_per_token_quant", dict(scale_ub="1"), TypeError, "scale_ub: expected a real number"),
    ("rms_norm_dynamic_per_token_quant", dict(scales=contiguous((4,), F32)), ValueError,
     r"scales: expected shape \(4, 1\)"),
    ("fused_add_rms_norm_dynamic_per_token_quant", dict(scales=contiguous((4, 1), F16)), TypeError,
     "scales: expected dtype float32"),
    ("fused_add_rms_norm_quant", dict(residual=contiguous((4, 64), F32)), TypeError,
     r"residual: expected dtype bfloat16 \(the dtype of x\)"),
    ("fused_add_rms_norm_dynamic_per_token_quant", dict(residual=None), TypeError, "residual: expected a device"),
    ("rms_norm_quant", dict(eps=-1.0), ValueError, "eps: expected a finite value >= 0"),
])
def test_quant_intake_errors_name_the_argument(op, kwargs, error, message):
    with pytest.raises(error, match=message):
        _norm(op, **kwargs)


def test_silu_and_mul_quant_intake_errors():
    op = launcher.ops()["silu_and_mul_quant"]
    with pytest.raises(ValueError, match=r"x: expected shape \(\.\.\., 2 \* d\)"):
        op.prepare(prepare_args("silu_and_mul_quant", x=contiguous((3, 7), F16), scale=contiguous((1,), F32),
                                out=None))
    with pytest.raises(TypeError, match="scale: expected dtype float32"):
        op.prepare(prepare_args("silu_and_mul_quant", x=contiguous((3, 8), F16), scale=contiguous((1,), F16),
                                out=None))
    with pytest.raises(TypeError, match="out: expected dtype uint8"):
        op.prepare(prepare_args("silu_and_mul_quant", x=contiguous((3, 8), F16), scale=contiguous((1,), F32),
                                out=contiguous((3, 4), F16)))


_X, _W, _S = np.ones((4, 64), F16), np.ones(64, F16), np.ones(1, F32)
REFUSED = [  # (op, args, kwargs): refused alike by the kernel op and its float64 reference
    ("rms_norm_quant", (_X, _W, None), {}),
    ("rms_norm_quant", (_X, _W, _S.astype(F16)), {}),
    ("rms_norm_quant", (_X, _W, np.ones(2, F32)), {}),
    ("rms_norm_quant", (_X, np.ones(63, F16), _S), {}),
    ("rms_norm_quant", (_X, _W, _S), {"eps": -1.0}),
    ("fused_add_rms_norm_quant", (_X, _X.astype(F32), _W, _S), {}),
    ("fused_add_rms_norm_quant", (_X, _X, _W, np.ones((1, 1), F32)), {}),
    ("rms_norm_dynamic_per_token_quant", (_X, _W), {"scale_ub": 0.0}),
    ("rms_norm_dynamic_per_token_quant", (_X, _W), {"scale_ub": 1e-39}),
    ("rms_norm_dynamic_per_token_quant", (_X.astype(np.int32), _W), {}),
    ("fused_add_rms_norm_dynamic_per_token_quant", (_X, None, _W), {}),
    ("fused_add_rms_norm_dynamic_per_token_quant", (_X, _X, _W), {"scale_ub": -2.0}),
    ("silu_and_mul_quant", (np.ones((4, 7), F16), _S), {}),
    ("silu_and_mul_quant", (np.ones((4, 8), F16), None), {}),
    ("silu_and_mul_quant", (np.ones((4, 8), F16), np.ones(1, F16)), {}),
]


@pytest.mark.parametrize("op, args, kwargs", REFUSED)
def test_reference_refuses_what_the_kernel_refuses(fake_launcher, op, args, kwargs):
    assert_same_error(getattr(cupykern, op), getattr(reference, op), *args, **kwargs)


def test_reference_takes_what_the_kernel_takes(fake_launcher):
    for op, args, kwargs in (("rms_norm_quant", (_X, _W, _S), {}), ("fused_add_rms_norm_quant", (_X, _X.copy(), _W, _S), {}),
                             ("rms_norm_dynamic_per_token_quant", (_X, _W), {"scale_ub": 3.0}),
                             ("fused_add_rms_norm_dynamic_per_token_quant", (_X, _X.copy(), _W), {}),
                             ("silu_and_mul_quant", (np.ones((4, 8), F16), _S), {})):
        assert kernel_and_reference_errors(getattr(cupykern, op), getattr(reference, op), *args, **kwargs) == (None, None)
    assert len(fake_launcher) == 5


def test_written_arrays_may_not_overlap_the_scale_or_the_weight(fake_launcher):
    """Every block reads the scale (and the weight) while others write out and residual: a
    scale inside out or residual, or a weight inside residual, was launched (a race)."""
    from tests.helpers import FakeArray

    x, w, res = FakeArray((4, 64), F16, ptr=1 << 20), FakeArray((64,), F16, ptr=2 << 20), \
        FakeArray((4, 64), F16, ptr=3 << 20)
    out, scale = FakeArray((4, 64), U8, ptr=4 << 20), FakeArray((1,), F32, ptr=5 << 20)
    scale_in_out, scale_in_res = FakeArray((1,), F32, ptr=(4 << 20) + 16), FakeArray((1,), F32, ptr=(3 << 20) + 16)
    w_in_res = FakeArray((64,), F16, ptr=(3 << 20) + 128)
    with pytest.raises(ValueError, match="out overlaps scale"):
        cupykern.rms_norm_quant(x, w, scale_in_out, out=out)
    with pytest.raises(ValueError, match="out overlaps scale"):
        cupykern.fused_add_rms_norm_quant(x, res, w, scale_in_out, out=out)
    with pytest.raises(ValueError, match="residual overlaps scale"):
        cupykern.fused_add_rms_norm_quant(x, res, w, scale_in_res)
    with pytest.raises(ValueError, match="residual overlaps weight"):
        cupykern.fused_add_rms_norm_quant(x, res, w_in_res, scale)
    with pytest.raises(ValueError, match="residual overlaps weight"):
        cupykern.fused_add_rms_norm_dynamic_per_token_quant(x, res, w_in_res)
    assert fake_launcher == []
    cupykern.fused_add_rms_norm_quant(x, res, w, scale, out=out)  # disjoint: launched
    assert len(fake_launcher) == 1


def test_reference_takes_the_scale_ub_the_kernel_takes():
    """A complex scale_ub with no imaginary part (or a 0-d array) passes the op's check;
    the reference then raised a TypeError naming no argument."""
    x, w = np.ones((2, 8), F16), np.ones(8, F16)
    want = reference.rms_norm_dynamic_per_token_quant(x, w, scale_ub=0.5)
    for bound in (0.5 + 0j, np.array(0.5), np.float16(0.5)):
        got = reference.rms_norm_dynamic_per_token_quant(x, w, scale_ub=bound)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
    got = reference.fused_add_rms_norm_dynamic_per_token_quant(x, x, w, scale_ub=0.5 + 0j)
    assert got[1].max() <= 0.5 / 448


def test_quant_ops_are_declared_with_their_plan_kinds():
    ops = launcher.ops()
    for name in ("rms_norm_quant", "fused_add_rms_norm_quant", "rms_norm_dynamic_per_token_quant",
                 "fused_add_rms_norm_dynamic_per_token_quant"):
        assert ops[name].plan_kind == "rows" and set(ops[name].launch_options) == set(plans.ROW_OVERRIDE_KEYS)
    assert ops["silu_and_mul_quant"].plan_kind == "activation"
    assert set(quant.__all__) <= set(cupykern.__all__) and set(quant.__all__) <= set(reference.__all__)


def test_validation_reads_uint8_outputs_as_e4m3fn():
    from cupykern import validation

    bits = np.array([[0x38, 0x7E, 0x7F]], dtype=np.uint8)
    assert validation.compare_array(bits, [[1.0, 448.0, np.nan]], _dtypes.float8_e4m3fn).ok
    assert validation.compare_array(bits, [[1.125, 416.0, np.nan]], _dtypes.float8_e4m3fn).ok  # one unit each
    assert not validation.compare_array(bits, [[1.25, 448.0, np.nan]], _dtypes.float8_e4m3fn).ok  # two units


# ----------------------------------------------------------------- GPU helpers
class GuardedBytes:
    """A uint8 output view poisoned with E4M3FN NaN (0x7f) inside a buffer of sentinel
    bytes (0xa5), rows ``row_pad`` bytes wider and ``margin`` bytes in (plus ``misalign``)."""

    SENTINEL = 0xA5

    def __init__(self, shape, *, row_pad: int = 8, margin: int = 64, misalign: int = 0):
        rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
        width = shape[-1] + row_pad
        self.buffer = cupy.full(2 * margin + rows * width, self.SENTINEL, dtype=np.uint8)
        body = self.buffer[margin + misalign: margin + misalign + rows * width].reshape(rows, width)
        self.view = body[:, : shape[-1]].reshape(shape)
        self.view[...] = 0x7F
        self._mask = np.ones(self.buffer.shape, dtype=bool)
        self._mask[(np.arange(rows * width).reshape(rows, width)[:, : shape[-1]].ravel() + margin + misalign)] = False

    def check_margins(self):
        outside = self.buffer.get()[self._mask]
        assert (outside == self.SENTINEL).all(), "kernel wrote outside its output"


def _ordinal(bits: np.ndarray) -> np.ndarray:
    """E4M3FN bits as integers in value order (+0 and -0 both 0)."""
    magnitude = (bits & 0x7F).astype(np.int64)
    return np.where(bits & 0x80, -magnitude, magnitude)


def assert_fp8_matches(got, want_values, *, seed, fraction=ONE_UNIT_FRACTION, slack=ONE_UNIT_SLACK):
    """``got`` (uint8 E4M3FN bits, device or host) equals the bits of the float64 reference
    ``want_values`` except for at most ``fraction`` of the elements (plus ``slack``) one unit
    apart; NaN exactly where the reference has NaN (0x7f or 0xff)."""
    got = host(got)
    want_values = np.asarray(want_values, dtype=np.float64)
    assert got.dtype == np.uint8 and got.shape == want_values.shape
    nan_got, nan_want = (got & 0x7F) == 0x7F, np.isnan(want_values)
    assert np.array_equal(nan_got, nan_want), f"NaN pattern differs (seed {seed})"
    want = e4m3fn_bits(want_values)
    differ = (got != want) & ~nan_want
    steps = np.abs(_ordinal(got[differ]) - _ordinal(want[differ]))
    assert (steps <= 1).all(), f"{int((steps > 1).sum())} elements more than one unit off (seed {seed})"
    allowed = int(fraction * got.size) + slack
    assert differ.sum() <= allowed, f"{int(differ.sum())} one-unit differences of {got.size} > {allowed} (seed {seed})"


def _quantise_fp32(y32, inv32) -> np.ndarray:
    """The kernel's own rounding of fp32 values: round_e4m3fn(float32(y32 * inv32))."""
    with np.errstate(invalid="ignore", over="ignore"):
        return e4m3fn_bits((np.asarray(y32, np.float32) * np.float32(inv32)).astype(np.float64))


def _device_scale(value):
    return cupy.asarray(np.array([value], dtype=np.float32))


def _norm_inputs(rng, rows, hidden, dtype, scale=1.0):
    return (random_device(rng, (rows, hidden), dtype, scale=scale),
            random_device(rng, (hidden,), dtype, scale=0.1, loc=1.0))


SHAPES = [(0, 64), (1, 1), (1, 4096), (3, 5), (3, 127), (64, 128), (64, 5120), (257, 4096), (4097, 64),
          (16, 8192), (3, 65536)]
STATIC_SCALE = 4.0 / 448.0


# ----------------------------------------------------------------- GPU: values
@pytest.mark.gpu
@pytest.mark.parametrize("rows, hidden", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_rms_norm_quant_matches_reference(rng, rows, hidden, dtype):
    x, w = _norm_inputs(rng, rows, hidden, dtype)
    scale = _device_scale(STATIC_SCALE)
    out = GuardedBytes((rows, hidden))
    assert cupykern.rms_norm_quant(x, w, scale, 1e-6, out=out.view) is out.view
    assert_fp8_matches(out.view, reference.rms_norm_quant(x, w, scale, 1e-6), seed=rng.seed)
    out.check_margins()


@pytest.mark.gpu
@pytest.mark.parametrize("rows, hidden", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_fused_add_rms_norm_quant_matches_reference(rng, rows, hidden, dtype):
    x, w = _norm_inputs(rng, rows, hidden, dtype)
    residual = random_device(rng, (rows, hidden), dtype)
    scale = _device_scale(STATIC_SCALE)
    want, want_residual = reference.fused_add_rms_norm_quant(x, residual, w, scale, weight_offset=0.0)
    x_before = x.copy()
    out = GuardedBytes((rows, hidden))
    got, got_residual = cupykern.fused_add_rms_norm_quant(x, residual, w, scale, out=out.view)
    assert got is out.view and got_residual is residual
    np.testing.assert_array_equal(residual.get().astype(np.float64), want_residual)  # the rounded sum, exactly
    np.testing.assert_array_equal(x.get().view(np.uint8), x_before.get().view(np.uint8))  # x is read only
    assert_fp8_matches(out.view, want, seed=rng.seed)
    out.check_margins()


@pytest.mark.gpu
@pytest.mark.parametrize("rows, hidden", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("fused", [False, True])
def test_dynamic_per_token_quant_matches_reference(rng, rows, hidden, dtype, fused):
    x, w = _norm_inputs(rng, rows, hidden, dtype)
    out = GuardedBytes((rows, hidden))
    scales = cupy.full((rows, 1), np.nan, dtype=np.float32)
    if fused:
        residual = random_device(rng, (rows, hidden), dtype)
        want, want_scales, want_residual = reference.fused_add_rms_norm_dynamic_per_token_quant(x, residual, w)
        got, got_scales = cupykern.fused_add_rms_norm_dynamic_per_token_quant(x, residual, w, out=out.view,
                                                                              scales=scales)
        np.testing.assert_array_equal(residual.get().astype(np.float64), want_residual)
    else:
        want, want_scales = reference.rms_norm_dynamic_per_token_quant(x, w)
        got, got_scales = cupykern.rms_norm_dynamic_per_token_quant(x, w, out=out.view, scales=scales)
    assert got is out.view and got_scales is scales
    assert_close(scales, want_scales, F32, seed=rng.seed)
    assert_fp8_matches(out.view, want, seed=rng.seed)
    out.check_margins()
    if rows:
        assert (np.abs(decode(out.view.get())).max(axis=-1) == 448.0).all()  # each row's maximum maps to 448


@pytest.mark.gpu
@pytest.mark.parametrize("rows, d", [(0, 64), (1, 1), (3, 7), (5, 128), (64, 11008), (257, 14336), (4097, 64)])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_silu_and_mul_quant_matches_reference(rng, rows, d, dtype):
    x = random_device(rng, (rows, 2 * d), dtype, scale=2.0)
    scale = _device_scale(STATIC_SCALE)
    out = GuardedBytes((rows, d))
    assert cupykern.silu_and_mul_quant(x, scale, out=out.view) is out.view
    assert_fp8_matches(out.view, reference.silu_and_mul_quant(x, scale), seed=rng.seed)
    out.check_margins()


@pytest.mark.gpu
@pytest.mark.parametrize("rows, d", [(1, 14336), (64, 11008), (257, 14336), (4097, 64)])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_silu_and_mul_quant_walks_give_the_same_bytes(rng, rows, d, dtype):
    """A block per item and the grid-stride walk (activation.cu's kGridStride) agree."""
    x = random_device(rng, (rows, 2 * d), dtype, scale=2.0)
    scale = _device_scale(STATIC_SCALE)
    got = []
    for grid_stride in (True, False):
        out = GuardedBytes((rows, d))
        with launcher.overrides(grid_stride=grid_stride):
            cupykern.silu_and_mul_quant(x, scale, out=out.view)
        out.check_margins()
        got.append(out.view.get())
    np.testing.assert_array_equal(got[0], got[1])
    assert_fp8_matches(cupy.asarray(got[1]), reference.silu_and_mul_quant(x, scale), seed=rng.seed)


# ----------------------------------------------------------------- GPU: the one rounding of the fp32 value
@pytest.mark.gpu
@pytest.mark.parametrize("hidden", [5, 4096, 65536])
def test_fp32_outputs_are_the_rounding_of_the_unquantised_kernels(rng, hidden):
    """In float32, rms_norm and silu_and_mul return y itself (their rounding to float32 is
    the identity, the code is the same): the quantised ops must be exactly
    round_e4m3fn(float32(y * float32(1 / scale))), with no tolerance."""
    x, w = _norm_inputs(rng, 33, hidden, F32, scale=3.0)
    inv = np.float32(1) / np.float32(STATIC_SCALE)
    y = cupykern.rms_norm(x, w).get()
    np.testing.assert_array_equal(cupykern.rms_norm_quant(x, w, _device_scale(STATIC_SCALE)).get(),
                                  _quantise_fp32(y, inv))
    out, scales = cupykern.rms_norm_dynamic_per_token_quant(x, w, scale_ub=10.0)
    s = np.maximum(np.minimum(np.abs(y).max(axis=-1, keepdims=True), np.float32(10.0)) / np.float32(448),
                   np.float32(1) / np.float32(448 * 512)).astype(np.float32)
    np.testing.assert_array_equal(scales.get(), s)
    np.testing.assert_array_equal(out.get(), _quantise_fp32(y, np.float32(1) / s))
    gate_up = random_device(rng, (33, 2 * hidden), F32, scale=2.0)
    h = cupykern.silu_and_mul(gate_up).get()
    np.testing.assert_array_equal(cupykern.silu_and_mul_quant(gate_up, _device_scale(STATIC_SCALE)).get(),
                                  _quantise_fp32(h, inv))


# ----------------------------------------------------------------- GPU: layouts and extremes
@pytest.mark.gpu
@pytest.mark.parametrize("hidden", [5, 128, 4096])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_strided_and_misaligned_views(rng, hidden, dtype):
    wide = random_device(rng, (37, hidden + 24), dtype)
    x = wide[:, 3:3 + hidden]
    w = random_device(rng, (hidden,), dtype, scale=0.1, loc=1.0)
    scale = _device_scale(STATIC_SCALE)
    for misalign in (0, 1, 3):
        out = GuardedBytes((37, hidden), misalign=misalign)
        cupykern.rms_norm_quant(x, w, scale, out=out.view)
        assert_fp8_matches(out.view, reference.rms_norm_quant(x, w, scale), seed=rng.seed)
        out.check_margins()
        out = GuardedBytes((37, hidden), misalign=misalign)
        scales = cupy.empty((37, 3), dtype=np.float32)[:, 1:2]  # strided scales
        cupykern.rms_norm_dynamic_per_token_quant(x, w, out=out.view, scales=scales)
        want, want_scales = reference.rms_norm_dynamic_per_token_quant(x, w)
        assert_fp8_matches(out.view, want, seed=rng.seed)
        assert_close(scales, want_scales, F32, seed=rng.seed)
        out.check_margins()
    gate_up = random_device(rng, (37, 2 * hidden + 6), dtype)[:, 3:3 + 2 * hidden]
    out = GuardedBytes((37, hidden), misalign=1)
    cupykern.silu_and_mul_quant(gate_up, scale, out=out.view)
    assert_fp8_matches(out.view, reference.silu_and_mul_quant(gate_up, scale), seed=rng.seed)
    out.check_margins()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_saturation_nan_and_zero_rows(rng, dtype):
    x, w = _norm_inputs(rng, 4, 256, dtype)
    x[1] = 0
    x[2, 7] = np.nan
    tiny = _device_scale(1e-3)  # most values beyond 448: saturated
    assert_fp8_matches(cupykern.rms_norm_quant(x, w, tiny), reference.rms_norm_quant(x, w, tiny), seed=rng.seed)
    got = cupykern.rms_norm_quant(x, w, tiny).get()
    assert set(np.unique(got[0] & 0x7F)) >= {0x7E}
    assert ((got[2] & 0x7F) == 0x7F).all()  # the NaN row
    out, scales = cupykern.rms_norm_dynamic_per_token_quant(x, w)
    scales = scales.get()
    assert scales[1, 0] == np.float32(MIN_SCALE) and (out.get()[1] == 0).all()  # the zero row: vLLM's floor
    assert np.isnan(scales[2, 0]) and ((out.get()[2] & 0x7F) == 0x7F).all()
    zero_scale = _device_scale(0.0)
    assert_fp8_matches(cupykern.rms_norm_quant(x, w, zero_scale), reference.rms_norm_quant(x, w, zero_scale),
                       seed=rng.seed)


@pytest.mark.gpu
def test_scale_ub_bounds_the_scale(rng):
    x, w = _norm_inputs(rng, 8, 4096, BF16, scale=10.0)
    out, scales = cupykern.rms_norm_dynamic_per_token_quant(x, w, scale_ub=0.5)
    assert (scales.get() == np.float32(np.float32(0.5) / np.float32(448))).all()
    want, _ = reference.rms_norm_dynamic_per_token_quant(x, w, scale_ub=0.5)
    assert_fp8_matches(out, want, seed=rng.seed)


@pytest.mark.gpu
def test_host_scale_is_refused():
    x = cupy.ones((4, 64), dtype=np.float16)
    w = cupy.ones(64, dtype=np.float16)
    with pytest.raises(TypeError, match="scale"):
        cupykern.rms_norm_quant(x, w, np.ones(1, np.float32))
    with pytest.raises(TypeError, match="scale"):
        cupykern.silu_and_mul_quant(x, np.ones(1, np.float32))
    with pytest.raises(ValueError, match="out overlaps x"):
        cupykern.rms_norm_quant(x, w, _device_scale(1.0), out=x.view(np.uint8)[:, :64])


# ----------------------------------------------------------------- GPU: streams and graphs
@pytest.mark.gpu
def test_graph_capture_reads_the_scale_at_replay(rng):
    dtype = _dtypes.bfloat16
    x, w = _norm_inputs(rng, 16, 4096, dtype)
    residual = random_device(rng, (16, 4096), dtype)
    gate_up = random_device(rng, (16, 2 * 1024), dtype)
    scale = _device_scale(STATIC_SCALE)
    out, out_fused, out_act = (cupy.full((16, n), 0x7F, dtype=np.uint8) for n in (4096, 4096, 1024))
    out_dyn, scales = cupy.full((16, 4096), 0x7F, dtype=np.uint8), cupy.full((16, 1), np.nan, dtype=np.float32)
    res_graph = residual.copy()
    cupykern.rms_norm_quant(x, w, scale, out=out)  # compile outside the capture
    cupykern.fused_add_rms_norm_quant(x, residual.copy(), w, scale, out=out_fused)
    cupykern.rms_norm_dynamic_per_token_quant(x, w, out=out_dyn, scales=scales)
    cupykern.silu_and_mul_quant(gate_up, scale, out=out_act)
    for a in (out, out_fused, out_act, out_dyn):
        a.fill(0x7F)
    cupy.cuda.Device().synchronize()
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        cupykern.rms_norm_quant(x, w, scale, out=out)
        cupykern.fused_add_rms_norm_quant(x, res_graph, w, scale, out=out_fused)
        cupykern.rms_norm_dynamic_per_token_quant(x, w, out=out_dyn, scales=scales)
        cupykern.silu_and_mul_quant(gate_up, scale, out=out_act)
        graph = stream.end_capture()
    assert (out.get() == 0x7F).all()  # captured, not run
    scale.fill(2 * STATIC_SCALE)  # the replay reads the scale's current value
    cupy.cuda.Device().synchronize()
    graph.launch(stream=stream)
    stream.synchronize()
    assert_fp8_matches(out, reference.rms_norm_quant(x, w, scale), seed=rng.seed)
    want_fused, want_res = reference.fused_add_rms_norm_quant(x, residual, w, scale)
    assert_fp8_matches(out_fused, want_fused, seed=rng.seed)
    np.testing.assert_array_equal(res_graph.get().astype(np.float64), want_res)
    want_dyn, want_scales = reference.rms_norm_dynamic_per_token_quant(x, w)
    assert_fp8_matches(out_dyn, want_dyn, seed=rng.seed)
    assert_close(scales, want_scales, F32, seed=rng.seed)
    assert_fp8_matches(out_act, reference.silu_and_mul_quant(gate_up, scale), seed=rng.seed)


@pytest.mark.gpu
def test_registry_check_passes():
    from cupykern import registry, validation

    for name in quant.__all__:
        spec = registry.all_specs()[name]
        for n in spec.check_token_counts:
            result = validation.check_op(spec, n, spec.check_sizes[0], BF16, seed=0)
            assert result.ok, f"{name} at {n} tokens: {result.message}"
