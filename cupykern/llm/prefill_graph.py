"""A llama model's prefill as CUDA graphs: one captured per bucket of prompt lengths.

An eager prefill launches about ten kernels and cuBLAS calls per layer from Python, 300
for SmolLM2-135M; on the H200 hosts lent to this project each costs 15-60 us of host
time, so a 512-token prefill took 13-15 ms while its kernels needed a fraction of that.
Replayed as a graph, the launches cost the host nothing.

A graph's kernel arguments are frozen at capture, so each graph serves a fixed number of
rows, a *bucket* (:data:`BUCKETS`): a prompt chunk of ``n`` tokens runs in the smallest
bucket ``b >= n``, its token ids and positions copied into the graph's input buffers
first, the ``b - n`` padding rows given position -1. The kernels treat a negative
position as padding (:meth:`~cupykern.llm.model.LlamaModel.hidden_states`): no KV-cache
write and an attention output of 0, so the padding rows change no other row. Prompts
longer than the largest bucket run in chunks of it, each attending to the cache rows the
chunks before it wrote. The logits of the prompt's last token come from its row after
the replay (one float32 product, as the eager forward's).

What capture forbids decides the rest: cuBLAS goes through
:mod:`~cupykern.llm.blas`; every kernel is loaded by a warm-up run of the bucket first;
arrays made during capture come from this object's own memory pool, which nothing else
allocates from, and the graph's inputs and output are held as long as the graph, so no
later array takes their addresses.

Bits: a valid row's result can differ from the eager forward's in the last place, since
cuBLAS may pick another algorithm for ``b`` rows than for ``n``; logits agree within the
per-dtype bounds (tests/test_llm.py).
"""

from __future__ import annotations

import time
from typing import NamedTuple

import numpy as np

from cupykern import _arrays
from cupykern.llm.kv_cache import KVCache
from cupykern.llm.reference import check_tokens, host_token_ids

#: Rows of the captured graphs: 16, then powers of two and their 1.5x, so from 32 rows up
#: a bucket is at most 1.5x the one below it (padding at most a third of its rows); the
#: last is the chunk size of long prompts.
BUCKETS = (16, 32, 48, 64, 96, 128, 192, 256, 384, 512)


class _Graph(NamedTuple):
    graph: object  # cupy.cuda.Graph
    ids: object  # (bucket,) int32 device input
    positions: object  # (bucket,) int32 device input, -1 on padding rows
    hidden: object  # (bucket, hidden_size) output rows, final-normed


def _check_count(num_tokens) -> None:
    """ValueError unless ``num_tokens`` is an int (Python or NumPy; not a bool or a float)."""
    if not _arrays.is_int(num_tokens):
        raise ValueError(f"num_tokens: expected an int, got {num_tokens!r}")


def bucket_for(num_tokens: int) -> int:
    """The rows of the graph that runs a chunk of ``num_tokens`` (1 .. ``BUCKETS[-1]``)."""
    _check_count(num_tokens)
    if not 1 <= num_tokens <= BUCKETS[-1]:
        raise ValueError(f"num_tokens: expected 1 .. {BUCKETS[-1]}, got {num_tokens}")
    return next(b for b in BUCKETS if b >= num_tokens)


def chunks(num_tokens: int) -> list[tuple[int, int]]:
    """``(first, count)`` of the chunks a prompt of ``num_tokens`` (an int >= 0) runs in, in order."""
    _check_count(num_tokens)
    if num_tokens < 0:
        raise ValueError(f"num_tokens: expected an int >= 0, got {num_tokens!r}")
    size = BUCKETS[-1]
    return [(first, min(size, num_tokens - first)) for first in range(0, num_tokens, size)]


