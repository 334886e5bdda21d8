"""Checks one op against its float64 reference on fresh seeded inputs.

Used by ``cupykern check``, ``cupykern sweep`` and the benchmarks before anything is
timed. Outputs are poisoned with NaN first (an element the kernel skips fails), and
for large inputs the reference runs on a sample of rows: rows are independent, so
the first, middle and last rows catch indexing faults at the edges.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cupykern.reference._common import host
from cupykern.registry import OpSpec
from cupykern.tolerances import tolerance

#: Reference rows at most (the first, last and evenly spaced ones between).
MAX_REFERENCE_ROWS = 64


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    worst_error_ratio: float  # max |err| / (atol + rtol |ref|); <= 1 passes
    message: str


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
    """Fills a preallocated ``out`` with NaN."""
    out = inputs.get("out")
    if out is not None:
        out[...] = np.nan


def compare(outputs, expected, dtypes, rows: np.ndarray) -> CheckResult:
    worst = 0.0
    for i, (got, want, dtype) in enumerate(zip(outputs, expected, dtypes)):
        got = host(got)[rows].astype(np.float64)
        want = np.asarray(want, dtype=np.float64)
        if not np.array_equal(np.isnan(got), np.isnan(want)):
            return CheckResult(False, float("inf"), f"output {i}: NaN where the reference has none (or vice versa)")
        finite = np.isfinite(want)
        if not np.array_equal(got[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)]):
            return CheckResult(False, float("inf"), f"output {i}: infinities differ")
        tol = tolerance(dtype)
        if finite.any():
            ratio = np.abs(got[finite] - want[finite]) / (tol["atol"] + tol["rtol"] * np.abs(want[finite]))
            worst = max(worst, float(ratio.max()))
    ok = worst <= 1.0
    return CheckResult(ok, worst, "ok" if ok else f"error {worst:.3g}x the tolerance")


def check_op(spec: OpSpec, num_tokens: int, size: int, dtype, seed: int, inputs: dict | None = None) -> CheckResult:
    """Runs ``spec`` once on fresh inputs (or ``inputs``) and compares with the reference."""
    if inputs is None:
        inputs = spec.make_inputs(np.random.default_rng(seed), num_tokens, size, dtype)
    rows = sample_rows(num_tokens)
    expected = spec.reference(_rows_of(inputs, rows, spec.token_inputs))
    poison(inputs)
    outputs = spec.run(inputs)
    return compare(outputs, expected, spec.output_dtypes(inputs), rows)
