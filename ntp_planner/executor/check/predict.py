"""What the cost model predicts for a validate run: the shrunk model on the processes it uses.

The run (``spec.RunSpec``) is turned into the planner's three inputs: a ``ModelSpec`` of the
shrunk decoder, a ``TrainingSpec`` of its batch and sequence, and a ``ParallelLayout`` of its
stages and degrees on a local cluster of its processes. ``estimate_step`` then costs it with the
profile's measurements and ``Efficiency.runtime = "executor"`` (the executor's synchronous
collectives), exactly as ``ntp plan --profile`` costs a layout. A run whose replicas differ (NTP)
is costed one replica kind at a time: the step is the slowest replica's pipeline, plus the data-
parallel sync and optimizer of the healthy layout; a degraded kind by the planner's one
degraded-replica cost (``cost_models.degraded``), scaled from the healthy one. Everything goes
through ``cost_models.step.estimate_step_detail``: the step is composed there, not here. No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cost_models.degraded import degraded_breakdown, work_ratio
from cost_models.efficiency import DEFAULT_EFFICIENCY
from cost_models.layout import ParallelLayout
from cost_models.model import ModelSpec
from cost_models.profile import BlockShape, Profile
from cost_models.step import StepEstimate, estimate_step_detail
from cost_models.training import TrainingSpec
from ntp_planner.executor.spec import RunSpec, TinyConfig
from topologies.cluster import Cluster
from topologies.cluster_catalogue import ClusterSpec

# measured categories (executor.launch.Result.time_split_s) -> the cost model's breakdown terms
SPLIT = {
    "compute": ("compute", "recompute"),
    "tp_comm": ("tp_comm",),
    "cp_comm": ("cp_comm",),
    "pp_wait": ("pp_p2p", "pp_bubble"),
    "dp_sync": ("dp_comm_exposed",),
    "optimizer": ("optimizer", "overhead"),
    "ep_comm": ("ep_comm",),
}
PIPELINE_TERMS = ("compute", "recompute", "tp_comm", "cp_comm", "ep_comm", "pp_p2p", "pp_bubble")


@dataclass(frozen=True)
class Prediction:
    step_time_s: float
    time_split_s: dict[str, float]  # SPLIT's categories, summing to step_time_s
    stage_busy_s: list[float]  # per run stage: its compute and TP communication over the step
    memory_bytes: list[dict[str, float]]  # per run stage: weights, grads, optimizer, activations
    compute_s: float  # the part that scales with compute (``cost_models.calibrate``)
    comm_s: float  # the part that scales with the links
    overhead_s: float
    notes: list[str] = field(default_factory=list)


def moe_pattern(cfg: TinyConfig, layers: int) -> tuple[int, int] | None:
    """(moe_first_dense_layers, moe_layer_freq) of ModelSpec that mark exactly ``cfg.moe_layers``
    MoE, or None when no such pair does (the cost model knows a dense prefix then every k-th).

    >>> moe_pattern(TinyConfig(layers=4, moe_layers=(1, 3)), 4), moe_pattern(TinyConfig(layers=3, moe_layers=(0, 1)), 3)
    ((1, 2), None)
    """
    want = set(cfg.moe_layers)
    for first in range(layers):
        for freq in range(1, layers + 1):
            if want == {i for i in range(first, layers) if (i - first) % freq == 0}:
                return first, freq
    return None


def run_model(spec: RunSpec, name: str) -> ModelSpec:
    """The executor's decoder (``TinyConfig``) as a ModelSpec of its family (untied, no dropout:
    what the executor runs), with its experts (the MoE layers as near as ``moe_pattern`` can
    say: ``moe_notes``)."""
    c = spec.cfg
    first, freq = moe_pattern(c, c.layers) or (c.moe_layers[0] if c.moe_layers else 0, 1)
    moe = (
        {
            "num_experts": c.experts,
            "moe_top_k": c.top_k,
            "moe_ffn_hidden_size": c.expert_ffn,
            "moe_layer_freq": freq,
            "moe_first_dense_layers": first,
            "moe_shared_ffn_hidden_size": c.shared_ffn,
        }
        if c.moe_layers
        else {}
    )
    return ModelSpec(
        name=f"{name} (shrunk)",
        family=c.family,
        hidden_size=c.hidden,
        ffn_hidden_size=c.ffn,
        num_layers=c.layers,
        num_heads=c.heads,
        num_kv_heads=c.kv_heads,
        head_dim=c.head_dim,
        vocab_size=c.vocab,
        max_position_embeddings=c.max_positions if c.positions == "learned" else spec.seq_len,
        tie_embeddings=False,
        gated_mlp=c.mlp == "swiglu",
        norm="layernorm" if c.norm == "layer" else "rmsnorm",
        position=c.positions,
        bias=c.bias,
        dropout=0.0,
        **moe,
    )


def moe_notes(spec: RunSpec) -> set[str]:
    """What the cost model cannot see of the run's experts."""
    c = spec.cfg
    if not c.moe_layers or moe_pattern(c, c.layers):
        return set()
    return {
        f"MoE layers {', '.join(map(str, c.moe_layers))} are no dense prefix then every k-th layer; costed as "
        f"MoE from layer {c.moe_layers[0]} on"
    }


