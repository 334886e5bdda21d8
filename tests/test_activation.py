"""Activation family: silu_and_mul, gelu_and_mul, swiglu (kernels_cu/activation.cu).

CPU: the instantiation space (compiled by tests/test_jit_compile.py), argument checks
that run before the GPU is touched, each op's intake spec on hand-built call signatures,
reference properties, launch plans and the kernel's work walk. GPU (marked):
kernels against the float64 reference on seeded inputs, outputs poisoned and guarded,
over dtypes, sizes, strided and misaligned layouts, extreme values, streams and graphs.
"""

from __future__ import annotations

import math

import cupy
import numpy as np
import pytest

import cupykern
from cupykern import _arrays, _dtypes, families, launcher, plans, reference
from cupykern._arrays import Sig
from cupykern.ops import activation
from cupykern.plans import H200_LIMITS, DeviceLimits
from cupykern.reference._common import round_to
from tests.helpers import (DTYPES, DTYPE_IDS, Guarded, assert_close, assert_same_error, contiguous,
                           host, kernel_and_reference_errors, poisoned, prepare_args, random_device, sig)

#: d (outputs per row): tiny, odd, prime-ish, and the intermediate sizes of real models
#: (Llama-2-7B 11008, Llama-3-8B 14336, Qwen2-7B 18944, Llama-3-70B 28672, ...).
D_SIZES = [1, 3, 127, 2816, 5632, 11008, 13824, 14336, 18944, 28672, 53248]
#: d at 2048 tokens: keeps the float64 reference (math.erfc per element for fp32) fast.
D_SIZES_MANY_TOKENS = [1, 127, 2816, 5632]
OPS = ["silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul", "swiglu"]


def _shapes():
    yield 0, 2816
    for num_tokens in (1, 5):
        for d in D_SIZES:
            yield num_tokens, d
    for d in D_SIZES_MANY_TOKENS:
        yield 2048, d


SHAPES = list(_shapes())


def _run(op: str, x, out=None):
    """``op`` on a fused (..., 2 * d) input; swiglu gets the two halves of x as views."""
    d = x.shape[-1] // 2
    if op == "silu_and_mul":
        return cupykern.silu_and_mul(x, out=out)
    if op == "gelu_and_mul":
        return cupykern.gelu_and_mul(x, out=out)
    if op == "gelu_tanh_and_mul":
        return cupykern.gelu_and_mul(x, approximate="tanh", out=out)
    return cupykern.swiglu(x[..., :d], x[..., d:], out=out)


def _reference(op: str, x) -> np.ndarray:
    if op == "gelu_and_mul":
        return reference.gelu_and_mul(x)
    if op == "gelu_tanh_and_mul":
        return reference.gelu_and_mul(x, approximate="tanh")
    return reference.silu_and_mul(x)  # swiglu of the halves is the same function


# ----------------------------------------------------------------- CPU: instantiations
def test_instantiations_cover_dtypes_activations_and_vector_widths():
    exprs = set(activation.instantiations()[activation.ACT_AND_MUL])
    widths = sum(len(plans.activation_vec_widths(d)) for d in DTYPES)  # fp32: 1, 2, 4; 16-bit: 1, 2, 4, 8
    assert len(exprs) == widths * len(activation.ACTIVATIONS) * 2  # vector widths x walks
    assert "act_and_mul_kernel<__nv_bfloat16, 0, 8, true>" in exprs
    assert "act_and_mul_kernel<__nv_bfloat16, 0, 8, false>" in exprs
    assert "act_and_mul_kernel<float, 2, 4, true>" in exprs
    assert "act_and_mul_kernel<__half, 1, 1, false>" in exprs
    sized = set(activation.instantiations()[activation.ACT_AND_MUL_SIZED])
    decode_widths = sum(len(plans.activation_decode_vec_widths(d)) for d in DTYPES)  # fp32: 2; 16-bit: 2, 4
    assert len(sized) == decode_widths * len(activation.ACTIVATIONS) * len(activation.SIZED_D)
    assert "act_and_mul_sized_kernel<__nv_bfloat16, 1, 2, 14336>" in sized
    assert "act_and_mul_sized_kernel<float, 0, 2, 1536>" in sized
    assert sorted(exprs | sized) == sorted(families.instantiations()["activation.cu"])  # what test_jit_compile compiles


def test_sized_d_are_the_presets_intermediate_sizes():
    from cupykern import models

    assert activation.SIZED_D == tuple(sorted({models.get(name).intermediate_size for name in models.names()}))
    assert {14336, 28672, 1536} <= set(activation.SIZED_D)


@pytest.mark.parametrize("num_rows", [1, 2, 16, 64])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_decode_sizes_of_a_preset_d_launch_the_sized_kernel(num_rows, dtype):
    """Contiguous [gate | up] rows of a preset's d at decode sizes: the block-per-item plan
    in 4- or 8-byte vectors, launched by act_and_mul_sized_kernel with d as its template
    argument and two pointers (at 64 rows, where 16-byte vectors may be planned, the
    general kernel then)."""
    for op, approximate in (("silu_and_mul", "none"), ("gelu_and_mul", "none"), ("gelu_and_mul", "tanh")):
        for d in (14336, 28672):
            launch = _fused(op, x=contiguous((num_rows, 2 * d), dtype), approximate=approximate)
            general = _fused(op, x=contiguous((num_rows, 2 * d), dtype), approximate=approximate,
                             out=Sig((num_rows, d), (2 * d * np.dtype(dtype).itemsize, np.dtype(dtype).itemsize),
                                     np.dtype(dtype), 0))
            assert general.template is activation.ACT_AND_MUL or num_rows == 1  # out rows 2d apart: the general one
            if num_rows == 1:  # one row: its stride is never read, so any out takes the sized kernel
                assert general.template is activation.ACT_AND_MUL_SIZED
            plan = launch.plan
            if plan.vec_width not in plans.activation_decode_vec_widths(dtype):  # 16-byte vectors: past decode sizes
                assert launch.template is activation.ACT_AND_MUL and num_rows == 64
                continue
            assert launch.template is activation.ACT_AND_MUL_SIZED, (op, d, launch.plan)
            assert not plan.grid_stride
            act = activation.ACTIVATIONS[activation.gelu_activation(approximate) if op == "gelu_and_mul" else "silu"]
            assert launch.template_args == (_dtypes.c_type(dtype), act, plan.vec_width, d)
            assert launch.pointers == ("out", "x") and launch.scalars == ()
            assert launch.plan == general.plan  # the same blocks and grid as the general kernel's
            expr = activation.ACT_AND_MUL_SIZED.expr(*launch.template_args)
            assert expr in families.instantiations()["activation.cu"]


