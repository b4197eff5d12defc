"""Megatron-Bridge recipe settings that table G's runs use (issue 24, deliverable 8): token
dropping at a capacity factor, padding to capacity, and selective recompute of named modules,
against hand-derived numbers."""

from __future__ import annotations

import pytest

from cost_models import moe
from cost_models.blocks import CostEnv
from cost_models.catalogue import MODELS
from cost_models.efficiency import DEFAULT_EFFICIENCY as EFF
from cost_models.flops import ACT_BYTES, Op, layer_ops, norm_residual_ops, unfused_rotary
from cost_models.layout import ParallelLayout, check_layout
from cost_models.memory import activation_bytes_per_layer
from cost_models.published_moe import table_g
from cost_models.training import TrainingSpec
from topologies.cluster import Cluster
from topologies.cluster_catalogue import CLUSTERS
from topologies.errors import InputError

MIXTRAL = MODELS["mixtral-8x7b"]  # 8 experts, top 2, hidden 4096, expert width 14336
DSV3 = MODELS["deepseek-v3"]
H64 = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=64)
TRAIN = TrainingSpec(seq_len=4096, global_batch=256)


def _layout(**kw) -> ParallelLayout:
    return ParallelLayout(**{"tp": 1, "dp": 64, "ep": 8, "global_batch": 256, "zero": 1, **kw})


# ---- capacity factor ----------------------------------------------------------------------------
def test_capacity_factor_caps_the_busiest_rank_at_cf_times_the_mean():
    dropless = CostEnv(MIXTRAL, TRAIN, _layout(), H64)
    imbalance = dropless.moe_shape(dropless.degree(1)).load
    assert imbalance > 1.01  # 8 ranks of one expert each: the sampling noise alone
    cap = 1.0 + (imbalance - 1) / 2  # a cap below the dropless busiest rank
    capped = CostEnv(MIXTRAL, TRAIN.model_copy(update={"moe_capacity_factor": cap}), _layout(), H64)
    assert capped.moe_shape(capped.degree(1)).load == pytest.approx(cap)
    loose = CostEnv(MIXTRAL, TRAIN.model_copy(update={"moe_capacity_factor": 4.0}), _layout(), H64)
    assert loose.moe_shape(loose.degree(1)).load == pytest.approx(imbalance)  # nothing dropped
    padded = TRAIN.model_copy(update={"moe_capacity_factor": 1.25, "moe_pad_to_capacity": True})
    env = CostEnv(MIXTRAL, padded, _layout(), H64)
    s = env.moe_shape(env.degree(1))
    assert s.load == 1.25  # every expert runs exactly its capacity
    # the experts' up-projection: 4096 tokens x top 2 x 8 ranks / 8 experts x 1.25 rows
    (up,) = [op for op in env._moe_layer_ops([], env.degree(1)) if op.name == "experts-up"]
    assert up.m == round(4096 * 2 * 1.25)


def test_padding_to_capacity_removes_the_host_sync():
    layout = _layout()
    sync = EFF.model_copy(update={"moe_host_sync_s": {"alltoall": 0.004, "allgather": 0.004, "flex": 0.0}})
    dropless = CostEnv(MIXTRAL, TRAIN, layout, H64, sync)
    assert dropless._host_sync_s(dropless.degree(1)) == 0.004
    padded = TRAIN.model_copy(update={"moe_capacity_factor": 1.0, "moe_pad_to_capacity": True})
    env = CostEnv(MIXTRAL, padded, layout, H64, sync)
    assert env._host_sync_s(env.degree(1)) == 0.0
    kind = MIXTRAL.layer_kind(0)
    unsynced = CostEnv(MIXTRAL, padded, layout, H64, sync.model_copy(update={"moe_host_sync_s": {}}))
    assert env.block_pass(kind, 1).fwd == pytest.approx(unsynced.block_pass(kind, 1).fwd, rel=1e-12)


def test_capacity_settings_are_validated():
    with pytest.raises(ValueError, match="needs moe_capacity_factor"):
        TrainingSpec(moe_pad_to_capacity=True)
    with pytest.raises(ValueError):
        TrainingSpec(moe_capacity_factor=0.0)


# ---- recompute modules: memory ------------------------------------------------------------------
def _act(model, layer, modules, dtype_bytes=ACT_BYTES, tp=1):
    return activation_bytes_per_layer(
        model, layer, 4096, 1, tp, tp > 1, "none", True, linear_input_bytes=dtype_bytes, modules=modules
    )


