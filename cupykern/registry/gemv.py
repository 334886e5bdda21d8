"""Op specs of the gemv family (gemv, gemv_add_residual, rms_norm_gemv, rms_norm_gemv_silu_and_mul).

The size is k, the length of x's rows (hidden_size with a model preset). Weights are
drawn with standard deviation 1 / sqrt(k), so products are O(1) like x. Without a
model, gemv, gemv_add_residual and rms_norm_gemv are square (n = k) and the gated
variant has d = k; with a preset, rms_norm_gemv is the QKV projection ((num_heads + 2 *
num_kv_heads) * head_dim rows), the gated one the MLP's gate/up (d = intermediate_size).
At most 16 tokens (decode sizes).
"""

from __future__ import annotations

import math

from cupykern import reference
from cupykern.ops import gemv
from cupykern.registry import OpSpec, nbytes, random_device

MAX_TOKENS = 16


def _weight(rng, rows: int, k: int, dtype):
    return random_device(rng, (rows, k), dtype, scale=1.0 / math.sqrt(k))


def _norm_weight(rng, k: int, dtype):
    return random_device(rng, (k,), dtype, scale=0.1, loc=1.0)


def _gemv_inputs(rng, num_tokens, k, dtype):
    return {"x": random_device(rng, (num_tokens, k), dtype), "weight": _weight(rng, k, k, dtype), "out": None}


def _residual_inputs(rng, num_tokens, k, dtype):
    return {"x": random_device(rng, (num_tokens, k), dtype), "weight": _weight(rng, k, k, dtype),
            "residual": random_device(rng, (num_tokens, k), dtype)}


def _norm_inputs(rng, num_tokens, k, dtype, model=None):
    n = k if model is None else (model.num_attention_heads + 2 * model.num_key_value_heads) * model.head_dim
    eps = 1e-6 if model is None else model.rms_norm_eps
    return {"x": random_device(rng, (num_tokens, k), dtype), "norm_weight": _norm_weight(rng, k, dtype),
            "weight": _weight(rng, n, k, dtype), "eps": eps, "out": None}


def _gated_inputs(rng, num_tokens, k, dtype, model=None):
    d = k if model is None else model.intermediate_size
    eps = 1e-6 if model is None else model.rms_norm_eps
    return {"x": random_device(rng, (num_tokens, k), dtype), "norm_weight": _norm_weight(rng, k, dtype),
            "gate_up_weight": _weight(rng, 2 * d, k, dtype), "eps": eps, "out": None}


def _bytes(weight_key: str, out_rows_of: str | None = None, read_out: bool = False):
    """Weight, x and norm weight read once; the output written once (read too when it is
    the residual)."""
    def count(i) -> int:
        x, w = i["x"], i[weight_key]
        out_cols = w.shape[0] // 2 if weight_key == "gate_up_weight" else w.shape[0]
        out = x.shape[0] * out_cols * x.itemsize
        return nbytes(x, w, i.get("norm_weight")) + out * (2 if read_out else 1)
    return count


GEMV = OpSpec(
    name="gemv", family="gemv", size_name="hidden_size", make_inputs=_gemv_inputs,
    run=lambda i: (gemv.gemv(i["x"], i["weight"], out=i.get("out")),),
    reference=lambda i: (reference.gemv(i["x"], i["weight"]),),
    min_bytes=_bytes("weight"), output_dtypes=lambda i: (i["x"].dtype,), max_tokens=MAX_TOKENS,
)

GEMV_ADD_RESIDUAL = OpSpec(
    name="gemv_add_residual", family="gemv", size_name="hidden_size", make_inputs=_residual_inputs,
    run=lambda i: (gemv.gemv_add_residual(i["x"], i["weight"], i["residual"]),),
    reference=lambda i: (reference.gemv_add_residual(i["x"], i["weight"], i["residual"]),),
    min_bytes=_bytes("weight", read_out=True), output_dtypes=lambda i: (i["x"].dtype,), max_tokens=MAX_TOKENS,
)

RMS_NORM_GEMV = OpSpec(
    name="rms_norm_gemv", family="gemv", size_name="hidden_size", make_inputs=_norm_inputs,
    run=lambda i: (gemv.rms_norm_gemv(i["x"], i["norm_weight"], i["weight"], i["eps"], out=i.get("out")),),
    reference=lambda i: (reference.rms_norm_gemv(i["x"], i["norm_weight"], i["weight"], i["eps"]),),
    min_bytes=_bytes("weight"), output_dtypes=lambda i: (i["x"].dtype,), model_aware=True, max_tokens=MAX_TOKENS,
)

RMS_NORM_GEMV_SILU_AND_MUL = OpSpec(
    name="rms_norm_gemv_silu_and_mul", family="gemv", size_name="hidden_size", make_inputs=_gated_inputs,
    run=lambda i: (gemv.rms_norm_gemv_silu_and_mul(i["x"], i["norm_weight"], i["gate_up_weight"], i["eps"],
                                                   out=i.get("out")),),
    reference=lambda i: (reference.rms_norm_gemv_silu_and_mul(i["x"], i["norm_weight"], i["gate_up_weight"],
                                                              i["eps"]),),
    min_bytes=_bytes("gate_up_weight"), output_dtypes=lambda i: (i["x"].dtype,), model_aware=True,
    max_tokens=MAX_TOKENS,
)

SPECS = (GEMV, GEMV_ADD_RESIDUAL, RMS_NORM_GEMV, RMS_NORM_GEMV_SILU_AND_MUL)
