"""Every factor of the block costs pinned to a number derived by hand from the docstrings' formulas.

Hardware figures (DGX H100, ``topologies.cluster_catalogue``): NVLink 900 GB/s bidirectional =
450 GB/s one way and 1 us per message step; the NIC 400 Gb/s = 50 GB/s and 5 us; dense bf16 peak
989.4 TFLOP/s. Fitted fractions are read from ``DEFAULT_EFFICIENCY`` (a re-fit must not break
these tests); what is pinned is how the formulas use them. Llama 3 8B: hidden 4,096, 32 query
heads and 8 KV heads of 128; Mixtral 8x7B: hidden 4,096, top-2 routing.
"""

import dataclasses
import math

import pytest

from cost_models import MODELS, ParallelLayout, TrainingSpec, estimate_step
from cost_models.blocks import EMBED, HEAD, CostEnv
from cost_models.efficiency import DEFAULT_EFFICIENCY as EFF
from cost_models.flops import gemm, layer_ops
from topologies import CLUSTERS, Cluster

L8, MIXTRAL = MODELS["llama3-8b"], MODELS["mixtral-8x7b"]
NVL_BW, NVL_LAT = 450e9 * EFF.nvlink_efficiency, 1e-6
IB_BW, IB_LAT = 50e9 * EFF.scaleout_efficiency, 5e-6
BF16_PEAK = 989.4e12
ATTENTION = BF16_PEAK * EFF.flash_efficiency["hopper"]["cudnn"]  # FLOP/s of fused attention on H100


def env_of(model=L8, gpus=8, seq=8192, dtype="bf16", eff=EFF, **layout):
    layout = {"global_batch": 8, **layout}
    training = TrainingSpec(seq_len=seq, global_batch=layout["global_batch"], dtype=dtype)
    return CostEnv(model, training, ParallelLayout(**layout), Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=gpus), eff)


def nvlink_all_reduce(nbytes, n):
    """Ring all-reduce inside one NVLink domain: 2 (n - 1)/n of the buffer per GPU, and a tree's
    2 log2(n) latency steps (half for each of its reduce-scatter and all-gather)."""
    return 2 * ((n - 1) / n * nbytes / NVL_BW + 2 * math.ceil(math.log2(n)) * NVL_LAT / 2)


# ---- context parallelism: the ring exchange of K and V (CostEnv._cp_comm) ----------------------


@pytest.mark.parametrize("cp", [2, 4])
def test_cp_ring_exposes_the_kv_send_that_outlasts_a_chunk_of_attention(cp):
    # tp8 x cp on cp hosts: ring neighbours sit 8 GPUs apart, one per host, over InfiniBand. Each
    # GPU holds 8192 / cp tokens and one of the 8 KV heads (8 over tp8); K and V in bf16:
    # 2 x 2 bytes x tokens x 128 per send. Attention on one chunk: the executed causal half of the
    # scores, 4 heads x 8192 x (8192 / cp), 2 x 128 FLOPs each, spread over cp steps.
    env = env_of(gpus=8 * cp, tp=8, cp=cp, dp=1, sequence_parallel=True)
    tokens = 8192 // cp
    send = 2 * 2 * tokens * 128 / IB_BW + IB_LAT
    attention = 2 * (4 * 8192 * tokens) * 128 / ATTENTION
    fwd = (cp - 1) * max(0.0, send - attention / cp)  # cp - 1 sends, each beside one chunk's forward
    bwd = (cp - 1) * max(0.0, 2 * send - 2.5 * attention / cp)  # K, V and their gradients; backward 2.5x
    assert fwd > 0 and bwd > 0  # both exposed: every factor above is visible in the sum
    assert env.block_pass(L8.layer_kind(0), 8).cp_comm == pytest.approx(fwd + bwd, rel=1e-12)
    # with this release's efficiencies: 19.4 + 22.8 us at cp2, 60.8 + 109.5 us at cp4
    assert (fwd + bwd) * 1e6 == pytest.approx({2: 42.27, 4: 170.31}[cp], abs=0.01)


