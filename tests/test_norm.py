"""Norm family: rms_norm, fused_add_rms_norm, layer_norm (kernels_cu/norm.cu).

CPU: reference properties; each op's intake spec and plan rule on hand-built call
signatures (the Launch it returns, the errors naming the argument). GPU (marked):
kernels against the float64 reference on fresh seeded inputs, outputs poisoned and
guarded, over dtypes, shapes and layouts.
"""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import cupy
import numpy as np
import pytest

import cupykern
from cupykern import _dtypes, families, launcher, plans, reference
from cupykern._arrays import Sig
from cupykern.ops import norm
from tests.helpers import (DTYPES, DTYPE_IDS, Guarded, assert_close, assert_same_error, contiguous,
                           kernel_and_reference_errors, poisoned, prepare_args, random_device)

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


def test_reference_messages_say_a_float64_array_is_checked_as_float32():
    """Helper 63: a float64 array's stride message quoted the float32 array it is checked
    as (8 bytes for a stride of 16) without saying so."""
    with pytest.raises(ValueError, match=r"got stride 8 bytes; .* \(bytes of the float32 array this float64 one is "
                                         r"checked as: half its own\)$"):
        reference.rms_norm(np.zeros((4, 512))[:, ::2], np.ones(256))
    with pytest.raises(ValueError, match=r"got stride 8 bytes; pass cupy.ascontiguousarray\(x\)$"):
        reference.rms_norm(np.zeros((4, 512), np.float32)[:, ::2], np.ones(256, np.float32))
    # helper 62: "weight: expected dtype float32 (the dtype of x)" where x was float64
    with pytest.raises(TypeError, match=r"the dtype of x\), got bfloat16 \(x: float64, checked as float32\)$"):
        reference.rms_norm(np.zeros((4, 512)), np.ones(512, _dtypes.bfloat16))


@pytest.mark.parametrize("kind", [lambda v: complex(v), np.complex64, lambda v: Fraction(v).limit_denominator(10**9),
                                  lambda v: Decimal(repr(v)), np.longdouble, np.array],
                         ids=["complex", "complex64", "Fraction", "Decimal", "longdouble", "0-d array"])
