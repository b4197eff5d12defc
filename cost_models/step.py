"""estimate_step: the one place where the cost terms are composed into a step time.

A pipeline stage is a chain of blocks: the embedding (first stage), transformer layers, the LM
head (last stage). Each block runs at a TP degree t dividing the stage width ``layout.tp`` (t =
tp everywhere for a uniform layout); a block at degree t runs tp/t copies inside the stage, each
on its share of the micro-batch. Per block and micro-batch we cost forward and backward compute
(backward = 2x forward for GEMMs and memory traffic), recomputation and the TP/CP/EP
collectives; between blocks of different degree, the change of activation layout. The pipeline
schedule turns stage times into the forward-backward time; the exposed part of the DP gradient
reduction and the optimizer step are added.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from pydantic import BaseModel, ConfigDict, Field

from cost_models import collectives as coll
from cost_models.efficiency import DEFAULT_EFFICIENCY, Efficiency
from cost_models.flops import ACT_BYTES, Op, embedding_ops, head_ops, layer_ops, model_flops_per_step
from cost_models.layout import ParallelLayout, check_layout, sub_batch
from cost_models.memory import (
    StateBytes,
    activation_bytes_per_layer,
    embedding_params_per_gpu,
    head_activation_bytes,
    head_params_per_gpu,
    in_flight_micro_batches,
    layer_params_per_gpu,
    state_bytes,
)
from cost_models.model import LayerKind, ModelSpec
from cost_models.pipeline import p2p_bytes, pipeline_time
from cost_models.training import TrainingSpec
from topologies.cluster import Cluster, GroupLinks

ADAM_BYTES_PER_PARAM = (
    34.0  # read fp32 param, grad, m, v (16) + write param, m, v (12) + 16-bit copy (2) + grad-norm read (4)
)
RUNTIME_RESERVED_BYTES = 2e9  # CUDA context, NCCL buffers, allocator slack
EMBED, HEAD = "embedding", "head"
Block = LayerKind | str  # a layer kind, or EMBED / HEAD


class StepCost(BaseModel):
    """Predicted cost of one optimizer step for one layout."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    step_time_s: float = Field(description="Wall time of one optimizer step.")
    time_breakdown_s: dict[str, float] = Field(description="Parts of step_time_s; they sum to it.")
    memory_per_gpu_bytes: float = Field(description="Peak bytes on the fullest GPU.")
    memory_breakdown_bytes: dict[str, float] = Field(description="Parts of memory_per_gpu_bytes.")
    hbm_bytes: float = Field(description="Capacity of one GPU.")
    mfu: float = Field(description="Model FLOPs / (step time x GPUs x dense peak).")
    tokens_per_s: float = Field(description="Training tokens per second for the whole job.")
    model_flops_per_step: float = Field(description="Forward + backward model FLOPs, no recompute.")
    tflops_per_gpu: float = Field(description="Hardware TFLOP/s per GPU, counting recompute.")
    bottleneck_stage: int = Field(description="Pipeline stage that paces the schedule.")
    stage_time_s: list[float] = Field(description="Per-micro-batch forward+backward time of each stage.")
    stage_memory_bytes: list[float] = Field(description="Peak bytes per GPU of each stage.")

    def fits(self, headroom: float = 0.0) -> bool:
        """Memory fits in HBM leaving ``headroom`` (a fraction) free."""
        return self.memory_per_gpu_bytes <= self.hbm_bytes * (1 - headroom)


@dataclass
class Pass:
    """Seconds of one micro-batch through some blocks on one GPU, by category."""

    fwd: float = 0.0
    bwd: float = 0.0
    recompute: float = 0.0
    tp_comm: float = 0.0
    cp_comm: float = 0.0
    ep_comm: float = 0.0
    hw_flops: float = 0.0

    def add(self, other: Pass, times: float = 1.0) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + times * getattr(other, f.name))

    @property
    def total(self) -> float:
        return self.fwd + self.bwd + self.recompute + self.tp_comm + self.cp_comm + self.ep_comm


