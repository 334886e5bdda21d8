"""row_reduce (kernels_cu/row_reduce.cu): CPU reference, kOp constants and the intake
spec on hand-built call signatures; GPU kernel vs float64 reference."""

from __future__ import annotations

import re

import cupy
import numpy as np
import pytest

import cupykern
from cupykern import _dtypes, jit, launcher, plans, reference
from cupykern._arrays import Sig
from cupykern.ops import row_reduce as row_reduce_ops
from tests.helpers import (DTYPES, DTYPE_IDS, assert_same_error, contiguous, kernel_and_reference_errors, prepare_args,
                           random_device)

OPS = ["sum", "mean", "sumsq", "max", "min"]
SHAPES = [(0, 16), (1, 1), (3, 5), (64, 127), (4097, 4096), (3, 131072), (70_000, 3)]


def test_reference_ops():
    x = np.array([[1.0, -2.0, 3.0]])
    assert reference.row_reduce(x, "sum") == 2.0
    assert reference.row_reduce(x, "sumsq") == 14.0
    assert reference.row_reduce(x, "min") == -2.0
    assert np.isnan(reference.row_reduce(np.array([[1.0, np.nan]]), "max"))


@pytest.mark.parametrize("args", [
    (np.ones((2, 3), np.float32), "avg"),
    (np.ones((2, 3), np.float32), None),
    (None, "sum"),
    (np.ones((2, 0), np.float32), "max"),
    (np.ones((2, 3), np.int32), "min"),
    (np.ones((2, 6), np.float32)[:, ::2], "sum"),
    # Rows 2**31 elements apart: the kernel's strides are 32-bit (as_strided allocates nothing).
    (np.lib.stride_tricks.as_strided(np.zeros(8, np.float32), shape=(2, 8), strides=(2**33, 4)), "sum"),
])
def test_reference_refuses_what_the_kernel_refuses(fake_launcher, args):
    assert_same_error(cupykern.row_reduce, reference.row_reduce, *args)


def test_reference_takes_what_the_kernel_takes(fake_launcher):
    for op in OPS:
        assert kernel_and_reference_errors(cupykern.row_reduce, reference.row_reduce, np.ones((2, 3), np.float16),
                                           op) == (None, None)


# ----------------------------------------------------------------- CPU: kOp constants
def test_ops_use_the_named_kop_constants():
    m = row_reduce_ops
    assert m.OPS == {"sum": m.K_SUM, "mean": m.K_SUM, "sumsq": m.K_SUMSQ, "max": m.K_MAX, "min": m.K_MIN}
    assert sorted({m.K_SUM, m.K_SUMSQ, m.K_MAX, m.K_MIN}) == [0, 1, 2, 3]
    assert set(OPS) == set(m.OPS)


def test_kop_constants_match_the_kernel():
    """K_SUM, K_SUMSQ, K_MAX, K_MIN are row_reduce.cu's kRowSum, kRowSumSq, kRowMax, kRowMin,
    and each selects the RowReduceOp specialisation that computes it."""
    text = jit.source("row_reduce.cu")
    named = {name: int(value) for name, value in re.findall(r"constexpr int (kRow\w+) = (\d+);", text)}
    m = row_reduce_ops
    assert named == {"kRowSum": m.K_SUM, "kRowSumSq": m.K_SUMSQ, "kRowMax": m.K_MAX, "kRowMin": m.K_MIN}
    found = {named.get(k, k): (base, term.strip()) for k, base, term in re.findall(
        r"struct RowReduceOp<(\w+)> : (\w+) \{[^}]*?return ([^;]+);", text)}
    assert found == {m.K_SUM: ("SumOp", "__fadd_rn(s, v)"), m.K_SUMSQ: ("SumOp", "__fmaf_rn(v, v, s)"),
                     m.K_MAX: ("MaxOp", "apply(s, v)"), m.K_MIN: ("MinOp", "apply(s, v)")}


# ----------------------------------------------------------------- CPU: intake spec and plan
def _prepare(op="sum", *, x=None, out=None, **kw):
    x = contiguous((4, 1000), _dtypes.float16) if x is None else x
    return row_reduce_ops._prepare(prepare_args("row_reduce", x=x, out=out, op=op, **kw))


@pytest.mark.parametrize("x", [None, launcher._FOREIGN], ids=["x_none", "x_foreign"])
@pytest.mark.parametrize("op", ["median", "Sum", None, 0])
def test_unknown_op_raises_before_x_is_looked_at(x, op):
    """The op is checked first: no conversion of x (nor a GPU) is needed to reject it."""
    with pytest.raises(ValueError, match=f"op: expected one of \\('sum', 'mean', 'sumsq', 'max', 'min'\\), "
                                         f"got {re.escape(repr(op))}"):
        row_reduce_ops._prepare(prepare_args("row_reduce", x=x, out=None, op=op, limits=None))


