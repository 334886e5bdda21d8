"""Per-dtype tolerances for comparing a kernel output with the float64 reference
(tests, `cupykern check`, sweeps and benchmarks).

A kernel computes in fp32 and rounds once to the output dtype. Against the unrounded
float64 reference r, its output k satisfies |k - r| <= |k - round(r)| + |round(r) - r|:
at most one unit in the last place (ulp) where the fp32 value and r round to
neighbours, plus half an ulp for the reference's own rounding. Relative to |r|, one ulp
is at most 2**-p (p = stored mantissa bits), so rtol = 1.5 * 2**-p:

* bfloat16 (p = 7):  1.5 * 2**-7  = 1.17e-2
* float16  (p = 10): 1.5 * 2**-10 = 1.46e-3
* float32  (p = 23): rounding is negligible; the fp32 math is the error. A sum of n
  terms in fp32 has relative error about sqrt(n) * 2**-24 for random data, 2e-5 for
  n = 131072 (the largest rows tested); expf/rsqrtf add a few ulp. rtol = 3e-5.

float8_e4m3fn (p = 3; the quant family's outputs): the reference is itself rounded to
E4M3FN (it models the kernel's one rounding), so the two differ by at most one unit
where the kernel's fp32 value and the float64 one straddle a rounding boundary. One unit
is at most 2**-3 of the value for normal values and 2**-9 (the subnormal spacing) below
2**-6: rtol = 2**-3, atol = 2**-9, one unit, stated in bits: the last of 3 mantissa bits.
The tests compare bit patterns and count these one-unit differences.

atol covers outputs near zero, where relative error is meaningless: the fp32 math
error there is about 2**-24 times the row's scale (O(1) in the tests), and the
output's own subnormal range; it is kept well under one ulp of O(1) values.
"""

from __future__ import annotations

import numpy as np

from cupykern import _dtypes

TOLERANCES = {
    _dtypes.bfloat16: dict(rtol=1.5 * 2**-7, atol=1e-3),
    _dtypes.float16: dict(rtol=1.5 * 2**-10, atol=1e-4),
    _dtypes.float32: dict(rtol=3e-5, atol=1e-6),
    _dtypes.float8_e4m3fn: dict(rtol=2**-3, atol=2**-9),
    # Token ids and positions: exact (integers differ by at least 1).
    np.dtype(np.int32): dict(rtol=0.0, atol=0.5),
}


def tolerance(dtype) -> dict:
    return TOLERANCES[np.dtype(dtype)]