def test_references_compute_in_float64_whatever_real_scalar_the_checks_take(kind):
    """Helper 76: the checks take these scalars as the ops do, but the references used them
    raw: a complex eps gave complex128 results, a Fraction or Decimal one failed inside
    NumPy, a long double gave float128. Each now gives the float64 result of the float."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 16)).astype(np.float32)
    w, b = np.full(16, 0.5, np.float32), np.zeros(16, np.float32)
    calls = {  # (eps, weight_offset or temperature) -> the reference's output
        "rms_norm": lambda eps, offset: reference.rms_norm(x, w, eps, weight_offset=offset),
        "fused_add_rms_norm": lambda eps, offset: reference.fused_add_rms_norm(x, x, w, eps, weight_offset=offset)[0],
        "layer_norm": lambda eps, offset: reference.layer_norm(x, w, b, eps),
        "rms_norm_quant": lambda eps, offset: reference.rms_norm_quant(x, w, np.array([0.1], np.float32), eps,
                                                                       weight_offset=offset),
        "rms_norm_gemv": lambda eps, offset: reference.rms_norm_gemv(x[:1], w, np.ones((4, 16), np.float32), eps),
        "softmax": lambda eps, temperature: reference.softmax(x, temperature=temperature),
    }
    for name, call in calls.items():
        got = call(kind(1e-6), kind(0.5))
        assert got.dtype == np.float64, name
        np.testing.assert_allclose(got, call(1e-6, 0.5), rtol=1e-12, atol=0, err_msg=name)


def test_references_refuse_masked_arrays_by_name():
    """Helper 76: a masked x or weight was computed on its hidden data and the mask dropped."""
    from cupykern.reference import softmax

    x = np.ma.masked_array(np.ones((2, 8), np.float32))
    x[0, 0] = np.ma.masked
    with pytest.raises(TypeError, match=r"x: expected a NumPy or CuPy array, got a masked array.*x.filled"):
        reference.rms_norm(x, np.ones(8, np.float32))
    with pytest.raises(TypeError, match=r"x: .*masked array"):
        softmax(x)
    with pytest.raises(TypeError, match=r"weight: .*masked array"):
        reference.rms_norm(x.data, np.ma.masked_array(np.ones(8, np.float32)))


def test_reference_layer_norm_is_stable_with_large_mean():
    rng = np.random.default_rng(1)
    x = 1e4 + rng.standard_normal((4, 1024))
    y = reference.layer_norm(x, None, None, eps=0.0)
    np.testing.assert_allclose(y.mean(axis=-1), 0, atol=1e-9)
    np.testing.assert_allclose(y.std(axis=-1), 1, rtol=1e-9)


# ----------------------------------------------------------------- CPU: intake spec and plan
F16, F32, BF16 = _dtypes.float16, _dtypes.float32, _dtypes.bfloat16
#: The intake tests plan with the heuristic, whatever the user's tuned file says.
heuristic_plans = pytest.mark.usefixtures("tune_file")


def _rms(*, x=None, weight=None, out=None, eps=1e-6, weight_offset=0.0, **kw):
    x = contiguous((4, 64), F16) if x is None else x
    weight = contiguous((x.shape[-1],), x.dtype) if weight is None else weight
    return norm._prepare_rms_norm(prepare_args("rms_norm", x=x, weight=weight, out=out, eps=eps,
                                               weight_offset=weight_offset, **kw))


@heuristic_plans
def test_rms_norm_launch():
    launch = _rms(weight_offset=1.0)
    want_plan = plans.plan_rows(4, 64, F16, aligned=True, limits=plans.H200_LIMITS, op="rms_norm")
    assert launch.template is norm.RMS_NORM
    assert launch.template_args == ("__half", *want_plan.layout.template_args(), want_plan.layout.fills(64, F16))
    assert launch.plan == want_plan and launch.plan.origin == "heuristic" and launch.plan.layout.vec_width == 8
    assert launch.pointers == ("out", "x", "weight")
    assert launch.allocate == (("out", (4, 64), F16),) and launch.returns == "out"
    assert launch.scalars == (4, 64, 64, 64, np.float32(1e-6), np.float32(1.0))
    assert [type(v) for v in launch.scalars] == [np.int32] * 4 + [np.float32] * 2
    assert [(r.a, r.b, r.allow_same) for r in launch.disjoint] == [("x", "out", True), ("weight", "out", False)]


@heuristic_plans
def test_rms_norm_launch_with_strided_rows_and_given_out():
    x = Sig((2, 3, 64), (3 * 128 * 2, 128 * 2, 2), np.dtype(BF16), 0)  # rows 128 elements apart
    out = Sig((2, 3, 64), (3 * 68 * 2, 68 * 2, 2), np.dtype(BF16), 0)  # rows 68 apart: not a vector multiple
    launch = _rms(x=x, out=out)
    assert launch.allocate == () and launch.returns == "out"
    assert launch.scalars[:4] == (6, 64, 128, 68)
    assert launch.plan.layout.vec_width == 1  # out's rows do not all start 16-byte aligned
    assert _rms(x=x, out=out._replace(strides=(3 * 80 * 2, 80 * 2, 2))).plan.layout.vec_width == 8


@heuristic_plans
@pytest.mark.parametrize("which", ["x", "weight", "out"])
@pytest.mark.parametrize("align", [2, 4, 8])
def test_rms_norm_unaligned_address_gives_scalar_accesses(which, align):
    sigs = {"x": contiguous((4, 64), F16), "weight": contiguous((64,), F16), "out": contiguous((4, 64), F16)}
    sigs[which] = sigs[which]._replace(align=align)
    launch = _rms(**sigs)
    assert launch.plan.layout.vec_width == 1
    assert launch.template_args[2] == 1
    assert _rms(**{**sigs, which: sigs[which]._replace(align=0)}).plan.layout.vec_width == 8


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(weight=contiguous((64,), np.float32)), TypeError, r"weight: expected dtype float16 \(the dtype of x\)"),
    (dict(weight=contiguous((63,), np.float16)), ValueError, r"weight: expected shape \(64,\), got \(63,\)"),
    (dict(weight=contiguous((64, 1), np.float16)), ValueError, r"weight: expected shape \(64,\)"),
    (dict(weight=Sig((64,), (4,), np.dtype(np.float16), 0)), ValueError, "weight: must be unit-stride"),
    (dict(x=Sig((4, 64), (2, 8), np.dtype(np.float16), 0)), ValueError, "x: the last axis must be unit-stride"),
    (dict(x=Sig((2, 3, 64), (512, 256, 2), np.dtype(np.float16), 0)), ValueError, "x: leading axes .* do not flatten"),
    (dict(x=contiguous((4, 64), np.float64)), TypeError, "x: unsupported dtype float64"),
    (dict(x=contiguous((4, 0), np.float16), weight=contiguous((0,), np.float16)), ValueError,
     "x: the last axis must have at least one element"),
    (dict(eps=-1.0), ValueError, "eps: expected a finite value >= 0"),
    (dict(eps=float("nan")), ValueError, "eps: expected a finite value >= 0"),
    (dict(out=contiguous((4, 63), np.float16)), ValueError, r"out: expected shape \(4, 64\), got \(4, 63\)"),
    (dict(out=contiguous((4, 64), np.float32)), TypeError, "out: expected dtype float16"),
    (dict(out=Sig((4, 64), (2, 8), np.dtype(np.float16), 0)), ValueError, "out: the last axis must be unit-stride"),
])
def test_rms_norm_intake_errors_name_the_argument(kwargs, error, message):
    x = kwargs.pop("x", contiguous((4, 64), F16))
    with pytest.raises(error, match=message):
        _rms(x=x, limits=None, **kwargs)  # checked before the device's limits are needed


@heuristic_plans
def test_eps_zero_and_the_smallest_normal_reach_the_kernel_exactly():
    """0 stays allowed (exact; an all-zero row gives NaN, as the float64 reference does);
    the smallest normal float32 is the smallest nonzero eps (not flushed by -ftz=true)."""
    tiny = np.finfo(np.float32).tiny
    assert _rms(eps=0.0).scalars[4] == 0 and _rms(eps=float(tiny)).scalars[4] == tiny
    with np.errstate(divide="ignore", invalid="ignore"):
        assert np.isnan(reference.rms_norm(np.zeros((1, 256), np.float32), np.ones(256, np.float32), 0.0)).all()
    assert (reference.rms_norm(np.zeros((1, 256), np.float32), np.ones(256, np.float32), float(tiny)) == 0).all()


def test_rms_norm_needs_a_gpu_only_to_plan():
    with pytest.raises(RuntimeError, match="rms_norm: no CUDA GPU"):
        _rms(limits=None)


def test_rms_norm_zero_rows_launch_nothing():
    for x in (contiguous((0, 4096), F16), contiguous((2, 0, 4096), F16)):
        launch = _rms(x=x, limits=None)  # no plan, so no device limits either
        assert launch.template is None and launch.plan is None
        assert launch.allocate == (("out", x.shape, F16),) and launch.returns == "out"
    given = _rms(x=contiguous((0, 4096), F16), out=contiguous((0, 4096), F16), limits=None)
    assert given.template is None and given.allocate == ()


@heuristic_plans
def test_rms_norm_launch_follows_overrides():
    launch = _rms(x=contiguous((300, 3000), BF16), overrides={"threads_per_row": 64, "block_size": 256})
    assert launch.plan.origin == "override"
    assert (launch.plan.layout.threads_per_row, launch.plan.rows_per_block, launch.plan.block_size) == (64, 4, 256)
    assert launch.template_args[:5] == ("__nv_bfloat16", 64, 8, launch.plan.layout.vecs_per_thread, 32)
    with pytest.raises(ValueError, match="block_size and rows_per_block"):
        _rms(overrides={"block_size": 256, "rows_per_block": 2})


def test_rms_norm_arguments_are_32_bit_the_others_64():
    """rms_norm's kernel takes num_rows, hidden_size and the row strides as 32-bit ints:
    2**31 or more of any is refused, naming the array. layer_norm's and
    fused_add_rms_norm's are 64-bit."""
    far = 2**31
    with pytest.raises(ValueError, match=r"x: rows 2147483648 elements apart; expected fewer than 2\*\*31"):
        _rms(x=Sig((2, 64), (far * 2, 2), np.dtype(F16), 0))
    with pytest.raises(ValueError, match=r"out: rows 2147483648 elements apart"):
        _rms(out=Sig((4, 64), (far * 2, 2), np.dtype(F16), 0))
    assert _fused(residual=Sig((4, 64), (far * 2, 2), np.dtype(BF16), 0)).scalars[:4] == (4, 64, 64, far)
    with pytest.raises(ValueError, match=r"x: 2147483648 row\(s\) of 1 elements; expected fewer than 2\*\*31 of each"):
        _rms(x=contiguous((far, 1), F16))
    assert _layer(x=Sig((2, 64), (far * 4, 4), np.dtype(F32), 0)).scalars[:4] == (2, 64, far, 64)
    with pytest.raises(ValueError, match=r"x: 1 row\(s\) of 2147483648 elements"):
        _rms(x=contiguous((1, far), F16))
    assert _rms(x=Sig((2, 64), ((far - 1) * 2, 2), np.dtype(F16), 0)).scalars[:4] == (2, 64, far - 1, 64)


