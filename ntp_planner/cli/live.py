"""`ntp validate --fail/--repair`: a live run that loses processes, re-plans and keeps training.

Options are parsed and checked here before any process starts; the run itself is
``executor.elastic`` (``launch`` on one host, ``torchrun`` across rendezvous nodes); the
report is the timeline (one row per event, its recovery time split into detect / agree /
re-plan / regroup / move state / redo) and the comparison with one process fed the samples the
run committed.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from topologies.errors import InputError

LIVE_POLICIES = ("ntp", "ntp-pw", "dp-drop", "spares", "restart")
FailOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--fail",
        help="RANK@STEP[:HOW]: process RANK fails in step STEP (from 0) for real: kill (SIGKILL mid-step, the "
        "default), sync (SIGKILL in the gradient sync), raise (an exception inside a collective), hang, or host "
        "(under torchrun: its whole node is lost). "
        "Repeat for more failures; the run recovers live under --policy.",
    ),
]
RepairOpt = Annotated[
    list[str] | None,
    typer.Option("--repair", help="RANK@STEP: failed process RANK comes back at step STEP and its replica regrows."),
]
LivePolicyOpt = Annotated[
    str,
    typer.Option(
        "--policy",
        help="How a live run recovers: ntp, ntp-pw, dp-drop, spares (idle --spares processes stand in) or "
        "restart (reload the last checkpoint on the new layout).",
    ),
]
LiveSparesOpt = Annotated[
    int,
    typer.Option("--spares", min=0, max=64, help="Idle spare processes a live run starts with (for --policy spares)."),
]
CheckpointEveryOpt = Annotated[
    int, typer.Option("--checkpoint-every", min=0, max=1000, help="Write a checkpoint every K steps (0: none).")
]
CheckpointDirOpt = Annotated[
    Path | None, typer.Option("--checkpoint-dir", help="Folder for checkpoints (default: a temporary one).")
]

JoinOpt = Annotated[
    str | None,
    typer.Option(
        "--join",
        help="HOST:PORT/RUN_ID: join the live run under torchrun whose store is there (rank 0 prints it) as a "
        "repair: this process takes back a failed process's slot at the next step boundary.",
    ),
]

_EVENT = re.compile(r"^(\d{1,6})@(\d{1,6})(?::([a-z]+))?$")


def parse_events(texts: list[str] | None, what: str, hows: tuple[str, ...] | None) -> list[tuple[int, int, str]]:
    """``['1@2:sync']`` -> ``[(1, 2, 'sync')]``; a malformed entry is one clear sentence."""
    out = []
    for text in texts or []:
        m = _EVENT.match(text.strip())
        how = m.group(3) if m else None
        if m is None or (how is not None and (hows is None or how not in hows)):
            form = "RANK@STEP[:HOW], HOW one of " + ", ".join(hows) if hows else "RANK@STEP"
            raise InputError(f"{what} {text!r} is not {form}; e.g. {what} 1@2")
        out.append((int(m.group(1)), int(m.group(2)), how or (hows[0] if hows else "")))
    return out


def check_live(fails, repairs, policy: str, spares: int, steps: int, world: int, every: int, folder) -> None:
    """Refuse, in one sentence each, what the run cannot do (before any process starts)."""
    if policy not in LIVE_POLICIES:
        raise InputError(f"--policy {policy!r} is not one of {', '.join(LIVE_POLICIES)}")
    total = world + spares
    for flag, events in (("--fail", fails), ("--repair", repairs)):
        for rank, step, _ in events:
            if rank >= total:
                raise InputError(
                    f"{flag} names process {rank} but the run has {world} processes"
                    + (f" and {spares} spares" if spares else "")
                    + f" (0..{total - 1}); pick one the shrink above lists"
                )
            if step >= steps:
                raise InputError(
                    f"{flag} {rank}@{step}: the run has steps 0..{steps - 1}; raise --steps or pick an earlier step"
                )
    if len({(r, s) for r, s, _ in fails}) < len(fails):
        raise InputError("--fail names the same process and step twice; give each failure once")
    _check_lives(fails, repairs)
    if policy == "spares" and spares == 0:
        raise InputError("--policy spares needs idle spare processes: add --spares 1 (or more)")
    if folder is not None and every == 0:
        raise InputError("--checkpoint-dir needs --checkpoint-every K to write checkpoints")
    if folder is not None:
        check_checkpoint_dir(folder)


def _check_lives(fails, repairs) -> None:
    """Each process alternates: it fails, is repaired, fails again... A repair of a process that
    is up, or a failure of one that is down, would never happen in the run (the timeline would
    silently lack it). A repair and a failure in the same step: the newcomer fails in that step."""
    for rank in sorted({r for r, _, _ in [*fails, *repairs]}):
        events = sorted([(s, 0) for r, s, _ in repairs if r == rank] + [(s, 1) for r, s, _ in fails if r == rank])
        down_since = None
        for step, failing in events:
            if failing and down_since is not None:
                raise InputError(
                    f"--fail {rank}@{step} fails process {rank}, which failed in step {down_since} and is not "
                    f"repaired before; add --repair {rank}@STEP between them or drop one"
                )
            if not failing and down_since is None:
                raise InputError(
                    f"--repair {rank}@{step} repairs a process that has not failed before step {step}; "
                    f"add --fail {rank}@STEP first"
                )
            down_since = step if failing else None


def check_checkpoint_dir(folder: Path) -> None:
    """Refuse a --checkpoint-dir the run cannot write, or one holding checkpoints already: a
    fallback would load the newest, another run's (a later step, another plan) as this run's
    state. Creates nothing (``run_live`` does, once every check passed)."""
    import os

    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise InputError(f"--checkpoint-dir {folder} is not a folder; give a folder path")
    if folder.is_dir():
        old = sorted(p.name for p in folder.glob("step-*"))
        if old:
            raise InputError(
                f"--checkpoint-dir {folder} already holds checkpoints ({old[0]}, ...) that a fallback would load "
                "as this run's; give an empty or new folder"
            )
    existing = next(p for p in (folder.absolute(), *folder.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise InputError(f"--checkpoint-dir {folder}: {existing} is a file, not a folder; give a folder path")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise InputError(f"--checkpoint-dir {folder}: {existing} is not writable; pick another folder")


def run_live(plan, shrunk, fails, repairs, policy: str, spares: int, every: int, folder, timeout: float, quiet: bool):
    """Run live and return (Result, LiveRun); a run that cannot go on ends in one sentence (exit 1)."""
    from ntp_planner.cli.output import show_json, with_step_progress
    from ntp_planner.executor.elastic.faults import Fault, RecoveryFailure, Repair
    from ntp_planner.executor.elastic.launch import launch_live

    faults = tuple(Fault(r, s, h) for r, s, h in fails)
    fixes = tuple(Repair(r, s) for r, s, _ in repairs)
    tmp = None
    if every and folder is None:
        tmp = tempfile.mkdtemp(prefix="ntp-checkpoints-")
    elif folder is not None:
        try:
            folder.mkdir(parents=True, exist_ok=True)  # checked (``check_checkpoint_dir``) before
        except OSError as exc:
            raise InputError(f"cannot create --checkpoint-dir {folder}: {exc.strerror}; pick another folder") from None
    where = tmp or (str(folder) if folder is not None else "")
    try:

        def work(tick):
            return launch_live(plan, shrunk, policy, faults, fixes, spares, every, where, "gloo", timeout, tick)

        return with_step_progress(work, shrunk.spec.steps, quiet)
    except (RecoveryFailure, ValueError) as exc:
        if quiet:
            show_json({"passed": False, "failure": str(exc)})
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def validate_live(plan, shrunk_run, nproc, steps, timeout, tolerance, json_out, how) -> None:
    """`ntp validate --fail/--repair`: the live run, on this host or as one torchrun worker, its
    timeline and the comparison. ``shrunk_run(n, failures)``: validate's shrink of the plan to n
    processes (and its cuts), keeping the widths ``failures`` lost processes lead to."""
    from ntp_planner.cli.output import show, show_json
    from ntp_planner.executor.train.launch import under_torchrun
    from ntp_planner.views.validate import validate_json, validate_view

    fails, repairs, policy, spares, every, folder = how

    torchrun = under_torchrun()
    if not torchrun and any(how == "host" for *_, how in fails):
        raise InputError("--fail RANK@STEP:host loses a whole torchrun node; run it under torchrun, or use :kill")
    n = check_torchrun_live(nproc, repairs, spares, every, folder) if torchrun else (nproc or 16)
    shrunk, cuts = shrunk_run(n, len(fails))
    check_live(fails, repairs, policy, spares, steps, shrunk.spec.world_size, every, folder)
    if torchrun:
        got = run_live_torchrun(plan, shrunk, fails, policy, spares, every, folder, timeout, json_out)
        if got is None:
            return  # a worker other than rank 0: rank 0 coordinates and reports
        result, run = got
    else:
        result, run = run_live(plan, shrunk, fails, repairs, policy, spares, every, folder, timeout, json_out)
    # every layout the run reached had its cuts checked (a mismatch ends the run); all are shown
    seen = {(c["unit"], c["degree"]) for c in cuts}
    from ntp_planner.executor.check.cuts import LAYER_UNITS

    units = [*LAYER_UNITS, "vocab"]  # ``cuts.compare_cuts``'s order
    cuts = sorted([*cuts, *(c for c in run.cuts if (c["unit"], c["degree"]) not in seen)],
                  key=lambda c: (units.index(c["unit"]), c["degree"]))  # fmt: skip
    data = validate_json(shrunk, result, tolerance, "gloo", cuts, plan.model) | live_json(result, run, tolerance)
    if json_out:
        show_json(data)
    else:
        show(validate_view(plan, shrunk, result, tolerance, "gloo", cuts))
        show(timeline_view(run))
    if not data["passed"]:
        raise typer.Exit(1)


def check_torchrun_live(nproc, repairs, spares: int, every: int, folder) -> int:
    """The run's processes under torchrun (its workers less the spares); refuses, in one
    sentence each, what a torchrun live run cannot do."""
    import os

    world = int(os.environ["WORLD_SIZE"])
    if nproc is not None and nproc != world:
        raise InputError(f"--nproc {nproc} differs from torchrun's {world} processes; drop --nproc")
    if repairs:
        raise InputError(
            "under torchrun a repair is a process that joins the run: start `ntp validate PLAN --join "
            "HOST:PORT/RUN_ID` (rank 0 prints the address) instead of --repair"
        )
    if every and folder is None:
        raise InputError("under torchrun --checkpoint-every needs --checkpoint-dir, a folder every host reaches")
    if spares >= world:
        raise InputError(f"--spares {spares} leaves none of torchrun's {world} processes to train; lower --spares")
    return world - spares


def run_live_torchrun(plan, shrunk, fails, policy: str, spares: int, every: int, folder, timeout: float, quiet: bool):
    """Be one torchrun worker of a live run; rank 0 returns (Result, LiveRun), the others None. A
    run that cannot go on ends in one sentence (exit 1), said by the worker that saw it."""
    from ntp_planner.cli.output import show_json
    from ntp_planner.executor.elastic.faults import Fault, RecoveryFailure
    from ntp_planner.executor.elastic.torchrun import StoreLost, run_live_torchrun

    faults = tuple(Fault(r, s, h) for r, s, h in fails)
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)  # checked (``check_checkpoint_dir``) before
    try:
        say = lambda line: typer.echo(line, err=True)  # noqa: E731 - stderr even with --json: stdout is the JSON
        return run_live_torchrun(plan, shrunk, policy, faults, spares, every, str(folder or ""), timeout, say)
    except (RecoveryFailure, StoreLost, ValueError) as exc:
        if quiet:
            show_json({"passed": False, "failure": str(exc)})
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


def join_live(endpoint: str) -> None:
    """`ntp validate PLAN --join HOST:PORT/RUN_ID`: a repair of a torchrun live run."""
    from ntp_planner.executor.elastic.torchrun import StoreLost, join

    if not re.match(r"^[^:/\s]+:\d{1,5}(/[^/\s]+)?$", endpoint):
        raise InputError(f"--join {endpoint!r} is not HOST:PORT/RUN_ID; e.g. --join 10.0.0.1:29500/job7")
    _check_reachable(endpoint.split("/")[0])
    try:
        proc = join(endpoint)
    except (StoreLost, ValueError, RuntimeError) as exc:
        typer.echo(f"error: {str(exc).splitlines()[0]}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"joined as process {proc}; the run is over", err=True)


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """InputError unless HOST:PORT names a valid port on a host that resolves and accepts a TCP
    connection, said in one sentence before torch's store client (which retries for a minute
    and prints C++ traces) is asked to connect."""
    import socket

    host, port = address.rsplit(":", 1)
    if not 1 <= int(port) <= 65535:
        raise InputError(f"--join port {port} must be 1..65535, the port rank 0 printed (HOST:PORT/RUN_ID)")
    if len(host) > 253:
        raise InputError(f"--join host of {len(host)} characters is longer than a host name can be (253)")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except socket.gaierror:
        raise InputError(f"--join host {host!r} does not resolve; give the address rank 0 printed") from None
    except OSError as exc:
        raise InputError(
            f"nothing accepts connections at {host}:{port} ({exc.strerror or exc}); check that the run is still going"
        ) from None


def live_json(result, run, tolerance: float) -> dict:
    """What `ntp validate --fail ... --json` adds: the timeline, the samples log, the steps lost
    and the recovery costs the simulator takes (``ntp simulate --recovery-from``)."""
    from ntp_planner.executor.elastic.timeline import recovery_costs

    return {
        "timeline": run.timeline,
        "samples": [
            {k: r[k] for k in ("step", "generation", "loss", "consumed", "batch", "replicas")} for r in run.steps
        ],
        "lost_steps": [{k: r[k] for k in ("step", "generation", "loss", "consumed", "batch")} for r in run.lost],
        "layouts": run.layouts,
        "recovery_costs_s": recovery_costs(run.timeline),
        "steps_committed": len(run.steps),
    }


def _source(e: dict) -> str:
    """Where the state came from: 'memory', 'checkpoint 5' or 'initial weights'."""
    if e["source"] == "checkpoint":
        return f"checkpoint {e['redo_from'] - 1}"
    return "initial weights" if e["source"] == "init" else "memory"


def timeline_view(run):
    """The events of a live run (when, what, the layout after, where the state came from, the
    steps redone) and their recovery time by part; notes and the samples log under them."""
    from rich import box
    from rich.console import Group
    from rich.markup import escape
    from rich.table import Table

    events = Table(title="Recovery timeline", box=box.SIMPLE_HEAD)
    for col in ("step", "event", "processes", "layout after", "batch", "state from", "redone"):
        events.add_column(col, justify="right" if col in ("step", "batch") else "left")
    times = Table(title="Recovery time, s", box=box.SIMPLE_HEAD)
    parts = ("detect", "agree", "re-plan", "regroup", "move state", "redo", "total")
    keys = ("detect_s", "agree_s", "replan_s", "regroup_s", "move_state_s", "redo_s", "total_s")
    times.add_column("step", justify="right")
    for col in parts:
        times.add_column(col, justify="right")
    notes = []
    for e in run.timeline:
        redone = "none" if e["event"] in ("repair", "idle failure") else _steps(e["redo_from"], e["redo_to"])
        procs = ", ".join(map(str, e.get("procs", [])))
        events.add_row(str(e["step"]), e["event"], procs, escape(e["layout"]), str(e["batch"]), _source(e), redone)
        times.add_row(str(e["step"]), *("" if e.get(k) is None else f"{e[k]:.3f}" for k in keys))
        if e.get("note"):
            notes.append(f"step {e['step']}: {e['note']}")
        notes += [f"step {e['step']}: {why}" for why in e.get("replicas", [])]
    log = "; ".join(f"step {r['step']}: samples {r['consumed']}..{r['consumed'] + r['batch'] - 1}" for r in run.steps)
    lost = f" Rolled back: steps {', '.join(str(r['step']) for r in run.lost)}." if run.lost else ""
    return Group(events, times, *(escape(n) for n in notes), escape(f"Samples committed: {log}.{lost}"))


def _steps(first: int, last: int) -> str:
    return f"step {first}" if first == last else f"steps {first}-{last}"
