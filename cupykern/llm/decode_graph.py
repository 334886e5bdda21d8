"""The decode step of a llama model captured once as CUDA graphs and replayed, one step per token.

:meth:`GraphDecoder.capture` records the step, then builds a graph of one step and one
of ``steps_per_graph`` (8) steps in a row: a batch of replays launches the second (eight
tokens a launch) and the first for the remainder; :func:`generate` queues ``read_every``
(16) steps at a time and reads their tokens while the next batch runs.

One step, for the token at position ``p`` (device state: ``positions[0] = p``, ``token[0]``):

==============================================  =====================================
launch                                          per layer / once
==============================================  =====================================
``embedding(token) -> hidden``                  once
``rms_norm_gemv_rope_kv_append(hidden, ...)``   layer: norm + QKV + RoPE; q out, k and
                                                v into cache row p
``decode_attention(q, cache, positions)``       layer: rows 0 .. p of the cache
``gemv_add_residual(attn, Wo, hidden)``         layer: o_proj + residual
``rms_norm_gemv_silu_and_mul(hidden, ..)``      layer: norm + gate/up + SiLU gate
``gemv_add_residual(act, Wdown, hidden)``       layer: down + residual
``rms_norm_gemv(hidden, final_norm, E)``        once: float32 logits (tied LM head)
``sample_tokens(logits, positions)``            once: argmax, or a seeded draw
``append_tokens(token, positions, history)``    once: p + 1, history[p + 1] = token
==============================================  =====================================

Five launches per layer plus four, every one reading the position from device memory,
so the graph needs no new kernel arguments from step to step (CuPy exposes no graph
parameter updates). What capture forbids decides the rest:
no cuBLAS (the GEMVs are cupykern's), no host-to-device copies (the position lives on
the device and the graph advances it), no allocation (every buffer is made before the
capture and held as long as the graph; :meth:`GraphDecoder.capture` checks the pool's
used bytes do not move), every kernel loaded first (a warm-up step).

On sm_90 and newer the captured kernels are programmatic dependent launches
(:mod:`cupykern.dependent_launch`): each kernel's blocks start while the one before it
finishes and request their weights before they wait for it, which hides most of each
launch's latency in this chain of 154 dependent kernels (``enable_pdl``).

The math is :class:`~cupykern.llm.model.LlamaModel`'s, the normalised rows rounded to
the dtype as there, except that the products go into their epilogues (RoPE, the SiLU
gate, the residual add) in fp32, one rounding where the eager path's GEMM rounds first,
and sums run in the kernels' order: logits agree with the eager forward within the
per-dtype bounds, greedy tokens up to near-ties (tests/test_llm.py).
"""

from __future__ import annotations

import time

import numpy as np

from cupykern import _arrays
from cupykern.llm.generate import Generation, check_args
from cupykern.llm.kv_cache import KVCache
from cupykern.llm.prefill_graph import PrefillGraphs
from cupykern.llm.reference import host_token_ids


class NonFiniteLogits(ValueError):
    """The forward produced NaN or infinite logits (the sampler reports them as ``-count``)."""