def test_moe_act_drops_the_experts_down_projection_input():
    # Mixtral, 4096 tokens at tp 1: top 2 copies of each through width 14336, 2 bytes each
    saved = _act(MIXTRAL, 0, ()) - _act(MIXTRAL, 0, ("moe_act",))
    assert saved == 2 * 4096 * 2 * 14336


def test_layernorm_drops_both_norm_outputs():
    saved = _act(MIXTRAL, 0, ()) - _act(MIXTRAL, 0, ("layernorm",))
    assert saved == 2 * 2 * 4096 * 4096  # two sublayers x 2 bytes x tokens x hidden
    assert _act(MIXTRAL, 0, (), 1.0) == _act(MIXTRAL, 0, ("layernorm",), 1.0)  # fp8: the linears keep their casts


def test_mla_up_proj_drops_q_k_v_and_mlp_the_dense_mlp():
    # DeepSeek-V3: 128 heads of 192 (q, k) and 128 (v) dims; Q + K + V per token 2 x (2 x 128 x 192 + 128 x 128)
    saved = _act(DSV3, 5, ()) - _act(DSV3, 5, ("mla_up_proj",))
    assert saved == 4096 * 2 * (2 * 128 * 192 + 128 * 128)
    dense = DSV3.layer_kind(0)  # one of the three leading dense layers, width 18432
    assert not dense.moe
    saved = _act(DSV3, 0, ()) - _act(DSV3, 0, ("mlp",))
    assert saved == 4096 * (2 * 2 + 2) * 18432  # gate and up outputs (16-bit) and the down input
    assert _act(DSV3, 5, ("mlp",)) == _act(DSV3, 5, ())  # MoE layers keep theirs ('moe' is another module)


# ---- recompute modules: time --------------------------------------------------------------------
def test_recompute_modules_add_their_forward_ops_to_backward():
    kind = MIXTRAL.layer_kind(0)
    base = CostEnv(MIXTRAL, TRAIN, _layout(), H64)
    env = CostEnv(MIXTRAL, TRAIN, _layout(recompute_modules=("moe_act", "layernorm")), H64)
    ops = base._moe_layer_ops([], base.degree(1))
    (act,) = [op for op in ops if op.name == "experts-act"]
    (norms,) = [op for op in norm_residual_ops(MIXTRAL, 4096, 1, 2) if op.name == "norms"]
    k = EFF.kernel_overhead_s
    expected = (env.op_time(act) + k) + (env.op_time(norms) + k)
    a, b = base.block_pass(kind, 1), env.block_pass(kind, 1)
    assert b.recompute - a.recompute == pytest.approx(expected, rel=1e-12)
    assert (b.fwd, b.bwd) == (a.fwd, a.bwd)
    # a dense DeepSeek-V3 layer recomputing its MLP: the three MLP ops' forward FLOPs counted again
    lay = _layout(ep=8, recompute_modules=("mlp",))
    train = TrainingSpec(seq_len=4096, global_batch=256)
    d0, d1 = CostEnv(DSV3, train, _layout(ep=8), H64), CostEnv(DSV3, train, lay, H64)
    dense = DSV3.layer_kind(0)
    h, f = DSV3.hidden_size, DSV3.ffn_hidden_size
    extra = d1.block_pass(dense, 1).hw_flops - d0.block_pass(dense, 1).hw_flops
    assert extra == pytest.approx(2 * 4096 * h * 2 * f + 2 * 4096 * f * h, rel=1e-12)


def test_recompute_modules_are_validated():
    with pytest.raises(ValueError, match="already recomputes it all"):
        _layout(recompute="full", recompute_modules=("mlp",))
    with pytest.raises(ValueError, match="names a module twice"):
        _layout(recompute_modules=("mlp", "mlp"))
    with pytest.raises(InputError, match="needs multi-latent attention"):
        check_layout(_layout(recompute_modules=("mla_up_proj",)), MIXTRAL, TRAIN, 64, 8)
    with pytest.raises(ValueError):
        _layout(recompute_modules=("attention",))


def test_recompute_modules_round_trip_and_stay_out_of_dumps_when_empty():
    assert "recompute_modules" not in _layout().model_dump()
    lay = _layout(recompute_modules=("moe_act",))
    assert ParallelLayout.model_validate(lay.model_dump(mode="json")) == lay
    assert "rc-moe_act" in lay.describe()
    assert moe.routed_load(1.3, 1.0, True) == 1.0


