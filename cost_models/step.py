"""estimate_step: the one place where the cost terms are composed into a step time.

A pipeline stage runs its model chunks (``ParallelLayout.stage_chunks``), each a chain of
blocks: the embedding (first chunk), transformer layers, the LM head (last chunk). Block costs
come from ``cost_models.blocks``; here they are summed per stage, the pipeline schedule turns
stage times into the forward-backward time, and the exposed parts of the data-parallel
synchronisation (``cost_models.data_parallel``), the pipeline sends, the optimizer step and the
fixed per-step overhead are added.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from pydantic import BaseModel, ConfigDict, Field

from cost_models.blocks import EMBED, EXECUTOR_TENSORS, HEAD, Block, CostEnv, Pass, pass_cache_key
from cost_models.data_parallel import DpTraffic, bucket_count, exposed_dp_time
from cost_models.efficiency import DEFAULT_EFFICIENCY, Efficiency
from cost_models.flops import model_flops_per_step
from cost_models.layout import ParallelLayout, check_layout
from cost_models.memory import in_flight_micro_batches
from cost_models.model import ModelSpec
from cost_models.pipeline import p2p_bytes, pipeline_time
from cost_models.pipeline_layout import stage_chunk_spans
from cost_models.training import TrainingSpec
from topologies.cluster import Cluster

__all__ = [
    "EMBED",
    "HEAD",
    "RUNTIME_RESERVED_BYTES",
    "Block",
    "CostEnv",
    "StepCost",
    "estimate_step",
    "pass_cache_key",
    "stage_blocks",
]

# Fused Adam (Transformer Engine's multi_tensor_adam) per parameter of this GPU's optimizer shard:
# read fp32 param, grad, m, v (16) + write param, m, v (12) + write the 16-bit copy (2) + the
# grad-norm read (4).
ADAM_BYTES_PER_PARAM = 34.0
RUNTIME_RESERVED_BYTES = 2e9  # CUDA context, NCCL buffers, allocator slack


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


Run = tuple[Block, int, int]  # (block, degree, how many in a row)


def range_blocks(
    model: ModelSpec, layout: ParallelLayout, stage: int, start: int, count: int
) -> list[tuple[int, Block]]:
    """(block index, block) of layers start..start+count-1 on ``stage``, with the embedding
    when it is the first stage and the LM head when it is the last: index 0 = embedding,
    i + 1 = layer i, L + 1 = LM head."""
    L = model.num_layers
    blocks: list[tuple[int, Block]] = [(0, EMBED)] if stage == 0 else []
    blocks += [(i + 1, model.layer_kind(i)) for i in range(start, start + count)]
    return blocks + ([(L + 1, HEAD)] if stage == layout.pp - 1 else [])


def stage_blocks(model: ModelSpec, layout: ParallelLayout, stage: int) -> list[tuple[int, Block]]:
    """(block index, block) of every block ``stage`` runs for one micro-batch, chunk by chunk
    (``ParallelLayout.stage_chunks``): the embedding opens chunk 0, the LM head closes the last."""
    L, last = model.num_layers, layout.pp * layout.vpp - 1
    blocks: list[tuple[int, Block]] = []
    for chunk, start, count in layout.stage_chunks(stage, L):
        blocks += [(0, EMBED)] if chunk == 0 else []
        blocks += [(i + 1, model.layer_kind(i)) for i in range(start, start + count)]
        blocks += [(L + 1, HEAD)] if chunk == last else []
    return blocks


def stage_runs(model: ModelSpec, layout: ParallelLayout, stage: int) -> list[Run]:
    """The blocks of one stage as runs of equal (block, degree). A uniform layout's layers are
    grouped by kind without walking them (order is irrelevant when no degree changes)."""
    if layout.layer_tp is None:
        return list(_uniform_stage_runs(model, layout.tp, layout.pp, layout.vpp, layout.chunk_layers, stage))
    return runs_of(stage_blocks(model, layout, stage), layout.layer_tp)


@lru_cache(maxsize=4096)
def _uniform_stage_runs(
    model: ModelSpec, tp: int, pp: int, vpp: int, chunk_layers: tuple[int, ...] | None, stage: int
) -> tuple[Run, ...]:
    """``stage_runs`` of a uniform layout, memoised: a search asks for the same few stages of
    layouts that differ only in what the runs do not depend on (dp, micro-batch, ZeRO, ...)."""
    last = pp * vpp - 1
    runs: list[Run] = []
    for chunk, start, count in stage_chunk_spans(pp, vpp, chunk_layers, stage, model.num_layers):
        runs += [(EMBED, tp, 1)] if chunk == 0 else []
        runs += [(kind, tp, n) for kind, n in model.kind_counts(start, start + count).items()]
        runs += [(HEAD, tp, 1)] if chunk == last else []
    return tuple(runs)


def runs_of(blocks: list[tuple[int, Block]], degrees: tuple[int, ...]) -> list[Run]:
    """Consecutive blocks of equal kind and degree merged into runs."""
    runs: list[Run] = []
    for index, block in blocks:
        t = degrees[index]
        if runs and runs[-1][0] == block and runs[-1][1] == t:
            runs[-1] = (block, t, runs[-1][2] + 1)
        else:
            runs.append((block, t, 1))
    return runs


@dataclass
class StageCost:
    pass_: Pass  # per micro-batch, transitions included in fwd/bwd
    params: float  # per GPU
    state: dict[str, float]  # weights, grads, optimizer, low-precision weight bytes
    act_per_micro_batch: float  # activation bytes one in-flight micro-batch leaves behind
    act_fixed: float  # LM-head logits, the full-recompute and the ZeRO-3 working sets
    dp: DpTraffic  # gradient reduction and parameter gathering
    optimizer_params: float  # parameters this GPU's optimizer updates
    buffer_params: float  # parameters whose gradient buffer this GPU zeroes each step
    gemm_params: float  # low-precision GEMM weights recast once per step
    tensors: float = 0.0  # parameter tensors, as the executor holds them (``EXECUTOR_TENSORS``)

    def memory(self, held: float) -> dict[str, float]:
        """Bytes per GPU by part when ``held`` micro-batches are in flight."""
        act = self.act_per_micro_batch * held + self.act_fixed
        return {**self.state, "activations": act, "runtime_reserved": RUNTIME_RESERVED_BYTES}


def stage_cost(env: CostEnv, runs: list[Run]) -> StageCost:
    """Time per micro-batch, memory and DP traffic of one stage made of ``runs``."""
    lay, training = env.layout, env.training
    p = Pass()
    prev_t = None
    params = opt_params = buffer = gemm = reduce_s = gather_s = working = act = head = 0.0
    layers = tensors = 0
    state = {"weights": 0.0, "grads": 0.0, "optimizer": 0.0, "low_precision_weights": 0.0}
    largest_block = 0.0
    dp_group = lay.dp  # Megatron sizes buckets by the data-parallel group without cp
    for block, t, n in runs:
        p.add(env.block_pass(block, t), n)
        if prev_t is not None and prev_t != t:
            switch = env.transition_time(prev_t, t)
            p.fwd += switch / 2
            p.bwd += switch / 2
        prev_t = t
        layers += n if block not in (EMBED, HEAD) else 0
        tensors += n * EXECUTOR_TENSORS.get(block if block in (EMBED, HEAD) else "layer")
        f = env.block_facts(block, t)
        for k in state:
            state[k] += n * getattr(f.state, k)
        head = max(head, f.logits)  # the logits live once, not per micro-batch in flight
        act += n * f.act
        working = max(working, f.working)
        d = env.degree(t)
        dp_group = max(dp_group, lay.dp * d.copies)
        dense, expert = f.dense, f.expert
        if env.executor and lay.sequence_parallel and t > 1:  # norms saw only this rank's tokens: their
            # gradients are summed over the TP group, one all-reduce per norm (two per layer, the final norm)
            norms = n * {EMBED: 0, HEAD: 1}.get(block, 2)
            reduce_s += norms * env.coll("all_reduce", env.model.hidden_size * training.grad_bytes, d.tp_links)
        params += n * (dense + expert)
        largest_block = max(largest_block, dense + expert)
        gemm += n * f.gemm
        weight_bytes = f.weight_bytes
        for nparams, links in ((n * dense, d.dp_links), (n * expert, d.expert_dp_links)):
            if nparams <= 0:
                continue
            sharded = lay.zero >= 1 and links.size > 1
            opt_params += nparams / (links.size if lay.zero >= 1 else 1)
            buffer += nparams / (links.size if lay.zero >= 2 else 1)
            if sharded:
                reduce_s += env.coll("reduce_scatter", nparams * training.grad_bytes, links)
                gather_s += env.coll("all_gather", nparams * weight_bytes, links)
                if env.executor:  # one reduce-scatter and one all-gather per parameter tensor (executor.optimizer)
                    calls = n * EXECUTOR_TENSORS.get(block if block in (EMBED, HEAD) else "layer")
                    reduce_s += (calls - 1) * env.coll("reduce_scatter", 0.0, links)
                    gather_s += (calls - 1) * env.coll("all_gather", 0.0, links)
            elif env.executor:  # one all-reduce per parameter tensor, n blocks of them
                calls = n * EXECUTOR_TENSORS.get(block if block in (EMBED, HEAD) else "layer")
                reduce_s += env.coll("all_reduce", nparams * training.grad_bytes, links)
                reduce_s += (calls - 1) * env.coll("all_reduce", 0.0, links)
            else:
                reduce_s += env.coll("all_reduce", nparams * training.grad_bytes, links)
    if lay.zero >= 3:  # two layers' gathered weights live at once (double buffer), and one's gradients
        working = max(working, largest_block * (2 * training.param_bytes + training.grad_bytes))
        if not lay.reshard_after_forward:  # every layer's gathered weights stay from forward to backward
            working = max(working, params * training.param_bytes + largest_block * training.grad_bytes)
    buckets = bucket_count(params, dp_group, lay.zero, layers)
    return StageCost(
        pass_=p,
        params=params,
        state=state,
        act_per_micro_batch=act,
        act_fixed=head + working,
        dp=DpTraffic(reduce_s=reduce_s, gather_s=gather_s, buckets=buckets),
        optimizer_params=opt_params,
        buffer_params=buffer,
        gemm_params=gemm,
        tensors=tensors,
    )


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
    dp_exposed = dp_exposed_s(lay, stages)
    optimizer_s = max(_optimizer_s(env, s) for s in stages)
    s = stages[pipe.bottleneck_stage].pass_
    breakdown = {
        "compute": m * (s.fwd + s.bwd),
        "recompute": m * s.recompute,
        "tp_comm": m * s.tp_comm,
        "cp_comm": m * s.cp_comm,
        "ep_comm": m * s.ep_comm,
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