class GraphDecoder:
    """Decode steps of ``model`` (a :class:`~cupykern.llm.model.LlamaModel`) for up to
    ``max_tokens`` positions, as captured CUDA graphs of the step (one step a replay, and
    ``steps_per_graph`` steps a replay).

    Parameters:
        model: the GPU model (fp16 or bf16 weights).
        max_tokens: positions the static KV cache holds (prompt plus new tokens), at most
            the model's context length.
        temperature: 0 for greedy, else the sampling temperature (:func:`cupykern.sample_tokens`).
        seed: the sampler's Philox key; with the position it fixes every draw.
        enable_pdl: capture the kernels as programmatic dependent launches; None (the
            default) where the GPU and driver allow it (sm_90+), False never, True or a
            RuntimeError saying why not.
        steps_per_graph: decode steps in a second graph that batches of replays launch
            (fewer graph launches, and dependent launches across the steps); 1: none.

    The prompt's forward runs as graphs too (:attr:`prefill`, a
    :class:`~cupykern.llm.prefill_graph.PrefillGraphs` into the same cache and stream).

    Device memory held: the KV cache (``2 * layers * max_tokens * kv_heads * head_dim``
    elements), one activation row per buffer, float32 logits and the token history;
    and the prefill graphs' activations.

    Raises:
        ValueError: ``max_tokens`` outside ``1 .. context_length``; a bad temperature, seed,
            ``enable_pdl`` or ``steps_per_graph``; a model without the kernel ops.
        RuntimeError: ``enable_pdl=True`` where dependent launches are unavailable.
    """

    def __init__(self, model, max_tokens: int, *, temperature: float = 0.0, seed: int = 0,
                 enable_pdl: bool | None = None, steps_per_graph: int = 8):
        import cupy
        import cupyx

        import cupykern
        from cupykern import dependent_launch
        from cupykern.ops import attention, tokens

        cfg = model.config
        self.model, self.config = model, cfg
        self.temperature = float(tokens.temperature(temperature))
        tokens.seed(seed)
        self.seed = int(seed)
        self.steps_per_graph = _arrays.count(steps_per_graph, "steps_per_graph", 1)
        if enable_pdl is not None:  # 0 and numpy's False are False here, not None (auto)
            if np.ndim(enable_pdl) != 0 or isinstance(enable_pdl, (str, bytes)) or enable_pdl not in (True, False):
                raise ValueError(f"enable_pdl: expected None, True or False, got {enable_pdl!r}")
            enable_pdl = bool(enable_pdl)
        why_not = dependent_launch.unavailable_reason() if enable_pdl is not False else None
        if enable_pdl and why_not:
            raise RuntimeError(f"enable_pdl=True: {why_not}")
        self.pdl = enable_pdl is not False and why_not is None
        self.cache: KVCache = model.new_cache(max_tokens)
        dtype = model.dtype
        self.positions = cupy.zeros((1,), np.int32)
        self.token = cupy.zeros((1,), np.int32)
        self.history = cupy.zeros((1, max_tokens + 1), np.int32)  # token ids by position
        self._host_history = cupyx.empty_pinned((max_tokens + 1,), np.int32)  # async copies of new tokens land here
        self.hidden = cupy.empty((1, cfg.hidden_size), dtype)  # the residual stream
        self.q = cupy.empty((1, cfg.num_heads, cfg.head_dim), dtype)
        self.attn = cupy.empty((1, cfg.num_heads, cfg.head_dim), dtype)
        self.act = cupy.empty((1, cfg.intermediate_size), dtype)
        self.logits = cupy.empty((1, cfg.vocab_size), np.float32)
        size = attention.workspace_size(1, cfg.num_heads, cfg.head_dim, max_tokens)
        self.workspace = cupy.empty((size,), np.float32) if size else None
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.prefill = PrefillGraphs(model, self.cache, self.stream)  # the prompt's forward, as graphs
        self.graph = self.graph_many = None
        self.position = None  # host copy of positions[0] between replays; None until start()
        self._ops = cupykern

    @property
    def max_tokens(self) -> int:
        return self.cache.max_tokens

    def _launches(self, layer: int | None) -> list[tuple[str, object, int]]:
        """(stage, call, weight bytes) of the step's launches: layer ``layer``'s five, or
        with None the step's own (embedding first, then the head's three)."""
        k_ = self._ops
        cfg, w = self.config, self.model.weights
        eps = cfg.rms_norm_eps
        if layer is None:
            return [("embedding", lambda: k_.embedding(self.token, w.embed, out=self.hidden, check_ids=False), 0),
                    ("final norm + LM head", lambda: k_.rms_norm_gemv(self.hidden, w.final_norm, w.lm_head, eps,
                                                                       out=self.logits, out_dtype=np.float32),
                     w.lm_head.nbytes),
                    ("sample_tokens", lambda: k_.sample_tokens(self.logits, temperature=self.temperature,
                                                               seed=self.seed, positions=self.positions,
                                                               out=self.token), 0),
                    ("append_tokens", lambda: k_.append_tokens(self.token, self.positions, self.history), 0)]
        lw, k_cache, v_cache = w.layers[layer], self.cache.k[layer], self.cache.v[layer]
        return [
            ("norm + QKV + RoPE + KV append", lambda: k_.rms_norm_gemv_rope_kv_append(
                self.hidden, lw.attn_norm, lw.qkv, self.positions, self.model.cos_sin_cache, k_cache, v_cache, eps,
                is_neox=False, q_out=self.q, check_positions=False), lw.qkv.nbytes),
            ("decode attention", lambda: k_.decode_attention(self.q, k_cache, v_cache, self.positions, out=self.attn,
                                                             workspace=self.workspace), 0),
            ("o_proj + residual", lambda: k_.gemv_add_residual(self.attn.reshape(1, -1), lw.o, self.hidden),
             lw.o.nbytes),
            ("norm + gate/up + SiLU", lambda: k_.rms_norm_gemv_silu_and_mul(self.hidden, lw.ffn_norm, lw.gate_up, eps,
                                                                             out=self.act), lw.gate_up.nbytes),
            ("down + residual", lambda: k_.gemv_add_residual(self.act, lw.down, self.hidden), lw.down.nbytes),
        ]

    def step(self) -> None:
        """One decode step on the current stream (eager; :meth:`capture` records it)."""
        first, *head = self._launches(None)
        first[1]()
        for layer in range(self.config.num_layers):
            for _, call, _ in self._launches(layer):
                call()
        for _, call, _ in head:
            call()

    def stage_split(self, position: int) -> list[dict]:
        """GPU time of each kind of launch of the step, alone: 100 of it captured in a graph
        and replayed (cupykern.timing.time_graph) at cache position ``position``; layer 0's
        stand for every layer. A launch alone reads its weights from L2 after the first,
        so the sum is below the whole step's :meth:`step_time_us`. Moves the decoder's state:
        call :meth:`start` before generating again.

        Returns: ``[{"stage", "per_step", "us", "weight_bytes"}]`` in step order.
        """
        from cupykern import timing

        first, *head = self._launches(None)
        kinds = [(first, 1)] + [(launch, self.config.num_layers) for launch in self._launches(0)] + \
            [(launch, 1) for launch in head]
        rows = []
        with self.stream:
            for (stage, call, weight_bytes), per_step in kinds:
                self.positions.fill(position)
                rows.append({"stage": stage, "per_step": per_step, "us": timing.time_graph(call).median_us,
                             "weight_bytes": weight_bytes})
        return rows

    def step_time_us(self, position: int, replays: int = 30) -> float:
        """Median GPU microseconds of one replay of the graph at cache position
        ``position`` (set before each replay, so the state does not move on). Needs
        :meth:`capture`; call :meth:`start` before generating again."""
        return self._replay_time_us(self.graph, 1, position, replays)

    def steps_time_us(self, position: int, replays: int = 30) -> float:
        """Median GPU microseconds per step of one replay of the ``steps_per_graph``-step
        graph from cache position ``position`` (as :meth:`step_time_us`; the step's
        time when replays run back to back in a batch)."""
        if self.graph_many is None:
            return self.step_time_us(position, replays)
        return self._replay_time_us(self.graph_many, self.steps_per_graph, position, replays)

    def _replay_time_us(self, graph, steps: int, position: int, replays: int) -> float:
        import cupy

        samples = []
        with self.stream:
            for _ in range(replays):
                self.positions.fill(position)
                start, end = cupy.cuda.Event(), cupy.cuda.Event()
                start.record(self.stream)
                graph.launch(self.stream)
                end.record(self.stream)
                end.synchronize()
                samples.append(cupy.cuda.get_elapsed_time(start, end) * 1e3 / steps)
        return float(np.median(samples))

    def capture(self) -> float:
        """Warms every kernel up with one eager step, then records :meth:`step` as the graph
        (its kernels as dependent launches when :attr:`pdl`).

        Returns the seconds it took. Leaves the cache and state to be reset by
        :meth:`start`. Raises RuntimeError if the capture allocated device memory.
        """
        import cupy

        from cupykern import launcher

        t0 = time.perf_counter()
        pool = cupy.get_default_memory_pool()
        with self.stream:
            self.positions.fill(0)
            self.token.fill(0)
            self.step()  # loads every kernel (a module load cannot happen inside a capture)
            self.stream.synchronize()
            used = pool.used_bytes()
            with launcher.recording() as launched:
                self.stream.begin_capture()
                try:
                    self.step()
                finally:
                    graph = self.stream.end_capture()
            if pool.used_bytes() != used:
                raise RuntimeError(f"the decode step allocated {pool.used_bytes() - used} bytes during capture: "
                                   "its addresses would be reused by later arrays")
            # The recorded launches again, as dependent launches where allowed; and
            # steps_per_graph steps in one graph, so a batch of replays is few launches.
            if self.pdl:
                graph = self._graph_of(launched, 1)
            many = self._graph_of(launched, self.steps_per_graph) if self.steps_per_graph > 1 else None
            for g in (graph, many):
                if g is not None:
                    g.upload(self.stream)
            self.stream.synchronize()
        self.graph, self.graph_many = graph, many
        self.position = None  # the warm-up step moved the device state: start() must set it again
        return time.perf_counter() - t0

    def _graph_of(self, launched: list, steps: int):
        """A graph of the recorded step ``launched`` (:class:`cupykern.launcher.Launched`),
        ``steps`` times in order; with :attr:`pdl`, each kernel whose template allows it as
        a programmatic dependent launch."""
        from cupykern import dependent_launch

        self.stream.begin_capture()
        try:
            for _ in range(steps):
                for launch in launched:
                    if self.pdl and launch.template is not None and launch.template.dependent_launch:
                        dependent_launch.launch(launch.function, launch.grid, launch.block, launch.args,
                                                launch.shared_mem, self.stream)
                    else:
                        launch.function(launch.grid, launch.block, launch.args, launch.shared_mem)
        finally:
            graph = self.stream.end_capture()
        return graph

    def start(self, prompt_ids: list[int]) -> int:
        """Prefills ``prompt_ids`` into the static cache by replays of :attr:`prefill`'s
        graphs (a bucket's captured now unless ``prefill.prepare`` did it) and picks the first new
        token on the device; sets the state for the first replay.

        ``prompt_ids``: ints, host or device, as :meth:`PrefillGraphs.run` takes them
        (flattened); the history and the position follow the tokens prefilled.

        Returns the first new token (read back: the host needs it anyway to stream it).
        """
        import cupy

        import cupykern

        # Once, as the prefill reads them: len() of a (1, n) array or np.asarray of a
        # CuPy one disagreed with what was prefilled (after the cache was written).
        host_ids = host_token_ids(prompt_ids)
        self.cache.length = 0
        with self.stream:
            logits = self.prefill.run(host_ids)
            last = host_ids.shape[0] - 1
            self.positions[...] = last
            first = cupykern.sample_tokens(logits, temperature=self.temperature, seed=self.seed,
                                           positions=self.positions, out=self.token)
            self.history[0, :last + 1] = cupy.asarray(host_ids.astype(np.int32))
            cupykern.append_tokens(first, self.positions, self.history)
            token = int(self.token.get()[0])
        _check_token(token, last)
        self.position = last + 1
        return token

    def replay(self, steps: int) -> np.ndarray:
        """Replays the graph ``steps`` times and returns the new tokens (host int array).

        Raises:
            ValueError: ``steps`` not an int >= 0, or more steps than the cache has rows left.
            RuntimeError: no graph captured (:meth:`capture`), or no prompt started
                since (:meth:`start`): the device position would not be the host's.
            NonFiniteLogits: a step's forward produced NaN or infinite logits.
        """
        return self.collect(self.enqueue(steps))

    def enqueue(self, steps: int) -> tuple:
        """Queues ``steps`` replays and the copy of their tokens to pinned host memory,
        without waiting: :meth:`collect` returns the tokens. Queue the next batch before
        collecting this one and the GPU never waits for the host (:func:`generate`).

        Returns an opaque ticket for :meth:`collect`. Raises as :meth:`replay`.
        """
        import cupy

        steps = _arrays.count(steps, "steps", 0)
        if self.graph is None or self.position is None:
            raise RuntimeError("replay: call capture() and then start(prompt_ids) first")
        start = self.position
        if start + steps > self.max_tokens:
            raise ValueError(f"steps: {steps} more steps from position {start} pass the cache's {self.max_tokens} rows")
        rows = slice(start + 1, start + 1 + steps)
        with self.stream:
            many, rest = divmod(steps, self.steps_per_graph) if self.graph_many is not None else (0, steps)
            for _ in range(many):
                self.graph_many.launch(self.stream)
            for _ in range(rest):
                self.graph.launch(self.stream)
            self.history[0, rows].get(stream=self.stream, out=self._host_history[rows], blocking=False)
            done = cupy.cuda.Event(block=True, disable_timing=True)
            done.record(self.stream)
        self.position = start + steps
        return start, rows, done

    def collect(self, ticket: tuple) -> np.ndarray:
        """Waits for an :meth:`enqueue`'d batch and returns its tokens (host int array).

        Raises:
            NonFiniteLogits: a step's forward produced NaN or infinite logits.
        """
        start, rows, done = ticket
        done.synchronize()
        new = self._host_history[rows].copy()
        for i, token in enumerate(new):
            _check_token(int(token), start + i)
        return new