def test_cp_comm_is_paid_per_layer_and_micro_batch_and_forward_again_under_full_recompute():
    lay = dict(gpus=16, tp=8, cp=2, dp=1, sequence_parallel=True, global_batch=4)
    env, kind = env_of(**lay), L8.layer_kind(0)
    per_layer = env.block_pass(kind, 8).cp_comm
    cost = estimate_step(L8, env.training, env.layout, env.cluster)
    assert cost.time_breakdown_s["cp_comm"] == pytest.approx(4 * 32 * per_layer, rel=1e-12)  # 4 mb x 32 layers
    assert env.block_pass(EMBED, 8).cp_comm == env.block_pass(HEAD, 8).cp_comm == 0.0
    # full recompute re-runs the forward with its exposed sends (19.4 us here, as above)
    full = env_of(**lay, recompute="full").block_pass(kind, 8)
    send = 2 * 2 * 4096 * 128 / IB_BW + IB_LAT
    cp_fwd = send - 2 * (4 * 8192 * 4096) * 128 / ATTENTION / 2
    tp_fwd = 2 * nvlink_all_reduce(2 * 4096 * 4096, 8)  # SP: gather + scatter per sublayer, no GEMM overlap
    assert full.recompute == pytest.approx(full.fwd + tp_fwd + cp_fwd, rel=1e-12)


# ---- tensor parallelism (CostEnv._tp_layer_comm, _tp_exposed, embedding and LM head) -----------


def _gemm_lasting(env, seconds):
    """A GEMM op whose forward takes ``seconds`` on ``env`` (op time is linear in its FLOPs)."""
    op = gemm("probe", 4096, 4096, 4096)
    return dataclasses.replace(op, flops=op.flops * seconds / env.op_time(op))


@pytest.mark.parametrize(
    ("sp", "dtype", "fwd_halves", "bwd_halves"),
    [
        # SP: forward gathers the input and scatters the output; backward gathers the output
        # gradient, scatters the input gradient and gathers the input again: per sublayer 2 and 3
        (True, "bf16", 2 * 2, 2 * 3),
        # fp8 gathers the forward input in 1 byte instead of 2 (the backward re-gather too)
        (True, "fp8", 2 * 1.5, 2 * 2.5),
        # no SP: one all-reduce (two halves) per sublayer each way
        (False, "bf16", 2 * 2, 2 * 2),
    ],
)
def test_tp_layer_moves_the_activation_as_megatron_does(sp, dtype, fwd_halves, bwd_halves):
    env = env_of(tp=8, dp=1, sequence_parallel=sp, dtype=dtype)
    half = nvlink_all_reduce(2 * 8192 * 4096, 8) / 2  # one all-gather or reduce-scatter of the activation
    fwd, bwd = env._tp_layer_comm(L8.layer_kind(0), env.degree(8), [])  # no GEMM to hide behind
    assert (fwd, bwd) == pytest.approx((fwd_halves * half, bwd_halves * half), rel=1e-12)


def test_tp_backward_hides_behind_twice_the_forward_gemm_time():
    # without SP the backward's two all-reduces run beside the weight- and input-gradient GEMMs,
    # which take twice the forward GEMM time g: exposed max(0, 4 half - 2 g). Forward hides nothing.
    env = env_of(tp=8, dp=1, sequence_parallel=False)
    half = nvlink_all_reduce(2 * 8192 * 4096, 8) / 2
    fwd, bwd = env._tp_layer_comm(L8.layer_kind(0), env.degree(8), [_gemm_lasting(env, half)])
    assert (fwd, bwd) == pytest.approx((4 * half, 2 * half), rel=1e-12)
    # userbuffers overlap hides tp_overlap_hidden of each collective, never more than the GEMM time
    over = env_of(tp=8, dp=1, sequence_parallel=True, tp_comm_overlap=True)
    hidden = EFF.tp_overlap_hidden
    fwd, _ = over._tp_layer_comm(L8.layer_kind(0), over.degree(8), [_gemm_lasting(over, 3.5 * half)])
    assert fwd == pytest.approx(max((1 - hidden) * 4 * half, 4 * half - 3.5 * half), rel=1e-12)
    fwd, _ = over._tp_layer_comm(L8.layer_kind(0), over.degree(8), [_gemm_lasting(over, half)])
    assert fwd == pytest.approx(3 * half, rel=1e-12)


