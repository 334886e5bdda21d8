"""CPU: model presets (cupykern/models.py) and the model-aware registry inputs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cupykern import _dtypes, models, reference, rope_scaling
from cupykern.registry import MODEL_SIZES, all_specs

#: Presets whose heads x head_dim differ from hidden_size (config gives head_dim explicitly).
DECOUPLED_HEAD_DIM = {"gemma-2-9b"}

REQUIRED = ("llama-3.1-8b", "llama-3.1-70b", "mistral-7b", "qwen2.5-7b", "qwen3-8b", "gemma-2-9b", "phi-3-mini",
            "smollm2-135m")


def test_required_presets_and_default():
    assert set(REQUIRED) <= set(models.names())
    assert models.DEFAULT_MODEL == "llama-3.1-8b"
    assert models.get("LLaMA-3.1-8B") is models.PRESETS["llama-3.1-8b"]
    with pytest.raises(KeyError, match="known: llama-3.1-8b"):
        models.get("gpt-5")


@pytest.mark.parametrize("name", models.names())
def test_preset_is_consistent(name):
    p = models.get(name)
    assert p.num_attention_heads % p.num_key_value_heads == 0
    if name not in DECOUPLED_HEAD_DIM:
        assert p.num_attention_heads * p.head_dim == p.hidden_size
    assert p.head_dim % 2 == 0 and 2 <= p.rotary_dim <= p.head_dim
    assert p.activation in models.ACTIVATIONS
    assert p.hf_repo.count("/") == 1
    assert 0 < p.rms_norm_eps < 1e-3 and p.rope_theta > 1
    hash(p)  # frozen and hashable (rope_scaling is stored as items)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.hidden_size = 1
    # Every preset's rope scaling is one rope_cos_sin_cache understands.
    inv_freq, _ = rope_scaling.rope_parameters(p.rotary_dim, p.rope_theta, p.rope_scaling,
                                               max_position=p.max_position_embeddings)
    assert inv_freq.shape == (p.rotary_dim // 2,)


def test_llama_3_1_8b_numbers():
    p = models.get("llama-3.1-8b")
    assert (p.hidden_size, p.intermediate_size, p.num_attention_heads, p.num_key_value_heads, p.head_dim) == \
        (4096, 14336, 32, 8, 128)
    assert p.rope_theta == 500000.0 and p.rms_norm_eps == 1e-5
    assert p.rope_scaling == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 8192}
    p.rope_scaling["factor"] = 1.0  # a copy: the preset cannot be changed through it
    assert p.rope_scaling["factor"] == 8.0


def test_model_specific_fields():
    gemma = models.get("gemma-2-9b")
    assert gemma.norm_weight_offset == 1.0 and gemma.activation == "gelu_tanh" and gemma.gelu_approximate == "tanh"
    assert gemma.activation_op == "gelu_and_mul"
    assert models.get("qwen3-8b").qk_norm and not models.get("qwen2.5-7b").qk_norm
    assert "longrope" in models.get("phi-3-mini").notes
    assert models.get("llama-3.1-8b").gelu_approximate == "none"
    half = dataclasses.replace(models.get("phi-3-mini"), partial_rotary_factor=0.5)
    assert half.rotary_dim == 48 and half.rotary_dim_for(10) == 4


def test_rotary_dim_for_takes_head_dims_the_kernels_take():
    """Helper 76: 0 gave 0, -1 gave -2, True gave 0, 4096.0 and 2**70 passed."""
    preset = models.get("llama-3.1-8b")
    assert preset.rotary_dim_for(128) == 128 and preset.rotary_dim_for(np.int64(64)) == 64
    for bad in (0, -1, True, 4096.0, 2**70, None, "128"):
        with pytest.raises(ValueError, match=r"head_dim: expected an int in \[1, 2147483647\]"):
            preset.rotary_dim_for(bad)


def test_spec_sizes_from_model():
    specs, p = all_specs(), models.get("qwen2.5-7b")
    # Sizes a preset does not give (the vocabulary, a history length) stay at the check size.
    given = {s.size_name for s in specs.values()} & set(MODEL_SIZES)
    assert given == {"hidden_size", "d", "head_dim"}
    assert specs["sample_tokens"].size_for_model(p) == specs["sample_tokens"].check_sizes[0]
    assert specs["rms_norm"].size_for_model(p) == 3584
    assert specs["softmax"].size_for_model(p) == 3584
    assert specs["silu_and_mul"].size_for_model(p) == 18944
    assert specs["apply_rope"].size_for_model(p) == 128
    assert specs["apply_rope"].size_error(7) and specs["apply_rope"].size_error(0)
    assert specs["rms_norm"].size_error(7) is None and specs["rms_norm"].size_error(0)


def test_for_model_binds_only_model_aware_specs():
    specs, p = all_specs(), models.get("gemma-2-9b")
    assert specs["softmax"].for_model(p) is specs["softmax"]
    assert specs["rms_norm"].for_model(None) is specs["rms_norm"]
    assert specs["rms_norm"].for_model(p).make_inputs.keywords == {"model": p}


@pytest.fixture
def host_arrays(monkeypatch):
    """Registry inputs on the host: cupy.asarray -> numpy.asarray (CPU tests of make_inputs)."""
    import cupy

    monkeypatch.setattr(cupy, "asarray", np.asarray)


def test_norm_inputs_take_eps_and_gemma_offset(host_arrays, rng):
    specs = all_specs()
    plain = specs["rms_norm"].make_inputs(rng, 3, 64, _dtypes.float32)
    assert plain["eps"] == 1e-6 and "weight_offset" not in plain  # the standard inputs are unchanged
    gemma = models.get("gemma-2-9b")
    i = specs["rms_norm"].for_model(gemma).make_inputs(rng, 3, 64, _dtypes.float32)
    assert i["eps"] == 1e-6 and i["weight_offset"] == 1.0
    assert abs(float(np.mean(i["weight"]))) < 0.2  # stored around 0, used as 1 + w
    (y,) = specs["rms_norm"].reference(i)
    np.testing.assert_allclose(y, reference.rms_norm(i["x"], i["weight"] + np.float32(1.0), i["eps"]), rtol=1e-6)
    i = specs["fused_add_rms_norm"].for_model(models.get("llama-3.1-8b")).make_inputs(rng, 2, 64, _dtypes.float32)
    assert i["eps"] == 1e-5 and "weight_offset" not in i


def test_gelu_inputs_follow_the_activation(host_arrays, rng):
    spec = all_specs()["gelu_and_mul"]
    assert spec.for_model(models.get("gemma-2-9b")).make_inputs(rng, 2, 8, _dtypes.float32)["approximate"] == "tanh"
    assert spec.for_model(models.get("llama-3.1-8b")).make_inputs(rng, 2, 8, _dtypes.float32)["approximate"] == "none"
    assert "approximate" not in spec.make_inputs(rng, 2, 8, _dtypes.float32)


@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen3-8b", "smollm2-135m"])
def test_rope_inputs_take_heads_and_scaling(host_arrays, rng, name):
    p = models.get(name)
    spec = all_specs()["qk_rms_norm_rope"].for_model(p)
    i = spec.make_inputs(rng, 5, p.head_dim, _dtypes.bfloat16)
    assert i["q"].shape == (5, p.num_attention_heads, p.head_dim)
    assert i["k"].shape == (5, p.num_key_value_heads, p.head_dim)
    assert i["eps"] == p.rms_norm_eps
    rows = min(p.max_position_embeddings, 131072)
    assert i["cos_sin_cache"].shape == (rows, p.rotary_dim) and int(i["positions"].max()) < rows
    expected = rope_scaling.cos_sin_table(rows, p.rotary_dim, p.rope_theta, p.rope_scaling, dtype=np.float32)
    np.testing.assert_array_equal(i["cos_sin_cache"][:64], expected[:64])


def test_long_context_and_vl_presets():
    """phi-3-mini-128k / phi-3.5-mini (LongRoPE) and qwen2.5-vl-7b (M-RoPE), from their config.json."""
    for name, repo in (("phi-3-mini-128k", "microsoft/Phi-3-mini-128k-instruct"),
                       ("phi-3.5-mini", "microsoft/Phi-3.5-mini-instruct")):
        p = models.get(name)
        assert p.hf_repo == repo and p.rope_type == "longrope" and p.rotary_dim == 96
        assert (p.hidden_size, p.intermediate_size, p.num_attention_heads, p.num_key_value_heads) == \
            (3072, 8192, 32, 32)
        assert (p.max_position_embeddings, p.rope_scaling["original_max_position_embeddings"]) == (131072, 4096)
        short, long = p.rope_scaling["short_factor"], p.rope_scaling["long_factor"]
        assert len(short) == len(long) == 48 and all(f > 0 for f in (*short, *long))
        # The attention factor llama.cpp's GGUF of the 128k model records: sqrt(1 + ln(32) / ln(4096)).
        _, attention = rope_scaling.rope_parameters(96, p.rope_theta, p.rope_scaling, max_position=131072)
        assert attention == pytest.approx(1.190238118171692, rel=1e-7)
    assert models.get("phi-3-mini-128k").rope_scaling["long_factor"][:2] == (1.0700000524520874, 1.1200000047683716)
    assert models.get("phi-3.5-mini").rope_scaling["short_factor"][-1] == 2.8399994373321533
    vl = models.get("qwen2.5-vl-7b")
    assert vl.hf_repo == "Qwen/Qwen2.5-VL-7B-Instruct"
    assert (vl.hidden_size, vl.intermediate_size, vl.num_attention_heads, vl.num_key_value_heads, vl.head_dim) == \
        (3584, 18944, 28, 4, 128)
    assert vl.rope_theta == 1e6 and vl.mrope_section == (16, 24, 24) and not vl.mrope_interleaved
    assert rope_scaling.mrope_parameters(vl.rope_scaling, vl.rotary_dim) == ((16, 24, 24), False)
    assert models.get("llama-3.1-8b").mrope_section is None


def test_mrope_preset_inputs_give_three_position_rows(host_arrays, rng):
    p = models.get("qwen2.5-vl-7b")
    spec = all_specs()["apply_rope"]
    assert "qwen2.5-vl-7b" in spec.check_models
    i = spec.for_model(p).make_inputs(rng, 5, 128, _dtypes.bfloat16)
    assert i["positions"].shape == (5, 3) and i["mrope_section"] == (16, 24, 24)
    assert int(i["positions"].max()) < 128000
    q_ref, _ = spec.reference(i)
    want, _ = reference.apply_rope(i["q"], i["k"], i["positions"].T, i["cos_sin_cache"], mrope_section=(16, 24, 24))
    np.testing.assert_array_equal(q_ref, want)
    plain = spec.for_model(models.get("qwen2.5-7b")).make_inputs(rng, 5, 128, _dtypes.bfloat16)
    assert plain["positions"].shape == (5,) and "mrope_section" not in plain
