"""The MoE cost model (cost_models.moe, flops.moe_ops, the MoE parts of blocks and step) against
hand-derived numbers, closed forms and brute force."""

from __future__ import annotations

import itertools
import math

import pytest

from cost_models import moe
from cost_models.blocks import CostEnv
from cost_models.catalogue import MODELS
from cost_models.collectives import all_gather_time
from cost_models.efficiency import DEFAULT_EFFICIENCY as EFF
from cost_models.flops import moe_ops
from cost_models.layout import ParallelLayout
from cost_models.step import estimate_step
from cost_models.training import TrainingSpec
from topologies.cluster import Cluster
from topologies.cluster_catalogue import CLUSTERS

MIXTRAL = MODELS["mixtral-8x7b"]  # 8 experts, top 2, hidden 4096, expert width 14336, no shared expert
H64 = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=64)  # 8-GPU NVLink nodes
TRAIN = TrainingSpec(seq_len=4096, global_batch=256)


def _env(model=MIXTRAL, training=TRAIN, cluster=H64, **lay) -> CostEnv:
    kw = {"tp": 2, "dp": 32, "global_batch": 256, "sequence_parallel": True, **lay}
    return CostEnv(model, training, ParallelLayout(**kw), cluster)


# ---- load imbalance and capacity -----------------------------------------------------------------
def test_expected_max_of_normals_matches_the_exact_order_statistics():
    # E[max of 2 standard normals] = 1 / sqrt(pi); of 8: 1.4236 (Harter's tables)
    assert moe.expected_max_normal(1) == 0.0
    assert moe.expected_max_normal(2) == pytest.approx(1 / math.sqrt(math.pi), rel=0.05)
    assert moe.expected_max_normal(8) == pytest.approx(1.4236, rel=0.01)


def test_imbalance_is_one_at_uniform_routing_and_for_one_rank():
    assert moe.imbalance_factor(8, 4, math.inf, 0.0) == 1.0  # no skew, no sampling noise
    assert moe.imbalance_factor(1, 8, 10.0, 0.5) == 1.0  # nobody to wait for


def test_imbalance_closed_form():
    # ep 8, 4 experts per rank, 100 rows per expert, cv 0.2: cv_rank = sqrt((0.04 + 0.01) / 4)
    got = moe.imbalance_factor(8, 4, 100.0, 0.2)
    assert got == pytest.approx(1 + math.sqrt(0.0125) * 1.4236, rel=2e-3)  # Blom: within 0.1%
    assert moe.imbalance_factor(8, 4, 100.0, 0.4) > got > moe.imbalance_factor(8, 16, 100.0, 0.2)


def test_capacity_factor_caps_the_busiest_rank():
    assert moe.routed_load(1.4, None) == 1.4  # dropless
    assert moe.routed_load(1.4, 1.25) == 1.25  # dropped past capacity
    assert moe.routed_load(1.1, 1.25) == 1.1
    assert moe.routed_load(1.1, 1.25, pad_to_capacity=True) == 1.25


# ---- compute ---------------------------------------------------------------------------------------
def test_moe_ops_rows_and_widths_by_hand():
    # 4096 tokens in the TP group of 2: 2048 per GPU; etp 2 gathers 4096; x top 2 x ep 4 / 8 experts
    ops = {op.name: op for op in moe_ops(MIXTRAL, 4096, 2, 4)}
    up, down = ops["experts-up"], ops["experts-down"]
    assert (up.m, up.n, up.k, up.batch) == (4096, 2 * 7168, 4096, 2)
    assert (down.m, down.n, down.k) == (4096, 4096, 7168)
    assert ops["router"].m == 2048 and ops["permute"].mem_bytes == 2 * 2 * 2048 * 4096 * 3
    # folded (etp 1): each GPU's own 2048 tokens on whole experts, no expert-TP re-sort
    folded = {op.name: op for op in moe_ops(MIXTRAL, 4096, 2, 4, etp=1, load=1.5)}
    assert (folded["experts-up"].m, folded["experts-up"].n) == (3072, 2 * 14336)  # 2048 x 2 x 4 / 8 x 1.5
    assert "permute-etp" not in folded and "permute-etp" in ops
    # the FLOPs of the experts on one GPU do not depend on how the grid splits them (at equal load)
    flops = lambda o: sum(op.flops for op in o if op.name.startswith("experts-"))  # noqa: E731
    assert flops(moe_ops(MIXTRAL, 4096, 2, 4, etp=1)) == pytest.approx(flops(ops.values()))
    no_aux = {op.name for op in moe_ops(MIXTRAL, 4096, 2, 4, aux_loss=False)}
    assert "router-aux-loss" in ops and "router-aux-loss" not in no_aux


