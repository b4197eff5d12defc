"""torchtitan's runtime (cost_models/titan.py, titan_step.py): each term against numbers worked out
by hand, the switch between runtimes, and table H's published runs (cost_models/published_titan.py)."""

import pytest

from cost_models import MODELS, ParallelLayout, TrainingSpec
from cost_models.blocks import CostEnv
from cost_models.efficiency import DEFAULT_EFFICIENCY
from cost_models.flops import Op, gemm
from cost_models.published_titan import TABLE_H
from cost_models.step import estimate_step
from cost_models.titan import (
    TitanSettings,
    fsdp2_buffer_bytes,
    fsdp2_exposed_s,
    full_ac_activation_bytes,
    kept_fsdp2_buffer_bytes,
    loss_logit_bytes,
    op_sac_activation_bytes,
    op_sac_lse_bytes,
    op_sac_recompute_s,
    pp_fsdp2_buffer_bytes,
    reserved_bytes,
    ring_cp_buffer_bytes,
    ring_cp_exposed_s,
)
from topologies import CLUSTERS, Cluster

TITAN = DEFAULT_EFFICIENCY.with_profile(None, "torchtitan")
# Llama 3 8B: h 4096, 32 query heads and 8 KV heads of 128, FFN 14336, vocabulary 128256 (untied)
LAYER_PARAMS = 4096 * (4096 + 1024 + 1024 + 4096) + 3 * 4096 * 14336 + 2 * 4096  # 218,112,000
ROOT_PARAMS = 2 * 128256 * 4096 + 4096  # embedding, LM head, final norm


def test_fsdp2_hides_every_gather_but_the_first_and_every_reduce_scatter_but_the_last():
    # compute-bound: 32 blocks, gather 1 ms, reduce-scatter 2 ms, forward 3 ms, backward 6 ms
    assert fsdp2_exposed_s(1e-3, 2e-3, 3e-3, 6e-3, 32, True) == pytest.approx((1e-3, 2e-3))
    # comm-bound: gather 3, reduce 4, forward 1, backward 2, 3 blocks; forward 3 + 2 x (3 - 1) = 7,
    # backward 2 x (3 + 4 - 2) + 4 = 14, or without the regather 2 x (4 - 2) + 4 = 8
    assert fsdp2_exposed_s(3.0, 4.0, 1.0, 2.0, 3, True) == (7.0, 14.0)
    assert fsdp2_exposed_s(3.0, 4.0, 1.0, 2.0, 3, False) == (7.0, 8.0)
    assert fsdp2_exposed_s(3.0, 4.0, 1.0, 2.0, 0, True) == (0.0, 0.0)


def test_ring_cp_exposes_the_gather_beyond_the_local_chunk_and_the_last_gradient_send():
    # cp 2: gather 10, send 5, attention 8 forward / 16 backward, so a chunk is 4 / 8:
    # forward 10 - 4 = 6; backward (10 - 8) + 1 x max(0, 5 - 8) + 5 = 7
    assert ring_cp_exposed_s(10.0, 5.0, 8.0, 16.0, 2) == (6.0, 7.0)
    assert ring_cp_exposed_s(10.0, 5.0, 8.0, 16.0, 1) == (0.0, 0.0)
    assert ring_cp_exposed_s(0.5, 0.25, 8.0, 16.0, 4) == (0.0, 0.25)  # all hidden but the last send


def test_per_op_sac_recomputes_wk_wo_w3_and_the_elementwise_ops_not_attention():
    # Llama 3 8B: wk is 1024 of the fused QKV's 6144 columns; w3 half of the fused w1/w3
    times = {"qkv": 6.0, "attention-core": 50.0, "out-proj": 4.0, "mlp-up": 28.0, "mlp-down": 14.0, "norms": 0.5}
    assert op_sac_recompute_s(times, 1024 / 6144) == pytest.approx(1.0 + 4.0 + 14.0 + 0.5)


def test_activation_bytes_of_per_op_sac_and_full_ac():
    # 8192 tokens: x, wq, wv, attention out, w1, w2 = 4096 + 4096 + 1024 + 4096 + 14336 + 4096 = 31744 bf16
    assert op_sac_activation_bytes(8192, 4096, 4096, 1024, 14336, 1) == 2 * 8192 * 31744 == 520_093_696
    # tp 8: all but w2's output (the whole sequence before its reduce-scatter) are split
    assert op_sac_activation_bytes(8192, 4096, 4096, 1024, 14336, 8) == 2 * 8192 * (27648 / 8 + 4096)
    assert full_ac_activation_bytes(8192, 4096, 8) == 2 * 8192 * 512


