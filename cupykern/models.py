"""Model presets: the shapes and constants of real models, from their published configs.

Each preset copies the fields of a Hugging Face ``config.json`` that the kernels care
about (the repo id is in the comment above it and in ``hf_repo``): ``hidden_size``
(norms), ``intermediate_size`` (the gated activation's d), attention heads, key/value
heads and ``head_dim`` (RoPE), ``rope_theta`` and ``rope_scaling`` (the cos/sin cache;
LongRoPE's factor lists and M-RoPE's ``mrope_section`` as tuples, so a preset hashes),
``rms_norm_eps``, the activation, the RMSNorm weight offset (Gemma's ``1 + w``) and
QK-norm (Qwen3). ``cupykern sweep --model NAME`` takes its sizes and op constants from
here; ``cupykern models`` lists them.

Pure Python, no GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from cupykern import _arrays

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
    def mrope_section(self) -> tuple | None:
        """M-RoPE's (temporal, height, width) split of rotary_dim / 2 (Qwen2-VL family), or None."""
        section = (self.rope_scaling or {}).get("mrope_section")
        return tuple(section) if section is not None else None

    @property
    def mrope_interleaved(self) -> bool:
        """Qwen3-VL's interleaved M-RoPE layout (``rope_scaling["mrope_interleaved"]``)."""
        return bool((self.rope_scaling or {}).get("mrope_interleaved", False))

    @property
    def rotary_dim(self) -> int:
        return self.rotary_dim_for(self.head_dim)

    def rotary_dim_for(self, head_dim: int) -> int:
        """Rotated dims of a head of ``head_dim``: ``head_dim * partial_rotary_factor``, even.

        Raises ValueError (naming ``head_dim``) unless it is an int >= 1 below 2**31, as
        the kernels take (helper 76: 0, -1, True and 4096.0 were taken).
        """
        head_dim = _arrays.count(head_dim, "head_dim", 1, _arrays.INT32_LIMIT - 1)
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

# LongRoPE factors of microsoft/Phi-3-mini-128k-instruct's config.json (the July 2024 update; rope_scaling
# type "longrope"); 48 = rotary_dim / 2 each. Copied from a Microsoft evaluation script's LONGROPE_PARAMS
# found through the search index; its first 16 and last 7 long factors and first 5 / last 3 short factors
# agree with an excerpt of that config.json quoted in llama.cpp notes (the HF file itself was not reachable).
_PHI3_MINI_128K_LONG = (
    1.0700000524520874, 1.1200000047683716, 1.149999976158142, 1.4199999570846558, 1.5699999332427979,
    1.7999999523162842, 2.129999876022339, 2.129999876022339, 3.009999990463257, 5.910000324249268,
    6.950000286102295, 9.070000648498535, 9.930000305175781, 10.710000038146973, 11.130000114440918,
    14.609999656677246, 15.409998893737793, 19.809999465942383, 37.279998779296875, 38.279998779296875,
    38.599998474121094, 40.12000274658203, 46.20000457763672, 50.940006256103516, 53.66000747680664,
    54.9373893737793, 56.89738845825195, 57.28738784790039, 59.98738479614258, 60.86738586425781,
    60.887386322021484, 61.71739196777344, 62.91739273071289, 62.957393646240234, 63.41739273071289,
    63.8173942565918, 63.83739471435547, 63.897396087646484, 63.93739700317383, 64.06739807128906,
    64.11434936523438, 64.12435150146484, 64.15435028076172, 64.19435119628906, 64.24435424804688,
    64.57435607910156, 64.69000244140625, 64.76000213623047)
_PHI3_MINI_128K_SHORT = (
    1.1, 1.1, 1.1, 1.3000000000000003, 1.3500000000000003, 1.3500000000000003, 1.4000000000000004,
    1.5500000000000005, 2.000000000000001, 2.000000000000001, 2.000000000000001, 2.000000000000001,
    2.000000000000001, 2.000000000000001, 2.000000000000001, 2.000000000000001, 2.000000000000001,
    2.000000000000001, 2.000000000000001, 2.000000000000001, 2.000000000000001, 2.000000000000001,
    2.000000000000001, 2.000000000000001, 2.000000000000001, 2.0500000000000007, 2.0500000000000007,
    2.0500000000000007, 2.0500000000000007, 2.0500000000000007, 2.0500000000000007, 2.1000000000000005,
    2.1000000000000005, 2.1500000000000004, 2.25, 2.25, 2.25, 2.25, 2.25, 2.3999999999999995,
    2.4499999999999993, 2.499999999999999, 2.6999999999999984, 2.6999999999999984, 2.7499999999999982,
    2.799999999999998, 2.8999999999999977, 3.049999999999997)
