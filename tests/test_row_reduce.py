"""row_reduce (kernels_cu/row_reduce.cu): GPU kernel vs float64 reference."""

from __future__ import annotations

import cupy
import numpy as np
import pytest

import cupykern
from cupykern import _dtypes, reference
from tests.helpers import DTYPES, DTYPE_IDS, assert_close, random_device

OPS = ["sum", "mean", "sumsq", "max", "min"]
SHAPES = [(0, 16), (1, 1), (3, 5), (64, 127), (4097, 4096), (3, 131072), (70_000, 3)]


def test_reference_ops():
    x = np.array([[1.0, -2.0, 3.0]])
    assert reference.row_reduce(x, "sum") == 2.0
    assert reference.row_reduce(x, "sumsq") == 14.0
    assert reference.row_reduce(x, "min") == -2.0
    assert np.isnan(reference.row_reduce(np.array([[1.0, np.nan]]), "max"))


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
