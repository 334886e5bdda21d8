"""Host-side float64 RoPE tables: inverse frequencies per Hugging Face ``rope_type``,
the attention factor, and the ``cos_sin_cache`` built from them.

Pure NumPy (no GPU): :func:`rope_parameters` reads a Hugging Face config's
``rope_scaling`` dict as is and returns ``(inv_freq, attention_factor)``;
:func:`cos_sin_table` evaluates ``cos``/``sin`` of ``position * inv_freq`` in float64
(so position 1,000,000 is as accurate as position 1) and folds the attention factor
in. ``cupykern.rope_cos_sin_cache`` uploads the table; ``cupykern.reference`` uses it
unrounded.

Each builder cites the function whose semantics it follows: Hugging Face transformers
``src/transformers/modeling_rope_utils.py`` (``_compute_*_parameters``) and vLLM
``vllm/model_executor/layers/rotary_embedding/`` (one file per scaling).
"""

from __future__ import annotations

import math

import numpy as np

from cupykern import _arrays, _dtypes

#: The rope_type values understood, with the keys each one requires.
REQUIRED_KEYS = {
    "default": (),
    "linear": ("factor",),
    "dynamic": ("factor", "original_max_position_embeddings"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings"),
    "longrope": ("short_factor", "long_factor", "original_max_position_embeddings"),
}
#: Older configs' names of a rope_type (Phi-3's first configs said "su"; Qwen2-VL's and
#: Qwen2.5-VL's say "mrope", which HF's Qwen2VLConfig rewrites to "default": M-RoPE's
#: table is the default one, its ``mrope_section`` only picks rows, see
#: :func:`mrope_parameters`).
ALIASES = {"su": "longrope", "mrope": "default"}

#: Rows of the table evaluated at once (bounds the float64 scratch to 64 MiB at rotary_dim 128).
_CHUNK_ROWS = 1 << 16


def default_inv_freq(rotary_dim: int, base: float) -> np.ndarray:
    """``inv_freq[i] = base ** (-2 i / rotary_dim)``, i in [0, rotary_dim / 2), float64.

    Source: RoFormer (Su et al. 2021, arXiv:2104.09864, eq. 15); HF
    ``_compute_default_rope_parameters``.
    """
    return 1.0 / (float(base) ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim))


def linear_inv_freq(rotary_dim: int, base: float, factor: float) -> np.ndarray:
    """Position interpolation: ``inv_freq / factor`` (HF ``_compute_linear_scaling_rope_parameters``;
    Chen et al. 2023, arXiv:2306.15595)."""
    return default_inv_freq(rotary_dim, base) / factor


def dynamic_ntk_inv_freq(rotary_dim: int, base: float, factor: float, original_max_position: float,
                         max_position: int) -> np.ndarray:
    """Dynamic NTK: the base stretched for a sequence of ``max_position`` tokens.

    ``base' = base * (factor * L / L0 - (factor - 1)) ** (rotary_dim / (rotary_dim - 2))``
    with ``L = max(max_position, L0)``, ``L0 = original_max_position``; then
    :func:`default_inv_freq` with ``base'``. HF ``_compute_dynamic_ntk_parameters`` with
    ``seq_len = max_position``; vLLM's ``DynamicNTKScalingRotaryEmbedding`` builds its
    cache the same way for its ``max_len`` positions. ``L <= L0`` gives the unscaled base.
    """
    seq_len = max(float(max_position), float(original_max_position))
    stretched = base * (factor * seq_len / original_max_position - (factor - 1)) ** (rotary_dim / (rotary_dim - 2))
    return default_inv_freq(rotary_dim, stretched)


def llama3_inv_freq(rotary_dim: int, base: float, factor: float, low_freq_factor: float, high_freq_factor: float,
                    original_max_position: float) -> np.ndarray:
    """Llama 3.1 scaling (HF ``_compute_llama3_parameters``, from Meta's reference code).

    With ``wavelen = 2 pi / inv_freq``, ``low_wl = L0 / low_freq_factor`` and
    ``high_wl = L0 / high_freq_factor``: wavelengths below ``high_wl`` keep their
    frequency, those above ``low_wl`` are divided by ``factor``, and those in between
    (both edges included) are interpolated with
    ``smooth = (L0 / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)``,
    ``inv_freq' = (1 - smooth) * inv_freq / factor + smooth * inv_freq``.
    """
    inv_freq = default_inv_freq(rotary_dim, base)
    wavelen = 2.0 * math.pi / inv_freq
    low_wl = original_max_position / low_freq_factor
    high_wl = original_max_position / high_freq_factor
    smooth = (original_max_position / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1.0 - smooth) * inv_freq / factor + smooth * inv_freq
    out = np.where(wavelen > low_wl, inv_freq / factor, inv_freq)
    medium = ~(wavelen < high_wl) & ~(wavelen > low_wl)
    return np.where(medium, smoothed, out)


