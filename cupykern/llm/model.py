"""The Llama forward on the GPU: cuBLAS matmuls, cupykern for the rest.

Per layer, for ``T`` new tokens at positions ``start ... start + T - 1`` (Touvron et
al. 2023, arXiv:2302.13971; Hugging Face ``LlamaDecoderLayer``; vLLM's
``LlamaDecoderLayer`` for the fused residual):

1. ``x = rms_norm(h)`` (layer 0) or ``x, h = fused_add_rms_norm(mlp_out, h)`` (later
   layers: the previous MLP output is added into the residual stream ``h`` and the
   sum normalised, one launch);
2. ``qkv = x @ Wqkv^T`` (one cuBLAS GEMM on the fused ``(q | k | v)`` weight, called
   through :mod:`~cupykern.llm.blas` so that a CUDA graph can capture it); q, k and
   v are **views** of ``qkv`` (``(T, H, D)``, ``(T, KV, D)``), not copies;
3. RoPE on those views, ``is_neox=False`` (GGUF's adjacent pairs), from a float32
   ``cos_sin_cache`` of ``context_length`` rows, and k and v written into the KV cache;
4. causal attention over the cache, fp32 math: scores ``q k^T / sqrt(D)`` over
   positions ``0 .. p`` for the token at ``p``, softmax, weighted sum of v; query head
   j uses kv head ``j // (H / KV)`` (GQA); the output is rounded once to the dtype.
   With cupykern's ops, steps 3-4 are :func:`cupykern.rope_kv_append` and
   :func:`cupykern.decode_attention` (few tokens) or :func:`cupykern.prefill_attention`
   (many: :data:`cupykern.llm.ops.PREFILL_ATTENTION_MIN_TOKENS`), two launches per
   layer; with plain CuPy,
   ``apply_rope``, two cache copies, batched matmuls, a mask and ``softmax``;
5. ``attn_out = attn @ Wo^T``; ``x, h = fused_add_rms_norm(attn_out, h)``;
6. ``gate_up = x @ Wgu^T`` (fused gate/up weight); ``act = silu_and_mul(gate_up)``;
   ``mlp_out = act @ Wdown^T``.

Then ``x = fused_add_rms_norm(mlp_out, h)`` with the final norm and ``logits = x E^T``
(tied embedding). The LM head runs in float32 on an exact float32 copy of the
dtype's embedding, so logits are not rounded to fp16/bf16 (a bf16 rounding at
``|logit| ~ 20`` is 0.06, larger than the model's near-tie gaps).

Weights: dequantised on the host in float32 (:mod:`~cupykern.llm.gguf_weights`), then
rounded once to fp16 or bf16 on the device. cuBLAS GEMMs of fp16/bf16 accumulate in
fp32 (``CUBLAS_COMPUTE_32F``, as CuPy's default for half precision).

``ops`` chooses cupykern's kernels or plain-CuPy compositions of the same math for
rms_norm, fused_add_rms_norm, apply_rope, silu_and_mul and the attention softmax
(:mod:`~cupykern.llm.ops`).
"""

from __future__ import annotations

import math

import numpy as np

from cupykern import _dtypes, environment
from cupykern.llm import blas
from cupykern.llm.gguf_weights import LayerWeights, LlamaConfig, LlamaWeights, load_weights
from cupykern.llm.kv_cache import KVCache
from cupykern.llm.ops import KERNELS
from cupykern.llm.reference import check_tokens, host_token_ids
from cupykern.llm.stage_timer import no_timer

#: dtypes the GPU forward runs in.
MODEL_DTYPES = (_dtypes.float16, _dtypes.bfloat16)


def _model_dtype(dtype) -> np.dtype:
    """``dtype`` as a NumPy dtype, ValueError unless float16 or bfloat16."""
    try:  # the names every other dtype argument takes ("bf16", "float16") too
        checked = _dtypes.parse(dtype)
    except ValueError:
        checked = None
    if checked is None or checked not in MODEL_DTYPES:
        raise ValueError(f"dtype: expected float16 or bfloat16, got {dtype!r}")
    return checked