def _fused(*, x=None, residual=None, weight=None, eps=1e-6, **kw):
    x = contiguous((4, 64), BF16) if x is None else x
    residual = contiguous(x.shape, x.dtype) if residual is None else residual
    weight = contiguous((x.shape[-1],), x.dtype) if weight is None else weight
    return norm._prepare_fused_add_rms_norm(prepare_args("fused_add_rms_norm", x=x, residual=residual, weight=weight,
                                                         eps=eps, weight_offset=0.0, **kw))


@heuristic_plans
def test_fused_add_rms_norm_launch():
    # x and residual as the column halves of one (tokens, 2 * 64) buffer.
    half = Sig((4, 64), (256, 2), np.dtype(BF16), 0)
    launch = _fused(x=half, residual=half._replace(align=0))
    assert launch.template is norm.FUSED_ADD_RMS_NORM
    assert launch.pointers == ("x", "residual", "weight")
    assert launch.allocate == () and launch.returns == ("x", "residual")
    assert launch.scalars[:4] == (4, 64, 128, 128)
    assert [(r.a, r.b, r.allow_same) for r in launch.disjoint] == [("x", "residual", False), ("weight", "x", False),
                                                                   ("weight", "residual", False)]
    assert launch.plan == plans.plan_rows(4, 64, BF16, aligned=True, limits=plans.H200_LIMITS,
                                          op="fused_add_rms_norm")
    assert _fused(residual=contiguous((4, 64), BF16, align=2)).plan.layout.vec_width == 1


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(residual=contiguous((4, 64), np.float32)), TypeError, "residual: expected dtype bfloat16"),
    (dict(residual=contiguous((4, 32), _dtypes.bfloat16)), ValueError, r"residual: expected shape \(4, 64\)"),
    (dict(residual=Sig((4, 64), (2, 8), np.dtype(_dtypes.bfloat16), 0)), ValueError,
     "residual: the last axis must be unit-stride"),
    (dict(weight=contiguous((64,), np.float16)), TypeError, "weight: expected dtype bfloat16"),
    (dict(eps=-1e-6), ValueError, "eps"),
])
def test_fused_add_rms_norm_intake_errors(kwargs, error, message):
    with pytest.raises(error, match=message):
        _fused(limits=None, **kwargs)


