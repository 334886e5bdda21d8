"""Op specs of the quant family (FP8 E4M3FN outputs of RMSNorm and SiLU-and-mul).

Inputs as the norm and activation families' (with a model preset, its eps and weight
offset), plus a static scale for the per-tensor ops: ``max |y| / 448`` of the standard
inputs' typical row maximum (about 4.5 for unit-normal rows of a few thousand elements
times weights near 1), so most values land in E4M3FN's normal range and a few saturate.
Outputs are compared as float8_e4m3fn (the uint8 bits viewed as such,
cupykern/validation.py) within one E4M3FN unit (cupykern/tolerances.py).
"""

from __future__ import annotations

import numpy as np

from cupykern import _dtypes, reference
from cupykern.ops import quant
from cupykern.registry import OpSpec, nbytes, random_device
from cupykern.registry.norm import _norm_inputs

#: The static scale of the standard inputs (see the module docstring).
STATIC_SCALE = 4.0 / 448.0
_FP8 = _dtypes.float8_e4m3fn
_SCALE_BYTES = 4


def _scale():
    import cupy

    return cupy.full((1,), STATIC_SCALE, dtype=np.float32)


def _fp8_bytes(x) -> int:
    return x.size  # one byte per element


def _static_norm_inputs(rng, n, h, dtype, model=None, with_residual=False):
    return {**_norm_inputs(rng, n, h, dtype, with_residual=with_residual, model=model), "scale": _scale(), "out": None}


def _dynamic_norm_inputs(rng, n, h, dtype, model=None, with_residual=False):
    return {**_norm_inputs(rng, n, h, dtype, with_residual=with_residual, model=model), "out": None, "scales": None}


RMS_NORM_QUANT = OpSpec(
    name="rms_norm_quant", family="quant", size_name="hidden_size",
    make_inputs=_static_norm_inputs,
    run=lambda i: (quant.rms_norm_quant(i["x"], i["weight"], i["scale"], i["eps"],
                                        weight_offset=i.get("weight_offset", 0.0), out=i.get("out")),),
    reference=lambda i: (reference.rms_norm_quant(i["x"], i["weight"], i["scale"], i["eps"],
                                                  weight_offset=i.get("weight_offset", 0.0)),),
    min_bytes=lambda i: nbytes(i["x"]) + _fp8_bytes(i["x"]) + nbytes(i["weight"]) + _SCALE_BYTES,
    output_dtypes=lambda i: (_FP8,),
    model_aware=True,
)

FUSED_ADD_RMS_NORM_QUANT = OpSpec(
    name="fused_add_rms_norm_quant", family="quant", size_name="hidden_size",
    make_inputs=lambda rng, n, h, dtype, model=None: _static_norm_inputs(rng, n, h, dtype, model, with_residual=True),
    run=lambda i: quant.fused_add_rms_norm_quant(i["x"], i["residual"], i["weight"], i["scale"], i["eps"],
                                                 weight_offset=i.get("weight_offset", 0.0), out=i.get("out")),
    reference=lambda i: reference.fused_add_rms_norm_quant(i["x"], i["residual"], i["weight"], i["scale"], i["eps"],
                                                           weight_offset=i.get("weight_offset", 0.0)),
    # x and residual read, residual written, the FP8 output written.
    min_bytes=lambda i: 3 * nbytes(i["x"]) + _fp8_bytes(i["x"]) + nbytes(i["weight"]) + _SCALE_BYTES,
    output_dtypes=lambda i: (_FP8, i["x"].dtype),
    model_aware=True,
)

RMS_NORM_DYNAMIC_PER_TOKEN_QUANT = OpSpec(
    name="rms_norm_dynamic_per_token_quant", family="quant", size_name="hidden_size",
    make_inputs=_dynamic_norm_inputs,
    run=lambda i: quant.rms_norm_dynamic_per_token_quant(i["x"], i["weight"], i["eps"],
                                                         weight_offset=i.get("weight_offset", 0.0),
                                                         out=i.get("out"), scales=i.get("scales")),
    reference=lambda i: reference.rms_norm_dynamic_per_token_quant(i["x"], i["weight"], i["eps"],
                                                                   weight_offset=i.get("weight_offset", 0.0)),
    min_bytes=lambda i: nbytes(i["x"]) + _fp8_bytes(i["x"]) + nbytes(i["weight"]) + 4 * i["x"].shape[0],
    output_dtypes=lambda i: (_FP8, _dtypes.float32),
    model_aware=True,
)

FUSED_ADD_RMS_NORM_DYNAMIC_PER_TOKEN_QUANT = OpSpec(
    name="fused_add_rms_norm_dynamic_per_token_quant", family="quant", size_name="hidden_size",
    make_inputs=lambda rng, n, h, dtype, model=None: _dynamic_norm_inputs(rng, n, h, dtype, model,
                                                                          with_residual=True),
    # The residual is updated in place; it is an output here too.
    run=lambda i: (*quant.fused_add_rms_norm_dynamic_per_token_quant(
        i["x"], i["residual"], i["weight"], i["eps"], weight_offset=i.get("weight_offset", 0.0), out=i.get("out"),
        scales=i.get("scales")), i["residual"]),
    reference=lambda i: reference.fused_add_rms_norm_dynamic_per_token_quant(
        i["x"], i["residual"], i["weight"], i["eps"], weight_offset=i.get("weight_offset", 0.0)),
    min_bytes=lambda i: 3 * nbytes(i["x"]) + _fp8_bytes(i["x"]) + nbytes(i["weight"]) + 4 * i["x"].shape[0],
    output_dtypes=lambda i: (_FP8, _dtypes.float32, i["x"].dtype),
    model_aware=True,
)

SILU_AND_MUL_QUANT = OpSpec(
    name="silu_and_mul_quant", family="quant", size_name="d",
    make_inputs=lambda rng, n, d, dtype: {"x": random_device(rng, (n, 2 * d), dtype), "scale": _scale(), "out": None},
    run=lambda i: (quant.silu_and_mul_quant(i["x"], i["scale"], out=i.get("out")),),
    reference=lambda i: (reference.silu_and_mul_quant(i["x"], i["scale"]),),
    min_bytes=lambda i: nbytes(i["x"]) + _fp8_bytes(i["x"]) // 2 + _SCALE_BYTES,
    output_dtypes=lambda i: (_FP8,),
    check_sizes=(11008,),
)

SPECS = (RMS_NORM_QUANT, FUSED_ADD_RMS_NORM_QUANT, RMS_NORM_DYNAMIC_PER_TOKEN_QUANT,
         FUSED_ADD_RMS_NORM_DYNAMIC_PER_TOKEN_QUANT, SILU_AND_MUL_QUANT)
