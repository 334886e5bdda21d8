"""softmax (kernels_cu/softmax.cu): CPU reference properties and the intake spec on
hand-built call signatures, GPU kernel vs reference."""

from __future__ import annotations

import cupy
import numpy as np
import pytest

import cupykern
from cupykern import _dtypes, launcher, plans, reference
from cupykern._arrays import Sig
from cupykern.ops import softmax as softmax_ops
from tests.helpers import (DTYPES, DTYPE_IDS, Guarded, assert_close, assert_same_error, contiguous,
                           kernel_and_reference_errors, prepare_args, random_device)

SHAPES = [(0, 128), (1, 1), (1, 5), (3, 127), (64, 4096), (4097, 128), (3, 65536), (2, 131072), (257, 32000)]


def test_reference_rows_sum_to_one_and_handle_inf():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 300)) * 10
    np.testing.assert_allclose(reference.softmax(x).sum(axis=-1), 1.0)
    y = reference.softmax(np.array([[-np.inf, -np.inf], [0.0, -np.inf]]))
    assert np.isnan(y[0]).all()
    np.testing.assert_array_equal(y[1], [1.0, 0.0])


def test_reference_temperature_divides_logits():
    x = np.array([[1.0, 2.0, 3.0]])
    np.testing.assert_allclose(reference.softmax(x, temperature=2.0), reference.softmax(x / 2.0))


# ----------------------------------------------------------------- CPU: intake spec and plan
def _prepare(*, x=None, out=None, temperature=1.0, **kw):
    x = contiguous((4, 1000), _dtypes.bfloat16) if x is None else x
    return softmax_ops._prepare(prepare_args("softmax", x=x, out=out, temperature=temperature, **kw))


@pytest.mark.usefixtures("tune_file")
def test_softmax_launch():
    launch = _prepare(temperature=0.5)
    plan = plans.plan_rows(4, 1000, _dtypes.bfloat16, aligned=True, limits=plans.H200_LIMITS, op="softmax")
    assert launch.template is softmax_ops.SOFTMAX and launch.plan == plan
    assert launch.template_args == ("__nv_bfloat16", "float", *plan.layout.template_args(), False)
    # kExact where the layout fills the row (1 x 4096 bf16: 256 threads x 2 leaves of 8), up
    # to 256 rows (plans.EXACT_WALK; 4096 x 4096: 128 x 4, filled too, but slower exact).
    assert _prepare(x=contiguous((1, 4096), _dtypes.bfloat16)).template_args[-1] is True
    assert _prepare(x=contiguous((256, 8192), _dtypes.bfloat16)).template_args[-1] is True
    assert _prepare(x=contiguous((257, 8192), _dtypes.bfloat16)).template_args[-1] is False
    prefill = _prepare(x=contiguous((4096, 4096), _dtypes.bfloat16))
    assert prefill.plan.layout.fills(4096, _dtypes.bfloat16) and prefill.template_args[-1] is False
    assert launch.pointers == ("out", "x")
    # The default output is float32.
    assert launch.allocate == (("out", (4, 1000), _dtypes.float32),) and launch.returns == "out"
    assert launch.scalars == (4, 1000, 1000, 1000, np.float32(2.0))  # 1 / temperature
    (rule,) = launch.disjoint
    assert (rule.a, rule.b, rule.allow_same) == ("x", "out", True)
    # An out of x's dtype (in place allowed) picks the matching instantiation.
    same = _prepare(out=contiguous((4, 1000), _dtypes.bfloat16))
    assert same.template_args[:2] == ("__nv_bfloat16", "__nv_bfloat16") and same.allocate == ()
    # A float32 out with rows that do not start 16-byte aligned: scalar accesses.
    assert _prepare(out=Sig((4, 1000), (4 * 1001, 4), np.dtype(np.float32), 0)).plan.layout.vec_width == 1
    assert _prepare(x=contiguous((4, 1000), _dtypes.bfloat16, align=2)).plan.layout.vec_width == 1


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(temperature=0.0), ValueError, "temperature: expected a finite value > 0"),
    (dict(temperature=-1.0), ValueError, "temperature"),
    (dict(temperature=float("inf")), ValueError, "temperature"),
    (dict(out=contiguous((4, 1000), np.float16)), TypeError, r"out: expected dtype float32 or x's dtype \(bfloat16\)"),
    (dict(out=contiguous((4, 999), np.float32)), ValueError, r"out: expected shape \(4, 1000\)"),
    (dict(x=contiguous((4, 1000), np.float64)), TypeError, "x: unsupported dtype float64"),
    (dict(x=Sig((4, 1000), (2, 8), np.dtype(np.float16), 0)), ValueError, "x: the last axis must be unit-stride"),
    (dict(x=contiguous((4, 0), np.float16)), ValueError, "x: the last axis must have at least one element"),
])
def test_softmax_intake_errors_name_the_argument(kwargs, error, message):
    with pytest.raises(error, match=message):
        _prepare(limits=None, **kwargs)