def test_fused_add_rms_norm_needs_a_residual():
    with pytest.raises(TypeError, match="residual: expected a device array, got None"):
        norm._prepare_fused_add_rms_norm(prepare_args("fused_add_rms_norm", x=contiguous((4, 64), BF16), residual=None,
                                                      weight=contiguous((64,), BF16), eps=1e-6, weight_offset=0.0))


def test_fused_add_rms_norm_zero_rows():
    launch = _fused(x=contiguous((0, 64), BF16), limits=None)
    assert launch.template is None and launch.allocate == () and launch.returns == ("x", "residual")


def _layer(*, x=None, weight="default", bias="default", out=None, eps=1e-5, **kw):
    x = contiguous((4, 64), F32) if x is None else x
    weight = contiguous((x.shape[-1],), x.dtype) if weight == "default" else weight
    bias = contiguous((x.shape[-1],), x.dtype) if bias == "default" else bias
    return norm._prepare_layer_norm(prepare_args("layer_norm", x=x, weight=weight, bias=bias, out=out, eps=eps,
                                                 **kw))


@heuristic_plans
def test_layer_norm_launch():
    launch = _layer()
    assert launch.template is norm.LAYER_NORM and launch.template_args[0] == "float"
    assert launch.pointers == ("out", "x", "weight", "bias")
    assert launch.scalars == (4, 64, 64, 64, np.float32(1e-5))
    assert launch.allocate == (("out", (4, 64), F32),) and launch.returns == "out"
    assert launch.plan.layout.vec_width == 4
    # weight and bias are optional (null pointers); an absent one does not limit the alignment.
    assert _layer(weight=None, bias=None).plan.layout.vec_width == 4
    assert _layer(bias=contiguous((64,), F32, align=4)).plan.layout.vec_width == 1
    assert [(r.a, r.b, r.allow_same) for r in launch.disjoint] == [("x", "out", True), ("weight", "out", False),
                                                                   ("bias", "out", False)]


