"""The step estimator composes its terms consistently and responds to the layout as physics says."""

import pytest

from cost_models import MODELS, ParallelLayout, TrainingSpec, estimate_step
from cost_models.efficiency import DEFAULT_EFFICIENCY
from cost_models.pipeline import pipeline_time
from topologies import CLUSTERS, Cluster

H100 = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=1024)
TRAIN = TrainingSpec(seq_len=8192, global_batch=1024)
MODEL = MODELS["llama3-70b"]


def est(**kw):
    base = dict(tp=8, pp=4, dp=32, global_batch=1024, sequence_parallel=True, distributed_optimizer=True)
    return estimate_step(MODEL, TRAIN, ParallelLayout(**{**base, **kw}), H100)


def test_breakdowns_sum_to_totals():
    cost = est(vpp=2, recompute="selective")
    assert sum(cost.time_breakdown_s.values()) == pytest.approx(cost.step_time_s)
    assert sum(cost.memory_breakdown_bytes.values()) == pytest.approx(cost.memory_per_gpu_bytes)
    assert cost.tokens_per_s == pytest.approx(8192 * 1024 / cost.step_time_s)
    assert cost.mfu == pytest.approx(cost.model_flops_per_step / (cost.step_time_s * 1024 * 989.4e12))


def test_pipeline_closed_forms():
    assert pipeline_time([2.0] * 8, 32, 1).total_s == pytest.approx((32 + 7) * 2.0)
    assert pipeline_time([2.0] * 8, 32, 4).bubble_s == pytest.approx(7 * 2.0 / 4)
    uneven = pipeline_time([1.0, 3.0, 2.0], 10, 1)
    assert (uneven.bottleneck_stage, uneven.total_s) == (1, 10 * 3.0 + 3.0)


def test_bubble_matches_formula_inside_the_estimate():
    cost = est(vpp=1)
    t = cost.stage_time_s
    assert cost.time_breakdown_s["pp_bubble"] == pytest.approx(sum(t) - max(t))
    assert est(vpp=5).time_breakdown_s["pp_bubble"] < cost.time_breakdown_s["pp_bubble"] / 4


def test_recompute_trades_time_for_memory():
    none, sel, full = est(recompute="none"), est(recompute="selective"), est(recompute="full")
    assert (
        full.memory_breakdown_bytes["activations"]
        < sel.memory_breakdown_bytes["activations"]
        <= none.memory_breakdown_bytes["activations"]
    )
    assert full.step_time_s > sel.step_time_s >= none.step_time_s
    # Full recompute redoes every layer's forward: one third more layer compute.
    assert full.time_breakdown_s["recompute"] > 0.3 * full.time_breakdown_s["compute"]


def test_thin_tp_shards_run_further_from_peak():
    eff = DEFAULT_EFFICIENCY
    h, f, tokens = 8192, 28672, 8192
    wide = eff.shape_factor(tokens, f, h)  # MLP up-projection at tp1
    thin = eff.shape_factor(tokens, f // 64, h)  # the same GEMM split 64 ways
    assert thin < wide < 1.0


def test_distributed_optimizer_shards_adam_state():
    plain, sharded = est(distributed_optimizer=False), est(distributed_optimizer=True)
    assert sharded.memory_breakdown_bytes["optimizer"] == pytest.approx(plain.memory_breakdown_bytes["optimizer"] / 32)


def test_overlap_hides_dp_communication():
    exposed = est(overlap_grad_reduce=False).time_breakdown_s["dp_comm_exposed"]
    hidden = est(overlap_grad_reduce=True).time_breakdown_s["dp_comm_exposed"]
    assert exposed > 0 and hidden < exposed


def test_more_tp_means_less_memory_more_communication():
    tp4 = estimate_step(
        MODEL, TRAIN, ParallelLayout(tp=4, pp=4, dp=64, global_batch=1024, sequence_parallel=True), H100
    )
    tp8 = estimate_step(
        MODEL, TRAIN, ParallelLayout(tp=8, pp=4, dp=32, global_batch=1024, sequence_parallel=True), H100
    )
    assert tp8.memory_breakdown_bytes["weights"] == pytest.approx(tp4.memory_breakdown_bytes["weights"] / 2, rel=0.01)
    per_mb = lambda c, m: c.time_breakdown_s["tp_comm"] / m  # noqa: E731
    assert per_mb(tp8, 32) > per_mb(tp4, 16) / 2  # per micro-batch TP traffic does not halve


def test_moe_expert_parallelism_costs_all_to_all():
    mixtral = MODELS["mixtral-8x7b"]
    c = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=64)
    t = TrainingSpec(seq_len=4096, global_batch=256)
    ep1 = estimate_step(mixtral, t, ParallelLayout(tp=2, dp=32, global_batch=256, sequence_parallel=True), c)
    ep8 = estimate_step(mixtral, t, ParallelLayout(tp=2, dp=32, ep=8, global_batch=256, sequence_parallel=True), c)
    # ep 1 at tp 2 still gathers the routed rows over the expert-TP group; ep 8 adds the all-to-all
    assert 0 < ep1.time_breakdown_s["ep_comm"] < ep8.time_breakdown_s["ep_comm"]
    assert ep8.memory_breakdown_bytes["weights"] < ep1.memory_breakdown_bytes["weights"] / 4


