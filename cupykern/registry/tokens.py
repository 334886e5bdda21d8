"""Op specs of the tokens family (sample_tokens, embedding, append_tokens).

sample_tokens' size is the vocabulary (Llama 3's 128256 by default), its logits
standard normal times 4, drawn with temperature 0.7 (the greedy path is the same
kernel without the noise); embedding's size is hidden_size over a 32000-row table;
append_tokens' size is the history length. Token ids compare exactly.
"""

from __future__ import annotations

import numpy as np

from cupykern import reference
from cupykern.ops import tokens
from cupykern.registry import OpSpec, nbytes, random_device

VOCAB_SIZE = 128256
NUM_EMBEDDINGS = 32000
TEMPERATURE = 0.7
_INT32 = np.dtype(np.int32)


def _sample_inputs(rng, num_tokens, vocab, dtype):
    import cupy

    return {"logits": random_device(rng, (num_tokens, vocab), np.float32, scale=4.0),
            "positions": cupy.asarray(rng.integers(0, 2**31 - 1, num_tokens, dtype=np.int32)),
            "temperature": TEMPERATURE, "seed": int(rng.integers(0, 2**63)), "out": None}


def _embedding_inputs(rng, num_tokens, hidden, dtype):
    import cupy

    return {"token_ids": cupy.asarray(rng.integers(0, NUM_EMBEDDINGS, num_tokens, dtype=np.int32)),
            "weight": random_device(rng, (NUM_EMBEDDINGS, hidden), dtype), "out": None}


def _append_inputs(rng, num_sequences, max_tokens, dtype):
    import cupy

    return {"tokens": cupy.asarray(rng.integers(0, VOCAB_SIZE, num_sequences, dtype=np.int32)),
            "positions": cupy.asarray(rng.integers(-1, max_tokens, num_sequences, dtype=np.int32)),
            "history": cupy.asarray(rng.integers(0, VOCAB_SIZE, (num_sequences, max_tokens), dtype=np.int32))}


SAMPLE_TOKENS = OpSpec(
    name="sample_tokens", family="tokens", size_name="vocab_size", make_inputs=_sample_inputs,
    run=lambda i: (tokens.sample_tokens(i["logits"], temperature=i["temperature"], seed=i["seed"],
                                        positions=i["positions"], out=i.get("out")),),
    reference=lambda i: (reference.sample_tokens(i["logits"], temperature=i["temperature"], seed=i["seed"],
                                                 positions=i["positions"]),),
    min_bytes=lambda i: nbytes(i["logits"], i["positions"]) + 4 * i["logits"].shape[0],
    output_dtypes=lambda i: (_INT32,), check_sizes=(VOCAB_SIZE,), token_inputs=("logits", "positions"),
)

EMBEDDING = OpSpec(
    name="embedding", family="tokens", size_name="hidden_size", make_inputs=_embedding_inputs,
    run=lambda i: (tokens.embedding(i["token_ids"], i["weight"], out=i.get("out")),),
    reference=lambda i: (reference.embedding(i["token_ids"], i["weight"]),),
    min_bytes=lambda i: 2 * i["token_ids"].size * i["weight"].shape[1] * i["weight"].itemsize + nbytes(i["token_ids"]),
    output_dtypes=lambda i: (i["weight"].dtype,), token_inputs=("token_ids",),
)

APPEND_TOKENS = OpSpec(
    name="append_tokens", family="tokens", size_name="max_tokens", make_inputs=_append_inputs,
    run=lambda i: tokens.append_tokens(i["tokens"], i["positions"], i["history"]),
    reference=lambda i: reference.append_tokens(i["tokens"], i["positions"], i["history"]),
    min_bytes=lambda i: 4 * (3 * i["tokens"].size + i["tokens"].size),
    output_dtypes=lambda i: (_INT32, _INT32), check_sizes=(1024,), token_inputs=("tokens", "positions", "history"),
)

SPECS = (SAMPLE_TOKENS, EMBEDDING, APPEND_TOKENS)
