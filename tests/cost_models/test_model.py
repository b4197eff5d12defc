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


# Published (total, active) in billions. DeepSeek-V3: arXiv 2412.19437 (MTP module apart); Qwen3: the
# Qwen3 technical report's model table; GPT-OSS: OpenAI's model card (Table 1); Llama 4: Meta's model
# cards (the vision encoder is in Meta's total, not here); Mixtral: Mistral's 8x7B and 8x22B posts.
PUBLISHED = [
    ("deepseek-v3", 671, 37),
    ("qwen3-30b-a3b", 30.5, 3.3),
    ("qwen3-235b-a22b", 235, 22),
    ("llama4-scout", 109, 17),
    ("llama4-maverick", 400, 17),
    ("mixtral-8x7b", 46.7, 12.9),
    ("mixtral-8x22b", 141, 39),
]


@pytest.mark.parametrize(("name", "total", "active"), PUBLISHED)
def test_params_total_and_active_match_the_model_cards(name, total, active):
    m = MODELS[name]
    assert m.params_total / 1e9 == pytest.approx(total, rel=0.015)
    assert m.params_active / 1e9 == pytest.approx(active, rel=0.02)
    assert isinstance(m.params_total, int) and isinstance(m.params_active, int)


@pytest.mark.parametrize(("name", "total", "active"), [("gpt-oss-20b", 20.91, 3.61), ("gpt-oss-120b", 116.83, 5.13)])
def test_gpt_oss_counts_the_unembedding_not_the_embedding(name, total, active):
    m = MODELS[name]
    assert m.params_total / 1e9 == pytest.approx(total, rel=0.002)
    # OpenAI's card: active = attention + top-4 experts + router + unembedding; the embedding
    # lookup (201,088 x 2,880 = 0.58B) is not counted, so our count is that much higher.
    embedding = 201_088 * 2_880
    assert (m.params_active - embedding) / 1e9 == pytest.approx(active, rel=0.005)
    assert m.params_active / 1e9 > 1.1 * active


def test_deepseek_v3_by_hand():
    m = MODELS["deepseek-v3"]
    h, a = 7168, 128
    # MLA per layer: q down 7168 x 1536 (+ its norm 1536), q up 1536 x 128 x 192, kv down
    # 7168 x (512 + 64) (+ norm 512), kv up 512 x 128 x (128 + 128), out 128 x 128 x 7168.
    mla = h * 1536 + 1536 + 1536 * a * 192 + h * 576 + 512 + 512 * a * 256 + a * 128 * h
    assert m.attention_params == mla == 187_107_328
    expert = 3 * h * 2048
    moe_layer = mla + 2 * h + h * 256 + expert + 256 * expert  # norms, router, shared, routed
    dense_layer = mla + 2 * h + 3 * h * 18432
    embed = 129_280 * h
    assert m.params_total == 3 * dense_layer + 58 * moe_layer + 2 * embed + h
    assert m.params_active == 3 * dense_layer + 58 * (moe_layer - 248 * expert) + 2 * embed + h
    # One MTP module: norms of the hidden state and embedding, projection 2h -> h, an MoE layer,
    # a final norm. The checkpoint's 685B adds it with its copies of the embedding and head.
    assert m.mtp_params == moe_layer + 2 * h * h + 3 * h
    assert (m.params_total + m.mtp_params + 2 * embed) / 1e9 == pytest.approx(685, rel=0.005)
    assert (m.mtp_params + 2 * embed) / 1e9 == pytest.approx(14, rel=0.05)
    # The down-projections and latent norms stay whole on every TP rank (Megatron-Core's
    # duplicated TELinear): 11.0M + 4.1M per layer, plus the two RMSNorms of the layer.
    kind = m.layer_kind(10)
    assert m.layer_tp_replicated_params(kind) == h * 1536 + 1536 + h * 576 + 512 + 2 * h