# ---- current hardware: number formats, sharding over dp x cp, ZeRO, terms that scale ---------------
from cost_models.blocks import CostEnv  # noqa: E402
from cost_models.flops import head_ops, layer_ops  # noqa: E402

B200 = Cluster(spec=CLUSTERS["dgx-b200"], num_gpus=64)
H64 = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=64)
L8 = MODELS["llama3-8b"]


def _env(dtype, cluster=H64, recipe="delayed", **lay):
    training = TrainingSpec(seq_len=4096, global_batch=64, dtype=dtype, fp8_recipe=recipe)
    layout = ParallelLayout(**{"tp": 1, "dp": cluster.num_gpus, "global_batch": 64, **lay})
    return CostEnv(L8, training, layout, cluster)


def test_fp8_runs_gemms_at_the_fp8_rate_and_attention_in_bf16():
    bf16, fp8 = _env("bf16"), _env("fp8")
    ops = {op.name: op for op in layer_ops(L8, 0, 1, 4096, 1, 1, 1, False, True)}
    gemm, attn = ops["mlp-up"], ops["attention-core"]
    # the same GEMM: fp8 peak is 2x bf16 and the fitted fractions differ; the d_half of an fp8 GEMM
    # is twice the bf16 one (the SM does twice the work per cycle), so shape costs fp8 a little more
    eff, gpu = fp8.eff, H64.gpu
    peaks = gpu.fp8_flops_per_s / gpu.bf16_flops_per_s  # 1978.9 / 989.4 on the datasheet
    ratio = (peaks * eff.gemm_peak_fraction("hopper", "fp8") / eff.gemm_peak_fraction("hopper", "bf16")) * (
        eff.shape_factor(gemm.m, gemm.n, gemm.k, fp8._gemm[True][1])
        / eff.shape_factor(gemm.m, gemm.n, gemm.k, bf16._gemm[True][1])
    )
    assert bf16.op_time(gemm) / fp8.op_time(gemm) == pytest.approx(ratio)
    assert fp8.op_time(attn) == bf16.op_time(attn)  # Transformer Engine runs attention in bf16
    # the LM head's logits GEMM stays in 16 bits under fp8 (Megatron keeps the output layer in bf16)
    head = {op.name: op for op in head_ops(L8, 1, 4096, 1, 1)}
    assert fp8.op_time(head["logits"]) == bf16.op_time(head["logits"])


