"""The tokenizer stored in a GGUF, rebuilt with Hugging Face ``tokenizers``; the chat template.

A ``tokenizer.ggml.model == "gpt2"`` vocabulary is byte-level BPE (Radford et al.
2019; Sennrich et al. 2016): ``tokenizer.ggml.tokens`` (id -> byte-level string),
``tokenizer.ggml.merges`` (``"a b"`` in priority order) and
``tokenizer.ggml.token_type`` (3 = control: special tokens, matched whole and never
split). ``tokenizer.ggml.pre`` names llama.cpp's pre-tokenizer regex
(``llama-vocab.cpp``); the ones understood here map to ``tokenizers`` pre-tokenizers:

* ``smollm`` / ``starcoder``: single digits split off (``Digits(individual_digits)``),
  then GPT-2's byte-level regex: as SmolLM2's own ``tokenizer.json``;
* ``gpt-2`` / ``default``: GPT-2's byte-level regex only.

No BOS is added (``tokenizer.ggml.add_bos_token`` is false for SmolLM2; with it true,
one BOS starts the ids even when the text already starts with it). The chat
template (``tokenizer.chat_template``, Jinja) is rendered as Hugging Face
transformers' ``apply_chat_template`` does, in a sandboxed Jinja environment.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cupykern.llm.reference import host_token_ids

#: tokenizer.ggml.token_type value of control (special) tokens (llama.cpp LLAMA_TOKEN_TYPE_CONTROL).
CONTROL = 3
_DIGIT_SPLIT_PRE = ("smollm", "starcoder", "refact")
_PLAIN_PRE = ("gpt-2", "gpt2", "default")


@dataclass
class GGUFTokenizer:
    """A ``tokenizers.Tokenizer`` plus the GGUF's special ids and chat template."""

    tokenizer: object  # tokenizers.Tokenizer
    bos_token_id: int | None
    eos_token_id: int | None
    chat_template: str | None
    add_bos: bool

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (special tokens such as ``<|im_start|>`` recognised).

        BOS is prepended only if the GGUF says ``add_bos_token``, and not when ``text``
        already starts with the BOS token (a rendered chat template that writes
        ``{{ bos_token }}``): the ids start with one BOS either way, as on llama.cpp's
        chat path, which strips the template's leading BOS text before tokenizing with
        BOS (``common/chat.cpp``). A BOS later in the text is kept.
        """
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        bos = self.bos_token_id
        if self.add_bos and bos is not None and ids[:1] != [bos]:
            return [bos] + ids
        return ids

    def decode(self, ids, *, skip_special_tokens: bool = False) -> str:
        """Text of ``ids`` (byte-level decoding; partial UTF-8 sequences become U+FFFD).
        ValueError naming the first id outside [0, vocab size) (the tokenizer itself
        raised OverflowError for -1 and gave "" for 10**9); TypeError for ids that are
        not integers."""
        ids = host_token_ids(ids, "ids")  # one array check: streaming decodes the whole text per token
        outside = np.flatnonzero((ids < 0) | (ids >= self.tokenizer.get_vocab_size()))
        if outside.size:
            raise ValueError(f"ids[{outside[0]}]: expected an id in [0, {self.tokenizer.get_vocab_size()}), got "
                             f"{ids[outside[0]]}")
        return self.tokenizer.decode(ids.tolist(), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], *, add_generation_prompt: bool = True) -> str:
        """The prompt text of a conversation ``[{"role": ..., "content": ...}, ...]``.

        Raises:
            ValueError: the GGUF has no ``tokenizer.chat_template``.
            ImportError: ``jinja2`` is not installed.
        """
        if not self.chat_template:
            raise ValueError("chat template: the GGUF has no tokenizer.chat_template")
        try:
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError as exc:
            raise ImportError("the chat template needs jinja2: pip install -e '.[llm]' in the cupykern checkout "
                              "(or pip install jinja2)") from exc
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        tokens = self.tokenizer.get_vocab()
        inverse = {v: k for k, v in tokens.items()}
        return env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=inverse.get(self.bos_token_id, ""), eos_token=inverse.get(self.eos_token_id, ""))


def _pre_tokenizer(pre: str):
    from tokenizers import pre_tokenizers

    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    if pre in _DIGIT_SPLIT_PRE:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in _PLAIN_PRE:
        return byte_level
    raise ValueError(f"GGUF tokenizer.ggml.pre: unsupported pre-tokenizer {pre!r}; supported: "
                     f"{', '.join(_DIGIT_SPLIT_PRE + _PLAIN_PRE)}")


def load_tokenizer(reader) -> GGUFTokenizer:
    """The tokenizer of an open ``gguf.GGUFReader`` (see the module docstring).

    Raises:
        ImportError: ``tokenizers`` is not installed.
        ValueError: ``tokenizer.ggml.model`` is not ``gpt2`` (byte-level BPE), an unknown
            pre-tokenizer, or a merge that is not two space-separated tokens.
        KeyError: a required tokenizer key is missing.
    """
    try:
        from tokenizers import AddedToken, Tokenizer, decoders, models
    except ImportError as exc:
        raise ImportError("the GGUF tokenizer needs the 'tokenizers' package: pip install -e '.[llm]' in the "
                          "cupykern checkout") from exc
    from cupykern.llm.gguf_weights import field_value

    kind = field_value(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"GGUF tokenizer.ggml.model: expected 'gpt2' (byte-level BPE), got {kind!r}")
    tokens = field_value(reader, "tokenizer.ggml.tokens")
    types = np.asarray(field_value(reader, "tokenizer.ggml.token_type", [1] * len(tokens)))
    merges = []
    for m in field_value(reader, "tokenizer.ggml.merges"):
        parts = m.split(" ")
        if len(parts) != 2:
            raise ValueError(f"GGUF tokenizer.ggml.merges: expected 'left right', got {m!r}")
        merges.append((parts[0], parts[1]))
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tk.pre_tokenizer = _pre_tokenizer(field_value(reader, "tokenizer.ggml.pre", "default"))
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                           for i in np.flatnonzero(types == CONTROL)])

    def opt_int(key):
        value = field_value(reader, key, -1)
        return None if value == -1 else int(value)

    return GGUFTokenizer(tokenizer=tk, bos_token_id=opt_int("tokenizer.ggml.bos_token_id"),
                         eos_token_id=opt_int("tokenizer.ggml.eos_token_id"),
                         chat_template=(str(field_value(reader, "tokenizer.chat_template", ""))
                                        if "tokenizer.chat_template" in reader.fields else None),
                         add_bos=bool(field_value(reader, "tokenizer.ggml.add_bos_token", False)))