def test_cuda_graphs_run_moe_layers_without_host_syncs():
    sync = EFF.model_copy(update={"moe_host_sync_s": {"alltoall": 0.004, "flex": 0.0}, "grouped_gemm_launch_s": 1e-5})
    graphed = CostEnv(MIXTRAL, TRAIN.model_copy(update={"cuda_graphs": True}), _layout(), H64, sync)
    eager = CostEnv(MIXTRAL, TRAIN, _layout(), H64, sync)
    kind = MIXTRAL.layer_kind(0)
    # the sync and, eager, the expert GEMMs launched one at a time: 8 experts over ep 8, one local
    # expert, 6 GEMMs of 10 us (moe.grouped_gemm_launch_s)
    assert eager.block_pass(kind, 1).fwd - graphed.block_pass(kind, 1).fwd == pytest.approx(0.004 + 6e-5, rel=1e-9)
    assert graphed.block_pass(kind, 1).bwd == eager.block_pass(kind, 1).bwd


def test_blackwell_ultra_runs_fused_attention_twice_as_fast():
    from cost_models.flops import Op

    core = Op("attention-core", "flash", flops=1e12)
    envs = {}
    for gpu, cluster in (("B200", "dgx-b200"), ("B300", "dgx-b300")):
        envs[gpu] = CostEnv(MIXTRAL, TRAIN, _layout(dp=8), Cluster(spec=CLUSTERS[cluster], num_gpus=8))
    # same bf16 peak (2.25 PFLOP/s) and architecture: the SFU's doubled exponentials alone
    assert envs["B200"].bf16_peak == envs["B300"].bf16_peak
    assert envs["B200"].op_time(core) / envs["B300"].op_time(core) == pytest.approx(2.0, rel=1e-12)
    assert envs["B200"].op_time(core) == pytest.approx(1e12 / (2.25e15 * 0.46), rel=1e-12)


def test_narrow_heads_run_exponential_bound_attention():
    # Blackwell: 8,192 bf16 FLOPs per SM and clock over 4 x 16 exponentials = head dim 128; a 64-wide head
    # (GPT-OSS) runs its forward (1 of 3.5 units) at half rate, its backward (10 d FLOPs an exponential)
    # at full: 3.5 / (2 + 2.5). Hopper's bound is 64: a 64-wide head is not slowed.
    assert EFF.attention_fraction("blackwell", "cudnn", "B200", 64) == pytest.approx(0.46 * 3.5 / 4.5, rel=1e-12)
    assert EFF.attention_fraction("blackwell", "cudnn", "B300", 64) == pytest.approx(0.46 * 2.0 * 3.5 / 4.5, rel=1e-12)
    assert EFF.attention_fraction("blackwell", "cudnn", "B200", 32) == pytest.approx(0.46 * 3.5 / (4 + 2.5 * 1.6))
    assert EFF.attention_fraction("blackwell", "cudnn", "B200", 128) == EFF.attention_fraction("blackwell", "cudnn")
    assert EFF.attention_fraction("hopper", "cudnn", "H100", 64) == pytest.approx(0.54, rel=1e-12)
    from cost_models.flops import Op

    core = Op("attention-core", "flash", flops=1e12)
    b200 = Cluster(spec=CLUSTERS["dgx-b200"], num_gpus=8)
    oss = CostEnv(MODELS["gpt-oss-120b"], TRAIN, _layout(dp=8), b200)  # head dim 64
    assert oss.op_time(core) == pytest.approx(1e12 / (2.25e15 * 0.46 * 3.5 / 4.5), rel=1e-12)


def test_alternating_attention_reselects_its_backend_on_the_host():
    # GPT-OSS alternates a 128-token window with full attention: 35 of its 36 layers differ from the
    # previous one, each re-running Transformer Engine's backend selection (6 ms) when nothing graphs it
    oss = MODELS["gpt-oss-120b"]
    assert moe.attention_switch_fraction(oss) == pytest.approx(35 / 36, rel=1e-12)
    assert moe.attention_switch_fraction(MIXTRAL) == 0.0
    # (16 streams: the eager experts share the GPU as the graph's grouped GEMM does, moe.expert_waves alike)
    sync = EFF.model_copy(
        update={
            "moe_host_sync_s": {"alltoall": 0.008, "flex": 0.0},
            "grouped_gemm_launch_s": 1e-5,
            "expert_gemm_streams": 16,
        }
    )
    flex = CostEnv(oss, TRAIN, _layout(moe_dispatcher="flex"), H64, sync)
    assert flex._host_sync_s(flex.degree(1)) == pytest.approx(0.006 * 35 / 36, rel=1e-12)
    # the longer of the dispatcher's stall and the re-selection, not their sum
    a2a = CostEnv(oss, TRAIN, _layout(), H64, sync)
    assert a2a._host_sync_s(a2a.degree(1)) == 0.008
    graphed = CostEnv(oss, TRAIN.model_copy(update={"cuda_graphs": True}), _layout(moe_dispatcher="flex"), H64, sync)
    assert graphed._host_sync_s(graphed.degree(1)) == 0.0
    kind = oss.layer_kind(1)
    # and, eager, 128 / 8 = 16 local experts' 6 GEMMs launched one at a time at 10 us: 0.96 ms
    launches = 6 * 16 * 1e-5
    # and the eager fc2 bias pass, which the graph's fused grouped MLP holds (flops.expert_bias_bytes)
    bias = next(op for op in flex._moe_layer_ops([], flex.degree(1)) if op.name == "experts-bias")
    eager_bias = flex.op_time(bias) + sync.kernel_overhead_s
    assert flex.block_pass(kind, 1).fwd - graphed.block_pass(kind, 1).fwd == pytest.approx(
        0.006 * 35 / 36 + launches + eager_bias, rel=1e-9
    )
    assert CostEnv(MIXTRAL, TRAIN, _layout(moe_dispatcher="flex"), H64, sync)._host_sync_s(flex.degree(1)) == 0.0


