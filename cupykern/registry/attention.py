"""Op specs of the attention family (rope_kv_append, decode_attention, prefill_attention).

The size is head_dim (64 or 128). Without a model: Llama-3 8B's 32 query and 8
key/value heads, rope_theta 500000; with a preset, its heads and rope constants. The
cache holds CACHE_ROWS positions (more than decode_attention's one-split limit, so the
split path and its combine run); positions are distinct (two tokens writing one cache
row would race) and drawn below it. prefill_attention's tokens are a prompt's: the
consecutive positions 0 .. num_tokens - 1 of a cache of at least PREFILL_CACHE_ROWS rows.
"""

from __future__ import annotations

import numpy as np

from cupykern import reference
from cupykern.ops import attention
from cupykern.registry import OpSpec, nbytes, random_device
from cupykern.registry.rope import BASE, NUM_KV_HEADS, NUM_Q_HEADS, _host_cache

CACHE_ROWS = 2048
PREFILL_CACHE_ROWS = 512


def _heads(model, head_dim):
    if model is None:
        return NUM_Q_HEADS, NUM_KV_HEADS, head_dim, BASE, ()
    return (model.num_attention_heads, model.num_key_value_heads, model.rotary_dim_for(head_dim), model.rope_theta,
            model.rope_scaling_items)


def _positions(rng, num_tokens):
    import cupy

    rows = max(CACHE_ROWS, num_tokens)
    return cupy.asarray(rng.choice(rows, size=num_tokens, replace=False).astype(np.int32)), rows


def _attention_inputs(rng, num_tokens, head_dim, dtype, model=None):
    q_heads, kv_heads, _, _, _ = _heads(model, head_dim)
    positions, rows = _positions(rng, num_tokens)
    return {
        "q": random_device(rng, (num_tokens, q_heads, head_dim), dtype),
        "k_cache": random_device(rng, (rows, kv_heads, head_dim), dtype),
        "v_cache": random_device(rng, (rows, kv_heads, head_dim), dtype),
        "positions": positions, "out": None,
    }


def _append_inputs(rng, num_tokens, head_dim, dtype, model=None):
    """decode_attention's inputs (no out) plus the new tokens' k and v and the cos/sin table."""
    import cupy

    inputs = _attention_inputs(rng, num_tokens, head_dim, dtype, model)
    del inputs["out"]
    _, kv_heads, rotary_dim, base, scaling = _heads(model, head_dim)
    rows = inputs["k_cache"].shape[0]
    inputs.update(k=random_device(rng, (num_tokens, kv_heads, head_dim), dtype),
                  v=random_device(rng, (num_tokens, kv_heads, head_dim), dtype),
                  cos_sin_cache=cupy.asarray(_host_cache(rotary_dim, rows, base, scaling)))
    return inputs


def _append_run(i):
    q, k_cache, v_cache = attention.rope_kv_append(i["q"], i["k"], i["v"], i["positions"], i["cos_sin_cache"],
                                                   i["k_cache"], i["v_cache"], is_neox=True)
    rows = i["positions"]
    return q, k_cache[rows], v_cache[rows]  # the rows written, in token order


def _append_reference(i):
    q, k_after, v_after = reference.rope_kv_append(i["q"], i["k"], i["v"], i["positions"], i["cos_sin_cache"],
                                                   i["k_cache"], i["v_cache"], is_neox=True)
    rows = np.asarray(i["positions"], dtype=np.int64)
    return q, k_after[rows], v_after[rows]


def _append_bytes(i) -> int:
    """q read and written; k, v read and written to the cache; a table row and a position per token."""
    cache = i["cos_sin_cache"]
    num_tokens = i["positions"].size
    return 2 * nbytes(i["q"], i["k"], i["v"]) + num_tokens * (cache.shape[1] * cache.itemsize + 4)


def _attention_bytes(i) -> int:
    """q read, out written, and each token's cache rows read once (tokens sharing rows
    count them again: an upper bound on what a kernel needs)."""
    import cupy

    lengths = cupy.minimum(i["positions"].astype(cupy.int64) + 1, i["k_cache"].shape[0])
    row_bytes = 2 * i["k_cache"].shape[1] * i["k_cache"].shape[2] * i["k_cache"].itemsize
    return 2 * nbytes(i["q"]) + int(lengths.sum()) * row_bytes


ROPE_KV_APPEND = OpSpec(
    name="rope_kv_append", family="attention", size_name="head_dim", make_inputs=_append_inputs,
    run=_append_run, reference=_append_reference, min_bytes=_append_bytes,
    output_dtypes=lambda i: (i["q"].dtype,) * 3, check_sizes=(128,), model_aware=True,
    token_inputs=("q", "k", "v", "positions"), min_size=64, size_multiple=64,
)

DECODE_ATTENTION = OpSpec(
    name="decode_attention", family="attention", size_name="head_dim", make_inputs=_attention_inputs,
    run=lambda i: (attention.decode_attention(i["q"], i["k_cache"], i["v_cache"], i["positions"], out=i.get("out")),),
    reference=lambda i: (reference.decode_attention(i["q"], i["k_cache"], i["v_cache"], i["positions"]),),
    min_bytes=_attention_bytes, output_dtypes=lambda i: (i["q"].dtype,), check_sizes=(128,), model_aware=True,
    token_inputs=("q", "positions"), min_size=64, size_multiple=64, sizes=attention.HEAD_DIMS,
)

def _prefill_inputs(rng, num_tokens, head_dim, dtype, model=None):
    import cupy

    q_heads, kv_heads, _, _, _ = _heads(model, head_dim)
    rows = max(PREFILL_CACHE_ROWS, num_tokens)
    return {
        "q": random_device(rng, (num_tokens, q_heads, head_dim), dtype),
        "k_cache": random_device(rng, (rows, kv_heads, head_dim), dtype),
        "v_cache": random_device(rng, (rows, kv_heads, head_dim), dtype),
        "positions": cupy.arange(num_tokens, dtype=np.int32), "out": None,
    }


def _prefill_bytes(i) -> int:
    """q read, out written, and the cache rows up to the largest position read once."""
    import cupy

    if i["positions"].size == 0:
        return 2 * nbytes(i["q"])
    length = min(int(cupy.max(i["positions"]).get()) + 1, i["k_cache"].shape[0])
    row_bytes = 2 * i["k_cache"].shape[1] * i["k_cache"].shape[2] * i["k_cache"].itemsize
    return 2 * nbytes(i["q"]) + max(0, length) * row_bytes


PREFILL_ATTENTION = OpSpec(
    name="prefill_attention", family="attention", size_name="head_dim", make_inputs=_prefill_inputs,
    run=lambda i: (attention.prefill_attention(i["q"], i["k_cache"], i["v_cache"], i["positions"],
                                               out=i.get("out")),),
    reference=lambda i: (reference.prefill_attention(i["q"], i["k_cache"], i["v_cache"], i["positions"]),),
    min_bytes=_prefill_bytes, output_dtypes=lambda i: (i["q"].dtype,), check_sizes=(128,), model_aware=True,
    token_inputs=("q", "positions"), min_size=64, size_multiple=64, sizes=attention.HEAD_DIMS,
)

SPECS = (ROPE_KV_APPEND, DECODE_ATTENTION, PREFILL_ATTENTION)