@dataclass(frozen=True)
class Degree:
    """What running a block at TP degree ``t`` inside a stage means: its share of the
    micro-batch and the groups it talks to (rank order tp < cp < dp < pp; a degree-t group's
    in-stage copies sit at stride t inside the stage's tp GPUs)."""

    t: int
    seqs: int  # sequences per TP group
    cp: int  # sequence split: inside the stage times the layout's cp
    tokens: int  # tokens one GPU's TP group processes
    copies: int  # data-parallel copies of the block inside the stage (tp / t)
    tp_links: GroupLinks
    cp_links: GroupLinks
    ep_links: GroupLinks
    dp_links: GroupLinks
    expert_dp_links: GroupLinks


class CostEnv:
    """Everything the estimator looks up repeatedly for one (model, training, layout, cluster),
    with per-degree and per-block caches. Also used by the per-layer solver to cost blocks."""

    def __init__(
        self,
        model: ModelSpec,
        training: TrainingSpec,
        layout: ParallelLayout,
        cluster: Cluster,
        eff: Efficiency = DEFAULT_EFFICIENCY,
        pass_cache: dict | None = None,
    ):
        """``pass_cache`` may be shared between layouts that differ only in pp, dp and vpp
        (block passes depend on tp, cp, ep, micro-batch, recompute and overlap, not on those)."""
        self.model, self.training, self.layout, self.cluster, self.eff = model, training, layout, cluster, eff
        gpu = cluster.gpu
        self.peak = gpu.peak_flops_per_s(training.dtype)
        self.gemm_peak = self.peak * eff.gemm_peak_fraction(gpu.name)
        self.mem_bw = gpu.hbm_bw_bytes_per_s * eff.hbm_efficiency
        self.stage_tokens = layout.micro_batch * training.seq_len // layout.cp
        self._degrees: dict[int, Degree] = {}
        self._passes: dict[tuple[Block, int], Pass] = {} if pass_cache is None else pass_cache

    # ---- degrees and groups ------------------------------------------------------------------
    def degree(self, t: int) -> Degree:
        if t not in self._degrees:
            lay, c = self.layout, self.cluster
            seqs, split = sub_batch(lay.micro_batch, t, lay.tp)
            copies = lay.tp // t
            outer = lay.tp * lay.cp
            self._degrees[t] = Degree(
                t=t,
                seqs=seqs,
                cp=split * lay.cp,
                tokens=seqs * self.training.seq_len // (split * lay.cp),
                copies=copies,
                tp_links=c.strided_links(0, 1, t),
                cp_links=c.grid_links(t, split, lay.tp, lay.cp),
                ep_links=c.strided_links(0, outer, lay.ep),
                dp_links=c.grid_links(t, copies, outer, lay.dp),
                expert_dp_links=c.grid_links(t, copies, outer * lay.ep, lay.dp * lay.cp // lay.ep),
            )
        return self._degrees[t]

    # ---- time of one micro-batch through one block -------------------------------------------
    def op_time(self, op: Op) -> float:
        if op.kind == "gemm":
            return op.flops / (self.gemm_peak * self.eff.shape_factor(op.m, op.n, op.k))
        if op.kind == "flash":
            return op.flops / (self.peak * self.eff.flash_efficiency)
        return op.mem_bytes / self.mem_bw

    def ops_pass(self, ops: list[Op]) -> Pass:
        fwd = sum(self.op_time(op) for op in ops)
        return Pass(fwd=fwd, bwd=2 * fwd, hw_flops=3 * sum(op.flops for op in ops))

    def block_pass(self, block: Block, t: int) -> Pass:
        key = (block, t)
        if key not in self._passes:
            if block == EMBED:
                self._passes[key] = self._embed_pass(t)
            elif block == HEAD:
                self._passes[key] = self._head_pass(t)
            else:
                self._passes[key] = self._layer_pass(block, t)
        return self._passes[key]

    def _tp_collective(self, d: Degree) -> float:
        """One TP collective on a block's activation: all-reduce, or reduce-scatter + all-gather
        under sequence parallelism (the same bytes), less what overlap hides."""
        one = coll.all_reduce_time(ACT_BYTES * d.tokens * self.model.hidden_size, d.tp_links, self.eff)
        return one * ((1 - self.eff.tp_overlap_hidden) if self.layout.tp_comm_overlap else 1.0)

    def _embed_pass(self, t: int) -> Pass:
        """Vocabulary-parallel lookup; its partial outputs are summed over TP (forward only)."""
        d = self.degree(t)
        p = self.ops_pass(embedding_ops(self.model, d.seqs, self.training.seq_len, d.cp))
        p.tp_comm = self._tp_collective(d)
        return p

    def _head_pass(self, t: int) -> Pass:
        """Final norm, column-parallel logits and vocabulary-parallel cross entropy; one TP
        collective's worth of traffic (gather forward, reduce backward)."""
        d = self.degree(t)
        p = self.ops_pass(head_ops(self.model, d.seqs, self.training.seq_len, t, d.cp))
        p.tp_comm = self._tp_collective(d)
        return p

    def _layer_pass(self, kind: LayerKind, t: int) -> Pass:
        """One transformer layer: compute, recompute and collectives. A TP collective follows
        each sublayer (attention, MLP) forward and again backward."""
        m, lay, eff, d = self.model, self.layout, self.eff, self.degree(t)
        ops = layer_ops(
            m,
            kind,
            d.seqs,
            self.training.seq_len,
            t,
            d.cp,
            lay.ep,
            lay.sequence_parallel,
            self.training.flash_attention,
        )
        p = self.ops_pass(ops)
        sublayers = kind.attention + (kind.moe or kind.ffn > 0)
        tp_fwd = sublayers * self._tp_collective(d)
        p.tp_comm = 2 * tp_fwd
        core = [op for op in ops if op.name.startswith(("attention", "softmax"))]
        if d.cp > 1 and kind.attention:  # all-gather K and V forward, reduce-scatter their gradients backward
            kv = 2 * ACT_BYTES * d.tokens * m.kv_width * d.cp
            core_s = sum(self.op_time(op) for op in core)
            p.cp_comm = max(0.0, coll.all_gather_time(kv, d.cp_links, eff) - core_s) * 3
        if kind.moe and lay.ep > 1:  # dispatch + combine, forward and backward
            routed = ACT_BYTES * d.tokens * m.hidden_size * m.moe_top_k
            p.ep_comm = 4 * coll.all_to_all_time(routed, d.ep_links, eff)
        if lay.recompute == "full":
            p.recompute = p.fwd + (tp_fwd + p.cp_comm / 3 + p.ep_comm / 2)
            p.hw_flops += sum(op.flops for op in ops)
        elif lay.recompute == "selective":
            p.recompute = sum(self.op_time(op) for op in core)
            p.hw_flops += sum(op.flops for op in core)
        return p

    def transition_time(self, t_from: int, t_to: int) -> float:
        """Changing degree between consecutive blocks, per micro-batch. Under sequence
        parallelism every GPU holds tokens [g T/tp, (g+1) T/tp) at a block boundary whatever the
        degree, so the change is free. Otherwise a degree-t block leaves its TP group's share
        replicated on the group: growing to t' > t all-gathers t'/t shares forward (backward
        slices locally); shrinking slices forward and all-gathers the gradient backward."""
        if t_from == t_to or self.layout.sequence_parallel:
            return 0.0
        lo, hi = sorted((t_from, t_to))
        nbytes = ACT_BYTES * self.stage_tokens * self.model.hidden_size * hi / self.layout.tp
        gather = coll.all_gather_time(nbytes, self.cluster.strided_links(0, lo, hi // lo), self.eff)
        regrown = self.layout.recompute == "full" and t_to > t_from
        return gather * (2 if regrown else 1)

    # ---- memory and gradient sync of one block -------------------------------------------------
    def block_params(self, block: Block, t: int, last_stage_ties: bool = False) -> tuple[float, float]:
        """(non-expert, expert) parameters of a block on one GPU at degree t."""
        m = self.model
        if block == EMBED:
            return embedding_params_per_gpu(m, t), 0.0
        if block == HEAD:
            return head_params_per_gpu(m, t, last_stage_ties), 0.0
        expert = m.layer_expert_params(block) / (t * self.layout.ep)
        return layer_params_per_gpu(m, block, t, self.layout.ep) - expert, expert

    def block_memory(self, block: Block, t: int, held: float) -> tuple[StateBytes, float]:
        """(weights/grads/optimizer, activation bytes) of one block on one GPU when ``held``
        micro-batches are in flight. The distributed optimizer shards over every data-parallel
        copy of the block: the outer replicas times its copies inside the stage."""
        lay = self.layout
        dense, expert = self.block_params(block, t, last_stage_ties=lay.pp > 1)
        shard = lay.dp * self.degree(t).copies if lay.distributed_optimizer else 1
        state = state_bytes(dense + expert, self.training.dtype, shard, lay.distributed_optimizer)
        act = self.block_activation_bytes(block, t) * held
        if block == HEAD:
            d = self.degree(t)
            act += head_activation_bytes(self.model, self.training.seq_len, d.seqs, t, d.cp)
        return state, act

    def full_recompute_working_bytes(self, block: Block, t: int) -> float:
        """Under full recompute, one layer's complete activations live while it is recomputed."""
        if self.layout.recompute != "full":
            return 0.0
        return self.block_activation_bytes(block, t, recompute="none")

    def block_activation_bytes(self, block: Block, t: int, recompute: str | None = None) -> float:
        """Bytes one micro-batch leaves on a GPU for the backward pass of this block (under the
        layout's recompute mode unless ``recompute`` says otherwise)."""
        if block in (EMBED, HEAD):
            return 0.0
        d, lay = self.degree(t), self.layout
        return activation_bytes_per_layer(
            self.model,
            block,
            self.training.seq_len,
            d.seqs,
            t,
            lay.sequence_parallel,
            recompute or lay.recompute,
            self.training.flash_attention,
            d.cp,
        )


Run = tuple[Block, int, int]  # (block, degree, how many in a row)


def stage_blocks(
    model: ModelSpec, layout: ParallelLayout, stage: int, start: int, count: int
) -> list[tuple[int, Block]]:
    """(block index, block) of one stage in order: index 0 = embedding (first stage), i + 1 =
    layer i, L + 1 = LM head (last stage)."""
    L = model.num_layers
    blocks: list[tuple[int, Block]] = [(0, EMBED)] if stage == 0 else []
    blocks += [(i + 1, model.layer_kind(i)) for i in range(start, start + count)]
    return blocks + ([(L + 1, HEAD)] if stage == layout.pp - 1 else [])


def stage_runs(model: ModelSpec, layout: ParallelLayout, stage: int, start: int, count: int) -> list[Run]:
    """The blocks of one stage as runs of equal (block, degree). A uniform layout's layers are
    grouped by kind without walking them (order is irrelevant when no degree changes)."""
    if layout.layer_tp is None:
        t, first, last = layout.tp, stage == 0, stage == layout.pp - 1
        runs: list[Run] = [(EMBED, t, 1)] if first else []
        runs += [(kind, t, n) for kind, n in model.kind_counts(start, start + count).items()]
        return runs + ([(HEAD, t, 1)] if last else [])
    runs = []
    for index, block in stage_blocks(model, layout, stage, start, count):
        t = layout.layer_tp[index]
        if runs and runs[-1][0] == block and runs[-1][1] == t:
            runs[-1] = (block, t, runs[-1][2] + 1)
        else:
            runs.append((block, t, 1))
    return runs


@dataclass
class StageCost:
    pass_: Pass  # per micro-batch, transitions included in fwd/bwd
    params: float  # per GPU
    state: dict[str, float]  # weights, grads, optimizer bytes
    act_per_micro_batch: float  # activation bytes one in-flight micro-batch leaves behind
    act_fixed: float  # LM-head logits and the full-recompute working set
    dp_reduce_s: float  # gradient reduction (reduce-scatter or all-reduce)
    dp_gather_s: float  # parameter all-gather (distributed optimizer)
    optimizer_params: float  # parameters this GPU's optimizer updates

    def memory(self, held: float) -> dict[str, float]:
        """Bytes per GPU by part when ``held`` micro-batches are in flight."""
        act = self.act_per_micro_batch * held + self.act_fixed
        return {**self.state, "activations": act, "runtime_reserved": RUNTIME_RESERVED_BYTES}


def stage_cost(env: CostEnv, runs: list[Run]) -> StageCost:
    """Time per micro-batch, memory and DP traffic of one stage made of ``runs``."""
    lay, training = env.layout, env.training
    p = Pass()
    prev_t = None
    params = opt_params = reduce_s = gather_s = full_working = act = head = 0.0
    state = {"weights": 0.0, "grads": 0.0, "optimizer": 0.0}
    grad_bytes = 2.0 if training.dtype == "fp16" else 4.0
    for block, t, n in runs:
        p.add(env.block_pass(block, t), n)
        if prev_t is not None and prev_t != t:
            switch = env.transition_time(prev_t, t)
            p.fwd += switch / 2
            p.bwd += switch / 2
        prev_t = t
        block_state, block_act = env.block_memory(block, t, 1.0)
        for k in state:
            state[k] += n * getattr(block_state, k)
        if block == HEAD:  # the logits live once, not per micro-batch in flight
            head = env.block_memory(block, t, 0.0)[1]
            block_act -= head
        act += n * block_act
        full_working = max(full_working, env.full_recompute_working_bytes(block, t))
        d = env.degree(t)
        dense, expert = env.block_params(block, t, last_stage_ties=lay.pp > 1)
        params += n * (dense + expert)
        opt_params += n * (dense + expert) / (lay.dp * d.copies if lay.distributed_optimizer else 1)
        for nparams, links in ((n * dense, d.dp_links), (n * expert, d.expert_dp_links)):
            if nparams <= 0:
                continue
            if lay.distributed_optimizer:
                reduce_s += coll.reduce_scatter_time(nparams * grad_bytes, links, env.eff)
                gather_s += coll.all_gather_time(nparams * ACT_BYTES, links, env.eff)
            else:
                reduce_s += coll.all_reduce_time(nparams * grad_bytes, links, env.eff)
    return StageCost(p, params, state, act, head + full_working, reduce_s, gather_s, opt_params)


def pass_cache_key(layout: ParallelLayout) -> tuple:
    """What a block's forward/backward pass depends on besides the block and its degree:
    layouts with the same key can share one ``CostEnv`` pass cache."""
    return (
        layout.tp,
        layout.cp,
        layout.ep,
        layout.micro_batch,
        layout.recompute,
        layout.sequence_parallel,
        layout.tp_comm_overlap,
    )


def estimate_step(
    model: ModelSpec,
    training: TrainingSpec,
    layout: ParallelLayout,
    cluster: Cluster,
    efficiency: Efficiency = DEFAULT_EFFICIENCY,
    pass_caches: dict | None = None,
) -> StepCost:
    """Predict step time, memory per GPU and MFU of ``layout``; raise ValueError if it is invalid.
    ``pass_caches`` (keyed by ``pass_cache_key``) lets many layouts share block passes."""
    check_layout(layout, model, training, cluster.num_gpus, cluster.spec.domain_size)
    cache = None if pass_caches is None else pass_caches.setdefault(pass_cache_key(layout), {})
    return cost_from_stages(CostEnv(model, training, layout, cluster, efficiency, cache))


def cost_from_stages(env: CostEnv, stages: list[StageCost] | None = None) -> StepCost:
    """Compose stage costs into a StepCost; stages default to the layout's own split."""
    model, training, lay, eff = env.model, env.training, env.layout, env.eff
    if stages is None:
        counts = lay.stage_layers(model.num_layers)
        starts = [sum(counts[:i]) for i in range(lay.pp)]
        memo: dict[tuple, StageCost] = {}
        stages = []
        for i, (start, count) in enumerate(zip(starts, counts, strict=True)):
            runs = tuple(stage_runs(model, lay, i, start, count))
            if runs not in memo:
                memo[runs] = stage_cost(env, list(runs))
            stages.append(memo[runs])
    # Pipeline sends: activation forward and its gradient backward, once per model chunk.
    p2p = 0.0
    if lay.pp > 1 and not lay.overlap_p2p:
        pp_links = env.cluster.strided_links(0, lay.tp * lay.cp * lay.dp, 2)
        p2p = 2 * lay.vpp * coll.send_recv_time(p2p_bytes(env.stage_tokens, model.hidden_size, lay.tp), pp_links, eff)
    stage_time = [s.pass_.total + p2p for s in stages]
    pipe = pipeline_time(stage_time, lay.num_micro_batches, lay.vpp if lay.pp > 1 else 1)
    dp_exposed = max(_dp_exposed(lay, s) for s in stages)
    optimizer_s = max(s.optimizer_params for s in stages) * ADAM_BYTES_PER_PARAM / env.mem_bw
    s = stages[pipe.bottleneck_stage].pass_
    m = lay.num_micro_batches
    breakdown = {
        "compute": m * (s.fwd + s.bwd),
        "recompute": m * s.recompute,
        "tp_comm": m * s.tp_comm,
        "cp_comm": m * s.cp_comm,
        "ep_comm": m * s.ep_comm,
        "pp_p2p": m * p2p,
        "pp_bubble": pipe.bubble_s,
        "dp_comm_exposed": dp_exposed,
        "optimizer": optimizer_s,
        "overhead": eff.step_overhead_s,
    }
    step_time = sum(breakdown.values())
    memory = [st.memory(in_flight_micro_batches(i, lay.pp, m, lay.vpp)) for i, st in enumerate(stages)]
    totals = [sum(parts.values()) for parts in memory]
    fullest = max(range(lay.pp), key=totals.__getitem__)
    model_flops = model_flops_per_step(model, training.seq_len, training.global_batch)
    n = env.cluster.num_gpus
    hw_flops = sum(st.pass_.hw_flops for st in stages) * m * lay.dp * lay.tp * lay.cp  # every GPU of every stage
    return StepCost(
        step_time_s=step_time,
        time_breakdown_s=breakdown,
        memory_per_gpu_bytes=totals[fullest],
        memory_breakdown_bytes=memory[fullest],
        hbm_bytes=env.cluster.gpu.hbm_bytes,
        mfu=model_flops / (step_time * n * env.peak),
        tokens_per_s=training.tokens_per_step / step_time,
        model_flops_per_step=model_flops,
        tflops_per_gpu=hw_flops / (step_time * n) / 1e12,
        bottleneck_stage=pipe.bottleneck_stage,
        stage_time_s=stage_time,
        stage_memory_bytes=totals,
    )


def _dp_exposed(lay: ParallelLayout, s: StageCost) -> float:
    """DP gradient sync left on the critical path for one stage.

    Gradients are reduced in fp32 for bf16/fp8 (Megatron accumulates main grads in fp32) and in
    fp16 for fp16. Distributed optimizer: reduce-scatter of gradients, all-gather of updated
    16-bit params; otherwise one all-reduce. With overlap the gradient reduction hides behind
    the last micro-batch's backward pass (buckets fill only then) and the parameter all-gather
    behind the next step's first forward; whatever does not fit stays exposed.
    """
    if not lay.overlap_grad_reduce:
        return s.dp_reduce_s + s.dp_gather_s
    return max(0.0, s.dp_reduce_s - (s.pass_.bwd + s.pass_.recompute)) + max(0.0, s.dp_gather_s - s.pass_.fwd)
