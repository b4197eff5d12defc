"""The mixture-of-experts sublayer as Megatron-Core runs it: its compute, its token dispatch and
what of the dispatch stays on the critical path.

Per GPU and micro-batch, an MoE sublayer (megatron/core/transformer/moe: ``router.py``,
``token_dispatcher.py``, ``experts.py``) runs:

1. the router: a gate GEMM (tokens x experts x hidden), the score function and top-k in fp32,
   and the auxiliary load-balancing loss (or, aux-loss-free, the per-expert counts that the
   bias update reads once per step: an ``experts``-long vector per layer, no cost worth
   counting);
2. permute: the tokens copied into expert order, ``top_k`` rows per token;
3. dispatch over the expert-parallel group (``dispatch_bytes``; the three dispatchers);
4. the local experts as one grouped GEMM whose rows are the tokens each expert receives: the
   busiest rank of the EP group sets the pace (``imbalance_factor``), or a capacity factor
   caps it when tokens are dropped;
5. combine (the mirror of dispatch) and unpermute (the weighted sum of the ``top_k`` rows);
6. a shared expert, when the model has one, as a dense MLP at the attention's TP.

Tokens entering the sublayer: Megatron requires sequence parallelism with TP in MoE layers, so a
GPU holds ``tokens / tp`` of its TP group's ``tokens``; expert tensor parallelism ``etp`` gathers
them back over the expert-TP group after dispatch (``etp`` = ``tp``: every TP rank sees all the TP
group's routed tokens on ``f / tp`` of each expert; ``etp`` = 1, parallel folding: each rank its
own, on whole experts).

Where each piece lives: the operations of steps 1, 2, 4 and 5 are ``flops.moe_ops``; this module
has the load (``imbalance_factor``, ``routed_load``), the grouped GEMMs' efficiency
(``grouped_gemm_factor``), the bytes and time of dispatch per dispatcher (``dispatch_bytes``,
``dispatch_time``) and what overlap leaves exposed (``exposed_dispatch``,
``unpaired_micro_batches``); ``CostEnv`` (``cost_models.blocks``) composes them per layer, with
the host sync of ``Efficiency.moe_host_sync_s``, the expert GEMMs launched one at a time
(``grouped_gemm_launch_s``) and the combined 1F1B schedule's host floor
(``overlap_host_floor_s``), and ``cost_models.step`` adds the unpaired
micro-batches' dispatch. HybridEP (``flex_backend_of``: the recipe's backend, else the
cluster's rule, ``flex_backend``) permutes inside its dispatch and combine, so its layers have no
permute or unpermute pass; layers whose attention differs from the previous
layer's stall the host on Transformer Engine's backend re-selection (``attention_switch_fraction``).
The constants are ``Efficiency``'s ``grouped_gemm_*``, ``moe_load_cv``, ``moe_host_sync_s``,
``moe_attention_reselect_s`` and ``moe_overlap_host_s``, fitted to or sourced against table G
(``cost_models.published_moe``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from statistics import NormalDist

from cost_models.efficiency import Efficiency
from cost_models.model import ModelSpec
from topologies.cluster import GroupLinks

GROUPED = "experts-"  # names of the grouped expert GEMMs (``CostEnv.op_time`` applies their efficiency)
Collective = Callable[[str, float, GroupLinks], float]


@dataclass(frozen=True)
class ExpertLinks:
    """The groups an MoE layer's dispatch talks to (``RankGrid.expert_group``): the EP group,
    the expert-TP group and the two together (the flex and all-gather dispatchers' group)."""

    ep: GroupLinks
    etp: GroupLinks
    tp_ep: GroupLinks


@dataclass(frozen=True)
class MoeShape:
    """One MoE sublayer on one GPU for one micro-batch.

    ``tokens_in``: tokens this GPU routes (its TP group's ``tokens / tp``); ``ep``, ``etp``: the
    expert grid; ``load``: the busiest EP rank's rows over the mean (``imbalance_factor``, or
    the capacity factor's cap)."""

    tokens_in: float
    hidden: int
    experts: int
    top_k: int
    ffn: int
    ep: int
    etp: int
    load: float = 1.0

    @property
    def experts_per_rank(self) -> int:
        return self.experts // self.ep

    @property
    def rows_per_expert(self) -> float:
        """Rows one local expert's GEMM gets at mean load: every token of the EP group (``ep``
        GPUs' ``tokens_in``, gathered ``etp`` times over the expert-TP group) ``top_k`` times,
        over the experts."""
        return self.tokens_in * self.etp * self.top_k * self.ep / self.experts


def imbalance_factor(ep: int, experts_per_rank: int, rows_per_expert: float, load_cv: float) -> float:
    """The busiest EP rank's rows over the mean, in dropless routing.

    Each expert's load has a routing skew (coefficient of variation ``load_cv`` after load
    balancing) and the Poisson noise of sampling ``rows_per_expert`` rows: variance
    ``(cv mu)^2 + mu``. A rank sums ``experts_per_rank`` such loads, so its coefficient of
    variation is ``sqrt((cv^2 + 1/mu) / e)``; the expected maximum of ``ep`` such (normal) loads
    is ``mu_rank (1 + cv_rank z_ep)``, with ``z_ep`` the expected largest of ``ep`` standard
    normals (Blom 1958: ``Phi^-1((n - 0.375) / (n + 0.25))``; 0.59 for 2, 1.42 for 8, 2.04 for
    32). One rank (``ep`` 1) has nobody to wait for: factor 1.

    >>> imbalance_factor(1, 8, 100.0, 0.3), imbalance_factor(8, 4, math.inf, 0.0)
    (1.0, 1.0)
    """
    if ep <= 1:
        return 1.0
    noise = 1.0 / rows_per_expert if rows_per_expert > 0 else 0.0
    cv_rank = math.sqrt((load_cv**2 + noise) / experts_per_rank)
    return 1.0 + cv_rank * expected_max_normal(ep)


def expected_max_normal(n: int) -> float:
    """Blom's approximation of the expected largest of ``n`` standard normal draws (0 for one)."""
    return 0.0 if n <= 1 else NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def routed_load(imbalance: float, capacity_factor: float | None, pad_to_capacity: bool = False) -> float:
    """Rows of the busiest rank over the mean: dropless (``capacity_factor`` None) the
    imbalance; with token dropping at most the capacity factor (each expert keeps at most
    ``cf x mean`` tokens); padded to capacity exactly the capacity factor."""
    if capacity_factor is None:
        return imbalance
    return capacity_factor if pad_to_capacity else min(imbalance, capacity_factor)


def grouped_gemm_factor(eff: Efficiency, m: int, n: int, k: int, half: float) -> float:
    """What ``Efficiency.shape_factor`` is to a dense GEMM, for a grouped expert GEMM of one
    expert's shape: ``grouped_gemm_fraction`` times the shape factor of a larger half-dimension
    (``grouped_gemm_half_dim`` over ``gemm_half_dim`` times ``half``, the dense one of this GPU
    and format): the tiles of many small GEMMs fill the SMs' waves less well and each expert
    pays its own prologue and epilogue."""
    scale = eff.grouped_gemm_half_dim / eff.gemm_half_dim
    return eff.grouped_gemm_fraction * eff.shape_factor(m, n, k, half * scale)


def expert_waves(m: int, n: int, k: int, concurrent: int, tile: tuple[int, int, int], sms: int) -> float:
    """Time of one expert's GEMM (``m`` rows, weight ``n`` x ``k``) over what its FLOPs take at full
    occupancy, from the waves its output tiles fill: ``concurrent`` experts' GEMMs share the
    GPU's ``sms / tile[2]`` tile slots, each pass's tiles (forward ``n`` x ``m``, data gradient
    ``k`` x ``m``, weight gradient ``n`` x ``k``; ``tile`` = (weight width, token width, SMs)) run
    in whole waves, and the last one's idle slots cost as much as busy ones; the three passes
    (equal FLOPs) average. A dense GEMM has many waves and its tail is inside the fitted shape
    factor; an expert's, a few, makes it explicit (``Efficiency.gemm_tile``,
    ``expert_gemm_streams``; CUTLASS and Transformer Engine's sources there). It assumes cuBLAS
    does not split the token reduction of a weight gradient (or stream-K a partial wave) for these
    shapes: unmeasured here (no GPU check yet), and table G's fit prefers it (8.94% against 9.15%
    without the weight gradient's waves).

    Qwen3-30B-A3B on a B200 at ep 8, micro-batch 4: 8,192 rows an expert, 2 x 768 wide up, 2,048
    hidden; four experts at once. Forward: 6 x 32 x 4 = 768 tiles on 74 SM pairs, 10.4 waves (11);
    data gradient 8 x 32 x 4 = 1,024, 13.8 (14); weight gradient 6 x 8 x 4 = 192, 2.6 (3):

    >>> round(expert_waves(8192, 1536, 2048, 4, (256, 256, 2), 148), 4)
    1.076
    >>> expert_waves(8192, 1536, 2048, 37, (256, 256, 2), 148)  # whole waves
    1.0
    """
    weight, tokens, per_tile = tile
    slots = max(1, sms // per_tile)

    def waves(rows: int, cols: int) -> float:
        full = math.ceil(rows / weight) * math.ceil(cols / tokens) * concurrent / slots
        return math.ceil(full) / full

    return (waves(n, m) + waves(k, m) + waves(n, k)) / 3


def expert_concurrency(local_experts: int, streams: int, one_kernel: bool) -> int:
    """Expert GEMMs that share the GPU at once: all the rank's experts when one grouped kernel runs
    them (``one_kernel``: the fused grouped GEMM a full-iteration CUDA graph needs, torchtitan's
    ``torch._grouped_mm``), else Transformer Engine's ``streams`` compute streams (one expert
    each), never more than the rank holds.

    >>> expert_concurrency(16, 4, False), expert_concurrency(2, 4, False), expert_concurrency(16, 4, True)
    (4, 2, 16)
    """
    return local_experts if one_kernel else min(streams, local_experts)


FUSED_BY_HYBRIDEP = ("permute", "unpermute")  # ``flops.moe_ops``' passes HybridEP's kernels do on the way


def flex_backend(domain_size: int, gpus_per_node: int) -> str:
    """The flex dispatcher's backend on a cluster (``ntp_planner.emitters.moe.flex_backend`` asks it):
    HybridEP where one NVLink domain spans several hosts (GB200 / GB300 NVL72), else DeepEP.

    HybridEP permutes while it dispatches and unpermutes while it combines (Megatron-Core's
    ``fused_a2a.hybrid_ep_dispatch`` calls the buffer's ``dispatch_with_permute`` and
    ``combine_with_unpermute``: the received rows land in expert order, and the combine sums a
    token's ``top_k`` rows as it gathers them), so the layer has no separate permute and unpermute
    memory passes; their bytes ride in the dispatch's. DeepEP dispatches in token order and
    Megatron permutes after it (``_DeepepManager.get_permuted_hidden_states_by_experts``).

    >>> flex_backend(72, 4), flex_backend(8, 8)
    ('hybridep', 'deepep')
    """
    return "hybridep" if domain_size > gpus_per_node else "deepep"


def flex_backend_of(chosen: str | None, domain_size: int, gpus_per_node: int) -> str:
    """The flex dispatcher's backend a run uses: the one its recipe names
    (``TrainingSpec.moe_flex_backend``, Megatron's ``moe_flex_dispatcher_backend``), else the
    cluster's rule (``flex_backend``). HybridEP is not only for multi-host NVLink domains:
    Megatron-Bridge's recipes set it on 8-GPU B200 / B300 / H100 hosts too (Qwen3-30B-A3B from
    26.02.01, DeepSeek-V3 on B200 / B300 from 26.02, GPT-OSS and Qwen3-235B-A22B on B300 from
    26.04), and Megatron-Core's ``_HybridEPManager`` permutes inside its kernels wherever it runs.

    >>> flex_backend_of(None, 8, 8), flex_backend_of("hybridep", 8, 8), flex_backend_of("deepep", 72, 4)
    ('deepep', 'hybridep', 'deepep')
    """
    return chosen or flex_backend(domain_size, gpus_per_node)


def attention_switch_fraction(model: ModelSpec) -> float:
    """Fraction of the layers whose attention (its sliding window) differs from the previous
    layer's: Transformer Engine caches one attention-backend choice and selects again on each of
    them (``Efficiency.moe_attention_reselect_s``). 0 for a model with one kind of attention; about
    1 for GPT-OSS, whose layers alternate a 128-token window with full attention (35 of 36).

    >>> from cost_models.catalogue import MODELS
    >>> attention_switch_fraction(MODELS["qwen3-30b-a3b"]), round(attention_switch_fraction(MODELS["gpt-oss-120b"]), 3)
    (0.0, 0.972)
    """
    windows = [model.attention_window(i) for i in range(model.num_layers)]
    return sum(a != b for a, b in zip(windows, windows[1:], strict=False)) / model.num_layers


GROUPED_GEMMS_PER_EXPERT = 6  # fc1 and fc2 forward; their dgrad and wgrad backward


def grouped_gemm_launch_s(experts_per_rank: int, launch_s: float, cuda_graphs: bool) -> float:
    """Host seconds per micro-batch of one MoE layer's expert GEMMs issued one expert at a time
    (``Efficiency.grouped_gemm_launch_s``), forward and backward together.

    Transformer Engine's ``GroupedLinear`` runs the local experts through
    ``general_grouped_gemm``, whose cuBLAS path (``nvte_multi_stream_cublas_gemm``) loops on the
    host over the experts, one ``cublas_gemm`` each (matrix descriptors, a
    ``cublasLtMatmulAlgoGetHeuristic`` query, the launch) spread over a few streams: fc1 and fc2
    forward, each one's data and weight gradient backward, ``GROUPED_GEMMS_PER_EXPERT`` = 6 per
    local expert. The MoE layer's device-to-host syncs keep the host from running ahead, so the
    GPU waits for them. A full-iteration CUDA graph replays the launches without the host: 0.

    >>> round(grouped_gemm_launch_s(16, 1e-5, False), 6), grouped_gemm_launch_s(16, 1e-5, True)
    (0.00096, 0.0)
    """
    return 0.0 if cuda_graphs else GROUPED_GEMMS_PER_EXPERT * experts_per_rank * launch_s


# ---- dispatch -------------------------------------------------------------------------------


@dataclass(frozen=True)
class DispatchBytes:
    """Bytes one GPU moves in one dispatch (combine: the same again), by collective: the
    all-to-all's send buffer over the EP group, the expert-TP all-gather's gathered size, the
    EP x ETP all-gather's gathered size, and flex's deduplicated scale-out and NVLink bytes."""

    all_to_all: float = 0.0
    etp_all_gather: float = 0.0
    tp_ep_all_gather: float = 0.0
    scaleout: float = 0.0
    nvlink: float = 0.0


def dispatch_bytes(dispatcher: str, s: MoeShape, domains: int, act_bytes: float) -> DispatchBytes:
    """Per-GPU bytes of one dispatch (``token_dispatcher.py``), at the busiest rank's load.

    - ``alltoall`` (``MoEAlltoAllTokenDispatcher``): every routed copy, ``tokens_in x top_k``
      rows of ``hidden``, all-to-all over the EP group; with ``etp`` > 1 the received rows are
      then all-gathered over the expert-TP group (``gather_from_sequence_parallel_region``;
      combine reduce-scatters them).
    - ``allgather`` (``MoEAllGatherTokenDispatcher``): the tokens (not their copies) with their
      routing map (1 byte) and probabilities (4 bytes) per expert, all-gathered over the whole
      EP x ETP group; each GPU keeps the rows of its experts; combine reduce-scatters.
    - ``flex`` (DeepEP / HybridEP over the EP x ETP group): a token crosses the scale-out
      network once per remote NVLink domain that holds one of its experts, and inside a domain
      is fanned out over NVLink once per destination GPU (copies for experts on the same GPU
      deduplicated; every expert-TP rank of a destination gets one). With ``G = domains`` of the
      group holding the experts equally, a token misses a given domain with probability
      ``C(E - E/G, k) / C(E, k)`` (its k experts are distinct), so it reaches
      ``(G - 1)(1 - miss)`` remote domains; likewise ``ep (1 - C(E - E/ep, k) / C(E, k))`` GPUs.
    """
    t, h, load = s.tokens_in, s.hidden, s.load
    if dispatcher == "alltoall":
        gathered = t * s.top_k * h * act_bytes * load * s.etp if s.etp > 1 else 0.0
        return DispatchBytes(all_to_all=t * s.top_k * h * act_bytes * load, etp_all_gather=gathered)
    if dispatcher == "allgather":
        per_token = h * act_bytes + s.experts * (1 + 4)
        return DispatchBytes(tp_ep_all_gather=t * per_token * s.ep * s.etp)
    if dispatcher == "flex":
        remote = (domains - 1) * (1 - _miss(s.experts, s.top_k, domains))
        ranks = s.ep * (1 - _miss(s.experts, s.top_k, s.ep))
        row = t * h * act_bytes * load
        return DispatchBytes(scaleout=row * remote, nvlink=row * ranks * s.etp)
    raise ValueError(f"unknown dispatcher {dispatcher!r}")


def _miss(experts: int, top_k: int, parts: int) -> float:
    """Probability that a token's ``top_k`` distinct experts all avoid one of ``parts`` equal
    parts of the experts: C(E - E/parts, k) / C(E, k)."""
    if parts <= 1:
        return 0.0
    return math.comb(experts - experts // parts, top_k) / math.comb(experts, top_k)


def dispatch_time(b: DispatchBytes, groups: ExpertLinks, coll: Collective, eff: Efficiency) -> float:
    """Seconds of one dispatch (or combine) from its bytes; ``coll(op, nbytes, links)`` times a
    collective (``CostEnv.coll``). flex's two tiers run concurrently (DeepEP's RDMA sends and
    NVLink forwards are pipelined): the slower of them, the NVLink bytes less this GPU's own
    share, plus a tree's latency over the group."""
    seconds = coll("all_to_all", b.all_to_all, groups.ep) if b.all_to_all else 0.0
    seconds += coll("all_gather", b.etp_all_gather, groups.etp) if b.etp_all_gather else 0.0
    seconds += coll("all_gather", b.tp_ep_all_gather, groups.tp_ep) if b.tp_ep_all_gather else 0.0
    links = groups.tp_ep
    if (b.scaleout or b.nvlink) and links.size > 1:
        n = links.size
        nvl = b.nvlink * (n - 1) / n / (links.nvlink_bw_bytes_per_s * eff.nvlink_efficiency)
        net = b.scaleout / (links.scaleout_bw_bytes_per_s * eff.scaleout_efficiency) if b.scaleout else 0.0
        alpha = links.scaleout_latency_s if links.domains > 1 else links.nvlink_latency_s
        seconds += max(nvl, net) + math.ceil(math.log2(n)) * alpha
    return seconds


# ---- overlap --------------------------------------------------------------------------------


def exposed_dispatch(overlap: str, comm_fwd: float, comm_bwd: float, compute_fwd: float, compute_bwd: float) -> float:
    """Dispatch and combine left on the critical path per micro-batch in the steady state.

    - ``none``: all of it.
    - ``1f1b`` (Megatron's ``overlap_moe_expert_parallel_comm``, the combined 1F1B schedule)
      and ``dualpipe`` (DeepSeek-V3's DualPipe): the forward of one micro-batch runs beside the
      backward of another, layer by layer, so the forward's dispatch and combine hide behind
      the other's backward compute and the backward's behind the forward compute:
      ``max(0, comm_fwd - compute_bwd) + max(0, comm_bwd - compute_fwd)``.
      The unpaired micro-batches (``unpaired_micro_batches``) pay in full.
    """
    if overlap == "none":
        return comm_fwd + comm_bwd
    return max(0.0, comm_fwd - compute_bwd) + max(0.0, comm_bwd - compute_fwd)


def unpaired_micro_batches(overlap: str, pp: int, micro_batches: int) -> int:
    """Micro-batches per step whose dispatch no other micro-batch's compute hides.

    1F1B pairs forward i + pp with backward i: the first stage's pp warm-up forwards and pp
    cool-down backwards run alone, which is pp micro-batches' worth of dispatch (1 with pp 1).
    DualPipe feeds micro-batches from both ends of the pipeline, so half as many (at least 1).
    Without overlap the question does not arise (0)."""
    if overlap == "none":
        return 0
    alone = pp if overlap == "1f1b" else max(1, pp // 2)
    return min(micro_batches, alone)


def overlap_host_floor_s(overlap: str, cuda_graphs: bool, host_s: float, gpu_s: float) -> float:
    """Seconds the combined 1F1B schedule adds to one MoE layer's forward-and-backward pair when
    its host work outlasts its GPU work (``Efficiency.moe_overlap_host_s``).

    With ``overlap_moe_expert_parallel_comm`` Megatron-Core no longer runs a layer as one module:
    ``TransformerLayerSchedulePlan.run`` (``models/common/model_chunk_schedule_plan.py``) issues,
    for the forward of one micro-batch and the backward of another, some ten ``ScheduleNode``
    calls (pre-dispatch compute, dispatch, experts, combine, each forward; their backwards and the
    delayed weight gradients), each switching stream under a CUDA event wait and record, and each
    backward a separate autograd-engine call (``Variable._execution_engine.run_backward`` on the
    node's detached inputs, ``pipeline_parallel/utils.py``). The host time of one such layer pair
    is ``host_s``; the pair takes at least that, so a layer with less GPU work (``gpu_s``, its
    forward and backward) waits ``host_s - gpu_s`` for the host. Without the overlap (a layer is
    one autograd graph) or in a CUDA graph (no host), nothing.

    >>> overlap_host_floor_s("1f1b", False, 0.012, 0.008), overlap_host_floor_s("1f1b", False, 0.012, 0.02)
    (0.004, 0.0)
    >>> overlap_host_floor_s("none", False, 0.012, 0.009), overlap_host_floor_s("1f1b", True, 0.012, 0.009)
    (0.0, 0.0)
    """
    if overlap == "none" or cuda_graphs:
        return 0.0
    return max(0.0, host_s - gpu_s)
