"""float64 references of kernels_cu/tokens.cu: sample_tokens, embedding, append_tokens.

:func:`philox4x32_10` is the counter-based generator the sampling kernel uses, in NumPy
(uint64 arithmetic, vectorised over counters), so the reference draws the same noise.
Each op's twin checks its arguments with its kernel's own checks (reference/_common.py)
first.
"""

from __future__ import annotations

import numpy as np

from cupykern import _arrays
from cupykern.ops import tokens as _tokens_ops
from cupykern.reference._common import check, f64, host, real64

__all__ = ["append_tokens", "embedding", "philox4x32_10", "sample_tokens"]

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_MASK = np.uint64(0xFFFFFFFF)


def _words(value, name: str) -> np.ndarray:
    """``value`` as uint64 words, ValueError naming ``name`` unless every one is an int in
    [0, 2**32) (checked on the array: gumbel_noise passes a vocabulary of counters)."""
    words = np.asarray(value)
    if words.dtype.kind in "iu":
        fits = words.size == 0 or (int(words.min()) >= 0 and int(words.max()) <= 0xFFFFFFFF)
    elif words.dtype == object:  # Python ints past int64
        fits = all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and 0 <= v <= 0xFFFFFFFF
                   for v in words.flat)
    else:
        fits = False
    if not fits:
        raise ValueError(f"{name}: expected integer words in [0, 2**32), got {value!r}")
    return words.astype(np.uint64)


def philox4x32_10(counter, key) -> np.ndarray:
    """Philox4x32-10 (Salmon et al., SC 2011; Random123's constants): ``counter`` an
    ``(..., 4)`` array of uint32 words, ``key`` two uint32 words; returns ``(..., 4)`` uint32.
    ValueError naming ``counter`` or ``key`` for a word outside [0, 2**32) or another shape
    (a wider word would change every later round instead of failing)."""
    c = _words(counter, "counter")
    if c.ndim < 1 or c.shape[-1] != 4:
        raise ValueError(f"counter: expected shape (..., 4), got {c.shape}")
    keys = _words(key, "key")
    if keys.shape != (2,):
        raise ValueError(f"key: expected two words, got shape {keys.shape}")
    x, y, z, w = (c[..., i] for i in range(4))
    k0, k1 = int(keys[0]), int(keys[1])
    for _ in range(10):
        p0, p1 = _M0 * x, _M1 * z  # exact: 32 x 32 bits fit in 64
        hi0, lo0 = p0 >> np.uint64(32), p0 & _MASK
        hi1, lo1 = p1 >> np.uint64(32), p1 & _MASK
        x, y, z, w = hi1 ^ y ^ np.uint64(k0), lo1, hi0 ^ w ^ np.uint64(k1), lo0
        k0, k1 = (k0 + _W0) & 0xFFFFFFFF, (k1 + _W1) & 0xFFFFFFFF
    return np.stack([x, y, z, w], axis=-1).astype(np.uint32)


def gumbel_noise(vocab_size: int, counter: int, seed: int) -> np.ndarray:
    """``-log(-log(u_i))`` for ``i < vocab_size``, float64, with the kernel's ``u_i``:
    ``((x >> 8) + 0.5) / 2**24``, ``x`` the first Philox word at counter ``(i, counter, 0, 0)``
    and key ``(seed mod 2**32, seed // 2**32)``."""
    counters = np.zeros((vocab_size, 4), dtype=np.uint64)
    counters[:, 0] = np.arange(vocab_size, dtype=np.uint64)
    counters[:, 1] = np.uint64(counter & 0xFFFFFFFF)
    words = philox4x32_10(counters, (seed & 0xFFFFFFFF, seed >> 32))[:, 0]
    u = ((words >> np.uint32(8)).astype(np.float64) + 0.5) * 2.0**-24
    return -np.log(-np.log(u))


def sample_tokens(logits, *, temperature=0.0, seed=0, positions=None, out=None) -> np.ndarray:
    """The kernel's choice per row: the first argmax of ``logits[t]`` (temperature 0) or of
    ``logits[t] + temperature * gumbel_noise(vocab, positions[t], seed)`` computed in
    float64 and rounded once to float32 (the kernel's ``fmaf``, so ties between
    perturbed logits break alike); ``-n`` for a row with ``n`` NaN or infinite logits.
    int32 array, as the op's (so it feeds :func:`append_tokens` as it is)."""
    if type(seed) is not int:  # the op checks such a seed before the arrays
        _tokens_ops.seed(seed)
    check("sample_tokens", logits=logits, positions=positions, out=out, temperature=temperature, seed=seed)
    rows = f64(logits)
    pos = host(positions).astype(np.int64).reshape(-1) if positions is not None else np.zeros(len(rows), np.int64)
    result = np.empty(rows.shape[0], dtype=np.int32)
    for t, row in enumerate(rows):
        bad = int((~np.isfinite(row)).sum())
        if bad:
            result[t] = -bad
            continue
        if temperature == 0:
            z = row
        else:
            z = (row + real64(temperature) * gumbel_noise(row.size, int(pos[t]), int(seed))).astype(np.float32)
        result[t] = int(np.argmax(z))
    return result


def embedding(token_ids, weight, *, out=None, check_ids=True) -> np.ndarray:
    """``weight[token_ids]`` in float64. An id outside the table raises the kernel's
    ValueError with ``check_ids``; without, it gives a row of NaN (as the kernel writes)."""
    checking = _arrays.flag(check_ids, "check_ids")  # before the arrays, as the op
    check("embedding", token_ids=token_ids, weight=weight, out=out)
    ids = host(token_ids).astype(np.int64).reshape(-1)
    table = f64(weight)
    if checking and ids.size:
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= table.shape[0]:
            raise ValueError(f"token_ids: expected values in [0, {table.shape[0]}) (the rows of weight), got "
                             f"min {lo}, max {hi}")
    valid = (ids >= 0) & (ids < table.shape[0])
    rows = np.full((ids.size, table.shape[1]), np.nan)
    rows[valid] = table[ids[valid]]
    return rows


def append_tokens(tokens, positions, history):
    """``(positions + 1, history with history[b, positions[b] + 1] = tokens[b])`` as int32
    arrays, as the op writes them (the write skipped where the new position is outside
    ``[0, max_tokens)``). The int32 positions wrap as the kernel's do: 2**31 - 1 + 1 is
    -2**31 (and nothing is written there). Takes int32 NumPy or CuPy arrays, as the op."""
    check("append_tokens", tokens=tokens, positions=positions, history=history)
    new_positions = (host(positions).astype(np.int64) + 1 + 2**31) % 2**32 - 2**31
    after = host(history).astype(np.int64).copy()
    for b, (p, token) in enumerate(zip(new_positions, host(tokens).astype(np.int64))):
        if 0 <= p < after.shape[1]:
            after[b, p] = token
    return new_positions.astype(np.int32), after.astype(np.int32)
