"""estimate_step: the one place where the cost terms are composed into a step time.

A pipeline stage runs its model chunks (``ParallelLayout.stage_chunks``), each a chain of
blocks: the embedding (first chunk), transformer layers, the LM head (last chunk). Block costs
come from ``cost_models.blocks``; here they are summed per stage, the pipeline schedule turns
stage times into the forward-backward time, and the exposed parts of the data-parallel
synchronisation (``cost_models.data_parallel``), the pipeline sends, the optimizer step and the
fixed per-step overhead are added.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from cost_models import titan_step
from cost_models.blocks import EMBED, HEAD, Block, CostEnv, pass_cache_key
from cost_models.data_parallel import exposed_dp_time
from cost_models.efficiency import DEFAULT_EFFICIENCY, Efficiency
from cost_models.flops import model_flops_per_step, padded_vocab
from cost_models.layout import ParallelLayout, check_layout
from cost_models.memory import in_flight_micro_batches
from cost_models.model import ModelSpec
from cost_models.moe import unpaired_micro_batches
from cost_models.pipeline import p2p_bytes, pipeline_time
from cost_models.profile import BlockShape
from cost_models.stage import (
    StageCost,
    stage_cost,
    stage_runs,
)
from cost_models.training import TrainingSpec
from topologies.cluster import Cluster

__all__ = [
    "EMBED",
    "HEAD",
    "Block",
    "CostEnv",
    "StepCost",
    "StepEstimate",
    "estimate_step",
    "estimate_step_detail",
    "pass_cache_key",
]

# Fused Adam (Transformer Engine's multi_tensor_adam) per parameter of this GPU's optimizer shard:
# read fp32 param, grad, m, v (16) + write param, m, v (12) + write the 16-bit copy (2) + the
# grad-norm read (4).
ADAM_BYTES_PER_PARAM = 34.0


class StepCost(BaseModel):
    """Predicted cost of one optimizer step for one layout."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    step_time_s: float = Field(description="Wall time of one optimizer step.")
    time_breakdown_s: dict[str, float] = Field(description="Parts of step_time_s; they sum to it.")
    memory_per_gpu_bytes: float = Field(description="Peak bytes on the fullest GPU.")
    memory_breakdown_bytes: dict[str, float] = Field(description="Parts of memory_per_gpu_bytes.")
    hbm_bytes: float = Field(description="Capacity of one GPU.")
    mfu: float = Field(
        description="Model FLOPs (attention over the full s x s scores, as Megatron-LM up to core 0.11 and "
        "NeMo's tables count them) / (step time x GPUs x dense bf16 peak)."
    )
    mfu_causal: float = Field(
        description="The same with causal attention FLOPs (half the scores), as Megatron-LM from core 0.12 and "
        "Megatron-Bridge count them."
    )
    tokens_per_s: float = Field(description="Training tokens per second for the whole job.")
    model_flops_per_step: float = Field(description="Forward + backward model FLOPs, no recompute, full attention.")
    tflops_per_gpu: float = Field(description="Hardware TFLOP/s per GPU, counting recompute.")
    bottleneck_stage: int = Field(description="Pipeline stage that paces the schedule.")
    stage_time_s: list[float] = Field(description="Per-micro-batch forward+backward time of each stage.")
    stage_memory_bytes: list[float] = Field(description="Peak bytes per GPU of each stage.")
    notes: list[str] = Field(
        default=[], description="Where a profile (Efficiency.profile) did not cover a term: analytical there."
    )

    def fits(self, headroom: float = 0.0) -> bool:
        """Memory fits in HBM leaving ``headroom`` (a fraction) free."""
        return self.memory_per_gpu_bytes <= self.hbm_bytes * (1 - headroom)


def estimate_step(
    model: ModelSpec,
    training: TrainingSpec,
    layout: ParallelLayout,
    cluster: Cluster,
    efficiency: Efficiency = DEFAULT_EFFICIENCY,
    pass_caches: dict | None = None,
) -> StepCost:
    """Predict step time, memory per GPU and MFU of ``layout``; InputError if it is invalid.
    ``pass_caches`` (keyed by ``pass_cache_key``) lets many layouts share block passes."""
    return cost_from_stages(cost_env(model, training, layout, cluster, efficiency, pass_caches))