@pytest.mark.usefixtures("tune_file")
@pytest.mark.parametrize("op", OPS)
def test_row_reduce_launch(op):
    launch = _prepare(op)
    plan = plans.plan_rows(4, 1000, _dtypes.float16, aligned=True, limits=plans.H200_LIMITS, op="row_reduce")
    assert launch.template is row_reduce_ops.ROW_REDUCE and launch.plan == plan
    assert launch.template_args == (row_reduce_ops.OPS[op], "__half", *plan.layout.template_args())
    assert launch.pointers == ("out", "x")
    assert launch.allocate == (("out", (4,), np.float32),) and launch.returns == "out"
    scale = np.float32(1 / 1000) if op == "mean" else np.float32(1.0)
    assert launch.scalars == (4, 1000, 1000, 1, scale)
    assert [type(v) for v in launch.scalars] == [np.int32] * 4 + [np.float32]  # 32-bit (row_reduce.cu)
    (rule,) = launch.disjoint
    assert (rule.a, rule.b, rule.allow_same) == ("x", "out", False)


def test_row_reduce_strides_of_2_31_are_refused():
    far = 2**31
    with pytest.raises(ValueError, match=r"x: rows 2147483648 elements apart; expected fewer than 2\*\*31"):
        _prepare(x=Sig((2, 8), (far * 2, 2), np.dtype(np.float16), 0))
    with pytest.raises(ValueError, match=r"out: rows 2147483648 elements apart"):
        _prepare(x=contiguous((2, 8), np.float16), out=Sig((2,), (far * 4,), np.dtype(np.float32), 0))


@pytest.mark.usefixtures("tune_file")
def test_row_reduce_launch_layouts():
    # (2, 3, 8) rows into a (2, 3) output; a strided out (every other float32).
    out = Sig((2, 3), (24, 8), np.dtype(np.float32), 4)
    launch = _prepare("max", x=contiguous((2, 3, 8), _dtypes.bfloat16), out=out)
    assert launch.allocate == () and launch.scalars[:4] == (6, 8, 8, 2)
    # Only x's alignment matters for vector loads (out is written one float per row).
    assert launch.plan.layout.vec_width == 8
    assert _prepare(x=contiguous((4, 1000), np.float16, align=8)).plan.layout.vec_width == 1
    assert _prepare(x=Sig((4, 1000), (2 * 1001, 2), np.dtype(np.float16), 0)).plan.layout.vec_width == 1


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(out=contiguous((4,), np.float16)), TypeError, "out: expected dtype float32"),
    (dict(out=contiguous((4, 1), np.float32)), ValueError, r"out: expected shape \(4,\)"),
    (dict(x=contiguous((4, 0), np.float16)), ValueError, "x: the last axis must have at least one element"),
    (dict(x=contiguous((4, 8), np.int32)), TypeError, "x: unsupported dtype int32"),
])
def test_row_reduce_intake_errors_name_the_argument(kwargs, error, message):
    with pytest.raises(error, match=message):
        _prepare("sum", limits=None, **kwargs)


def test_row_reduce_zero_rows_launch_nothing():
    launch = _prepare("min", x=contiguous((0, 16), np.float32), limits=None)
    assert launch.template is None and launch.allocate == (("out", (0,), np.float32),)


@pytest.mark.gpu
@pytest.mark.parametrize("rows, n", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("op", OPS)
def test_row_reduce_matches_reference(rng, op, rows, n, dtype):
    x = random_device(rng, (rows, n), dtype)
    out = cupy.full((rows,), np.nan, dtype=np.float32)
    assert cupykern.row_reduce(x, op, out=out) is out
    want = reference.row_reduce(x, op)
    if op in ("sum", "mean", "sumsq"):
        # An fp32 sum's error scales with the sum of |terms|, not with the result.
        scale = reference.row_reduce(np.abs(x.get().astype(np.float64)), op if op != "sumsq" else "sumsq")
        scale = np.maximum(scale, 1.0)
        err = np.abs(out.get() - want)
        assert np.all(err <= 1e-5 * scale), f"max err/scale {np.max(err / scale)} (seed {rng.seed})"
    else:
        np.testing.assert_array_equal(out.get(), want.astype(np.float32))  # max/min are exact


@pytest.mark.gpu
def test_row_reduce_propagates_nan_and_handles_strided_rows(rng):
    wide = random_device(rng, (10, 300), np.float32)
    x = wide[:, 7:263]
    x[4, 100] = np.nan
    for op in OPS:
        got = cupykern.row_reduce(x, op).get()
        assert np.isnan(got[4]) and not np.isnan(np.delete(got, 4)).any(), op
    got = cupykern.row_reduce(wide[:, 1:], "max")
    np.testing.assert_array_equal(got.get(), reference.row_reduce(wide[:, 1:], "max").astype(np.float32))


@pytest.mark.gpu
def test_row_reduce_output_shape_and_errors():
    x = cupy.ones((2, 3, 8), dtype=np.float16)
    assert cupykern.row_reduce(x, "mean").shape == (2, 3)
    with pytest.raises(TypeError, match="out: expected dtype float32"):
        cupykern.row_reduce(x, "sum", out=cupy.empty((2, 3), dtype=np.float16))
    with pytest.raises(ValueError, match=r"out: expected shape \(2, 3\)"):
        cupykern.row_reduce(x, "sum", out=cupy.empty((6,), dtype=np.float32))
