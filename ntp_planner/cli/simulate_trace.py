"""`ntp simulate --trace FILE`, `--trace-out FILE`, `--trace-trial K`: replay a failure log instead
of random draws, and write the failures of one simulated trial in the same format
(``ntp_planner.failures.trace``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import typer

from ntp_planner.cli.options import given
from topologies.errors import InputError

TraceOpt = Annotated[
    Path | None,
    typer.Option(
        "--trace",
        help="Replay this failure log (CSV: time_h, unit gpu:G|host:H|domain:D, cause, optional repair_h) "
        "instead of random draws: one run, through every strategy.",
    ),
]
TraceOutOpt = Annotated[
    Path | None,
    typer.Option("--trace-out", help="Write one trial's failures (--trace-trial) as a trace CSV, for --trace."),
]
LAST_TRIAL = 999_999  # trials are numbered from 0, and --trials is at most 1,000,000
TraceTrialOpt = Annotated[
    int, typer.Option("--trace-trial", min=0, max=LAST_TRIAL, help="The trial --trace-out writes (0 = the first).")
]


# The options that shape random draws, and why a replay has no use for them: refused when given
# with --trace (the trace decides), so that nobody reads a replay as what they asked for.
NOT_FOR_A_REPLAY = {
    "start": ("--start", "the trace's negative times say what is in repair at the start"),
    "failure_dist": ("--failure-dist", "the trace's times are the arrivals"),
    "weibull_shape": ("--weibull-shape", "the trace's times are the arrivals"),
    "hw_blast": ("--hw-blast", "each line's unit (gpu:G, host:H, domain:D) says what a failure takes down"),
    "sw_blast": ("--sw-blast", "each line's unit (gpu:G, host:H, domain:D) says what a failure takes down"),
    "lemon_fraction": ("--lemon-fraction", "the trace's units say which hosts fail"),
    "lemon_factor": ("--lemon-factor", "the trace's units say which hosts fail"),
}


@dataclass
class TraceIO:
    """What the trace options ask of one simulation."""

    replay: Path | None
    out: Path | None
    trial: int
    source: object = None  # the event source handed to the simulator
    recorder: object = None
    settings: dict = field(default_factory=dict)


def check_trace_options(trace, trace_out, trace_trial: int, trials: int, inputs: list, ctx=None) -> TraceIO:
    """The options checked before any work: --trace-out may be written, --trace-trial is a trial
    the run simulates (a replay is one trial) and comes with --trace-out, no option that shapes random draws comes with
    --trace (``ctx``, the command's context, says which were given)."""
    from ntp_planner.outputs import check_output

    if trace is not None and ctx is not None:
        _refuse_draw_options(ctx, trials)
    runs = 1 if trace is not None else trials
    if trace_trial >= runs:
        what = "a replay is one trial, 0" if trace is not None else f"--trials {trials} numbers them 0..{runs - 1}"
        raise InputError(f"--trace-trial {trace_trial} is not a trial of this run: {what}")
    if trace_trial and trace_out is None:  # it would pick nothing: say so rather than ignore it
        raise InputError(f"--trace-trial {trace_trial} picks the trial --trace-out writes; give --trace-out FILE too")
    out = None if trace_out is None else check_output(trace_out, "--trace-out", [*inputs, trace], "trace.csv")
    return TraceIO(trace, out, trace_trial)


def check_apart(out: Path | None, plot: Path | None, pngs: list[str]) -> None:
    """--trace-out must be neither --plot's folder nor one of the plots in it: one write would
    fail after the trials or replace the other's file."""
    if out is None or plot is None or str(out) == "-":
        return
    folder = Path(plot).resolve()
    if out.resolve() == folder:
        raise InputError(f"--trace-out {out} is the folder --plot {plot} writes; give the trace another path")
    if out.name in pngs and out.parent.resolve() == folder:
        raise InputError(
            f"--trace-out {out} is the plot {out.name} that --plot {plot} writes; give the trace another path"
        )


# Options that shape only a part of the draws, and when that part is absent: refused when given
# (on the command line or from the environment) with it absent, so that nobody reads a table as
# shaped by an option the run ignored. option name -> (the test for "absent", why)
IDLE_WITHOUT = {
    "weibull_shape": (lambda p: p["failure_dist"] != "weibull", "it shapes --failure-dist weibull, not poisson"),
    "lemon_factor": (lambda p: p["lemon_fraction"] == 0, "it applies to lemon hosts and --lemon-fraction is 0"),
    "straggler_hours": (lambda p: p["straggler_rate"] == 0, "it applies to stragglers and --straggler-rate is 0"),
    "straggler_slowdown": (lambda p: p["straggler_rate"] == 0, "it applies to stragglers and --straggler-rate is 0"),
    "hw_repair_days": (lambda p: p["hw_share"] == 0, "it applies to hardware failures and --hw-share 0 has none"),
    "hw_blast": (lambda p: p["hw_share"] == 0, "it applies to hardware failures and --hw-share 0 has none"),
    "sw_repair_hours": (lambda p: p["hw_share"] == 1, "it applies to software failures and --hw-share 1 has none"),
    "sw_blast": (lambda p: p["hw_share"] == 1, "it applies to software failures and --hw-share 1 has none"),
}


def refuse_idle_options(ctx: typer.Context) -> None:
    """An option of ``IDLE_WITHOUT`` given while the draws it shapes are absent, in one sentence."""
    for name, (absent, why) in IDLE_WITHOUT.items():
        if given(ctx, name) and absent(ctx.params):
            option = "--" + name.replace("_", "-")
            raise InputError(f"{option} {ctx.params[name]} does nothing here: {why}; drop it")


def _refuse_draw_options(ctx: typer.Context, trials: int) -> None:
    """With --trace, refuse in one sentence an option given (on the command line or from the
    environment) that only shapes random draws (``NOT_FOR_A_REPLAY``), and --trials above 1: a
    replay is one run."""
    if given(ctx, "trials") and trials > 1:
        raise InputError(f"--trials {trials} does not apply to --trace: a replay is one run of the trace's failures")
    for name, (option, why) in NOT_FOR_A_REPLAY.items():
        if given(ctx, name):
            raise InputError(f"{option} does not apply to --trace: {why}")


def prepare(io: TraceIO, plan, cfg, seed: int):
    """``cfg`` for the run (one trial for a replay) and ``io`` with its event source: the trace's
    failures, drawn ones, either one recorded for --trace-out."""
    import numpy as np

    from ntp_planner.failures.events import draw_events
    from ntp_planner.failures.trace import Placement, Recorder, read_trace, replay

    source = draw_events
    if io.replay is not None:
        cfg = cfg.model_copy(update={"trials": 1})
        events = read_trace(io.replay, Placement.of(plan.cluster.build()), cfg, np.random.default_rng(seed))
        source = replay(events)
        io.settings["trace"] = trace_settings(io.replay, events, cfg.days * 24)
        io.settings["start"] = "trace"  # the trace, not --start, says what is in repair at the start
    if io.out is not None:
        source = io.recorder = Recorder(io.trial, source)
        io.settings["trace_out"] = {"path": str(io.out), "trial": io.trial}
    io.source = source
    return cfg, io


def trace_settings(path: Path, events, run_h: float) -> dict:
    """``settings.trace`` of a replay: the file, its failures during the run and the hours they
    span, the failures still in repair at the start (negative times), the hours replayed."""
    during = events.start_h[events.start_h >= 0]
    return {
        "path": str(path),
        "name": path.name,
        "failures": int(during.size),
        "in_repair_at_start": int(events.start_h.size - during.size),
        "first_failure_h": float(during.min()) if during.size else None,
        "last_failure_h": float(during.max()) if during.size else None,
        "run_h": run_h,
    }


def finish_trace(io: TraceIO, plan, cfg, seed: int, json_out: bool) -> None:
    """After the simulation: write the recorded trial's failures (--trace-out) through
    outputs.write_atomic, and say under the table where it went (the table says what was replayed)."""
    from ntp_planner.cli.output import show

    if io.recorder is not None:
        from ntp_planner.failures.trace import Placement, format_trace
        from ntp_planner.outputs import write_atomic

        origin = f"replay of {io.replay}" if io.replay is not None else f"trial {io.trial} of seed {seed}"
        note = f"{origin}, {cfg.days:g} days on {plan.cluster.num_gpus:,} GPUs"
        write_atomic(io.out, format_trace(io.recorder.kept, Placement.of(plan.cluster.build()), cfg.classes, note))
    if json_out:
        return
    if io.out is not None:
        show(f"trace of trial {io.trial} written to {io.out}")
