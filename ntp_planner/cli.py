"""The `ntp` command: a thin layer over the library. Only this module prints.

Heavy imports (pydantic models, numpy, rich tables) happen inside commands so `ntp --help`
stays fast; torch is never imported by these commands.
"""

from __future__ import annotations

import functools
import json
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    help="Plan how to parallelise LLM training over thousands of GPUs, and what failures cost.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


class Dtype(str, Enum):
    fp16 = "fp16"
    bf16 = "bf16"
    fp8 = "fp8"
    mxfp8 = "mxfp8"
    nvfp4 = "nvfp4"


class Fp8Recipe(str, Enum):
    delayed = "delayed"
    current = "current"


class AttentionKernel(str, Enum):
    cudnn = "cudnn"
    flash2 = "flash2"


class GradReduce(str, Enum):
    fp32 = "fp32"
    bf16 = "bf16"


class RecomputeOpt(str, Enum):
    none = "none"
    selective = "selective"
    full = "full"


ModelOpt = Annotated[
    str, typer.Option("--model", "-m", help="Catalogue name (see `ntp models`) or a config.json / YAML path.")
]
ClusterOpt = Annotated[
    str, typer.Option("--cluster", "-c", help="Catalogue name (see `ntp clusters`) or a cluster YAML/JSON path.")
]
GpusOpt = Annotated[int, typer.Option("--gpus", "-n", help="Number of GPUs, a multiple of the host size.")]
GpusPerDomainOpt = Annotated[
    int | None,
    typer.Option(
        "--gpus-per-domain",
        min=1,
        help="GPUs used per NVLink domain (default: all); the rest are in-domain spares.",
    ),
]
SeqOpt = Annotated[int, typer.Option("--seq-len", help="Tokens per sequence.")]
BatchOpt = Annotated[int, typer.Option("--global-batch", help="Sequences per optimizer step.")]
DtypeOpt = Annotated[
    Dtype, typer.Option("--dtype", help="GEMM format: fp16, bf16, fp8 (Hopper+), mxfp8 or nvfp4 (Blackwell).")
]
Fp8RecipeOpt = Annotated[
    Fp8Recipe, typer.Option("--fp8-recipe", help="fp8 scaling: delayed (amax history) or current (tensorwise).")
]
Fp8ParamsOpt = Annotated[
    bool, typer.Option("--fp8-params", help="Keep weights in the fp8/fp4 format (Megatron --fp8-param-gather).")
]
GradReduceOpt = Annotated[
    GradReduce | None,
    typer.Option("--grad-reduce", help="Gradient buffer and reduction: fp32 or bf16 (default: fp32 for bf16 only)."),
]
PrecisionAwareOpt = Annotated[
    bool,
    typer.Option(
        "--precision-aware-optimizer", help="Adam keeps 16-bit master-weight remainders (10 bytes of state/param)."
    ),
]
AttentionKernelOpt = Annotated[
    AttentionKernel,
    typer.Option("--attention-kernel", help="Fused attention: cudnn (TE's default) or flash2 (FlashAttention-2)."),
]
FusedLossOpt = Annotated[
    bool, typer.Option("--fused-cross-entropy/--unfused-cross-entropy", help="Fused loss kernel (TE) or Megatron's.")
]
FlashOpt = Annotated[bool, typer.Option("--flash-attention/--no-flash-attention", help="Fused attention kernels.")]
DistOptOpt = Annotated[
    bool, typer.Option("--distributed-optimizer/--no-distributed-optimizer", help="Shard optimizer state over DP.")
]
HeadroomOpt = Annotated[float, typer.Option("--headroom", help="Fraction of HBM kept free (fragmentation, spikes).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts instead of tables.")]
OutOpt = Annotated[Path | None, typer.Option("--output", "-o", help="Save the Plan as JSON here (written atomically).")]


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message.rstrip('.')}.", err=True)
    return typer.Exit(2)