def test_fp8_speed_up_is_far_below_two_on_a_real_layout():
    # the example: a flat 2x GEMM rate gave 1.85x end to end; casts, bf16 attention, the
    # 16-bit LM head and communication keep it well below that
    def step(dtype):
        t = TrainingSpec(seq_len=2048, global_batch=2048, dtype=dtype)
        lay = ParallelLayout(tp=4, pp=8, dp=16, vpp=6, micro_batch=2, global_batch=2048, sequence_parallel=True, zero=1)
        return estimate_step(MODELS["gpt3-175b"], t, lay, Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=512)).step_time_s

    assert 1.2 < step("bf16") / step("fp8") < 1.8


def test_current_scaling_reads_every_cast_tensor_once_more_than_delayed():
    delayed, current = _env("fp8"), _env("fp8", recipe="current")
    d = {op.name: op.mem_bytes for op in layer_ops(L8, 0, 1, 4096, 1, 1, 1, False, True, "fp8", "hopper", "delayed")}
    c = {op.name: op.mem_bytes for op in layer_ops(L8, 0, 1, 4096, 1, 1, 1, False, True, "fp8", "hopper", "current")}
    assert c["cast-inputs"] > d["cast-inputs"] and c["cast-grads"] > d["cast-grads"]
    assert current.block_pass(L8.layer_kind(0), 1).total > delayed.block_pass(L8.layer_kind(0), 1).total


def test_block_scaled_formats_need_blackwell():
    with pytest.raises(ValueError, match="H100-SXM \\(hopper\\) has no mxfp8 tensor cores"):
        _env("mxfp8")
    with pytest.raises(ValueError, match="has no nvfp4 tensor cores"):
        _env("nvfp4")
    assert _env("nvfp4", cluster=B200).peak == 9e15


def test_dp_group_includes_context_parallel_ranks():
    # Megatron reduces gradients and shards the distributed optimizer over dp x cp: cp8 dp1 on 8
    # GPUs shards Adam's 12 bytes per parameter 8 ways, exactly like dp8 cp1
    c = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=8)
    t = TrainingSpec(seq_len=32768, global_batch=8)
    cp8 = estimate_step(L8, t, ParallelLayout(cp=8, dp=1, global_batch=8, zero=1), c)
    dp8 = estimate_step(L8, t, ParallelLayout(cp=1, dp=8, global_batch=8, zero=1), c)
    assert cp8.memory_breakdown_bytes["optimizer"] == pytest.approx(dp8.memory_breakdown_bytes["optimizer"])
    assert cp8.memory_breakdown_bytes["optimizer"] == pytest.approx(12 * L8.num_params / 8, rel=0.01)
    assert cp8.time_breakdown_s["dp_comm_exposed"] > 0  # the gradients are reduced over the 8 cp ranks


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_zero_levels_shard_what_they_say(zero):
    c = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=64)
    t = TrainingSpec(seq_len=4096, global_batch=64)
    cost = estimate_step(L8, t, ParallelLayout(dp=64, global_batch=64, zero=zero), c)
    mem = cost.memory_breakdown_bytes
    n = L8.num_params
    assert mem["optimizer"] == pytest.approx(12 * n / (64 if zero >= 1 else 1), rel=1e-9)
    assert mem["grads"] == pytest.approx(4 * n / (64 if zero >= 2 else 1), rel=1e-9)
    assert mem["weights"] == pytest.approx(2 * n / (64 if zero >= 3 else 1), rel=1e-9)


def test_zero3_gathers_every_micro_batch_and_costs_more_communication():
    c = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=64)
    t = TrainingSpec(seq_len=4096, global_batch=512)
    lay = ParallelLayout(dp=64, global_batch=512, micro_batch=1)  # 8 micro-batches per step
    z1 = estimate_step(L8, t, lay.model_copy(update={"zero": 1}), c).time_breakdown_s["dp_comm_exposed"]
    z3 = estimate_step(L8, t, lay.model_copy(update={"zero": 3}), c).time_breakdown_s["dp_comm_exposed"]
    keep = estimate_step(L8, t, lay.model_copy(update={"zero": 3, "reshard_after_forward": False}), c)
    assert z3 >= z1 and keep.time_breakdown_s["dp_comm_exposed"] <= z3