def test_the_sized_kernel_only_where_its_contract_holds():
    """A d outside SIZED_D, rows that are not contiguous, prefill sizes (16-byte vectors),
    misaligned rows (scalar) and swiglu keep act_and_mul_kernel."""
    d = 14336
    assert 11008 not in activation.SIZED_D
    assert _fused("silu_and_mul", x=contiguous((1, 2 * 11008), BF16)).template is activation.ACT_AND_MUL
    wide = Sig((4, 2 * d), ((2 * d + 64) * 2, 2), np.dtype(BF16), 0)  # rows of a wider buffer
    assert _fused("silu_and_mul", x=wide).template is activation.ACT_AND_MUL
    assert _fused("silu_and_mul", x=contiguous((4096, 2 * d), BF16)).template is activation.ACT_AND_MUL
    assert _fused("silu_and_mul", x=contiguous((1, 2 * d), BF16, align=2)).template is activation.ACT_AND_MUL
    assert _swiglu(gate=contiguous((1, d), BF16), up=contiguous((1, d), BF16)).template is activation.ACT_AND_MUL


# ----------------------------------------------------------------- CPU: argument checks
@pytest.mark.parametrize("call", [
    lambda x: cupykern.silu_and_mul(x),
    lambda x: cupykern.gelu_and_mul(x),
    lambda x: cupykern.gelu_and_mul(x, approximate="tanh"),
    lambda x: cupykern.swiglu(x, x),
], ids=["silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul", "swiglu"])
def test_activation_rejects_numpy_input(call):
    with pytest.raises(TypeError, match=r"(x|gate): expected a device array.*NumPy"):
        call(np.ones((2, 8), dtype=np.float16))


def test_gelu_and_mul_rejects_unknown_approximate_before_touching_the_gpu():
    for bad in ("erf", "Tanh", None, 1):
        with pytest.raises(ValueError, match="approximate: expected one of"):
            cupykern.gelu_and_mul(np.ones((2, 8), dtype=np.float16), approximate=bad)
    assert activation.gelu_activation("none") == "gelu"
    assert activation.gelu_activation("tanh") == "gelu_tanh"


@pytest.mark.parametrize("shape", [(4, 7), (7,), (2, 3, 1), (4, 0), ()])
def test_gated_output_shape_rejects_odd_or_empty_last_axis(shape):
    with pytest.raises(ValueError, match=r"x: expected shape \(\.\.\., 2 \* d\)"):
        activation.gated_output_shape(shape, "x")


def test_gated_output_shape_halves_the_last_axis():
    assert activation.gated_output_shape((4, 22016)) == (4, 11008)
    assert activation.gated_output_shape((2, 3, 2)) == (2, 3, 1)
    assert activation.gated_output_shape((0, 10)) == (0, 5)


def test_swiglu_shape_checks():
    activation.check_same_shape((4, 128), (4, 128))
    with pytest.raises(ValueError, match=r"up: expected the shape of gate \(4, 128\), got \(4, 127\)"):
        activation.check_same_shape((4, 128), (4, 127))
    with pytest.raises(ValueError, match=r"up: expected the shape of gate"):
        activation.check_same_shape((4, 128), (128,))
    with pytest.raises(ValueError, match=r"gate: expected shape \(\.\.\., d\) with d >= 1"):
        activation.check_same_shape((4, 0), (4, 0))


# ----------------------------------------------------------------- CPU: intake spec and plan
F16, BF16 = _dtypes.float16, _dtypes.bfloat16


def _fused(op="silu_and_mul", *, x=None, out=None, approximate="none", **kw):
    x = contiguous((4, 128), F16) if x is None else x
    values = dict(x=x, out=out)
    if op == "gelu_and_mul":
        values["approximate"] = approximate
    prepare = activation._SILU_AND_MUL.prepare if op == "silu_and_mul" else activation._GELU_AND_MUL.prepare
    return prepare(prepare_args(op, **values, **kw))


def _swiglu(*, gate=None, up=None, out=None, **kw):
    gate = contiguous((4, 64), F16) if gate is None else gate
    up = contiguous(gate.shape, gate.dtype) if up is None else up
    return activation._prepare_swiglu(prepare_args("swiglu", gate=gate, up=up, out=out, **kw))


@pytest.mark.parametrize("op, approximate, act", [("silu_and_mul", "none", "silu"), ("gelu_and_mul", "none", "gelu"),
                                                  ("gelu_and_mul", "tanh", "gelu_tanh")])
def test_fused_activation_launch(op, approximate, act):
    launch = _fused(op, approximate=approximate)
    plan = plans.plan_activation(4, 64, F16, aligned=True, limits=H200_LIMITS, op=op)
    # A block per item at 4 rows: 4-byte vectors (2 fp16) with up to 256 threads.
    assert launch.template is activation.ACT_AND_MUL and launch.plan == plan and plan.vec_width == 2
    assert launch.template_args == ("__half", activation.ACTIVATIONS[act], 2, False)
    # up is the second half of each row of x: the same array, d elements further on.
    assert launch.pointers == ("out", "x", ("x", 64 * 2))
    # d and the row strides of x (gate, up) and out, 32-bit; then num_rows.
    assert launch.scalars == (64, 128, 128, 64, 4)
    assert [type(v) for v in launch.scalars] == [np.int32] * 4 + [np.int64]
    assert launch.allocate == (("out", (4, 64), F16),) and launch.returns == "out"
    (rule,) = launch.disjoint
    assert (rule.a, rule.b, rule.allow_same) == ("x", "out", False)


def test_fused_activation_3d_input_and_given_out():
    out = Sig((2, 3, 100), (3 * 104 * 4, 104 * 4, 4), np.dtype(np.float32), 0)
    launch = _fused(x=contiguous((2, 3, 200), np.float32), out=out)
    assert launch.allocate == () and launch.scalars == (100, 200, 200, 104, 6)
    assert launch.pointers[2] == ("x", 100 * 4)


def test_fused_up_alignment_follows_from_x():
    """up starts d elements into x's row: its address class is x's plus d * itemsize."""
    # d = 64: up 128 bytes in, aligned (4-byte vectors at decode sizes)
    assert _fused(x=contiguous((4, 128), F16)).plan.vec_width == 2
    out = Sig((4, 60), (64 * 2, 2), np.dtype(F16), 0)  # rows 64 apart: aligned
    # d = 60: gate aligned, rows 120 elements apart (a vector multiple), but up starts 120 bytes in.
    assert _fused(x=contiguous((4, 120), F16), out=out).plan.vec_width == 1
    assert _fused(x=contiguous((4, 120), F16), out=out, overrides={"vec_width": 1}).plan.vec_width == 1
    with pytest.raises(ValueError, match="not 16-byte aligned"):
        _fused(x=contiguous((4, 120), F16), out=out, overrides={"vec_width": 8})
    # d = 64 from an address 8 bytes off: gate and up both misaligned.
    assert _fused(x=contiguous((4, 128), F16, align=8)).plan.vec_width == 1
    # d = 4 (8 bytes) from an address 8 bytes off: gate misaligned, up aligned; scalar accesses.
    assert _fused(x=contiguous((4, 8), F16, align=8), out=Sig((4, 4), (16, 2), np.dtype(F16), 0)).plan.vec_width == 1