@heuristic_plans
@pytest.mark.parametrize("prepare", [_rms, _fused, _layer], ids=["rms_norm", "fused_add_rms_norm", "layer_norm"])
def test_exact_walk_where_the_layout_fills_the_row(prepare):
    """kExact (a leaf walk without bounds) exactly where the planned layout fills the row
    and the kernel is built with it: rms_norm at every layout, the other two up to 2
    leaves a thread (plans.EXACT_WALK)."""
    built = set(families.instantiations()["norm.cu"])

    def planned(num_rows, hidden_size, dtype):
        launch = prepare(x=contiguous((num_rows, hidden_size), dtype))
        assert launch.template.expr(*launch.template_args) in built
        assert launch.plan.exact is launch.template_args[-1]  # what the sweep's points record
        return launch.plan.layout, launch.template_args[-1]

    layout, exact = planned(1, 4096, BF16)  # the decode layout 256 x 2 leaves of 8
    assert layout.fills(4096, BF16) and layout.vecs_per_thread == 2 and exact is True
    assert planned(1, 4000, BF16)[1] is False and planned(1, 4104, BF16)[1] is False
    # The prefill layout 128 x 4 leaves of 8; the fused add keeps its decode layout
    # (plans.DECODE_FILL_SHARE) and with it the exact walk.
    layout, exact = planned(6000, 4096, F16)  # past rms_norm's plans.DECODE_FILL_SHARE_FILLED
    assert layout.fills(4096, F16)
    assert (layout.vecs_per_thread, exact) == ((2, True) if prepare is _fused else (4, prepare is _rms))


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(bias=contiguous((64,), np.float16)), TypeError, "bias: expected dtype float32"),
    (dict(bias=contiguous((32,), np.float32)), ValueError, r"bias: expected shape \(64,\)"),
    (dict(weight=contiguous((32,), np.float32), bias=None), ValueError, r"weight: expected shape \(64,\)"),
    (dict(out=contiguous((4, 64), np.float16)), TypeError, "out: expected dtype float32"),
    (dict(eps=float("inf")), ValueError, "eps"),
])
def test_layer_norm_intake_errors(kwargs, error, message):
    with pytest.raises(error, match=message):
        _layer(limits=None, **kwargs)


@pytest.mark.parametrize("prepare, scalar, value", [
    (_rms, "eps", 1e-40), (_rms, "eps", 1e-44), (_rms, "weight_offset", -1e-40), (_fused, "eps", 1e-40),
    (_layer, "eps", 1e-44),
])
def test_subnormal_scalars_are_refused(prepare, scalar, value):
    """The issue's eps = 1e-40 / 1e-44: -ftz=true would flush them to 0 on the GPU."""
    with pytest.raises(ValueError, match=rf"{scalar}: {value!r} is below the smallest normal float32 "
                                         r"\(1.1754944e-38\), which the kernels flush to 0"):
        prepare(limits=None, **{scalar: value})