def test_gpt_oss_expert_bias_pass_by_hand():
    # GPT-OSS's fc2 bias, added per expert outside the GEMM over every received row (hidden 2,880):
    # 4,096 tokens (tp 1) x top 4 x ep 8 / 128 experts = 1,024 rows an expert, 16 local experts = 16,384
    # rows. 16-bit probabilities (all-to-all): 12 bytes an element forward, 12 backward;
    # fp32 (DeepEP / HybridEP): 28 forward, 36 backward (flops.expert_bias_bytes' itemised passes)
    from cost_models.flops import expert_bias_bytes, layer_ops

    assert expert_bias_bytes(2) == (12.0, 12.0) and expert_bias_bytes(4) == (28.0, 36.0)
    oss = MODELS["gpt-oss-120b"]
    bias = {op.name: op for op in moe_ops(oss, 4096, 1, 8)}["experts-bias"]
    assert bias.mem_bytes == 12 * 16_384 * 2_880 == 566_231_040 and (bias.fwd, bias.bwd) == (1.0, 1.0)
    fp32 = {op.name: op for op in moe_ops(oss, 4096, 1, 8, probs_bytes=4)}["experts-bias"]
    assert fp32.mem_bytes == 28 * 16_384 * 2_880 and fp32.bwd * fp32.mem_bytes == pytest.approx(36 * 16_384 * 2_880)
    # experts without biases (Mixtral, Qwen3, DeepSeek-V3) have no such pass
    assert "experts-bias" not in {op.name for op in moe_ops(MIXTRAL, 4096, 2, 4)}
    # the layer takes the dispatcher's probabilities: flex's fp32 pass costs 28 / 12 of the all-to-all's
    h100 = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=64)
    train = TrainingSpec(seq_len=4096, global_batch=512)
    got = {}
    for dispatcher in ("alltoall", "flex"):
        lay = ParallelLayout(tp=1, dp=64, ep=8, global_batch=512, moe_dispatcher=dispatcher)
        env = CostEnv(oss, train, lay, h100)
        d, kind = env.degree(1), oss.layer_kind(0)
        ops = layer_ops(oss, kind, d.seqs, 4096, 1, 1, 8, False, True, "bf16", env.arch, "delayed", 4)
        got[dispatcher] = next(op for op in env._moe_layer_ops(ops, d) if op.name == "experts-bias").mem_bytes
    assert got["flex"] / got["alltoall"] == pytest.approx(28 / 12)
    # under full-iteration CUDA graphs the eager pass cannot run (its split reads the row counts on the host):
    # the graphed recipes' fused grouped MLP adds fc2's bias in Transformer Engine's GroupedLinear
    lay = ParallelLayout(tp=1, dp=64, ep=8, global_batch=512, moe_dispatcher="flex")
    graphed = CostEnv(oss, train.model_copy(update={"cuda_graphs": True}), lay, h100)
    names = {op.name for op in graphed._moe_layer_ops(ops, d)}
    assert "experts-bias" not in names and "experts-down" in names


def test_grouped_gemm_factor_closed_form():
    half = 166.0
    got = moe.grouped_gemm_factor(EFF, 512, 768, 2048, half)
    h2 = half * EFF.grouped_gemm_half_dim / EFF.gemm_half_dim
    want = EFF.grouped_gemm_fraction * (512 / (512 + h2)) * (768 / (768 + h2)) * (2048 / (2048 + h2))
    assert got == pytest.approx(want, rel=1e-12)
    same = EFF.model_copy(update={"grouped_gemm_fraction": 1.0, "grouped_gemm_half_dim": EFF.gemm_half_dim})
    assert moe.grouped_gemm_factor(same, 512, 768, 2048, half) == EFF.shape_factor(512, 768, 2048, half)