def replica_kinds(spec: RunSpec) -> list[tuple[tuple[int, ...], int]]:
    """(stage widths, micro-batches) of each distinct kind of replica, the healthy (widest) first."""
    kinds = {(tuple(st.width for st in rep.stages), rep.micro_batches) for rep in spec.replicas}
    return sorted(kinds, key=lambda k: (-min(k[0]), -k[1]))


def _layout(spec: RunSpec, widths: tuple[int, ...], micro_batches: int, dp: int, healthy: bool) -> ParallelLayout:
    first = next(r for r in spec.replicas if tuple(st.width for st in r.stages) == widths)
    tp = min(widths)
    chunks = first.model_chunks  # model order: chunk c on stage c % pp
    blocks = [b for c in chunks for b in c]
    degrees = tuple(b.degree for b in blocks) if healthy else (tp,) * len(blocks)
    counts = tuple(sum(b.kind == "layer" for b in c) for c in chunks)
    return ParallelLayout(
        tp=tp,
        pp=spec.pp,
        vpp=spec.vpp,
        dp=dp,
        cp=spec.cp,
        micro_batch=spec.micro_batch,
        global_batch=micro_batches * spec.micro_batch * dp,
        sequence_parallel=spec.sequence_parallel and tp > 1,
        recompute=spec.recompute,
        overlap_grad_reduce=False,
        overlap_p2p=False,
        tp_comm_overlap=False,
        chunk_layers=counts if spec.pp > 1 else None,
        layer_tp=degrees if len(set(degrees)) > 1 else None,
        ep=spec.ep if healthy else 1,
        zero=spec.zero,
        reshard_after_forward=spec.reshard_after_forward,
    )


def host_cluster(base: ClusterSpec, ranks: int) -> Cluster:
    """``ranks`` processes on the one host ``base`` describes (its links and GPU)."""
    spec = base.model_copy(update={"domain_size": ranks, "gpus_per_node": ranks})
    return Cluster(spec=ClusterSpec.model_validate(spec.model_dump()), num_gpus=ranks)


def _inputs(spec: RunSpec, model_name: str, profile: Profile, cluster: ClusterSpec):
    """(model, efficiency, [(training, layout, local cluster) of each replica kind]) of the run:
    the healthy kind (``replica_kinds``, widest first) with every data replica, costed with
    ``profile`` as the executor runs; the other kinds one replica each."""
    model = run_model(spec, model_name)
    eff = DEFAULT_EFFICIENCY.with_profile(profile, runtime="executor", host_ranks=spec.world_size)
    if profile.calibration.step_overhead_s is None:
        eff = eff.model_copy(update={"step_overhead_s": 0.0})  # the executor's step has no data loader or logger
    kinds = []
    for i, (widths, micro) in enumerate(replica_kinds(spec)):
        lay = _layout(spec, widths, micro, spec.data_replicas if i == 0 else 1, healthy=i == 0)
        training = TrainingSpec(
            seq_len=spec.seq_len,
            global_batch=lay.global_batch,
            grad_reduce_in_fp32=True,
            distributed_optimizer=spec.zero >= 1,
            fused_cross_entropy=False,
        )
        kinds.append((training, lay, host_cluster(cluster, lay.world_size)))
    return model, eff, kinds


def needed_blocks(
    spec: RunSpec, model_name: str, profile: Profile, cluster: ClusterSpec
) -> list[tuple[BlockShape, int]]:
    """(shape, sequences per micro-batch) of every block the run costs, once each: those of the
    healthy replicas (a degraded replica is scaled from them, ``cost_models.degraded``)."""
    model, eff, kinds = _inputs(spec, model_name, profile, cluster)
    training, lay, local = kinds[0]
    detail = estimate_step_detail(model, training, lay, local, eff)
    return list(dict.fromkeys((r.shape, r.sequences) for st in detail.stages for r in st.runs))