def test_fsdp2_buffers_and_the_allocator_reserve():
    # two gathered bf16 blocks (4 bytes/param), one block's bf16 gradients + fp32 copy (6), root in bf16 (2)
    assert fsdp2_buffer_bytes(LAYER_PARAMS, ROOT_PARAMS, 2.0) == LAYER_PARAMS * 10 + ROOT_PARAMS * 2
    assert fsdp2_buffer_bytes(LAYER_PARAMS, 0.0, 1.0) == LAYER_PARAMS * 8  # float8 all-gather
    assert reserved_bytes(60e9, 0.15) == pytest.approx(9e9)


def _fsdp8(efficiency, **training):
    lay = ParallelLayout(dp=8, zero=3, micro_batch=2, global_batch=16, recompute="selective")
    t = TrainingSpec(seq_len=8192, global_batch=16, grad_reduce_in_fp32=True, **training)
    return estimate_step(MODELS["llama3-8b"], t, lay, Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=8), efficiency)


def test_fsdp2_memory_of_llama3_8b_on_8_gpus_by_part():
    parts = _fsdp8(TITAN).memory_breakdown_bytes
    params = 32 * LAYER_PARAMS + ROOT_PARAMS
    assert params == MODELS["llama3-8b"].params_total
    assert parts["weights"] == pytest.approx(params / 8 * 4) and parts["optimizer"] == pytest.approx(params / 8 * 8)
    assert parts["fsdp_buffers"] == pytest.approx(LAYER_PARAMS * 10 + ROOT_PARAMS * 2)
    # 32 layers of per-op SAC at 16384 tokens with SDPA's fp32 logsumexp (32 heads), and the
    # compiled loss's logits: 16384 x (4096 x 2 + 128256 x 4)
    logits = 16384 * (4096 * 2 + 128256 * 4)
    assert parts["activations"] == pytest.approx(32 * (2 * 16384 * 31744 + 4 * 16384 * 32) + logits)
    allocated = sum(v for k, v in parts.items() if k not in ("allocator_reserve", "runtime_reserved"))
    assert parts["allocator_reserve"] == pytest.approx(0.15 * allocated)


def test_zero_1_and_2_cost_as_the_export_runs_them_fsdp2_that_keeps_every_block_gathered():
    """torchtitan has no ZeRO-1/2: `ntp export --format torchtitan` writes them as FSDP with
    fsdp_reshard_after_forward 'never', so they hold all 32 gathered bf16 blocks at the start of
    backward and do not regather in it; ZeRO-3 holds two blocks and regathers."""
    assert kept_fsdp2_buffer_bytes(32 * LAYER_PARAMS * 2.0, LAYER_PARAMS, ROOT_PARAMS) == (
        LAYER_PARAMS * (64 + 6) + ROOT_PARAMS * 2
    )
    # 64 GPUs over 8 hosts, 1,024 tokens a GPU: a block's gather (~2 ms) and fp32 reduce-scatter
    # (~4 ms) outlast its backward (~2 ms), so the regather ZeRO-3 adds is exposed
    cluster, t = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=64), TrainingSpec(seq_len=1024, global_batch=64)
    costs = {
        zero: estimate_step(
            MODELS["llama3-8b"], t, ParallelLayout(dp=64, zero=zero, micro_batch=1, global_batch=64), cluster, TITAN
        )
        for zero in (1, 2, 3)
    }
    for zero in (1, 2):
        gap = costs[zero].memory_breakdown_bytes["fsdp_buffers"] - costs[3].memory_breakdown_bytes["fsdp_buffers"]
        assert gap == pytest.approx(LAYER_PARAMS * (64 + 6 - 10))  # 32 blocks gathered, not two
        exposed = [costs[z].time_breakdown_s["dp_comm_exposed"] for z in (zero, 3)]
        assert exposed[0] < 0.9 * exposed[1]  # no regathers


def test_pipelined_fsdp2_holds_every_block_even_when_asked_to_reshard_after_forward():
    """torch.distributed.pipelining turns reshard-after-backward and gradient sync off until the
    last micro-batch: ZeRO-3 with reshard_after_forward under pp 2 still holds every block of its
    stage gathered and its gradients accumulated in fp32 (it held two blocks before)."""
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=16)
    t = TrainingSpec(seq_len=8192, global_batch=16, grad_reduce_in_fp32=True)
    parts = [
        estimate_step(
            MODELS["llama3-8b"],
            t,
            ParallelLayout(dp=8, pp=2, zero=3, micro_batch=1, global_batch=16, reshard_after_forward=reshard),
            cluster,
            TITAN,
        ).memory_breakdown_bytes["fsdp_buffers"]
        for reshard in (True, False)
    ]
    assert parts[0] == parts[1] > 16 * LAYER_PARAMS * (2 + 4)  # 16 blocks a stage, bf16 + fp32 gradient


