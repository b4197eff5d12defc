"""FLOP counts and memory-bound bytes against closed forms and hand-derived byte counts."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cost_models import MODELS
from cost_models.flops import (
    attention_ops,
    cast_ops,
    cp_correction_op,
    head_ops,
    layer_ops,
    model_flops_per_step,
    padded_vocab,
)


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


# ---- low-precision casts ---------------------------------------------------------------------------
LLAMA8 = MODELS["llama3-8b"]  # h 4096, 32 heads, 8 KV heads, d 128, SwiGLU f 14336
TOK = 4096  # tp 1, seq 4096, micro-batch 1
# Elements cast per token (tp 1):
#   forward:  QKV input h = 4096 (fused with the norm), out-proj input q = 4096 (unfused),
#             FC1 input h = 4096 (fused with the norm), FC2 input f = 14336 (fused with the activation)
#             -> fused 22,528, unfused 4,096, all 26,624
#   backward: QKV output grad q + 2 kv = 4096 + 2048 = 6144 (unfused), out-proj output grad h = 4096
#             (unfused), FC1 output grad 2f = 28,672 (fused with dact), FC2 output grad h = 4096 (unfused)
#             -> fused 28,672, unfused 14,336, all 43,008
# Bytes per element:
#   fp8 delayed: unfused read 2 + write 1 + transposed copy 1 on Hopper (4) / none on Blackwell (3); fused 0
#   fp8 current: never fused, + 2 for the amax read: Hopper 6, Blackwell 5
#   mxfp8: two 16-bit reads 4 + rows and columns 2 x (1 + 1/32) = 6.0625
#   nvfp4: read 2 + rows and columns 2 x (0.5 + 1/16) + Hadamard pass 2.5 = 5.625
CAST_CASES = [
    ("fp8", "hopper", "delayed", 4_096 * 4, 14_336 * 4),  # 16,384 / 57,344
    ("fp8", "hopper", "current", 26_624 * 6, 43_008 * 6),  # 159,744 / 258,048
    ("fp8", "blackwell", "delayed", 4_096 * 3, 14_336 * 3),  # 12,288 / 43,008
    ("fp8", "blackwell", "current", 26_624 * 5, 43_008 * 5),  # 133,120 / 215,040
    ("mxfp8", "blackwell", "delayed", 161_408, 260_736),  # 26,624 x 6.0625 / 43,008 x 6.0625
    ("mxfp8", "blackwell", "current", 161_408, 260_736),  # the recipe is an fp8 setting only
    ("nvfp4", "blackwell", "delayed", 149_760, 241_920),  # 26,624 x 5.625 / 43,008 x 5.625
]


def _pass_bytes(ops):
    """Bytes moved in forward and in backward by a list of memory ops."""
    return sum(op.mem_bytes * op.fwd for op in ops), sum(op.mem_bytes * op.bwd for op in ops)


@pytest.mark.parametrize(("dtype", "arch", "recipe", "fwd_per_token", "bwd_per_token"), CAST_CASES)
def test_cast_bytes_of_a_llama_layer(dtype, arch, recipe, fwd_per_token, bwd_per_token):
    ops = cast_ops(LLAMA8, LLAMA8.layer_kind(0), TOK, 1, False, dtype, arch, recipe)
    assert _pass_bytes(ops) == (fwd_per_token * TOK, bwd_per_token * TOK)
    # and layer_ops adds exactly these casts for a low-precision layer
    casts = [op for op in layer_ops(LLAMA8, 0, 1, 4096, 1, 1, 1, False, True, dtype, arch, recipe) if "cast" in op.name]
    assert _pass_bytes(casts) == (fwd_per_token * TOK, bwd_per_token * TOK)


def test_bf16_layer_has_no_casts():
    assert not [op for op in layer_ops(LLAMA8, 0, 1, 4096, 1, 1, 1, False, True, "bf16") if "cast" in op.name]


def test_sequence_parallel_casts_the_gathered_inputs_locally():
    # tp 8, SP, fp8 current scaling on Hopper (6 bytes per element). Per token: q = 512, 2 kv = 256,
    # f = 1792. Forward: QKV and FC1 inputs on 1/8 of the tokens: 2 x 4096 / 8 = 1024, out-proj 512,
    # FC2 1792 -> 3,328. Backward: QKV 768, out-proj 4096, FC1 2 x 1792 = 3584, FC2 4096 -> 12,544.
    ops = cast_ops(LLAMA8, LLAMA8.layer_kind(0), TOK, 8, True, "fp8", "hopper", "current")
    assert _pass_bytes(ops) == (3_328 * 6 * TOK, 12_544 * 6 * TOK)


def test_moe_layer_casts_every_routed_copy_and_the_shared_expert():
    # DeepSeek-MoE 16B layer 1 (MoE), tp 1, no SP, fp8 current scaling on Hopper (6 bytes per
    # element). h 2048, 16 heads of 128 (q 2048, 2 kv 4096), routed experts 1408 wide, top 6,
    # shared expert 2816 wide, gated. Per token, forward: QKV 2048 + out-proj 2048; routed FC1
    # 6 x 2048 + FC2 6 x 1408; shared FC1 2048 + FC2 2816 -> 29,696. Backward: QKV 2048 + 4096,
    # out-proj 2048; routed FC1 6 x 2 x 1408 + FC2 6 x 2048; shared 2 x 2816 + 2048 -> 45,056.
    m = MODELS["deepseek-moe-16b"]
    assert (m.hidden_size, m.q_width, m.moe_top_k, m.moe_ffn_hidden_size) == (2048, 2048, 6, 1408)
    ops = cast_ops(m, m.layer_kind(1), TOK, 1, False, "fp8", "hopper", "current")
    assert _pass_bytes(ops) == (29_696 * 6 * TOK, 45_056 * 6 * TOK)


# ---- cross entropy, gradient accumulation, CP merge --------------------------------------------


@pytest.mark.parametrize(
    ("fused", "fwd_bytes", "bwd_bytes"),
    [
        # fused: read 2 twice + write 2 = 6; backward read 2 + write 2 = 4
        (True, 6, 4),
        # unfused: cast 2 + 4, max 4, subtract and exp 2 x (4 + 4), sum 4, normalise 4 + 4 = 38;
        # backward 4 + 4 + 4 + 2 = 14
        (False, 38, 14),
    ],
)
def test_cross_entropy_bytes(fused, fwd_bytes, bwd_bytes):
    # Llama 3 8B head at tp 8: vocabulary padded to 129,024, 16,128 per rank; 4096 tokens.
    logits = 4096 * 16_128  # 66,060,288
    op = next(op for op in head_ops(LLAMA8, 1, 4096, 8, 1, fused_cross_entropy=fused) if op.name == "cross-entropy")
    assert op.kind == "memory" and op.flops == 0
    assert (op.mem_bytes * op.fwd, op.mem_bytes * op.bwd) == pytest.approx((fwd_bytes * logits, bwd_bytes * logits))


# GEMM weights of one Llama 3 8B layer at tp 1:
#   QKV 4096 x (4096 + 2 x 1024) = 25,165,824; out-proj 4096 x 4096 = 16,777,216;
#   gate+up 4096 x 2 x 14336 = 117,440,512; down 14336 x 4096 = 58,720,256.  Total 218,103,808.
# At tp 8 (4 query heads, 1 KV head, f/8 = 1792): 3,145,728 + 2,097,152 + 14,680,064 + 7,340,032 = 27,262,976.
@pytest.mark.parametrize(
    ("tp", "grad_bytes", "flash", "dtype", "expected"),
    [
        (1, 4.0, True, "bf16", 2 * 4 * 218_103_808),  # read and write the fp32 main grad: 1,744,830,464
        (1, 2.0, True, "fp8", 2 * 2 * 218_103_808),  # 16-bit main grads
        (1, 4.0, False, "bf16", 2 * 4 * 218_103_808),  # the unfused attention GEMMs hold no weights
        (8, 4.0, True, "bf16", 2 * 4 * 27_262_976),
    ],
)
def test_main_grad_accumulate_bytes(tp, grad_bytes, flash, dtype, expected):
    ops = layer_ops(LLAMA8, 0, 1, 4096, tp, 1, 1, False, flash, dtype, grad_bytes=grad_bytes)
    (op,) = [op for op in ops if op.name == "main-grad-accumulate"]
    assert (op.mem_bytes * op.fwd, op.mem_bytes * op.bwd) == (0.0, expected)


@pytest.mark.parametrize(
    ("tp", "q", "kv", "fwd_bytes", "bwd_bytes"),
    [
        # tp 1, cp 2, s 8192: 4096 tokens per rank, q = 4096, kv = 1024.
        # forward 2 steps x 12 bytes x 4096 x 4096; backward 2 x 10 x 4096 x (4096 + 2 x 1024)
        (1, 4096, 1024, 402_653_184, 503_316_480),
        # tp 8: q = 512, kv = 128: 2 x 12 x 4096 x 512; 2 x 10 x 4096 x (512 + 256)
        (8, 512, 128, 50_331_648, 62_914_560),
    ],
)
def test_cp_correction_bytes(tp, q, kv, fwd_bytes, bwd_bytes):
    direct = cp_correction_op(4096, q, kv, 2)
    assert (direct.mem_bytes * direct.fwd, direct.mem_bytes * direct.bwd) == pytest.approx((fwd_bytes, bwd_bytes))
    (op,) = [op for op in attention_ops(LLAMA8, 1, 8192, tp, 2, flash=True) if op.name == "cp-merge"]
    assert (op.mem_bytes * op.fwd, op.mem_bytes * op.bwd) == pytest.approx((fwd_bytes, bwd_bytes))


def test_no_cp_merge_without_cp_or_without_flash():
    assert not [op for op in attention_ops(LLAMA8, 1, 8192, 1, 1, flash=True) if op.name == "cp-merge"]
    assert not [op for op in attention_ops(LLAMA8, 1, 8192, 1, 2, flash=False) if op.name == "cp-merge"]


# ---- model FLOPs with the causal convention -----------------------------------------------------


@pytest.mark.parametrize(("causal", "expected"), [(True, 53_970_627_761_012_736), (False, 60_726_027_202_068_480)])
def test_causal_model_flops_match_megatron_lm(causal, expected):
    # Megatron-LM training.py num_floating_point_operations (core >= 0.12), dense Llama 3 8B:
    #   12 B s L h^2 [ (1 + g/a + s/(2h)) (q/h) + 1.5 f/h + V_padded/(2 L h) ]
    # B 128, s 8192, L 32, h 4096, g/a = 8/32, q = h, f 14336, V 128,256 (a multiple of 128 already):
    #   12 x 128 x 8192 x 32 x 4096^2 = 6,755,399,441,055,744
    #   bracket = 1 + 0.25 + 1 + 5.25 + 0.4892578125 = 7.9892578125 -> 53,970,627,761,012,736
    # Without the causal halving s/h replaces s/(2h): bracket 8.9892578125.
    B, s, L, h, g, a, f, V = 128, 8192, 32, 4096, 8, 32, 14336, 128256
    megatron = 12 * B * s * L * h * h * ((1 + g / a + s / h / (2 if causal else 1)) + 1.5 * f / h + V / (2 * L * h))
    assert megatron == pytest.approx(expected, rel=1e-15)
    assert model_flops_per_step(LLAMA8, s, B, causal=causal) == pytest.approx(expected, rel=1e-12)


def _by_name(ops):
    return {op.name: op for op in ops}


@pytest.mark.parametrize("tp", [1, 8])
def test_mla_projections_and_core_by_hand(tp):
    # DeepSeek-V3, one sequence of 4096 tokens: the down-projections whole on every TP rank, the
    # up-projections and the output on the rank's 128 / tp heads; scores over 128 + 64 = 192
    # dims, values over 128; a flash kernel's causal half: 4096^2 / 2 pairs per head.
    m, s, a = MODELS["deepseek-v3"], 4096, 128 // tp
    ops = _by_name(attention_ops(m, 1, s, tp, 1, flash=True))
    assert (ops["q-down"].m, ops["q-down"].n, ops["q-down"].k) == (s, 1536, 7168)
    assert (ops["q-up"].n, ops["q-up"].k) == (a * 192, 1536)
    assert (ops["kv-down"].n, ops["kv-down"].k) == (512 + 64, 7168)
    assert (ops["kv-up"].n, ops["kv-up"].k) == (a * (128 + 128), 512)
    assert (ops["out-proj"].n, ops["out-proj"].k) == (7168, a * 128)
    assert ops["attention-core"].flops == 2 * a * (s * s / 2) * (192 + 128)
    assert "qkv" not in ops
    # rotary on the queries' 64 rope dims and the one shared rope key; latent norms read + write
    assert ops["rotary"].mem_bytes == 2 * 2 * s * (a + 1) * 64
    assert ops["latent-norms"].mem_bytes == 2 * 2 * s * (1536 + 512)
    gemm_flops = sum(op.flops for op in ops.values() if op.kind == "gemm")
    per_token = 2 * (7168 * 1536 + 7168 * 576) + 2 * (1536 * a * 192 + 512 * a * 256 + a * 128 * 7168)
    assert gemm_flops == s * per_token


def test_sliding_window_core_is_the_band_not_the_triangle():
    # GPT-OSS-20B at 4096 tokens: layer 0 attends through a 128-token window, layer 1 in full.
    m, s = MODELS["gpt-oss-20b"], 4096
    windowed = _by_name(layer_ops(m, 0, 1, s, 1, 1, 1, False, True))["attention-core"]
    full = _by_name(layer_ops(m, 1, 1, s, 1, 1, 1, False, True))["attention-core"]
    # each query sees min(i, 128) keys: 4096 x 128 - 128^2 / 2 = 516,096 pairs per head, not
    # 4096^2 / 2 = 8,388,608; per pair 2 x (64 + 64) FLOPs, 64 heads
    assert windowed.flops == 64 * 516_096 * 2 * 128
    assert full.flops == 64 * 8_388_608 * 2 * 128
    # with cp 2 each rank takes half the band; sinks add no GEMM work
    assert _by_name(layer_ops(m, 0, 1, s, 1, 2, 1, False, True))["attention-core"].flops == windowed.flops / 2
    no_sinks = m.model_copy(update={"attention_sinks": False})
    assert layer_ops(no_sinks, 0, 1, s, 1, 1, 1, False, True)[:4] == layer_ops(m, 0, 1, s, 1, 1, 1, False, True)[:4]


def test_windowed_model_flops_by_hand():
    # GPT-OSS-20B, one 4096-token sequence, causal convention: per token, each of the 24 layers
    # projects (2 x 2880 x (4096 + 2 x 512) + 2 x 4096 x 2880), routes (2 x 2880 x 32) and runs 4
    # experts (2 x 3 x 2880 x 2880 each); the 12 full layers' core is 2 x 4096 x 4096, the 12
    # windowed layers' 4 x (516,096 / 4096) x 4096; the logits 2 x 2880 x 201,088; x3 for backward.
    m, s = MODELS["gpt-oss-20b"], 4096
    proj = 2 * 2880 * (4096 + 1024) + 2 * 4096 * 2880
    moe = 2 * 2880 * 32 + 4 * 2 * 3 * 2880 * 2880
    cores = 12 * 2 * s * 4096 + 12 * 4 * (516_096 / s) * 4096
    per_token = 24 * (proj + moe) + cores + 2 * 2880 * 201_088
    assert model_flops_per_step(m, s, 1, causal=True) == pytest.approx(3 * s * per_token, rel=1e-12)


def test_mtp_adds_its_layer_projection_and_logits():
    m, s, h, V = MODELS["deepseek-v3"], 4096, 7168, 129_280
    without = m.model_copy(update={"mtp_layers": 0})
    layer61 = model_flops_per_step(without.model_copy(update={"num_layers": 62}), s, 1) - model_flops_per_step(
        without, s, 1
    )  # the pattern's next (MoE) layer, as the MTP module's layer
    extra = model_flops_per_step(m, s, 1) - model_flops_per_step(without, s, 1)
    assert extra == pytest.approx(layer61 + 3 * s * (2 * 2 * h * h + 2 * h * V), rel=1e-12)
    # the MTP ops on the last stage: one projection 2h -> h (column-parallel) and a second logits GEMM
    from cost_models.flops import mtp_ops

    ops = mtp_ops(m, 1, s, 8, 1, 8, True, True)
    proj = [op for op in ops if op.name == "mtp-proj"]
    assert len(proj) == 1 and proj[0].flops == 2 * s * (h // 8) * 2 * h
    assert [op.name for op in ops].count("logits") == 1
    assert mtp_ops(without, 1, s, 8, 1, 8, True, True) == []


def test_mla_casts_each_projection_input_and_output_gradient():
    # DeepSeek-V3's dense layer 0 in fp8 on Hopper, delayed scaling, tp 1: a cast fused into the
    # kernel before it (norm -> down-projections and FC1, activation -> FC2) is free; the others
    # read 2 bytes and write row- and column-wise fp8 copies: 4 bytes per element. Forward: the
    # q latent 1536, the kv latent 512, the values 128 x 128 into the out-projection; backward:
    # the output gradients of q-down 1536, kv-down 576, q-up 128 x 192, kv-up 128 x 256, out 7168
    # and FC2's 7168.
    m, T = MODELS["deepseek-v3"], 4096
    ops = _by_name(cast_ops(m, m.layer_kind(0), T, 1, False, "fp8", "hopper", "delayed"))
    assert ops["cast-inputs"].mem_bytes == 4 * T * (1536 + 512 + 128 * 128)
    assert ops["cast-grads"].mem_bytes == 4 * T * (1536 + 576 + 128 * 192 + 128 * 256 + 7168 + 7168)