def to_device(weights: LlamaWeights, dtype) -> LlamaWeights:
    """A copy of host ``weights`` on the current GPU, each array rounded once to ``dtype``.

    ``weights`` may hold float32 or float64 arrays: both hold the dequantised float32
    values exactly, so either gives the same single rounding to ``dtype``.

    Raises:
        ValueError: ``dtype`` is not float16 or bfloat16.
        RuntimeError: no GPU.
    """
    import cupy

    dtype = _model_dtype(dtype)
    environment.check_gpu("to_device")

    def up(a):
        return cupy.asarray(a).astype(dtype)  # host float32 -> device, then round on the device

    embed = up(weights.embed)
    layers = [LayerWeights(**{name: up(getattr(layer, name)) for name in
                              ("attn_norm", "qkv", "o", "ffn_norm", "gate_up", "down")})
              for layer in weights.layers]
    lm_head = embed if weights.lm_head is weights.embed else up(weights.lm_head)
    return LlamaWeights(config=weights.config, embed=embed, layers=layers, final_norm=up(weights.final_norm),
                        lm_head=lm_head)


def random_device_weights(config: LlamaConfig, dtype, seed: int) -> LlamaWeights:
    """Device weights of ``config``'s shapes drawn at random (seeded): matrices normal with
    standard deviation ``1 / sqrt(in_features)`` (activations keep their scale through
    the layers), norm weights ``1 + 0.1 * normal``; a tied LM head when
    ``config.tied_embeddings``. For benchmarks and tests of the forward's kernels, whose
    time and numerics do not need a trained model.

    Raises:
        ValueError: ``dtype`` is not float16 or bfloat16.
        RuntimeError: no GPU.
    """
    import cupy

    dtype = _model_dtype(dtype)
    environment.check_gpu("random_device_weights")
    cfg = config
    rng = cupy.random.default_rng(seed)

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(dtype)

    def norm():
        return (1 + 0.1 * rng.standard_normal(cfg.hidden_size, dtype=np.float32)).astype(dtype)

    layers = [LayerWeights(attn_norm=norm(), qkv=mat(cfg.qkv_size, cfg.hidden_size),
                           o=mat(cfg.hidden_size, cfg.num_heads * cfg.head_dim), ffn_norm=norm(),
                           gate_up=mat(2 * cfg.intermediate_size, cfg.hidden_size),
                           down=mat(cfg.hidden_size, cfg.intermediate_size)) for _ in range(cfg.num_layers)]
    embed = mat(cfg.vocab_size, cfg.hidden_size)
    lm_head = embed if cfg.tied_embeddings else mat(cfg.vocab_size, cfg.hidden_size)
    return LlamaWeights(config=cfg, embed=embed, layers=layers, final_norm=norm(), lm_head=lm_head)


