"""From logits to the next step's input on the device (kernels_cu/tokens.cu):
sample_tokens, embedding, append_tokens.

With these a decode loop never leaves the GPU: the LM head's logits give the next token
(:func:`sample_tokens`), its embedding row starts the next step (:func:`embedding`), and
:func:`append_tokens` moves the position on and records the token, so a captured CUDA
graph can be replayed step after step while the host only reads tokens back now and
then.
"""

from __future__ import annotations

import math

import numpy as np

from cupykern import _arrays, _dtypes, launcher, plans
from cupykern.jit import KernelTemplate

__all__ = ["append_tokens", "embedding", "sample_tokens"]

SAMPLE_TOKENS = KernelTemplate("tokens.cu", "sample_tokens_kernel", dependent_launch=True)
EMBEDDING = KernelTemplate("tokens.cu", "embedding_kernel", dependent_launch=True)
APPEND_TOKENS = KernelTemplate("tokens.cu", "append_tokens_kernel", dependent_launch=True)

#: Largest temperature: ``temperature * g`` (g, the Gumbel noise, below 23 in magnitude)
#: must stay far inside float32's range.
MAX_TEMPERATURE = 1e30
_INT32 = np.dtype(np.int32)


def instantiations() -> dict[KernelTemplate, list[str]]:
    """Every instantiation of this family."""
    return {
        SAMPLE_TOKENS: [SAMPLE_TOKENS.expr(idx, has) for idx in _dtypes.INDEX_C_TYPES.values() for has in (False, True)],
        EMBEDDING: [EMBEDDING.expr(_dtypes.c_type(d), idx, v) for d in _dtypes.DTYPES for idx in _dtypes.INDEX_C_TYPES.values()
                    for v in sorted({1, _dtypes.vec_width(d)})],
        APPEND_TOKENS: [APPEND_TOKENS.expr()],
    }


# ----------------------------------------------------------------- intake
def temperature(value) -> np.float32:
    """A temperature in ``[0, MAX_TEMPERATURE]`` as float32 (0: greedy). A nonzero value
    below float32's smallest normal number is refused (``_arrays.real``): the kernels
    flush such values to 0."""
    t = _arrays.real(value, "temperature")
    if not (math.isfinite(t) and 0 <= t <= MAX_TEMPERATURE):
        raise ValueError(f"temperature: expected a finite value in [0, {MAX_TEMPERATURE:g}] (0 is greedy), got "
                         f"{value!r}")
    return t


def seed(value) -> tuple[np.uint32, np.uint32]:
    """A seed, an int in ``[0, 2**64)``, as the two 32-bit halves of Philox's key."""
    if not _arrays.is_int(value) or not 0 <= int(value) < 2**64:
        raise ValueError(f"seed: expected an int in [0, 2**64), got {value!r}")
    value = int(value)
    return np.uint32(value & 0xFFFFFFFF), np.uint32(value >> 32)


_check_seed = seed  # sample_tokens' parameter of the same name hides it there


def _prepare_sample_tokens(a: launcher.Args) -> launcher.Launch:
    logits = _arrays.required(a.logits, "logits", "a float32 device array (num_tokens, vocab_size)")
    _arrays.check_dtype(logits, _dtypes.float32, "logits", "sample_tokens reads float32 logits")
    if len(logits.shape) != 2 or logits.shape[1] < 1:
        raise ValueError(f"logits: expected shape (num_tokens, vocab_size) with vocab_size >= 1, got "
                         f"{tuple(logits.shape)}")
    _arrays.element_aligned(logits, "logits")
    rows = _arrays.rows_of(logits, "logits")
    num_tokens, vocab = logits.shape
    if vocab >= 2**31:
        raise ValueError(f"logits: vocab_size must be below 2**31 (int32 token ids), got {vocab}")
    t = temperature(a.temperature)
    seed_lo, seed_hi = seed(a.seed)
    positions = _arrays.index_vector(a.positions, "positions", num_tokens) if a.positions is not None else None
    out, allocate = launcher.output(a.out, "out", (num_tokens,), _INT32)
    _arrays.index_vector(out, "out", num_tokens, {_INT32: "int"})
    disjoint = (launcher.Disjoint("logits", "out"), launcher.Disjoint("positions", "out"))
    if num_tokens == 0:
        return launcher.Launch(None, allocate=allocate, returns="out")
    plan = plans.DecodePlan("tokens", (num_tokens, 1, 1), plans.SAMPLE_THREADS)
    index_type = _dtypes.INDEX_C_TYPES[positions.dtype] if positions is not None else "int"
    return launcher.Launch(
        SAMPLE_TOKENS, (index_type, positions is not None), plan,
        pointers=("out", "logits", "positions" if positions is not None else "logits"),
        scalars=(np.int64(vocab), np.int64(rows.row_stride), t, seed_lo, seed_hi),
        allocate=allocate, returns="out", disjoint=disjoint)


