"""Shared test helpers: seeded device inputs, poisoned and guarded outputs, comparison."""

from __future__ import annotations

import cupy
import numpy as np

from cupykern import _dtypes
from cupykern.reference._common import host
from tests.tolerances import tolerance

#: The storage dtypes every op takes, and their short names as pytest ids.
DTYPES = _dtypes.DTYPES
DTYPE_IDS = [_dtypes.short_name(d) for d in DTYPES]

#: Value written around and into outputs before a kernel runs: any element the kernel
#: fails to write stays NaN and fails the comparison.
POISON = np.nan


def random_device(rng: np.random.Generator, shape, dtype, scale: float = 1.0, loc: float = 0.0):
    """Normal(loc, scale) values from ``rng``, rounded to ``dtype``, on the device."""
    values = rng.standard_normal(shape, dtype=np.float32) * np.float32(scale) + np.float32(loc)
    return cupy.asarray(values.astype(dtype))


def poisoned(shape, dtype):
    """A new device array of ``dtype`` filled with NaN."""
    return cupy.full(shape, POISON, dtype=np.float32).astype(dtype)


class Guarded:
    """A poisoned output view inside a larger buffer whose margins are checked later.

    ``view`` is ``shape``, rows ``row_pad`` elements wider than needed and ``margin``
    elements into the buffer, so a kernel writing past a row, past the last row or
    before the first is caught by :meth:`check_margins`.
    """

    def __init__(self, shape, dtype, *, row_pad: int = 8, margin: int = 64, misalign: int = 0):
        shape = tuple(shape)
        rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
        width = shape[-1] + row_pad
        self.sentinel = np.float32(-4096.0)  # exact in every supported dtype
        self.buffer = cupy.full(margin + rows * width + margin, self.sentinel, dtype=np.float32).astype(dtype)
        body = self.buffer[margin + misalign: margin + misalign + rows * width].reshape(rows, width)
        self.view = body[:, : shape[-1]].reshape(shape)
        self.view[...] = cupy.asarray(POISON, dtype=np.float32).astype(dtype)
        self._mask = np.ones(self.buffer.shape, dtype=bool)
        flat_index = np.arange(rows * width).reshape(rows, width)[:, : shape[-1]].ravel() + margin + misalign
        self._mask[flat_index] = False

    def check_margins(self):
        outside = host(self.buffer).astype(np.float64)[self._mask]
        bad = np.flatnonzero(outside != np.float64(self.sentinel))
        assert bad.size == 0, f"kernel wrote outside its output: {bad.size} guard elements changed"


def assert_close(actual, expected, dtype, *, seed, what: str = "output", rtol=None, atol=None):
    """Asserts ``actual`` (device or host, any dtype) matches float64 ``expected``.

    NaN must be where the reference has NaN and nowhere else; infinities must match.
    """
    tol = tolerance(dtype)
    rtol = tol["rtol"] if rtol is None else rtol
    atol = tol["atol"] if atol is None else atol
    got = host(actual).astype(np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert got.shape == expected.shape, f"{what}: shape {got.shape} != {expected.shape}"
    nan_got, nan_ref = np.isnan(got), np.isnan(expected)
    assert np.array_equal(nan_got, nan_ref), (
        f"{what}: NaN pattern differs ({nan_got.sum()} NaN in output, {nan_ref.sum()} in reference; seed {seed})")
    ok = ~nan_ref
    inf_ref = np.isinf(expected) & ok
    assert np.array_equal(got[inf_ref], expected[inf_ref]), f"{what}: infinities differ (seed {seed})"
    finite = ok & ~inf_ref
    err = np.abs(got[finite] - expected[finite])
    limit = atol + rtol * np.abs(expected[finite])
    if err.size and not np.all(err <= limit):
        worst = int(np.argmax(err - limit))
        raise AssertionError(
            f"{what}: {int(np.sum(err > limit))} of {err.size} elements outside rtol={rtol:.3g} atol={atol:.3g}; "
            f"worst |err|={err[worst]:.4g} at ref={expected[finite][worst]:.6g} ({np.dtype(dtype)}, seed {seed})")