@pytest.mark.parametrize("block", [EMBED, HEAD])
@pytest.mark.parametrize("overlap", [False, True])
def test_embedding_and_head_pay_one_tp_all_reduce(block, overlap):
    env = env_of(tp=8, dp=1, sequence_parallel=True, tp_comm_overlap=overlap)
    expected = nvlink_all_reduce(2 * 8192 * 4096, 8) * (1 - EFF.tp_overlap_hidden if overlap else 1)
    assert env.block_pass(block, 8).tp_comm == pytest.approx(expected, rel=1e-12)


# ---- expert parallelism (CostEnv._layer_pass) -------------------------------------------------


def test_ep_pays_four_all_to_alls_and_full_recompute_repeats_the_forward_two():
    # Mixtral at ep2 on GPUs 0-1 (one host): dispatch and combine, forward and backward, each an
    # all-to-all of the routed activation (tokens x hidden x top-2, bf16); a member keeps half
    # and sends half over NVLink, plus one latency step (2 log2(2) / 2), times the busier rank's
    # load: 4 experts of 4096 x 2 x 2 / 8 = 2048 rows each, so 1 + sqrt((cv^2 + 1/2048) / 4) times
    # E[max of 2 normals] = 1/sqrt(pi) (Blom's approximation: within 1% here)
    lay = dict(model=MIXTRAL, seq=4096, tp=1, dp=8, ep=2, global_batch=8)
    load = 1 + math.sqrt((EFF.moe_load_cv**2 + 1 / 2048) / 4) / math.sqrt(math.pi)
    a2a = load * (2 * 4096 * 4096 * 2) / 2 / NVL_BW + NVL_LAT
    p = env_of(**lay).block_pass(MIXTRAL.layer_kind(0), 1)
    assert p.ep_comm == pytest.approx(4 * a2a, rel=0.01)
    even = EFF.model_copy(update={"moe_load_cv": 0.0})  # only the sampling noise left
    assert env_of(**lay, eff=even).block_pass(MIXTRAL.layer_kind(0), 1).ep_comm < p.ep_comm
    full = env_of(**lay, recompute="full").block_pass(MIXTRAL.layer_kind(0), 1)
    assert full.recompute - full.fwd == pytest.approx(p.ep_comm / 2, rel=1e-9)
    assert env_of(**{**lay, "ep": 1}).block_pass(MIXTRAL.layer_kind(0), 1).ep_comm == 0.0


def test_cp_merge_moves_12_bytes_per_output_and_10_per_gradient_element_and_step():
    # Llama 3 8B at tp8 cp2 (one 8192-token sequence): 4096 tokens, 4 query heads and 1 KV head
    # of 128 per GPU. Forward: 2 steps x 12 bytes x 4096 x 512; backward: 2 x 10 x 4096 x (512 + 256).
    ops = {op.name: op for op in layer_ops(L8, 0, 1, 8192, 8, 2, 1, True, True)}
    merge = ops["cp-merge"]
    assert merge.mem_bytes == 2 * 12 * 4096 * 512 == 50_331_648
    assert merge.bwd * merge.mem_bytes == pytest.approx(2 * 10 * 4096 * (512 + 2 * 128), rel=1e-12)
    assert "cp-merge" not in {op.name for op in layer_ops(L8, 0, 1, 8192, 8, 1, 1, True, True)}


# ---- changing degree between blocks, and the tied LM head (CostEnv.transition_time, block_memory)