def _prepare_embedding(a: launcher.Args) -> launcher.Launch:
    ids = _arrays.index_vector(a.token_ids, "token_ids", None)
    weight = _arrays.required(a.weight, "weight", "a device array (num_embeddings, hidden_size)")
    _arrays.supported_dtype(weight, "weight")
    if len(weight.shape) != 2 or weight.shape[1] < 1:
        raise ValueError(f"weight: expected shape (num_embeddings, hidden_size), got {tuple(weight.shape)}")
    _arrays.element_aligned(weight, "weight")
    w_rows = _arrays.rows_of(weight, "weight")
    num_tokens, (num_embeddings, hidden) = ids.shape[0], weight.shape
    out, allocate = launcher.output(a.out, "out", (num_tokens, hidden), weight.dtype)
    out_rows = _arrays.written_rows(out, "out")
    disjoint = (launcher.Disjoint("token_ids", "out"),
                launcher.Disjoint("weight", "out", a_rows=w_rows, b_rows=out_rows))
    if num_tokens == 0:
        return launcher.Launch(None, allocate=allocate, returns="out")
    vw = _dtypes.vec_width(weight.dtype)
    aligned = hidden % vw == 0 and _arrays.vector_aligned(vw, (weight, w_rows.row_stride),
                                                          (out, out_rows.row_stride))
    plan = plans.DecodePlan("tokens", (num_tokens, 1, 1), plans.TOKEN_BLOCK_SIZE, vec_width=vw if aligned else 1)
    return launcher.Launch(
        EMBEDDING, (_dtypes.c_type(weight.dtype), _dtypes.INDEX_C_TYPES[ids.dtype], plan.vec_width), plan,
        pointers=("out", "token_ids", "weight"),
        scalars=tuple(map(np.int64, (num_embeddings, hidden, w_rows.row_stride, out_rows.row_stride))),
        allocate=allocate, returns="out", disjoint=disjoint)


