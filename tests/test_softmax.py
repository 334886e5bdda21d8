"""softmax (kernels_cu/softmax.cu): CPU reference properties, GPU kernel vs reference."""

from __future__ import annotations

import cupy
import numpy as np
import pytest

import cupykern
from cupykern import _dtypes, reference
from tests.helpers import DTYPES, DTYPE_IDS, Guarded, assert_close, random_device

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
def test_softmax_strided_misaligned_rows(rng):
    wide = random_device(rng, (50, 1100), _dtypes.bfloat16)
    x = wide[:, 1:1001]
    assert_close(cupykern.softmax(x), reference.softmax(x), np.float32, seed=rng.seed)


@pytest.mark.gpu
def test_softmax_argument_errors():
    x = cupy.ones((2, 8), dtype=np.float16)
    with pytest.raises(ValueError, match="temperature"):
        cupykern.softmax(x, temperature=0.0)
    with pytest.raises(TypeError, match="out: expected dtype float32 or float16"):
        cupykern.softmax(x, out=cupy.empty((2, 8), dtype=_dtypes.bfloat16))