# ---- dispatch ---------------------------------------------------------------------------------------
def _shape(ep=8, etp=1, experts=8, top_k=2, tokens=1024, load=1.0):
    return moe.MoeShape(tokens, 4096, experts, top_k, 14336, ep, etp, load)


def test_dispatch_bytes_by_hand():
    a2a = moe.dispatch_bytes("alltoall", _shape(), 1, 2)
    assert (a2a.all_to_all, a2a.etp_all_gather) == (1024 * 2 * 4096 * 2, 0.0)
    assert moe.dispatch_bytes("alltoall", _shape(etp=2), 1, 2).etp_all_gather == 1024 * 2 * 4096 * 2 * 2
    assert moe.dispatch_bytes("alltoall", _shape(load=1.5), 1, 2).all_to_all == 1.5 * a2a.all_to_all
    # all-gather: each token once, with a routing-map byte and an fp32 probability per expert, from ep x etp
    ag = moe.dispatch_bytes("allgather", _shape(ep=4, etp=2), 1, 2)
    assert ag.tp_ep_all_gather == 1024 * (4096 * 2 + 8 * 5) * 8


def test_flex_across_two_nodes_equals_hand_derived_dedup():
    # 16 experts on ep 16 over 2 nodes, top 2: a token misses the other node with C(8,2)/C(16,2) = 28/120
    b = moe.dispatch_bytes("flex", _shape(ep=16, experts=16), 2, 2)
    row = 1024 * 4096 * 2
    assert b.scaleout == pytest.approx(row * 92 / 120)
    assert b.nvlink == pytest.approx(row * 2)  # two distinct GPUs per token, one expert on each
    # brute force over every pair of distinct experts (GPU g holds expert g, node g // 8)
    pairs = list(itertools.combinations(range(16), 2))
    remote = sum(any(e // 8 != 0 for e in p) for p in pairs) / len(pairs)  # seen from node 0
    assert b.scaleout == pytest.approx(row * remote)
    # 4 experts per GPU, top 4: copies for experts on one GPU go once
    b4 = moe.dispatch_bytes("flex", _shape(ep=4, experts=16, top_k=4), 1, 2)
    quads = list(itertools.combinations(range(16), 4))
    distinct = sum(len({e // 4 for e in q}) for q in quads) / len(quads)
    assert b4.nvlink == pytest.approx(row * distinct) and b4.scaleout == 0


def test_flex_dispatch_time_is_the_slower_tier():
    c = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=16)
    group = c.strided_links(0, 1, 16)
    links = moe.ExpertLinks(ep=group, etp=c.strided_links(0, 1, 1), tp_ep=group)
    b = moe.DispatchBytes(scaleout=3e8, nvlink=1e8)
    net = 3e8 / (group.scaleout_bw_bytes_per_s * EFF.scaleout_efficiency)
    got = moe.dispatch_time(b, links, lambda *a: 0.0, EFF)
    assert got == pytest.approx(net + 4 * group.scaleout_latency_s)


# ---- overlap ----------------------------------------------------------------------------------------
def test_exposed_dispatch_with_overlap_hand_example():
    assert moe.exposed_dispatch("none", 3.0, 3.0, 1.0, 2.0) == 6.0
    # forward's 3 s behind the other micro-batch's 2 s of backward, backward's 3 s behind 1 s of forward
    assert moe.exposed_dispatch("1f1b", 3.0, 3.0, 1.0, 2.0) == (3 - 2) + (3 - 1)
    assert moe.exposed_dispatch("dualpipe", 1.0, 1.0, 1.0, 2.0) == 0.0
    assert [moe.unpaired_micro_batches("1f1b", pp, 8) for pp in (1, 4, 16)] == [1, 4, 8]
    assert moe.unpaired_micro_batches("dualpipe", 8, 32) == 4 and moe.unpaired_micro_batches("none", 8, 32) == 0


def test_step_pays_the_unpaired_micro_batches_in_full():
    lay = {"ep": 8, "etp": 1, "moe_overlap": "1f1b"}
    env = _env(**lay)
    p = env.block_pass(MIXTRAL.layer_kind(0), 2)
    assert 0 == p.ep_comm < p.ep_comm_full  # in one node the dispatch hides entirely
    step = estimate_step(MIXTRAL, TRAIN, env.layout, H64)
    m = env.layout.num_micro_batches
    layers = MIXTRAL.num_layers
    want = layers * (m * p.ep_comm + 1 * (p.ep_comm_full - p.ep_comm))  # pp 1: one micro-batch alone
    assert step.time_breakdown_s["ep_comm"] == pytest.approx(want)


# ---- parallel folding -------------------------------------------------------------------------------
def test_folding_removes_the_expert_tp_collective():
    kind = MIXTRAL.layer_kind(0)
    unfolded, folded = _env().block_pass(kind, 2), _env(etp=1).block_pass(kind, 2)
    assert folded.ep_comm == 0.0 and folded.tp_comm == unfolded.tp_comm  # the attention's TP collectives stay
    # unfolded, ep 1: the expert-TP all-gather after dispatch and reduce-scatter before combine, forward
    # and backward: 4 x the gathered rows (4096 x 4096 tokens per micro-batch / TP 2, x top 2 x etp 2)
    env = _env()
    links = env.degree(2).experts.etp
    gathered = 2 * (4096 // 2) * 2 * 4096 * 2
    assert unfolded.ep_comm == pytest.approx(4 * all_gather_time(gathered, links, EFF))


def test_folding_divides_expert_weights_by_ep_only():
    kind = MIXTRAL.layer_kind(0)
    experts = MIXTRAL.layer_expert_params(kind)
    assert _env(ep=8, etp=1).block_params(kind, 2)[1] == experts / 8
    assert _env(ep=8).block_params(kind, 2)[1] == experts / 16
    assert _env(ep=8, etp=1).block_params(kind, 2)[0] == _env(ep=8).block_params(kind, 2)[0]


def test_folded_ep_group_stays_in_the_node():
    # tp 2 ep 8: unfolded EP takes every other rank (16 GPUs, two nodes); folded the first 8 (one node)
    assert _env(ep=8).degree(2).ep_links.domains == 2
    assert _env(ep=8, etp=1).degree(2).ep_links.domains == 1
    assert _env(ep=8, etp=1).degree(2).expert_dp_links.size == 64 // 8


def test_the_recipes_flex_backend_decides_the_fused_permute():
    # dgx-h100 hosts 8 GPUs in one NVLink domain: the cluster's rule is DeepEP (Megatron permutes after
    # the dispatch); a recipe that names HybridEP there (Megatron-Bridge's Qwen3-30B-A3B, DeepSeek-V3 on
    # B200) permutes inside the kernels, and one that names DeepEP on an NVL72 keeps the passes
    from cost_models.flops import layer_ops

    assert moe.flex_backend_of(None, 8, 8) == "deepep" and moe.flex_backend_of(None, 72, 4) == "hybridep"
    assert moe.flex_backend_of("hybridep", 8, 8) == "hybridep" and moe.flex_backend_of("deepep", 72, 4) == "deepep"
    layout = _env(ep=8, etp=1, moe_dispatcher="flex").layout
    auto = CostEnv(MIXTRAL, TRAIN, layout, H64)
    hybrid = CostEnv(MIXTRAL, TRAIN.model_copy(update={"moe_flex_backend": "hybridep"}), layout, H64)
    d, kind = auto.degree(2), MIXTRAL.layer_kind(0)
    ops = layer_ops(MIXTRAL, kind, d.seqs, TRAIN.seq_len, 2, 1, 8, True, True, "bf16", auto.arch, "delayed", 4)
    names = {op.name for op in auto._moe_layer_ops(ops, d)} - {op.name for op in hybrid._moe_layer_ops(ops, d)}
    assert names == {"permute", "unpermute"}
    # each pass reads and writes the tokens' rows once plus their k copies, 16-bit: 2 x 2 x t x h x (1 + k);
    # t = 4,096 tokens of the TP pair (seq 4,096, one sequence a micro-batch) over tp 2 = 2,048 a GPU,
    # h 4,096, k 2: 2 x 2 x 2,048 x 4,096 x 3 = 100,663,296 bytes
    permute = next(op for op in auto._moe_layer_ops(ops, d) if op.name == "permute")
    assert permute.mem_bytes == 100_663_296
    one = auto.op_time(permute) + EFF.kernel_overhead_s
    a, b = auto.block_pass(kind, 2), hybrid.block_pass(kind, 2)
    assert a.fwd - b.fwd == pytest.approx(2 * one, rel=1e-9)  # permute and unpermute, forward once each
    assert a.bwd - b.bwd == pytest.approx(2 * one, rel=1e-9)
    gb200 = Cluster(spec=CLUSTERS["gb200-nvl72"], num_gpus=64)
    deep = TRAIN.model_copy(update={"moe_flex_backend": "deepep"})
    ran = {op.name for op in CostEnv(MIXTRAL, deep, layout, gb200)._moe_layer_ops(ops, d)}
    assert {"permute", "unpermute"} <= ran
    assert not {"permute", "unpermute"} & {
        op.name for op in CostEnv(MIXTRAL, TRAIN, layout, gb200)._moe_layer_ops(ops, d)
    }


def test_a_dense_layer_has_no_moe_terms():
    # flex over two nodes (tp 2 ep 8 unfolded: its ep x etp group is GPUs 0-15) stalls as the all-to-all
    # does; folded (etp 1) the group is GPUs 0-7, one node
    scale = EFF.model_copy(update={"moe_host_sync_s": {"flex": 0.001, "flex_scaleout": 0.003}})
    for etp, domains, stall in ((2, 2, 0.003), (1, 1, 0.001)):
        env = CostEnv(MIXTRAL, TRAIN, _env(ep=8, etp=etp, moe_dispatcher="flex").layout, H64, scale)
        assert env.degree(2).experts.tp_ep.domains == domains
        assert env._host_sync_s(env.degree(2)) == stall
    dense = MODELS["llama3-8b"]
    env = CostEnv(dense, TRAIN, ParallelLayout(tp=2, dp=32, global_batch=256, sequence_parallel=True), H64)
    p = env.block_pass(dense.layer_kind(0), 2)
    assert p.ep_comm == p.ep_comm_full == 0.0
    step = estimate_step(dense, TRAIN, env.layout, H64)
    assert step.time_breakdown_s["ep_comm"] == 0.0


# ---- host sync and multi-token prediction ---------------------------------------------------------
def test_host_sync_stalls_each_moe_layer_forward_once():
    kind = MIXTRAL.layer_kind(0)
    for dispatcher in ("alltoall", "flex"):
        lay = {"ep": 8, "etp": 1, "moe_dispatcher": dispatcher}
        none = EFF.model_copy(update={"moe_host_sync_s": {"alltoall": 0.0, "allgather": 0.0, "flex": 0.0}})
        sync = EFF.model_copy(update={"moe_host_sync_s": {"alltoall": 0.004, "allgather": 0.0, "flex": 0.001}})
        layout = _env(**lay).layout
        a = CostEnv(MIXTRAL, TRAIN, layout, H64, none).block_pass(kind, 2)
        b = CostEnv(MIXTRAL, TRAIN, layout, H64, sync).block_pass(kind, 2)
        assert b.fwd - a.fwd == pytest.approx(0.004 if dispatcher == "alltoall" else 0.001, rel=1e-9)
        assert b.bwd == a.bwd
    # flex over two nodes (ep 16 at etp 1 spans GPUs 0-15) stalls as the all-to-all does
    two_nodes = _env(ep=8, etp=2, tp=2, moe_dispatcher="flex").layout.model_copy(update={"ep": 8})
    scale = EFF.model_copy(update={"moe_host_sync_s": {"flex": 0.001, "flex_scaleout": 0.003}})
    env = CostEnv(MIXTRAL, TRAIN, two_nodes, H64, scale)
    assert env.degree(2).experts.tp_ep.domains == 2
    assert env._host_sync_s(env.degree(2)) == 0.003
    assert CostEnv(MIXTRAL, TRAIN, _env(ep=8, etp=1, moe_dispatcher="flex").layout, H64, scale)._host_sync_s(
        env.degree(2)
    ) == pytest.approx(0.003)
    dense = MODELS["llama3-8b"]
    env = CostEnv(dense, TRAIN, ParallelLayout(tp=2, dp=32, global_batch=256, sequence_parallel=True), H64)
    assert (
        env.block_pass(dense.layer_kind(0), 2).fwd
        == CostEnv(dense, TRAIN, env.layout, H64, EFF.model_copy(update={"moe_host_sync_s": {"alltoall": 1.0}}))
        .block_pass(dense.layer_kind(0), 2)
        .fwd
    )  # a dense layer has no experts to sync


def test_mtp_module_adds_its_layer_projection_and_output_pass_to_the_head():
    from cost_models.blocks import HEAD
    from cost_models.flops import embedding_ops, gemm

    v3 = MODELS["deepseek-v3"]
    cluster = Cluster(spec=CLUSTERS["dgx-b200"], num_gpus=64)
    training = TrainingSpec(seq_len=4096, global_batch=64)
    lay = ParallelLayout(tp=1, dp=64, ep=64, etp=1, global_batch=64)
    with_mtp = CostEnv(v3, training, lay, cluster)
    without = CostEnv(v3.model_copy(update={"mtp_layers": 0}), training, lay, cluster)
    head, bare = with_mtp.block_pass(HEAD, 1), without.block_pass(HEAD, 1)
    layer = with_mtp.block_pass(v3.mtp_layer_kind, 1)
    tokens, h = 4096, v3.hidden_size
    proj = with_mtp.op_time(gemm("mtp-proj", tokens, h, 2 * h)) + EFF.kernel_overhead_s
    norms = 2 * 2 * 2 * tokens * h / with_mtp.mem_bw + EFF.kernel_overhead_s  # two RMSNorms, read + write 2 bytes
    lookup = with_mtp.ops_pass(embedding_ops(v3, 1, 4096, 1, 1, training.grad_bytes))
    assert head.fwd - 2 * bare.fwd == pytest.approx(layer.fwd + proj + norms + lookup.fwd, rel=1e-9)
    assert head.ep_comm == layer.ep_comm > 0
    dense, expert = with_mtp.block_params(HEAD, 1, last_stage_ties=True)
    assert expert == pytest.approx(v3.layer_expert_params(v3.mtp_layer_kind) / 64)
    assert with_mtp.block_activation_bytes(HEAD, 1) > 0 == without.block_activation_bytes(HEAD, 1)


def test_expert_waves_count_whole_waves_of_tiles_over_the_sms():
    from cost_models.moe import expert_concurrency, expert_waves

    blackwell = EFF.gemm_tile["blackwell"]
    assert blackwell == (256, 256, 2) and EFF.gemm_tile["hopper"] == (128, 256, 1)
    # GPT-OSS on GB200 at ep 64, micro-batch 4: 2 local experts of 32,768 rows, up-projection 5,760 x 2,880.
    # Forward 23 x 128 x 2 = 5,888 tiles on 74 SM pairs: 79.6 waves, 80; data gradient 12 x 128 x 2 = 3,072:
    # 41.5, 42; weight gradient 23 x 12 x 2 = 552: 7.46, 8
    fwd, dgrad, wgrad = 80 / (5888 / 74), 42 / (3072 / 74), 8 / (552 / 74)
    assert expert_waves(32768, 5760, 2880, 2, blackwell, 148) == pytest.approx((fwd + dgrad + wgrad) / 3)
    # one tile's worth of work takes a whole wave: 1 tile of 74 slots costs 74 tiles' time in each pass
    assert expert_waves(256, 256, 256, 1, blackwell, 148) == pytest.approx(74.0)
    # on Hopper a tile is 128 weight rows x 256 tokens on one of 132 SMs: 33 x 4 = 132 tiles, one wave
    assert expert_waves(1024, 4224, 4224, 1, EFF.gemm_tile["hopper"], 132) == pytest.approx(
        (1 + 1 + math.ceil(33 * 17 / 132) / (33 * 17 / 132)) / 3
    )
    # Transformer Engine's four compute streams, or every local expert in a CUDA graph's grouped GEMM
    assert EFF.expert_gemm_streams == 4
    assert [expert_concurrency(e, 4, False) for e in (1, 2, 16)] == [1, 2, 4]
    assert expert_concurrency(16, 4, True) == 16
