"""Token generation over either forward: prefill the prompt, then one-token decode steps.

Works with any model that has ``new_cache(max_tokens)`` and ``forward(ids, cache, *,
all_logits, timer)`` returning logits (:class:`~cupykern.llm.model.LlamaModel` on the
GPU, :class:`~cupykern.llm.reference.ReferenceLlama` on the CPU). The next token is
chosen on the host from the last row of logits: the argmax (greedy, temperature 0;
ties go to the lowest id, as ``numpy.argmax``) or a draw from
``softmax(logits / temperature)`` in float64 with a seeded NumPy generator.
"""

from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass, field

import numpy as np

from cupykern import _arrays
from cupykern.llm.kv_cache import KVCache
from cupykern.llm.reference import host_token_ids


@dataclass
class Generation:
    """What a :func:`generate` call produced, with wall-clock timings.

    ``prefill_s`` runs from the start to the first new token on the host (the prompt's
    forward and the logits' copy); ``decode_s`` covers the remaining decode steps.
    ``cache`` is the KV cache the generation filled (the model's ``new_cache`` of
    ``len(prompt_ids) + max_new_tokens`` positions; ``length`` rows written), kept so
    the caller can measure it (``cupykern generate`` reports its bytes); it holds
    device memory as long as this object lives.
    """

    prompt_ids: list[int]
    new_ids: list[int]
    prefill_s: float
    decode_s: float
    stopped: bool  # ended on a stop token
    cache: KVCache | None = field(default=None, repr=False, compare=False)

    @property
    def prefill_tokens_per_s(self) -> float:
        return len(self.prompt_ids) / self.prefill_s if self.prefill_s > 0 else math.inf

    @property
    def decode_tokens_per_s(self) -> float:
        steps = len(self.new_ids) - 1  # the first new token comes from the prefill
        return steps / self.decode_s if steps > 0 and self.decode_s > 0 else math.nan


def host_row(logits) -> np.ndarray:
    """The last row of ``logits`` (NumPy or CuPy) as a host float64 vector."""
    row = logits[-1]
    return np.asarray(row.get() if hasattr(row, "get") else row, dtype=np.float64)


def next_token(logits_row: np.ndarray, temperature: float, rng: np.random.Generator) -> int:
    """Greedy argmax for ``temperature == 0``, else a sample of ``softmax(logits / temperature)``.

    Parameters:
        logits_row: ``(vocab_size,)`` float logits of the next position (host array).
        temperature: 0, or any positive finite value (:func:`check_args`).
        rng: the sampling generator (advanced by one draw when sampling).

    Returns:
        The token id: the lowest index of the maximum when greedy.

    Raises:
        ValueError: ``logits_row`` not one non-empty row; a NaN or infinite logit (the
            forward went wrong: no token is made up from it), saying how many and the
            index of the first.

    Notes:
        The maximum is subtracted before dividing by the temperature, so the scaled
        logits are <= 0 and the largest is exactly 0: no temperature, however small
        (1e-308, 5e-324), overflows into NaN probabilities. A tiny temperature scales
        every logit below the maximum to -inf (probability 0), which is the limit of
        sampling as the temperature goes to 0: the argmax (uniform over exact ties).
    """
    logits_row = np.asarray(logits_row)
    if logits_row.ndim != 1 or logits_row.size == 0:  # argmax would index a flattened 2-D array
        raise ValueError(f"logits_row: expected shape (vocab_size,), got {logits_row.shape}")
    bad = np.flatnonzero(~np.isfinite(logits_row))
    if bad.size:
        raise ValueError(f"logits: the forward produced {bad.size} non-finite logit(s) (NaN or inf) of "
                         f"{logits_row.size}, the first at index {bad[0]} ({logits_row[bad[0]]})")
    if temperature == 0:
        return int(np.argmax(logits_row))
    with np.errstate(over="ignore"):  # (x - max) / tiny temperature -> -inf: probability 0, as it should be
        z = (logits_row.astype(np.float64) - logits_row.max()) / temperature
    p = np.exp(z)
    return int(rng.choice(p.size, p=p / p.sum()))


