"""Commands that choose a layout: models, clusters, plan, explain; and the inputs every plan needs."""

from __future__ import annotations

from typing import Annotated

import typer

from ntp_planner.cli.options import (
    AttentionKernelOpt,
    BatchOpt,
    ClusterOpt,
    DtypeOpt,
    FlashOpt,
    Fp8ParamsOpt,
    Fp8RecipeOpt,
    FusedLossOpt,
    GpusOpt,
    GpusPerDomainOpt,
    GradReduceOpt,
    HeadroomOpt,
    JsonOpt,
    ModelOpt,
    Objective,
    OutOpt,
    PlanArg,
    PrecisionAwareOpt,
    ProfileOpt,
    RuntimeOpt,
    SeedOpt,
    SeqOpt,
    Strategy,
    attention_kernel_for,
    refuse_unused_training,
)
from ntp_planner.cli.output import show, show_json
from topologies.errors import InputError

DistOptOpt = Annotated[
    bool, typer.Option("--distributed-optimizer/--no-distributed-optimizer", help="Shard optimizer state over DP.")
]
MaxZeroOpt = Annotated[
    int,
    typer.Option("--max-zero", min=0, max=3, help="Most sharding to try: 1 distributed optimizer, 2 +grads, 3 FSDP."),
]
TopOpt = Annotated[
    int, typer.Option("--top", min=1, max=100, help="Layouts to keep: the best and top-1 runners-up (a table's worth).")
]
PerLayerOpt = Annotated[
    bool, typer.Option("--per-layer/--uniform", help="Let each layer pick its TP degree (chosen only when it wins).")
]
ObjectiveOpt = Annotated[
    Objective, typer.Option("--objective", help="Rank by step time or by throughput under failures.")
]
StrategyOpt = Annotated[
    Strategy | None, typer.Option("--strategy", help="Failure strategy for --objective goodput (default: ntp).")
]


def models(json_out: JsonOpt = False) -> None:
    """List the built-in models. Example: ntp models --json"""
    from cost_models import MODELS

    if json_out:
        from ntp_planner.views.model import params_json

        show_json([m.model_dump(mode="json") | {"num_params": m.num_params} | params_json(m) for m in MODELS.values()])
    else:
        from ntp_planner.views.catalogue import models_table

        show(models_table(list(MODELS.values())))


def clusters(json_out: JsonOpt = False) -> None:
    """List the built-in clusters. Example: ntp clusters"""
    from topologies import CLUSTERS

    if json_out:
        show_json([c.model_dump(mode="json") for c in CLUSTERS.values()])
    else:
        from ntp_planner.views.catalogue import clusters_table

        show(clusters_table(list(CLUSTERS.values())))