def test_changing_degree_without_sp_gathers_the_wider_share_and_twice_when_regrown():
    # tp4 stage, one 8192-token sequence: growing from degree lo to hi all-gathers hi/lo shares of
    # 2 x 8192 x 4096 x hi/4 bytes over the hi/lo GPUs at stride lo; under full recompute a grown
    # degree is gathered again in the recomputed forward.
    def gather(lo, hi):
        n, nbytes = hi // lo, 2 * 8192 * 4096 * hi / 4
        return (n - 1) / n * nbytes / NVL_BW + 2 * math.ceil(math.log2(n)) * NVL_LAT / 2

    env = env_of(gpus=8, tp=4, dp=2, global_batch=4)
    full = env_of(gpus=8, tp=4, dp=2, global_batch=4, recompute="full")
    assert env.transition_time(1, 4) == env.transition_time(4, 1) == pytest.approx(gather(1, 4), rel=1e-12)
    assert env.transition_time(2, 4) == pytest.approx(gather(2, 4), rel=1e-12)
    assert full.transition_time(1, 4) == pytest.approx(2 * gather(1, 4), rel=1e-12)
    assert full.transition_time(4, 1) == pytest.approx(gather(1, 4), rel=1e-12)
    assert env_of(gpus=8, tp=4, dp=2, global_batch=4, sequence_parallel=True).transition_time(1, 4) == 0.0


def test_a_tied_lm_head_on_its_own_stage_keeps_a_copy_of_the_embedding():
    # GPT-3 ties the output layer to the embedding (51,200 x hidden, already a multiple of 128):
    # with pp > 1 the last stage holds its own bf16 copy, 2 bytes per parameter
    gpt = MODELS["gpt3-175b"]
    flat = env_of(model=gpt, gpus=8, seq=2048, tp=8, dp=1)
    piped = env_of(model=gpt, gpus=16, seq=2048, tp=8, pp=2, dp=1)
    extra = piped.block_memory(HEAD, 8, 0.0)[0].weights - flat.block_memory(HEAD, 8, 0.0)[0].weights
    assert extra == pytest.approx(2 * 51200 * gpt.hidden_size / 8, rel=1e-12)


# ---- data-parallel exposure (cost_models.data_parallel.exposed_dp_time) ---------------------------


@pytest.mark.parametrize(
    ("zero", "overlap", "reshard", "expected"),
    [
        # not overlapped: the step waits for all of it; ZeRO-2 reduces every micro-batch (3 x 4);
        # ZeRO-3 gathers every micro-batch, twice when it reshards after forward (3 x 2 x 2)
        (0, False, True, (4.0, 2.0)),
        (1, False, True, (4.0, 2.0)),
        (2, False, True, (12.0, 2.0)),
        (3, False, True, (12.0, 12.0)),
        (3, False, False, (12.0, 6.0)),
        # overlapped in 2 pieces: max(c / b, C - W (1 - 1/b)) = max(2, 4 - 3/2) and max(1, 2 - 1.5/2)
        (1, True, True, (2.5, 1.25)),
        # ZeRO-2 adds the 2 earlier micro-batches' reductions beyond their compute: 2 x (4 - 3)
        (2, True, True, (2.0 + 2.5, 1.25)),
        # ZeRO-3, 4 layers: per micro-batch, backward moves gradients and re-gathered weights
        # (4 + 2) behind its 2 s, forward gathers 2 behind its 1 s: 3 x max(6/4, 6 - 2 x 3/4), 3 x max(2/4, 2 - 3/4)
        (3, True, True, (13.5, 3.75)),
        (3, True, False, (7.5, 3.75)),  # weights kept from forward: backward moves only the 4 s of gradients
    ],
)
def test_dp_exposure_closed_forms(zero, overlap, reshard, expected):
    from cost_models.data_parallel import DpTraffic, exposed_dp_time

    traffic = DpTraffic(reduce_s=4.0, gather_s=2.0, buckets=4)
    got = exposed_dp_time(traffic, zero, overlap, reshard, 1.0, 2.0, 3, 3.0, 1.5, 2)
    assert got == pytest.approx(expected, rel=1e-12)


