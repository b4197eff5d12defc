"""estimate_step: the one place where the cost terms are composed into a step time.

Per pipeline stage and micro-batch: forward and backward compute of every op (backward = 2x
forward for GEMMs and memory traffic), recomputation, TP/CP/EP collectives and pipeline sends.
The pipeline schedule turns stage times into the forward-backward time; then the exposed part
of the DP gradient reduction and the optimizer step are added.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from cost_models import collectives as coll
from cost_models.efficiency import DEFAULT_EFFICIENCY, Efficiency
from cost_models.flops import ACT_BYTES, Op, embedding_ops, head_ops, layer_ops, model_flops_per_step
from cost_models.layout import ParallelLayout, check_layout
from cost_models.memory import (
    activation_bytes_per_layer,
    head_activation_bytes,
    in_flight_micro_batches,
    stage_params,
    state_bytes,
)
from cost_models.model import ModelSpec
from cost_models.pipeline import p2p_bytes, pipeline_time
from cost_models.training import TrainingSpec
from topologies.cluster import Cluster

ADAM_BYTES_PER_PARAM = (
    34.0  # read fp32 param, grad, m, v (16) + write param, m, v (12) + 16-bit copy (2) + grad-norm read (4)
)
RUNTIME_RESERVED_BYTES = 2e9  # CUDA context, NCCL buffers, allocator slack


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
class _Pass:
    """Seconds of one micro-batch through some layers on one GPU, by category."""

    fwd: float = 0.0
    bwd: float = 0.0
    recompute: float = 0.0
    tp_comm: float = 0.0
    cp_comm: float = 0.0
    ep_comm: float = 0.0
    hw_flops: float = 0.0

    def add(self, other: _Pass, times: float = 1.0) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + times * getattr(other, name))

    @property
    def total(self) -> float:
        return self.fwd + self.bwd + self.recompute + self.tp_comm + self.cp_comm + self.ep_comm


class _Ctx:
    """Everything estimate_step looks up repeatedly, computed once."""

    def __init__(
        self, model: ModelSpec, training: TrainingSpec, layout: ParallelLayout, cluster: Cluster, eff: Efficiency
    ):
        self.model, self.training, self.layout, self.cluster, self.eff = model, training, layout, cluster, eff
        gpu = cluster.gpu
        self.peak = gpu.peak_flops_per_s(training.dtype)
        self.gemm_peak = self.peak * eff.gemm_peak_fraction(gpu.name)
        self.mem_bw = gpu.hbm_bw_bytes_per_s * eff.hbm_efficiency
        lay = layout
        self.tokens = lay.micro_batch * training.seq_len // lay.cp
        # Representative groups of rank 0 under the rank order tp < cp < dp < pp.
        self.tp_links = cluster.strided_links(0, 1, lay.tp)
        self.cp_links = cluster.strided_links(0, lay.tp, lay.cp)
        self.dp_links = cluster.strided_links(0, lay.tp * lay.cp, lay.dp)
        self.ep_links = cluster.strided_links(0, lay.tp * lay.cp, lay.ep)
        self.expert_dp_links = cluster.strided_links(0, lay.tp * lay.cp * lay.ep, lay.dp * lay.cp // lay.ep)
        self.pp_links = cluster.strided_links(0, lay.tp * lay.cp * lay.dp, min(2, lay.pp))

    def op_time(self, op: Op) -> float:
        if op.kind == "gemm":
            return op.flops / (self.gemm_peak * self.eff.shape_factor(op.m, op.n, op.k))
        if op.kind == "flash":
            return op.flops / (self.peak * self.eff.flash_efficiency)
        return op.mem_bytes / self.mem_bw

    def ops_pass(self, ops: list[Op]) -> _Pass:
        fwd = sum(self.op_time(op) for op in ops)
        flops = sum(op.flops for op in ops)
        return _Pass(fwd=fwd, bwd=2 * fwd, hw_flops=3 * flops)

    def layer_pass(self, layer: int) -> _Pass:
        """One transformer layer, one micro-batch: compute, recompute and collectives."""
        m, lay, eff = self.model, self.layout, self.eff
        ops = layer_ops(
            m,
            layer,
            lay.micro_batch,
            self.training.seq_len,
            lay.tp,
            lay.cp,
            lay.ep,
            lay.sequence_parallel,
            self.training.flash_attention,
        )
        p = self.ops_pass(ops)
        act = ACT_BYTES * self.tokens * m.hidden_size
        # Two TP collectives forward (after attention and after the MLP), two backward:
        # all-reduce, or reduce-scatter + all-gather under sequence parallelism (same bytes).
        tp_one = coll.all_reduce_time(act, self.tp_links, eff)
        tp_fwd = 2 * tp_one * ((1 - eff.tp_overlap_hidden) if lay.tp_comm_overlap else 1.0)
        p.tp_comm = 2 * tp_fwd
        core = [op for op in ops if op.name.startswith(("attention", "softmax"))]
        if lay.cp > 1:  # all-gather K and V forward, reduce-scatter their gradients backward
            kv = 2 * ACT_BYTES * self.tokens * m.kv_width * lay.cp
            core_s = sum(self.op_time(op) for op in core)
            p.cp_comm = max(0.0, coll.all_gather_time(kv, self.cp_links, eff) - core_s) * 3
        if m.is_moe_layer(layer) and lay.ep > 1:  # dispatch + combine, forward and backward
            routed = act * m.moe_top_k
            p.ep_comm = 4 * coll.all_to_all_time(routed, self.ep_links, eff)
        if lay.recompute == "full":
            p.recompute = p.fwd + (tp_fwd + p.cp_comm / 3 + p.ep_comm / 2)
            p.hw_flops += sum(op.flops for op in ops)
        elif lay.recompute == "selective":
            p.recompute = sum(self.op_time(op) for op in core)
            p.hw_flops += sum(op.flops for op in core)
        return p


def estimate_step(
    model: ModelSpec,
    training: TrainingSpec,
    layout: ParallelLayout,
    cluster: Cluster,
    efficiency: Efficiency = DEFAULT_EFFICIENCY,
) -> StepCost:
    """Predict step time, memory per GPU and MFU of ``layout``; raise ValueError if it is invalid."""
    check_layout(layout, model, training, cluster.num_gpus, cluster.spec.domain_size)
    ctx = _Ctx(model, training, layout, cluster, efficiency)
    lay, eff = layout, efficiency
    stages = lay.stage_layers(model.num_layers)
    starts = [sum(stages[:i]) for i in range(lay.pp)]
    # Layers of one kind (dense or MoE) cost the same: cost one of each, multiply by counts.
    kinds = _layer_kinds(model)
    per_kind = {moe: ctx.layer_pass(layer) for moe, layer in kinds.items()}
    embed = ctx.ops_pass(embedding_ops(model, lay.micro_batch, training.seq_len, lay.cp))
    head = ctx.ops_pass(head_ops(model, lay.micro_batch, training.seq_len, lay.tp, lay.cp))
    # Stages with the same layer counts and role cost the same: compute each signature once.
    signatures = [
        (count, model.count_moe_layers(start, start + count), i == 0, i == lay.pp - 1)
        for i, (start, count) in enumerate(zip(starts, stages, strict=True))
    ]
    by_signature: dict[tuple[int, int, bool, bool], _Pass] = {}
    for count, moe, first, last in set(signatures):
        p = _Pass()
        for is_moe, n in ((True, moe), (False, count - moe)):
            if n:
                p.add(per_kind[is_moe], n)
        if first:
            p.add(embed)
        if last:
            p.add(head)
        by_signature[(count, moe, first, last)] = p
    passes = [by_signature[sig] for sig in signatures]
    # Pipeline sends: activation forward and its gradient backward, once per model chunk.
    p2p = 0.0
    if lay.pp > 1 and not lay.overlap_p2p:
        send = p2p_bytes(ctx.tokens, model.hidden_size, lay.tp)
        p2p = 2 * lay.vpp * coll.send_recv_time(send, ctx.pp_links, eff)
    stage_time = [p.total + p2p for p in passes]
    pipe = pipeline_time(stage_time, lay.num_micro_batches, lay.vpp if lay.pp > 1 else 1)

    params = [
        stage_params(model, range(s, s + n), lay.tp, lay.ep, i == 0, i == lay.pp - 1, lay.pp)
        for i, (s, n) in enumerate(zip(starts, stages, strict=True))
    ]
    exposed: dict[tuple, float] = {}
    for i, sig in enumerate(signatures):
        if sig not in exposed:
            exposed[sig] = _dp_exposed(ctx, params[i], passes[i], sig[1])
    dp_exposed = max(exposed.values())
    local = max(params) / (lay.dp if lay.distributed_optimizer else 1)
    optimizer_s = local * ADAM_BYTES_PER_PARAM / ctx.mem_bw

    s = passes[pipe.bottleneck_stage]
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
    mem = [_stage_memory(model, training, lay, i, starts[i], stages[i], params[i], kinds) for i in range(lay.pp)]
    fullest = max(range(lay.pp), key=lambda i: sum(mem[i].values()))
    model_flops = model_flops_per_step(model, training.seq_len, training.global_batch)
    hw_flops = sum(p.hw_flops for p in passes) * m * lay.dp
    return StepCost(
        step_time_s=step_time,
        time_breakdown_s=breakdown,
        memory_per_gpu_bytes=sum(mem[fullest].values()),
        memory_breakdown_bytes=mem[fullest],
        hbm_bytes=cluster.gpu.hbm_bytes,
        mfu=model_flops / (step_time * cluster.num_gpus * ctx.peak),
        tokens_per_s=training.tokens_per_step / step_time,
        model_flops_per_step=model_flops,
        tflops_per_gpu=hw_flops / (step_time * cluster.num_gpus) / 1e12,
        bottleneck_stage=pipe.bottleneck_stage,
        stage_time_s=stage_time,
        stage_memory_bytes=[sum(x.values()) for x in mem],
    )


def _dp_exposed(ctx: _Ctx, params: float, p: _Pass, expert_layers: int) -> float:
    """DP gradient sync left on the critical path for one stage.

    Gradients are reduced in fp32 for bf16/fp8 (Megatron accumulates main grads in fp32) and in
    fp16 for fp16. Distributed optimizer: reduce-scatter of gradients, all-gather of updated
    16-bit params; otherwise one all-reduce. With overlap the gradient reduction hides behind
    the last micro-batch's backward pass (buckets fill only then) and the parameter all-gather
    behind the next step's first forward; whatever does not fit stays exposed.
    """
    lay, eff = ctx.layout, ctx.eff
    grad_bytes = 2.0 if ctx.training.dtype == "fp16" else 4.0
    expert = expert_layers * ctx.model.expert_params / (lay.tp * lay.ep)
    groups = [(params - expert, ctx.dp_links), (expert, ctx.expert_dp_links)]
    reduce_s = gather_s = 0.0
    for n, links in groups:
        if n <= 0:
            continue
        if lay.distributed_optimizer:
            reduce_s += coll.reduce_scatter_time(n * grad_bytes, links, eff)
            gather_s += coll.all_gather_time(n * ACT_BYTES, links, eff)
        else:
            reduce_s += coll.all_reduce_time(n * grad_bytes, links, eff)
    if not lay.overlap_grad_reduce:
        return reduce_s + gather_s
    return max(0.0, reduce_s - (p.bwd + p.recompute)) + max(0.0, gather_s - p.fwd)


def _layer_kinds(model: ModelSpec) -> dict[bool, int]:
    """One representative layer index per kind present: {is_moe: layer}."""
    if not model.is_moe:
        return {False: 0}
    first_moe = next((i for i in range(model.num_layers) if model.is_moe_layer(i)), None)
    first_dense = next((i for i in range(model.num_layers) if not model.is_moe_layer(i)), None)
    return {k: v for k, v in ((True, first_moe), (False, first_dense)) if v is not None}


def _stage_memory(
    model: ModelSpec,
    training: TrainingSpec,
    lay: ParallelLayout,
    stage: int,
    start: int,
    count: int,
    params: float,
    kinds: dict[bool, int],
) -> dict[str, float]:
    st = state_bytes(params, training.dtype, lay.dp, lay.distributed_optimizer)
    flash = training.flash_attention
    moe = model.count_moe_layers(start, start + count)
    per_layer = 0.0
    for is_moe, n in ((True, moe), (False, count - moe)):
        if n:
            per_layer += n * activation_bytes_per_layer(
                model,
                kinds[is_moe],
                training.seq_len,
                lay.micro_batch,
                lay.tp,
                lay.sequence_parallel,
                lay.recompute,
                flash,
                lay.cp,
            )
    held = in_flight_micro_batches(stage, lay.pp, lay.num_micro_batches, lay.vpp)
    act = per_layer * held
    if lay.recompute == "full":  # one layer's full activations live while it is recomputed
        act += activation_bytes_per_layer(
            model, start, training.seq_len, lay.micro_batch, lay.tp, lay.sequence_parallel, "none", flash, lay.cp
        )
    if stage == lay.pp - 1:
        act += head_activation_bytes(model, training.seq_len, lay.micro_batch, lay.tp, lay.cp)
    return {
        "weights": st.weights,
        "grads": st.grads,
        "optimizer": st.optimizer,
        "activations": act,
        "runtime_reserved": RUNTIME_RESERVED_BYTES,
    }
