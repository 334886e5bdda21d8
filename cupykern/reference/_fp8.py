"""Exact float64 -> FP8 E4M3FN rounding for the references of the quant family.

E4M3FN (OCP 8-bit Floating Point Specification (OFP8) rev. 1.0; ``ml_dtypes.float8_e4m3fn``):
1 sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities; NaN is S.1111.111;
largest finite 448 (0x7e), smallest normal 2**-6 (0x08), smallest subnormal 2**-9 (0x01).

:func:`e4m3fn_bits` rounds float64 values to nearest even, in one step, then saturates:
what ``__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3)`` does to an fp32 ``v`` (every
fp32 value is a float64 value). ``ml_dtypes`` converts float64 to float8 through float32,
two roundings, which differ from one where the float32 rounding lands on an E4M3FN
midpoint (1.0625 + 2**-40 is 1.125 rounded once, 1.0 through float32), so it is used
here only as the container and for decoding bits.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

FLOAT8_E4M3FN = np.dtype(ml_dtypes.float8_e4m3fn)
#: Largest finite E4M3FN value, and the exponents of the smallest normal and subnormal.
E4M3FN_MAX = 448.0
MIN_NORMAL_EXP, MIN_SUBNORMAL_EXP = -6, -9
#: Bit pattern of NaN (positive sign), as the sm_89+ conversion writes it.
NAN_BITS = 0x7F
_MANTISSA_BITS = 3
#: The 127 non-negative finite values, in increasing order; index = bit pattern.
_POSITIVE = np.arange(0x7F, dtype=np.uint8).view(FLOAT8_E4M3FN).astype(np.float64)


def e4m3fn_bits(values) -> np.ndarray:
    """uint8 E4M3FN bit patterns of float64 ``values``: round to nearest even (one
    rounding), |v| beyond 448 (infinities included) to +-448, NaN to 0x7f, the sign of
    zero kept."""
    v = np.asarray(values, dtype=np.float64)
    nan = np.isnan(v)
    sign = np.signbit(v)
    a = np.minimum(np.abs(np.where(nan, 0.0, v)), E4M3FN_MAX)
    # The spacing of E4M3FN at a: 2**(e - 3) for a in [2**e, 2**(e + 1)), e >= -6; 2**-9 below.
    _, exp = np.frexp(a)  # a = m * 2**exp, m in [0.5, 1): floor(log2 a) = exp - 1
    quantum = np.exp2(np.maximum(exp - 1, MIN_NORMAL_EXP) - _MANTISSA_BITS)
    rounded = np.rint(a / quantum) * quantum  # a / quantum is exact; rint ties to even
    bits = np.searchsorted(_POSITIVE, rounded).astype(np.uint8)
    bits = np.where(sign, bits | np.uint8(0x80), bits)
    return np.where(nan, np.uint8(NAN_BITS), bits).astype(np.uint8)


def decode(bits) -> np.ndarray:
    """float64 values of uint8 E4M3FN bit patterns (NaN for 0x7f and 0xff)."""
    return np.asarray(bits, dtype=np.uint8).view(FLOAT8_E4M3FN).astype(np.float64)


def round_e4m3fn(values) -> np.ndarray:
    """float64 ``values`` rounded once to E4M3FN (:func:`e4m3fn_bits`), as float64."""
    return decode(e4m3fn_bits(values))