# ---- a replica at reduced TP (cost_models.degraded) -------------------------------------------


def test_degraded_step_scales_each_term_as_its_docstring_says():
    from cost_models.degraded import degraded_step_time

    breakdown = dict(compute=6.0, recompute=2.0, tp_comm=4.0, cp_comm=1.0, ep_comm=1.0, pp_p2p=2.0)
    breakdown |= dict(pp_bubble=3.0, dp_comm_exposed=1.0, optimizer=0.5, overhead=0.1)
    # per micro-batch (2 of them): compute 4 -> 4 x 2 / 1.25 = 6.4; TP 2 -> 2 x (3/4) / (7/8) = 12/7
    # (ring factors of tp4 and tp8); CP + EP + PP 2 unchanged: 70.8 / 7 instead of 8. Three
    # micro-batches, the bubble scaled by the same ratio, DP and optimizer x 2, overhead as is.
    per_mb = 6.4 + 12 / 7 + 2.0
    expected = 3 * per_mb + 3.0 * per_mb / 8 + 1.5 * 2 + 0.1
    assert degraded_step_time(breakdown, 2, 3, 8, 4, work=2.0, speed=1.25) == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(37.2357142857, rel=1e-10)
    # without power boost (speed 1): compute 4 x 2 = 8 per micro-batch
    slow = 8.0 + 12 / 7 + 2.0
    assert degraded_step_time(breakdown, 2, 3, 8, 4, work=2.0) == pytest.approx(
        3 * slow + 3.0 * slow / 8 + 3.1, rel=1e-12
    )
    # tp2 -> tp1 drops TP traffic (a ring of one moves nothing); a tp1 job keeps its breakdown's
    base = 3 * (4.0 + 2.0) + 3.0 * 6.0 / 8 + 0.1 + 1.5
    assert degraded_step_time(breakdown, 2, 3, 2, 1, work=1.0) == pytest.approx(base, rel=1e-12)
    assert degraded_step_time(breakdown, 2, 3, 1, 1, work=1.0) == pytest.approx(
        3 * 8.0 + 3.0 * 8.0 / 8 + 0.1 + 1.5, rel=1e-12
    )
    # nothing per micro-batch: the bubble stays as it was
    idle = {**breakdown, **dict(compute=0.0, recompute=0.0, tp_comm=0.0, cp_comm=0.0, ep_comm=0.0, pp_p2p=0.0)}
    assert degraded_step_time(idle, 2, 3, 8, 4, work=1.0) == pytest.approx(3.0 + 1.5 + 0.1, rel=1e-12)


def test_ring_factor_and_power_below_nominal():
    from cost_models.degraded import power_for_speed, ring_factor

    assert (ring_factor(1), ring_factor(2), ring_factor(8)) == (0.0, 0.5, 7 / 8)
    assert power_for_speed(0.9) == power_for_speed(1.0) == 1.0  # no boost needed at or below nominal speed


def test_work_ratio_weights_heads_ffn_columns_and_vocabulary_rows_by_their_flops():
    from cost_models.degraded import work_ratio

    # Llama 3 8B from tp8 to tp7: the fullest GPU gets 5 of 32 heads instead of 4, and
    # 14,336 / 7 = 2,048 FFN columns instead of 1,792. Per token and layer, the attention GEMMs
    # cost 2h(q + 2kv) + 2qh FLOPs paid 3 times (forward + 2 x backward), the flash core 2sq
    # (the causal half of 4sq) paid 3.5 times; the gated MLP 2 x 3 h f, 3 times
    # (h = q = 4,096, kv = 1,024, s = 4,096).
    h, s = 4096, 4096
    attention = 3 * (2 * h * (h + 2 * 1024) + 2 * h * h) + 3.5 * 2 * s * h
    mlp = 3 * 2 * 3 * h * 14336
    expected = (attention * 5 / 4 + mlp * 2048 / 1792) / (attention + mlp)
    training = TrainingSpec(seq_len=s)
    assert work_ratio(L8, training, 8, 7) == pytest.approx(expected, rel=1e-12)
    assert expected == pytest.approx(1.170588, rel=1e-6)
    # with the vocabulary (first and last stage): 128,256 rows, 18,323 on the fullest of 7 GPUs,
    # 16,032 of 8; the logits GEMM runs over the vocabulary padded to 128 (128,256 already is)
    vocab = 3 * 2 * h * 128256
    with_vocab = (32 * (attention * 5 / 4 + mlp * 2048 / 1792) + vocab * 18323 / 16032) / (
        32 * (attention + mlp) + vocab
    )
    assert work_ratio(L8, training, 8, 7, with_vocab=True) == pytest.approx(with_vocab, rel=1e-12)
    # down to one GPU, it holds everything: 8 times its share at tp8
    assert work_ratio(L8, training, 8, 1) == 8.0