def test_hybridep_permutes_inside_dispatch_and_combine():
    # flex on an NVL72 rack is HybridEP (one NVLink domain over 18 hosts): no permute or unpermute pass. Mixtral
    # at ep 8, 4,096 tokens per GPU, top 2: each pass moves 2 x 2 x 4,096 x 4,096 x (1 + 2) bytes, forward
    # and backward, at 8 TB/s x 0.85, plus one kernel overhead each way
    rack = Cluster(spec=CLUSTERS["gb200-nvl72"], num_gpus=64)
    kind = MIXTRAL.layer_kind(0)
    passes = {}
    for dispatcher in ("flex", "alltoall"):
        env = CostEnv(MIXTRAL, TRAIN, _layout(moe_dispatcher=dispatcher), rack, EFF)
        names = {op.name for op in env._moe_layer_ops([], env.degree(1))}
        assert ("permute" in names, "unpermute" in names) == ((False, False) if dispatcher == "flex" else (True, True))
        passes[dispatcher] = env.block_pass(kind, 1)
    one = 2 * 2 * 4096 * 4096 * 3 / (8e12 * 0.85) + 2e-6  # GB200: 8 TB/s
    assert passes["alltoall"].bwd - passes["flex"].bwd == pytest.approx(2 * one, rel=1e-9)
    assert moe.flex_backend(8, 8) == "deepep"  # a DGX: DeepEP, which Megatron permutes after
    dgx = CostEnv(MIXTRAL, TRAIN, _layout(moe_dispatcher="flex"), H64, EFF)
    assert "permute" in {op.name for op in dgx._moe_layer_ops([], dgx.degree(1))}


def test_fp8_attention_doubles_the_gemms_but_not_the_exponentials():
    # Qwen3-30B (head dim 128) on GB200: the forward is bound by its exponentials at fp8 (4 x 128 FLOPs a
    # score, half of what 2 x 8,192 / 16 needs), the backward is not: 3.5 / (1 + 2.5 / 2) of the bf16 rate
    qwen = MODELS["qwen3-30b-a3b"]
    rack = Cluster(spec=CLUSTERS["gb200-nvl72"], num_gpus=8)
    mx = TrainingSpec(seq_len=4096, global_batch=64, dtype="mxfp8")
    bf16 = CostEnv(qwen, mx, _layout(dp=8), rack)._attention
    fp8 = CostEnv(qwen, mx.model_copy(update={"fp8_attention": True}), _layout(dp=8), rack)._attention
    assert fp8 / bf16 == pytest.approx(3.5 / 2.25, rel=1e-12)
    assert EFF.attention_fraction("hopper", "cudnn", "H100", 128, 2.0) == pytest.approx(2 * 0.54, rel=1e-12)
    with pytest.raises(ValueError, match="fp8_attention"):  # pydantic wraps the InputError
        TrainingSpec(seq_len=4096, global_batch=64, dtype="bf16", fp8_attention=True)