class LlamaModel:
    """GPU forward of a llama model in fp16 or bf16, with a KV cache.

    Parameters:
        weights: device :class:`LlamaWeights` of one dtype (float16 or bfloat16), as
            made by :func:`to_device`.
        ops: :data:`cupykern.llm.ops.KERNELS` (default) or ``PLAIN``.

    Raises:
        ValueError: weights of another dtype than float16/bfloat16.
    """

    def __init__(self, weights: LlamaWeights, *, ops=KERNELS):
        import cupykern

        self.weights = weights
        self.config: LlamaConfig = weights.config
        self.dtype = np.dtype(weights.embed.dtype)
        if self.dtype not in MODEL_DTYPES:
            raise ValueError(f"weights: expected float16 or bfloat16 arrays, got {self.dtype}")
        self.ops = ops
        cfg = self.config
        self.cos_sin_cache = cupykern.rope_cos_sin_cache(cfg.context_length, cfg.rotary_dim, base=cfg.rope_base)
        self.lm_head_f32 = weights.lm_head.astype(np.float32)  # exact: every fp16/bf16 value is a float32

    @classmethod
    def from_gguf(cls, path, dtype=_dtypes.float16, *, ops=KERNELS) -> LlamaModel:
        """Loads ``path``, dequantises on the host and uploads in ``dtype`` (errors as
        :func:`~cupykern.llm.gguf_weights.load_weights` and :func:`to_device`; the dtype
        and the GPU are checked before the seconds of dequantising)."""
        _model_dtype(dtype)
        environment.check_gpu("LlamaModel.from_gguf")
        return cls(to_device(load_weights(path, np.float32), dtype), ops=ops)

    def new_cache(self, max_tokens: int) -> KVCache:
        """An empty KV cache for up to ``max_tokens`` positions (at most ``context_length``).

        Raises:
            ValueError: ``max_tokens`` < 1 or beyond the model's context length.
        """
        import cupy

        cfg = self.config
        if not 1 <= max_tokens <= cfg.context_length:
            raise ValueError(f"max_tokens: expected 1 .. {cfg.context_length} (context length), got {max_tokens}")
        shape = (max_tokens, cfg.num_kv_heads, cfg.head_dim)
        return KVCache([cupy.zeros(shape, self.dtype) for _ in range(cfg.num_layers)],
                       [cupy.zeros(shape, self.dtype) for _ in range(cfg.num_layers)])

    def _attention(self, q, k, v, cache: KVCache, layer: int, start: int):
        """Causal GQA over the cache (fp32 math): q ``(T, H, D)``, k/v ``(T, KV, D)`` views
        -> ``(T, H * D)`` of the model dtype. Writes rows ``[start, start + T)`` of the cache."""
        import cupy

        cfg = self.config
        num_tokens = q.shape[0]
        stop = start + num_tokens
        cache.k[layer][start:stop] = k
        cache.v[layer][start:stop] = v
        group = cfg.num_heads // cfg.num_kv_heads
        scale = np.float32(1.0 / math.sqrt(cfg.head_dim))
        qg = (q.astype(np.float32) * scale).reshape(num_tokens, cfg.num_kv_heads, group, cfg.head_dim)
        qg = qg.transpose(1, 2, 0, 3)  # (KV, G, T, D)
        keys = cache.k[layer][:stop].astype(np.float32).transpose(1, 2, 0)  # (KV, D, S)
        values = cache.v[layer][:stop].astype(np.float32).transpose(1, 0, 2)  # (KV, S, D)
        scores = cupy.matmul(qg, keys[:, None])  # (KV, G, T, S)
        if num_tokens > 1:  # a single new token sees every cached position
            causal = cupy.arange(stop)[None, :] <= (start + cupy.arange(num_tokens))[:, None]
            scores = cupy.where(causal, scores, np.float32(-np.inf))
        probs = self.ops.softmax(scores)
        out = cupy.matmul(probs, values[:, None])  # (KV, G, T, D)
        return out.transpose(2, 0, 1, 3).reshape(num_tokens, cfg.num_heads * cfg.head_dim).astype(self.dtype)

    def forward(self, token_ids, cache: KVCache, *, all_logits: bool = False, timer=no_timer):
        """Runs ``token_ids`` at positions ``cache.length ...`` (prefill: many; decode: one).

        Parameters:
            token_ids: ``(num_tokens,)`` ints, host or device.
            cache: from :meth:`new_cache`; rows ``[length, length + num_tokens)`` of
                every layer are written and ``length`` advanced.
            all_logits: logits of every token (teacher forcing) instead of the last.
            timer: a :mod:`~cupykern.llm.stage_timer` timer (CUDA events per stage).

        Returns:
            float32 device logits ``(num_tokens or 1, vocab_size)``.

        Mutates: ``cache`` only.

        Raises:
            TypeError: ids that are not integers (a float, bool or string array).
            ValueError: empty ``token_ids``, an id outside the vocabulary, or more
                tokens than the cache holds.
        """
        import cupy

        host_ids = host_token_ids(token_ids)
        start = cache.length
        check_tokens(host_ids, start, cache.max_tokens, self.config.vocab_size)
        num_tokens = host_ids.shape[0]
        ids = cupy.asarray(host_ids)
        positions = cupy.arange(start, start + num_tokens, dtype=cupy.int32)  # < context_length: new_cache checks
        x = self.hidden_states(ids, positions, cache, start=start, timer=timer)
        with timer("matmul"):
            logits = self.logits(x if all_logits else x[-1:])
        cache.length = start + num_tokens
        return logits

    def logits(self, rows):
        """float32 logits ``(T, vocab_size)`` of final-normed ``rows`` ``(T, hidden_size)``
        (the tied LM head in float32, see the module docstring)."""
        return rows.astype(np.float32) @ self.lm_head_f32.T

    def hidden_states(self, ids, positions, cache: KVCache, *, start: int | None = None, timer=no_timer):
        """The layers and the final norm: ``(T, hidden_size)`` rows of the model dtype
        for token ``ids`` ``(T,)`` at ``positions`` ``(T,)`` (int32, device), their k and
        v written into the cache rows of their positions.

        With the kernel ops (``ops.fused_attention``) everything happens on the device
        from ``ids`` and ``positions`` (no host sync, no host-to-device copy, cuBLAS
        through :mod:`~cupykern.llm.blas`), so the call can be captured in a CUDA graph
        (:mod:`~cupykern.llm.prefill_graph`), and a negative position marks a padding
        row: no cache write, attention output 0, other rows unaffected. The plain ops
        need ``start``, the host copy of ``positions[0]`` (positions ``start ..
        start + T - 1``). Unchecked: :meth:`forward` checks ids and positions.

        Mutates: ``cache``'s rows at ``positions``.
        """
        cfg, w, ops = self.config, self.weights, self.ops
        num_tokens = ids.shape[0]
        nq, nkv, eps = cfg.num_heads, cfg.num_kv_heads, cfg.rms_norm_eps
        with timer("other"):
            residual = w.embed[ids]  # (T, hidden): a fresh array, so updating it in place is safe
        mlp_out = None
        for n, layer in enumerate(w.layers):
            with timer("norm"):
                if n == 0:
                    x = ops.rms_norm(residual, layer.attn_norm, eps)
                else:
                    x, residual = ops.fused_add_rms_norm(mlp_out, residual, layer.attn_norm, eps)
            with timer("matmul"):
                qkv = blas.matmul_nt(x, layer.qkv).reshape(num_tokens, nq + 2 * nkv, cfg.head_dim)
            q, k, v = qkv[:, :nq], qkv[:, nq:nq + nkv], qkv[:, nq + nkv:]  # views of qkv
            if ops.fused_attention:
                with timer("attention"):
                    attn = ops.rope_attention(q, k, v, positions, self.cos_sin_cache, cache.k[n], cache.v[n])
                    attn = attn.reshape(num_tokens, nq * cfg.head_dim)
            else:
                with timer("rope"):
                    ops.apply_rope(q, k, positions, self.cos_sin_cache)
                with timer("attention"):
                    attn = self._attention(q, k, v, cache, n, start)
            with timer("matmul"):
                attn_out = blas.matmul_nt(attn, layer.o)
            with timer("norm"):
                x, residual = ops.fused_add_rms_norm(attn_out, residual, layer.ffn_norm, eps)
            with timer("matmul"):
                gate_up = blas.matmul_nt(x, layer.gate_up)
            with timer("activation"):
                act = ops.silu_and_mul(gate_up)
            with timer("matmul"):
                mlp_out = blas.matmul_nt(act, layer.down)
        with timer("norm"):
            x, residual = ops.fused_add_rms_norm(mlp_out, residual, w.final_norm, eps)
        return x
