"""`ntp estimate`: the cost of a layout you choose, and how its options become a ParallelLayout."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ntp_planner.cli.options import (
    MAX_GLOBAL_BATCH,
    MAX_GPUS,
    MAX_LAYERS,
    AttentionKernelOpt,
    BatchOpt,
    ClusterOpt,
    Dispatcher,
    DtypeOpt,
    FlashOpt,
    FlexBackend,
    Fp8ParamsOpt,
    Fp8RecipeOpt,
    FusedLossOpt,
    GpusOpt,
    GpusPerDomainOpt,
    GradReduceOpt,
    JsonOpt,
    ModelOpt,
    MoeOverlap,
    OutOpt,
    PrecisionAwareOpt,
    ProfileOpt,
    Recompute,
    RuntimeOpt,
    SeqOpt,
    attention_kernel_for,
    parse_list,
    refuse_unused_training,
)
from ntp_planner.cli.output import show, show_json
from ntp_planner.cli.plan import plan_inputs
from topologies.errors import InputError

# a degree is at most the GPU count, a micro-batch at most the batch, chunks per stage at most the layers
_DEG = dict(min=1, max=MAX_GPUS)
TpOpt = Annotated[int, typer.Option("--tp", **_DEG, help="Tensor-parallel degree.")]
PpOpt = Annotated[int, typer.Option("--pp", **_DEG, help="Pipeline stages.")]
DpOpt = Annotated[int | None, typer.Option("--dp", **_DEG, help="Data-parallel degree (default: GPUs / (tp pp cp)).")]
CpOpt = Annotated[int, typer.Option("--cp", **_DEG, help="Context-parallel degree.")]
EpOpt = Annotated[int, typer.Option("--ep", **_DEG, help="Expert-parallel degree (MoE).")]
EtpOpt = Annotated[
    int | None, typer.Option("--etp", **_DEG, help="Expert tensor parallelism (MoE; default tp; 1 folds EP over TP).")
]
DispatcherOpt = Annotated[
    Dispatcher, typer.Option("--moe-dispatcher", help="MoE token dispatcher (flex: DeepEP / HybridEP).")
]
MoeOverlapOpt = Annotated[MoeOverlap, typer.Option("--moe-overlap", help="Overlap of MoE dispatch with compute.")]
FlexBackendOpt = Annotated[
    FlexBackend | None,
    typer.Option(
        "--moe-flex-backend",
        help="The flex dispatcher's backend (Megatron's --moe-flex-dispatcher-backend); default: HybridEP where one "
        "NVLink domain spans several hosts, else DeepEP.",
    ),
]
MicroBatchOpt = Annotated[
    int, typer.Option("--micro-batch", min=1, max=MAX_GLOBAL_BATCH, help="Sequences per micro-batch.")
]
VppOpt = Annotated[
    int, typer.Option("--vpp", min=1, max=MAX_LAYERS, help="Virtual pipeline stages per rank (interleaving).")
]
PpLayersOpt = Annotated[str | None, typer.Option("--pp-layers", help="Layers per stage, e.g. 13,13,12,12.")]
PpLayoutOpt = Annotated[
    str | None, typer.Option("--pp-layout", help="Megatron layout string, e.g. 'Et*3|(tt|)*29,t|L' (E, t, L, |, *n).")
]
EmbeddingOpt = Annotated[
    bool, typer.Option("--account-for-embedding", help="The embedding counts as a pipeline layer.")
]
LossOpt = Annotated[bool, typer.Option("--account-for-loss", help="The loss (LM head) counts as a pipeline layer.")]
RecomputeOpt = Annotated[Recompute, typer.Option("--recompute", help="Activation recomputation.")]
RecomputeModulesOpt = Annotated[
    str | None,
    typer.Option(
        "--recompute-modules",
        help="Megatron's selective recompute modules, comma-separated: mla_up_proj, mlp, moe_act, layernorm.",
    ),
]
CapacityOpt = Annotated[
    float | None,
    typer.Option("--moe-capacity-factor", min=0, max=64, help="MoE token dropping at this capacity factor."),
]
PadOpt = Annotated[bool, typer.Option("--moe-pad-to-capacity", help="Pad every expert to its capacity.")]
GraphsOpt = Annotated[bool, typer.Option("--cuda-graphs", help="Full-iteration CUDA graphs (no MoE host syncs).")]
SpOpt = Annotated[
    bool | None,
    typer.Option(
        "--sequence-parallel/--no-sequence-parallel", help="Shard norms/dropout over TP (default: when tp > 1)."
    ),
]
MaybeDistOptOpt = Annotated[
    bool | None,
    typer.Option("--distributed-optimizer/--no-distributed-optimizer", help="Shard optimizer state (default: on)."),
]
ZeroOpt = Annotated[
    int | None,
    typer.Option(
        "--zero", min=0, max=3, help="Shard over dp x cp: 1 optimizer (default when dp x cp > 1), 2 +grads, 3 +weights."
    ),
]
ReshardOpt = Annotated[
    bool, typer.Option("--reshard-after-forward/--keep-params-after-forward", help="ZeRO-3: gather weights again.")
]
OverlapGradOpt = Annotated[
    bool, typer.Option("--overlap-grad-reduce/--no-overlap-grad-reduce", help="Overlap DP sync with backward.")
]
OverlapP2pOpt = Annotated[
    bool, typer.Option("--overlap-p2p/--no-overlap-p2p", help="Overlap pipeline sends with compute.")
]
ScatterGatherOpt = Annotated[
    bool, typer.Option("--p2p-scatter-gather", help="Split pipeline sends over TP without SP (Megatron-LM 2021).")
]
TpOverlapOpt = Annotated[bool, typer.Option("--tp-comm-overlap", help="Overlap TP collectives with GEMMs.")]


def _modules(text: str | None) -> tuple[str, ...]:
    from typing import get_args

    from cost_models.layout import RecomputeModule
    from ntp_planner.cli.options import parse_list

    if text is None:
        return ()
    return tuple(parse_list(text, "--recompute-modules", str, "mla_up_proj,moe_act", get_args(RecomputeModule)))


def estimate(
    model: ModelOpt,
    cluster: ClusterOpt,
    gpus: GpusOpt,
    gpus_per_domain: GpusPerDomainOpt = None,
    tp: TpOpt = 1,
    pp: PpOpt = 1,
    dp: DpOpt = None,
    cp: CpOpt = 1,
    ep: EpOpt = 1,
    etp: EtpOpt = None,
    moe_dispatcher: DispatcherOpt = "alltoall",
    moe_overlap: MoeOverlapOpt = "none",
    moe_flex_backend: FlexBackendOpt = None,
    micro_batch: MicroBatchOpt = 1,
    vpp: VppOpt = 1,
    pp_layers: PpLayersOpt = None,
    pp_layout: PpLayoutOpt = None,
    account_for_embedding: EmbeddingOpt = False,
    account_for_loss: LossOpt = False,
    recompute: RecomputeOpt = "none",
    recompute_modules: RecomputeModulesOpt = None,
    sequence_parallel: SpOpt = None,
    distributed_optimizer: MaybeDistOptOpt = None,
    zero: ZeroOpt = None,
    reshard_after_forward: ReshardOpt = True,
    overlap_grad_reduce: OverlapGradOpt = True,
    overlap_p2p: OverlapP2pOpt = True,
    p2p_scatter_gather: ScatterGatherOpt = False,
    tp_comm_overlap: TpOverlapOpt = False,
    seq_len: SeqOpt = 8192,
    global_batch: BatchOpt = 1024,
    dtype: DtypeOpt = "bf16",
    fp8_recipe: Fp8RecipeOpt = "delayed",
    fp8_params: Fp8ParamsOpt = False,
    grad_reduce: GradReduceOpt = None,
    precision_aware_optimizer: PrecisionAwareOpt = False,
    fused_cross_entropy: FusedLossOpt = True,
    flash_attention: FlashOpt = True,
    attention_kernel: AttentionKernelOpt = None,
    moe_capacity_factor: CapacityOpt = None,
    moe_pad_to_capacity: PadOpt = False,
    cuda_graphs: GraphsOpt = False,
    profile: ProfileOpt = None,
    runtime: RuntimeOpt = "megatron",
    output: OutOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Predict step time, memory and MFU of a layout you choose.

    \b
    Example: ntp estimate -m gpt3-175b -c dgx-a100 -n 1024 --tp 8 --pp 8 \\
               --seq-len 2048 --global-batch 1536
    """
    from cost_models import estimate_step
    from ntp_planner.cli.options import profile_efficiency
    from ntp_planner.outputs import check_output

    refuse_unused_training(dtype, fp8_recipe, moe_dispatcher, moe_flex_backend)
    if output:
        check_output(output, "--output", [model, cluster, profile])
    inputs = plan_inputs(
        model,
        cluster,
        gpus,
        gpus_per_domain,
        seq_len,
        global_batch,
        dtype,
        flash_attention,
        distributed_optimizer is not False,
        fp8_recipe=fp8_recipe,
        fp8_params=fp8_params,
        grad_reduce=grad_reduce,
        precision_aware_optimizer=precision_aware_optimizer,
        fused_cross_entropy=fused_cross_entropy,
        attention_kernel=attention_kernel_for(attention_kernel, runtime),
        moe_capacity_factor=moe_capacity_factor,
        moe_pad_to_capacity=moe_pad_to_capacity,
        moe_flex_backend=moe_flex_backend,
        cuda_graphs=cuda_graphs,
    )
    degrees = dict(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, vpp=vpp, micro_batch=micro_batch, global_batch=global_batch)
    pipeline = dict(pp_layers=pp_layers, pp_layout=pp_layout, embedding=account_for_embedding, loss=account_for_loss)
    layout = _layout(
        inputs[0].num_layers,
        gpus,
        degrees,
        pipeline,
        distributed_optimizer,
        zero,
        recompute=recompute,
        sequence_parallel=sequence_parallel if sequence_parallel is not None else tp > 1,
        reshard_after_forward=reshard_after_forward,
        overlap_grad_reduce=overlap_grad_reduce,
        overlap_p2p=overlap_p2p,
        p2p_scatter_gather=p2p_scatter_gather,
        tp_comm_overlap=tp_comm_overlap,
        etp=etp,
        moe_dispatcher=moe_dispatcher,
        moe_overlap=moe_overlap,
        recompute_modules=_modules(recompute_modules),
    )
    model_spec, training, cluster_obj = inputs
    efficiency = profile_efficiency(profile, cluster_obj.gpu.name, runtime)
    cost = estimate_step(model_spec, training, layout, cluster_obj, efficiency)
    if output:
        _save_estimate(inputs, layout, cost, output, efficiency)
    if json_out:  # the step cost, and the model's parameter counts beside it
        from ntp_planner.views.model import params_json

        show_json(params_json(model_spec) | cost.model_dump(mode="json"))
    else:
        _show_estimate(inputs, layout, cost)


