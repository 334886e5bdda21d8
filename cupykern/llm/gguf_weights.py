"""GGUF -> model configuration and dequantised Llama weights on the host.

Reads a GGUF v3 file with the ``gguf`` package (llama.cpp's own Python reader) and
dequantises each tensor with ``gguf.quants.dequantize`` (Q4_1: ``w = d * q + m`` per
block of 32 with fp16 ``d``, ``m``; Q8_0: ``w = d * q``; F32 as stored), giving float32
values, which are then cast to the requested dtype. GGUF lists a tensor's dimensions
innermost first, so a ``[in, out]`` GGUF matrix is the ``(out, in)`` NumPy array of a
``torch.nn.Linear`` weight.

Llama tensor names (llama.cpp ``gguf-py/gguf/constants.py``, ``MODEL_ARCH.LLAMA``):
``token_embd``, ``output_norm``, optional ``output`` (absent: tied to the embedding),
and per block ``blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm,
ffn_gate, ffn_up, ffn_down}``. llama.cpp's converter permutes the rows of ``attn_q``
and ``attn_k`` so that rotary pairs are adjacent dims (2i, 2i+1): the weights here
need ``apply_rope(..., is_neox=False)``.

References: GGUF specification (ggml ``docs/gguf.md``); llama.cpp
``convert_hf_to_gguf.py`` (``LlamaModel.permute``); Touvron et al., "LLaMA", 2023
(arXiv:2302.13971).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cupykern import _arrays


@dataclass(frozen=True)
class LlamaConfig:
    """Sizes and constants of a llama-architecture model, from GGUF metadata."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    context_length: int
    rope_base: float
    rotary_dim: int
    rms_norm_eps: float
    tied_embeddings: bool
    name: str = ""

    @property
    def qkv_size(self) -> int:
        """Rows of the fused QKV weight: ``(num_heads + 2 * num_kv_heads) * head_dim``."""
        return (self.num_heads + 2 * self.num_kv_heads) * self.head_dim


@dataclass
class LayerWeights:
    """One decoder block. Matrices are ``(out_features, in_features)``: ``y = x @ w.T``.

    ``qkv``: ``(qkv_size, hidden)``, rows q (num_heads * head_dim), then k, then v
    (num_kv_heads * head_dim each); ``gate_up``: ``(2 * intermediate, hidden)``, gate
    rows then up rows (the layout ``silu_and_mul`` expects of the product).
    """

    attn_norm: np.ndarray  # (hidden,)
    qkv: np.ndarray  # (qkv_size, hidden)
    o: np.ndarray  # (hidden, num_heads * head_dim)
    ffn_norm: np.ndarray  # (hidden,)
    gate_up: np.ndarray  # (2 * intermediate, hidden)
    down: np.ndarray  # (hidden, intermediate)


@dataclass
class LlamaWeights:
    """All weights of a llama model (NumPy or CuPy arrays, one dtype).

    ``lm_head`` is the same object as ``embed`` when the embeddings are tied.
    """

    config: LlamaConfig
    embed: np.ndarray  # (vocab, hidden)
    layers: list[LayerWeights] = field(default_factory=list)
    final_norm: np.ndarray | None = None  # (hidden,)
    lm_head: np.ndarray | None = None  # (vocab, hidden)


def _gguf():
    try:
        import gguf
    except ImportError as exc:
        raise ImportError("reading GGUF files needs the 'gguf' package: pip install -e '.[llm]' in the cupykern "
                          "checkout (or pip install gguf)") from exc
    return gguf