def test_pipeline_sends_across_nodes_are_exposed_in_fill_and_drain():
    # 2 stages of tp8 on two hosts. Interleaved with overlap, only the 2 (pp - 1) sends of the
    # fill and drain wait; without interleaving Megatron cannot overlap them (its arguments.py
    # turns --overlap-p2p-communication off), so every micro-batch waits for its two sends.
    c = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=16)
    t = TrainingSpec(seq_len=4096, global_batch=16)
    lay = ParallelLayout(tp=8, pp=2, dp=1, vpp=2, global_batch=16, sequence_parallel=True)
    one = 2 * 4096 * L8.hidden_size / 8 / (50e9 * 0.9) + 5e-6  # bytes / (NIC x efficiency) + IB latency
    overlapped = estimate_step(L8, t, lay, c).time_breakdown_s["pp_p2p"]
    assert overlapped == pytest.approx(2 * (2 - 1) * one)
    flat = lay.model_copy(update={"vpp": 1})
    for layout in (flat, flat.model_copy(update={"overlap_p2p": False})):
        blocking = estimate_step(L8, t, layout, c).time_breakdown_s["pp_p2p"]
        assert blocking == pytest.approx(16 * 2 * one)  # every micro-batch, forward and backward
    # without sequence parallelism each GPU sends the whole activation: 8 times the bytes
    no_sp = estimate_step(L8, t, flat.model_copy(update={"sequence_parallel": False}), c).time_breakdown_s["pp_p2p"]
    full = 2 * 4096 * L8.hidden_size / (50e9 * 0.9) + 5e-6
    assert no_sp == pytest.approx(16 * 2 * full)


def test_pipeline_sends_take_the_slowest_stage_boundary():
    # tp2 dp2 per stage on 8-GPU hosts: stages 0-1 (GPUs 0-3 -> 4-7) share a host, stages 1-2
    # (GPUs 4-7 -> 8-11) cross InfiniBand: the exposed sends are priced at the IB rate.
    c = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=16)
    t = TrainingSpec(seq_len=4096, global_batch=16)
    lay = ParallelLayout(tp=2, pp=4, dp=2, global_batch=16, sequence_parallel=True, overlap_p2p=False)
    ib = 2 * 4096 * L8.hidden_size / 2 / (50e9 * 0.9) + 5e-6
    assert estimate_step(L8, t, lay, c).time_breakdown_s["pp_p2p"] == pytest.approx(8 * 2 * ib)


def test_every_step_pays_the_fixed_overhead_and_mfu_counts_attention_both_ways():
    cost = est(vpp=2)
    assert cost.time_breakdown_s["overhead"] == DEFAULT_EFFICIENCY.step_overhead_s > 0
    # causal attention FLOPs are the full ones less half the s x s core: the ratio of the MFUs
    full = 3 * 1024 * 8192 * (4 * 8192 * MODEL.q_width) * MODEL.num_layers
    assert cost.mfu - cost.mfu_causal == pytest.approx(full / 2 / (cost.step_time_s * 1024 * 989.4e12), rel=1e-9)


def test_dp_traffic_crossing_spines_is_slower():
    # the same 256 replicas of one rail: inside one scalable unit (32 hosts x 8) a leaf suffices;
    # spread over two units the gradient reduction crosses spines and slows down
    from cost_models import collectives as coll

    c = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=4096)
    leaf = c.strided_links(0, 8, 32)  # 32 hosts, rail 0: one leaf
    spine = c.strided_links(0, 8, 64)  # 64 hosts: two scalable units
    eff = DEFAULT_EFFICIENCY
    per_byte = lambda links: coll.reduce_scatter_time(1e9, links, eff)  # noqa: E731
    assert per_byte(spine) / per_byte(leaf) == pytest.approx((63 / 64) / (31 / 32) / eff.spine_efficiency, rel=0.01)