# ----------------------------------------------------------------- CPU: the reference checks as the kernel
_X, _W = np.ones((4, 64), F16), np.ones(64, F16)
REFUSED = [  # (op, args, kwargs): refused alike by the kernel op and its float64 reference
    ("rms_norm", (None, _W), {}),
    ("rms_norm", (_X, np.ones(63, F16)), {}),
    ("rms_norm", (_X, _W.astype(F32)), {}),
    ("rms_norm", (_X.astype(np.int32), _W), {}),
    ("rms_norm", (np.ones((), F16), _W), {}),
    ("rms_norm", (np.ones((4, 0), F16), np.ones(0, F16)), {}),
    ("rms_norm", (np.ones((4, 128), F16)[:, ::2], _W), {}),           # non-unit last stride
    ("rms_norm", (np.ones((2, 4, 64), F16)[:, :3], _W), {}),          # leading axes that do not flatten
    ("rms_norm", (_X, _W), {"eps": -1.0}),
    ("rms_norm", (_X, _W), {"eps": 1e-40}),
    ("rms_norm", (_X, _W), {"eps": "1e-6"}),
    ("rms_norm", (_X, _W), {"weight_offset": float("inf")}),
    ("fused_add_rms_norm", (_X, None, _W), {}),
    ("fused_add_rms_norm", (_X, np.ones((4, 32), F16), _W), {}),
    ("fused_add_rms_norm", (_X, _X.astype(F32), _W), {}),
    ("fused_add_rms_norm", (np.broadcast_to(_W, (4, 64)), _X, _W), {}),  # written rows on the same bytes
    ("fused_add_rms_norm", (_X, _X, _W), {"eps": float("nan")}),
    ("layer_norm", (_X, _W, np.ones(32, F16)), {}),
    ("layer_norm", (_X, _W.astype(F32), None), {}),
    ("layer_norm", (_X, None, None), {"eps": 1e-44}),
    # Rows 2**31 elements apart: rms_norm's kernel strides are 32-bit (as_strided allocates nothing).
    ("rms_norm", (np.lib.stride_tricks.as_strided(np.zeros(64, F16), shape=(2, 64), strides=(2**32, 2)), _W), {}),
]


@pytest.mark.parametrize("op, args, kwargs", REFUSED)
def test_reference_refuses_what_the_kernel_refuses(fake_launcher, op, args, kwargs):
    """The issue's reference.rms_norm(None, w), a weight of the wrong length and eps=-1 among them."""
    assert_same_error(getattr(cupykern, op), getattr(reference, op), *args, **kwargs)


def test_written_arrays_may_not_overlap_the_weight_or_the_bias(fake_launcher):
    """Every block reads the weight (and the bias) while other blocks write their rows: a
    weight or bias inside out, x or residual was launched (a race, helper 53). Beside arrays
    that are only read, it is fine."""
    from tests.helpers import FakeArray

    base = {name: i << 20 for i, name in enumerate(("x", "out", "residual", "weight"), 1)}
    x, out, res = (FakeArray((4, 64), F16, ptr=base[name]) for name in ("x", "out", "residual"))
    w = FakeArray((64,), F16, ptr=base["weight"])

    def inside(name):  # a weight-shaped view of row 1 of that array
        return FakeArray((64,), F16, ptr=base[name] + 128)

    for call, message in ((lambda: cupykern.rms_norm(x, inside("out"), out=out), "out overlaps weight"),
                          (lambda: cupykern.rms_norm(x, inside("x"), out=x), "out overlaps weight"),
                          (lambda: cupykern.fused_add_rms_norm(x, res, inside("x")), "x overlaps weight"),
                          (lambda: cupykern.fused_add_rms_norm(x, res, inside("residual")), "residual overlaps weight"),
                          (lambda: cupykern.layer_norm(x, inside("out"), w, out=out), "out overlaps weight"),
                          (lambda: cupykern.layer_norm(x, w, inside("out"), out=out), "out overlaps bias"),
                          (lambda: cupykern.layer_norm(x, None, inside("x"), out=x), "out overlaps bias")):
        with pytest.raises(ValueError, match=f"^{message} in memory$"):
            call()
    assert fake_launcher == []
    cupykern.rms_norm(x, inside("x"), out=out)  # the weight inside x: both only read
    cupykern.fused_add_rms_norm(x, res, w)
    cupykern.layer_norm(x, inside("x"), inside("x"), out=out)
    assert len(fake_launcher) == 3


def test_reference_takes_what_the_kernel_takes(fake_launcher):
    wide = np.ones((4, 80), F16)
    for op, args in (("rms_norm", (wide[:, 16:], _W)), ("fused_add_rms_norm", (_X, wide[:, :64], _W)),
                     ("layer_norm", (_X, None, None))):
        assert kernel_and_reference_errors(getattr(cupykern, op), getattr(reference, op), *args) == (None, None)
    assert len(fake_launcher) == 3
    # float64, the reference's own precision, is checked as float32 would be.
    np.testing.assert_allclose(reference.rms_norm(np.full((2, 4), 2.0), np.ones(4), 0.0), 1.0)
    with pytest.raises(TypeError, match=r"weight: expected dtype float32 \(the dtype of x\), got float16"):
        reference.rms_norm(np.ones((2, 4)), np.ones(4, F16))