def _check_token(token: int, position: int) -> None:
    if token < 0:
        raise NonFiniteLogits(f"the forward produced {-token} NaN or infinite logits at position {position}: "
                              "no token was chosen")


def generate(decoder: GraphDecoder, prompt_ids, max_new_tokens: int, *, stop_ids=(), on_token=None,
             read_every: int = 16) -> Generation:
    """:func:`cupykern.llm.generate.generate` on a captured decoder: the prompt's forward
    (prefill graph replays; their capture, if new, before the clock starts), then decode graph replays, the host reading ``read_every`` tokens at a time to
    stream them and look for stop tokens while the next ``read_every`` replays run
    (replays past a stop token are wasted, not returned). Temperature and seed are the
    decoder's.

    Raises:
        ValueError: bad ``max_new_tokens``; ``read_every`` not an int >= 1; prompt plus
            new tokens beyond the decoder's ``max_tokens``; as the model's ``forward``.
        TypeError: ``prompt_ids`` or ``stop_ids`` not integers.
        NonFiniteLogits: the forward produced NaN or infinite logits.
    """
    check_args(max_new_tokens, decoder.temperature)
    # 0 would replay nothing forever; a negative count would move the host's position back
    read_every = _arrays.count(read_every, "read_every", 1)
    prompt_ids = host_token_ids(prompt_ids, "prompt_ids").tolist()
    if len(prompt_ids) + max_new_tokens > decoder.max_tokens:
        raise ValueError(f"max_new_tokens: {len(prompt_ids)} prompt tokens + {max_new_tokens} exceed the decoder's "
                         f"{decoder.max_tokens} positions")
    stop_ids = set(host_token_ids(stop_ids, "stop_ids").tolist())
    if decoder.graph is None:
        decoder.capture()
    decoder.prefill.prepare(len(prompt_ids))  # capture, like the decode step's, is not the prefill's time
    t0 = time.perf_counter()
    new_ids = [decoder.start(prompt_ids)]
    t1 = time.perf_counter()
    if on_token is not None:
        on_token(new_ids[0])
    stopped = new_ids[0] in stop_ids
    queued = len(new_ids)  # tokens chosen or queued
    pending = []
    while not stopped and (pending or queued < max_new_tokens):
        # Keep one batch queued behind the one being read, so the GPU runs while the host reads.
        while len(pending) < 2 and queued < max_new_tokens:
            steps = min(read_every, max_new_tokens - queued)
            pending.append(decoder.enqueue(steps))
            queued += steps
        for token in decoder.collect(pending.pop(0)):
            new_ids.append(int(token))
            if on_token is not None:
                on_token(int(token))
            if token in stop_ids:
                stopped = True
                break
    if pending:  # a stop token came first: let the queued replays finish before the caller reuses the decoder
        decoder.stream.synchronize()
    t2 = time.perf_counter()
    decoder.cache.length = len(prompt_ids) + len(new_ids) - 1  # rows written: the last token is not yet in it
    return Generation(prompt_ids, new_ids, prefill_s=t1 - t0, decode_s=t2 - t1, stopped=stopped,
                      cache=decoder.cache)
