"""FLOP counts against closed forms."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cost_models import MODELS
from cost_models.flops import head_ops, layer_ops, model_flops_per_step, padded_vocab


@pytest.mark.parametrize("name", [n for n in MODELS if n.startswith(("megatron", "gpt3", "ntp"))])
def test_model_flops_equal_narayanan_formula(name):
    m = MODELS[name]
    B, s, h, L, V = 512, 2048, m.hidden_size, m.num_layers, m.vocab_size
    narayanan = 72 * B * L * s * h * h * (1 + s / (6 * h) + V / (12 * h * L))
    assert model_flops_per_step(m, s, B) == pytest.approx(narayanan, rel=1e-12)


@given(tp=st.sampled_from([1, 2, 4, 8]), mb=st.integers(1, 4))
def test_gpt_layer_forward_flops_split_evenly_over_tp(tp, mb):
    # Forward of one GPT layer: 24 b s h^2 + 4 b s^2 h (Narayanan appendix), divided over tp.
    m, s = MODELS["gpt3-175b"], 2048
    h = m.hidden_size
    ops = layer_ops(m, 0, mb, s, tp, 1, 1, False, flash=False)
    assert sum(op.flops for op in ops) == pytest.approx((24 * mb * s * h * h + 4 * mb * s * s * h) / tp)


def test_flash_attention_executes_half_the_causal_core():
    m, s = MODELS["llama3-8b"], 8192
    full = sum(op.flops for op in layer_ops(m, 0, 1, s, 1, 1, 1, False, flash=False) if op.name.startswith("attention"))
    flash = sum(op.flops for op in layer_ops(m, 0, 1, s, 1, 1, 1, False, flash=True) if op.name.startswith("attention"))
    assert full == 4 * s * s * m.q_width
    assert flash == full / 2


def test_gqa_replicates_kv_heads_beyond_their_count():
    m = MODELS["llama3-70b"]  # 64 heads, 8 KV heads, head_dim 128
    qkv8 = next(op for op in layer_ops(m, 0, 1, 4096, 8, 1, 1, False, True) if op.name == "qkv")
    qkv16 = next(op for op in layer_ops(m, 0, 1, 4096, 16, 1, 1, False, True) if op.name == "qkv")
    assert qkv8.n == (8 + 2 * 1) * 128  # 8 query heads + 1 K + 1 V head per rank
    assert qkv16.n == (4 + 2 * 1) * 128  # KV head replicated, not split further


def test_padded_vocab_and_logits():
    m = MODELS["llama3-8b"]
    assert padded_vocab(m, 8) == 129024  # ceil(128256 / 1024) * 1024
    logits = next(op for op in head_ops(m, 1, 4096, 8, 1) if op.name == "logits")
    assert logits.flops == 2 * 4096 * (129024 // 8) * 4096


def test_moe_flops_count_top_k_experts():
    m = MODELS["mixtral-8x7b"]
    s = 4096
    dense_equiv = 2 * 3 * m.hidden_size * m.moe_ffn_hidden_size * s  # one expert's MLP over all tokens
    ops = layer_ops(m, 0, 1, s, 1, 1, 1, False, True)
    experts = sum(op.flops for op in ops if op.name.startswith("experts"))
    assert experts == pytest.approx(m.moe_top_k * dense_equiv)
