"""Checks outputs against their float64 reference: the one comparison of the project.

Used by the tests (``tests/helpers.py::assert_close``), ``cupykern check``, the sweep
engine and the benchmarks before anything is timed. :func:`compare_array` compares one
output; :func:`check_op` runs an op of the registry once on fresh seeded inputs, its
outputs poisoned with NaN first (an element the kernel skips fails), and for large
inputs compares a sample of rows: rows are independent, so the first, middle and last
rows catch indexing faults at the edges.

Every result carries the error three ways: the largest absolute error, the largest
relative error (over nonzero reference values) and the largest error in units in the
last place (ulp) of the output dtype at the reference value.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from cupykern import _dtypes
from cupykern.reference._common import host
from cupykern.tolerances import tolerance

#: Reference rows at most (the first, last and evenly spaced ones between).
MAX_REFERENCE_ROWS = 64


@dataclass(frozen=True)
class CheckResult:
    """The outcome of a comparison with the float64 reference."""

    ok: bool
    worst_error_ratio: float  # max |err| / (atol + rtol |ref|); <= 1 passes
    max_abs_err: float
    max_rel_err: float  # over nonzero reference values
    max_ulp_err: float  # in ulp of the output dtype at the reference value
    message: str

    @staticmethod
    def failed(message: str) -> "CheckResult":
        inf = float("inf")
        return CheckResult(False, inf, inf, inf, inf, message)


def ulp(values: np.ndarray, dtype) -> np.ndarray:
    """The spacing of ``dtype`` at each float64 value (its subnormal spacing near zero; 1
    for integer dtypes such as token ids)."""
    if np.dtype(dtype).kind in "iu":
        return np.ones_like(values, dtype=np.float64)
    info = ml_dtypes.finfo(dtype) if np.dtype(dtype).kind == "V" else np.finfo(dtype)
    magnitude = np.abs(values)
    with np.errstate(divide="ignore"):
        exponent = np.floor(np.log2(magnitude, where=magnitude > 0, out=np.full_like(magnitude, -np.inf)))
    return np.exp2(np.maximum(exponent, info.minexp) - info.nmant)


def compare_array(actual, expected, dtype, *, rtol: float | None = None, atol: float | None = None,
                  what: str = "output") -> CheckResult:
    """Compares ``actual`` (device or host, any dtype) with float64 ``expected``.

    Passes when NaN is exactly where the reference has NaN, infinities match, and every
    finite element is within ``atol + rtol * |ref|`` (defaults: the dtype's entry of
    cupykern/tolerances.py).
    """
    tol = tolerance(dtype)
    rtol = tol["rtol"] if rtol is None else rtol
    atol = tol["atol"] if atol is None else atol
    got = host(actual)
    if np.dtype(dtype) == _dtypes.float8_e4m3fn and got.dtype == _dtypes.FP8_STORAGE:
        got = got.view(_dtypes.float8_e4m3fn)  # the quant family's uint8 bit patterns
    got = got.astype(np.float64)
    want = np.asarray(expected, dtype=np.float64)
    if got.shape != want.shape:
        return CheckResult.failed(f"{what}: shape {got.shape} != {want.shape} (the reference's)")
    nan_got, nan_want = np.isnan(got), np.isnan(want)
    if not np.array_equal(nan_got, nan_want):
        return CheckResult.failed(f"{what}: NaN pattern differs ({int(nan_got.sum())} NaN in the output, "
                                  f"{int(nan_want.sum())} in the reference)")
    inf_want = np.isinf(want)
    if not np.array_equal(got[inf_want], want[inf_want]) or np.isinf(got[~inf_want & ~nan_want]).any():
        return CheckResult.failed(f"{what}: infinities differ")
    finite = ~nan_want & ~inf_want
    if not finite.any():
        return CheckResult(True, 0.0, 0.0, 0.0, 0.0, "ok")
    g, w = got[finite], want[finite]
    err = np.abs(g - w)
    limit = atol + rtol * np.abs(w)
    ratio = err / limit
    nonzero = w != 0
    max_rel = float((err[nonzero] / np.abs(w[nonzero])).max()) if nonzero.any() else 0.0
    result = dict(worst_error_ratio=float(ratio.max()), max_abs_err=float(err.max()), max_rel_err=max_rel,
                  max_ulp_err=float((err / ulp(w, dtype)).max()))
    if result["worst_error_ratio"] <= 1.0:
        return CheckResult(True, message="ok", **result)
    worst = int(np.argmax(ratio))
    message = (f"{what}: {int(np.sum(err > limit))} of {err.size} elements outside rtol={rtol:.3g} atol={atol:.3g}; "
               f"worst |err|={err[worst]:.4g} at ref={w[worst]:.6g} ({np.dtype(dtype)}), "
               f"{result['worst_error_ratio']:.3g}x the tolerance")
    return CheckResult(False, message=message, **result)


def sample_rows(num_tokens: int) -> np.ndarray:
    if num_tokens <= MAX_REFERENCE_ROWS:
        return np.arange(num_tokens)
    return np.unique(np.linspace(0, num_tokens - 1, MAX_REFERENCE_ROWS).astype(np.int64))


def _rows_of(inputs: dict, rows: np.ndarray, token_inputs) -> dict:
    """Inputs on the host, the token-indexed ones restricted to ``rows``."""
    picked = {}
    for key, value in inputs.items():
        if not hasattr(value, "shape"):
            picked[key] = value
        elif key in token_inputs:
            picked[key] = host(value)[rows]
        else:
            picked[key] = host(value)
    return picked


def poison(inputs: dict) -> None:
    """Fills a preallocated ``out`` (and ``scales``) with NaN: E4M3FN's NaN (0x7f) in a
    uint8 output of the quant family."""
    for name in ("out", "scales"):
        out = inputs.get(name)
        if out is None:
            continue
        if out.dtype == _dtypes.FP8_STORAGE:
            out.fill(0x7F)
        else:
            out[...] = np.nan


def compare(outputs, expected, dtypes, rows: np.ndarray) -> CheckResult:
    """:func:`compare_array` of each output's ``rows`` with its reference; the worst of them."""
    results = [compare_array(host(got)[rows], want, dtype, what=f"output {i}")
               for i, (got, want, dtype) in enumerate(zip(outputs, expected, dtypes))]
    failed = [r for r in results if not r.ok]
    if failed:
        return max(failed, key=lambda r: r.worst_error_ratio)
    worst = {f: max((getattr(r, f) for r in results), default=0.0)
             for f in ("worst_error_ratio", "max_abs_err", "max_rel_err", "max_ulp_err")}
    return CheckResult(True, message="ok", **worst)


def check_op(spec, num_tokens: int, size: int, dtype, seed: int, inputs: dict | None = None) -> CheckResult:
    """Runs ``spec`` (a registry OpSpec) once on fresh inputs (or ``inputs``) and compares
    with the reference."""
    if inputs is None:
        inputs = spec.make_inputs(np.random.default_rng(seed), num_tokens, size, dtype)
    rows = sample_rows(num_tokens)
    expected = spec.reference(_rows_of(inputs, rows, spec.token_inputs))
    poison(inputs)
    outputs = spec.run(inputs)
    return compare(outputs, expected, spec.output_dtypes(inputs), rows)

