"""The KV cache shared by the GPU forward (model.py) and the float64 reference (reference.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class KVCache:
    """Keys (after RoPE) and values per layer, each ``(max_tokens, num_kv_heads, head_dim)``:
    CuPy arrays of the model dtype for the GPU forward, float64 NumPy arrays for the
    reference. Rows ``[0, length)`` are filled; the forward appends and advances ``length``."""

    k: list
    v: list
    length: int = 0

    @property
    def max_tokens(self) -> int:
        return self.k[0].shape[0]
