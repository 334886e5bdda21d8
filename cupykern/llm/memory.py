"""Device memory of a generation: bytes of the weights, of the KV cache, and the report line.

Sizes are ``nbytes`` sums, so the functions work the same on CuPy (device) and NumPy
(host) arrays; the CLI calls them on device arrays and reads the pool's high-water
mark itself (``cupy.get_default_memory_pool().total_bytes()``: the pool keeps every
block it ever got until ``free_all_blocks()``, so after a run it is the most the pool
held at once, not what was live at any instant).
"""

from __future__ import annotations

import dataclasses

from cupykern.llm.gguf_weights import LlamaWeights
from cupykern.llm.kv_cache import KVCache

MIB = 1 << 20


def _arrays(obj):
    """Every array-valued field of a weights dataclass, descending into lists of layers."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, list):
            for item in value:
                yield from _arrays(item)
        elif hasattr(value, "nbytes"):
            yield value


def weights_nbytes(weights: LlamaWeights) -> int:
    """Bytes of every array in ``weights`` (embedding, each layer's matrices and norms,
    final norm, LM head), each distinct array counted once: a tied ``lm_head`` (the same
    object as ``embed``) adds nothing. ``config`` and ``None`` fields count 0."""
    seen: dict[int, int] = {}
    for array in _arrays(weights):
        seen[id(array)] = int(array.nbytes)
    return sum(seen.values())


def kv_cache_nbytes(cache: KVCache) -> int:
    """Bytes of the k and v buffers of all layers of ``cache``: ``2 * layers *
    max_tokens * num_kv_heads * head_dim * itemsize`` (its capacity, not only the
    ``length`` rows filled)."""
    return sum(int(a.nbytes) for a in (*cache.k, *cache.v))


def mib(nbytes: int) -> str:
    """``nbytes`` as MiB (2**20 bytes) with one decimal: ``"1.5 MiB"``."""
    return f"{nbytes / MIB:.1f} MiB"


def report(weights: int, kv_cache: int, pool_peak: int, *, dtype_name: str, num_layers: int,
           max_tokens: int, tables: int = 0) -> str:
    """The ``generate`` memory block: a heading and one line per item (sizes in bytes).

    Parameters:
        weights: :func:`weights_nbytes` of the device weights.
        kv_cache: :func:`kv_cache_nbytes` of the generation's cache.
        pool_peak: bytes held by CuPy's default memory pool after the run (emptied
            before the weights were loaded).
        dtype_name: the weights' dtype as the user named it (``"fp16"``).
        num_layers, max_tokens: the cache's shape, for the reader.
        tables: the model's own device arrays beside the weights (the float32 copy of
            the LM head and the RoPE cos/sin table); 0 leaves that line out.

    Returns:
        Lines under 80 characters (so an 80-column terminal does not wrap them),
        joined by newlines, no trailing newline.
    """
    rows = [("weights", weights, f"{dtype_name}, tied LM head counted once")]
    if tables:
        rows.append(("f32 LM head + RoPE", tables, "the model's float32 tables"))
    rows.append(("KV cache", kv_cache, f"k and v, {num_layers} layers x {max_tokens} positions"))
    rows.append(("pool peak (held)", pool_peak, "CuPy's pool: load, warm-up, generation"))
    return "\n".join(["device memory:"] + [f"  {label:<20} {mib(n):>11}  {note}" for label, n, note in rows])