def user_errors(fn):
    """Turn ValueError (bad input) into one sentence on stderr and exit code 2. A pydantic
    error about a field the command takes as an option names the option and the value given
    (``--seq-len -5: Input should be greater than 0``), not the internal field."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ValueError as exc:
            from pydantic import ValidationError

            if isinstance(exc, ValidationError):
                from topologies.cluster_catalogue import first_error

                err = exc.errors()[0]
                option = _option_for(fn, err["loc"])
                if option is not None:
                    msg = err["msg"].removeprefix("Value error, ")
                    raise _fail(f"{option} {err.get('input')!s}: {msg}") from None
                raise _fail(first_error(exc)) from None
            raise _fail(str(exc)) from None

    return wrapper


def _option_for(fn, loc: tuple) -> str | None:
    """The command's option for a one-part pydantic error location (field ``seq_len`` ->
    ``--seq-len``), or None when the command has no such option."""
    if len(loc) != 1 or not isinstance(loc[0], str):
        return None
    option = "--" + loc[0].replace("_", "-")
    import typing

    for hint in typing.get_type_hints(fn, include_extras=True).values():
        for meta in getattr(hint, "__metadata__", ()):
            decls = (getattr(meta, "default", None), *(getattr(meta, "param_decls", None) or ()))
            if option in decls:  # with Annotated, typer keeps the first name as ``default``
                return option
    return None


def _print(renderable) -> None:
    from rich.console import Console

    # A terminal sets its own width; pipes and files get 120 columns instead of rich's 80.
    Console(width=None if sys.stdout.isatty() else 120).print(renderable)


def _print_json(data) -> None:
    sys.stdout.write(json.dumps(data, indent=1) + "\n")


def _inputs(
    model: str,
    cluster: str,
    gpus: int,
    gpus_per_domain: int | None,
    seq_len: int,
    global_batch: int,
    dtype: Dtype,
    flash: bool,
    distributed_optimizer: bool,
    **precision,
):
    """The three inputs of a plan. ``precision`` holds the remaining TrainingSpec fields
    (fp8_recipe, fp8_params, grad_reduce, precision_aware_optimizer, fused_cross_entropy)."""
    from cost_models import TrainingSpec, resolve_model
    from topologies import Cluster, resolve_cluster_spec

    model_spec = resolve_model(model)
    cluster_obj = Cluster(spec=resolve_cluster_spec(cluster), num_gpus=gpus, gpus_per_domain=gpus_per_domain)
    grad = precision.pop("grad_reduce", None)
    recipe = precision.pop("fp8_recipe", Fp8Recipe.delayed)
    kernel = precision.pop("attention_kernel", AttentionKernel.cudnn)
    training = TrainingSpec(
        seq_len=seq_len,
        global_batch=global_batch,
        dtype=dtype.value,
        flash_attention=flash,
        distributed_optimizer=distributed_optimizer,
        fp8_recipe=recipe.value,
        grad_reduce_in_fp32=None if grad is None else grad == GradReduce.fp32,
        attention_kernel=kernel.value,
        **precision,
    )
    cluster_obj.gpu.peak_flops_per_s(training.dtype)  # fp8 on a GPU without it fails here, clearly
    return model_spec, training, cluster_obj


@app.command()
@user_errors
def models(json_out: JsonOpt = False) -> None:
    """List the built-in models. Example: ntp models --json"""
    from cost_models import MODELS

    if json_out:
        _print_json([m.model_dump(mode="json") | {"num_params": m.num_params} for m in MODELS.values()])
    else:
        from ntp_planner.report import models_table

        _print(models_table(list(MODELS.values())))


@app.command()
@user_errors
def clusters(json_out: JsonOpt = False) -> None:
    """List the built-in clusters. Example: ntp clusters"""
    from topologies import CLUSTERS

    if json_out:
        _print_json([c.model_dump(mode="json") for c in CLUSTERS.values()])
    else:
        from ntp_planner.report import clusters_table

        _print(clusters_table(list(CLUSTERS.values())))


@app.command()
@user_errors
def plan(
    model: ModelOpt,
    cluster: ClusterOpt,
    gpus: GpusOpt,
    gpus_per_domain: GpusPerDomainOpt = None,
    seq_len: SeqOpt = 8192,
    global_batch: BatchOpt = 1024,
    dtype: DtypeOpt = Dtype.bf16,
    fp8_recipe: Fp8RecipeOpt = Fp8Recipe.delayed,
    fp8_params: Fp8ParamsOpt = False,
    grad_reduce: GradReduceOpt = None,
    precision_aware_optimizer: PrecisionAwareOpt = False,
    fused_cross_entropy: FusedLossOpt = True,
    flash_attention: FlashOpt = True,
    attention_kernel: AttentionKernelOpt = AttentionKernel.cudnn,
    distributed_optimizer: DistOptOpt = True,
    headroom: HeadroomOpt = 0.1,
    max_zero: Annotated[
        int,
        typer.Option(
            "--max-zero", min=0, max=3, help="Most sharding to try: 1 distributed optimizer, 2 +grads, 3 FSDP."
        ),
    ] = 3,
    top: Annotated[int, typer.Option("--top", help="Layouts to keep: the best and top-1 runners-up.")] = 5,
    per_layer: Annotated[
        bool,
        typer.Option("--per-layer/--uniform", help="Let each layer pick its TP degree (chosen only when it wins)."),
    ] = True,
    objective: Annotated[
        str, typer.Option("--objective", help="step-time, or goodput (throughput under failures).")
    ] = "step-time",
    strategy: Annotated[str, typer.Option("--strategy", help="Failure strategy for --objective goodput.")] = "ntp",
    output: OutOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Search every layout, per-layer TP degrees included, and show the fastest that fits.

    Example: ntp plan --model llama3-70b --cluster dgx-h100 --gpus 1024 --seq-len 8192 -o plan.json
    """
    from ntp_planner.solver.planner import make_plan

    inputs = _inputs(
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
        attention_kernel=attention_kernel,
    )
    from ntp_planner.solver.search import SearchSpace

    space = SearchSpace(zeros=tuple(range(1, max_zero + 1)) or (0,))
    result = make_plan(
        *inputs, headroom=headroom, top=top, space=space, per_layer=per_layer, objective=objective, strategy=strategy
    )
    if output:
        result.save(output)
    if json_out:
        sys.stdout.write(result.model_dump_json(indent=1) + "\n")
    else:
        from ntp_planner.report import plan_view

        _print(plan_view(result))
        if output:
            _print(f"plan written to {output}")


