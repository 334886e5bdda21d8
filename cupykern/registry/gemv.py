"""Op specs of the gemv family (gemv, gemv_add_residual, rms_norm_gemv, rms_norm_gemv_silu_and_mul).

The size is k, the length of x's rows (hidden_size with a model preset). Weights are
drawn with standard deviation 1 / sqrt(k), so products are O(1) like x. Without a
model, gemv, gemv_add_residual and rms_norm_gemv are square (n = k) and the gated
variant has d = k; with a preset, rms_norm_gemv is the QKV projection ((num_heads + 2 *
num_kv_heads) * head_dim rows), the gated one the MLP's gate/up (d = intermediate_size).
At most 16 tokens (decode sizes). rms_norm_gemv_rope_kv_append takes Llama-3 8B's heads
(32 + 8 + 8 of 128) without a model, the preset's with one.
"""

from __future__ import annotations

import math

import numpy as np

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

def _qkv_rope_inputs(rng, num_tokens, k, dtype, model=None):
    import cupy

    from cupykern.registry.rope import BASE, NUM_KV_HEADS, NUM_Q_HEADS, _host_cache

    if model is None:
        heads, kv_heads, head_dim, base, scaling, eps = NUM_Q_HEADS, NUM_KV_HEADS, 128, BASE, (), 1e-6
    else:
        heads, kv_heads, head_dim = model.num_attention_heads, model.num_key_value_heads, model.head_dim
        base, scaling, eps = model.rope_theta, model.rope_scaling_items, model.rms_norm_eps
    rows = CACHE_ROWS
    return {"x": random_device(rng, (num_tokens, k), dtype), "norm_weight": _norm_weight(rng, k, dtype),
            "qkv_weight": _weight(rng, (heads + 2 * kv_heads) * head_dim, k, dtype),
            "positions": cupy.asarray(rng.choice(rows, num_tokens, replace=False).astype(np.int32)),
            "cos_sin_cache": cupy.asarray(_host_cache(head_dim if model is None else model.rotary_dim_for(head_dim),
                                                      rows, base, scaling)),
            "k_cache": random_device(rng, (rows, kv_heads, head_dim), dtype),
            "v_cache": random_device(rng, (rows, kv_heads, head_dim), dtype), "eps": eps}


def _qkv_rope_run(i):
    q, k_cache, v_cache = gemv.rms_norm_gemv_rope_kv_append(i["x"], i["norm_weight"], i["qkv_weight"], i["positions"],
                                                            i["cos_sin_cache"], i["k_cache"], i["v_cache"], i["eps"])
    return q, k_cache[i["positions"]], v_cache[i["positions"]]  # the rows written, in token order


def _qkv_rope_reference(i):
    q, k_after, v_after = reference.rms_norm_gemv_rope_kv_append(
        i["x"], i["norm_weight"], i["qkv_weight"], i["positions"], i["cos_sin_cache"], i["k_cache"], i["v_cache"],
        i["eps"])
    rows = np.asarray(i["positions"], dtype=np.int64)
    return q, k_after[rows], v_after[rows]


def _qkv_rope_bytes(i) -> int:
    """Weights and x read, q written, k and v written to the cache, a table row per token."""
    x, w = i["x"], i["qkv_weight"]
    t = x.shape[0]
    return nbytes(x, w, i["norm_weight"]) + t * w.shape[0] * x.itemsize + t * i["cos_sin_cache"].shape[1] * 4


#: Cache rows of rms_norm_gemv_rope_kv_append's inputs (positions are drawn below it).
CACHE_ROWS = 4096

RMS_NORM_GEMV_ROPE_KV_APPEND = OpSpec(
    name="rms_norm_gemv_rope_kv_append", family="gemv", size_name="hidden_size", make_inputs=_qkv_rope_inputs,
    run=_qkv_rope_run, reference=_qkv_rope_reference, min_bytes=_qkv_rope_bytes,
    output_dtypes=lambda i: (i["x"].dtype,) * 3, model_aware=True, max_tokens=MAX_TOKENS,
    token_inputs=("x", "positions"),
)

SPECS = (GEMV, GEMV_ADD_RESIDUAL, RMS_NORM_GEMV, RMS_NORM_GEMV_SILU_AND_MUL, RMS_NORM_GEMV_ROPE_KV_APPEND)