def test_expert_groups_follow_megatron_over_cp_x_dp():
    # Mixtral at tp2 cp2 dp4 ep2 on 16 H100 (two 8-GPU hosts). Megatron flattens cp x dp (8 ranks
    # of stride tp = 2: GPUs 0, 2, ..., 14 for tp rank 0): EP takes consecutive ones, {0, 2};
    # the expert data-parallel group the rest at stride tp x ep = 4, {0, 4, 8, 12}: two hosts.
    m = MODELS["mixtral-8x7b"]
    lay = ParallelLayout(tp=2, cp=2, dp=4, ep=2, global_batch=64, sequence_parallel=True)
    env = CostEnv(m, TrainingSpec(seq_len=4096, global_batch=64), lay, Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=16))
    d = env.degree(2)
    assert (d.ep_links.size, d.ep_links.domains) == (2, 1)
    assert (d.expert_dp_links.size, d.expert_dp_links.domains, d.expert_dp_links.per_domain) == (4, 2, 2)
    assert d.dp_links.size == 8  # dense gradients: every cp x dp rank


def test_keeping_gathered_weights_after_forward_costs_the_stage_weights():
    # ZeRO-3 without resharding after forward keeps every layer's gathered bf16 weights from its
    # forward to its backward: P x 2 bytes (P = the stage's parameters on one GPU) plus one
    # layer's gradients, instead of two layers' weights and one's gradients.
    from cost_models.blocks import EMBED, HEAD

    m, cluster = MODELS["llama3-70b"], Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=64)
    training = TrainingSpec(seq_len=4096, global_batch=64)

    def layout(keep):
        return ParallelLayout(
            tp=8, dp=8, global_batch=64, sequence_parallel=True, zero=3, reshard_after_forward=not keep
        )

    env = CostEnv(m, training, layout(False), cluster)
    blocks = [EMBED, *(m.layer_kind(i) for i in range(m.num_layers)), HEAD]
    params = sum(sum(env.block_params(b, 8)) for b in blocks)
    largest = max(sum(env.block_params(b, 8)) for b in blocks)
    kept, resharded = (estimate_step(m, training, layout(k), cluster).memory_per_gpu_bytes for k in (True, False))
    expected = (2 * params + 4 * largest) - largest * (2 * 2 + 4)
    assert kept - resharded == pytest.approx(expected, rel=1e-9)
    assert expected > 15e9  # about 17.6 GB of a 70B model at tp8


def test_fp8_primary_weights_cover_only_gemm_weights():
    # Llama 3 8B at tp1, fp8 with fp8 primary weights: the embedding (128,256 x 4,096 =
    # 525,336,576 parameters) stays bf16, 2 bytes each; a layer's GEMM weights (218,103,808) take
    # 1 byte and its two norms (2 x 4,096) 2.
    m = MODELS["llama3-8b"]
    training = TrainingSpec(seq_len=8192, global_batch=8, dtype="fp8", fp8_params=True)
    env = CostEnv(m, training, ParallelLayout(global_batch=8, dp=8), Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=8))
    from cost_models.blocks import EMBED

    assert env.weight_bytes(EMBED, 1) == 2.0
    n = 218_103_808 + 8_192
    assert env.weight_bytes(m.layer_kind(0), 1) == pytest.approx((218_103_808 * 1 + 8_192 * 2) / n)


@pytest.mark.parametrize(("zero", "dtype"), [(0, "bf16"), (1, "bf16"), (2, "bf16"), (1, "fp8")])
def test_optimizer_step_is_fused_adam_over_the_shard_at_hbm_speed(zero, dtype):
    # Llama 3 8B at dp8 on one host. Fused Adam moves 34 bytes per parameter of this GPU's optimizer
    # shard (N / 8 from ZeRO-1, else all N); zeroing the gradient buffer writes its bytes per parameter it holds (all N
    # below ZeRO-2, N / 8 from it): 4 in bf16 training, 2 in fp8 (gradients reduced in bf16). fp8
    # also recasts each of the 32 layers' 218,103,808 GEMM weights once per step: read 2 bytes,
    # write the fp8 row-wise and column-wise copies (1 + 1 on Hopper).
    c = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=8)
    t = TrainingSpec(seq_len=4096, global_batch=8, dtype=dtype)
    cost = estimate_step(L8, t, ParallelLayout(dp=8, global_batch=8, zero=zero), c)
    n = L8.num_params
    grad = {"bf16": 4, "fp8": 2}[dtype]
    nbytes = (
        n / (8 if zero >= 1 else 1) * 34
        + grad * n / (8 if zero >= 2 else 1)
        + (32 * 218_103_808 * (2 + 2) if dtype == "fp8" else 0)
    )
    assert cost.time_breakdown_s["optimizer"] == pytest.approx(nbytes / (3.35e12 * 0.85), rel=1e-12)