def open_reader(path):
    """A ``gguf.GGUFReader`` on ``path`` (memory-mapped).

    Raises:
        FileNotFoundError: no such file.
        ValueError: ``path`` is a directory, or the file is truncated or not a GGUF file
            (named, with the reader's own complaint): the reader checks the magic and
            maps every tensor, so a file cut short anywhere fails here.
        ImportError: ``gguf`` is not installed.
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path}: a directory, expected a GGUF file")
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path} (run `cupykern fetch-model smollm2`)")
    gguf = _gguf()
    try:
        return gguf.GGUFReader(str(path))
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        # The reader's own errors ("GGUF magic invalid", NumPy's view and reshape errors
        # past the end of a cut file) do not name the file or say what is wrong with it.
        raise ValueError(f"{path}: truncated or not a GGUF file (reading it failed: {exc})") from exc


def field_value(reader, key: str, default=None):
    """A metadata value (str, number or list) of ``key``; ``default`` if absent, else KeyError."""
    f = reader.fields.get(key)
    if f is None:
        if default is not None:
            return default
        raise KeyError(f"GGUF metadata: missing key {key!r}")
    return f.contents()


def _int_field(reader, key: str, default=None) -> int:
    """``key``'s value, ValueError naming the key unless one whole number >= 1 (GGUF allows
    per-layer arrays of some counts, which this pipeline does not take; a float or a bool
    would pass int() as another count)."""
    value = field_value(reader, key, default)
    if isinstance(value, list):
        raise ValueError(f"GGUF {key}: per-layer values are not supported, expected one int, got "
                         f"{value[:4]}{' ...' if len(value) > 4 else ''}")
    return _arrays.count(_plain(value), f"GGUF {key}", 1)


def _real_field(reader, key: str, default=None, *, zero_allowed: bool) -> float:
    """``key``'s value, ValueError naming the key unless a finite real > 0 (or >= 0)."""
    value = field_value(reader, key, default)
    ok = not isinstance(value, (bool, list)) and isinstance(value, numbers.Real) and math.isfinite(value) and (
        value >= 0 if zero_allowed else value > 0)
    if not ok:
        raise ValueError(f"GGUF {key}: expected a finite value {'>=' if zero_allowed else '>'} 0, got "
                         f"{_plain(value)!r}")
    return float(value)


def _plain(value):
    """A metadata value as read, NumPy scalars as the Python numbers they hold (so that
    messages say 0, not np.uint32(0))."""
    return value.item() if isinstance(value, np.generic) else value


