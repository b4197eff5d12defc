"""Model specs: parameter counts against published sizes; HuggingFace config loading."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cost_models import MODELS, resolve_model
from cost_models.hf_config import model_from_hf_config
from cost_models.model import ModelSpec


@pytest.mark.parametrize(
    ("name", "billions"),
    [
        ("gpt3-175b", 174.6),
        ("llama3-8b", 8.03),
        ("llama3-70b", 70.55),
        ("llama3.1-405b", 405.85),
        ("mixtral-8x7b", 46.7),
        ("megatron-1t", 1008.0),
        ("megatron-529.6b", 529.6),
        ("megatron-39.1b", 39.1),
    ],
)
def test_parameter_counts_match_published(name, billions):
    assert MODELS[name].num_params / 1e9 == pytest.approx(billions, abs=0.06)


def test_moe_active_params():
    assert MODELS["mixtral-8x7b"].active_params / 1e9 == pytest.approx(12.9, abs=0.05)
    # DeepSeekMoE 16B (arXiv 2401.06066): 16.4B parameters, 2.8B activated per token.
    deepseek = MODELS["deepseek-moe-16b"]
    assert (deepseek.num_params / 1e9, deepseek.active_params / 1e9) == (
        pytest.approx(16.4, abs=0.05),
        pytest.approx(2.8, abs=0.05),
    )
    assert len(deepseek.kinds) == 2 and not deepseek.is_moe_layer(0) and deepseek.is_moe_layer(1)


@given(
    layers=st.integers(1, 60),
    freq=st.integers(1, 4),
    first=st.integers(0, 5),
    start=st.integers(0, 60),
    length=st.integers(0, 60),
)
def test_count_moe_layers_matches_brute_force(layers, freq, first, start, length):
    m = MODELS["mixtral-8x7b"].model_copy(
        update={"num_layers": layers, "moe_layer_freq": freq, "moe_first_dense_layers": first}
    )
    stop = min(start + length, layers)
    assert m.count_moe_layers(start, stop) == sum(m.is_moe_layer(i) for i in range(start, stop))


LLAMA_CFG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
}


def test_hf_llama_config_equals_catalogue(tmp_path):
    d = tmp_path / "Meta-Llama-3-70B"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(LLAMA_CFG))
    m = resolve_model(str(d / "config.json"))
    assert m.name == "Meta-Llama-3-70B"
    assert m.model_dump(exclude={"name"}) == MODELS["llama3-70b"].model_dump(exclude={"name"})


def test_hf_gelu_means_two_matrices_and_text_config_nesting():
    cfg = {"text_config": {**LLAMA_CFG, "hidden_act": "gelu", "head_dim": 256}}
    m = model_from_hf_config(cfg, "mm")
    assert not m.gated_mlp and m.mlp_matrices == 2 and m.head_dim == 256


def test_hf_mixtral_and_qwen_moe_keys():
    mixtral = model_from_hf_config({**LLAMA_CFG, "num_local_experts": 8, "num_experts_per_tok": 2}, "mx")
    assert (mixtral.num_experts, mixtral.moe_top_k, mixtral.moe_ffn_hidden_size) == (8, 2, 28672)
    qwen = model_from_hf_config(
        {
            **LLAMA_CFG,
            "num_experts": 60,
            "num_experts_per_tok": 4,
            "moe_intermediate_size": 1408,
            "shared_expert_intermediate_size": 5632,
            "decoder_sparse_step": 1,
        },
        "qw",
    )
    assert (qwen.num_experts, qwen.moe_ffn_hidden_size, qwen.moe_shared_ffn_hidden_size) == (60, 1408, 5632)


def test_hf_missing_keys_named():
    cfg = {k: v for k, v in LLAMA_CFG.items() if k not in ("hidden_size", "vocab_size")}
    with pytest.raises(ValueError, match="lacks required key\\(s\\) hidden_size, vocab_size"):
        model_from_hf_config(cfg, "x")


def test_yaml_model_file(tmp_path):
    f = tmp_path / "tiny.yaml"
    f.write_text(
        "hidden_size: 1024\nintermediate_size: 4096\nnum_hidden_layers: 4\nnum_attention_heads: 16\n"
        "vocab_size: 32000\nhidden_act: gelu\n"
    )
    m = resolve_model(str(f))
    assert (m.name, m.num_layers, m.gated_mlp, m.num_kv_heads) == ("tiny", 4, False, 16)


def test_heads_must_be_multiple_of_kv_heads():
    with pytest.raises(ValueError, match=r"num_heads \(10\) must be a multiple of num_kv_heads \(4\)"):
        ModelSpec(**{**MODELS["llama3-8b"].model_dump(), "num_heads": 10, "num_kv_heads": 4})