# ---- which blocks a stage runs, and the fixed memory terms --------------------------------------
from cost_models.stage import range_blocks, runs_of, stage_blocks, stage_runs  # noqa: E402
from cost_models.step import EMBED, HEAD  # noqa: E402


def test_stage_blocks_follow_megatrons_interleaved_chunks():
    # 8 layers, pp2 vpp2: chunks of 2 layers; stage 0 runs chunks 0 and 2 (layers 0-1, 4-5) with
    # the embedding (index 0) first, stage 1 chunks 1 and 3 (layers 2-3, 6-7) with the LM head
    # (index L + 1 = 9) last. Layer i is block i + 1.
    m = L8.model_copy(update={"num_layers": 8})
    k = m.layer_kind(0)
    lay = ParallelLayout(tp=2, pp=2, dp=2, vpp=2, global_batch=8)
    assert stage_blocks(m, lay, 0) == [(0, EMBED), (1, k), (2, k), (5, k), (6, k)]
    assert stage_blocks(m, lay, 1) == [(3, k), (4, k), (7, k), (8, k), (9, HEAD)]
    assert stage_runs(m, lay, 0) == [(EMBED, 2, 1), (k, 2, 2), (k, 2, 2)]
    assert stage_runs(m, lay, 1) == [(k, 2, 2), (k, 2, 2), (HEAD, 2, 1)]
    # without interleaving, layers start..start+count-1 of a stage (the per-layer solver's view)
    flat = lay.model_copy(update={"vpp": 1})
    assert range_blocks(m, flat, 0, 0, 3) == [(0, EMBED), (1, k), (2, k), (3, k)]
    assert range_blocks(m, flat, 1, 3, 5) == [(4, k), (5, k), (6, k), (7, k), (8, k), (9, HEAD)]
    # per-layer degrees (indexed by block) merge into runs of equal block and degree
    degrees = (2, 2, 1, 1, 2, 2, 2, 2, 2, 1)
    assert runs_of(stage_blocks(m, flat, 0), degrees) == [(EMBED, 2, 1), (k, 2, 1), (k, 1, 2), (k, 2, 1)]
    per_layer = flat.model_copy(update={"layer_tp": degrees})
    assert stage_runs(m, per_layer, 1) == [(k, 2, 4), (HEAD, 1, 1)]


def test_memory_reserves_two_gigabytes_for_the_runtime_and_fits_leaves_the_headroom():
    cost = estimate_step(L8, TrainingSpec(seq_len=4096, global_batch=64), ParallelLayout(dp=64, global_batch=64), H64)
    assert cost.memory_breakdown_bytes["runtime_reserved"] == 2e9  # CUDA context, NCCL buffers, allocator slack
    assert cost.memory_breakdown_bytes["low_precision_weights"] == 0.0  # bf16 training keeps no cast copies
    half = cost.model_copy(update={"memory_per_gpu_bytes": cost.hbm_bytes / 2})
    assert half.fits() and half.fits(0.5) and not half.fits(0.51)
    assert not half.model_copy(update={"memory_per_gpu_bytes": cost.hbm_bytes * 1.01}).fits()