@pytest.mark.parametrize("x, message", [
    (contiguous((4, 127), np.float16), r"x: expected shape \(\.\.\., 2 \* d\) with d >= 1 .*got shape \(4, 127\)"),
    (contiguous((4, 0), np.float16), r"x: expected shape \(\.\.\., 2 \* d\)"),
    (contiguous((), np.float16), r"x: expected shape \(\.\.\., 2 \* d\) .*got a 0-d array"),
])
@pytest.mark.parametrize("op", ["silu_and_mul", "gelu_and_mul"])
def test_fused_activation_rejects_odd_or_empty_last_axis(op, x, message):
    with pytest.raises(ValueError, match=message):
        _fused(op, x=x, limits=None)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(x=contiguous((4, 128), np.float64)), TypeError, "x: unsupported dtype float64"),
    (dict(x=Sig((4, 128), (2, 8), np.dtype(np.float16), 0)), ValueError, "x: the last axis must be unit-stride"),
    (dict(out=contiguous((4, 128), np.float16)), ValueError, r"out: expected shape \(4, 64\), got \(4, 128\)"),
    (dict(out=contiguous((4, 64), np.float32)), TypeError, "out: expected dtype float16"),
    (dict(out=Sig((4, 64), (2, 8), np.dtype(np.float16), 0)), ValueError, "out: the last axis must be unit-stride"),
])
def test_fused_activation_intake_errors_name_the_argument(kwargs, error, message):
    with pytest.raises(error, match=message):
        _fused(limits=None, **kwargs)


def test_activation_row_strides_are_32_bit():
    """Rows 2**31 elements apart do not fit the kernels' 32-bit strides: refused, naming
    the array; one row's stride is never used, so any passes (as 0)."""
    far = 2**31  # elements between rows
    x = Sig((2, 128), (far * 2, 2), np.dtype(F16), 0)
    with pytest.raises(ValueError, match=r"x: rows 2147483648 elements apart; expected fewer than 2\*\*31"):
        _fused(x=x)
    out = Sig((2, 64), (far * 2, 2), np.dtype(F16), 0)
    with pytest.raises(ValueError, match=r"out: rows 2147483648 elements apart"):
        _fused(x=contiguous((2, 128), F16), out=out)
    with pytest.raises(ValueError, match=r"up: rows -2147483648 elements apart"):
        _swiglu(gate=contiguous((2, 64), F16), up=Sig((2, 64), (-far * 2, 2), np.dtype(F16), 0))
    nearly = _fused(x=Sig((2, 128), ((far - 1) * 2, 2), np.dtype(F16), 0))
    assert nearly.scalars[1:3] == (far - 1, far - 1)
    one_row = _fused(x=Sig((1, 128), (far * 2, 2), np.dtype(F16), 0))
    assert one_row.scalars[1:4] == (0, 0, 0)


def test_fused_activation_needs_x():
    with pytest.raises(TypeError, match=r"x: expected a device array \(\.\.\., 2 \* d\), got None"):
        activation._SILU_AND_MUL.prepare(prepare_args("silu_and_mul", x=None, out=None, limits=None))


@pytest.mark.parametrize("approximate", ["erf", "Tanh", None, 1])
def test_gelu_approximate_is_checked_before_x_is_looked_at(approximate):
    with pytest.raises(ValueError, match="approximate: expected one of"):
        _fused("gelu_and_mul", x=launcher._FOREIGN, approximate=approximate, limits=None)


def test_swiglu_launch():
    # gate and up as the two halves of a fused row, out separate: three row strides.
    gate = Sig((4, 64), (256, 2), np.dtype(BF16), 0)
    up = Sig((4, 64), (256, 2), np.dtype(BF16), 0)
    launch = _swiglu(gate=gate, up=up, out=Sig((4, 64), (80 * 2, 2), np.dtype(BF16), 0))
    assert launch.template is activation.ACT_AND_MUL
    assert launch.template_args == ("__nv_bfloat16", activation.ACTIVATIONS["silu"], 2, False)
    assert launch.pointers == ("out", "gate", "up")
    assert launch.scalars == (64, 128, 128, 80, 4)
    assert launch.allocate == () and launch.returns == "out"
    rules = {(r.a, r.b, r.allow_same) for r in launch.disjoint}
    assert rules == {("gate", "out", True), ("up", "out", True)}  # in place as gate or up
    assert _swiglu(gate=gate, up=up._replace(align=2)).plan.vec_width == 1
    fresh = _swiglu()
    assert fresh.allocate == (("out", (4, 64), F16),) and fresh.plan.vec_width == 2


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(up=contiguous((4, 63), np.float16)), ValueError, r"up: expected the shape of gate \(4, 64\), got \(4, 63\)"),
    (dict(up=contiguous((64,), np.float16)), ValueError, "up: expected the shape of gate"),
    (dict(up=contiguous((4, 64), np.float32)), TypeError, r"up: expected dtype float16 \(the dtype of gate\)"),
    (dict(gate=contiguous((4, 0), np.float16)), ValueError, r"gate: expected shape \(\.\.\., d\) with d >= 1"),
    (dict(gate=contiguous((4, 64), np.int8)), TypeError, "gate: unsupported dtype int8"),
    (dict(up=Sig((4, 64), (2, 8), np.dtype(np.float16), 0)), ValueError, "up: the last axis must be unit-stride"),
    (dict(out=contiguous((4, 32), np.float16)), ValueError, r"out: expected shape \(4, 64\)"),
    (dict(out=contiguous((4, 64), _dtypes.bfloat16)), TypeError, "out: expected dtype float16"),
])
def test_swiglu_intake_errors_name_the_argument(kwargs, error, message):
    with pytest.raises(error, match=message):
        _swiglu(limits=None, **kwargs)


def test_swiglu_needs_gate_and_up():
    with pytest.raises(TypeError, match="gate: expected a device array"):
        activation._prepare_swiglu(prepare_args("swiglu", gate=None, up=contiguous((4, 64), F16), out=None))
    with pytest.raises(TypeError, match="up: expected a device array"):
        activation._prepare_swiglu(prepare_args("swiglu", gate=contiguous((4, 64), F16), up=None, out=None))


def test_activation_zero_rows_launch_nothing_cpu():
    launch = _fused(x=contiguous((0, 2 * 2816), F16), limits=None)
    assert launch.template is None and launch.allocate == (("out", (0, 2816), F16),) and launch.returns == "out"
    assert _fused(x=contiguous((3, 0, 8), F16), limits=None).allocate == (("out", (3, 0, 4), F16),)
    assert _swiglu(gate=contiguous((0, 64), F16), out=contiguous((0, 64), F16), limits=None).allocate == ()


def test_activation_launch_follows_overrides():
    launch = _fused(x=contiguous((300, 6000), BF16), overrides={"block_size": 1024, "vec_width": 1})
    assert (launch.plan.origin, launch.plan.block_size, launch.plan.vec_width) == ("override", 1024, 1)
    assert launch.template_args == ("__nv_bfloat16", 0, 1, True)  # scalar, past a wave: the walk
    launch = _fused(x=contiguous((300, 6000), BF16), overrides={"grid_stride": True})
    assert launch.template_args == ("__nv_bfloat16", 0, 8, True) and launch.plan.grid == (300 * 2, 1, 1)  # every item
    with pytest.raises(ValueError, match=r"\['threads_per_row'\] do not apply to silu_and_mul"):
        _fused(overrides={"threads_per_row": 64})
    for name in ("silu_and_mul", "gelu_and_mul", "swiglu"):
        op = launcher.ops()[name]
        assert op.plan_kind == "activation" and op.launch_options == plans.ACTIVATION_OVERRIDE_KEYS


