"""The config.json of a dozen dense families, written here (no hub access), read as their
modelling code builds them: GPT-2's own key names, Gemma's GeGLU and windows, GPT-NeoX's and Phi's
partial rotary, Qwen2's QKV-only biases, Mistral's window; the parameter count is checked against
transformers building each model on the meta device, and an unknown model_type is refused."""

import functools
import re

import pytest

from cost_models.hf_config import KNOWN_TYPES, model_from_hf_config
from topologies.errors import InputError

SHAPE = dict(hidden_size=512, intermediate_size=1376, num_hidden_layers=6, num_attention_heads=8, vocab_size=1000)
SMALL = dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=3, num_attention_heads=4, vocab_size=1000)
CONFIGS = {
    "llama": dict(SHAPE, num_key_value_heads=2, rope_theta=500000.0, rms_norm_eps=1e-5),
    "mistral": dict(SHAPE, num_key_value_heads=2, sliding_window=256, rope_theta=1e6),
    "qwen2": dict(SHAPE, num_key_value_heads=2, rope_theta=1e6, rms_norm_eps=1e-6),
    "qwen3": dict(SHAPE, num_key_value_heads=2, head_dim=64),
    "gemma": dict(SHAPE, num_key_value_heads=1, head_dim=64, hidden_act="gelu"),
    "gemma2": dict(
        SHAPE, num_key_value_heads=4, head_dim=64, hidden_activation="gelu_pytorch_tanh", sliding_window=128
    ),
    "gemma3_text": dict(SHAPE, num_key_value_heads=4, head_dim=64, sliding_window=128),
    "gpt2": dict(n_embd=256, n_layer=3, n_head=4, n_positions=512, vocab_size=1000),
    "gpt_neox": dict(SMALL, rotary_pct=0.25, max_position_embeddings=2048),
    "phi": dict(SMALL, partial_rotary_factor=0.4),
    "phi3": dict(SMALL, num_key_value_heads=4, vocab_size=32064),  # its pad id 32000 must be a token
    "starcoder2": dict(SMALL, num_key_value_heads=2),
    "nemotron": dict(SMALL, num_key_value_heads=2, norm_eps=1e-5),  # hidden_act relu2 by default
    "olmo2": dict(SMALL, num_key_value_heads=2),  # q/k norms over the projections: 256 + 128 wide
}
# What each family's modelling code has that ntp does not count (parameters per layer, and once):
# Phi-2's one LayerNorm per layer (attention and MLP side by side) and its output layer's bias.
# Qwen3's and Gemma 3's per-head q/k RMSNorms (ModelSpec.qk_norm), OLMo 2's over the whole
# projections (qk_norm_span) and Gemma 2 / 3's norms after attention and the MLP (post_norms) are counted.
LEFT_OUT = {
    "phi": lambda m: m.vocab_size - m.num_layers * 2 * m.hidden_size,
}


def _read(kind: str):
    return model_from_hf_config({"model_type": kind, **CONFIGS[kind]}, kind)


def test_a_dozen_dense_families_beside_the_moe_ones():
    assert len(CONFIGS) >= 12 and set(CONFIGS) <= set(KNOWN_TYPES)


