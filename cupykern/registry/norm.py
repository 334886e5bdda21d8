"""Op specs of the norm family (rms_norm, fused_add_rms_norm, layer_norm)."""

from __future__ import annotations

from cupykern import reference
from cupykern.ops import norm
from cupykern.registry import OpSpec, nbytes, random_device


def _norm_inputs(rng, num_tokens, hidden_size, dtype, *, with_residual=False, with_bias=False):
    inputs = {
        "x": random_device(rng, (num_tokens, hidden_size), dtype),
        "weight": random_device(rng, (hidden_size,), dtype, scale=0.1, loc=1.0),
        "eps": 1e-6,
    }
    if with_residual:
        inputs["residual"] = random_device(rng, (num_tokens, hidden_size), dtype)
    if with_bias:
        inputs["bias"] = random_device(rng, (hidden_size,), dtype, scale=0.1)
        inputs["eps"] = 1e-5
    return inputs


RMS_NORM = OpSpec(
    name="rms_norm", family="norm", size_name="hidden_size",
    make_inputs=lambda rng, n, h, dtype: {**_norm_inputs(rng, n, h, dtype), "out": None},
    run=lambda i: (norm.rms_norm(i["x"], i["weight"], i["eps"], out=i.get("out")),),
    reference=lambda i: (reference.rms_norm(i["x"], i["weight"], i["eps"]),),
    min_bytes=lambda i: 2 * nbytes(i["x"]) + nbytes(i["weight"]),
    output_dtypes=lambda i: (i["x"].dtype,),
)

FUSED_ADD_RMS_NORM = OpSpec(
    name="fused_add_rms_norm", family="norm", size_name="hidden_size",
    make_inputs=lambda rng, n, h, dtype: _norm_inputs(rng, n, h, dtype, with_residual=True),
    run=lambda i: norm.fused_add_rms_norm(i["x"], i["residual"], i["weight"], i["eps"]),
    reference=lambda i: reference.fused_add_rms_norm(i["x"], i["residual"], i["weight"], i["eps"]),
    min_bytes=lambda i: 4 * nbytes(i["x"]) + nbytes(i["weight"]),
    output_dtypes=lambda i: (i["x"].dtype, i["x"].dtype),
)

LAYER_NORM = OpSpec(
    name="layer_norm", family="norm", size_name="hidden_size",
    make_inputs=lambda rng, n, h, dtype: {**_norm_inputs(rng, n, h, dtype, with_bias=True), "out": None},
    run=lambda i: (norm.layer_norm(i["x"], i["weight"], i["bias"], i["eps"], out=i.get("out")),),
    reference=lambda i: (reference.layer_norm(i["x"], i["weight"], i["bias"], i["eps"]),),
    min_bytes=lambda i: 2 * nbytes(i["x"]) + nbytes(i["weight"], i["bias"]),
    output_dtypes=lambda i: (i["x"].dtype,),
)

SPECS = (RMS_NORM, FUSED_ADD_RMS_NORM, LAYER_NORM)