def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's magnitude correction ``0.1 * mscale * ln(scale) + 1`` (1 for scale <= 1)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def yarn_parameters(rotary_dim: int, base: float, factor: float, original_max_position: float, *,
                    beta_fast: float | None = None, beta_slow: float | None = None, mscale: float | None = None,
                    mscale_all_dim: float | None = None, attention_factor: float | None = None,
                    truncate: bool = True) -> tuple[np.ndarray, float]:
    """YaRN (Peng et al. 2023, arXiv:2309.00071): ``(inv_freq, attention_factor)``.

    Frequencies blend interpolation (``inv_freq / factor``) and extrapolation
    (``inv_freq``) with a linear ramp over pair index i between
    ``low = floor(d(beta_fast))`` and ``high = ceil(d(beta_slow))`` (no floor/ceil when
    ``truncate`` is False), ``d(r) = rotary_dim * ln(L0 / (2 pi r)) / (2 ln base)``,
    clamped to [0, rotary_dim - 1]: ``ramp = clip((i - low) / (high - low), 0, 1)``,
    ``inv_freq' = inv_freq / factor * ramp + inv_freq * (1 - ramp)``.
    The attention factor is ``attention_factor`` if given, else
    ``mscale(factor, mscale) / mscale(factor, mscale_all_dim)`` when both are set and
    nonzero (DeepSeek), else ``0.1 ln(factor) + 1``. beta_fast/beta_slow default to 32/1.
    Source: HF ``_compute_yarn_parameters``; vLLM ``YaRNScalingRotaryEmbedding`` and
    ``DeepseekScalingRotaryEmbedding``. ``factor`` is the config's ``factor`` (vLLM; HF
    releases that rederive it as ``max_position_embeddings / L0`` agree whenever the
    config's sizes are consistent). The mscale rule is HF's: both ``mscale`` and
    ``mscale_all_dim`` nonzero, else the plain ``0.1 ln(factor) + 1`` (vLLM's DeepSeek
    class instead reads a missing ``mscale_all_dim`` as 0, giving ``mscale(factor,
    mscale)``); DeepSeek-V2/V3 also multiply the attention's softmax scale by
    ``mscale(factor, mscale_all_dim) ** 2`` in the model, outside this table. Checked
    against an independent float64 transcription of HF's formula in tests/test_rope.py
    (DeepSeek-V3, DeepSeek-V2-Lite, gpt-oss ``truncate: false``).
    """
    beta_fast = 32.0 if beta_fast is None else beta_fast
    beta_slow = 1.0 if beta_slow is None else beta_slow
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim)
        else:
            attention_factor = yarn_get_mscale(factor)

    def correction_dim(num_rotations: float) -> float:
        return rotary_dim * math.log(original_max_position / (num_rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # as HF and vLLM: avoid dividing by zero
    ramp = np.clip((np.arange(rotary_dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    inv_freq = default_inv_freq(rotary_dim, base)
    return inv_freq / factor * ramp + inv_freq * (1.0 - ramp), float(attention_factor)


def longrope_parameters(rotary_dim: int, base: float, short_factor, long_factor, original_max_position: float, *,
                        max_position: int, factor: float | None = None,
                        attention_factor: float | None = None) -> tuple[np.ndarray, float]:
    """LongRoPE (Phi-3/3.5 128k): per-dimension rescaled frequencies and an attention factor.

    ``inv_freq[i] = 1 / (ext[i] * base ** (2 i / rotary_dim))`` with ``ext = long_factor``
    when the table is for sequences longer than the original context (``max_position >
    original_max_position``), else ``short_factor`` (HF's rule with ``seq_len =
    max_position``). The attention factor, unless given, is ``sqrt(1 + ln(s) /
    ln(original_max_position))`` for ``s > 1`` (else 1), ``s`` the ``factor`` if given,
    else ``max_position / original_max_position``: Hugging Face computes ``s`` from
    the config's ``max_position_embeddings``, so a table of that many rows (or the
    ``factor`` key) reproduces it. A model serves short and long prompts with two
    tables, one of ``original_max_position`` rows (short factors) and one of the full
    length (long factors), as vLLM's ``Phi3LongRoPEScaledRotaryEmbedding`` keeps both.

    Source: HF ``_compute_longrope_parameters``; Ding et al., "LongRoPE", 2024
    (arXiv:2402.13753).
    """
    ext = np.asarray(long_factor if max_position > original_max_position else short_factor, dtype=np.float64)
    inv_freq = 1.0 / (ext * float(base) ** (np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim))
    if attention_factor is None:
        scale = factor if factor is not None else max_position / original_max_position
        attention_factor = math.sqrt(1.0 + math.log(scale) / math.log(original_max_position)) if scale > 1 else 1.0
    return inv_freq, float(attention_factor)


def _factor_list(rope_scaling: dict, key: str, length: int) -> np.ndarray:
    """A list of ``length`` finite numbers > 0 (LongRoPE's per-dimension factors)."""
    value = rope_scaling[key]
    try:
        factors = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        factors = None
    if isinstance(value, (str, bytes, dict)) or factors is None or factors.shape != (length,) or \
            not (np.isfinite(factors).all() and (factors > 0).all()):
        got = f"{len(value)} values" if isinstance(value, (list, tuple)) else repr(value)
        raise ValueError(f"rope_scaling[{key!r}]: expected a list of rotary_dim / 2 = {length} finite numbers > 0, "
                         f"got {got}")
    return factors


def rope_type_of(rope_scaling) -> str:
    """The ``rope_type`` of a HF ``rope_scaling`` dict (older configs say ``type``); None -> default.

    Raises:
        ValueError: not a dict, or an unknown type (the message names it and lists the known ones).
    """
    if rope_scaling is None:
        return "default"
    if not isinstance(rope_scaling, dict):
        raise ValueError(f"rope_scaling: expected a dict (a HF config's rope_scaling) or None, got "
                         f"{type(rope_scaling).__name__}")
    kind = rope_scaling.get("rope_type", rope_scaling.get("type", "default"))
    kind = ALIASES.get(kind, kind) if isinstance(kind, str) else kind
    if not isinstance(kind, str) or kind not in REQUIRED_KEYS:
        raise ValueError(f"rope_scaling: unknown rope_type {kind!r}; supported: {', '.join(REQUIRED_KEYS)}")
    return kind


def mrope_parameters(rope_scaling, rotary_dim: int) -> tuple[tuple | None, bool]:
    """``(mrope_section, mrope_interleaved)`` of a HF ``rope_scaling`` dict, for
    :func:`cupykern.apply_rope`'s arguments of the same names: ``(None, False)`` when the
    dict (or None) has no ``mrope_section``.

    ``mrope_section`` splits the rotary half-dimension into temporal, height and width
    sections (Qwen2-VL / Qwen2.5-VL: ``{"type": "mrope", "mrope_section": [16, 24, 24]}``,
    which HF's ``Qwen2VLConfig`` turns into ``rope_type "default"``; Qwen3-VL:
    ``{"rope_type": "default", "mrope_section": [24, 20, 20], "mrope_interleaved": true}``).
    Any rope_type's table may be combined with it (vLLM's ``MRotaryEmbedding`` also
    takes YaRN): the sections only choose which position row gives each index its row
    of the table.

    Raises:
        ValueError: ``rope_scaling['mrope_section']`` not 3 ints >= 0 summing to
            ``rotary_dim / 2``; ``rope_scaling['mrope_interleaved']`` not a bool, or set
            without ``mrope_section``.
    """
    if rope_scaling is None or not isinstance(rope_scaling, dict):
        return None, False
    interleaved = rope_scaling.get("mrope_interleaved", False)
    if not isinstance(interleaved, (bool, np.bool_)):
        raise ValueError(f"rope_scaling['mrope_interleaved']: expected a bool, got {interleaved!r}")
    section = rope_scaling.get("mrope_section")
    if section is None:
        if interleaved:
            raise ValueError("rope_scaling['mrope_interleaved']: true needs rope_scaling['mrope_section']")
        return None, False
    half = rotary_dim // 2
    ok = isinstance(section, (list, tuple)) and len(section) == 3 and all(
        _arrays.is_int(v) and v >= 0 for v in section)
    if not ok or sum(section) != half:
        raise ValueError(f"rope_scaling['mrope_section']: expected 3 ints >= 0 (temporal, height, width) summing "
                         f"to rotary_dim / 2 = {half}, got {section!r}")
    return tuple(int(v) for v in section), bool(interleaved)


def _positive(rope_scaling: dict, key: str, *, allow_zero: bool = False) -> float:
    value = rope_scaling[key]
    try:
        value = float(value) if not isinstance(value, (bool, str)) else float("nan")
    except (TypeError, ValueError, OverflowError):
        value = float("nan")
    if not (math.isfinite(value) and (value > 0 or (allow_zero and value == 0))):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"rope_scaling[{key!r}]: expected a finite number {bound}, got {rope_scaling[key]!r}")
    return value


def _yarn_options(rope_scaling: dict) -> dict:
    """YaRN's optional keys, checked: betas and attention_factor > 0, mscales >= 0 (0 = unset)."""
    options = {}
    for key in ("beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim"):
        if rope_scaling.get(key) is not None:
            options[key] = _positive(rope_scaling, key, allow_zero=key.startswith("mscale"))
    truncate = rope_scaling.get("truncate", True)
    if not isinstance(truncate, (bool, np.bool_)):  # NumPy's bool too, as every other flag
        raise ValueError(f"rope_scaling['truncate']: expected a bool, got {truncate!r}")
    options["truncate"] = bool(truncate)
    return options


def rope_parameters(rotary_dim: int, base: float, rope_scaling=None, *, max_position: int) -> tuple[np.ndarray, float]:
    """``(inv_freq, attention_factor)`` for a HF ``rope_scaling`` dict, float64.

    ``inv_freq`` has ``rotary_dim / 2`` entries; ``max_position`` (the cache length) is
    used by ``"dynamic"`` and ``"longrope"`` (which factor list, and the default
    attention factor) only.

    ``"mrope"`` (Qwen2-VL's name) is ``"default"``; an ``mrope_section`` key (any
    rope_type) is checked (:func:`mrope_parameters`) and does not change the table.

    Raises:
        ValueError: unknown rope_type, missing keys (all named), non-positive or
            non-finite factors, llama3's ``high_freq_factor == low_freq_factor``,
            LongRoPE factor lists not of ``rotary_dim / 2`` positive numbers, LongRoPE's
            ``original_max_position_embeddings`` <= 1 without ``attention_factor``, a bad
            ``mrope_section`` / ``mrope_interleaved``.
    """
    kind = rope_type_of(rope_scaling)
    mrope_parameters(rope_scaling, rotary_dim)  # a bad mrope_section is an error of the config too
    missing = [key for key in REQUIRED_KEYS[kind] if key not in rope_scaling]
    if missing:
        raise ValueError(f"rope_scaling: rope_type {kind!r} needs {', '.join(map(repr, missing))} "
                         f"(missing from {sorted(rope_scaling)})")
    if kind == "longrope":
        half = rotary_dim // 2
        optional = {key: _positive(rope_scaling, key) for key in ("factor", "attention_factor")
                    if rope_scaling.get(key) is not None}
        original = _positive(rope_scaling, "original_max_position_embeddings")
        if original <= 1 and "attention_factor" not in optional:  # the default factor divides by ln(original)
            raise ValueError(f"rope_scaling['original_max_position_embeddings']: longrope's attention factor "
                             f"sqrt(1 + ln(s) / ln(original)) needs a length > 1, got "
                             f"{rope_scaling['original_max_position_embeddings']!r}")
        return longrope_parameters(rotary_dim, base, _factor_list(rope_scaling, "short_factor", half),
                                   _factor_list(rope_scaling, "long_factor", half), original,
                                   max_position=max_position, **optional)
    get = {key: _positive(rope_scaling, key) for key in REQUIRED_KEYS[kind]}
    if kind == "default":
        return default_inv_freq(rotary_dim, base), 1.0
    if kind == "linear":
        return linear_inv_freq(rotary_dim, base, get["factor"]), 1.0
    if kind == "dynamic":
        if rotary_dim <= 2:  # the NTK exponent rotary_dim / (rotary_dim - 2) is undefined
            raise ValueError(f"rope_scaling: dynamic NTK needs rotary_dim > 2, got {rotary_dim}")
        return dynamic_ntk_inv_freq(rotary_dim, base, get["factor"], get["original_max_position_embeddings"],
                                    max_position), 1.0
    if kind == "llama3":
        if get["high_freq_factor"] == get["low_freq_factor"]:
            raise ValueError("rope_scaling: llama3 needs high_freq_factor != low_freq_factor, got both "
                             f"{get['low_freq_factor']}")
        return llama3_inv_freq(rotary_dim, base, get["factor"], get["low_freq_factor"], get["high_freq_factor"],
                               get["original_max_position_embeddings"]), 1.0
    return yarn_parameters(rotary_dim, base, get["factor"], get["original_max_position_embeddings"],
                           **_yarn_options(rope_scaling))


def check_table_args(max_position, rotary_dim, base) -> None:
    """ValueError unless ``max_position`` is in ``[0, 2**31)``, ``rotary_dim`` even in ``[2,
    2**31)`` (the kernels take both as 32-bit arguments; helper 76: 2**62 rows reached
    NumPy's "array is too big"), ``base > 0`` and != 1."""
    if not _arrays.is_int(max_position) or not 0 <= max_position < _arrays.INT32_LIMIT:
        raise ValueError(f"max_position: expected an int in [0, 2**31), got {max_position!r}")
    if not _arrays.is_int(rotary_dim) or not 2 <= rotary_dim < _arrays.INT32_LIMIT or rotary_dim % 2:
        raise ValueError(f"rotary_dim: expected an even int in [2, 2**31), got {rotary_dim!r}")
    try:
        base_value = float(base) if not isinstance(base, (bool, str)) else float("nan")
    except (TypeError, ValueError, OverflowError):
        base_value = float("nan")
    if not (math.isfinite(base_value) and base_value > 0 and base_value != 1):
        raise ValueError(f"base: expected a finite number > 0 and != 1, got {base!r}")


def _table_dtype(dtype) -> np.dtype:
    """``dtype`` as a NumPy floating dtype (bfloat16 included); TypeError naming it for an
    int or bool one, whose table would truncate every value, or what is not a dtype."""
    try:
        table_dtype = np.dtype(dtype)
    except TypeError:
        table_dtype = None
    if table_dtype is None or not (table_dtype.kind == "f" or table_dtype == _dtypes.bfloat16):
        raise TypeError(f"dtype: expected a floating dtype for the cos/sin table, got {dtype!r}")
    return table_dtype


def cos_sin_table(max_position: int, rotary_dim: int, base: float = 10000.0, rope_scaling=None,
                  dtype=np.float64) -> np.ndarray:
    """The ``(max_position, rotary_dim)`` cos/sin cache on the host.

    Row p: ``[cos(p * inv_freq) * a, sin(p * inv_freq) * a]`` (cos in the first
    ``rotary_dim / 2`` columns), ``a`` the attention factor (1 except YaRN and
    LongRoPE), angles and
    products in float64, rounded once to ``dtype``. vLLM's and FlashInfer's
    ``cos_sin_cache`` layout.

    Raises:
        ValueError: as :func:`check_table_args` and :func:`rope_parameters`; and naming
            ``rope_scaling`` where its values leave no finite frequencies or attention
            factor, or a table that is not finite in ``dtype``.
        TypeError: ``dtype`` not a floating dtype (an int or bool table would truncate).
    """
    check_table_args(max_position, rotary_dim, base)
    dtype = _table_dtype(dtype)
    try:  # first: rope_parameters' rotary_dim / 2 frequencies of a table too large take as long
        table = np.empty((max_position, rotary_dim), dtype=dtype)
    except (MemoryError, ValueError):  # past the host's memory, or NumPy's size limit
        raise MemoryError(f"the cos/sin table of max_position {max_position} x rotary_dim {rotary_dim} "
                          f"({dtype.name}, {max_position * rotary_dim * dtype.itemsize} bytes) "
                          "does not fit in host memory") from None
    try:
        inv_freq, attention_factor = rope_parameters(rotary_dim, float(base), rope_scaling, max_position=max_position)
    except (OverflowError, ZeroDivisionError) as exc:  # helper 71: a yarn beta of 5e-324, a factor of 1e200
        raise ValueError(f"rope_scaling: its values overflow the frequencies ({exc}); got {rope_scaling!r}") from None
    except ValueError as exc:
        if "math domain error" not in str(exc):  # rope_parameters' own messages name the key
            raise
        raise ValueError(f"rope_scaling: its values leave the frequencies undefined ({exc}); "
                         f"got {rope_scaling!r}") from None
    if not (np.isfinite(inv_freq).all() and np.isfinite(attention_factor)):  # a linear factor of 1e-308
        raise ValueError(f"rope_scaling: its values give frequencies or an attention factor that are not finite; "
                         f"got {rope_scaling!r}")
    half = rotary_dim // 2
    for start in range(0, max_position, _CHUNK_ROWS):
        stop = min(start + _CHUNK_ROWS, max_position)
        with np.errstate(over="ignore", invalid="ignore"):  # checked just below, by name
            angles = np.arange(start, stop, dtype=np.float64)[:, None] * inv_freq[None, :]
            table[start:stop, :half] = np.cos(angles) * attention_factor
            table[start:stop, half:] = np.sin(angles) * attention_factor
        if not np.isfinite(table[start:stop]).all():  # an attention factor past the dtype's range
            raise ValueError(f"rope_scaling: the cos/sin table is not finite in {np.dtype(dtype).name} "
                             f"(attention factor {attention_factor:g}); got {rope_scaling!r}")
    return table
