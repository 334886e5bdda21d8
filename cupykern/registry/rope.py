"""Op specs of the rope family (apply_rope, qk_rms_norm_rope).

Without a model: Llama-3 8B's heads and rope_theta with plain (unscaled) RoPE. With a
model preset: its query and key/value head counts, rope_theta, rope_scaling, partial
rotary dims, max_position_embeddings (cache rows, capped at MAX_POSITION) and
rms_norm_eps (the QK-norm eps). A preset with M-RoPE (qwen2.5-vl-7b) gives apply_rope
three independent position rows per token, stored ``(num_tokens, 3)`` (token-indexed,
so validation can sample tokens) and passed transposed, ``(3, num_tokens)`` with row
stride 1, with the preset's ``mrope_section``; ``cupykern check`` validates it too
(``check_models``).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from cupykern import reference, rope_scaling
from cupykern.ops import rope
from cupykern.registry import OpSpec, nbytes, random_device

#: Llama-3 8B attention: 32 query heads, 8 key/value heads, rope_theta 500000.
NUM_Q_HEADS, NUM_KV_HEADS, BASE = 32, 8, 500000.0
#: Cache rows; positions are drawn uniformly below it.
MAX_POSITION = 131072


@lru_cache(maxsize=4)
def _host_cache(rotary_dim: int, max_position: int = MAX_POSITION, base: float = BASE,
                scaling_items: tuple = ()) -> np.ndarray:
    """The float32 cos/sin table, ``(max_position, rotary_dim)`` (built once per shape: 64 MiB
    at 131072 x 128)."""
    return rope_scaling.cos_sin_table(max_position, rotary_dim, base, dict(scaling_items) or None, dtype=np.float32)


def _rope_inputs(rng, num_tokens, head_dim, dtype, *, with_weights=False, model=None):
    import cupy

    if model is None:
        q_heads, kv_heads, rotary_dim, rows, base, scaling, eps = (NUM_Q_HEADS, NUM_KV_HEADS, head_dim, MAX_POSITION,
                                                                   BASE, (), 1e-6)
    else:
        q_heads, kv_heads, rotary_dim = model.num_attention_heads, model.num_key_value_heads, model.rotary_dim_for(head_dim)
        rows, base, scaling = min(model.max_position_embeddings, MAX_POSITION), model.rope_theta, model.rope_scaling_items
        eps = model.rms_norm_eps
    inputs = {
        "q": random_device(rng, (num_tokens, q_heads, head_dim), dtype),
        "k": random_device(rng, (num_tokens, kv_heads, head_dim), dtype),
        "positions": cupy.asarray(rng.integers(0, rows, num_tokens, dtype=np.int64)),
        "cos_sin_cache": cupy.asarray(_host_cache(rotary_dim, rows, base, scaling)),
    }
    if model is not None and model.mrope_section is not None and not with_weights:
        inputs["positions"] = cupy.asarray(rng.integers(0, rows, (num_tokens, 3), dtype=np.int64))
        inputs["mrope_section"] = model.mrope_section
        inputs["mrope_interleaved"] = model.mrope_interleaved
    if with_weights:
        inputs["q_weight"] = random_device(rng, (head_dim,), dtype, scale=0.1, loc=1.0)
        inputs["k_weight"] = random_device(rng, (head_dim,), dtype, scale=0.1, loc=1.0)
        inputs["eps"] = eps
    return inputs


def _min_bytes(i) -> int:
    """q and k read and written once, rotary_dim cache values and the positions (one, or
    three with M-RoPE) per token."""
    cache = i["cos_sin_cache"]
    num_tokens = i["q"].shape[0]
    return 2 * nbytes(i["q"], i["k"]) + num_tokens * cache.shape[1] * cache.itemsize + nbytes(i["positions"])


def _mrope(i) -> dict:
    """apply_rope's M-RoPE arguments of the inputs: positions (3, num_tokens), the section (none without)."""
    if "mrope_section" not in i:
        return {"positions": i["positions"]}
    return {"positions": i["positions"].T, "mrope_section": i["mrope_section"],
            "mrope_interleaved": i["mrope_interleaved"]}


APPLY_ROPE = OpSpec(
    name="apply_rope", family="rope", size_name="head_dim",
    make_inputs=lambda rng, n, h, dtype, model=None: _rope_inputs(rng, n, h, dtype, model=model),
    run=lambda i: rope.apply_rope(i["q"], i["k"], cos_sin_cache=i["cos_sin_cache"], check_positions=False, **_mrope(i)),
    reference=lambda i: reference.apply_rope(i["q"], i["k"], cos_sin_cache=i["cos_sin_cache"], **_mrope(i)),
    min_bytes=_min_bytes,
    output_dtypes=lambda i: (i["q"].dtype, i["k"].dtype),
    check_sizes=(128,),
    model_aware=True, min_size=2, size_multiple=2,
    check_models=("qwen2.5-vl-7b",),  # M-RoPE
)

QK_RMS_NORM_ROPE = OpSpec(
    name="qk_rms_norm_rope", family="rope", size_name="head_dim",
    make_inputs=lambda rng, n, h, dtype, model=None: _rope_inputs(rng, n, h, dtype, with_weights=True, model=model),
    run=lambda i: rope.qk_rms_norm_rope(i["q"], i["k"], i["q_weight"], i["k_weight"], i["positions"],
                                        i["cos_sin_cache"], i["eps"], check_positions=False),
    reference=lambda i: reference.qk_rms_norm_rope(i["q"], i["k"], i["q_weight"], i["k_weight"], i["positions"],
                                                   i["cos_sin_cache"], i["eps"]),
    min_bytes=lambda i: _min_bytes(i) + nbytes(i["q_weight"], i["k_weight"]),
    output_dtypes=lambda i: (i["q"].dtype, i["k"].dtype),
    check_sizes=(128,),
    model_aware=True, min_size=2, size_multiple=2,
)

SPECS = (APPLY_ROPE, QK_RMS_NORM_ROPE)