#: Seeds :func:`generate` takes: the range of the GPU sampler's (cupykern.ops.tokens.seed,
#: Philox's 64-bit key), so a seed one path takes the other takes too (their draws differ:
#: NumPy's generator here, Philox on the GPU).
MAX_SEED = 2**64 - 1


def check_args(max_new_tokens: int, temperature: float, seed: int = 0) -> None:
    """Checks :func:`generate`'s ``max_new_tokens`` (an int >= 1), ``temperature`` (a
    finite real number >= 0: 0 is greedy, and any positive value samples, however small,
    since :func:`next_token` subtracts the maximum before dividing) and ``seed`` (an int
    in [0, :data:`MAX_SEED`]).

    Raises:
        ValueError: ``max_new_tokens`` not an int >= 1; ``temperature`` negative, NaN or
            inf; ``seed`` not an int in range (None too: no unseeded runs).
        TypeError: ``temperature`` not a real number (a str, None, a bool).
    """
    _arrays.count(max_new_tokens, "max_new_tokens", 1)
    _arrays.count(seed, "seed", 0, MAX_SEED)
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise TypeError(f"temperature: expected a finite real number >= 0, got {temperature!r}")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature: expected a finite value >= 0, got {temperature!r}")


def generate(model, prompt_ids, max_new_tokens: int, *, temperature: float = 0.0, seed: int = 0,
             stop_ids=(), on_token=None) -> Generation:
    """Generates up to ``max_new_tokens`` tokens after ``prompt_ids``.

    Parameters:
        model: a GPU or reference model (see the module docstring).
        prompt_ids: non-empty list of token ids.
        max_new_tokens: >= 1.
        temperature: 0 for greedy, else the sampling temperature.
        seed: seeds the sampling generator (unused when greedy).
        stop_ids: ids that end generation (included in ``new_ids``).
        on_token: optional ``callable(token_id)`` called as each token is chosen.

    Returns:
        :class:`Generation`, with the KV cache it used in ``cache``.

    Raises:
        ValueError: bad ``max_new_tokens``/``temperature``/``seed``, or as the model's
            ``forward`` (empty prompt, ids outside the vocabulary, prompt plus new tokens
            beyond the context length).
        TypeError: ``prompt_ids`` or ``stop_ids`` not integers (a float is not truncated).
    """
    check_args(max_new_tokens, temperature, seed)
    # Not int() of each: 1.7 was taken as token 1 (the forward refuses float ids itself).
    prompt_ids = host_token_ids(prompt_ids, "prompt_ids").tolist()
    rng = np.random.default_rng(seed)
    stop_ids = set(host_token_ids(stop_ids, "stop_ids").tolist())
    cache = model.new_cache(len(prompt_ids) + max_new_tokens)
    t0 = time.perf_counter()
    logits = model.forward(prompt_ids, cache)
    new_ids: list[int] = []
    t1 = None
    stopped = False
    while True:
        token = next_token(host_row(logits), temperature, rng)
        if t1 is None:
            t1 = time.perf_counter()
        new_ids.append(token)
        if on_token is not None:
            on_token(token)
        if token in stop_ids:
            stopped = True
            break
        if len(new_ids) == max_new_tokens:
            break
        logits = model.forward([token], cache)
    t2 = time.perf_counter()
    return Generation(prompt_ids, new_ids, prefill_s=t1 - t0, decode_s=t2 - t1, stopped=stopped, cache=cache)


def profile_stages(model, make_timer, prompt_ids, new_ids) -> tuple[dict, dict]:
    """Time per stage of a replay of a generation: ``(prefill_ms, decode_ms)`` by stage.

    Runs the prompt, then each of ``new_ids[:-1]`` as a decode step (teacher-forced:
    the same computation as the generation that produced ``new_ids``), each with a
    fresh timer from ``make_timer()``.
    """
    cache = model.new_cache(len(prompt_ids) + max(len(new_ids), 1))
    prefill_timer = make_timer()
    model.forward(list(prompt_ids), cache, timer=prefill_timer)
    decode_timer = make_timer()
    for token in new_ids[:-1]:
        model.forward([token], cache, timer=decode_timer)
    return prefill_timer.totals_ms(), (decode_timer.totals_ms() if len(new_ids) > 1 else {})