def test_row_ops_take_row_overrides():
    for name in ("rms_norm", "fused_add_rms_norm", "layer_norm"):
        op = launcher.ops()[name]
        assert op.plan_kind == "rows" and set(op.launch_options) == set(plans.ROW_OVERRIDE_KEYS)


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
@pytest.mark.parametrize("rows, hidden", [(5, 256), (64, 4096)])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_weight_between_rows_of_the_written_arrays(rng, rows, hidden, dtype):
    """A weight stored in the gap between two rows of the arrays an op writes (column
    slices of one buffer) shares no element with them: taken (helper 57), and the weight,
    the buffer's other columns and the results are as with separate arrays."""
    x, w = _rms_inputs(rng, rows, hidden, dtype)
    buf = random_device(rng, (rows, 2 * hidden), dtype)
    buf[:, :hidden] = poisoned((rows, hidden), dtype)  # out
    buf[2, hidden:] = w
    rest = buf[:, hidden:].copy()
    out = cupykern.rms_norm(x, buf[2, hidden:], 1e-6, out=buf[:, :hidden])
    assert out.data.ptr == buf.data.ptr
    assert_close(out, reference.rms_norm(x, w, 1e-6), dtype, seed=rng.seed)
    np.testing.assert_array_equal(buf[:, hidden:].get().astype(np.float64), rest.get().astype(np.float64))
    # fused_add_rms_norm: x and residual the first two column thirds, the weight in the third.
    residual = random_device(rng, (rows, hidden), dtype)
    want_x, want_residual = reference.fused_add_rms_norm(x, residual, w, 1e-6)
    buf = random_device(rng, (rows, 3 * hidden), dtype)
    buf[:, :hidden], buf[:, hidden:2 * hidden], buf[1, 2 * hidden:] = x, residual, w
    rest = buf[:, 2 * hidden:].copy()
    got_x, got_residual = cupykern.fused_add_rms_norm(buf[:, :hidden], buf[:, hidden:2 * hidden],
                                                      buf[1, 2 * hidden:], 1e-6)
    np.testing.assert_array_equal(got_residual.get().astype(np.float64), want_residual)
    assert_close(got_x, want_x, dtype, seed=rng.seed)
    np.testing.assert_array_equal(buf[:, 2 * hidden:].get().astype(np.float64), rest.get().astype(np.float64))


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
def test_zero_rows_with_the_smallest_normal_eps_give_zero():
    """The issue's all-zero float32 row (H = 256): eps = 1e-40 is refused (the GPU would
    flush it to 0 and give NaN); the smallest normal eps gives 0, as the reference."""
    x, w = cupy.zeros((2, 256), np.float32), cupy.ones(256, np.float32)
    tiny = float(np.finfo(np.float32).tiny)
    for got in (cupykern.rms_norm(x, w, eps=tiny), cupykern.layer_norm(x, w, None, eps=tiny),
                cupykern.fused_add_rms_norm(x.copy(), x.copy(), w, eps=tiny)[0]):
        assert (got.get() == 0).all()
    with pytest.raises(ValueError, match="eps: 1e-40 is below the smallest normal float32"):
        cupykern.rms_norm(x, w, eps=1e-40)


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
    """A row alone and inside 6144 rows (256 for the widest) gives identical bits: the
    decode and the prefill layout compute the same reduction tree (the fused add keeps
    its decode layout: plans.DECODE_FILL_SHARE; rms_norm's filled rows keep theirs to
    4224 rows: plans.DECODE_FILL_SHARE_FILLED)."""
    dtype = _dtypes.bfloat16
    rows = 6144 if hidden <= 8192 else 256  # 256 x 1024 threads: past half an H200's, the prefill layout
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
@pytest.mark.parametrize("dtype, hidden", [(_dtypes.bfloat16, 4096), (_dtypes.bfloat16, 8192), (_dtypes.float16, 4096),
                                           (_dtypes.float16, 8192), (_dtypes.float32, 4096)],
                         ids=["bf16-4096", "bf16-8192", "fp16-4096", "fp16-8192", "fp32-4096"])