@app.command()
@user_errors
def estimate(
    model: ModelOpt,
    cluster: ClusterOpt,
    gpus: GpusOpt,
    gpus_per_domain: GpusPerDomainOpt = None,
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel degree.")] = 1,
    pp: Annotated[int, typer.Option("--pp", help="Pipeline stages.")] = 1,
    dp: Annotated[int | None, typer.Option("--dp", help="Data-parallel degree; default GPUs / (tp pp cp).")] = None,
    cp: Annotated[int, typer.Option("--cp", help="Context-parallel degree.")] = 1,
    ep: Annotated[int, typer.Option("--ep", help="Expert-parallel degree (MoE).")] = 1,
    micro_batch: Annotated[int, typer.Option("--micro-batch", help="Sequences per micro-batch.")] = 1,
    vpp: Annotated[int, typer.Option("--vpp", help="Virtual pipeline stages per rank (interleaving).")] = 1,
    pp_layers: Annotated[str | None, typer.Option("--pp-layers", help="Layers per stage, e.g. 13,13,12,12.")] = None,
    pp_layout: Annotated[
        str | None,
        typer.Option("--pp-layout", help="Megatron layout string, e.g. 'Et*3|(tt|)*29,t|L' (E, t, L, |, *n)."),
    ] = None,
    account_for_embedding: Annotated[
        bool, typer.Option("--account-for-embedding", help="The embedding counts as a pipeline layer.")
    ] = False,
    account_for_loss: Annotated[
        bool, typer.Option("--account-for-loss", help="The loss (LM head) counts as a pipeline layer.")
    ] = False,
    recompute: Annotated[
        RecomputeOpt, typer.Option("--recompute", help="Activation recomputation.")
    ] = RecomputeOpt.none,
    sequence_parallel: Annotated[
        bool | None,
        typer.Option(
            "--sequence-parallel/--no-sequence-parallel", help="Shard norms/dropout over TP (default: when tp > 1)."
        ),
    ] = None,
    distributed_optimizer: Annotated[
        bool | None,
        typer.Option("--distributed-optimizer/--no-distributed-optimizer", help="Shard optimizer state (default: on)."),
    ] = None,
    zero: Annotated[
        int | None,
        typer.Option("--zero", min=0, max=3, help="Shard over dp x cp: 1 optimizer (default), 2 +grads, 3 +weights."),
    ] = None,
    reshard_after_forward: Annotated[
        bool,
        typer.Option("--reshard-after-forward/--keep-params-after-forward", help="ZeRO-3: gather weights again."),
    ] = True,
    overlap_grad_reduce: Annotated[
        bool, typer.Option("--overlap-grad-reduce/--no-overlap-grad-reduce", help="Overlap DP sync with backward.")
    ] = True,
    overlap_p2p: Annotated[
        bool, typer.Option("--overlap-p2p/--no-overlap-p2p", help="Overlap pipeline sends with compute.")
    ] = True,
    p2p_scatter_gather: Annotated[
        bool,
        typer.Option("--p2p-scatter-gather", help="Split pipeline sends over TP without SP (Megatron-LM 2021)."),
    ] = False,
    tp_comm_overlap: Annotated[
        bool, typer.Option("--tp-comm-overlap", help="Overlap TP collectives with GEMMs.")
    ] = False,
    seq_len: SeqOpt = 8192,
    global_batch: BatchOpt = 1024,
    dtype: DtypeOpt = Dtype.bf16,
    fp8_recipe: Fp8RecipeOpt = Fp8Recipe.delayed,
    fp8_params: Fp8ParamsOpt = False,
    grad_reduce: GradReduceOpt = None,
    precision_aware_optimizer: PrecisionAwareOpt = False,
    fused_cross_entropy: FusedLossOpt = True,
    flash_attention: FlashOpt = True,
    attention_kernel: AttentionKernelOpt = AttentionKernel.cudnn,
    output: OutOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Predict step time, memory and MFU of a layout you choose.

    Example: ntp estimate -m gpt3-175b -c dgx-a100 -n 1024 --tp 8 --pp 8 --seq-len 2048 --global-batch 1536
    """
    from cost_models import ParallelLayout, estimate_step

    inputs = _inputs(
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
        attention_kernel=attention_kernel,
    )
    positive = min(tp, pp, cp, vpp) >= 1  # otherwise ParallelLayout below names the bad degree
    if dp is None:
        if positive and gpus % (tp * pp * cp):
            raise ValueError(f"GPUs({gpus}) is not divisible by tp({tp}) * pp({pp}) * cp({cp}) = {tp * pp * cp}")
        dp = gpus // (tp * pp * cp) if positive else 1
    chunks = (
        _pipeline_chunks(inputs[0].num_layers, pp, vpp, pp_layers, pp_layout, account_for_embedding, account_for_loss)
        if positive
        else None
    )
    if pp_layout is not None and chunks is not None:
        if vpp != 1 and vpp != len(chunks) // pp:
            raise ValueError(
                f"--vpp {vpp} disagrees with --pp-layout, which has {len(chunks)} chunks = pp({pp}) x "
                f"{len(chunks) // pp}; drop --vpp (the layout sets it)"
            )
        vpp = len(chunks) // pp
    if distributed_optimizer is False and zero is not None and zero >= 1:
        raise ValueError(
            f"--no-distributed-optimizer asks for ZeRO-0 but --zero {zero} shards the optimizer; pass one of them"
        )
    layout = ParallelLayout(
        tp=tp,
        pp=pp,
        dp=dp,
        cp=cp,
        ep=ep,
        micro_batch=micro_batch,
        global_batch=global_batch,
        vpp=vpp,
        chunk_layers=chunks,
        recompute=recompute.value,
        sequence_parallel=sequence_parallel if sequence_parallel is not None else tp > 1,
        zero=zero if zero is not None else int(distributed_optimizer is not False and dp * cp > 1),
        reshard_after_forward=reshard_after_forward,
        overlap_grad_reduce=overlap_grad_reduce,
        overlap_p2p=overlap_p2p,
        p2p_scatter_gather=p2p_scatter_gather,
        tp_comm_overlap=tp_comm_overlap,
    )
    model_spec, training, cluster_obj = inputs
    cost = estimate_step(model_spec, training, layout, cluster_obj)
    if output:
        from ntp_planner.solver.planner import plan_from_layout

        plan_from_layout(*inputs, layout).save(output)
    if json_out:
        sys.stdout.write(cost.model_dump_json(indent=1) + "\n")
    else:
        from ntp_planner.report import cost_tables, domain_use

        _print(f"[bold]{model_spec.name}[/bold]: {layout.describe()}")
        for line in domain_use(cluster_obj):
            _print(line)
        _print(cost_tables(cost))
        if not cost.fits():
            need, have = cost.memory_per_gpu_bytes / 2**30, cost.hbm_bytes / 2**30
            _print(f"[red]does not fit: needs {need:.1f} GiB of {have:.1f} GiB per GPU[/red]")


def _pipeline_chunks(
    num_layers: int,
    pp: int,
    vpp: int,
    pp_layers: str | None,
    pp_layout: str | None,
    embedding: bool,
    loss: bool,
) -> tuple[int, ...] | None:
    """Layers per model chunk from the one pipeline option given: a Megatron layout string,
    layers per stage, or the embedding / loss counted as layers; None for an even split."""
    from cost_models.pipeline_layout import chunks_from_stages, megatron_split, parse_layout

    given = [name for name, v in (("--pp-layout", pp_layout), ("--pp-layers", pp_layers)) if v is not None]
    given += [name for name, on in (("--account-for-embedding", embedding), ("--account-for-loss", loss)) if on]
    if pp_layout is not None and len(given) > 1:
        raise ValueError(f"--pp-layout fixes the whole split; drop {', '.join(given[1:])}")
    if pp_layers is not None and (embedding or loss):
        raise ValueError("--pp-layers gives every stage's layers; drop --account-for-embedding/--account-for-loss")
    if pp_layout is not None:
        return parse_layout(pp_layout, pp)
    if pp_layers is not None:
        stages = _parse_layers(pp_layers)
        if len(stages) != pp:
            raise ValueError(f"--pp-layers has {len(stages)} entries but --pp is {pp}")
        return chunks_from_stages(stages, vpp)
    if embedding or loss:
        return megatron_split(num_layers, pp, vpp, embedding, loss)
    return None


def _parse_layers(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--pp-layers {text!r} must be comma-separated whole numbers, e.g. 13,13,12,12") from None


@app.command()
@user_errors
def explain(
    plan_file: Annotated[Path, typer.Argument(help="A plan written by `ntp plan -o` or `ntp estimate -o`.")],
    json_out: JsonOpt = False,
) -> None:
    """Where the time and memory go, and why the runners-up lost. Example: ntp explain plan.json"""
    from ntp_planner.plan import Plan
    from ntp_planner.report import explain_json, explain_view

    p = Plan.load(plan_file)
    if json_out:
        _print_json(explain_json(p))
    else:
        _print(explain_view(p))


PlanArg = Annotated[Path, typer.Argument(help="A plan written by `ntp plan -o` or `ntp estimate -o`.")]
PolicyOpt = Annotated[str, typer.Option("--policy", help="dp-drop, ntp, ntp-pw or spares.")]
SparesOpt = Annotated[int, typer.Option("--spares", help="Idle spare NVLink domains (policy spares).")]
FallbackOpt = Annotated[str, typer.Option("--fallback", help="What spares fall back to: dp-drop, ntp or ntp-pw.")]
BatchModeOpt = Annotated[str, typer.Option("--batch", help="flexible (shrinks) or fixed (pauses when short).")]
PowerOpt = Annotated[float, typer.Option("--max-power", help="Largest power multiplier per GPU (ntp-pw).")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed for random failures.")]
BlastOpt = Annotated[str, typer.Option("--blast", help="What one failure takes down: gpu, node or domain.")]


def _check_choice(value: str, allowed: tuple[str, ...], option: str) -> str:
    if value not in allowed:
        raise ValueError(f"{option} {value!r} is not one of {', '.join(allowed)}")
    return value


@app.command()
@user_errors
def replan(
    plan_file: PlanArg,
    failed: Annotated[str | None, typer.Option("--failed", help="Failed GPU ids, e.g. 17,803,4410.")] = None,
    failed_fraction: Annotated[
        float | None, typer.Option("--failed-fraction", help="Fail this share of GPUs at random.")
    ] = None,
    seed: SeedOpt = 0,
    blast: BlastOpt = "gpu",
    policy: PolicyOpt = "ntp",
    spares: SparesOpt = 0,
    fallback: FallbackOpt = "dp-drop",
    batch: BatchModeOpt = "flexible",
    max_power: PowerOpt = 1.3,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Save the re-plan as JSON.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Re-plan a job after GPU failures: drop replicas, or run them at reduced TP (NTP).

    Example: ntp replan plan.json --failed-fraction 0.001 --seed 1 --policy ntp-pw
    """
    import numpy as np

    from ntp_planner.failures.replan import BATCH_MODES, POLICIES, Replanner
    from ntp_planner.failures.sampling import BLASTS, explicit_failures, lost_domains, random_failures
    from ntp_planner.plan import Plan

    _check_choice(policy, POLICIES, "--policy")
    _check_choice(batch, BATCH_MODES, "--batch")
    _check_choice(blast, BLASTS, "--blast")
    if (failed is None) == (failed_fraction is None):
        raise ValueError("give exactly one of --failed (GPU ids) or --failed-fraction (a share of GPUs)")
    p = Plan.load(plan_file)
    cluster = p.cluster.build()
    down = frozenset()
    if failed is not None:
        ids = _parse_ints(failed, "--failed")
        lost = explicit_failures(cluster, ids)
    else:
        lost = random_failures(cluster, failed_fraction, np.random.default_rng(seed), blast)
        down = lost_domains(cluster, lost, blast)
    result = Replanner(p, max_power).replan(lost, policy, spares, fallback, batch, domains_down=down)
    if output:
        from ntp_planner.plan import write_atomic

        write_atomic(output, result.model_dump_json(indent=1))
    if json_out:
        sys.stdout.write(result.model_dump_json(indent=1) + "\n")
    else:
        from ntp_planner.report import replan_view

        _print(replan_view(result))


def _parse_ints(text: str, option: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{option} {text!r} must be comma-separated whole numbers, e.g. 17,803,4410") from None


@app.command()
@user_errors
def sweep(
    plan_file: PlanArg,
    fractions: Annotated[str, typer.Option("--fractions", help="Failed shares, e.g. 0.0005,0.001,0.002.")] = (
        "0.0005,0.001,0.002,0.004"
    ),
    samples: Annotated[int, typer.Option("--samples", help="Random failure sets per fraction.")] = 200,
    policies: Annotated[str, typer.Option("--policies", help="Comma-separated policies.")] = "dp-drop,ntp,ntp-pw",
    seed: SeedOpt = 0,
    blast: BlastOpt = "gpu",
    spares: SparesOpt = 0,
    fallback: FallbackOpt = "dp-drop",
    batch: BatchModeOpt = "flexible",
    max_power: PowerOpt = 1.3,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write a PNG of loss against failed share.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Throughput loss per policy over random failure placements (mean, p5, p95).

    Example: ntp sweep plan.json --fractions 0.0005,0.001,0.002,0.004 --samples 200 --plot loss.png
    """
    import numpy as np

    from ntp_planner.failures.replan import BATCH_MODES
    from ntp_planner.failures.sampling import BLASTS
    from ntp_planner.failures.sweep import plot_sweep
    from ntp_planner.failures.sweep import sweep as run_sweep
    from ntp_planner.plan import Plan

    _check_choice(batch, BATCH_MODES, "--batch")
    _check_choice(blast, BLASTS, "--blast")
    try:
        shares = [float(x) for x in fractions.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--fractions {fractions!r} must be comma-separated numbers, e.g. 0.001,0.002") from None
    bad = [f for f in shares if not 0 <= f < 1]
    if bad or not shares:
        raise ValueError(f"--fractions must be numbers in [0, 1); got {bad or fractions!r}")
    names = [x.strip() for x in policies.split(",") if x.strip()]
    p = Plan.load(plan_file)
    if plot is not None:
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:
            raise ValueError("--plot needs matplotlib; install the extra: pip install 'ntp-planner[plot]'")
    from rich.progress import Progress

    with Progress(transient=True, disable=json_out) as bar:
        task = bar.add_task("failure samples", total=samples * len(shares))
        rows = run_sweep(
            p,
            shares,
            samples,
            names,
            np.random.default_rng(seed),
            spares,
            fallback,
            batch,
            blast,
            max_power,
            progress=lambda: bar.advance(task),
        )
    if plot is not None:
        plot_sweep(rows, plot, f"{p.model.name} on {p.cluster.num_gpus} x {p.cluster.spec.gpu}")
    if json_out:
        _print_json([r.model_dump() for r in rows])
    else:
        from ntp_planner.report import sweep_table

        _print(sweep_table(rows))
        if plot is not None:
            _print(f"plot written to {plot}")


def _hours_range(text: str, option: str, scale: float) -> tuple[float, float]:
    """'3-5' -> (3, 5) and '3' -> (3, 3), times ``scale`` (days -> hours)."""
    try:
        parts = [float(x) for x in text.split("-")] if not text.startswith("-") else [float(text)]
    except ValueError:
        raise ValueError(f"{option} {text!r} must be a number or a range like 3-5") from None
    lo, hi = parts[0], parts[-1]
    if lo < 0 or hi < 0 or len(parts) > 2:
        raise ValueError(f"{option} {text!r} must be non-negative, a number or a range like 3-5")
    if hi < lo:
        raise ValueError(f"{option} {text!r} is reversed; write the smaller bound first")
    return lo * scale, hi * scale


@app.command()
@user_errors
def simulate(
    plan_file: PlanArg,
    days: Annotated[float, typer.Option("--days", help="Length of the run in days.")] = 30,
    trials: Annotated[int, typer.Option("--trials", help="Monte-Carlo trials.")] = 1000,
    strategies: Annotated[str, typer.Option("--strategies", help="restart, dp-drop, spares, ntp, ntp-pw.")] = (
        "restart,dp-drop,spares,ntp,ntp-pw"
    ),
    failure_rate: Annotated[
        float | None, typer.Option("--failure-rate", help="Failures per GPU-hour (default: Llama 3's 1.97e-5).")
    ] = None,
    hw_repair_days: Annotated[str, typer.Option("--hw-repair-days", help="Hardware repair, days: 3-5.")] = "3-5",
    sw_repair_hours: Annotated[str, typer.Option("--sw-repair-hours", help="Software repair, hours: 3.")] = "3",
    hw_share: Annotated[float, typer.Option("--hw-share", help="Share of failures that are hardware.")] = 0.78,
    checkpoint_interval: Annotated[
        str, typer.Option("--checkpoint-interval", help="auto (Daly's optimum) or minutes.")
    ] = "auto",
    checkpoint_write_s: Annotated[float, typer.Option("--checkpoint-write-s", help="Checkpoint write, s.")] = 300,
    restart_s: Annotated[float, typer.Option("--restart-s", help="Restart overhead, s.")] = 600,
    spares: SparesOpt = 0,
    batch: BatchModeOpt = "flexible",
    failure_dist: Annotated[str, typer.Option("--failure-dist", help="poisson, or weibull (job renewal).")] = (
        "poisson"
    ),
    weibull_shape: Annotated[float, typer.Option("--weibull-shape", help="Weibull shape; < 1 is bursty.")] = 0.7,
    hw_blast: Annotated[str, typer.Option("--hw-blast", help="Hardware failure takes down: gpu, node, domain.")] = (
        "gpu"
    ),
    sw_blast: Annotated[str, typer.Option("--sw-blast", help="Software failure takes down: gpu, node, domain.")] = (
        "gpu"
    ),
    straggler_rate: Annotated[
        float, typer.Option("--straggler-rate", help="Straggler episodes per GPU-hour (0 = none).")
    ] = 0.0,
    straggler_hours: Annotated[float, typer.Option("--straggler-hours", help="Episode length, hours.")] = 0.4,
    straggler_slowdown: Annotated[
        float, typer.Option("--straggler-slowdown", help="Job slowdown during an episode.")
    ] = 1.3,
    down_threshold: Annotated[
        float, typer.Option("--down-threshold", help="Report the time more than this share of GPUs is down.")
    ] = 0.001,
    lemon_fraction: Annotated[float, typer.Option("--lemon-fraction", help="Share of lemon hosts.")] = 0.0,
    lemon_factor: Annotated[float, typer.Option("--lemon-factor", help="How much more often lemons fail.")] = 1.0,
    seed: SeedOpt = 0,
    plot: Annotated[Path | None, typer.Option("--plot", help="Folder for PNG plots.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Goodput of the run under failures, per fault-handling strategy (Monte Carlo).

    Example: ntp simulate plan.json --days 30 --trials 1000 --strategies restart,ntp,ntp-pw --plot out/
    """
    import numpy as np

    from ntp_planner.failures.replan import BATCH_MODES
    from ntp_planner.failures.sampling import BLASTS
    from ntp_planner.failures.simulator import (
        LLAMA3_RATE_PER_GPU_HOUR,
        FailureClass,
        SimConfig,
        check_strategies,
        plot_simulation,
    )
    from ntp_planner.failures.simulator import simulate as run_simulation
    from ntp_planner.plan import Plan

    _check_choice(batch, BATCH_MODES, "--batch")
    names = [x.strip() for x in strategies.split(",") if x.strip()]
    check_strategies(names)
    rate = LLAMA3_RATE_PER_GPU_HOUR if failure_rate is None else failure_rate
    if rate < 0:
        raise ValueError(f"--failure-rate {rate} must be zero or more failures per GPU-hour")
    if days <= 0:
        raise ValueError(f"--days {days} must be more than zero")
    if not 0 < hw_share <= 1:
        raise ValueError(f"--hw-share {hw_share} must lie in (0, 1]")
    hw = _hours_range(hw_repair_days, "--hw-repair-days", 24)
    sw = _hours_range(sw_repair_hours, "--sw-repair-hours", 1)
    _check_choice(failure_dist, ("poisson", "weibull"), "--failure-dist")
    _check_choice(hw_blast, BLASTS, "--hw-blast")
    _check_choice(sw_blast, BLASTS, "--sw-blast")
    if straggler_rate < 0 or straggler_hours < 0 or straggler_slowdown < 1:
        raise ValueError("--straggler-rate and --straggler-hours must be >= 0 and --straggler-slowdown >= 1")
    classes = [FailureClass(name="hardware", share=hw_share, repair_min_h=hw[0], repair_max_h=hw[1], blast=hw_blast)]
    if hw_share < 1:
        classes.append(
            FailureClass(name="software", share=1 - hw_share, repair_min_h=sw[0], repair_max_h=sw[1], blast=sw_blast)
        )
    if checkpoint_interval == "auto":
        interval = None
    else:
        try:
            interval = float(checkpoint_interval) * 60
        except ValueError:
            raise ValueError(f"--checkpoint-interval {checkpoint_interval!r} must be auto or minutes") from None
        if interval <= 0:
            raise ValueError(f"--checkpoint-interval {checkpoint_interval} must be more than zero minutes")
    if plot is not None:
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:
            raise ValueError("--plot needs matplotlib; install the extra: pip install 'ntp-planner[plot]'")
    cfg = SimConfig(
        days=days,
        trials=trials,
        failure_rate_per_gpu_hour=rate,
        classes=tuple(classes),
        checkpoint_interval_s=interval,
        checkpoint_write_s=checkpoint_write_s,
        restart_s=restart_s,
        spares=spares,
        batch=batch,
        lemon_host_fraction=lemon_fraction,
        lemon_factor=lemon_factor,
        distribution=failure_dist,
        weibull_shape=weibull_shape,
        straggler_rate_per_gpu_hour=straggler_rate,
        straggler_hours=straggler_hours,
        straggler_slowdown=straggler_slowdown,
        down_threshold=down_threshold,
    )
    p = Plan.load(plan_file)
    from rich.progress import Progress

    with Progress(transient=True, disable=json_out) as bar:
        task = bar.add_task("trials", total=trials)
        results, trace = run_simulation(
            p, cfg, names, np.random.default_rng(seed), progress=lambda k: bar.advance(task, k)
        )
    if plot is not None:
        plot_simulation(trace, results, plot, f"{p.model.name} on {p.cluster.num_gpus} GPUs")
    if json_out:
        _print_json(
            {
                s: {
                    **r.mean.model_dump(),
                    "p5": r.p5.model_dump(),
                    "p95": r.p95.model_dump(),
                    "checkpoint_interval_s": r.checkpoint_interval_s,
                }
                for s, r in results.items()
            }
        )
    else:
        from ntp_planner.report import simulation_table

        _print(simulation_table(results, cfg))
        if plot is not None:
            _print(f"plots written to {plot}/")


def _load_replan(path: Path, plan, verb: str):
    """A re-plan from `ntp replan -o`, checked against the plan it must come from."""
    from pydantic import ValidationError

    from ntp_planner.failures.replan import ReplanResult

    try:
        result = ReplanResult.model_validate_json(Path(path).read_text())
    except OSError as exc:
        raise ValueError(f"cannot read re-plan {path}: {exc.strerror}") from None
    except ValidationError:
        raise ValueError(f"{path} is not a re-plan written by `ntp replan -o`") from None
    if len(result.rank_to_gpu) != plan.layout.world_size:
        raise ValueError(
            f"re-plan {path} has {len(result.rank_to_gpu)} ranks but the plan "
            f"has {plan.layout.world_size}; {verb} the plan it was made from"
        )
    return result


@app.command(name="export")
@user_errors
def export_cmd(
    plan_file: PlanArg,
    fmt: Annotated[str, typer.Option("--format", help="megatron, nemo, nemo2, bridge or json.")] = "megatron",
    out_dir: Annotated[Path, typer.Option("--output", "-o", help="Folder to write into.")] = Path("."),
    replan_file: Annotated[
        Path | None, typer.Option("--replan", help="A re-plan from `ntp replan -o` (NTP settings).")
    ] = None,
    data_path: Annotated[str | None, typer.Option("--data-path", help="Training data (default: mock data).")] = None,
    save_dir: Annotated[str | None, typer.Option("--save-dir", help="Checkpoint folder.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Write launch files for Megatron-LM, NeMo 1.x, NeMo 2.0 or Megatron-Bridge.

    Example: ntp export plan.json --format megatron -o launch/
    """
    from ntp_planner.emitters import export
    from ntp_planner.plan import Plan, write_atomic

    p = Plan.load(plan_file)
    replan_result = None if replan_file is None else _load_replan(replan_file, p, "export")
    result = export(p, fmt, replan_result, data_path, save_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cannot create output folder {out_dir}: {exc.strerror}; choose another -o") from None
    for name, text in result.files.items():
        write_atomic(out_dir / name, text)
        if name.endswith(".sh"):
            (out_dir / name).chmod(0o755)
    for w in result.warnings:
        typer.echo(f"warning: {w}", err=True)
    if json_out:
        _print_json({"files": [str(out_dir / n) for n in result.files], "warnings": result.warnings})
    else:
        for name in result.files:
            _print(f"wrote {out_dir / name}")


@app.command()
@user_errors
def validate(
    plan_file: PlanArg,
    replan_file: Annotated[
        Path | None, typer.Option("--replan", help="A re-plan from `ntp replan -o`: run its degraded replicas.")
    ] = None,
    nproc: Annotated[
        int | None, typer.Option("--nproc", help="Processes to run (default: 16 on CPU, one per GPU with nccl).")
    ] = None,
    backend: Annotated[str, typer.Option("--backend", help="gloo (CPU) or nccl (CUDA GPUs).")] = "gloo",
    steps: Annotated[int, typer.Option("--steps", help="AdamW steps to train and compare.")] = 3,
    timeout: Annotated[
        float,
        typer.Option(
            "--timeout", help="Seconds without progress before the run counts as hung (start-up gets 60 s more)."
        ),
    ] = 180.0,
    tolerance: Annotated[float, typer.Option("--tolerance", help="Largest relative error that passes.")] = 1e-5,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the weights and the synthetic batch.")] = 0,
    fault: Annotated[str | None, typer.Option("--inject-fault", hidden=True, help="RANK:die|hang|raise:STEP")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Run a plan for real on a shrunk model with torch.distributed and compare it with one process.

    Keeps the plan's stage width, per-layer TP degrees and (with --replan) the degraded replicas'
    uneven shards and batches; shrinks layers, width, replicas and stages to fit --nproc.
    Across hosts, run the same command under torchrun (each process becomes one rank).

    Example: ntp validate plan.json --replan replan.json --steps 3
    """
    from ntp_planner.executor.shrink import shrink
    from ntp_planner.plan import Plan

    _check_choice(backend, ("gloo", "nccl"), "--backend")
    if steps < 1:
        raise ValueError(f"--steps {steps} must be at least 1")
    if timeout <= 0:
        raise ValueError(f"--timeout {timeout:g} must be positive")
    if not 0 < tolerance < 1:
        raise ValueError(f"--tolerance {tolerance:g} must lie between 0 and 1, e.g. 1e-5")
    p = Plan.load(plan_file)
    replan_result = None if replan_file is None else _load_replan(replan_file, p, "validate")
    injected = _parse_fault(fault)
    import torch  # the executor needs it; imported only here

    from ntp_planner.executor.launch import RankFailure, launch, run_as_torchrun_rank, under_torchrun

    gpus = torch.cuda.device_count() if backend == "nccl" else 0
    if backend == "nccl" and gpus == 0:
        raise ValueError("--backend nccl needs CUDA GPUs and this machine has none; use --backend gloo")
    torchrun = under_torchrun()  # then this process is one rank of a run torchrun started
    if torchrun:
        import os

        n = int(os.environ["WORLD_SIZE"])
        if nproc is not None and nproc != n:
            raise ValueError(f"--nproc {nproc} differs from torchrun's {n} processes; drop --nproc")
    else:
        n = nproc if nproc is not None else (gpus or 16)
        if n < 1:
            raise ValueError(f"--nproc {n} must be at least 1")
        if backend == "nccl" and n > gpus:
            raise ValueError(f"--nproc {n} exceeds the {gpus} GPUs here (nccl runs one rank per GPU); lower --nproc")
    shrunk = shrink(p, n, replan_result, steps, seed)
    from ntp_planner.report import validate_json, validate_view

    try:
        if torchrun:
            result = run_as_torchrun_rank(shrunk.spec, backend, timeout)
            if result is None:
                return  # rank 0 reports
        else:
            result = _with_progress(lambda tick: launch(shrunk.spec, backend, timeout, injected, tick), steps, json_out)
    except RankFailure as exc:
        if json_out:
            _print_json({"passed": False, "failure": str(exc)})
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    data = validate_json(shrunk, result, tolerance, backend)
    if json_out:
        _print_json(data)
    else:
        _print(validate_view(p, shrunk, result, tolerance, backend))
    if not data["passed"]:
        raise typer.Exit(1)


def _parse_fault(text: str | None):
    if text is None:
        return None
    try:
        rank, kind, step = text.split(":")
        if kind not in ("die", "hang", "raise"):
            raise ValueError
        return int(rank), kind, int(step)
    except ValueError:
        raise ValueError(f"--inject-fault {text!r} must look like RANK:die|hang|raise:STEP, e.g. 1:die:0") from None


def _with_progress(work, steps: int, quiet: bool):
    """Run ``work(tick)`` under a progress bar of the steps the slowest rank has entered."""
    if quiet:
        return work(None)
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task("starting ranks", total=steps)

        def tick(step: int) -> None:
            if step:
                bar.update(task, completed=step - 1, description=f"step {step} of {steps}")

        return work(tick)


def main() -> None:
    """The ``ntp`` entry point. A usage error (an unknown option, a value out of range) ends in one
    line on stderr and exit code 2, like every other bad input; bare ``ntp`` prints the help."""
    from typer._click.exceptions import NoArgsIsHelpError
    from typer.exceptions import TyperException

    try:
        code = app(standalone_mode=False)
    except NoArgsIsHelpError as exc:
        typer.echo(exc.ctx.get_help())
        code = 0
    except TyperException as exc:
        where = exc.ctx.command_path if getattr(exc, "ctx", None) else "ntp"
        message = " ".join(exc.format_message().split()).rstrip(".")
        typer.echo(f"error: {message}; run `{where} --help` for the options.", err=True)
        code = getattr(exc, "exit_code", 2)
    except typer.Abort:
        typer.echo("aborted.", err=True)
        code = 1
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