class RunEstimate(BaseModel):
    """One run of equal blocks of a stage, as a validation of the executor reads it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    shape: BlockShape = Field(description="How a profile names the block at this degree.")
    sequences: int = Field(description="Sequences per micro-batch its TP group runs (``Degree.seqs``).")
    blocks: int = Field(description="Blocks in the run.")
    params_per_gpu: float = Field(description="Parameters of one block on one GPU, the vocabulary unpadded.")
    dp_ranks: int = Field(description="Ranks holding the same shard: the group ZeRO divides the states by.")


class StageEstimate(BaseModel):
    """One pipeline stage of a costed step."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    busy_per_micro_batch_s: float = Field(description="Compute, recompute and TP communication of one micro-batch.")
    memory_bytes: dict[str, float] = Field(description="Peak bytes per GPU by part, with its in-flight micro-batches.")
    runs: list[RunEstimate] = Field(description="Its blocks as runs of equal (block, degree).")


class StepEstimate(BaseModel):
    """A costed step with what its stages are made of: the public entry for callers outside the
    planner (``executor.check.predict``) that need more than ``StepCost``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cost: StepCost = Field(description="The step, its split and its memory.")
    stages: list[StageEstimate] = Field(description="Every pipeline stage, in order.")


def estimate_step_detail(
    model: ModelSpec,
    training: TrainingSpec,
    layout: ParallelLayout,
    cluster: Cluster,
    efficiency: Efficiency = DEFAULT_EFFICIENCY,
    checked: bool = True,
) -> StepEstimate:
    """``estimate_step`` with every stage's busy time, memory and runs. ``checked=False`` costs
    a layout ``check_layout`` refuses (a degree that does not divide the heads: each block is
    then costed at the degree's whole share, as a profile measures the shard)."""
    env = (
        cost_env(model, training, layout, cluster, efficiency)
        if checked
        else CostEnv(model, training, layout, cluster, efficiency)
    )
    stages = layout_stages(env)
    cost = cost_from_stages(env, stages)
    out = []
    for i, (st, memory) in enumerate(zip(stages, stage_memory(env, stages), strict=True)):
        runs = [_run_estimate(env, block, t, n) for block, t, n in stage_runs(model, layout, i)]
        busy = st.pass_.fwd + st.pass_.bwd + st.pass_.recompute + st.pass_.tp_comm
        out.append(StageEstimate(busy_per_micro_batch_s=busy, memory_bytes=memory, runs=runs))
    return StepEstimate(cost=cost, stages=out)


def _run_estimate(env: CostEnv, block: Block, t: int, n: int) -> RunEstimate:
    m, f = env.model, env.block_facts(block, t)
    params = f.dense + f.expert
    if block in (EMBED, HEAD):  # Megatron pads the vocabulary to a multiple of 128 t (flops.padded_vocab)
        params -= (padded_vocab(m, t) - m.vocab_size) * m.hidden_size / t
    d = env.degree(t)
    return RunEstimate(
        shape=env.profile_shape(block, t), sequences=d.seqs, blocks=n, params_per_gpu=params, dp_ranks=d.dp_ranks
    )


def cost_env(
    model: ModelSpec,
    training: TrainingSpec,
    layout: ParallelLayout,
    cluster: Cluster,
    efficiency: Efficiency = DEFAULT_EFFICIENCY,
    pass_caches: dict | None = None,
) -> CostEnv:
    """The checked ``CostEnv`` of a layout (InputError if the layout is invalid), sharing block
    passes through ``pass_caches``."""
    check_layout(layout, model, training, cluster.num_gpus, cluster.tp_domain_size)
    cache = None if pass_caches is None else pass_caches.setdefault(pass_cache_key(layout), {})
    return CostEnv(model, training, layout, cluster, efficiency, cache)


def stage_memory(env: CostEnv, stages: list[StageCost]) -> list[dict[str, float]]:
    """Peak bytes per GPU of each stage, by part, with its in-flight micro-batches."""
    if env.titan:
        return titan_step.stage_memory(env, stages)
    lay = env.layout
    return [
        st.memory(in_flight_micro_batches(i, lay.pp, lay.num_micro_batches, lay.vpp)) for i, st in enumerate(stages)
    ]


def layout_stages(env: CostEnv) -> list[StageCost]:
    """The cost of every stage of the layout's own split (stages with the same blocks and
    degrees are costed once)."""
    memo: dict[tuple, StageCost] = {}
    stages = []
    for i in range(env.layout.pp):
        runs = tuple(stage_runs(env.model, env.layout, i))
        if runs not in memo:
            memo[runs] = stage_cost(env, list(runs))
        stages.append(memo[runs])
    return stages


def pipeline_p2p_s(env: CostEnv) -> tuple[float, float]:
    """(exposed pipeline-send time per micro-batch, exposed fill-and-drain send time per step).

    Each chunk boundary sends the activation forward and its gradient backward: b s h / cp
    values, split over tp under sequence parallelism (Megatron-Core's ``get_tensor_shapes``) or
    legacy Megatron's scatter-gather (``p2p_scatter_gather``),
    over the slowest link between neighbouring stages. Without overlap every send waits (2 vpp
    per micro-batch); Megatron overlaps them (batched isend/irecv beside compute) only under
    interleaving (``--overlap-p2p-communication`` needs virtual stages), and then only the sends
    on the critical path of the fill and the drain wait: 2 (pp - 1) of them."""
    lay, cluster = env.layout, env.cluster
    if lay.pp == 1:
        return 0.0, 0.0
    stride = lay.rank_grid.stride("pp")
    split = lay.sequence_parallel or lay.p2p_scatter_gather
    # a block of degree t at the boundary runs tp / t copies, each on its share of the tokens
    # (per-layer layouts: the widest degree, a bound)
    t = max(lay.layer_tp) if lay.layer_tp else lay.tp
    nbytes = p2p_bytes(env.stage_tokens * t // lay.tp, env.model.hidden_size, t if split else 1, env.act_bytes)
    one = max(env.coll("send_recv", nbytes, links) for links in cluster.neighbour_links(stride, lay.pp - 1))
    if env.executor:  # the stage's first rank receives and broadcasts to the others (one message of the
        # whole activation, whatever the sequence split); nothing overlaps
        nbytes = p2p_bytes(env.stage_tokens, env.model.hidden_size, 1, env.act_bytes)
        one = env.coll("send_recv", nbytes, cluster.strided_links(0, stride, 2))
        one += env.coll("all_reduce", nbytes, cluster.strided_links(0, 1, lay.tp)) / 2
        return 2 * lay.vpp * one, 0.0
    if not lay.overlap_p2p or lay.vpp == 1:
        return 2 * lay.vpp * one, 0.0
    return 0.0, 2 * (lay.pp - 1) * one


def cost_from_stages(env: CostEnv, stages: list[StageCost] | None = None) -> StepCost:
    """Compose stage costs into a StepCost; stages default to the layout's own split."""
    model, training, lay, eff = env.model, env.training, env.layout, env.eff
    stages = layout_stages(env) if stages is None else stages
    m = lay.num_micro_batches
    p2p_per_mb, p2p_fill = pipeline_p2p_s(env)
    stage_time = [s.pass_.total + p2p_per_mb for s in stages]
    pipe = pipeline_time(stage_time, m, lay.vpp if lay.pp > 1 else 1)
    # torchtitan: FSDP2's per-block traffic; replicated (ZeRO-0), a bucketed all-reduce as Megatron's
    dp_exposed = titan_step.dp_exposed_s(env, stages) if env.titan and lay.zero else dp_exposed_s(lay, stages)
    optimizer_s = max(_optimizer_s(env, s) for s in stages)
    s = stages[pipe.bottleneck_stage].pass_
    breakdown = {
        "compute": m * (s.fwd + s.bwd),
        "recompute": m * s.recompute,
        "tp_comm": m * s.tp_comm,
        "cp_comm": m * s.cp_comm,
        # MoE dispatch: the steady state's exposed part, and all of it for the micro-batches no other hides
        "ep_comm": m * s.ep_comm + unpaired_micro_batches(lay.moe_overlap, lay.pp, m) * (s.ep_comm_full - s.ep_comm),
        "pp_p2p": m * p2p_per_mb + p2p_fill,
        # the fill and drain run with fewer ranks computing: on a shared CPU host, at a lone rank's speed
        "pp_bubble": pipe.bubble_s / env.host_slowdown,
        "dp_comm_exposed": dp_exposed,
        "optimizer": optimizer_s,
        "overhead": eff.step_overhead_s,
    }
    step_time = sum(breakdown.values())
    memory = stage_memory(env, stages)
    totals = [sum(parts.values()) for parts in memory]
    fullest = max(range(lay.pp), key=totals.__getitem__)
    model_flops = model_flops_per_step(model, training.seq_len, training.global_batch)
    causal_flops = model_flops_per_step(model, training.seq_len, training.global_batch, causal=True)
    n = env.cluster.num_gpus
    hw_flops = sum(st.pass_.hw_flops for st in stages) * m * lay.dp * lay.tp * lay.cp  # every GPU of every stage
    return StepCost(
        step_time_s=step_time,
        time_breakdown_s=breakdown,
        memory_per_gpu_bytes=totals[fullest],
        memory_breakdown_bytes=memory[fullest],
        hbm_bytes=env.cluster.gpu.hbm_bytes,
        mfu=model_flops / (step_time * n * env.bf16_peak),
        mfu_causal=causal_flops / (step_time * n * env.bf16_peak),
        tokens_per_s=training.tokens_per_step / step_time,
        model_flops_per_step=model_flops,
        tflops_per_gpu=hw_flops / (step_time * n) / 1e12,
        bottleneck_stage=pipe.bottleneck_stage,
        stage_time_s=stage_time,
        stage_memory_bytes=totals,
        notes=sorted(env.notes),
    )


def dp_exposed_s(lay: ParallelLayout, stages: list[StageCost]) -> float:
    """Data-parallel synchronisation left on the critical path of the step.

    The step ends when every stage has reduced its gradients (the gradient-norm all-reduce
    over all stages then syncs them), and the next step's pipeline fill waits for each stage's
    gathered parameters; so the step pays the worst stage's reduction tail plus the worst
    stage's gathering tail. Without interleaving, stage i finishes its last backward i
    micro-batch backwards before stage 0 (the pipeline drains towards stage 0) and starts its
    first forward i forwards after it: that much more slack for each. Megatron buckets the
    gradients of the first stage only; the others move theirs in one piece. Under interleaving
    each model chunk is reduced when its last backward is done, spread over the cool-down of
    2 (pp - i - 1) + (vpp - 1) pp + 1 chunk backwards (``in_flight_micro_batches`` stage
    micro-batches), and gathered over the warm-up in the same way. ZeRO-3 waits for its
    gathers and reductions layer by layer in every micro-batch, which no slack absorbs."""
    reduce_tail = gather_tail = 0.0
    m = lay.num_micro_batches
    for i, s in enumerate(stages):
        fwd, bwd = s.pass_.fwd, s.pass_.bwd + s.pass_.recompute
        if lay.vpp > 1:
            window = in_flight_micro_batches(i, lay.pp, m, lay.vpp)
            windows, pieces, drain, fill = (bwd * window, fwd * window), lay.vpp, 0.0, 0.0
        else:
            windows, pieces, drain, fill = (bwd, fwd), (s.dp.buckets if i == 0 else 1), i * bwd, i * fwd
        red, gat = exposed_dp_time(
            s.dp, lay.zero, lay.overlap_grad_reduce, lay.reshard_after_forward, fwd, bwd, m, *windows, pieces
        )
        if lay.zero >= 3:  # stalls on every micro-batch's layers: the drain and fill slack does not absorb them
            drain = fill = 0.0
        reduce_tail = max(reduce_tail, red - drain)
        gather_tail = max(gather_tail, gat - fill)
    return reduce_tail + gather_tail


def _optimizer_s(env: CostEnv, s: StageCost) -> float:
    """The optimizer step of one stage, memory-bound: fused Adam over this GPU's shard, zeroing
    the gradient buffer, and recasting the low-precision weight copies (once per step). The
    executor's AdamW steps one tensor at a time: where the profile measured it, a fixed cost per
    tensor plus its bytes at the measured rate (``Profile.optimizer_cost``)."""
    t = env.training
    measured = env.profile.optimizer_cost() if env.executor and env.profile is not None else None
    if measured is not None:
        per_tensor, bw = measured
        # fp32 AdamW reads parameter, gradient and both moments and writes three: 7 x 4 bytes
        return env.compute_scale * (s.tensors * per_tensor + s.optimizer_params * 28 / bw)
    nbytes = s.optimizer_params * ADAM_BYTES_PER_PARAM + s.buffer_params * t.grad_bytes
    nbytes += s.gemm_params * (2 + env.lp_copy_bytes)
    return nbytes / env.mem_bw