def test_layer_patterns_of_the_families():
    maverick, scout, oss = MODELS["llama4-maverick"], MODELS["llama4-scout"], MODELS["gpt-oss-120b"]
    # Maverick interleaves: odd layers MoE, even layers dense of intermediate_size_mlp 16384.
    assert [maverick.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    assert maverick.num_moe_layers == 24 and scout.num_moe_layers == 48
    assert MODELS["deepseek-v3"].num_moe_layers == 58
    # GPT-OSS: layer_types alternate sliding (even) and full (odd) attention.
    assert [oss.layer_kind(i).window for i in range(4)] == [128, 0, 128, 0]
    counts = oss.kind_counts(0, 36)
    assert sorted(counts.values()) == [18, 18] and {k.window for k in counts} == {0, 128}
    assert oss.kind_counts(3, 8) == {oss.layer_kind(3): 3, oss.layer_kind(4): 2}
    # Sinks: one logit per head per layer, 64 x 36.
    no_sinks = oss.model_copy(update={"attention_sinks": False})
    assert oss.params_total - no_sinks.params_total == 64 * 36


def _spec(**kw):
    base = dict(
        name="x", family="llama", hidden_size=64, ffn_hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=4,
        head_dim=16, vocab_size=100, max_position_embeddings=1024, tie_embeddings=False, gated_mlp=True,
        norm="rmsnorm", position="rope", bias=False, dropout=0.0,
    )  # fmt: skip
    return ModelSpec(**{**base, **kw})


MLA = dict(kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(q_lora_rank=16), r"q_lora_rank\(16\) describe multi-head latent attention, which kv_lora_rank\(0\)"),
        (dict(v_head_dim=16, qk_rope_head_dim=8), r"qk_rope_head_dim\(8\), v_head_dim\(16\) describe"),
        ({**MLA, "qk_rope_head_dim": 0, "qk_nope_head_dim": 16}, r"needs qk_rope_head_dim\(0\) > 0"),
        ({**MLA, "head_dim": 24}, r"qk_nope_head_dim\(8\) \+ qk_rope_head_dim\(8\) = 16 wide, but head_dim is 24"),
        ({**MLA, "num_kv_heads": 2}, r"num_kv_heads\(2\) must equal num_heads\(4\)"),
        ({**MLA, "position": "learned"}, "position must be 'rope'"),
        (dict(full_attention_every=2), r"full_attention_every\(2\) picks the full-attention layers"),
        (dict(sliding_window=128), r"sliding_window\(128\) with full_attention_every\(1\) leaves every layer"),
        (dict(sliding_window=128, full_attention_every=5), r"full_attention_every\(5\) > num_layers\(4\)"),
        (dict(sliding_window=1024, full_attention_every=2), r"sliding_window\(1024\) >= max_position_embeddings"),
    ],
)
def test_mla_and_window_fields_are_validated(fields, message):
    with pytest.raises(ValueError, match=message):
        _spec(**fields)


def test_small_mla_and_window_specs_are_accepted():
    # A window shorter than the sequence is the point of one; 0 makes every layer windowed.
    all_windowed = _spec(sliding_window=64, full_attention_every=0)
    assert {all_windowed.layer_kind(i).window for i in range(4)} == {64}
    m = _spec(**MLA, q_lora_rank=0)
    # No query latent: q is projected directly, h x a(nope + rope), and is column-parallel.
    assert m.attention_params == 64 * 40 + 32 + 64 * 4 * 16 + 32 * 4 * 24 + 4 * 16 * 64 == 13_856
    assert m.layer_tp_replicated_params(m.layer_kind(0)) == 64 * 40 + 32 + 2 * 64