def test_expert_gemms_launched_one_at_a_time_cost_six_launches_per_local_expert():
    # Mixtral at ep 2: 8 / 2 = 4 local experts, fc1 and fc2 forward, their dgrad and wgrad
    # backward: 24 GEMMs issued by Transformer Engine's host loop, 10 us each = 0.24 ms; none graphed
    assert moe.grouped_gemm_launch_s(4, 1e-5, False) == pytest.approx(2.4e-4, rel=1e-12)
    assert moe.grouped_gemm_launch_s(4, 1e-5, True) == 0.0
    quiet = EFF.model_copy(update={"moe_host_sync_s": {}, "grouped_gemm_launch_s": 1e-5})
    kind = MIXTRAL.layer_kind(0)
    eager = CostEnv(MIXTRAL, TRAIN, _layout(ep=2), H64, quiet).block_pass(kind, 1)
    graphed = CostEnv(MIXTRAL, TRAIN.model_copy(update={"cuda_graphs": True}), _layout(ep=2), H64, quiet).block_pass(
        kind, 1
    )
    assert eager.fwd - graphed.fwd == pytest.approx(2.4e-4, rel=1e-9)
    assert eager.bwd == graphed.bwd


def test_a2a_overlap_holds_a_layer_pair_to_the_host_time_of_its_schedule_nodes():
    # the combined 1F1B schedule: a layer's forward and backward take at least moe_overlap_host_s
    # of host time (no host syncs or launches here, to isolate it): 1 s against a few ms of GPU
    quiet = EFF.model_copy(update={"moe_host_sync_s": {}, "grouped_gemm_launch_s": 0.0, "moe_overlap_host_s": 1.0})
    kind = MIXTRAL.layer_kind(0)
    plain = CostEnv(MIXTRAL, TRAIN, _layout(), H64, quiet).block_pass(kind, 1)
    assert plain.fwd + plain.bwd < 0.1
    paired = CostEnv(MIXTRAL, TRAIN, _layout(moe_overlap="1f1b"), H64, quiet).block_pass(kind, 1)
    assert paired.fwd + paired.bwd == pytest.approx(1.0, rel=1e-12)
    assert paired.bwd == plain.bwd
    graphed_train = TRAIN.model_copy(update={"cuda_graphs": True})
    graphed = CostEnv(MIXTRAL, graphed_train, _layout(moe_overlap="1f1b"), H64, quiet).block_pass(kind, 1)
    assert graphed.fwd + graphed.bwd == pytest.approx(plain.fwd + plain.bwd, rel=1e-12)
    # GPU work above the host time: nothing added
    assert moe.overlap_host_floor_s("1f1b", False, 0.012, 0.015) == 0.0
    assert moe.overlap_host_floor_s("dualpipe", False, 0.012, 0.005) == pytest.approx(0.007, rel=1e-12)


def test_unfused_rope_moves_six_times_the_fused_bytes_forward():
    # GPT-OSS's YaRN turns the recipes' rope fusion off (published_moe: rope_fusion False). The rotated
    # elements of one GPU at tp 1, seq 4,096, one sequence: 4,096 tokens x (64 query + 8 key heads) x 64
    # = 18,874,368; fused 4 bytes each forward and 8 backward, unfused 24 and 26
    oss = MODELS["gpt-oss-120b"]
    h100 = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=8)
    lay = ParallelLayout(tp=1, dp=8, ep=8, global_batch=64)
    fused = CostEnv(oss, TRAIN.model_copy(update={"global_batch": 64}), lay, h100)
    unfused = CostEnv(oss, fused.training.model_copy(update={"rope_fusion": False}), lay, h100)
    kind = oss.layer_kind(0)
    rot = lambda env: next(op for op in layer_ops_of(env, kind) if op.name == "rotary")  # noqa: E731
    assert rot(fused).mem_bytes == 4 * 18_874_368 and rot(fused).bwd == 2.0
    one = unfused_rotary(rot(fused))
    assert one.mem_bytes == 24 * 18_874_368 and one.mem_bytes * one.bwd == pytest.approx(26 * 18_874_368)
    a, b = fused.block_pass(kind, 1), unfused.block_pass(kind, 1)
    t = lambda nbytes: fused.op_time(Op("x", "memory", mem_bytes=nbytes))  # noqa: E731
    assert b.fwd - a.fwd == pytest.approx(t(24 * 18_874_368) - t(4 * 18_874_368), rel=1e-9)
    k = EFF.kernel_overhead_s  # each pass pays it as many times as its multiplier
    assert b.bwd - a.bwd == pytest.approx(26 / 24 * (t(24 * 18_874_368) + k) - 2 * (t(4 * 18_874_368) + k), rel=1e-9)
    rows = [r for r in table_g() if r.model.name == "gpt-oss-120b"]
    assert rows and not any(r.training.rope_fusion for r in rows)
    assert all(r.training.rope_fusion for r in table_g() if r.model.name != "gpt-oss-120b")


def layer_ops_of(env: CostEnv, kind):
    d, tr = env.degree(1), env.training
    return layer_ops(env.model, kind, d.seqs, tr.seq_len, 1, 1, 8, False, True, "bf16", env.arch, "delayed", 4)