def plan(
    model: ModelOpt,
    cluster: ClusterOpt,
    gpus: GpusOpt,
    gpus_per_domain: GpusPerDomainOpt = None,
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
    distributed_optimizer: DistOptOpt = True,
    headroom: HeadroomOpt = 0.1,
    max_zero: MaxZeroOpt = 3,
    top: TopOpt = 5,
    per_layer: PerLayerOpt = True,
    objective: ObjectiveOpt = "step-time",
    strategy: StrategyOpt = None,
    seed: SeedOpt = 0,
    profile: ProfileOpt = None,
    runtime: RuntimeOpt = "megatron",
    output: OutOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Search the layouts (with --per-layer, the default, per-layer TP degrees too) and show the
    fastest that fits. For an MoE model the experts' grid too: expert TP = tp or 1 (EP folded over
    the TP ranks), every EP degree, the dispatcher its EP group calls for.

    \b
    Example: ntp plan --model llama3-70b --cluster dgx-h100 --gpus 1024 \\
               --seq-len 8192 -o plan.json
    """
    from ntp_planner.cli.options import profile_efficiency
    from ntp_planner.outputs import check_output
    from ntp_planner.solver.planner import make_plan
    from ntp_planner.solver.search import SearchSpace

    if strategy is not None and objective != "goodput":
        raise InputError(
            f"--strategy {strategy} only applies to --objective goodput (the search ranks by {objective}); "
            "add --objective goodput or drop --strategy"
        )
    refuse_unused_training(dtype, fp8_recipe)
    if output:
        check_output(output, "--output", [model, cluster, profile])  # before the search, not after

    inputs = plan_inputs(
        model,
        cluster,
        gpus,
        gpus_per_domain,
        seq_len,
        global_batch,
        dtype,
        flash_attention,
        distributed_optimizer,
        fp8_recipe=fp8_recipe,
        fp8_params=fp8_params,
        grad_reduce=grad_reduce,
        precision_aware_optimizer=precision_aware_optimizer,
        fused_cross_entropy=fused_cross_entropy,
        attention_kernel=attention_kernel_for(attention_kernel, runtime),
    )
    space = SearchSpace(zeros=tuple(range(1, max_zero + 1)) or (0,))
    efficiency = profile_efficiency(profile, inputs[2].gpu.name, runtime)
    result = make_plan(
        *inputs,
        headroom=headroom,
        top=top,
        space=space,
        per_layer=per_layer,
        objective=objective,
        strategy=strategy or "ntp",
        seed=seed,
        efficiency=efficiency,
    )
    if output:
        result.save(output)
    if json_out:  # the plan, and the model's parameter counts beside it (-o writes the plan file)
        from ntp_planner.views.model import params_json

        show_json(params_json(result.model) | result.model_dump(mode="json"))
        return
    from ntp_planner.views.plan import plan_view

    show(plan_view(result))
    if output:
        show(f"plan written to {output}")


def explain(plan_file: PlanArg, profile: ProfileOpt = None, json_out: JsonOpt = False) -> None:
    """Where the time and memory go, and why the runners-up lost. With --profile the plan's layout
    is costed again from the measurements. Example: ntp explain plan.json --profile profile.json"""
    from ntp_planner.cli.options import profile_efficiency
    from ntp_planner.plan import Plan
    from ntp_planner.views.plan import explain_json, explain_view

    p = Plan.load(plan_file)
    efficiency = profile_efficiency(profile, p.cluster.build().gpu.name, p.runtime)
    if profile is not None:  # the plan, its runners-up and its Megatron projection costed again from the profile
        from cost_models import estimate_step
        from ntp_planner.solver.planner import runner_up

        cluster = p.cluster.build()
        cost = lambda lay: estimate_step(p.model, p.training, lay, cluster, efficiency)  # noqa: E731
        update = {
            "predicted": cost(p.layout),
            "runners_up": [runner_up(r.layout, cost(r.layout)) for r in p.runners_up],
        }
        if p.megatron is not None:
            update["megatron"] = runner_up(p.megatron.layout, cost(p.megatron.layout))
        p = p.model_copy(update=update)
    if json_out:
        show_json(explain_json(p))
    else:
        show(explain_view(p, efficiency))


def plan_inputs(
    model: str,
    cluster: str,
    gpus: int,
    gpus_per_domain: int | None,
    seq_len: int,
    global_batch: int,
    dtype: str,
    flash: bool,
    distributed_optimizer: bool,
    grad_reduce: str | None = None,
    **precision,
):
    """The three inputs of a plan. ``precision`` holds the remaining TrainingSpec fields
    (fp8_recipe, fp8_params, precision_aware_optimizer, fused_cross_entropy, attention_kernel)."""
    from cost_models import TrainingSpec, resolve_model
    from topologies import Cluster, resolve_cluster_spec

    model_spec = resolve_model(model)
    cluster_obj = Cluster(spec=resolve_cluster_spec(cluster), num_gpus=gpus, gpus_per_domain=gpus_per_domain)
    training = TrainingSpec(
        seq_len=seq_len,
        global_batch=global_batch,
        dtype=dtype,
        flash_attention=flash,
        distributed_optimizer=distributed_optimizer,
        grad_reduce_in_fp32=None if grad_reduce is None else grad_reduce == "fp32",
        **precision,
    )
    cluster_obj.gpu.peak_flops_per_s(training.dtype)  # fp8 on a GPU without it fails here, clearly
    return model_spec, training, cluster_obj