def read_config(reader) -> LlamaConfig:
    """The :class:`LlamaConfig` from a reader's ``llama.*`` metadata.

    Raises:
        ValueError: ``general.architecture`` is not ``llama``; a count is not one int >= 1,
            the RoPE base not finite and > 0, the RMS eps not finite and >= 0, or the
            rotary width not even and within head_dim (each names its key); or the sizes
            disagree (hidden not divisible by heads, heads not a multiple of kv heads).
        KeyError: a required key is missing (named).
    """
    arch = field_value(reader, "general.architecture")
    if arch != "llama":
        raise ValueError(f"GGUF general.architecture: expected 'llama', got {arch!r}")
    hidden = _int_field(reader, "llama.embedding_length")
    heads = _int_field(reader, "llama.attention.head_count")
    kv_heads = _int_field(reader, "llama.attention.head_count_kv", heads)
    if hidden % heads or heads % kv_heads:
        raise ValueError(f"GGUF llama sizes: hidden {hidden}, heads {heads}, kv heads {kv_heads} do not divide")
    head_dim = _int_field(reader, "llama.attention.key_length", hidden // heads)
    rotary_dim = _int_field(reader, "llama.rope.dimension_count", head_dim)
    if rotary_dim % 2 or rotary_dim > head_dim:
        raise ValueError(f"GGUF llama.rope.dimension_count: expected an even width up to the head_dim "
                         f"{head_dim}, got {rotary_dim}")
    names = {t.name for t in reader.tensors}
    vocab = (_int_field(reader, "llama.vocab_size") if "llama.vocab_size" in reader.fields
             else len(field_value(reader, "tokenizer.ggml.tokens")))
    if field_value(reader, "llama.rope.scaling.type", "none") not in ("none",):
        raise ValueError("GGUF llama.rope.scaling.type: RoPE scaling is not supported by this pipeline")
    return LlamaConfig(
        num_layers=_int_field(reader, "llama.block_count"),
        hidden_size=hidden, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        intermediate_size=_int_field(reader, "llama.feed_forward_length"),
        vocab_size=vocab,
        context_length=_int_field(reader, "llama.context_length"),
        rope_base=_real_field(reader, "llama.rope.freq_base", 10000.0, zero_allowed=False),
        rotary_dim=rotary_dim,
        rms_norm_eps=_real_field(reader, "llama.attention.layer_norm_rms_epsilon", zero_allowed=True),
        tied_embeddings="output.weight" not in names,
        name=str(field_value(reader, "general.name", "")),
    )


class _Tensors:
    """Dequantised tensors of a reader by name, with shape checks."""

    def __init__(self, reader, dtype):
        self._by_name = {t.name: t for t in reader.tensors}
        self._dtype = np.dtype(dtype)
        self._gguf = _gguf()

    def get(self, name: str, shape: tuple) -> np.ndarray:
        t = self._by_name.get(name)
        if t is None:
            raise KeyError(f"GGUF: missing tensor {name!r}")
        values = self._gguf.quants.dequantize(t.data, t.tensor_type)
        if tuple(values.shape) != tuple(shape):
            raise ValueError(f"GGUF tensor {name} ({t.tensor_type.name}): expected shape {tuple(shape)}, "
                             f"got {tuple(values.shape)}")
        return np.ascontiguousarray(values, dtype=self._dtype)


def tensor_types(reader) -> dict[str, str]:
    """``{tensor name: ggml type name}`` (e.g. ``'Q4_1'``), for reports and tests."""
    return {t.name: t.tensor_type.name for t in reader.tensors}


def load_weights(path, dtype=np.float32, *, reader=None) -> LlamaWeights:
    """Dequantised weights of a llama GGUF on the host, q/k/v and gate/up fused.

    Parameters:
        path: the ``.gguf`` file (ignored when ``reader`` is given).
        dtype: NumPy dtype of the returned arrays: float32 (the dequantised values
            exactly) or float64 (the reference forward).
        reader: an open ``gguf.GGUFReader`` to reuse.

    Returns:
        :class:`LlamaWeights` of C-contiguous arrays (shapes in :class:`LayerWeights`).
        For SmolLM2-135M: embed ``(49152, 576)``, qkv ``(960, 576)``, o ``(576, 576)``,
        gate_up ``(3072, 576)``, down ``(576, 1536)``, 30 layers, tied lm_head.

    Raises:
        FileNotFoundError: no such file. ImportError: ``gguf`` not installed.
        KeyError: a tensor or metadata key is missing (named). ValueError: a tensor
        of unexpected shape (named, expected vs got), a non-llama architecture, bad
        metadata (:func:`read_config`), ``dtype`` not float32 or float64.
    """
    try:  # int8 would be taken and cast to, "bogus" would fail in NumPy's words
        host_dtype = np.dtype(dtype)
    except TypeError:
        host_dtype = None
    if host_dtype is None or host_dtype not in (np.float32, np.float64):
        raise ValueError(f"dtype: expected float32 or float64, got {dtype!r}")
    reader = reader if reader is not None else open_reader(path)
    cfg = read_config(reader)
    t = _Tensors(reader, host_dtype)
    h, d, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    embed = t.get("token_embd.weight", (cfg.vocab_size, h))
    weights = LlamaWeights(config=cfg, embed=embed, final_norm=t.get("output_norm.weight", (h,)),
                           lm_head=embed if cfg.tied_embeddings else t.get("output.weight", (cfg.vocab_size, h)))
    for n in range(cfg.num_layers):
        p = f"blk.{n}."
        qkv = np.concatenate([t.get(p + "attn_q.weight", (cfg.num_heads * d, h)),
                              t.get(p + "attn_k.weight", (cfg.num_kv_heads * d, h)),
                              t.get(p + "attn_v.weight", (cfg.num_kv_heads * d, h))])
        gate_up = np.concatenate([t.get(p + "ffn_gate.weight", (i, h)), t.get(p + "ffn_up.weight", (i, h))])
        weights.layers.append(LayerWeights(
            attn_norm=t.get(p + "attn_norm.weight", (h,)), qkv=qkv,
            o=t.get(p + "attn_output.weight", (h, cfg.num_heads * d)),
            ffn_norm=t.get(p + "ffn_norm.weight", (h,)), gate_up=gate_up,
            down=t.get(p + "ffn_down.weight", (h, i))))
    return weights