def test_a_stage_pays_each_change_of_degree_once_split_between_forward_and_backward():
    # 4 layers at tp4 without SP, layers 1-2 at degree 1: the stage time is its blocks' passes
    # plus one shrink (4 -> 1) and one growth (1 -> 4), half of each in forward, half in backward
    m = L8.model_copy(update={"num_layers": 4})
    t = TrainingSpec(seq_len=4096, global_batch=8)
    degrees = (4, 4, 1, 1, 4, 4)
    lay = ParallelLayout(tp=4, dp=2, global_batch=8, layer_tp=degrees)
    c = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=8)
    env = CostEnv(m, t, lay, c)
    blocks = [EMBED, *(m.layer_kind(i) for i in range(4)), HEAD]
    passes = sum(env.block_pass(b, d).total for b, d in zip(blocks, degrees, strict=True))
    switches = env.transition_time(4, 1) + env.transition_time(1, 4)
    assert switches > 0
    assert estimate_step(m, t, lay, c).stage_time_s == [pytest.approx(passes + switches, rel=1e-12)]


@pytest.mark.parametrize(("dp", "zero", "buckets"), [(8, 1, 201), (64, 1, 126), (128, 0, 63), (8, 3, 32)])
def test_gradient_buckets_are_megatrons_size_or_one_layer_under_zero3(dp, zero, buckets):
    # Llama 3 8B has 8,030,261,248 parameters, all on one stage. Megatron's bucket holds
    # max(40M, 1M x dp) parameters: ceil(8.03e9 / 40e6) = 201 at dp8, / 64e6 = 126 at dp64,
    # / 128e6 = 63 at dp128; ZeRO-3 gathers and reduces one transformer layer at a time: 32.
    from cost_models.stage import stage_cost

    c = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=dp)
    lay = ParallelLayout(dp=dp, global_batch=dp, zero=zero)
    env = CostEnv(L8, TrainingSpec(seq_len=4096, global_batch=dp), lay, c)
    assert stage_cost(env, stage_runs(L8, lay, 0)).dp.buckets == buckets


@pytest.mark.parametrize("zero", [0, 1, 2])
def test_dp_traffic_of_a_stage_is_one_collective_per_run_of_blocks(zero):
    # Llama 3 8B at tp4 dp2 on one host: N parameters per GPU, its DP peer 4 GPUs away over
    # NVLink. Below ZeRO-1 the gradients (4 bytes each) are
    # all-reduced: 2 x (1/2) x 4N / bw; from ZeRO-1 reduce-scattered, (1/2) x 4N / bw, and the bf16
    # weights all-gathered, (1/2) x 2N / bw. The stage's three runs (embedding, 32 layers, LM head)
    # each pay a tree's latency: 2 log2(2) x 1 us per all-reduce, half that per half of it.
    from cost_models.stage import stage_cost

    c = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=8)
    lay = ParallelLayout(tp=4, dp=2, global_batch=2, zero=zero)
    env = CostEnv(L8, TrainingSpec(seq_len=4096, global_batch=2), lay, c)
    n = sum(sum(env.block_params(b, 4)) for b in (EMBED, *(L8.layer_kind(i) for i in range(32)), HEAD))
    bw = 450e9 * DEFAULT_EFFICIENCY.nvlink_efficiency
    dp = stage_cost(env, stage_runs(L8, lay, 0)).dp
    if zero == 0:
        assert (dp.reduce_s, dp.gather_s) == pytest.approx((4 * n / bw + 3 * 2e-6, 0.0), rel=1e-12)
    else:
        assert (dp.reduce_s, dp.gather_s) == pytest.approx((2 * n / bw + 3e-6, n / bw + 3e-6), rel=1e-12)


