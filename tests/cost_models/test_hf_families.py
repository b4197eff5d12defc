"""The MoE families' published config.json files (hf_configs/, trimmed to the keys that shape the
model) read into the catalogue's ModelSpec, and the layer patterns each family's modelling code
derives from its keys."""

import json
from pathlib import Path

import pytest

from cost_models import MODELS
from cost_models.hf_config import load_model_file, model_from_hf_config
from topologies.errors import InputError

CONFIGS = Path(__file__).parent / "hf_configs"
FILES = sorted(CONFIGS.glob("*.json"))


def _cfg(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_config_reads_into_the_catalogue_entry(path):
    m = load_model_file(path)
    assert m.model_dump(exclude={"name"}) == MODELS[path.stem].model_dump(exclude={"name"})


def test_every_moe_family_has_a_fixture():
    names = {"deepseek-v3", "qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-20b", "gpt-oss-120b", "llama4-scout"}
    assert names | {"llama4-maverick", "mixtral-8x7b", "mixtral-8x22b"} == {p.stem for p in FILES}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_parameter_count_equals_transformers_on_the_meta_device(path):
    """transformers' own model classes, built on the meta device (no memory), counted."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    raw = json.loads(path.read_text())
    if "text_config" in raw:  # Llama 4: the text model alone (its vision tower is not trained here)
        from transformers.models.llama4 import Llama4ForCausalLM, Llama4TextConfig

        cfg, build = Llama4TextConfig(**raw["text_config"]), Llama4ForCausalLM
    else:
        cfg = transformers.AutoConfig.for_model(**raw)
        build = transformers.AutoModelForCausalLM.from_config
    with torch.device("meta"):
        hf = sum(p.numel() for p in build(cfg).parameters())
    # DeepSeek-V3's HF class builds no MTP module (params_total leaves it out too). Qwen3's per-head
    # q/k RMSNorms (2 x 128 per layer) and GPT-OSS's router biases (one per expert a layer) are counted.
    assert MODELS[path.stem].params_total == hf


def test_deepseek_mla_keys_win_over_head_dim():
    # transformers' DeepseekV3Config writes head_dim = qk_rope_head_dim (64) into saved files; the
    # query/key heads are qk_nope + qk_rope = 192 wide all the same.
    m = model_from_hf_config({**_cfg("deepseek-v3"), "head_dim": 64}, "ds")
    assert (m.head_dim, m.v_head_dim, m.kv_lora_rank, m.q_lora_rank, m.mtp_layers) == (192, 128, 512, 1536, 1)
    lite = model_from_hf_config({**_cfg("deepseek-v3"), "q_lora_rank": None}, "lite")  # V2-Lite: no q latent
    assert lite.q_lora_rank == 0 and lite.is_mla


def test_deepseek_moe_layer_freq_counts_from_layer_zero():
    # DeepseekV3DecoderLayer: MoE when i >= first_k_dense_replace and i % moe_layer_freq == 0.
    m = model_from_hf_config({**_cfg("deepseek-v3"), "moe_layer_freq": 2}, "ds")
    assert [i for i in range(12) if m.is_moe_layer(i)] == [4, 6, 8, 10]


@pytest.mark.parametrize(
    ("keys", "moe"),
    [
        (dict(decoder_sparse_step=2), [1, 3, 5, 7]),  # Qwen3MoeDecoderLayer: (i + 1) % step == 0
        (dict(mlp_only_layers=[0, 1]), [2, 3, 4, 5, 6, 7]),
        (dict(decoder_sparse_step=2, mlp_only_layers=[1]), [3, 5, 7]),  # a dense prefix of 3, then every 2nd
        (dict(decoder_sparse_step=2, mlp_only_layers=[3]), None),
        (dict(mlp_only_layers=[5]), None),
    ],
)
def test_qwen_moe_layers(keys, moe):
    cfg = {**_cfg("qwen3-30b-a3b"), "num_hidden_layers": 8, **keys}
    if moe is None:
        with pytest.raises(ValueError, match="mlp_only_layers makes layers .* MoE; ntp writes MoE layers as"):
            model_from_hf_config(cfg, "q")
        return
    m = model_from_hf_config(cfg, "q")
    assert [i for i in range(8) if m.is_moe_layer(i)] == moe


@pytest.mark.parametrize("listed", [[8], [-1], [0, 99]])
def test_qwen_dense_layers_outside_the_model_are_refused(listed):
    cfg = {**_cfg("qwen3-30b-a3b"), "num_hidden_layers": 8, "mlp_only_layers": listed}
    with pytest.raises(ValueError, match=r"mlp_only_layers .* names layers outside 0\.\.7 \(num_hidden_layers 8\)"):
        model_from_hf_config(cfg, "q")


def test_qwen_mlp_only_layers_must_be_a_list():
    cfg = {**_cfg("qwen3-30b-a3b"), "num_hidden_layers": 8, "mlp_only_layers": 5}
    with pytest.raises(ValueError, match=r"mlp_only_layers is 5; it must be a list of layer indices"):
        model_from_hf_config(cfg, "q")


@pytest.mark.timeout(20)
@pytest.mark.parametrize("family", ["qwen3-30b-a3b", "llama4-maverick"])
def test_a_huge_layer_count_is_refused_before_the_moe_pattern_lists_every_layer(family):
    cfg = _cfg(family)
    inner = cfg.get("text_config", cfg)  # Llama 4 keeps its text model's keys in text_config
    inner["num_hidden_layers"] = 10**30  # listing 10**30 layers would never end
    with pytest.raises(ValueError, match=r"num_hidden_layers: must lie in 1\.\.10,000 layers, not 1e\+30"):
        model_from_hf_config(cfg, "q")


def test_llama4_interleaving_and_moe_layers_list():
    text = _cfg("llama4-maverick")["text_config"]
    m = model_from_hf_config({"text_config": text}, "mav")
    # Llama4TextModel: moe_layers = range(step - 1, layers, step); dense layers intermediate_size_mlp.
    assert [i for i in range(6) if m.is_moe_layer(i)] == [1, 3, 5]
    assert (m.ffn_hidden_size, m.moe_ffn_hidden_size, m.moe_shared_ffn_hidden_size) == (16384, 8192, 8192)
    listed = model_from_hf_config({"text_config": {**text, "moe_layers": list(range(1, 48, 2))}}, "mav")
    assert listed == m
    with pytest.raises(ValueError, match=r"moe_layers makes layers \[1, 2, 5\] MoE"):
        model_from_hf_config({"text_config": {**text, "moe_layers": [1, 2, 5]}}, "bad")


@pytest.mark.parametrize(
    ("keys", "window", "every"),
    [
        ({}, 128, 2),  # GPT-OSS: sliding, full, sliding, ...
        (dict(layer_types=["sliding_attention"] * 24), 128, 0),
        (dict(layer_types=["full_attention"] * 24), 0, 1),
        (dict(layer_types=None), 128, 0),  # Mistral: no layer_types, every layer windowed
        (dict(use_sliding_window=False), 0, 1),  # Qwen2: the window is written but off
        (dict(sliding_window=None), 0, 1),
        (dict(layer_types=(["sliding_attention"] * 3 + ["full_attention"]) * 6), 128, 4),
    ],
)
def test_sliding_window_from_layer_types(keys, window, every):
    m = model_from_hf_config({**_cfg("gpt-oss-20b"), **keys}, "oss")
    assert (m.sliding_window, m.full_attention_every, m.attention_sinks) == (window, every, True)


def test_irregular_layer_types_are_refused():
    types = ["full_attention", "sliding_attention", "full_attention"] + ["sliding_attention"] * 21
    with pytest.raises(ValueError, match=r"layer_types puts full attention on layers \[0, 2\]"):
        model_from_hf_config({**_cfg("gpt-oss-20b"), "layer_types": types}, "oss")
    with pytest.raises(ValueError, match=r"layer_types must list one attention type per layer \(24\)"):
        model_from_hf_config({**_cfg("gpt-oss-20b"), "layer_types": ["full_attention"]}, "oss")


def test_sinks_only_for_gpt_oss():
    assert not model_from_hf_config(_cfg("mixtral-8x22b"), "mx").attention_sinks


def test_gpt_oss_gates_with_a_clamped_offset_quick_gelu():
    # GptOssExperts: (up + 1) * gate * sigmoid(1.702 gate), gate <= swiglu_limit, |up| <= swiglu_limit
    m = model_from_hf_config(_cfg("gpt-oss-20b"), "oss")
    assert (m.gate_activation, m.gate_linear_offset, m.activation_clamp) == ("quick_gelu", 1.0, 7.0)
    assert model_from_hf_config({**_cfg("gpt-oss-20b"), "swiglu_limit": 5.5}, "oss").activation_clamp == 5.5
    with pytest.raises(InputError, match=r"swiglu_alpha is 1\.0; .* sigmoid\(1\.702 x\)"):
        model_from_hf_config({**_cfg("gpt-oss-20b"), "swiglu_alpha": 1.0}, "oss")
    with pytest.raises(InputError, match=r"swiglu_limit: Input should be greater than 0"):
        model_from_hf_config({**_cfg("gpt-oss-20b"), "swiglu_limit": 0}, "oss")


def test_qwen3_moe_normalises_queries_and_keys_per_head():
    assert model_from_hf_config(_cfg("qwen3-30b-a3b"), "q").qk_norm is True
    assert model_from_hf_config(_cfg("mixtral-8x7b"), "m").qk_norm is False


def test_llama4_l2_normalises_queries_and_keys_as_its_use_qk_norm_says():
    """Scout's config.json says use_qk_norm true, Maverick's false, and transformers' Llama4TextConfig
    reads the key so (true when absent); the L2 norm has no weights, so the counts above hold either way.
    Both skip rotary positions on every 4th layer, as Llama4TextConfig's no_rope_layers has it."""
    config = pytest.importorskip("transformers.models.llama4").Llama4TextConfig
    for name, l2 in (("llama4-scout", True), ("llama4-maverick", False)):
        text = _cfg(name)["text_config"]
        assert MODELS[name].qk_l2_norm == config(**text).use_qk_norm == l2
        nope = [i for i, rotary in enumerate(config(**text).no_rope_layers) if not rotary]
        assert nope == [i for i in range(48) if (i + 1) % MODELS[name].nope_every == 0] == list(range(3, 48, 4))
        unsaid = {k: v for k, v in text.items() if k != "use_qk_norm"}
        assert model_from_hf_config({"text_config": unsaid}, name).qk_l2_norm == config(**unsaid).use_qk_norm
    with pytest.raises(InputError, match="use_qk_norm is 'yes'; it must be true or false"):
        model_from_hf_config({"text_config": {**_cfg("llama4-scout")["text_config"], "use_qk_norm": "yes"}}, "x")


def test_llama4_nope_layers_are_read_from_the_list_or_the_interval():
    text = _cfg("llama4-scout")["text_config"]
    every_6th = [int((i + 1) % 6 != 0) for i in range(48)]
    assert model_from_hf_config({"text_config": {**text, "no_rope_layers": every_6th}}, "x").nope_every == 6
    assert model_from_hf_config({"text_config": {**text, "no_rope_layer_interval": 8}}, "x").nope_every == 8
    assert model_from_hf_config({"text_config": {**text, "no_rope_layers": [1] * 48}}, "x").nope_every == 0
    with pytest.raises(InputError, match=r"no_rope_layers leaves layers \[3, 5\] without rotary positions"):
        model_from_hf_config({"text_config": {**text, "no_rope_layers": [0 if i in (3, 5) else 1 for i in range(48)]}},
                             "x")  # fmt: skip