def _layout(num_layers: int, gpus: int, degrees: dict, pipeline: dict, distributed_optimizer, zero, **flags):
    """The ParallelLayout `ntp estimate` describes: dp from the GPU count when not given, the
    pipeline split from the one pipeline option given, ZeRO from the optimizer options."""
    from cost_models import ParallelLayout

    tp, pp, cp, vpp, dp = degrees["tp"], degrees["pp"], degrees["cp"], degrees["vpp"], degrees["dp"]
    positive = min(tp, pp, cp, vpp) >= 1  # otherwise ParallelLayout below names the bad degree
    if dp is None:
        if positive and gpus % (tp * pp * cp):
            raise InputError(f"GPUs({gpus}) is not divisible by tp({tp}) * pp({pp}) * cp({cp}) = {tp * pp * cp}")
        dp = gpus // (tp * pp * cp) if positive else 1
    chunks = _pipeline_chunks(num_layers, pp, vpp, **pipeline) if positive else None
    if pipeline["pp_layout"] is not None and chunks is not None:
        if vpp != 1 and vpp != len(chunks) // pp:
            raise InputError(
                f"--vpp {vpp} disagrees with --pp-layout, which has {len(chunks)} chunks = pp({pp}) x "
                f"{len(chunks) // pp}; drop --vpp (the layout sets it)"
            )
        vpp = len(chunks) // pp
    if distributed_optimizer is False and zero is not None and zero >= 1:
        raise InputError(
            f"--no-distributed-optimizer asks for ZeRO-0 but --zero {zero} shards the optimizer; pass one of them"
        )
    if zero is None:
        zero = int(distributed_optimizer is not False and dp * cp > 1)
    return ParallelLayout(**{**degrees, "dp": dp, "vpp": vpp}, chunk_layers=chunks, zero=zero, **flags)