def test_work_ratio_of_an_moe_model_counts_its_dense_prefix_shared_expert_and_router():
    from cost_models.degraded import work_ratio

    # DeepSeek-MoE 16B from tp4 to tp3: 28 layers, the first dense (FFN 10,944), 27 MoE layers of
    # 64 experts of 1,408 columns, top 6, a 2,816-column shared expert and a 64-way router
    # (replicated on every TP rank). Fullest GPU at tp3 over tp4: heads 6/4, dense FFN 3,648/2,736,
    # experts 470/352, shared 939/704, router 1. Per token, FLOPs paid 3 times (3.5 for flash).
    m, s = MODELS["deepseek-moe-16b"], 4096
    h, q, kv = m.hidden_size, m.q_width, m.kv_width
    attention = 3 * (2 * h * (q + 2 * kv) + 2 * q * h) + 3.5 * 2 * s * q
    dense = 3 * 2 * 3 * h * 10944
    experts, shared, router = 3 * 2 * 3 * h * 1408 * 6, 3 * 2 * 3 * h * 2816, 3 * 2 * h * 64
    # work of the fullest GPU: its share of each kind's FLOPs, the whole router on every GPU
    at3 = 28 * attention * 6 / 16 + dense * 3648 / 10944 + 27 * (experts * 470 / 1408 + shared * 939 / 2816 + router)
    at4 = (28 * attention + dense + 27 * (experts + shared)) / 4 + 27 * router
    expected = at3 / at4
    got = work_ratio(m, TrainingSpec(seq_len=s), 4, 3)
    assert got == pytest.approx(expected, rel=1e-12)
    # the old dense formula (every layer's MLP the top-6 routed experts, no shared expert, dense
    # layer or router, the full 4sq core paid like a GEMM) put the ratio at 1.3999; the shared
    # expert's 939/704 and the dense layer's 4/3 pull it towards 4/3, the attention's 3/2 up
    old_attention = 2 * h * (q + 2 * kv) + 2 * q * h + 4 * s * q
    old_mlp = 2 * 3 * h * 1408 * 6
    old = (old_attention * 6 / 4 + old_mlp * 470 / 352) / (old_attention + old_mlp)
    assert (round(old, 4), round(got, 4)) == (1.3999, 1.3787)


# ---- collectives across two domains (cost_models.collectives) -----------------------------------


def test_reduce_scatter_over_two_hosts_with_two_gpus_each_is_hierarchical():
    # GPUs 0, 1, 8, 9: 2 per host on 2 hosts. Inside the host (1/2) nbytes over NVLink, across
    # hosts (1/2) of each member's 1/2 shard over its NIC, and half a tree's 2 log2(4) IB steps.
    from cost_models.collectives import reduce_scatter_time

    links = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=16).group_links([0, 1, 8, 9])
    assert (links.domains, links.per_domain) == (2, 2)
    nbytes = 1e9
    expected = nbytes / 2 / NVL_BW + (nbytes / 2) / 2 / IB_BW + 2 * 2 * IB_LAT / 2
    assert reduce_scatter_time(nbytes, links, EFF) == pytest.approx(expected, rel=1e-12)
