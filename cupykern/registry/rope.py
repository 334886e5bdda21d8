"""Op specs of the rope family (apply_rope, qk_rms_norm_rope)."""

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
def _host_cache(head_dim: int) -> np.ndarray:
    """The float32 cos/sin table (built once per head_dim: 64 MiB at head_dim 128)."""
    return rope_scaling.cos_sin_table(MAX_POSITION, head_dim, BASE, dtype=np.float32)


def _rope_inputs(rng, num_tokens, head_dim, dtype, *, with_weights=False):
    import cupy

    inputs = {
        "q": random_device(rng, (num_tokens, NUM_Q_HEADS, head_dim), dtype),
        "k": random_device(rng, (num_tokens, NUM_KV_HEADS, head_dim), dtype),
        "positions": cupy.asarray(rng.integers(0, MAX_POSITION, num_tokens, dtype=np.int64)),
        "cos_sin_cache": cupy.asarray(_host_cache(head_dim)),
    }
    if with_weights:
        inputs["q_weight"] = random_device(rng, (head_dim,), dtype, scale=0.1, loc=1.0)
        inputs["k_weight"] = random_device(rng, (head_dim,), dtype, scale=0.1, loc=1.0)
        inputs["eps"] = 1e-6
    return inputs


def _min_bytes(i) -> int:
    """q and k read and written once, one cache row and one position per token."""
    cache = i["cos_sin_cache"]
    num_tokens = i["positions"].size
    return 2 * nbytes(i["q"], i["k"]) + num_tokens * (cache.shape[1] * cache.itemsize + i["positions"].itemsize)


APPLY_ROPE = OpSpec(
    name="apply_rope", family="rope", size_name="head_dim",
    make_inputs=lambda rng, n, h, dtype: _rope_inputs(rng, n, h, dtype),
    run=lambda i: rope.apply_rope(i["q"], i["k"], i["positions"], i["cos_sin_cache"], check_positions=False),
    reference=lambda i: reference.apply_rope(i["q"], i["k"], i["positions"], i["cos_sin_cache"]),
    min_bytes=_min_bytes,
    output_dtypes=lambda i: (i["q"].dtype, i["k"].dtype),
    check_sizes=(128,),
)

QK_RMS_NORM_ROPE = OpSpec(
    name="qk_rms_norm_rope", family="rope", size_name="head_dim",
    make_inputs=lambda rng, n, h, dtype: _rope_inputs(rng, n, h, dtype, with_weights=True),
    run=lambda i: rope.qk_rms_norm_rope(i["q"], i["k"], i["q_weight"], i["k_weight"], i["positions"],
                                        i["cos_sin_cache"], i["eps"], check_positions=False),
    reference=lambda i: reference.qk_rms_norm_rope(i["q"], i["k"], i["q_weight"], i["k_weight"], i["positions"],
                                                   i["cos_sin_cache"], i["eps"]),
    min_bytes=lambda i: _min_bytes(i) + nbytes(i["q_weight"], i["k_weight"]),
    output_dtypes=lambda i: (i["q"].dtype, i["k"].dtype),
    check_sizes=(128,),
)

SPECS = (APPLY_ROPE, QK_RMS_NORM_ROPE)