def _pipeline_chunks(
    num_layers: int, pp: int, vpp: int, pp_layers: str | None, pp_layout: str | None, embedding: bool, loss: bool
) -> tuple[int, ...] | None:
    """Layers per model chunk from the one pipeline option given: a Megatron layout string,
    layers per stage, or the embedding / loss counted as layers; None for an even split."""
    from cost_models.pipeline_layout import chunks_from_stages, megatron_split, parse_layout

    given = [name for name, v in (("--pp-layout", pp_layout), ("--pp-layers", pp_layers)) if v is not None]
    given += [name for name, on in (("--account-for-embedding", embedding), ("--account-for-loss", loss)) if on]
    if pp_layout is not None and len(given) > 1:
        raise InputError(f"--pp-layout fixes the whole split; drop {', '.join(given[1:])}")
    if pp_layers is not None and (embedding or loss):
        raise InputError("--pp-layers gives every stage's layers; drop --account-for-embedding/--account-for-loss")
    if pp_layout is not None:
        return parse_layout(pp_layout, pp)
    if pp_layers is not None:
        stages = parse_list(pp_layers, "--pp-layers", int, "13,13,12,12")
        if len(stages) != pp:
            raise InputError(f"--pp-layers has {len(stages)} entries but --pp is {pp}")
        return chunks_from_stages(tuple(stages), vpp)
    if embedding or loss:
        return megatron_split(num_layers, pp, vpp, embedding, loss)
    return None


def _save_estimate(inputs, layout, cost, output: Path, efficiency) -> None:
    """Save the layout as a Plan; one line on stderr when it does not fit in memory."""
    from ntp_planner.solver.planner import plan_from_layout

    plan_from_layout(*inputs, layout, efficiency=efficiency).save(output)
    if not cost.fits():
        typer.echo(f"warning: {output} holds a layout that does not fit: {_shortfall(cost)}", err=True)


def _shortfall(cost) -> str:
    return f"needs {cost.memory_per_gpu_bytes / 2**30:.1f} GiB of {cost.hbm_bytes / 2**30:.1f} GiB per GPU"


def _show_estimate(inputs, layout, cost) -> None:
    from ntp_planner.views.plan import cost_tables, domain_use

    model_spec, _, cluster_obj = inputs
    from ntp_planner.views.model import model_lines

    show(f"[bold]{model_spec.name}[/bold]: {layout.describe()}")
    for line in model_lines(model_spec, layout):
        show(line)
    for line in domain_use(cluster_obj):
        show(line)
    show(cost_tables(cost))
    if not cost.fits():
        show(f"[red]does not fit: {_shortfall(cost)}[/red]")
