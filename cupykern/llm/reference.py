"""The Llama forward in float64 NumPy on the CPU, from ``cupykern.reference``.

The same computation as :mod:`cupykern.llm.model` (pre-norm decoder, grouped-query
attention, SwiGLU MLP, tied LM head), on the dequantised GGUF weights in float64
with no rounding anywhere: the ground truth the GPU forward is compared with, and a
way to run the model without a GPU (``cupykern generate --reference``). Built from
the float64 twins of the kernels (``reference.rms_norm``, ``fused_add_rms_norm``,
``apply_rope`` with ``is_neox=False``, ``silu_and_mul``, ``softmax``), so a
mismatch with the GPU forward points at a kernel or at the GPU glue, not at this.

Per token t at position p, layer by layer (Touvron et al. 2023, arXiv:2302.13971;
Hugging Face ``LlamaDecoderLayer``):
``x = rms_norm(h); q, k, v = x Wq^T, x Wk^T, x Wv^T; q, k = rope(q, k, p);``
``a = softmax(q k^T / sqrt(head_dim) + causal mask) v`` (kv head ``j // group`` for
query head j; GQA, Ainslie et al. 2023, arXiv:2305.13245);
``h = h + a Wo^T; h = h + down(silu(x2 Wg^T) * (x2 Wu^T))`` with ``x2 = rms_norm(h)``;
logits ``= rms_norm(h) E^T``.

Memory: about 1.1 GB of float64 weights for SmolLM2-135M (0.23 GB of it the embedding).
"""

from __future__ import annotations

import numpy as np

from cupykern import reference as ref
from cupykern.llm.gguf_weights import LlamaConfig, LlamaWeights, load_weights
from cupykern.llm.kv_cache import KVCache
from cupykern.llm.stage_timer import no_timer


