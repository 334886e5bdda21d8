"""Op specs of the activation family (silu_and_mul, gelu_and_mul, swiglu).

Inputs are the fused gate_up layout: x of shape (num_tokens, 2 * d), or separate gate
and up of shape (num_tokens, d) for swiglu; the size is d.
With a model preset, gelu_and_mul uses the tanh approximation for GeGLU models (Gemma).
"""

from __future__ import annotations

from cupykern import reference
from cupykern.ops import activation
from cupykern.registry import OpSpec, nbytes, random_device


def _gate_up_inputs(rng, num_tokens, d, dtype):
    return {"x": random_device(rng, (num_tokens, 2 * d), dtype), "out": None}


def _gelu_inputs(rng, num_tokens, d, dtype, model=None):
    inputs = _gate_up_inputs(rng, num_tokens, d, dtype)
    if model is not None:
        inputs["approximate"] = model.gelu_approximate
    return inputs


def _gate_up_bytes(inputs) -> int:
    """x read once, out (half of x's width) written once."""
    x = inputs["x"]
    return nbytes(x) + nbytes(x) // 2


SILU_AND_MUL = OpSpec(
    name="silu_and_mul", family="activation", size_name="d",
    make_inputs=_gate_up_inputs,
    run=lambda i: (activation.silu_and_mul(i["x"], out=i.get("out")),),
    reference=lambda i: (reference.silu_and_mul(i["x"]),),
    min_bytes=_gate_up_bytes,
    output_dtypes=lambda i: (i["x"].dtype,),
    check_sizes=(11008,),
)

GELU_AND_MUL = OpSpec(
    name="gelu_and_mul", family="activation", size_name="d",
    make_inputs=_gelu_inputs,
    run=lambda i: (activation.gelu_and_mul(i["x"], approximate=i.get("approximate", "none"), out=i.get("out")),),
    reference=lambda i: (reference.gelu_and_mul(i["x"], approximate=i.get("approximate", "none")),),
    min_bytes=_gate_up_bytes,
    output_dtypes=lambda i: (i["x"].dtype,),
    check_sizes=(11008,),
    model_aware=True,
)

SWIGLU = OpSpec(
    name="swiglu", family="activation", size_name="d",
    make_inputs=lambda rng, n, d, dtype: {"gate": random_device(rng, (n, d), dtype),
                                          "up": random_device(rng, (n, d), dtype), "out": None},
    run=lambda i: (activation.swiglu(i["gate"], i["up"], out=i.get("out")),),
    reference=lambda i: (reference.swiglu(i["gate"], i["up"]),),
    min_bytes=lambda i: 3 * nbytes(i["gate"]),
    output_dtypes=lambda i: (i["gate"].dtype,),
    check_sizes=(11008,),
)

SPECS = (SILU_AND_MUL, GELU_AND_MUL, SWIGLU)