@pytest.mark.parametrize("temperature, message", [
    # 1 / 1e-39 overflows float32 (the NaN row); 1e-39 itself is subnormal.
    (1e-39, "temperature: 1e-39 is below the smallest normal float32"),
    (5e-324, "temperature: 5e-324 is below the smallest normal float32"),
    # 1 / 1e38 would be flushed to 0 on the GPU: a -inf logit would give -inf * 0 = NaN.
    (1e38, r"temperature: expected at most 8.507059e\+37 \(1 / temperature must be a normal float32"),
])
def test_softmax_temperatures_whose_scale_the_gpu_would_flush(temperature, message):
    with pytest.raises(ValueError, match=message):
        _prepare(limits=None, temperature=temperature)


@pytest.mark.usefixtures("tune_file")
def test_softmax_temperature_range_ends_are_normal_scales():
    tiny = np.finfo(np.float32).tiny
    assert _prepare(temperature=float(tiny)).scalars[-1] == np.float32(1 / tiny)
    assert _prepare(temperature=softmax_ops.MAX_TEMPERATURE).scalars[-1] == tiny


_X = np.array([[1.0, 2.0, 0.5, 3.0]], np.float32)


@pytest.mark.parametrize("args, kwargs", [
    ((_X,), {"temperature": -1.0}),  # the reversed softmax
    ((_X,), {"temperature": 0.0}),  # the NaN
    ((_X,), {"temperature": 1e-39}),
    ((_X,), {"temperature": 1e38}),
    ((_X,), {"temperature": float("nan")}),
    ((_X,), {"temperature": "hot"}),
    ((None,), {}),
    ((_X.astype(np.int64),), {}),
    ((np.ones((2, 8), np.float32)[:, ::2],), {}),
    ((np.ones((2, 0), np.float32),), {}),
    # Rows 2**31 elements apart: the kernel's strides are 32-bit (as_strided allocates nothing).
    ((np.lib.stride_tricks.as_strided(np.zeros(8, np.float32), shape=(2, 8), strides=(2**33, 4)),), {}),
])
def test_reference_refuses_what_the_kernel_refuses(fake_launcher, args, kwargs):
    assert_same_error(cupykern.softmax, reference.softmax, *args, **kwargs)


def test_softmax_arguments_are_32_bit():
    """num_rows, hidden_size and the row strides are the kernel's 32-bit ints (softmax.cu):
    2**31 or more is refused, naming the array; one row's stride is passed as 0."""
    far = 2**31
    with pytest.raises(ValueError, match=r"x: rows 2147483648 elements apart; expected fewer than 2\*\*31"):
        _prepare(x=Sig((2, 1000), (far * 2, 2), np.dtype(np.float16), 0))
    with pytest.raises(ValueError, match=r"out: rows 2147483648 elements apart"):
        _prepare(out=Sig((4, 1000), (far * 4, 4), np.dtype(np.float32), 0))
    with pytest.raises(ValueError, match=r"x: 1 row\(s\) of 2147483648 elements"):
        _prepare(x=contiguous((1, far), np.float16))
    launch = _prepare(x=Sig((1, 1000), (far * 2, 2), np.dtype(np.float16), 0))
    assert launch.scalars[:4] == (1, 1000, 0, 0) and {type(v) for v in launch.scalars[:4]} == {np.int32}


