"""`ntp profile`: measure this machine's blocks, kernels and collectives with torch, and write the
profile and the cluster file of the machine."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Literal

import typer

from ntp_planner.cli.options import MAX_PROCS, MAX_SEQ_LEN, Backend, JsonOpt, SeedOpt, parse_list
from ntp_planner.cli.output import show, show_json
from topologies.errors import InputError

DeviceOpt = Annotated[
    Literal["cuda", "cpu"] | None,
    typer.Option("--device", help="Where to measure (default: cuda when torch sees a GPU)."),
]
ProfileBackendOpt = Annotated[
    Backend | None, typer.Option("--backend", help="Collectives over nccl (CUDA) or gloo (default: nccl on cuda).")
]
ProcsOpt = Annotated[
    int | None,
    typer.Option(
        "--nproc", min=1, max=MAX_PROCS, help="Processes for the collectives, e.g. 8 (default: the GPUs; 2 on CPU)."
    ),
]
ProfileModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model", "-m", help="Whose blocks: catalogue name or config.json path, e.g. llama3-8b (default: "
        "llama3-8b on cuda, llama2-7b on cpu)."
    ),
]  # fmt: skip
ProfileDtypeOpt = Annotated[
    str | None, typer.Option("--dtype", help="torch dtype, e.g. bf16 or float32 (default: bf16 on cuda, fp32 on cpu).")
]
ProfileSeqOpt = Annotated[
    int | None,
    typer.Option(
        "--seq-len", min=1, max=MAX_SEQ_LEN, help="Tokens per sequence, e.g. 4096 (default: 4096 cuda, 256 cpu)."
    ),
]
MicroBatchesOpt = Annotated[
    str | None, typer.Option("--micro-batches", help="Micro-batch sizes, e.g. 1,2,4 (default: 1,2,4; 1,2 on cpu).")
]
TpOpt = Annotated[
    str | None, typer.Option("--tp", help="TP degrees, e.g. 1,2,4,8 (default: those the planner tries on --nproc).")
]
QuickOpt = Annotated[bool, typer.Option("--quick", help="A rough profile in under a minute: few shapes and reps.")]
ProfileOutOpt = Annotated[Path, typer.Option("--output", "-o", help="Profile JSON to write, e.g. profile.json.")]
ClusterOutOpt = Annotated[
    Path | None, typer.Option("--cluster-out", help="Cluster file to write (default: <output stem>.cluster.json).")
]


def profile(
    device: DeviceOpt = None,
    backend: ProfileBackendOpt = None,
    nproc: ProcsOpt = None,
    model: ProfileModelOpt = None,
    dtype: ProfileDtypeOpt = None,
    seq_len: ProfileSeqOpt = None,
    micro_batches: MicroBatchesOpt = None,
    tp: TpOpt = None,
    quick: QuickOpt = False,
    output: ProfileOutOpt = Path("profile.json"),
    cluster_out: ClusterOutOpt = None,
    json_out: JsonOpt = False,
    seed: SeedOpt = 0,
) -> None:
    """Measure this machine with torch: the executor's blocks at each TP shard, GEMMs, attention,
    memory-bound passes and collectives (fitted to alpha-beta terms); write the profile and a
    cluster file of this machine. Needs PyTorch: pip install 'ntp-planner[torch]'.

    \b
    Example: ntp profile --device cpu --nproc 2 --quick -o profile.json
    """
    from ntp_planner.outputs import check_output

    cluster_out = cluster_out or output.with_name(f"{output.stem}.cluster.json")
    if cluster_out.resolve() == output.resolve():
        raise InputError(f"--cluster-out {cluster_out} is the profile's own path; give the cluster file another name")
    # before minutes of measuring, not after; -m may name a config.json
    check_output(output, "--output", [model], "profile.json")
    check_output(cluster_out, "--cluster-out", [model], "profile.cluster.json")
    mbs = None if micro_batches is None else tuple(parse_list(micro_batches, "--micro-batches", int, "1,2,4"))
    tps = None if tp is None else tuple(parse_list(tp, "--tp", int, "1,2,4,8"))
    if any(v < 1 for v in (*(mbs or ()), *(tps or ()))):
        raise InputError("--micro-batches and --tp take whole numbers of at least 1, e.g. 1,2,4")
    try:
        import torch  # noqa: F401  (only this command and validate import torch)
    except ImportError:
        raise InputError("`ntp profile` measures with PyTorch, which is not installed here; install it with: "
                         "pip install 'ntp-planner[torch]'") from None  # fmt: skip
    from cost_models.profile import profile_json
    from ntp_planner.outputs import write_files
    from ntp_planner.profiler.cluster import local_cluster
    from ntp_planner.profiler.collectives import MeasureFailure
    from ntp_planner.profiler.machine import profile_machine, resolve_settings, task_count
    from ntp_planner.profiler.view import profile_summary, profile_view

    settings = resolve_settings(device, backend, nproc, model, dtype, seq_len, mbs, tps, quick, seed)
    try:
        result = _with_progress(lambda tick: profile_machine(settings, tick), task_count(settings), json_out)
    except MeasureFailure as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    cluster = local_cluster(result)
    cluster_json = cluster.model_dump_json(indent=1, exclude_defaults=False) + "\n"
    write_files({output: profile_json(result), cluster_out: cluster_json})  # both files or neither
    if json_out:
        show_json(profile_summary(result) | {"profile": str(output), "cluster": str(cluster_out)})
    else:
        show(profile_view(result))
        show(f"profile written to {output}; cluster file (gpu {cluster.gpu}) written to {cluster_out}")


def _with_progress(work, total: int, quiet: bool):
    """Run ``work(tick)`` under a progress bar of the measurements done, on stderr when it is a
    terminal (a log gets no bar, and an error stays one line)."""
    if quiet or not sys.stderr.isatty():
        return work(None)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("measuring", total=total)
        return work(lambda label: bar.update(task, advance=1, description=label))