# ----------------------------------------------------------------- CPU: reference
def test_reference_silu_and_mul_equals_swiglu_of_the_halves():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5, 2 * 37))
    np.testing.assert_array_equal(reference.silu_and_mul(x), reference.swiglu(x[..., :37], x[..., 37:]))
    assert reference.silu_and_mul(x).shape == (3, 5, 37)


def test_reference_known_values():
    x = np.array([[1.0, -1.0, 0.0, 2.0, 3.0, 0.5]])  # gates 1, -1, 0; ups 2, 3, 0.5
    phi = lambda g: 0.5 * math.erfc(-g / math.sqrt(2.0))  # noqa: E731
    tanh_gelu = lambda g: 0.5 * g * (1 + math.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g**3)))  # noqa: E731
    np.testing.assert_allclose(reference.silu_and_mul(x), [[2 / (1 + math.exp(-1)), 3 * -1 / (1 + math.e), 0.0]],
                               rtol=1e-15)
    np.testing.assert_allclose(reference.gelu_and_mul(x), [[2 * phi(1.0), 3 * -phi(-1.0), 0.0]], rtol=1e-15)
    np.testing.assert_allclose(reference.gelu_and_mul(x, approximate="tanh"),
                               [[2 * tanh_gelu(1.0), 3 * tanh_gelu(-1.0), 0.0]], rtol=1e-15)
    np.testing.assert_allclose(reference.gelu_and_mul(x)[0, 0], 2 * 0.8413447460685429, rtol=1e-15)


def test_reference_gelu_tanh_is_close_to_erf():
    """The tanh approximation is within 5e-4 of the erf form everywhere (arXiv:1606.08415)."""
    g = np.linspace(-8, 8, 4001)
    x = np.concatenate([g, np.ones_like(g)])[None, :]
    diff = reference.gelu_and_mul(x, approximate="tanh") - reference.gelu_and_mul(x)
    assert np.max(np.abs(diff)) < 5e-4
    assert np.max(np.abs(diff)) > 1e-5  # they are different functions