def test_reference_takes_what_the_kernel_takes(fake_launcher):
    for temperature in (float(np.finfo(np.float32).tiny), 0.7, softmax_ops.MAX_TEMPERATURE):
        assert kernel_and_reference_errors(cupykern.softmax, reference.softmax, _X, temperature=temperature) == \
            (None, None)
    np.testing.assert_array_equal(reference.softmax(_X, temperature=float(np.finfo(np.float32).tiny)), [[0, 0, 0, 1]])


def test_softmax_zero_rows_launch_nothing():
    launch = _prepare(x=contiguous((0, 128), np.float16), limits=None)
    assert launch.template is None and launch.allocate == (("out", (0, 128), np.float32),)


@pytest.mark.usefixtures("tune_file")
def test_softmax_takes_row_overrides():
    launch = _prepare(overrides={"threads_per_row": 32, "block_size": 128})
    assert launch.plan.origin == "override" and launch.plan.rows_per_block == 4
    assert launcher.ops()["softmax"].launch_options == plans.ROW_OVERRIDE_KEYS


@pytest.mark.gpu
@pytest.mark.parametrize("rows, n", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_softmax_matches_reference(rng, rows, n, dtype):
    x = random_device(rng, (rows, n), dtype, scale=4.0)
    out = Guarded((rows, n), np.float32)
    cupykern.softmax(x, out=out.view)
    assert_close(out.view, reference.softmax(x), np.float32, seed=rng.seed)
    out.check_margins()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_softmax_default_output_is_float32_and_out_may_be_x(rng, dtype):
    x = random_device(rng, (33, 1000), dtype, scale=2.0)
    want = reference.softmax(x, temperature=0.7)
    got = cupykern.softmax(x, temperature=0.7)
    assert got.dtype == np.float32
    assert_close(got, want, np.float32, seed=rng.seed)
    assert cupykern.softmax(x, temperature=0.7, out=x) is x
    assert_close(x, want, dtype, seed=rng.seed)


@pytest.mark.gpu
def test_softmax_minus_inf_rows(rng):
    x = random_device(rng, (4, 1000), np.float32)
    x[0, :] = -np.inf               # all -inf: NaN, as the float64 reference
    x[1, ::2] = -np.inf             # partly -inf: exact zeros there
    got = cupykern.softmax(x).get()
    assert np.isnan(got[0]).all()
    assert (got[1, ::2] == 0).all()
    assert_close(got, reference.softmax(x), np.float32, seed=rng.seed)


@pytest.mark.gpu
def test_softmax_temperature_range_ends():
    """The issue's row [1, 3, 2, -1]: at the smallest temperature, one-hot at the maximum (as
    the float64 reference); at the largest, -inf entries give 0, not -inf * 0 = NaN."""
    x = cupy.asarray([[1.0, 3.0, 2.0, -1.0]], dtype=np.float32)
    np.testing.assert_array_equal(cupykern.softmax(x, temperature=float(np.finfo(np.float32).tiny)).get(),
                                  [[0, 1, 0, 0]])
    with pytest.raises(ValueError, match="temperature: 1e-39 is below the smallest normal float32"):
        cupykern.softmax(x, temperature=1e-39)
    x[0, 0] = -np.inf
    got = cupykern.softmax(x, temperature=softmax_ops.MAX_TEMPERATURE).get()
    np.testing.assert_allclose(got, [[0, 1 / 3, 1 / 3, 1 / 3]], rtol=1e-6)


@pytest.mark.gpu
def test_softmax_strided_misaligned_rows(rng):
    wide = random_device(rng, (50, 1100), _dtypes.bfloat16)
    x = wide[:, 1:1001]
    assert_close(cupykern.softmax(x), reference.softmax(x), np.float32, seed=rng.seed)


@pytest.mark.gpu
def test_softmax_argument_errors():
    x = cupy.ones((2, 8), dtype=np.float16)
    with pytest.raises(ValueError, match="temperature"):
        cupykern.softmax(x, temperature=0.0)
    with pytest.raises(TypeError, match=r"out: expected dtype float32 or x's dtype \(float16\)"):
        cupykern.softmax(x, out=cupy.empty((2, 8), dtype=_dtypes.bfloat16))