def predict_run(spec: RunSpec, model_name: str, profile: Profile, cluster: ClusterSpec) -> Prediction:
    """The cost model's step time, split and memory of ``spec`` on the machine ``profile``
    measured (``cluster``: the local cluster file ``ntp profile`` wrote). A degraded replica
    kind is costed by the one degraded-replica cost (``cost_models.degraded.degraded_breakdown``)
    from the healthy replicas' step, every block at the healthy width."""
    model, eff, kinds = _inputs(spec, model_name, profile, cluster)
    training, lay, local = kinds[0]
    healthy = estimate_step_detail(model, training, lay, local, eff)
    notes = set(healthy.cost.notes) | moe_notes(spec)
    breakdowns = [healthy.cost.time_breakdown_s]
    if len(kinds) > 1:
        basis = healthy.cost
        if lay.is_per_layer:  # a degraded replica scales from every block at the stage width (failures.degrade)
            whole = lay.model_copy(update={"layer_tp": None})
            basis = estimate_step_detail(model, training, whole, local, eff, checked=False).cost
        for (_, micro), (_, degraded, _) in zip(replica_kinds(spec)[1:], kinds[1:], strict=True):
            work = work_ratio(model, training, lay.tp, degraded.tp)
            breakdowns.append(
                degraded_breakdown(basis.time_breakdown_s, lay.num_micro_batches, micro, lay.tp, degraded.tp, work)
            )
    for widths, _ in replica_kinds(spec):
        if len(set(widths)) > 1:
            notes.add(f"a replica with stage widths {'/'.join(map(str, widths))} is costed at width {min(widths)}")
    if len(kinds) > 1:
        notes.add("NTP's gradient resharding between replicas of different widths is costed as a plain all-reduce")
    base = breakdowns[0]
    slowest = max(breakdowns, key=lambda b: sum(b[k] for k in PIPELINE_TERMS))
    breakdown = {k: (slowest[k] if k in PIPELINE_TERMS else base[k]) for k in base}
    split = {name: sum(breakdown.get(k, 0.0) for k in terms) for name, terms in SPLIT.items()}
    m = lay.num_micro_batches
    compute, comm = _by_scaling(breakdown)
    return Prediction(
        step_time_s=sum(split.values()),
        time_split_s=split,
        stage_busy_s=[m * st.busy_per_micro_batch_s for st in healthy.stages],
        memory_bytes=_memory(healthy, profile, spec),
        compute_s=compute,
        comm_s=comm,
        overhead_s=breakdown["overhead"],
        notes=sorted(notes),
    )


def _by_scaling(b: dict[str, float]) -> tuple[float, float]:
    """(compute, communication) seconds of a breakdown, the pipeline bubble shared between them
    in the proportion of the pipeline's own compute and communication (the bubble is idle time
    of the same micro-batch passes)."""
    compute = b["compute"] + b["recompute"]
    comm = b["tp_comm"] + b["cp_comm"] + b["ep_comm"] + b["pp_p2p"]
    share = compute / (compute + comm) if compute + comm else 1.0
    bubble = b["pp_bubble"]
    return compute + b["optimizer"] + share * bubble, comm + b["dp_comm_exposed"] + (1 - share) * bubble


def _memory(step: StepEstimate, profile: Profile, spec: RunSpec) -> list[dict[str, float]]:
    """Per stage, the cost model's memory in the executor's element sizes: per parameter (the
    vocabulary unpadded: the executor does not pad it) a weight of the profile's dtype, a
    gradient of the same (fp32 under bf16 mixed precision: Megatron's main_grad), AdamW's two
    moments (plus the fp32 master weight under mixed precision; in float32/float64 the weights
    are their own masters); under ZeRO-N the states are divided by each block's data-parallel
    group (in-stage copies x dp x cp) as ``cost_models.memory.state_bytes`` does: the optimizer
    from ZeRO-1, gradients from ZeRO-2, weights at ZeRO-3. The cost model's activation bytes are
    rescaled from 16-bit elements. The executor pads every tensor's flattened slice to a
    multiple of the group, so its fullest rank may hold up to one element more per tensor."""
    from cost_models.blocks import DTYPE_BYTES

    elem, zero = DTYPE_BYTES[profile.dtype], spec.zero
    grad, opt = (4, 12) if spec.dtype == "bfloat16" else (elem, 2 * elem)
    out = []
    for stage in step.stages:
        held = {"weights": 0.0, "grads": 0.0, "optimizer": 0.0}
        for run in stage.runs:
            params, d = run.blocks * run.params_per_gpu, run.dp_ranks
            held["weights"] += params * elem / (d if zero >= 3 else 1)
            held["grads"] += params * grad / (d if zero >= 2 else 1)
            held["optimizer"] += params * opt / (d if zero >= 1 else 1)
        out.append({**held, "activations": stage.memory_bytes["activations"] * elem / 2})
    return out