def test_rereading_rows_keeps_their_bits(rng, dtype, hidden):
    """From plans.REREAD's 8192 rows rms_norm reads each row again from L2 (kReread; 256 x 2
    and 512 x 2): the reference's values, into a poisoned output, and the same bytes as the
    layout that holds the row (4 leaves a thread, overridden), as one row alone (the decode
    layout) and as the call in place (out is x: pass 2 reads x before it writes it)."""
    rows = plans.REREAD["rms_norm"][0]
    x, w = _rms_inputs(rng, rows, hidden, dtype)
    out = Guarded((rows, hidden), dtype)
    with launcher.recording() as launched:
        cupykern.rms_norm(x, w, out=out.view)
    (record,) = launched
    assert record.plan.reread and record.plan.exact
    out.check_margins()
    got = out.view.get()
    assert_close(out.view[:512], reference.rms_norm(x[:512], w), dtype, seed=rng.seed)
    assert_close(out.view[-512:], reference.rms_norm(x[-512:], w), dtype, seed=rng.seed)
    held_vecs = 2 * record.plan.layout.vecs_per_thread
    with launcher.recording() as launched, launcher.overrides(vecs_per_thread=held_vecs):
        held = cupykern.rms_norm(x, w).get()
    assert not launched[0].plan.reread
    np.testing.assert_array_equal(held.view(np.uint8), got.view(np.uint8))
    for i in (0, rows // 2 + 1, rows - 1):
        np.testing.assert_array_equal(cupykern.rms_norm(x[i:i + 1], w).get().view(np.uint8), got[i:i + 1].view(np.uint8))
    in_place = x.copy()
    cupykern.rms_norm(in_place, w, out=in_place)
    np.testing.assert_array_equal(in_place.get().view(np.uint8), got.view(np.uint8))


@pytest.mark.gpu
@pytest.mark.parametrize("threads_per_row", [32, 64, 256, 1024])
@pytest.mark.parametrize("wider", [False, True])
def test_overridden_layouts_stay_correct(rng, threads_per_row, wider):
    """Every layout a sweep may choose computes the same function (3000 bf16: 375 leaves,
    a tree of 512 columns; ``wider``: 8 columns per thread, more than the tree needs)."""
    dtype = _dtypes.bfloat16
    x, w = _rms_inputs(rng, 300, 3000, dtype)
    rows_per_block = max(1, 32 // threads_per_row)
    vecs = 8 if wider else plans.tree_vecs_per_thread(3000, dtype, threads_per_row)
    with launcher.overrides(threads_per_row=threads_per_row, vecs_per_thread=vecs, rows_per_block=rows_per_block):
        got = cupykern.rms_norm(x, w)
    assert_close(got, reference.rms_norm(x, w), dtype, seed=rng.seed)
    np.testing.assert_array_equal(got.get().view(np.uint8), cupykern.rms_norm(x, w).get().view(np.uint8))


@pytest.mark.gpu
@pytest.mark.parametrize("choices", [dict(block_size=256), dict(threads_per_row=64, block_size=256),
                                     dict(threads_per_row=32, block_size=128),
                                     dict(threads_per_row=1024, block_size=1024)])
def test_block_size_override_around_rms_norm(rng, choices):
    """A row op takes block_size (= threads_per_row x rows_per_block), as sweeps pass it;
    it used to raise TypeError."""
    dtype = _dtypes.bfloat16
    x, w = _rms_inputs(rng, 300, 3000, dtype)
    with launcher.recording() as launched, launcher.overrides(**choices):
        got = cupykern.rms_norm(x, w)
    assert_close(got, reference.rms_norm(x, w), dtype, seed=rng.seed)
    (record,) = launched
    assert record.op == "rms_norm" and record.block == (choices["block_size"], 1, 1)
    assert record.plan.origin == "override"
    assert record.plan.rows_per_block == choices["block_size"] // record.plan.layout.threads_per_row
    if "threads_per_row" in choices:
        assert record.plan.layout.threads_per_row == choices["threads_per_row"]
    with launcher.overrides(block_size=256, rows_per_block=2), pytest.raises(ValueError, match="block_size"):
        cupykern.rms_norm(x, w)


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