def test_qk_norm_adds_two_head_wide_norms_per_layer():
    # Qwen3-30B-A3B: 48 layers x (q_norm + k_norm) of head_dim 128 = 12,288 weights, all of them
    # kept whole on every TP rank; a LayerNorm model's per-head norms carry a bias as well
    qwen = MODELS["qwen3-30b-a3b"]
    without = ModelSpec(**{**qwen.model_dump(), "qk_norm": False})
    assert qwen.params_total - without.params_total == 48 * 2 * 128 == 12_288
    assert qwen.params_active - without.params_active == 12_288
    kind = qwen.kinds[0]
    assert qwen.layer_tp_replicated_params(kind) - without.layer_tp_replicated_params(kind) == 256
    gpt = MODELS["gpt3-5b"]
    normed = ModelSpec(**{**gpt.model_dump(), "qk_norm": True})
    assert normed.params_total - gpt.params_total == 24 * 2 * 2 * 128


def test_qk_norms_over_the_whole_projections_count_their_widths():
    # OLMo 2 7B's shape (transformers' Olmo2Attention: q_norm of num_heads x head_dim, k_norm of
    # num_kv_heads x head_dim): 32 layers x (4096 + 4096) = 262,144 weights; with 8 KV heads the
    # key norm is 1024 wide; split over TP with the projections, not kept whole
    llama = MODELS["llama2-7b"]
    olmo = ModelSpec(**{**llama.model_dump(), "name": "olmo", "qk_norm": True, "qk_norm_span": "projection"})
    assert olmo.qk_norm_params == 8192 and olmo.params_total - llama.params_total == 262_144
    gqa = olmo.model_copy(update={"num_kv_heads": 8})
    assert gqa.qk_norm_params == 4096 + 1024
    assert olmo.layer_tp_replicated_params(olmo.kinds[0]) == llama.layer_tp_replicated_params(llama.kinds[0])


def test_biased_routers_count_a_bias_per_expert():
    # GPT-OSS 20B: 32 experts of a 2880-wide router row plus a bias each, in each of 24 layers
    oss, mixtral = MODELS["gpt-oss-20b"], MODELS["mixtral-8x7b"]
    assert oss.router_params == 32 * 2881 == 92_192
    assert mixtral.router_params == 8 * 4096  # no biases
    assert oss.moe_layer_nonexpert_params == oss.attention_params + oss.norm_params + 92_192  # no shared expert


@pytest.mark.parametrize(
    ("update", "says"),
    [
        ({"qk_norm_span": "projection"}, r"qk_norm_span\('projection'\) says what the query/key norms span"),
        ({"qk_l2_norm": True, "qk_norm": True}, "qk_l2_norm .* and qk_norm .* both normalise"),
        ({"rotary_fraction": 0.5, "position": "learned"}, r"rotary_fraction\(0.5\) is the share"),
        ({"nope_every": 4, "position": "learned"}, r"nope_every\(4\) picks the layers without rotary"),
        ({"nope_every": 33}, r"nope_every\(33\) .* num_layers\(32\)"),
    ],
)
def test_query_key_norm_and_rotary_settings_that_contradict_are_refused(update, says):
    with pytest.raises(ValueError, match=says):
        ModelSpec(**{**MODELS["llama2-7b"].model_dump(), **update})


def test_qk_norm_is_refused_beside_mla_whose_latent_norms_it_would_double():
    with pytest.raises(ValueError, match="MLA .* normalises its latents instead"):
        ModelSpec(**{**MODELS["deepseek-v3"].model_dump(), "qk_norm": True})


def test_catalogue_models_carry_their_authors_activations_and_qk_norms():
    got = {
        n: (m.gate_activation, m.gate_linear_offset, m.activation_clamp, m.mlp_activation, m.qk_norm)
        for n, m in MODELS.items()
        if n in ("gpt-oss-20b", "qwen3-235b-a22b", "nemotron4-15b", "llama3-8b", "gpt3-175b")
    }
    assert got == {
        "gpt-oss-20b": ("quick_gelu", 1.0, 7.0, "gelu", False),
        "qwen3-235b-a22b": ("silu", 0.0, None, "gelu", True),
        "nemotron4-15b": ("silu", 0.0, None, "squared_relu", False),
        "llama3-8b": ("silu", 0.0, None, "gelu", False),
        "gpt3-175b": ("silu", 0.0, None, "gelu", False),
    }