class ReferenceLlama:
    """float64 CPU forward of a llama model with a KV cache.

    Parameters:
        weights: :class:`LlamaWeights` of float64 NumPy arrays (``load_weights(path, np.float64)``).
    """

    def __init__(self, weights: LlamaWeights):
        self.weights = weights
        self.config: LlamaConfig = weights.config
        cfg = self.config
        # Unrounded float64 cos/sin (the kernels get this table rounded to float32).
        self.cos_sin_cache = ref.rope_cos_sin_cache(cfg.context_length, cfg.rotary_dim, cfg.rope_base)

    @classmethod
    def from_gguf(cls, path) -> ReferenceLlama:
        """Loads and dequantises ``path`` in float64 (see :func:`load_weights` for errors)."""
        return cls(load_weights(path, np.float64))

    def new_cache(self, max_tokens: int) -> KVCache:
        """An empty cache for up to ``max_tokens`` positions (at most ``context_length``).

        Raises:
            ValueError: ``max_tokens`` < 1 or beyond the model's context length (as the
                GPU model's :meth:`~cupykern.llm.model.LlamaModel.new_cache`).
        """
        cfg = self.config
        if not 1 <= max_tokens <= cfg.context_length:
            raise ValueError(f"max_tokens: expected 1 .. {cfg.context_length} (context length), got {max_tokens}")
        shape = (max_tokens, cfg.num_kv_heads, cfg.head_dim)
        return KVCache([np.zeros(shape) for _ in range(cfg.num_layers)],
                       [np.zeros(shape) for _ in range(cfg.num_layers)])

    def _attention(self, q, k, v, cache: KVCache, layer: int, start: int) -> np.ndarray:
        """Causal GQA over the cache: q ``(T, H, D)``, k/v ``(T, KV, D)`` -> ``(T, H * D)``."""
        cfg = self.config
        num_tokens = q.shape[0]
        stop = start + num_tokens
        cache.k[layer][start:stop], cache.v[layer][start:stop] = k, v
        group = cfg.num_heads // cfg.num_kv_heads
        keys = cache.k[layer][:stop].transpose(1, 2, 0)  # (KV, D, S)
        values = cache.v[layer][:stop].transpose(1, 0, 2)  # (KV, S, D)
        qg = q.reshape(num_tokens, cfg.num_kv_heads, group, cfg.head_dim).transpose(1, 2, 0, 3)  # (KV, G, T, D)
        scores = (qg @ keys[:, None]) / np.sqrt(cfg.head_dim)  # (KV, G, T, S)
        causal = np.arange(stop)[None, :] <= (start + np.arange(num_tokens))[:, None]
        probs = ref.softmax(np.where(causal, scores, -np.inf))
        out = probs @ values[:, None]  # (KV, G, T, D)
        return out.transpose(2, 0, 1, 3).reshape(num_tokens, cfg.num_heads * cfg.head_dim)

    def forward(self, token_ids, cache: KVCache, *, all_logits: bool = False, timer=no_timer) -> np.ndarray:
        """Runs ``token_ids`` (positions ``cache.length ...``) through the model.

        Parameters:
            token_ids: ``(num_tokens,)`` ints.
            cache: from :meth:`new_cache`; its rows ``[length, length + num_tokens)``
                are written and ``length`` advanced.
            all_logits: return logits of every token (teacher forcing), else of the last.
            timer: a :mod:`~cupykern.llm.stage_timer` timer.

        Returns:
            float64 logits ``(num_tokens or 1, vocab_size)``.

        Raises:
            TypeError: ids that are not integers (a float, bool or string array).
            ValueError: empty ``token_ids``, an id outside the vocabulary, or more
                tokens than the cache holds.
        """
        cfg, w = self.config, self.weights
        ids = host_token_ids(token_ids)
        start = cache.length
        check_tokens(ids, start, cache.max_tokens, cfg.vocab_size)
        num_tokens = ids.shape[0]
        positions = np.arange(start, start + num_tokens)
        hq, hk = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        with timer("other"):
            residual = w.embed[ids]
        mlp_out = None
        for n, layer in enumerate(w.layers):
            with timer("norm"):
                if n == 0:
                    x = ref.rms_norm(residual, layer.attn_norm, cfg.rms_norm_eps)
                else:
                    x, residual = ref.fused_add_rms_norm(mlp_out, residual, layer.attn_norm, cfg.rms_norm_eps)
            with timer("matmul"):
                qkv = x @ layer.qkv.T
            q = qkv[:, :hq].reshape(num_tokens, cfg.num_heads, cfg.head_dim)
            k = qkv[:, hq:hq + hk].reshape(num_tokens, cfg.num_kv_heads, cfg.head_dim)
            v = qkv[:, hq + hk:].reshape(num_tokens, cfg.num_kv_heads, cfg.head_dim)
            with timer("rope"):
                q, k = ref.apply_rope(q, k, positions, self.cos_sin_cache, is_neox=False)
            with timer("attention"):
                attn = self._attention(q, k, v, cache, n, start)
            with timer("matmul"):
                attn_out = attn @ layer.o.T
            with timer("norm"):
                x, residual = ref.fused_add_rms_norm(attn_out, residual, layer.ffn_norm, cfg.rms_norm_eps)
            with timer("matmul"):
                gate_up = x @ layer.gate_up.T
            with timer("activation"):
                act = ref.silu_and_mul(gate_up)
            with timer("matmul"):
                mlp_out = act @ layer.down.T
        with timer("norm"):
            x, _ = ref.fused_add_rms_norm(mlp_out, residual, w.final_norm, cfg.rms_norm_eps)
        with timer("matmul"):
            logits = (x if all_logits else x[-1:]) @ w.lm_head.T
        cache.length = start + num_tokens
        return logits


def host_token_ids(token_ids, name: str = "token_ids") -> np.ndarray:
    """``token_ids`` (host or device, any shape) as a flat int64 NumPy array; errors name
    the argument ``name``.

    Raises:
        TypeError: ids that are not integers (floats were truncated, bools taken as 0
            and 1, digit strings parsed).
    """
    try:
        ids = np.asarray(token_ids.get() if hasattr(token_ids, "get") else token_ids)
    except ValueError as exc:  # a ragged nested list
        raise ValueError(f"{name}: expected an array of integer ids, got {type(token_ids).__name__} "
                         f"({exc})") from None
    if ids.size and ids.dtype.kind not in "iu":
        raise TypeError(f"{name}: expected integer ids, got dtype {ids.dtype}")
    if ids.size and ids.dtype.kind == "u" and ids.max() > np.iinfo(np.int64).max:
        # int64 would wrap 2**64 - 1 to -1 and the range check report ids never given
        raise ValueError(f"{name}: expected ids below 2**63, got max {ids.max()}")
    return ids.astype(np.int64).reshape(-1)


def check_tokens(ids, start: int, max_tokens: int, vocab_size: int) -> None:
    """ValueError for an empty batch, ids outside ``[0, vocab_size)`` or a cache overflow."""
    if ids.size == 0:
        raise ValueError("token_ids: expected at least one token, got none")
    if ids.min() < 0 or ids.max() >= vocab_size:
        raise ValueError(f"token_ids: expected ids in [0, {vocab_size}), got min {ids.min()} max {ids.max()}")
    if start + ids.size > max_tokens:
        raise ValueError(f"token_ids: {ids.size} tokens at position {start} overflow the KV cache of "
                         f"{max_tokens} positions")