def test_pipeline_sends_inside_a_host_go_over_nvlink_and_pp2_interleaving_shrinks_the_bubble():
    # tp2 pp2 dp2 on one host: stage 1 is 4 GPUs after stage 0. Without overlap each of the 4
    # micro-batches waits for its send forward and backward: 2 bytes x 4096 x 4096 / tp2 per send.
    c = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=8)
    t = TrainingSpec(seq_len=4096, global_batch=8)
    lay = ParallelLayout(tp=2, pp=2, dp=2, global_batch=8, sequence_parallel=True, overlap_p2p=False)
    one = 2 * 4096 * 4096 / 2 / (450e9 * DEFAULT_EFFICIENCY.nvlink_efficiency) + 1e-6
    assert estimate_step(L8, t, lay, c).time_breakdown_s["pp_p2p"] == pytest.approx(4 * 2 * one, rel=1e-12)
    # two virtual stages at pp2: the fill and drain are the other stage's time over vpp
    cost = estimate_step(L8, t, lay.model_copy(update={"vpp": 2}), c)
    times = cost.stage_time_s
    assert cost.time_breakdown_s["pp_bubble"] == pytest.approx((sum(times) - max(times)) / 2, rel=1e-12)


def test_a_tied_lm_head_on_the_last_stage_adds_its_copy_to_the_stages_parameters():
    # GPT-3 175B at tp8 pp2: the last stage's own copy of the 51,200 x 12,288 embedding, over tp8,
    # is optimised and synchronised with it; with pp1 the head shares the embedding's.
    from cost_models.stage import stage_cost

    gpt = MODELS["gpt3-175b"]
    t = TrainingSpec(seq_len=2048, global_batch=8)
    piped = ParallelLayout(tp=8, pp=2, dp=1, global_batch=8)
    env = CostEnv(gpt, t, piped, Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=16))
    flat = CostEnv(gpt, t, piped.model_copy(update={"pp": 1}), Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=8))
    runs = stage_runs(gpt, piped, 1)
    extra = stage_cost(env, runs).params - stage_cost(flat, runs).params
    assert extra == pytest.approx(51200 * 12288 / 8, rel=1e-12)


def _stage(reduce_s, gather_s, buckets=3):
    """A stage whose micro-batch takes 1 s forward and 2 s backward, with the given DP traffic."""
    from cost_models.blocks import Pass
    from cost_models.data_parallel import DpTraffic
    from cost_models.stage import StageCost

    dp = DpTraffic(reduce_s=reduce_s, gather_s=gather_s, buckets=buckets)
    return StageCost(Pass(fwd=1.0, bwd=2.0), 0.0, {}, 0.0, 0.0, dp, 0.0, 0.0, 0.0)


@pytest.mark.parametrize(
    ("vpp", "zero", "stage1_reduce_s", "expected"),
    [
        # 1F1B, 3 buckets on stage 0: max(6/3, 6 - 2 x 2/3) + max(3/3, 3 - 1 x 2/3); stage 1
        # finishes its backward one micro-batch earlier (6 - 2, 3 - 1 exposed): smaller
        (1, 1, 6.0, 14 / 3 + 7 / 3),
        # a larger stage 1 moves its gradients in one piece after its last backward: 12 - 2
        (1, 1, 12.0, 10 + 7 / 3),
        # interleaved pp2 vpp2, 4 micro-batches: stage 0 reduces over the cool-down of 5 chunk
        # backwards (2.5 micro-batches), stage 1 over 3 (1.5), each in vpp = 2 pieces:
        # max(6 - 2 x 1.5 / 2, 6 - 5 / 2) + max(3 - 1.5 / 2, 3 - 2.5 / 2) = 4.5 + 2.25
        (2, 1, 6.0, 4.5 + 2.25),
        # ZeRO-3 stalls every micro-batch: no drain slack for stage 1, whose traffic is larger:
        # 4 x max(15/3, 15 - 2 x 2/3) + 4 x max(3/3, 3 - 2/3)
        (1, 3, 12.0, 4 * (15 - 4 / 3) + 4 * (3 - 2 / 3)),
    ],
)
def test_dp_exposure_of_the_step_takes_each_stages_slack(vpp, zero, stage1_reduce_s, expected):
    from cost_models.step import dp_exposed_s

    lay = ParallelLayout(pp=2, dp=1, vpp=vpp, global_batch=4, zero=zero)
    got = dp_exposed_s(lay, [_stage(6.0, 3.0), _stage(stage1_reduce_s, 3.0)])
    assert got == pytest.approx(expected, rel=1e-12)