def _prepare_append_tokens(a: launcher.Args) -> launcher.Launch:
    tokens = _arrays.index_vector(a.tokens, "tokens", None, {_INT32: "int"})
    num_sequences = tokens.shape[0]
    _arrays.index_vector(a.positions, "positions", num_sequences, {_INT32: "int"})
    history = _arrays.required(a.history, "history", "an int32 device array (num_sequences, max_tokens)")
    _arrays.check_dtype(history, _INT32, "history", "int32")
    if len(history.shape) != 2 or history.shape[0] != num_sequences:
        raise ValueError(f"history: expected shape ({num_sequences}, max_tokens), got {tuple(history.shape)}")
    _arrays.element_aligned(history, "history")
    if history.size and (not history.shape[1] or history.strides != (history.shape[1] * 4, 4)):
        raise ValueError("history: expected a C-contiguous array")
    disjoint = (launcher.Disjoint("tokens", "positions"), launcher.Disjoint("tokens", "history"),
                launcher.Disjoint("positions", "history"))
    if num_sequences == 0:
        return launcher.Launch(None, returns=("positions", "history"))
    block = min(plans.TOKEN_BLOCK_SIZE, -(-num_sequences // plans.WARP_SIZE) * plans.WARP_SIZE)
    plan = plans.DecodePlan("tokens", (-(-num_sequences // block), 1, 1), block)
    return launcher.Launch(APPEND_TOKENS, (), plan, pointers=("positions", "history", "tokens"),
                           scalars=(np.int32(num_sequences), np.int64(history.shape[1])),
                           returns=("positions", "history"), disjoint=disjoint)


_SAMPLE_TOKENS = launcher.Op("sample_tokens", arrays=("logits", "positions", "out"), scalars=("temperature", "seed"),
                             prepare=_prepare_sample_tokens, plan_kind="tokens")
_EMBEDDING = launcher.Op("embedding", arrays=("token_ids", "weight", "out"), prepare=_prepare_embedding,
                         plan_kind="tokens")
_APPEND_TOKENS = launcher.Op("append_tokens", arrays=("tokens", "positions", "history"),
                             prepare=_prepare_append_tokens, plan_kind="tokens")


# ----------------------------------------------------------------- public API
def sample_tokens(logits, *, temperature=0.0, seed=0, positions=None, out=None):
    """The next token of each row of logits, chosen on the device: argmax or a seeded draw.

    ``temperature == 0``: ``out[t]`` is the index of the row's maximum, the first one on
    ties (``numpy.argmax``). ``temperature > 0``: a draw from ``softmax(logits[t] /
    temperature)`` by the Gumbel-max trick, ``out[t] = argmax_i (logits[t, i] +
    temperature * g_i)``, ``g_i = -log(-log(u_i))``; multiplying the noise instead of
    dividing the logits gives the same argmax and cannot overflow for tiny temperatures.
    ``u_i = ((x >> 8) + 0.5) / 2**24`` with ``x`` the first word of Philox4x32-10 at
    counter ``(i, c, 0, 0)`` and key ``(seed mod 2**32, seed // 2**32)``, ``c =
    positions[t]`` (0 without positions): a seed reproduces a run, each position draws
    fresh noise, and :func:`cupykern.reference.sample_tokens` draws the same numbers.

    Parameters:
        logits: float32 device array ``(num_tokens, vocab_size)``, unit-stride rows.
        temperature: 0 (greedy) or in ``[1.18e-38, 1e30]`` (float32's smallest normal
            number up: the kernel would flush a smaller one to 0). Tiny temperatures
            give the argmax: the noise is multiplied by the temperature, never the
            logits divided by it.
        seed: int in ``[0, 2**64)``.
        positions: optional ``(num_tokens,)`` int32/int64 device array: the position of
            the token each row of logits belongs to (the Philox counter).
        out: optional ``(num_tokens,)`` int32 device array.

    Returns:
        ``out`` (allocated if not given), int32. A row holding ``n > 0`` NaN or infinite
        logits gives ``-n`` there instead of a token: such logits mean the forward went
        wrong, and the caller must not feed the result on.

    Mutates: ``out`` only.

    Raises:
        TypeError: a non-device array; logits not float32; positions or out of the wrong
            integer type.
        ValueError: wrong shapes; a temperature outside ``[0, 1e30]``, not finite, or
            nonzero below 1.18e-38; a seed outside ``[0, 2**64)``; ``out`` overlapping
            an input.

    Notes:
        fp32 arithmetic (``logf``, one ``fmaf``): a draw can differ from the float64
        reference's where two perturbed logits lie within float32 rounding of each
        other.

    References:
        Gumbel 1954; Maddison, Tarlow & Minka, "A* Sampling", 2014 (arXiv:1411.0292);
        Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011 (Philox).
    """
    if type(seed) is not int:
        # The launcher's key compares scalars with ==, so 1.0 or True would find the recipe
        # of seed=1 and pass where a first call refuses them: check other types each call.
        _check_seed(seed)
    return _SAMPLE_TOKENS((logits, positions, out), (temperature, seed))


def embedding(token_ids, weight, *, out=None, check_ids=True):
    """Rows of an embedding table: ``out[t] = weight[token_ids[t]]`` (the ids stay on the device).

    Parameters:
        token_ids: ``(num_tokens,)`` int32 or int64 device array.
        weight: ``(num_embeddings, hidden_size)`` float16, bfloat16 or float32 device
            array with a unit-stride last axis.
        out: optional ``(num_tokens, hidden_size)`` of weight's dtype.
        check_ids: check every id is in ``[0, num_embeddings)`` (a reduction and a
            device-to-host copy). False skips it, as a captured graph must: a row of an
            id outside the table is then written as NaN (which :func:`sample_tokens`
            reports downstream), never read out of bounds.

    Returns:
        ``out`` (allocated if not given).

    Mutates: ``out`` only.

    Raises:
        TypeError: a non-device array; ids not int32/int64; an unsupported dtype.
        ValueError: wrong shapes or strides; ``out`` overlapping an input; an id out
            of range (with ``check_ids``).

    References:
        ``torch.nn.functional.embedding`` (the same lookup, without max_norm).
    """
    arrays = (token_ids, weight, out)
    if _arrays.flag(check_ids, "check_ids"):
        import cupy

        token_ids, weight, _ = _EMBEDDING.intake(arrays)
        if token_ids.size:
            lo, hi = (int(v) for v in cupy.stack((token_ids.min(), token_ids.max())).get())
            if lo < 0 or hi >= weight.shape[0]:
                raise ValueError(f"token_ids: expected values in [0, {weight.shape[0]}) (the rows of weight), got "
                                 f"min {lo}, max {hi}")
    return _EMBEDDING(arrays)


def append_tokens(tokens, positions, history):
    """A decode step's bookkeeping on the device: ``positions[b] += 1``, then ``history[b, positions[b]] = tokens[b]``.

    The last launch of a captured decode step: the next replay reads the advanced
    position (RoPE row, cache row, attention length, the sampler's counter), and the
    host reads the new tokens from ``history`` when it wants them. A new position
    outside ``[0, max_tokens)`` is advanced but not recorded (2**31 - 1 wraps to -2**31,
    as int32 arithmetic does).

    Parameters:
        tokens: ``(num_sequences,)`` int32 device array (:func:`sample_tokens`' output).
        positions: ``(num_sequences,)`` int32 device array, each sequence's position.
        history: ``(num_sequences, max_tokens)`` int32 C-contiguous device array.

    Returns:
        ``(positions, history)``.

    Mutates: ``positions`` and ``history``.

    Raises:
        TypeError: arrays of another dtype than int32, or not device arrays.
        ValueError: shapes that disagree; a non-contiguous history; arrays overlapping.
    """
    return _APPEND_TOKENS((tokens, positions, history))