# microsoft/Phi-3.5-mini-instruct config.json (rope_scaling type "longrope"): two identical copies of that
# config.json found through the search index (an ONNX export recipe and a thunder benchmark config).
_PHI35_MINI_LONG = (
    1.0800000429153442, 1.1100000143051147, 1.1399999856948853, 1.340000033378601, 1.5899999141693115,
    1.600000023841858, 1.6200000047683716, 2.620000123977661, 3.2300000190734863, 3.2300000190734863,
    4.789999961853027, 7.400000095367432, 7.700000286102295, 9.09000015258789, 12.199999809265137,
    17.670000076293945, 24.46000099182129, 28.57000160217285, 30.420001983642578, 30.840002059936523,
    32.590003967285156, 32.93000411987305, 42.320003509521484, 44.96000289916992, 50.340003967285156,
    50.45000457763672, 57.55000305175781, 57.93000411987305, 58.21000289916992, 60.1400032043457,
    62.61000442504883, 62.62000274658203, 62.71000289916992, 63.1400032043457, 63.1400032043457,
    63.77000427246094, 63.93000411987305, 63.96000289916992, 63.970001220703125, 64.02999877929688,
    64.06999969482422, 64.08000183105469, 64.12000274658203, 64.41000366210938, 64.4800033569336,
    64.51000213623047, 64.52999877929688, 64.83999633789062)
_PHI35_MINI_SHORT = (
    1.0, 1.0199999809265137, 1.0299999713897705, 1.0299999713897705, 1.0499999523162842, 1.0499999523162842,
    1.0499999523162842, 1.0499999523162842, 1.0499999523162842, 1.0699999332427979, 1.0999999046325684,
    1.1099998950958252, 1.1599998474121094, 1.1599998474121094, 1.1699998378753662, 1.2899998426437378,
    1.339999794960022, 1.679999828338623, 1.7899998426437378, 1.8199998140335083, 1.8499997854232788,
    1.8799997568130493, 1.9099997282028198, 1.9399996995925903, 1.9899996519088745, 2.0199997425079346,
    2.0199997425079346, 2.0199997425079346, 2.0199997425079346, 2.0199997425079346, 2.0199997425079346,
    2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914,
    2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0799996852874756,
    2.0899996757507324, 2.189999580383301, 2.2199995517730713, 2.5899994373321533, 2.729999542236328,
    2.749999523162842, 2.8399994373321533)

#: Phi-3's configs keep original_max_position_embeddings (4096) beside rope_scaling, and HF and vLLM take
#: the attention factor's scale from max_position_embeddings / original (131072 / 4096 = 32) whatever the
#: table's length: the preset puts both in the dict, where rope_cos_sin_cache reads them.
_PHI_128K_NOTES = ("LongRoPE ('longrope'): the config's original_max_position_embeddings 4096 and the scale "
                   "factor 32 (max_position_embeddings / original, as HF and vLLM compute it) are put in the "
                   "rope_scaling dict. Every table gets the attention factor sqrt(1 + ln(32) / ln(4096)) = 1.19; "
                   "a table of more than 4096 rows uses the long factors, one of at most 4096 the short ones "
                   "(vLLM keeps both and picks by sequence length). Same shapes as phi-3-mini; fused qkv_proj and "
                   "gate_up_proj; sliding_window 262144 (attention only).")

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
                      "The 128k variant, with LongRoPE ('longrope') scaling, is the phi-3-mini-128k preset. "
                      "Fused qkv_proj and gate_up_proj (gate first, as silu_and_mul expects)."),
    # microsoft/Phi-3-mini-128k-instruct config.json
    ModelPreset("phi-3-mini-128k", "microsoft/Phi-3-mini-128k-instruct", hidden_size=3072, intermediate_size=8192,
                num_attention_heads=32, num_key_value_heads=32, head_dim=96, num_hidden_layers=32,
                max_position_embeddings=131072, rope_theta=10000.0, rms_norm_eps=1e-5,
                rope_scaling_items=_scaling(type="longrope", short_factor=_PHI3_MINI_128K_SHORT,
                                            long_factor=_PHI3_MINI_128K_LONG, original_max_position_embeddings=4096,
                                            factor=32.0),
                notes=_PHI_128K_NOTES),
    # microsoft/Phi-3.5-mini-instruct config.json
    ModelPreset("phi-3.5-mini", "microsoft/Phi-3.5-mini-instruct", hidden_size=3072, intermediate_size=8192,
                num_attention_heads=32, num_key_value_heads=32, head_dim=96, num_hidden_layers=32,
                max_position_embeddings=131072, rope_theta=10000.0, rms_norm_eps=1e-5,
                rope_scaling_items=_scaling(type="longrope", short_factor=_PHI35_MINI_SHORT,
                                            long_factor=_PHI35_MINI_LONG, original_max_position_embeddings=4096,
                                            factor=32.0),
                notes=_PHI_128K_NOTES),
    # Qwen/Qwen2.5-VL-7B-Instruct config.json (the text decoder; the vision tower is not covered)
    ModelPreset("qwen2.5-vl-7b", "Qwen/Qwen2.5-VL-7B-Instruct", hidden_size=3584, intermediate_size=18944,
                num_attention_heads=28, num_key_value_heads=4, head_dim=128, num_hidden_layers=28,
                max_position_embeddings=128000, rope_theta=1000000.0, rms_norm_eps=1e-6,
                rope_scaling_items=_scaling(type="mrope", mrope_section=(16, 24, 24)),
                notes="M-RoPE: rope_scaling type 'mrope' (HF: 'default') with mrope_section [16, 24, 24]: "
                      "apply_rope takes positions (3, num_tokens) (temporal, height, width) with "
                      "mrope_section=(16, 24, 24); text tokens have three equal rows (plain RoPE). q/k/v "
                      "projections have a bias (outside these kernels); the vision tower (2-D RoPE, window "
                      "attention) is not covered."),
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
