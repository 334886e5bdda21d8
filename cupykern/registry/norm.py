"""Op specs of the norm family (rms_norm, fused_add_rms_norm, layer_norm).

With a model preset, the RMSNorm ops take its ``rms_norm_eps`` and weight offset
(Gemma: weights drawn around 0 and used as ``1 + w``, as the checkpoint stores them).
"""

from __future__ import annotations

from cupykern import reference
from cupykern.ops import norm
from cupykern.registry import OpSpec, nbytes, random_device


def _norm_inputs(rng, num_tokens, hidden_size, dtype, *, with_residual=False, with_bias=False, model=None):
    offset = model.norm_weight_offset if model is not None else 0.0
    inputs = {
        "x": random_device(rng, (num_tokens, hidden_size), dtype),
        "weight": random_device(rng, (hidden_size,), dtype, scale=0.1, loc=1.0 - offset),
        "eps": model.rms_norm_eps if model is not None else 1e-6,
    }
    if offset:
        inputs["weight_offset"] = offset
    if with_residual:
        inputs["residual"] = random_device(rng, (num_tokens, hidden_size), dtype)
    if with_bias:
        inputs["bias"] = random_device(rng, (hidden_size,), dtype, scale=0.1)
        inputs["eps"] = 1e-5
    return inputs


RMS_NORM = OpSpec(
    name="rms_norm", family="norm", size_name="hidden_size",
    make_inputs=lambda rng, n, h, dtype, model=None: {**_norm_inputs(rng, n, h, dtype, model=model), "out": None},
    run=lambda i: (norm.rms_norm(i["x"], i["weight"], i["eps"], weight_offset=i.get("weight_offset", 0.0),
                                 out=i.get("out")),),
    reference=lambda i: (reference.rms_norm(i["x"], i["weight"], i["eps"],
                                            weight_offset=i.get("weight_offset", 0.0)),),
    min_bytes=lambda i: 2 * nbytes(i["x"]) + nbytes(i["weight"]),
    output_dtypes=lambda i: (i["x"].dtype,),
    model_aware=True,
)

FUSED_ADD_RMS_NORM = OpSpec(
    name="fused_add_rms_norm", family="norm", size_name="hidden_size",
    make_inputs=lambda rng, n, h, dtype, model=None: _norm_inputs(rng, n, h, dtype, with_residual=True, model=model),
    run=lambda i: norm.fused_add_rms_norm(i["x"], i["residual"], i["weight"], i["eps"],
                                          weight_offset=i.get("weight_offset", 0.0)),
    reference=lambda i: reference.fused_add_rms_norm(i["x"], i["residual"], i["weight"], i["eps"],
                                                     weight_offset=i.get("weight_offset", 0.0)),
    min_bytes=lambda i: 4 * nbytes(i["x"]) + nbytes(i["weight"]),
    output_dtypes=lambda i: (i["x"].dtype, i["x"].dtype),
    model_aware=True,
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