def test_the_loss_holds_10_bytes_a_logit_eager_14_under_loss_parallel_4_compiled():
    assert loss_logit_bytes(1, False) == 2 + 4 + 4  # bf16 logits, fp32 upcast, fused log-softmax output
    assert loss_logit_bytes(8, False) == 2 + 4 + 4 + 4  # DTensor's decomposed log-softmax: + exp(shifted)
    assert loss_logit_bytes(1, True) == loss_logit_bytes(8, True) == 2 + 2  # inductor: bf16 logits and gradient
    eager = TITAN.model_copy(update={"titan": TitanSettings(compile_loss=False)})
    # Llama 3 8B, 16384 tokens: 6 bytes x 128256 more per token than the compiled loss
    gap = _fsdp8(eager).memory_breakdown_bytes["activations"] - _fsdp8(TITAN).memory_breakdown_bytes["activations"]
    assert gap == pytest.approx(16384 * 128256 * 6)


def test_sdpa_logsumexp_and_the_ring_cp_buffers_by_hand():
    assert op_sac_lse_bytes(16384, 32, 1) == 4 * 16384 * 32
    # Llama 3.1 405B, TP 8 (16 of 128 query heads of 128, KV repeated to them), CP 8, 32768 local
    # tokens: every chunk's K and V in bf16 (2 x 2 x 8) and five fp32 chunk accumulators (5 x 4)
    assert ring_cp_buffer_bytes(32768, 2048, 8) == 32768 * 2048 * 52 == 3_489_660_928
    assert ring_cp_buffer_bytes(32768, 2048, 1) == 0.0


def test_pipelined_fsdp2_accumulates_every_unsharded_gradient_in_fp32():
    # 100 parameters gathered at 1.5 bytes each (float8 GEMM weights, bf16 rest): + 4 bytes each
    assert pp_fsdp2_buffer_bytes(150.0, 100.0) == 550.0


def test_cp_adds_its_gathered_kv_and_fp32_accumulators_to_a_405b_stage():
    # table H's T6 CP1 32k and CP8 256k: the same 32768 tokens per rank, the same shards (FSDP x CP = 8)
    rows = {r.label: r for r in TABLE_H}

    def activations(label):
        r = rows[label]
        eff = TITAN.model_copy(update={"titan": r.titan})
        return estimate_step(r.model, r.training, r.layout, r.cluster, eff).memory_breakdown_bytes["activations"]

    assert activations("T6 CP8 256k") - activations("T6 CP1 32k") == pytest.approx(3_489_660_928)


def test_titan_settings_change_nothing_under_megatron_and_the_gemm_and_memory_rates_under_torchtitan():
    eager = TitanSettings(compile=False, float8_scaling="rowwise")
    megatron = DEFAULT_EFFICIENCY.model_copy(update={"titan": eager})
    assert _fsdp8(megatron).step_time_s == _fsdp8(DEFAULT_EFFICIENCY).step_time_s
    model, lay, cluster = (
        MODELS["llama3-8b"],
        ParallelLayout(dp=8, global_batch=8),
        Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=8),
    )
    fp8 = TrainingSpec(dtype="fp8", fp8_recipe="current")
    tensorwise = CostEnv(
        model, fp8, lay, cluster, TITAN.model_copy(update={"titan": TitanSettings(float8_scaling="tensorwise")})
    )
    rowwise = CostEnv(model, fp8, lay, cluster, TITAN.model_copy(update={"titan": eager}))
    op, norm = gemm("mlp-up", 8192, 28672, 4096), Op("norms", "memory", mem_bytes=1e9)
    assert rowwise.op_time(op) == pytest.approx(tensorwise.op_time(op) / 0.5)  # rowwise_gemm_fraction
    assert rowwise.op_time(norm) == pytest.approx(2.0 * tensorwise.op_time(norm))  # eager_memory_factor


def test_published_throughput_becomes_step_time_over_the_non_data_parallel_ranks():
    rows = {r.label: r for r in TABLE_H}
    assert rows["T5 1F1B"].measured_step_time_s == pytest.approx(32 * 8192 / (100 * 8 * 8))  # tp 8 x pp 8
    assert rows["T2 CP8 256k"].measured_step_time_s == pytest.approx(262144 / (548 * 8))  # cp 8
    assert rows["T5 1F1B"].layout.num_micro_batches == 8 and rows["T5 1F1B"].layout.micro_batch == 4
    assert len(TABLE_H) == 32 and sum(r.memory_gib is not None for r in TABLE_H) == 20


def test_table_h_meets_the_goal_step_time_within_10_percent_on_average_and_every_peak_within_15():
    from benchmarks.calibration_titan import error_summary, results

    res = results()
    step = error_summary([r.step_error for r in res])
    memory = [r.memory_error for r in res if r.row.memory_is_peak]
    assert step[0] <= 0.10 and len(memory) == 20 and max(map(abs, memory)) <= 0.15
