"""Model presets: the shapes and constants of real models, from their published configs.

Each preset copies the fields of a Hugging Face ``config.json`` that the kernels care
about (the repo id is in the comment above it and in ``hf_repo``): ``hidden_size``
(norms), ``intermediate_size`` (the gated activation's d), attention heads, key/value
heads and ``head_dim`` (RoPE), ``rope_theta`` and ``rope_scaling`` (the cos/sin cache),
``rms_norm_eps``, the activation, the RMSNorm weight offset (Gemma's ``1 + w``) and
QK-norm (Qwen3). ``cupykern sweep --model NAME`` takes its sizes and op constants from
here; ``cupykern models`` lists them.

Pure Python, no GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The preset ``cupykern sweep`` uses when no ``--model`` is given.
DEFAULT_MODEL = "llama-3.1-8b"
#: num_tokens of a default `cupykern sweep` and of bench/peers.py: decode (1-64) to prefill.
NUM_TOKENS_LADDER = (1, 16, 64, 256, 1024, 4096, 16384)

#: Activation of the gated MLP -> (registry op, ``approximate`` of gelu_and_mul).
ACTIVATIONS = {"silu": ("silu_and_mul", None), "gelu_tanh": ("gelu_and_mul", "tanh")}


@dataclass(frozen=True)
class ModelPreset:
    """What the kernels need to know about one model (one decoder layer's shapes).

    Attributes:
        name: the CLI name (``"llama-3.1-8b"``).
        hf_repo: the Hugging Face repo whose ``config.json`` the numbers come from.
        hidden_size, intermediate_size, num_attention_heads, num_key_value_heads,
            head_dim, num_hidden_layers, max_position_embeddings, rope_theta,
            rms_norm_eps: as in the config (``head_dim`` = hidden / heads where the
            config leaves it out).
        rope_scaling_items: the config's ``rope_scaling`` dict as sorted (key, value)
            pairs (hashable); :attr:`rope_scaling` gives the dict back, or None.
        partial_rotary_factor: fraction of head_dim that is rotated (1.0: all).
        activation: ``"silu"`` (SwiGLU) or ``"gelu_tanh"`` (GeGLU, HF ``gelu_pytorch_tanh``).
        norm_weight_offset: added to every RMSNorm weight (1.0 for Gemma's ``x * (1 + w)``).
        qk_norm: per-head RMSNorm of q and k before RoPE (Qwen3).
        notes: what the preset leaves out or the kernels do not support.
    """

    name: str
    hf_repo: str
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_hidden_layers: int
    max_position_embeddings: int
    rope_theta: float
    rms_norm_eps: float
    rope_scaling_items: tuple = ()
    partial_rotary_factor: float = 1.0
    activation: str = "silu"
    norm_weight_offset: float = 0.0
    qk_norm: bool = False
    notes: str = ""

    @property
    def rope_scaling(self) -> dict | None:
        """The config's ``rope_scaling`` as a new dict (what ``rope_cos_sin_cache`` takes), or None."""
        return dict(self.rope_scaling_items) if self.rope_scaling_items else None

    @property
    def rope_type(self) -> str:
        scaling = self.rope_scaling or {}
        return str(scaling.get("rope_type", scaling.get("type", "default")))

    @property
    def rotary_dim(self) -> int:
        return self.rotary_dim_for(self.head_dim)

    def rotary_dim_for(self, head_dim: int) -> int:
        """Rotated dims of a head of ``head_dim``: ``head_dim * partial_rotary_factor``, even."""
        rotary = int(head_dim * self.partial_rotary_factor)
        return rotary - rotary % 2

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def activation_op(self) -> str:
        return ACTIVATIONS[self.activation][0]

    @property
    def gelu_approximate(self) -> str:
        """``approximate`` for gelu_and_mul: ``"tanh"`` for GeGLU models, else ``"none"``."""
        return ACTIVATIONS[self.activation][1] or "none"


def _scaling(**items) -> tuple:
    return tuple(sorted(items.items()))


_LLAMA3_SCALING = _scaling(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                           original_max_position_embeddings=8192)

PRESETS: dict[str, ModelPreset] = {p.name: p for p in (
    # meta-llama/Llama-3.1-8B config.json
    ModelPreset("llama-3.1-8b", "meta-llama/Llama-3.1-8B", hidden_size=4096, intermediate_size=14336,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, num_hidden_layers=32,
                max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
                rope_scaling_items=_LLAMA3_SCALING),
    # meta-llama/Llama-3.1-70B config.json
    ModelPreset("llama-3.1-70b", "meta-llama/Llama-3.1-70B", hidden_size=8192, intermediate_size=28672,
                num_attention_heads=64, num_key_value_heads=8, head_dim=128, num_hidden_layers=80,
                max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
                rope_scaling_items=_LLAMA3_SCALING),
    # mistralai/Mistral-7B-v0.1 config.json
    ModelPreset("mistral-7b", "mistralai/Mistral-7B-v0.1", hidden_size=4096, intermediate_size=14336,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, num_hidden_layers=32,
                max_position_embeddings=32768, rope_theta=10000.0, rms_norm_eps=1e-5,
                notes="v0.1: sliding window 4096 (attention only). v0.2/v0.3 have the same shapes with "
                      "rope_theta 1e6 and no sliding window."),
    # Qwen/Qwen2.5-7B config.json
    ModelPreset("qwen2.5-7b", "Qwen/Qwen2.5-7B", hidden_size=3584, intermediate_size=18944,
                num_attention_heads=28, num_key_value_heads=4, head_dim=128, num_hidden_layers=28,
                max_position_embeddings=131072, rope_theta=1000000.0, rms_norm_eps=1e-6,
                notes="q/k/v projections have a bias (outside these kernels). The model card's optional "
                      "YaRN (factor 4) for long inputs is not in config.json and not applied here."),
    # Qwen/Qwen3-8B config.json
    ModelPreset("qwen3-8b", "Qwen/Qwen3-8B", hidden_size=4096, intermediate_size=12288,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, num_hidden_layers=36,
                max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6, qk_norm=True,
                notes="QK-norm: per-head RMSNorm of q and k (eps = rms_norm_eps) before RoPE, "
                      "which qk_rms_norm_rope fuses."),
    # google/gemma-2-9b config.json
    ModelPreset("gemma-2-9b", "google/gemma-2-9b", hidden_size=3584, intermediate_size=14336,
                num_attention_heads=16, num_key_value_heads=8, head_dim=256, num_hidden_layers=42,
                max_position_embeddings=8192, rope_theta=10000.0, rms_norm_eps=1e-6,
                activation="gelu_tanh", norm_weight_offset=1.0,
                notes="heads x head_dim = 4096 != hidden_size 3584. RMSNorm scales by (1 + w) "
                      "(weight_offset=1.0), GeGLU with gelu_pytorch_tanh. Not covered here: logit "
                      "soft-capping (attention 50, final 30), query_pre_attn_scalar, the extra "
                      "post-attention/post-feedforward norms (same rms_norm op), sliding window 4096."),
    # microsoft/Phi-3-mini-4k-instruct config.json
    ModelPreset("phi-3-mini", "microsoft/Phi-3-mini-4k-instruct", hidden_size=3072, intermediate_size=8192,
                num_attention_heads=32, num_key_value_heads=32, head_dim=96, num_hidden_layers=32,
                max_position_embeddings=4096, rope_theta=10000.0, rms_norm_eps=1e-5,
                notes="The 4k model rotates the whole head (no partial_rotary_factor, rope_scaling null). "
                      "The 128k variant (microsoft/Phi-3-mini-128k-instruct, same shapes) uses rope_scaling "
                      "type 'longrope' (per-dimension short/long factors), which rope_cos_sin_cache takes "
                      "(with the config's original_max_position_embeddings put in the dict); it has no "
                      "preset here yet. Fused qkv_proj and gate_up_proj (gate first, as silu_and_mul expects)."),
    # HuggingFaceTB/SmolLM2-135M config.json
    ModelPreset("smollm2-135m", "HuggingFaceTB/SmolLM2-135M", hidden_size=576, intermediate_size=1536,
                num_attention_heads=9, num_key_value_heads=3, head_dim=64, num_hidden_layers=30,
                max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5,
                notes="Llama architecture; tied embeddings. Row sizes (576 = 72 bf16 vectors) are small: "
                      "decode sizes are launch-bound."),
)}


def names() -> list[str]:
    return list(PRESETS)


def get(name: str) -> ModelPreset:
    """The preset called ``name`` (case-insensitive).

    Raises:
        KeyError: unknown name; the message lists the known ones.
    """
    preset = PRESETS.get(str(name).lower())
    if preset is None:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(PRESETS)}")
    return preset
