"""Memory per GPU pinned to hand formulas: Megatron's bytes-per-parameter table and
Korthikanti et al. 2022's activation formulas, for GPT-3 175B at TP8 PP8, s=2048, b=1, fp16."""

import pytest

from cost_models import MODELS, ParallelLayout, TrainingSpec, estimate_step
from cost_models.memory import activation_bytes_per_layer, stage_params, state_bytes
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
