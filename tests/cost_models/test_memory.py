"""Memory per GPU pinned to hand formulas: Megatron's bytes-per-parameter table and
Korthikanti et al. 2022's activation formulas, for GPT-3 175B at TP8 PP8, s=2048, b=1, fp16; every
ZeRO level, low-precision weight copies, a Llama 3 8B layer in fp8, and micro-batches in flight."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cost_models import MODELS, ParallelLayout, TrainingSpec, estimate_step
from cost_models.memory import (
    activation_bytes_per_layer,
    in_flight_micro_batches,
    low_precision_copy_bytes,
    saved_input_bytes,
    stage_params,
    state_bytes,
)
from topologies import CLUSTERS, Cluster

GPT3 = MODELS["gpt3-175b"]
H, A, S, B, T = 12288, 96, 2048, 1, 8
SBH = S * B * H

# First stage of PP8: 12 layers + word embeddings (51,200 rows, split over TP) + learned positions
# (2,048 rows, replicated). Per layer: 12h^2 + 13h parameters, of which the 2 LayerNorms (4h) and
# the 2 row-parallel biases (2h) are replicated over TP and the rest (12h^2 + 7h) is split.
PER_LAYER_PER_GPU = (12 * H * H + 7 * H) / T + 6 * H
STAGE0_PARAMS = 12 * PER_LAYER_PER_GPU + 51200 * H / T + 2048 * H


def test_stage_params_match_hand_count():
    assert STAGE0_PARAMS == 2_822_731_776
    assert stage_params(GPT3, range(0, 12), tp=8, ep=1, first=True, last=False, pp=8) == STAGE0_PARAMS


def test_parallel_folding_splits_experts_over_etp_times_ep():
    # Mixtral 8x7B, one MoE layer (h 4096, 8 experts of 3 x 4096 x 14336 = 176,160,768): attention
    # 4096 x (4096 + 2 x 1024) + 4096 x 4096 = 41,943,040 and the router 4096 x 8 = 32,768 split over
    # tp 2; the two RMSNorms (8,192) whole; the 1,409,286,144 expert parameters over etp x ep.
    m = MODELS["mixtral-8x7b"]
    moe = range(0, 1)
    dense_part = (41_943_040 + 32_768) / 2 + 8_192
    folded = stage_params(m, moe, tp=2, ep=4, first=False, last=False, pp=2, etp=1)
    assert folded == dense_part + 1_409_286_144 / 4 == 373_317_632
    # etp None is etp = tp: each expert's matrices split over the two attention TP ranks too.
    unfolded = stage_params(m, moe, tp=2, ep=4, first=False, last=False, pp=2)
    assert unfolded == stage_params(m, moe, tp=2, ep=4, first=False, last=False, pp=2, etp=2)
    assert unfolded == dense_part + 1_409_286_144 / 8 == 197_156_864
    # tp 1 with etp 2 (expert TP wider than the attention's): experts 8 ways, attention whole.
    assert stage_params(m, moe, tp=1, ep=4, first=False, last=False, pp=2, etp=2) == (
        41_943_040 + 32_768 + 8_192 + 1_409_286_144 / 8
    )


def test_fp16_adam_state_bytes_match_megatron_table():
    # fp16 params + fp16 grads: 2 + 2 bytes, fp32 main params/grads + Adam m, v: 16 bytes.
    st = state_bytes(STAGE0_PARAMS, "fp16", dp=16, distributed_optimizer=False)
    assert (st.weights, st.grads, st.optimizer) == (2 * STAGE0_PARAMS, 2 * STAGE0_PARAMS, 16 * STAGE0_PARAMS)
    sharded = state_bytes(STAGE0_PARAMS, "fp16", dp=16, distributed_optimizer=True)
    assert sharded.total == pytest.approx((4 + 16 / 16) * STAGE0_PARAMS)
    bf16 = state_bytes(STAGE0_PARAMS, "bf16", dp=4, distributed_optimizer=True)
    assert bf16.total == pytest.approx((6 + 12 / 4) * STAGE0_PARAMS)


def test_estimate_reports_the_same_state_bytes():
    cluster = Cluster(spec=CLUSTERS["dgx-a100"], num_gpus=1024)
    training = TrainingSpec(seq_len=2048, global_batch=1536, dtype="fp16", flash_attention=False)
    layout = ParallelLayout(tp=8, pp=8, dp=16, global_batch=1536, micro_batch=1)
    cost = estimate_step(GPT3, training, layout, cluster)
    stage0 = cost.memory_breakdown_bytes if cost.stage_memory_bytes.index(max(cost.stage_memory_bytes)) == 0 else None
    assert stage0 is not None, "the first stage (embeddings + most in-flight micro-batches) is the fullest"
    assert stage0["weights"] == 2 * STAGE0_PARAMS
    assert stage0["grads"] == 2 * STAGE0_PARAMS
    assert stage0["optimizer"] == 16 * STAGE0_PARAMS


@pytest.mark.parametrize(
    ("sp", "recompute", "expected"),
    [
        (False, "none", SBH * (10 + 24 / T + 5 * A * S / (H * T))),  # Korthikanti eq. 2
        (True, "none", SBH / T * (34 + 5 * A * S / H)),  # eq. 4
        (False, "selective", SBH * (10 + 24 / T)),  # eq. 5 without SP
        (True, "selective", SBH * 34 / T),  # eq. 6
        (False, "full", 2 * SBH),  # section 4.3: only the layer input
    ],
)
def test_activation_bytes_match_korthikanti(sp, recompute, expected):
    got = activation_bytes_per_layer(GPT3, 0, S, B, T, sp, recompute, flash=False)
    assert got == pytest.approx(expected, rel=1e-12)


def test_known_activation_values():
    # Hand-evaluated: 2048*12288 = 25,165,824; (10 + 3 + 10) x that for the no-recompute case.
    assert activation_bytes_per_layer(GPT3, 0, S, B, T, False, "none", flash=False) == 578_813_952
    assert activation_bytes_per_layer(GPT3, 0, S, B, T, True, "selective", flash=False) == 106_954_752


def test_flash_attention_drops_the_quadratic_term():
    no_flash = activation_bytes_per_layer(GPT3, 0, S, B, T, False, "none", flash=False)
    flash = activation_bytes_per_layer(GPT3, 0, S, B, T, False, "none", flash=True)
    # The 5 a s^2 b / t term goes; a 4-byte log-sum-exp per (token, head) stays.
    assert no_flash - flash == pytest.approx(5 * A * S * S * B / T - 4 * S * B * A / T)


# ---- model state per parameter, every ZeRO level -----------------------------------------------
D = 8  # data-parallel ranks sharing the state


@pytest.mark.parametrize(
    ("dtype", "grad_bytes", "zero", "precision_aware", "expected"),
    [
        # bf16 weights 2, fp32 grads 4, Adam fp32 master + m + v = 12 (Megatron's table: 18)
        ("bf16", None, 0, False, (2, 4, 12)),  # 18
        ("bf16", None, 1, False, (2, 4, 12 / D)),  # 6 + 12/d
        ("bf16", None, 2, False, (2, 4 / D, 12 / D)),  # 2 + 16/d
        ("bf16", None, 3, False, (2 / D, 4 / D, 12 / D)),  # 18/d
        # fp16 weights 2, fp16 grads 2, and 16 bytes of fp32 state (+ main grad): 20
        ("fp16", None, 0, False, (2, 2, 16)),  # 20
        ("fp16", None, 1, False, (2, 2, 16 / D)),  # 4 + 16/d
        ("fp16", None, 2, False, (2, 2 / D, 16 / D)),  # 2 + 18/d
        ("fp16", None, 3, False, (2 / D, 2 / D, 16 / D)),  # 20/d
        # bf16 weights with 16-bit gradients (the fp8 recipes): the optimizer adds an fp32 grad copy
        ("bf16", 2.0, 0, False, (2, 2, 16)),
        ("bf16", 2.0, 1, False, (2, 2, 16 / D)),
        # precision-aware: 2-byte master remainders + fp32 m, v = 10, no fp32 grad copy
        ("bf16", 2.0, 0, True, (2, 2, 10)),  # 14
        ("bf16", 2.0, 1, True, (2, 2, 10 / D)),  # 4 + 10/d
        ("bf16", None, 0, True, (2, 4, 10)),  # 16
    ],
)
def test_state_bytes_per_parameter(dtype, grad_bytes, zero, precision_aware, expected):
    state = state_bytes(1000.0, dtype, dp=D, zero=zero, grad_bytes=grad_bytes, precision_aware=precision_aware)
    assert (state.weights, state.grads, state.optimizer) == pytest.approx(tuple(1000.0 * x for x in expected))
    assert state.low_precision_weights == 0.0
    assert state.total == pytest.approx(1000.0 * sum(expected))


def test_state_bytes_zero_level_beats_the_legacy_flag():
    # distributed_optimizer=True alone means ZeRO-1 (6 + 12/8 = 7.5 bytes); zero=0 overrides it (18).
    assert state_bytes(1.0, "bf16", dp=8, distributed_optimizer=True).total == pytest.approx(7.5)
    assert state_bytes(1.0, "bf16", dp=8, distributed_optimizer=True, zero=0).total == pytest.approx(18.0)


@pytest.mark.parametrize(("zero", "expected"), [(0, 1800.0), (1, 1800.0), (2, 1800.0), (3, 1800.0 / 4)])
def test_low_precision_copies_shard_only_under_zero3(zero, expected):
    # 900 GEMM weights of 1000 parameters, 2 bytes of fp8 copies each on Hopper: 1800 bytes.
    state = state_bytes(1000.0, "bf16", dp=4, zero=zero, grad_bytes=2.0, lp_copy_bytes=2.0, gemm_params=900.0)
    assert state.low_precision_weights == pytest.approx(expected)


def test_fp8_primary_weights_take_one_byte():
    # param_bytes 1 (fp8 params): weights 1 byte each, sharded 4 ways under ZeRO-3.
    assert state_bytes(1000.0, "bf16", dp=4, zero=1, param_bytes=1.0).weights == 1000.0
    assert state_bytes(1000.0, "bf16", dp=4, zero=3, param_bytes=1.0).weights == 250.0


@pytest.mark.parametrize(
    ("dtype", "arch", "fp8_params", "expected"),
    [
        ("fp8", "hopper", False, 2.0),  # row-wise 1 + stored transpose 1
        ("fp8", "hopper", True, 1.0),  # the weight is the row-wise copy: only the transpose
        ("fp8", "blackwell", False, 1.0),  # column-wise read natively: one copy
        ("fp8", "blackwell", True, 0.0),
        ("mxfp8", "blackwell", False, 2 * (1 + 1 / 32)),  # 2.0625: rows and columns, 1-byte scale per 32
        ("mxfp8", "blackwell", True, 1 + 1 / 32),
        ("nvfp4", "blackwell", False, 2 * (0.5 + 1 / 16)),  # 1.125: half a byte + 1-byte scale per 16
        ("nvfp4", "blackwell", True, 0.5 + 1 / 16),
        ("bf16", "hopper", False, 0.0),
        ("fp16", "blackwell", True, 0.0),
    ],
)
def test_low_precision_copy_bytes(dtype, arch, fp8_params, expected):
    assert low_precision_copy_bytes(dtype, arch, fp8_params) == expected


# ---- activations of a Llama layer in fp8 ---------------------------------------------------------
# Llama 3 8B: h 4096, 32 heads, 8 KV heads, d 128, SwiGLU f 14336, no dropout; s 4096, b 1, flash.
LLAMA8 = MODELS["llama3-8b"]
TOK = 4096  # tokens T = b s / cp
# tp 1, no recompute, fp8 (linear inputs 1 byte), per token:
#   norm inputs 2 x 2h and QKV/FC1 inputs 2 x 1h (fp8):   6 x 4096           = 24,576
#   Q, K, V in 16 bits: 2 x (32 + 2 x 8) x 128                                = 12,288
#   attention output in 16 bits + its fp8 copy: (2 + 1) x 32 x 128            = 12,288
#   gate and up outputs 2 x 2 x 14336 + fp8 down-projection input 14336       = 71,680
#   log-sum-exp: 4 bytes x 32 heads                                           =    128
#                                                                       total = 120,960
FP8_NONE = 120_960 * TOK  # 495,452,160
# selective recompute drops the log-sum-exp and the 16-bit attention output (2 x 4096 = 8,192):
FP8_SELECTIVE = (120_960 - 128 - 8_192) * TOK  # 112,640 per token
# bf16 for comparison: 8 x 4096 + (12,288 + 2 x 4096) + 6 x 14336 + 128 = 139,392 per token
BF16_NONE = 139_392 * TOK
BF16_SELECTIVE = (139_392 - 128) * TOK  # only the log-sum-exp goes; the 16-bit output is the out-proj input


@pytest.mark.parametrize(
    ("lin", "recompute", "expected"),
    [
        (1, "none", FP8_NONE),
        (1, "selective", FP8_SELECTIVE),
        (2, "none", BF16_NONE),
        (2, "selective", BF16_SELECTIVE),
        (1, "full", 2 * TOK * 4096),  # only the layer input, in 16 bits
    ],
)
def test_llama_layer_activations_in_fp8(lin, recompute, expected):
    got = activation_bytes_per_layer(LLAMA8, 0, 4096, 1, 1, False, recompute, flash=True, linear_input_bytes=lin)
    assert got == expected


def test_llama_layer_activations_in_fp8_at_tp8_with_sp():
    # tp 8, sequence parallel: 4 query heads, 1 KV head, f/8 = 1792; replicated terms / 8. Per token:
    #   6 x 4096 / 8 = 3,072; QKV 2 x (4 + 2) x 128 = 1,536; attention output 3 x 4 x 128 = 1,536;
    #   MLP 2 x 2 x 1792 + 1792 = 8,960; log-sum-exp 4 x 4 = 16.   Total 15,120.
    got = activation_bytes_per_layer(LLAMA8, 0, 4096, 1, 8, True, "none", flash=True, linear_input_bytes=1)
    assert got == 15_120 * TOK


# ---- micro-batches in flight ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stage", "pp", "m", "vpp", "expected"),
    [
        (0, 4, 16, 1, 4.0),  # 1F1B: pp - r
        (3, 4, 16, 1, 1.0),
        (0, 8, 3, 1, 3.0),  # fewer micro-batches than stages: all of them
        # Interleaved: (2 (pp - r - 1) + (vpp - 1) pp + 1) / vpp
        (0, 8, 64, 8, 8.875),  # (14 + 56 + 1) / 8 = 71/8 = 8 (1 + 7/64): Korthikanti eq. 5
        (7, 8, 64, 8, 7.125),  # (0 + 56 + 1) / 8 = 57/8
        (0, 4, 32, 2, 5.5),  # (6 + 4 + 1) / 2
        (3, 4, 32, 2, 2.5),  # (0 + 4 + 1) / 2
        (0, 8, 8, 8, 8.0),  # 8.875 capped at the 8 micro-batches of the step
        # m = pp interleaved: Megatron's all_warmup_microbatches, every stage holds all m (was 2.5 and 7.125)
        (3, 4, 4, 2, 4.0),
        (7, 8, 8, 8, 8.0),
    ],
)
def test_in_flight_micro_batches(stage, pp, m, vpp, expected):
    assert in_flight_micro_batches(stage, pp, m, vpp) == expected


@given(pp=st.integers(2, 32), vpp=st.integers(2, 16))
def test_interleaved_first_and_last_stage_closed_forms(pp, vpp):
    m = 1000 * pp  # never the cap
    # Korthikanti eq. 5: the first stage holds pp (1 + (pp - 1) / (pp vpp)) micro-batches ...
    assert in_flight_micro_batches(0, pp, m, vpp) == pytest.approx(pp * (1 + (pp - 1) / (pp * vpp)))
    # ... and the last ((vpp - 1) pp + 1) / vpp = pp - (pp - 1) / vpp.
    assert in_flight_micro_batches(pp - 1, pp, m, vpp) == pytest.approx(pp - (pp - 1) / vpp)


@pytest.mark.parametrize(
    ("dtype", "saved"), [("bf16", 2.0), ("fp8", 1.0), ("mxfp8", 1 + 1 / 32), ("nvfp4", 0.5 + 1 / 16)]
)
def test_low_precision_formats_save_linear_inputs_in_their_own_width(dtype, saved):
    # Llama 3 8B layer, tp 1, no SP, one 4096-token sequence. Linear inputs saved for the weight
    # gradient: QKV and FC1 inputs (h = 4096 each), the down-projection input (f = 14,336) and,
    # in low precision, the out-projection's own cast input (q = 4096) beside its 16-bit copy:
    # 4096 x (4096 + 4096 + 14,336) elements at `saved` bytes, plus 4096 x 4096 when low precision.
    m, tokens = MODELS["llama3-8b"], 4096
    assert saved_input_bytes(dtype) == saved

    def act(nbytes):
        return activation_bytes_per_layer(m, 0, 4096, 1, 1, False, "none", True, 1, linear_input_bytes=nbytes)

    linear = tokens * (4096 + 4096 + 14_336)
    expected = (2.0 - saved) * linear - (saved * tokens * 4096 if dtype != "bf16" else 0)
    assert act(2.0) - act(saved_input_bytes(dtype)) == pytest.approx(expected)


def test_mla_layer_activations_by_hand():
    # DeepSeek-V3's first (dense) layer, one 4096-token sequence, tp 1, no SP, bf16, flash, no
    # recompute: the two norm inputs and the two linear inputs (2 + 2 bytes x 2 x T h); Q and K of
    # 128 heads x 192, V of 128 x 128, the out-projection's input 128 x 128 (2 bytes each); MLA's
    # latents q 1536 + kv 512 (norm input and up-projection input) and the 64-wide rope key; the
    # SwiGLU MLP of 18432 (two up outputs + the down input, 2 bytes each); the fp32 log-sum-exp.
    m, T, h = MODELS["deepseek-v3"], 4096, 7168
    by_hand = 2 * 4 * T * h
    by_hand += 2 * T * (128 + 128) * 192 + 2 * T * 128 * 128 + 2 * T * 128 * 128
    by_hand += 4 * T * (1536 + 512) + 2 * T * 64
    by_hand += 3 * 2 * T * 18432 + 4 * T * 128
    assert activation_bytes_per_layer(m, 0, T, 1, 1, False, "none", True) == by_hand
    # at tp 8 with SP the heads and the MLP split 8 ways, the latents stay whole (duplicated
    # down-projections), the norm / linear inputs split under SP.
    tp8 = 2 * 4 * T * h / 8
    tp8 += 2 * T * (16 + 16) * 192 + 2 * T * 16 * 128 + 2 * T * 16 * 128
    tp8 += 4 * T * (1536 + 512) + 2 * T * 64
    tp8 += 3 * 2 * T * 18432 / 8 + 4 * T * 16
    assert activation_bytes_per_layer(m, 0, T, 1, 8, True, "none", True) == tp8


def test_last_stage_holds_the_mtp_module():
    # DeepSeek-V3 PP16 at tp 1, ep 64 (etp 1): the last stage's 4 layers, head, and the MTP module
    # (an MoE layer, its 2h x h projection, 3 norms, and a copy of the embedding to look the next
    # tokens up: 129,280 x 7168).
    m, h = MODELS["deepseek-v3"], 7168
    last = stage_params(m, range(57, 61), tp=1, ep=64, first=False, last=True, pp=16, etp=1)
    without = stage_params(
        m.model_copy(update={"mtp_layers": 0}), range(57, 61), tp=1, ep=64, first=False, last=True, pp=16, etp=1
    )
    mla = 187_107_328
    expert = 3 * h * 2048
    moe_layer_per_gpu = mla + 2 * h + h * 256 + expert + 256 * expert / 64
    assert last - without == moe_layer_per_gpu + 2 * h * h + 3 * h + 129_280 * h
    # pp 1: the embedding is already on the only stage
    one = stage_params(m, range(0, 61), tp=1, ep=64, first=True, last=True, pp=1, etp=1)
    one_without = stage_params(
        m.model_copy(update={"mtp_layers": 0}), range(0, 61), tp=1, ep=64, first=True, last=True, pp=1, etp=1
    )
    assert one - one_without == moe_layer_per_gpu + 2 * h * h + 3 * h


def test_mtp_activations_by_hand():
    from cost_models.memory import mtp_activation_bytes

    m, T, h = MODELS["deepseek-v3"], 4096, 7168
    layer = activation_bytes_per_layer(m, 61, T, 1, 8, True, "none", True)  # the pattern's next layer: MoE
    # the two norm inputs (h each) and the projection's 2h input, split under SP: (2 + 2) x 2h T / 8
    assert mtp_activation_bytes(m, T, 1, 8, True, "none", True) == layer + 4 * 2 * h * T / 8
    assert mtp_activation_bytes(MODELS["mixtral-8x7b"], T, 1, 8, True, "none", True) == 0.0


def test_folded_experts_hold_a_tp_share_of_the_routed_rows():
    # Mixtral 8x7B MoE layer, 4096 tokens, tp 2 with SP, bf16: with etp = tp each TP rank holds
    # all 4096 x 2 routed copies' inputs (2 bytes x h) and half of each expert's 14,336 columns;
    # folded to etp 1 it holds half the copies (4096) through whole experts: the column terms are
    # equal, the routed inputs halve, 2 x 4096 x 4096 bytes fewer.
    m, T, h = MODELS["mixtral-8x7b"], 4096, 4096
    base = activation_bytes_per_layer(m, 0, T, 1, 2, True, "none", True)
    folded = activation_bytes_per_layer(m, 0, T, 1, 2, True, "none", True, etp=1)
    assert base - folded == 2 * (2 * T) * h - 2 * T * h == 2 * T * h
    etp2 = activation_bytes_per_layer(m, 0, T, 1, 2, True, "none", True, etp=2)
    assert etp2 == base
    wide = activation_bytes_per_layer(m, 0, T, 1, 1, False, "none", True, etp=2)  # tp 1, etp 2
    narrow = activation_bytes_per_layer(m, 0, T, 1, 1, False, "none", True)
    # etp 2 over tp 1: twice the rows per GPU, half the columns: the routed inputs double
    assert wide - narrow == 2 * (2 * 2 * T) * h - 2 * (2 * T) * h