@functools.cache
def _built(kind: str):
    """transformers' config and model for ``kind``, the model on the meta device (no memory)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    import logging

    logging.getLogger("transformers").setLevel(logging.ERROR)
    cfg = transformers.AutoConfig.for_model(kind, **CONFIGS[kind])
    with torch.device("meta"):
        return cfg, transformers.AutoModelForCausalLM.from_config(cfg)


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_parameter_count_equals_transformers_on_the_meta_device(kind):
    hf = sum(p.numel() for p in _built(kind)[1].parameters())
    m = _read(kind)
    assert m.params_total + LEFT_OUT.get(kind, lambda _: 0)(m) == hf


@pytest.mark.parametrize("kind", list(CONFIGS))
def test_norm_offset_and_rotary_share_are_what_transformers_builds(kind):
    """A norm scales by (1 + w) when, its weights zeroed, it still passes its input on (Gemma's
    RMSNorm, Nemotron's LayerNorm1P); the rotated share of each head is the one transformers'
    config settles on (rope_parameters' partial_rotary_factor, 1 when unset)."""
    import torch

    cfg, model = _built(kind)
    norm_class = next(type(mod) for mod in model.modules() if "norm" in type(mod).__name__.lower())
    norm = norm_class(8, eps=1e-5)
    with torch.no_grad():
        for p in norm.parameters():
            p.zero_()
        plus_one = bool(norm(torch.arange(8.0).view(1, 8)).abs().sum() > 0)
    share = (getattr(cfg, "rope_parameters", None) or {}).get("partial_rotary_factor", 1.0)
    m = _read(kind)
    assert (m.norm_zero_centered, m.rotary_fraction) == (plus_one, share)


@pytest.mark.parametrize(
    ("kind", "expect"),
    [
        ("gpt2", dict(hidden_size=256, num_layers=3, num_heads=4, ffn_hidden_size=1024, max_position_embeddings=512,
                      position="learned", norm="layernorm", gated_mlp=False, bias=True, tie_embeddings=True)),
        ("gpt_neox", dict(position="rope", norm="layernorm", gated_mlp=False, bias=True, tie_embeddings=False)),
        ("gemma2", dict(gated_mlp=True, tie_embeddings=True, head_dim=64, sliding_window=128, full_attention_every=2)),
        ("gemma3_text", dict(gated_mlp=True, sliding_window=128, full_attention_every=6, qk_norm=True,
                             post_norms=True, attention_softcap=None, final_softcap=None)),
        ("gemma2", dict(qk_norm=False, post_norms=True, attention_softcap=50.0, final_softcap=30.0)),
        ("qwen3", dict(qk_norm=True, head_dim=64, gated_mlp=True)),
        ("nemotron", dict(gated_mlp=False, mlp_activation="squared_relu", norm="layernorm", norm_eps=1e-5,
                          norm_zero_centered=True, rotary_fraction=0.5)),
        ("olmo2", dict(qk_norm=True, qk_norm_span="projection", gated_mlp=True, norm_zero_centered=False)),
        ("gpt_neox", dict(rotary_fraction=0.25)),
        ("mistral", dict(sliding_window=256, full_attention_every=0, rope_theta=1e6)),
        ("qwen2", dict(qkv_bias=True, bias=False, rope_theta=1e6, norm_eps=1e-6)),
        ("phi", dict(position="rope", gated_mlp=False, bias=True)),
        ("llama", dict(rope_theta=500000.0, norm_eps=1e-5, gated_mlp=True, bias=False, tie_embeddings=False)),
    ],
)  # fmt: skip
def test_each_family_reads_as_its_modelling_code_builds_it(kind, expect):
    m = _read(kind)
    assert {k: getattr(m, k) for k in expect} == expect


def test_an_unknown_model_type_is_refused_by_name():
    with pytest.raises(InputError, match=r"model_type 'rwkv' is not one ntp reads \(deepseek_v2, deepseek_v3, "):
        model_from_hf_config({"model_type": "rwkv", **SHAPE}, "x")
    typeless = model_from_hf_config(dict(SHAPE, hidden_act="silu"), "hand-written")  # no model_type: read as before
    assert typeless.gated_mlp and not typeless.tie_embeddings


def test_gpt2_takes_four_times_its_width_without_n_inner():
    m = model_from_hf_config({"model_type": "gpt2", "n_embd": 128, "n_layer": 2, "n_head": 2, "vocab_size": 50}, "g")
    assert m.ffn_hidden_size == 512 and m.num_layers == 2


@pytest.mark.parametrize(
    ("keys", "says"),
    [
        ({"model_type": ["gemma2"]}, "model_type is ['gemma2']; it must be the family's name"),
        ({"model_type": "gemma2", "sliding_window": 16, "sliding_window_pattern": 0}, "sliding_window_pattern is 0"),
        ({"model_type": "llama", "rope_scaling": {"rope_type": "llama3", "factor": 0.5}}, "rope_scaling.factor"),
        ({"model_type": "llama", "rms_norm_eps": "1e-5"}, "rms_norm_eps is '1e-5'"),
        ({"model_type": "llama", "rope_theta": float("inf")}, "rope_theta is inf"),
        ({"model_type": "phi", "partial_rotary_factor": 1.5}, "partial_rotary_factor: Input should be less than or"),
        ({"model_type": "gpt_neox", "rotary_pct": "0.5"}, "rotary_pct is '0.5'; it must be a number"),
    ],
)
def test_a_bad_family_key_is_one_sentence_naming_it(keys, says):
    with pytest.raises(InputError, match=re.escape(says)):
        model_from_hf_config({**SHAPE, **keys}, "x")


def test_transformers_5_rope_parameters_read_as_the_older_keys():
    # transformers 5 saves rope_theta and Llama 3.1's scaling inside rope_parameters, with no
    # top-level rope_theta or rope_scaling: both must read as they do from a 4.x file
    from transformers import LlamaConfig

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}  # fmt: skip
    cfg = LlamaConfig(rope_scaling=scaling, rope_theta=500000.0, max_position_embeddings=131072).to_dict()
    assert "rope_theta" not in cfg and "rope_scaling" not in cfg  # what transformers 5 writes
    m = model_from_hf_config(cfg, "llama31")
    assert (m.rope_theta, m.rope_scaling_factor) == (500000.0, 8.0)
    old = {k: v for k, v in cfg.items() if k != "rope_parameters"}
    m4 = model_from_hf_config({**old, "rope_theta": 500000.0, "rope_scaling": scaling}, "llama31")
    assert (m4.rope_theta, m4.rope_scaling_factor) == (500000.0, 8.0)