@pytest.mark.parametrize("op", ["silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_reference_extreme_gates(op, dtype):
    gates = [-1e4, np.inf, -np.inf, np.nan, 1e4, -100.0]
    ups = [1.0, 2.0, 1.0, 1.0, -1.0, 1.0]
    x = np.array([gates + ups], dtype=np.float32).astype(dtype)
    got = _reference(op, x)[0]
    assert got[0] == 0 and not np.isnan(got[0])   # -1e4: -0 or 0, never NaN
    assert got[1] == np.inf                       # +inf stays inf
    assert got[2] == 0 and not np.isnan(got[2])   # -inf: the limit, 0
    assert np.isnan(got[3])                       # NaN stays in its element only
    assert got[4] == -float(np.float32(1e4).astype(dtype))  # act(g) = g for large g
    assert abs(got[5]) < 1e-30
    assert np.isnan(got).sum() == 1


def test_reference_fp16_overflow_rounds_to_inf():
    x = np.array([[300.0, 300.0]], dtype=np.float16)
    want = reference.silu_and_mul(x)
    assert np.isfinite(want).all()                     # 9e4 in float64
    with np.errstate(over="ignore"):
        assert round_to(want, np.float16)[0, 0] == np.inf  # beyond 65504 after rounding


@pytest.mark.parametrize("op", ["silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"])
@pytest.mark.parametrize("dtype", [_dtypes.float16, _dtypes.bfloat16], ids=["fp16", "bf16"])
def test_reference_table_lookup_matches_direct_evaluation(op, dtype):
    """2-byte inputs go through a 65536-entry table; it must equal the float64 formula."""
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((7, 2 * 33)) * 4).astype(dtype)
    np.testing.assert_array_equal(_reference(op, x), _reference(op, x.astype(np.float64)))


def test_reference_argument_errors():
    with pytest.raises(ValueError, match="approximate"):
        reference.gelu_and_mul(np.ones((1, 4)), approximate="fast")
    with pytest.raises(ValueError, match=r"x: expected shape \(\.\.\., 2 \* d\)"):
        reference.silu_and_mul(np.ones((1, 5)))


_GATE_UP = np.ones((3, 8), F16)
# Rows 2**31 elements apart (two pages touched: as_strided allocates nothing).
_FAR_ROWS = np.lib.stride_tricks.as_strided(np.zeros(16, F16), shape=(2, 8), strides=(2**31 * 2, 2))


@pytest.mark.parametrize("op, args, kwargs", [
    ("silu_and_mul", (None,), {}),
    ("silu_and_mul", (np.ones((3, 7), F16),), {}),
    ("silu_and_mul", (np.ones((3, 0), F16),), {}),
    ("silu_and_mul", (np.ones((), F16),), {}),
    ("silu_and_mul", (np.ones((3, 8), np.int16),), {}),
    ("silu_and_mul", (np.ones((3, 16), F16)[:, ::2],), {}),
    ("gelu_and_mul", (_GATE_UP,), {"approximate": "fast"}),
    ("gelu_and_mul", (_GATE_UP,), {"approximate": None}),
    ("swiglu", (_GATE_UP, None), {}),
    ("swiglu", (None, _GATE_UP), {}),
    ("swiglu", (_GATE_UP, np.ones((3, 4), F16)), {}),
    ("swiglu", (_GATE_UP, _GATE_UP.astype(np.float32)), {}),
    ("swiglu", (np.ones((3, 0), F16), np.ones((3, 0), F16)), {}),
    ("silu_and_mul", (_FAR_ROWS,), {}),
    ("swiglu", (np.ones((2, 8), F16), _FAR_ROWS), {}),
])
def test_reference_refuses_what_the_kernel_refuses(fake_launcher, op, args, kwargs):
    assert_same_error(getattr(cupykern, op), getattr(reference, op), *args, **kwargs)


def test_reference_takes_what_the_kernel_takes(fake_launcher):
    wide = np.ones((3, 12), F16)
    for op, args, kwargs in (("silu_and_mul", (wide[:, 2:10],), {}),
                             ("gelu_and_mul", (_GATE_UP,), {"approximate": "tanh"}),
                             ("swiglu", (wide[:, :4], wide[:, 6:10]), {})):
        assert kernel_and_reference_errors(getattr(cupykern, op), getattr(reference, op), *args, **kwargs) == \
            (None, None)
    assert len(fake_launcher) == 3


# ----------------------------------------------------------------- CPU: launch plans
def _kernel_walk(grid: int, block_size: int, num_rows: int, d: int, vec_width: int) -> list:
    """The (row, chunk) items act_and_mul_kernel's blocks visit, as its loop computes them."""
    slots_per_row = -(-d // vec_width)
    chunks_per_row = -(-slots_per_row // block_size)
    num_chunks = num_rows * chunks_per_row
    step_rows, step_chunks = divmod(grid, chunks_per_row)
    visited = []
    for block in range(grid):
        row, chunk = divmod(block, chunks_per_row)
        work = block
        while work < num_chunks:
            visited.append((row, chunk))
            row, chunk, work = row + step_rows, chunk + step_chunks, work + grid
            if chunk >= chunks_per_row:
                row, chunk = row + 1, chunk - chunks_per_row
    return visited


@pytest.mark.parametrize("num_rows", [1, 5, 2048, 70_001])
@pytest.mark.parametrize("d", D_SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("aligned", [True, False])
def test_plan_activation_is_valid_and_compiled(num_rows, d, dtype, aligned):
    plan = plans.plan_activation(num_rows, d, dtype, aligned=aligned, limits=H200_LIMITS)
    assert plan.origin == "heuristic"
    # 16-byte vectors, or 4- or 8-byte ones on the block-per-item grid (decode sizes).
    if not aligned:
        assert plan.vec_width == 1
    elif plan.grid_stride:
        assert plan.vec_width == _dtypes.vec_width(dtype)
    else:
        assert plan.vec_width in plans.activation_vec_widths(dtype)
    assert plan.block_size % 32 == 0 and 32 <= plan.block_size <= plans.ACTIVATION_MAX_BLOCK_SIZE
    assert plan.block[1:] == (1, 1)
    chunks = plans.activation_chunks(num_rows, d, plan.block_size, plan.vec_width)
    resident = H200_LIMITS.sm_count * (H200_LIMITS.max_threads_per_sm // plan.block[0])
    sixteen_bytes = plan.vec_width == _dtypes.vec_width(dtype)
    if (chunks <= resident or sixteen_bytes) and num_rows <= H200_LIMITS.max_grid_y and d % plan.vec_width == 0:
        # A block per (row, chunk) item, at any number of items with 16-byte vectors: the
        # grid is (chunks_per_row, num_rows); whole vectors only (that kernel has no
        # scalar tail).
        assert not plan.grid_stride
        assert plan.grid == (-(-(-(-d // plan.vec_width)) // plan.block_size), num_rows, 1)
        assert plan.grid[0] * plan.grid[1] == chunks
    else:
        assert plan.grid_stride
        assert plan.grid == (min(chunks, resident, H200_LIMITS.max_grid_x), 1, 1)
    # Every vector of every row has a thread: chunks x block_size x vec_width >= rows x d.
    assert chunks * plan.block_size * plan.vec_width >= num_rows * d
    expr = activation.ACT_AND_MUL.expr(_dtypes.c_type(dtype), 0, plan.vec_width, plan.grid_stride)
    assert expr in families.instantiations()["activation.cu"]


def test_plan_activation_walks_only_rows_past_the_grid_with_a_tail_or_scalar_past_a_wave():
    bf16 = _dtypes.bfloat16
    for num_tokens in (1, 16, 64, 4096, 16384):  # llama-3.1-8b and -70b: a block per item
        for d in (14336, 28672):
            plan = plans.plan_activation(num_tokens, d, bf16, aligned=True, limits=H200_LIMITS)
            assert not plan.grid_stride and plan.grid[1] == num_tokens
    # 16-byte vectors of 256 threads at prefill sizes: 7 chunks a row of 14336.
    assert plans.plan_activation(4096, 14336, bf16, aligned=True, limits=H200_LIMITS).grid == (7, 4096, 1)
    # Rows past the grid's y limit walk, however few items each has; so do rows with a
    # scalar tail (d not a multiple of 8) past the narrow vectors' one wave.
    assert plans.plan_activation(70_000, 8, bf16, aligned=True, limits=H200_LIMITS).grid_stride
    assert not plans.plan_activation(65_535, 8, bf16, aligned=True, limits=H200_LIMITS).grid_stride
    assert plans.plan_activation(4096, 14335, bf16, aligned=True, limits=H200_LIMITS).grid_stride
    # Scalar rows (not 16-byte aligned) walk past one wave: their block per item was slower.
    assert not plans.plan_activation(16, 14336, bf16, aligned=False, limits=H200_LIMITS).grid_stride
    assert plans.plan_activation(4096, 14336, bf16, aligned=False, limits=H200_LIMITS).grid_stride


def test_plan_activation_grid_stride_override():
    bf16 = _dtypes.bfloat16
    plan = plans.plan_activation(1, 14336, bf16, aligned=True, limits=H200_LIMITS, overrides={"grid_stride": True})
    assert plan.grid_stride and plan.grid == (14, 1, 1) and plan.origin == "override"
    plan = plans.plan_activation(4096, 14336, bf16, aligned=True, limits=H200_LIMITS, overrides={"grid_stride": False})
    assert not plan.grid_stride and plan.grid == (7, 4096, 1)
    with pytest.raises(ValueError, match="1 x 65536 exceeds the device's 2147483647 x 65535"):
        plans.plan_activation(65_536, 8, bf16, aligned=True, limits=H200_LIMITS, overrides={"grid_stride": False})
    with pytest.raises(ValueError, match=r"grid_stride=False needs d a multiple of vec_width .* d = 14337, vec_width = 8"):
        plans.plan_activation(1, 14337, bf16, aligned=True, limits=H200_LIMITS, overrides={"grid_stride": False})
    plan = plans.plan_activation(1, 14337, bf16, aligned=True, limits=H200_LIMITS,
                                 overrides={"grid_stride": False, "vec_width": 1})
    assert not plan.grid_stride and plan.vec_width == 1
    assert plans.plan_activation(1, 14337, bf16, aligned=True, limits=H200_LIMITS).grid_stride  # a tail: the walk
    with pytest.raises(ValueError, match="launch override grid_stride: expected True or False, got 1"):
        plans.plan_activation(1, 8, bf16, aligned=True, limits=H200_LIMITS, overrides={"grid_stride": 1})
    plan = plans.plan_activation(1, 14336, bf16, aligned=True, limits=H200_LIMITS,
                                 overrides={"grid_stride": np.bool_(True)})
    assert plan.grid_stride is True and plan.origin == "override"
    # Zero rows launch nothing: the walk's plan, whatever the override.
    assert plans.plan_activation(0, 4096, bf16, aligned=True, limits=H200_LIMITS,
                                 overrides={"grid_stride": False}).grid_stride


def test_plan_activation_block_per_item_respects_grid_x():
    bf16 = _dtypes.bfloat16
    narrow_x = DeviceLimits(name="narrow x", sm_count=10_000, max_grid_x=1000)
    # 2^22 outputs: 4096 chunks of 128 vectors in one row, more than the grid's x limit.
    plan = plans.plan_activation(1, 2**22, bf16, aligned=True, limits=narrow_x)
    assert plan.grid_stride and plan.grid[0] <= 1000
    with pytest.raises(ValueError, match=r"4096 x 1 exceeds the device's 1000 x 65535"):
        plans.plan_activation(1, 2**22, bf16, aligned=True, limits=narrow_x, overrides={"grid_stride": False})


def test_plan_activation_shapes_the_block_to_the_work():
    bf16 = _dtypes.bfloat16
    # Throughput: 256 threads, one 16-byte vector each.
    assert plans.plan_activation(4096, 14336, bf16, aligned=True, limits=H200_LIMITS).block_size == 256
    # Decode: a block per item, 4-byte vectors and 256 threads (NOTES items 20, 22).
    decode = plans.plan_activation(1, 14336, bf16, aligned=True, limits=H200_LIMITS)
    assert (decode.block_size, decode.vec_width, decode.grid) == (256, 2, (28, 1, 1))
    # Narrow rows: no more threads than vectors, at least one warp.
    assert plans.plan_activation(4096, 3, bf16, aligned=False, limits=H200_LIMITS).block_size == 32


@pytest.mark.parametrize("num_tokens, vec_width", [(1, 2), (16, 2), (64, 4)])
def test_plan_activation_takes_narrow_vectors_where_16_byte_ones_leave_a_tail(num_tokens, vec_width):
    """d = 14340 is a whole number of 4- and 8-byte vectors (2 and 4 bf16), not of 16-byte
    ones: the block-per-item grid with narrower vectors, not the grid-stride walk (its
    scalar tail); 4-byte ones while their grid (29 blocks a row) fills at most half a wave."""
    plan = plans.plan_activation(num_tokens, 14340, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS)
    assert (plan.vec_width, plan.block_size, plan.grid_stride) == (vec_width, 256, False)
    assert plan.grid == (-(-14340 // vec_width // 256), num_tokens, 1)
    assert plans.plan_activation(num_tokens, 14340, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS,
                                 overrides={"grid_stride": False}).vec_width == vec_width
    assert plans.plan_activation(num_tokens, 14337, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS).grid_stride


@pytest.mark.parametrize("d, num_tokens, vec_width", [(14336, 1, 2), (14336, 16, 2), (14336, 64, 4),
                                                      (28672, 1, 2), (28672, 16, 4), (28672, 64, 8)])
def test_plan_activation_takes_4_byte_vectors_up_to_half_a_wave(d, num_tokens, vec_width):
    """llama-3.1-8b's and -70b's intermediate sizes (NOTES item 22): 4-byte vectors while
    their grid fills at most half of the H200's 132 x 8 resident 256-thread blocks (8b at
    16 tokens: 448 blocks), 8-byte ones beyond (70b at 16 tokens: 896 blocks of 4-byte ones,
    over half a wave), then 16-byte ones past one wave of 8-byte ones (70b at 64 tokens)."""
    plan = plans.plan_activation(num_tokens, d, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS)
    assert (plan.vec_width, plan.block_size, plan.grid_stride) == (vec_width, 256, False)
    blocks = num_tokens * -(-d // 2 // 256)
    assert (blocks <= H200_LIMITS.sm_count * 8 // 2) == (vec_width == 2)
    # fp32: no single-element "vectors" (unmeasured); 8-byte ones (2 elements) where they fit.
    fp32 = plans.plan_activation(num_tokens, d, _dtypes.float32, aligned=True, limits=H200_LIMITS)
    assert fp32.vec_width in (2, 4)


def test_plan_activation_overrides_keep_their_vectors():
    """block_size or vec_width overridden: no narrow (4- or 8-byte) vectors unless asked for; NumPy ints
    are taken as ints; the 8-byte block respects the device's block limit."""
    bf16 = _dtypes.bfloat16
    plan = plans.plan_activation(1, 14336, bf16, aligned=True, limits=H200_LIMITS, overrides={"block_size": 128})
    assert (plan.vec_width, plan.block_size, plan.grid_stride) == (8, 128, False)
    plan = plans.plan_activation(1, 14336, bf16, aligned=True, limits=H200_LIMITS, overrides={"vec_width": np.int64(8)})
    assert plan.vec_width == 8 and type(plan.block_size) is int
    plan = plans.plan_activation(1, 14336, bf16, aligned=True, limits=H200_LIMITS,
                                 overrides={"vec_width": np.uint8(4), "block_size": np.uint16(256)})
    assert (plan.vec_width, plan.block_size) == (4, 256)
    assert plans.plan_activation(1, 14336, bf16, aligned=True, limits=H200_LIMITS,
                                 overrides={"grid_stride": True}).vec_width == 8
    small_blocks = DeviceLimits(name="128-thread blocks", sm_count=132, max_threads_per_block=128)
    plan = plans.plan_activation(31, 1024, bf16, aligned=True, limits=small_blocks)
    assert plan.block_size <= 128 and not plan.grid_stride


def test_plan_activation_caps_the_grid():
    small = DeviceLimits(name="tiny", sm_count=2, max_grid_x=1000)
    plan = plans.plan_activation(10_000_000, 14336, _dtypes.float16, aligned=True, limits=small)
    assert plan.grid[0] == 2 * (2048 // plan.block_size)  # one resident wave; the rest grid-stride
    wide = DeviceLimits(name="many SMs", sm_count=10_000, max_grid_x=1000)
    plan = plans.plan_activation(10_000_000, 14336, _dtypes.float16, aligned=True, limits=wide)
    assert plan.grid[0] == 1000


@pytest.mark.parametrize("grid, block_size, num_rows, d, vec_width", [
    (7, 32, 5, 100, 1),         # grid smaller than a row's chunks
    (3, 32, 11, 65, 8),         # scalar-tail slot in the last chunk
    (13, 64, 9, 1000, 4),       # grid not a multiple of chunks_per_row
    (1, 256, 4, 14336, 8),
    (40, 32, 40, 1, 1),         # one chunk per row, grid == rows
    (1000, 256, 70, 14336, 8),  # grid larger than the work
])
def test_kernel_walk_visits_every_chunk_once(grid, block_size, num_rows, d, vec_width):
    slots_per_row = -(-d // vec_width)
    chunks_per_row = -(-slots_per_row // block_size)
    visited = _kernel_walk(grid, block_size, num_rows, d, vec_width)
    assert sorted(visited) == [(r, c) for r in range(num_rows) for c in range(chunks_per_row)]


@pytest.mark.parametrize("choices, message", [
    (dict(vec_width=8), "vec_width"),        # bf16 arrays not aligned
    (dict(vec_width=3), "vec_width"),
    (dict(block_size=48), "block_size"),
    (dict(block_size=2048), "block_size"),
    (dict(block_size=0), "block_size"),
])
def test_plan_activation_rejects_illegal_overrides(choices, message):
    with pytest.raises(ValueError, match=message):
        plans.plan_activation(4, 4096, _dtypes.bfloat16, aligned=False, limits=H200_LIMITS, overrides=choices)


def test_plan_activation_overrides():
    plan = plans.plan_activation(4, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS,
                                 overrides={"block_size": 1024, "vec_width": 1})
    assert (plan.block_size, plan.vec_width, plan.origin) == (1024, 1, "override")
    plan = plans.plan_activation(4, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS,
                                 overrides={"block_size": None, "vec_width": None})
    assert plan.origin == "heuristic"
    with pytest.raises(ValueError, match=r"\['rows_per_block'\] do not apply to swiglu"):
        plans.plan_activation(4, 4096, _dtypes.bfloat16, aligned=True, limits=H200_LIMITS,
                              overrides={"rows_per_block": 2}, op="swiglu")


# ----------------------------------------------------------------- GPU: values
@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens, d", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("op", OPS)
def test_activation_matches_reference(rng, op, dtype, num_tokens, d):
    x = random_device(rng, (num_tokens, 2 * d), dtype, scale=2.0)
    out = Guarded((num_tokens, d), dtype)  # rows of out padded: a strided output view
    result = _run(op, x, out=out.view)
    assert result is out.view
    assert_close(out.view, _reference(op, x), dtype, seed=rng.seed, what=op)
    out.check_margins()


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens", [1, 2, 16, 64])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("op", OPS[:3])
def test_sized_kernel_matches_reference_and_the_general_kernel(rng, op, dtype, num_tokens):
    """Every preset's d at decode sizes through act_and_mul_sized_kernel (contiguous rows,
    poisoned out with guarded margins): within the dtype's tolerance of float64 and bit
    for bit the general kernel's output (x in rows of a wider buffer takes that one)."""
    for d in activation.SIZED_D:
        x = random_device(rng, (num_tokens, 2 * d), dtype, scale=2.0)
        out = Guarded((num_tokens, d), dtype, row_pad=0)
        with launcher.recording() as launches:
            assert _run(op, x, out=out.view) is out.view
        (launched,) = launches
        if launched.template is not activation.ACT_AND_MUL_SIZED:  # 16-byte vectors at 64 rows
            assert num_tokens == 64 and launched.plan.vec_width == _dtypes.vec_width(dtype), launched.plan
        assert_close(out.view, _reference(op, x), dtype, seed=rng.seed, what=f"{op} d={d}")
        out.check_margins()
        wide = cupy.zeros((num_tokens, 2 * d + 8), dtype=dtype)
        wide[:, :2 * d] = x
        with launcher.recording() as launches:
            general = _run(op, wide[:, :2 * d])
        assert launches[0].template is activation.ACT_AND_MUL or num_tokens == 1
        np.testing.assert_array_equal(host(general).view(np.uint8), host(out.view).view(np.uint8))


@pytest.mark.gpu
@pytest.mark.parametrize("d", D_SIZES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("op", OPS)
def test_activation_strided_and_misaligned_input(rng, op, dtype, d):
    num_tokens = 5
    wide = random_device(rng, (num_tokens, 2 * d + 24), dtype, scale=2.0)
    strided = wide[:, 8:8 + 2 * d]                   # rows of a wider buffer, aligned start
    strided_odd = wide[:, 3:3 + 2 * d]               # rows of a wider buffer, misaligned start
    flat = random_device(rng, (num_tokens * 2 * d + 1,), dtype, scale=2.0)
    shifted = flat[1:].reshape(num_tokens, 2 * d)    # contiguous, offset by one element
    for x in (strided, strided_odd, shifted):
        for misalign in (0, 1):
            out = Guarded((num_tokens, d), dtype, misalign=misalign)
            _run(op, x, out=out.view)
            assert_close(out.view, _reference(op, x), dtype, seed=rng.seed, what=op)
            out.check_margins()


@pytest.mark.gpu
@pytest.mark.parametrize("d", [1, 3, 127, 2816, 14337])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_swiglu_vector_path_with_scalar_tail(rng, dtype, d):
    """Aligned pointers and strides with d % vec_width != 0: 16-byte vectors plus the tail."""
    vec = _dtypes.vec_width(dtype)
    width = -(-d // vec) * vec + vec                 # row stride a multiple of vec_width
    gate = random_device(rng, (33, width), dtype, scale=2.0)[:, :d]
    up = random_device(rng, (33, width + vec), dtype)[:, :d]
    out = Guarded((33, d), dtype, row_pad=width - d)
    assert _arrays.vector_aligned(vec, (sig(gate), width), (sig(up), width + vec), (sig(out.view), width))
    cupykern.swiglu(gate, up, out=out.view)
    assert_close(out.view, reference.swiglu(gate, up), dtype, seed=rng.seed)
    out.check_margins()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_silu_and_mul_equals_swiglu_bit_for_bit(rng, dtype):
    x = random_device(rng, (64, 2 * 5632), dtype, scale=3.0)
    fused = cupykern.silu_and_mul(x)
    split = cupykern.swiglu(x[:, :5632].copy(), x[:, 5632:].copy())
    np.testing.assert_array_equal(fused.get().view(np.uint8), split.get().view(np.uint8))


@pytest.mark.gpu
@pytest.mark.parametrize("target", ["gate", "up"])
def test_swiglu_in_place(rng, target):
    dtype = _dtypes.bfloat16
    gate = random_device(rng, (17, 14336), dtype, scale=2.0)
    up = random_device(rng, (17, 14336), dtype)
    want = reference.swiglu(gate, up)
    out = gate if target == "gate" else up
    assert cupykern.swiglu(gate, up, out=out) is out
    assert_close(out, want, dtype, seed=rng.seed)


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
def test_activation_three_dimensional_input(rng, op):
    dtype = _dtypes.float16
    x = random_device(rng, (2, 3, 2 * 129), dtype)
    got = _run(op, x)
    assert got.shape == (2, 3, 129) and got.dtype == dtype
    assert_close(got, _reference(op, x), dtype, seed=rng.seed)


# ----------------------------------------------------------------- GPU: numerics
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("op", OPS)
def test_activation_extreme_inputs(rng, op, dtype):
    d = 40
    host = (rng.standard_normal((8, 2 * d)) * 2).astype(np.float32)
    host[0, 0] = -1e4          # gate: silu/gelu -> -0, times up: +-0, never NaN
    host[1, 3] = np.inf        # gate +inf, up > 0: +inf
    host[1, d + 3] = 1.5
    host[2, 5] = np.nan        # NaN gate: NaN in this element only
    host[3, d + 7] = np.nan    # NaN up: NaN in this element only
    host[4, 2] = -np.inf       # gate -inf: the limit 0, not -inf * 0
    host[5, 9], host[5, d + 9] = 300.0, 300.0   # 9e4: inf in fp16, finite in bf16/fp32
    host[6, :d] = np.linspace(-110.0, -80.0, d)  # the underflowing tail
    host[7, :d] = np.linspace(-12.0, 12.0, d)
    x = cupy.asarray(host.astype(dtype))
    out = Guarded((8, d), dtype)
    _run(op, x, out=out.view)
    got = out.view.get().astype(np.float64)
    want = _reference(op, x)
    # Compared with the reference rounded to the dtype, so an fp16 overflow is inf on both sides.
    with np.errstate(over="ignore"):
        want = round_to(want, dtype)
    assert_close(got, want, dtype, seed=rng.seed, what=op)
    assert got[0, 0] == 0 and got[4, 2] == 0
    assert got[1, 3] == np.inf
    assert np.argwhere(np.isnan(got)).tolist() == [[2, 5], [3, 7]]
    assert (got[5, 9] == np.inf) == (dtype == _dtypes.float16)
    out.check_margins()


@pytest.mark.gpu
def test_activation_more_than_65535_rows(rng):
    dtype = _dtypes.float16
    x = random_device(rng, (70_001, 2 * 8), dtype)
    for op in OPS:
        out = Guarded((70_001, 8), dtype)
        _run(op, x, out=out.view)
        assert_close(out.view, _reference(op, x), dtype, seed=rng.seed, what=op)
        out.check_margins()


@pytest.mark.gpu
def test_silu_and_mul_offsets_past_2_31_elements(rng):
    """x spans 2.3e9 elements (4.6 GB of bf16): row offsets need 64-bit arithmetic."""
    dtype, d, num_tokens = _dtypes.bfloat16, 28672, 40_000
    x = cupy.empty((num_tokens, 2 * d), dtype=dtype)
    assert x.size > 2**31
    rows = [0, 1, 37_450, num_tokens - 2, num_tokens - 1]  # 37_450 * 2 * d > 2**31
    for r in rows:
        x[r] = random_device(rng, (2 * d,), dtype, scale=2.0)
    for grid_stride in (True, False):  # the heuristic walks these 40,000 rows; a block per item too
        with launcher.overrides(grid_stride=grid_stride):
            out = cupykern.silu_and_mul(x)
        for r in rows:
            assert_close(out[r], reference.silu_and_mul(x[r]), dtype, seed=rng.seed, what=f"row {r}")
        del out
    del x


@pytest.mark.gpu
@pytest.mark.parametrize("block_size, vec_width", [(32, None), (64, 1), (1024, None), (256, 1)])
@pytest.mark.parametrize("grid_stride", [True, False])
def test_activation_overridden_launches_stay_correct(rng, block_size, vec_width, grid_stride):
    dtype = _dtypes.bfloat16
    x = random_device(rng, (300, 2 * 3000), dtype)
    with launcher.overrides(block_size=block_size, vec_width=vec_width, grid_stride=grid_stride):
        got = cupykern.silu_and_mul(x)
    assert_close(got, reference.silu_and_mul(x), dtype, seed=rng.seed)


@pytest.mark.gpu
@pytest.mark.parametrize("num_tokens, d", [(1, 14336), (5, 127), (64, 28672), (2048, 2816), (300, 3)])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("op", OPS)
def test_activation_walks_give_the_same_bytes(rng, op, dtype, num_tokens, d):
    """A block per item and the grid-stride walk run the same per-element code: same bytes."""
    x = random_device(rng, (num_tokens, 2 * d), dtype, scale=2.0)
    got = {}
    for grid_stride in (True, False):
        out = Guarded((num_tokens, d), dtype)
        with launcher.overrides(grid_stride=grid_stride):
            _run(op, x, out=out.view)
        out.check_margins()
        got[grid_stride] = out.view.get()
    np.testing.assert_array_equal(got[True].view(np.uint8), got[False].view(np.uint8))
    assert_close(cupy.asarray(got[False]), _reference(op, x), dtype, seed=rng.seed, what=op)


# ----------------------------------------------------------------- GPU: streams and graphs
@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
def test_activation_on_current_stream_and_under_graph_capture(rng, op):
    dtype, num_tokens, d = _dtypes.bfloat16, 16, 14336
    x = random_device(rng, (num_tokens, 2 * d), dtype)
    want = _reference(op, x)
    stream = cupy.cuda.Stream(non_blocking=True)
    out = poisoned((num_tokens, d), dtype)
    cupy.cuda.Device().synchronize()  # the poison fill ran on the null stream
    with stream:
        _run(op, x, out=out)
        stream.synchronize()
    assert_close(out, want, dtype, seed=rng.seed, what=op)

    out = poisoned((num_tokens, d), dtype)  # allocated before the capture, kept alive
    cupy.cuda.Device().synchronize()
    with stream:
        stream.begin_capture()
        _run(op, x, out=out)
        graph = stream.end_capture()
    assert np.isnan(out.get().astype(np.float32)).all()  # captured, not run
    graph.launch(stream=stream)
    stream.synchronize()
    assert_close(out, want, dtype, seed=rng.seed, what=op)


# ----------------------------------------------------------------- GPU: argument errors
@pytest.mark.gpu
def test_activation_argument_errors_name_the_argument():
    x = cupy.ones((4, 64), dtype=np.float16)
    with pytest.raises(ValueError, match=r"x: expected shape \(\.\.\., 2 \* d\)"):
        cupykern.silu_and_mul(cupy.ones((4, 63), dtype=np.float16))
    with pytest.raises(ValueError, match=r"x: expected shape \(\.\.\., 2 \* d\)"):
        cupykern.gelu_and_mul(cupy.ones((4, 0), dtype=np.float16))
    with pytest.raises(ValueError, match="approximate"):
        cupykern.gelu_and_mul(x, approximate="erf")
    with pytest.raises(TypeError, match="x: unsupported dtype float64"):
        cupykern.silu_and_mul(x.astype(np.float64))
    with pytest.raises(ValueError, match=r"out: expected shape \(4, 32\), got \(4, 64\)"):
        cupykern.silu_and_mul(x, out=cupy.empty((4, 64), dtype=np.float16))
    with pytest.raises(TypeError, match="out: expected dtype float16"):
        cupykern.gelu_and_mul(x, out=cupy.empty((4, 32), dtype=np.float32))
    with pytest.raises(TypeError, match="out: expected a device array"):
        cupykern.silu_and_mul(x, out=np.empty((4, 32), dtype=np.float16))
    with pytest.raises(ValueError, match="x: the last axis must be unit-stride"):
        cupykern.silu_and_mul(cupy.ones((64, 4), dtype=np.float16).T)
    with pytest.raises(ValueError, match="out overlaps x"):
        cupykern.silu_and_mul(x, out=x[:, :32])
    with pytest.raises(ValueError, match="up: expected the shape of gate"):
        cupykern.swiglu(x, x[:, :32])
    with pytest.raises(TypeError, match="up: expected dtype float16"):
        cupykern.swiglu(x, x.astype(np.float32))
    with pytest.raises(TypeError, match="up: expected a device array"):
        cupykern.swiglu(x, np.ones((4, 64), dtype=np.float16))
    with pytest.raises(ValueError, match="out overlaps gate"):
        buf = cupy.ones(4 * 64 + 1, dtype=np.float16)
        cupykern.swiglu(buf[:-1].reshape(4, 64), x, out=buf[1:].reshape(4, 64))
    with pytest.raises(ValueError, match="out overlaps up"):
        buf = cupy.ones(4 * 64 + 1, dtype=np.float16)
        cupykern.swiglu(x, buf[:-1].reshape(4, 64), out=buf[1:].reshape(4, 64))


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
def test_activation_zero_rows_launch_nothing(op):
    x = cupy.ones((0, 2 * 2816), dtype=np.float16)
    assert _run(op, x).shape == (0, 2816)
    out = cupy.empty((0, 2816), dtype=np.float16)
    assert _run(op, x, out=out) is out
    assert _run(op, cupy.ones((3, 0, 8), dtype=np.float16)).shape == (3, 0, 4)