class PrefillGraphs:
    """Prefills into ``cache`` for ``model`` (a :class:`~cupykern.llm.model.LlamaModel`
    with the kernel ops) by graph replays on ``stream``; a bucket's graph is captured the
    first time a prompt needs it, or ahead by :meth:`prepare`.

    Parameters:
        model: the GPU model (fp16 or bf16 weights) with the kernel ops (``ops=KERNELS``:
            its attention is the fused kernels, which take padding rows).
        cache: the :class:`~cupykern.llm.kv_cache.KVCache` the prompts are written into
            (``model.new_cache(max_tokens)``), at most the model's context length in rows;
            the graphs hold its arrays' addresses.
        stream: the ``cupy.cuda.Stream`` the graphs are captured and replayed on, and the
            inputs copied on; a stream of your own, not the default one
            (``cupy.cuda.Stream.null``): CUDA cannot begin a capture on the legacy
            default stream. Best ``cupy.cuda.Stream(non_blocking=True)``, as
            :class:`~cupykern.llm.decode_graph.GraphDecoder` makes: while a blocking
            stream captures, work queued on the default stream would depend on the
            capture implicitly, which CUDA refuses (``cudaErrorStreamCaptureImplicit``).

    Device memory held: per bucket ``b`` captured, its activations (about ``b x
    (hidden + qkv + gate_up + intermediate)`` elements of the dtype, reused across
    buckets through the private pool) and inputs.

    The graphs write the arrays ``cache`` holds now: another cache (or new arrays in
    this one) needs another PrefillGraphs; :meth:`run` and :meth:`prepare` refuse it.

    Raises:
        ValueError: a model without the fused kernel attention (``ops=PLAIN``); a cache
            without a key and value array per layer, or of more rows than the model's
            context length (positions past its RoPE table would be neither rotated nor
            written).
    """

    def __init__(self, model, cache: KVCache, stream):
        import cupy

        if not model.ops.fused_attention:
            raise ValueError(f"model: prefill graphs need the kernel ops (fused attention), got {model.ops.name!r}")
        cfg = model.config
        if len(cache.k) != cfg.num_layers or len(cache.v) != cfg.num_layers:
            raise ValueError(f"cache: expected {cfg.num_layers} layers of keys and values (model.new_cache), got "
                             f"{len(cache.k)} and {len(cache.v)}")
        if not 1 <= cache.max_tokens <= cfg.context_length:
            raise ValueError(f"cache: expected 1 .. {cfg.context_length} rows (the model's context length), got "
                             f"{cache.max_tokens}")
        self.model, self.cache, self.stream = model, cache, stream
        self._arrays = self._cache_arrays()
        self._pool = cupy.cuda.MemoryPool()  # this object's arrays only: see the module docstring
        self._graphs: dict[int, _Graph] = {}

    def _cache_arrays(self) -> tuple:
        return tuple((a.data.ptr, a.shape, a.strides) for a in (*self.cache.k, *self.cache.v))

    def _check_cache(self) -> None:
        """ValueError unless :attr:`cache` holds the arrays it held at construction (the
        ones the captured graphs write)."""
        if self._cache_arrays() != self._arrays:
            raise ValueError("cache: not the arrays these prefill graphs were made for (they would write the "
                             "old ones); make a PrefillGraphs for the new cache")

    def prepare(self, num_tokens: int) -> float:
        """Captures the graphs a prompt of ``num_tokens`` (an int, 0 .. the cache's rows)
        needs (none if captured before). Returns the seconds it took. Moves no cache row.

        Raises:
            ValueError: :attr:`cache` holding other arrays than at construction;
                ``num_tokens`` not an int or past the cache's rows (no prompt that long fits).
        """
        t0 = time.perf_counter()
        self._check_cache()
        _check_count(num_tokens)
        if not 0 <= num_tokens <= self.cache.max_tokens:
            raise ValueError(f"num_tokens: expected 0 .. {self.cache.max_tokens} (the cache's rows), got {num_tokens}")
        for _, count in chunks(num_tokens):
            self._graph(bucket_for(count))
        return time.perf_counter() - t0

    def _graph(self, bucket: int) -> _Graph:
        import cupy

        found = self._graphs.get(bucket)
        if found is not None:
            return found
        hidden_states = self.model.hidden_states
        with cupy.cuda.using_allocator(self._pool.malloc), self.stream:
            ids = cupy.zeros((bucket,), np.int32)
            positions = cupy.full((bucket,), -1, np.int32)  # all padding: the warm-up writes no cache row
            hidden_states(ids, positions, self.cache)  # loads every kernel, makes cuBLAS's handle
            self.stream.synchronize()
            self.stream.begin_capture()
            try:
                hidden = hidden_states(ids, positions, self.cache)
            finally:
                graph = self.stream.end_capture()
            graph.upload(self.stream)
        found = self._graphs[bucket] = _Graph(graph, ids, positions, hidden)
        return found

    def run(self, token_ids) -> object:
        """Prefills ``token_ids`` at positions ``cache.length ...`` and returns the float32
        logits ``(1, vocab_size)`` of the last token; advances ``cache.length``. Runs on
        ``stream`` without waiting for it (the logits are ready when it is).

        Raises:
            ValueError: :attr:`cache` holding other arrays than at construction.
            TypeError: ids that are not integers, as :meth:`~cupykern.llm.model.LlamaModel.forward`.
            ValueError: as :meth:`~cupykern.llm.model.LlamaModel.forward` (empty, ids out
                of the vocabulary, more tokens than the cache holds).
        """
        self._check_cache()
        host_ids = host_token_ids(token_ids)
        start = self.cache.length
        check_tokens(host_ids, start, self.cache.max_tokens, self.model.config.vocab_size)
        last = None
        with self.stream:
            for first, count in chunks(host_ids.shape[0]):
                g = self._graph(bucket_for(count))
                bucket = g.ids.shape[0]
                ids = np.zeros(bucket, np.int32)
                ids[:count] = host_ids[first:first + count]
                positions = np.full(bucket, -1, np.int32)
                positions[:count] = np.arange(start + first, start + first + count, dtype=np.int32)
                g.ids.set(ids, stream=self.stream)
                g.positions.set(positions, stream=self.stream)
                g.graph.launch(self.stream)
                last = g.hidden[count - 1:count]
            logits = self.model.logits(last)
        self.cache.length = start + host_ids.shape[0]
        return logits
