"""`ntp validate`: run a plan (or a re-plan's degraded replicas) for real, shrunk to this host, and
check it against one process; live recovery with --fail."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated, Literal

import typer

from ntp_planner.cli.live import (
    CheckpointDirOpt,
    CheckpointEveryOpt,
    FailOpt,
    JoinOpt,
    LivePolicyOpt,
    LiveSparesOpt,
    RepairOpt,
    parse_events,
)
from ntp_planner.cli.options import MAX_PROCS, Backend, JsonOpt, PlanArg
from ntp_planner.cli.output import show, show_json, with_step_progress
from topologies.errors import InputError

ValidateReplanOpt = Annotated[
    Path | None, typer.Option("--replan", help="A re-plan from `ntp replan -o`: run its degraded replicas.")
]
NprocOpt = Annotated[
    int | None,
    typer.Option(
        "--nproc",
        min=1,
        max=MAX_PROCS,
        help="Processes to run, at most one machine's worth (default: 16 with gloo, one per GPU with nccl).",
    ),
]
BackendOpt = Annotated[Backend, typer.Option("--backend", help="gloo (CPU) or nccl (CUDA GPUs).")]
MAX_STEPS = 1000  # a check needs a few steps, timing about 10; a thousand tiny steps take minutes
StepsOpt = Annotated[
    int | None,
    typer.Option(
        "--steps",
        min=1,
        max=MAX_STEPS,
        help="AdamW steps to train and compare (default 3; 8 with --profile, for timing).",
    ),
]
ValidateProfileOpt = Annotated[
    Path | None,
    typer.Option(
        "--profile",
        help="A profile of this machine from `ntp profile`: also predict the run's step time, its split and "
        "memory with the cost model and report them against the measured ones.",
    ),
]
ShrunkSeqOpt = Annotated[
    int | None,
    typer.Option(
        "--seq-len",
        min=1,
        max=65536,
        help="Tokens per sequence of the shrunk run (default 8), at least enough for its batch to hold every vocabulary"
        " id: longer ones give timing more compute per step (and fp32 more rounding: allow a larger --tolerance).",
    ),
]
FullSizeOpt = Annotated[bool, typer.Option("--full-size", help="Run a one-GPU plan unshrunk, as planned, on 1 rank.")]
RecordOpt = Annotated[
    Path | None,
    typer.Option("--record", help="With --profile: append the run (measured and predicted) to this JSON-lines file."),
]
MIN_TIMEOUT_S = (
    1.0  # one AdamW step of the shrunk model takes milliseconds; below a second, scheduling jitter is a hang
)
MAX_TIMEOUT_S = 86_400.0  # a day; the ranks' collective timeout is a finite timedelta of twice this
TimeoutOpt = Annotated[
    float,
    typer.Option(
        "--timeout",
        min=MIN_TIMEOUT_S,
        max=MAX_TIMEOUT_S,
        help="Seconds without progress before the run counts as hung (start-up gets 60 s more), 1 s to a day.",
    ),
]
# Largest relative error that passes, per dtype of the run. float64: roundoff 1.1e-16, a clean run
# errs near 1e-15 and a bug by 1e-8 or more, so 1e-9 is tight with room for longer runs; float32:
# roundoff 6e-8, Adam amplifies a clean run's to 1e-6 (more with --seq-len), so 1e-5; bfloat16
# (bf16 weights and activations, fp32 master weights and gradient sums, as Megatron): roundoff
# 3.9e-3 on every activation; clean runs' first-step gradients err by 1.7e-2 (TP2) to 6.2e-2 (MoE,
# EP2, ZeRO-2: the reference is one bf16 backward of the whole batch, the run sums bf16 pieces in
# fp32), losses by 5e-3 and parameters by 6e-4, so 1e-1 (a bug of the planted kinds errs by 0.2 to 1).
TOLERANCE = {"float64": 1e-9, "float32": 1e-5, "bfloat16": 1e-1}
RunDtype = Literal["float64", "float32", "bfloat16"]
ValidateDtypeOpt = Annotated[
    RunDtype,
    typer.Option(
        "--dtype",
        help="Precision of the run and of the one-process reference: float64 makes the exactness check tight "
        "(tolerance 1e-9), float32 (1e-5) is the default, bfloat16 runs the plan's precision (bf16 with fp32 "
        "master weights) for timing (1e-1).",
    ),
]
ToleranceOpt = Annotated[
    float | None,
    typer.Option(
        "--tolerance", min=0, max=1, help="Largest relative error that passes, in (0, 1) (default: set by --dtype)."
    ),
]
# torch seeds are 64-bit: the batch generator takes seed + 1, so the largest signed 64-bit value is kept free
WeightSeedOpt = Annotated[
    int, typer.Option("--seed", min=0, max=2**63 - 2, help="Seed of the weights and the synthetic batch.")
]
FaultOpt = Annotated[str | None, typer.Option("--inject-fault", hidden=True, help="RANK:die|hang|raise:STEP")]

TORCH_MISSING = (
    "`ntp validate` runs the plan with PyTorch, which is not installed here; "
    "install it with: pip install 'ntp-planner[torch]'"
)


def validate(
    plan_file: PlanArg,
    replan_file: ValidateReplanOpt = None,
    nproc: NprocOpt = None,
    backend: BackendOpt = "gloo",
    steps: StepsOpt = None,
    timeout: TimeoutOpt = 180.0,
    tolerance: ToleranceOpt = None,
    seed: WeightSeedOpt = 0,
    seq_len: ShrunkSeqOpt = None,
    profile: ValidateProfileOpt = None,
    record: RecordOpt = None,
    fault: FaultOpt = None,
    json_out: JsonOpt = False,
    dtype: ValidateDtypeOpt = "float32",
    fail: FailOpt = None,
    repair: RepairOpt = None,
    policy: LivePolicyOpt = "ntp",
    spares: LiveSparesOpt = 0,
    checkpoint_every: CheckpointEveryOpt = 0,
    checkpoint_dir: CheckpointDirOpt = None,
    full: FullSizeOpt = False,
    join: JoinOpt = None,
) -> None:
    """Run a plan for real on a shrunk model with torch.distributed and compare it with one process.

    Keeps the plan's stage width, per-layer TP degrees and (with --replan) the degraded replicas'
    uneven shards and batches; shrinks layers, width, replicas and stages to fit --nproc.
    Across hosts, run the same command under torchrun (each process becomes one rank). With
    --profile, the cost model predicts the run (the shrunk model on these processes) and the
    report sets predicted against measured step time, per stage and per part, and memory.
    Every rank's copy of every parameter and first-step gradient is compared, the shard cuts are
    checked against the planner's shares, and the batches cover every vocabulary id.
    With --fail, processes fail for real during the run and it recovers live: the survivors agree
    on who failed, re-plan under --policy (NTP shrinks the replica's TP degree), rebuild their
    process groups, fetch the rows they now own from their peers and redo the interrupted step;
    --repair brings a process back. Under torchrun --fail recovers across nodes, a whole node
    lost too (:host); a repair there is a process started later with --join. The report adds
    the recovery timeline, and the reference is fed the samples the run committed.
    Needs PyTorch: pip install 'ntp-planner[torch]'.

    \b
    Example: ntp validate plan.json --replan replan.json --steps 3
             ntp validate plan.json --dtype float64
             ntp validate plan.json --profile profile.json --record runs.jsonl
             ntp validate plan.json --steps 8 --fail 1@3 --repair 1@6 --policy ntp
             ntp validate one_gpu.json --full-size --backend nccl
             torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d \\
               --rdzv-endpoint HOST:29500 $(which ntp) validate plan.json \\
               --steps 8 --fail 3@2:host
    """
    tolerance = TOLERANCE[dtype] if tolerance is None else tolerance
    if not 0 < tolerance < 1:
        raise InputError(f"--tolerance {tolerance:g} must lie between 0 and 1, e.g. 1e-5")
    from ntp_planner.executor.elastic.faults import HOWS

    _check_record(record, profile, [plan_file, replan_file, profile])
    if join is not None:
        from ntp_planner.cli.live import join_live

        _import_torch()
        return join_live(join)
    fails, repairs = parse_events(fail, "--fail", HOWS), parse_events(repair, "--repair", None)
    live = bool(fails or repairs)
    _check_modes(live, full, replan_file, profile, fault, backend, policy, spares, checkpoint_every,
                 checkpoint_dir, seq_len)  # fmt: skip
    from ntp_planner.executor.shrink.run import SEQ_LEN

    seq_len = SEQ_LEN if seq_len is None else seq_len
    torch = _import_torch()
    from ntp_planner.plan import Plan
    from ntp_planner.replan_result import ReplanResult
    from ntp_planner.views.validate import validate_json, validate_view

    steps = steps or (8 if profile or live else 3)
    p = Plan.load(plan_file)
    if live:
        from ntp_planner.cli.live import validate_live

        def shrunk_run(n: int, failures: int):
            return _shrunk_run(p, n, None, steps, seed, seq_len, dtype, json_out, failures)

        return validate_live(p, shrunk_run, nproc, steps, timeout, tolerance, json_out,
                             (fails, repairs, policy, spares, checkpoint_every, checkpoint_dir))  # fmt: skip
    replan_result = None if replan_file is None else ReplanResult.load(replan_file, p, "validate")
    injected = _parse_fault(fault)
    n, torchrun = _world_size(torch, backend, 1 if full and nproc is None else nproc)
    measured_profile = None if profile is None else _machine_profile(profile, backend)
    if full:
        from ntp_planner.executor.shrink.full import device_memory_bytes, full_run

        shrunk, cuts = full_run(p, n, backend, steps, seed, dtype, device_memory_bytes(backend))
    else:
        shrunk, cuts = _shrunk_run(p, n, replan_result, steps, seed, seq_len, dtype, json_out)
    replan_fields = {} if replan_result is None else _replan_coverage(replan_result, shrunk, n)
    if measured_profile is not None:
        from ntp_planner.profiler.for_run import complete_profile

        measured_profile = complete_profile(measured_profile, shrunk.spec, p.model.name, None if json_out else show)
    result = _run(shrunk, backend, timeout, injected, torchrun, steps, json_out)
    if result is None:
        return  # a torchrun rank other than 0: rank 0 reports
    comparison = None if measured_profile is None else _compare_prediction(measured_profile, shrunk.spec, p, result)
    data = validate_json(shrunk, result, tolerance, backend, cuts, p.model) | replan_fields | (comparison or {})
    _show_run(data, validate_view(p, shrunk, result, tolerance, backend, cuts), comparison, json_out)
    if record is not None:
        _record(record, plan_file, p, measured_profile, comparison)
    if not data["passed"]:
        raise typer.Exit(1)


def _show_run(data: dict, view, comparison: dict | None, json_out: bool) -> None:
    """The run's report: ``data`` as JSON, or its view and the predicted-against-measured table."""
    if json_out:
        show_json(data)
        return
    show(view)
    if comparison is not None:
        from ntp_planner.views.timing import comparison_view

        show(comparison_view(comparison))


def _check_record(record: Path | None, profile: Path | None, inputs: list) -> None:
    """--record needs --profile, and a path it can append to (said before the run)."""
    if record is not None and profile is None:
        raise InputError("--record stores predicted against measured step times; give --profile too")
    if record is not None:
        from ntp_planner.outputs import check_output
        from topologies.files import read_text

        check_output(record, "--record", inputs, "runs.jsonl")  # before the run
        if record.exists():
            read_text(record, "runs file")  # a folder, a device or an oversized file: said before the run too


def _check_modes(live, full, replan_file, profile, fault, backend, policy, spares, checkpoint_every, checkpoint_dir,
                 seq_len) -> None:  # fmt: skip
    """The options that belong to one mode (live recovery, a plain run, --full-size) and not another."""
    if live and (replan_file or profile or fault or backend != "gloo"):
        raise InputError(
            "--fail and --repair run live recovery from the plan's healthy layout, on gloo, without --replan, "
            "--profile, --inject-fault or --backend nccl; drop those"
        )
    if not live and (policy != "ntp" or spares or checkpoint_every or checkpoint_dir is not None):
        raise InputError("--policy, --spares and --checkpoint-* shape a live recovery; add --fail RANK@STEP")
    if full and (live or replan_file or seq_len is not None):
        raise InputError("--full-size runs the plan's own model, sequence and batch on one process; drop --fail, "
                         "--repair, --replan and --seq-len")  # fmt: skip


def _replan_coverage(replan, shrunk, nproc: int) -> dict:
    """The re-plan's replicas the run holds, said out loud (a warning on stderr, before the run)
    when none of them is degraded beside one of another width: such a run checks no NTP sync."""
    from ntp_planner.executor.shrink.notes import no_degraded_warning

    picked = list(shrunk.replicas)
    warning = no_degraded_warning(replan, picked, nproc)
    if warning:
        typer.echo(f"warning: {warning}", err=True)
    status = {x.replica: x.status for x in replan.replicas}
    return {"degraded_replicas_run": [r for r in picked if status[r] == "degraded"], "replan_warning": warning}


def _shrunk_run(plan, n: int, replan_result, steps: int, seed: int, seq_len: int, dtype: str, quiet: bool,
                failures: int = 0):  # fmt: skip
    """The shrunk run in ``dtype``, its sequences lengthened until its batch holds every vocabulary
    id, and its shard cuts against the planner's shares; a mismatch ends the command (exit 1)
    before any process starts: the run would check a sharding the planner did not plan.
    ``failures``: processes a live run loses (the shrink keeps the widths they lead to)."""
    from ntp_planner.executor.check.cuts import compare_cuts, mismatches
    from ntp_planner.executor.model.batch import covering_seq_len, covers_vocabulary
    from ntp_planner.executor.shrink.run import shrink

    shrunk = shrink(plan, n, replan_result, steps, seed, seq_len, failures)
    if not covers_vocabulary(shrunk.spec):
        shrunk = shrink(plan, n, replan_result, steps, seed, covering_seq_len(shrunk.spec), failures)
    shrunk = replace(shrunk, spec=replace(shrunk.spec, dtype=dtype))
    cuts = compare_cuts(shrunk.spec, plan.model)
    if mismatches(cuts):
        if quiet:
            show_json({"passed": False, "failure": mismatches(cuts), "cuts": cuts})
        typer.echo(f"error: {mismatches(cuts)}.", err=True)
        raise typer.Exit(1)
    return shrunk, cuts


def _machine_profile(path: Path, backend: str):
    """The profile at ``path``, refused when it was measured on another kind of device than the
    one this run computes on (gloo runs on the CPU, nccl on CUDA GPUs)."""
    from cost_models.profile import load_profile

    prof = load_profile(path)
    want = "cuda" if backend == "nccl" else "cpu"
    if prof.device.kind != want:
        raise InputError(
            f"profile {path} was measured on {prof.device.kind} ({prof.device.name}) but a {backend} run computes on "
            f"{want}; profile this machine with `ntp profile --device {want}`"
        )
    return prof


def _compare_prediction(prof, spec, plan, result) -> dict:
    from ntp_planner.executor.check.timing import compare_run
    from ntp_planner.profiler.cluster import local_cluster

    return compare_run(prof, local_cluster(prof), spec, plan.model.name, result)


def _record(path: Path, plan_file: Path, plan, prof, comparison: dict) -> None:
    """Append the run to the JSON-lines file at ``path`` (the whole file rewritten atomically)."""
    from ntp_planner.executor.check.timing import run_record
    from ntp_planner.plan import write_atomic

    line = run_record(f"{Path(plan_file).name}: {plan.layout.describe()}", prof, comparison).model_dump_json()
    old = ""
    if path.exists():
        from topologies.files import read_text

        old = read_text(path, "runs file")
        old += "" if not old or old.endswith("\n") else "\n"
    write_atomic(path, old + line + "\n")


def _import_torch():
    try:
        import torch  # the executor needs it; imported only by `ntp validate`
    except ImportError:
        raise InputError(TORCH_MISSING) from None
    return torch


def _world_size(torch, backend: str, nproc: int | None) -> tuple[int, bool]:
    """Ranks to run, and whether this process is one rank of a run torchrun started."""
    from ntp_planner.executor.train.launch import under_torchrun

    gpus = torch.cuda.device_count() if backend == "nccl" else 0
    if backend == "nccl" and gpus == 0:
        raise InputError("--backend nccl needs CUDA GPUs and this machine has none; use --backend gloo")
    if under_torchrun():
        import os

        n = int(os.environ["WORLD_SIZE"])
        if nproc is not None and nproc != n:
            raise InputError(f"--nproc {nproc} differs from torchrun's {n} processes; drop --nproc")
        return n, True
    n = nproc if nproc is not None else (gpus or 16)
    if backend == "nccl" and n > gpus:
        raise InputError(f"--nproc {n} exceeds the {gpus} GPUs here (nccl runs one rank per GPU); lower --nproc")
    return n, False


def _run(shrunk, backend: str, timeout: float, injected, torchrun: bool, steps: int, quiet: bool):
    """The run's result; a failed rank ends the command with its name and exit code 1."""
    from ntp_planner.executor.train.launch import RankFailure, launch, run_as_torchrun_rank

    try:
        if torchrun:
            return run_as_torchrun_rank(shrunk.spec, backend, timeout, injected)
        return with_step_progress(lambda tick: launch(shrunk.spec, backend, timeout, injected, tick), steps, quiet)
    except RankFailure as exc:
        if not exc.report:  # under torchrun another rank says it: one sentence, one JSON object
            raise typer.Exit(1) from None
        if quiet:
            show_json({"passed": False, "failure": str(exc)})
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


def _parse_fault(text: str | None):
    """``'1:die:0'`` -> ``(1, 'die', 0)``: rank 1 dies at step 0 (a hidden option for tests)."""
    if text is None:
        return None
    try:
        rank, kind, step = text.split(":")
        if kind not in ("die", "hang", "raise"):
            raise ValueError
        return int(rank), kind, int(step)
    except ValueError:
        raise InputError(f"--inject-fault {text!r} must look like RANK:die|hang|raise:STEP, e.g. 1:die:0") from None
