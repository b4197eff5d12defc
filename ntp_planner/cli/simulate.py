"""`ntp simulate`: the goodput of a whole run under failures, per fault-handling strategy."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, get_args

import typer

from ntp_planner.cli.failures import need_matplotlib
from ntp_planner.cli.options import (
    BatchModeOpt,
    Blast,
    FailureDist,
    JsonOpt,
    PlanArg,
    SeedOpt,
    Start,
    Strategy,
    parse_list,
)
from ntp_planner.cli.output import progress, show, show_json
from ntp_planner.cli.simulate_trace import (
    TraceOpt,
    TraceOutOpt,
    TraceTrialOpt,
    check_apart,
    check_trace_options,
    finish_trace,
    prepare,
    refuse_idle_options,
)
from ntp_planner.outputs import check_output_folder
from topologies.errors import InputError

# Upper (and lowest non-zero) bounds of the simulation's options; each mirrors SimConfig's field
# bound (ntp_planner.failures.simulator, spelled here so `ntp --help` imports no numpy; a test
# checks they agree).
MAX_DAYS = 1388  # SimConfig's 200,000 time bins of 600 s (its ten-year bound needs a coarser bin_s)
MAX_TRIALS = 1_000_000  # a million trials of a month is hours of work
MAX_RATE_PER_GPU_HOUR = 1.0  # every GPU failing every hour; Llama 3 saw 2e-5
MIN_RATE_PER_GPU_HOUR = 1e-12  # once per 10**8 GPU-years; below it a rate underflows the expected counts
MAX_SECONDS = 86_400  # a checkpoint write or a restart longer than a day is not a running job
MAX_INTERVAL_MIN = 525_600  # a year between checkpoints
MIN_INTERVAL_MIN = 1 / 60  # a checkpoint a second
MIN_SHAPE, MAX_SHAPE = 0.1, 10.0  # failure studies fit Weibull shapes of 0.5 to 1.5
MAX_HOURS = 8760  # a straggler episode lasting a year
MAX_SLOWDOWN = 100.0  # a job 100x slower is down, not slow
MAX_LEMON_FRACTION = 0.99  # SimConfig.lemon_host_fraction < 1, which typer's max cannot say
MAX_LEMON_FACTOR = 1000.0  # lemon hosts in studies fail 2-20x as often
MAX_REPAIR = {"--hw-repair-days": 365, "--sw-repair-hours": 8760}  # a repair of more than a year

DaysOpt = Annotated[
    float,
    typer.Option("--days", min=0, max=MAX_DAYS, help="Length of the run in days."),
]
TrialsOpt = Annotated[int, typer.Option("--trials", min=1, max=MAX_TRIALS, help="Monte-Carlo trials.")]
StrategiesOpt = Annotated[
    str, typer.Option("--strategies", help="Comma-separated: restart, dp-drop, spares, ntp, ntp-pw.")
]
RateOpt = Annotated[
    float | None,
    typer.Option(
        "--failure-rate",
        min=0,
        max=MAX_RATE_PER_GPU_HOUR,
        help=f"Failures per GPU-hour, 0 or {MIN_RATE_PER_GPU_HOUR:g} or more (default: Llama 3's 1.97e-5).",
    ),
]
HwRepairOpt = Annotated[
    str, typer.Option("--hw-repair-days", help="Hardware repair, days: a number or a range, 3-5; at most 365.")
]
SwRepairOpt = Annotated[
    str, typer.Option("--sw-repair-hours", help="Software repair, hours: a number or a range; at most 8760.")
]
HwShareOpt = Annotated[float, typer.Option("--hw-share", min=0, max=1, help="Share of failures that are hardware.")]
IntervalOpt = Annotated[
    str,
    typer.Option(
        "--checkpoint-interval", help=f"auto (Daly's optimum) or minutes, at most {MAX_INTERVAL_MIN:,} (a year)."
    ),
]
WriteOpt = Annotated[
    float,
    typer.Option("--checkpoint-write-s", min=0, max=MAX_SECONDS, help="Checkpoint write, s."),
]
RestartOpt = Annotated[
    float | None,
    typer.Option(
        "--restart-s",
        min=0,
        max=MAX_SECONDS,
        help="Restart overhead, s (default 600, or --recovery-from's).",
    ),
]
RecoveryOpt = Annotated[
    Path | None,
    typer.Option(
        "--recovery-from",
        help='JSON whose "recovery_costs_s" (detection_s, reconfigure_s, restart_s) replace the defaults, '
        "e.g. the output of ntp validate --json.",
    ),
]
SimSparesOpt = Annotated[
    str,
    typer.Option(
        "--spares",
        help="Idle spare NVLink domains every elastic strategy draws on; a list (0,8,16) sweeps them.",
    ),
]
StartOpt = Annotated[Start, typer.Option("--start", help="steady: failures already in repair at t = 0; healthy: none.")]
DistOpt = Annotated[
    FailureDist, typer.Option("--failure-dist", help="Failure arrivals: poisson, or weibull (renewal).")
]
ShapeOpt = Annotated[
    float,
    typer.Option("--weibull-shape", min=MIN_SHAPE, max=MAX_SHAPE, help="Weibull shape; < 1 is bursty."),
]
HwBlastOpt = Annotated[Blast, typer.Option("--hw-blast", help="What a hardware failure takes down.")]
SwBlastOpt = Annotated[Blast, typer.Option("--sw-blast", help="What a software failure takes down.")]
StragglerRateOpt = Annotated[
    float,
    typer.Option(
        "--straggler-rate",
        min=0,
        max=MAX_RATE_PER_GPU_HOUR,
        help=f"Straggler episodes per GPU-hour, 0 (none) or {MIN_RATE_PER_GPU_HOUR:g} or more.",
    ),
]
StragglerHoursOpt = Annotated[
    float,
    typer.Option("--straggler-hours", min=0, max=MAX_HOURS, help="Episode length, hours."),
]
SlowdownOpt = Annotated[
    float,
    typer.Option("--straggler-slowdown", min=1, max=MAX_SLOWDOWN, help="Job slowdown during an episode."),
]
ThresholdOpt = Annotated[
    float,
    typer.Option(
        "--down-threshold",
        min=0,
        max=1,
        help="Report the time more than this share of GPUs is down.",
    ),
]
LemonFractionOpt = Annotated[
    float,
    typer.Option(
        "--lemon-fraction",
        min=0,
        max=MAX_LEMON_FRACTION,
        help="Share of lemon hosts, below 1 (were every host a lemon, none would fail more often than the rest).",
    ),
]
LemonFactorOpt = Annotated[
    float,
    typer.Option("--lemon-factor", min=1, max=MAX_LEMON_FACTOR, help="How much more often lemons fail."),
]
SimPlotOpt = Annotated[Path | None, typer.Option("--plot", help="Folder for PNG plots.")]


def simulate(
    ctx: typer.Context,
    plan_file: PlanArg,
    days: DaysOpt = 30,
    trials: TrialsOpt = 1000,
    strategies: StrategiesOpt = "restart,dp-drop,spares,ntp,ntp-pw",
    failure_rate: RateOpt = None,
    hw_repair_days: HwRepairOpt = "3-5",
    sw_repair_hours: SwRepairOpt = "3",
    hw_share: HwShareOpt = 0.78,
    checkpoint_interval: IntervalOpt = "auto",
    checkpoint_write_s: WriteOpt = 300,
    restart_s: RestartOpt = None,
    recovery_from: RecoveryOpt = None,
    spares: SimSparesOpt = "0",
    start: StartOpt = "steady",
    batch: BatchModeOpt = "flexible",
    failure_dist: DistOpt = "poisson",
    weibull_shape: ShapeOpt = 0.7,
    hw_blast: HwBlastOpt = "gpu",
    sw_blast: SwBlastOpt = "gpu",
    straggler_rate: StragglerRateOpt = 0.0,
    straggler_hours: StragglerHoursOpt = 0.4,
    straggler_slowdown: SlowdownOpt = 1.3,
    down_threshold: ThresholdOpt = 0.001,
    lemon_fraction: LemonFractionOpt = 0.0,
    lemon_factor: LemonFactorOpt = 1.0,
    seed: SeedOpt = 0,
    plot: SimPlotOpt = None,
    trace: TraceOpt = None,
    trace_out: TraceOutOpt = None,
    trace_trial: TraceTrialOpt = 0,
    json_out: JsonOpt = False,
) -> None:
    """Goodput of the run under failures, per fault-handling strategy (Monte Carlo).

    \b
    Example: ntp simulate plan.json --days 30 --trials 1000 \\
               --strategies restart,ntp,ntp-pw --plot out/
    Replay a log: ntp simulate plan.json --days 54 \\
               --trace examples/llama3_trace.csv
    """
    import numpy as np

    from ntp_planner.failures.sim_config import LLAMA3_RATE_PER_GPU_HOUR, SimConfig, check_pool_sweep
    from ntp_planner.failures.simulator import simulate as run_simulation
    from ntp_planner.plan import Plan
    from ntp_planner.views.plots import plot_simulation

    names = parse_list(strategies, "--strategies", str, "restart,ntp", choices=get_args(Strategy))
    pools = parse_list(spares, "--spares", int, "0,8,16")
    costs, sources = _recovery_costs(recovery_from, restart_s)
    repair = (
        _hours_range(hw_repair_days, "--hw-repair-days", 24),
        _hours_range(sw_repair_hours, "--sw-repair-hours", 1),
    )
    cfg = SimConfig(
        days=days,
        trials=trials,
        failure_rate_per_gpu_hour=LLAMA3_RATE_PER_GPU_HOUR if failure_rate is None else failure_rate,
        classes=_failure_classes(hw_share, repair, (hw_blast, sw_blast)),
        checkpoint_interval_s=_interval_s(checkpoint_interval),
        checkpoint_write_s=checkpoint_write_s,
        **costs,
        spares=pools[0],
        start=start,
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
    check_pool_sweep(pools, cfg, len(names))
    io = check_trace_options(trace, trace_out, trace_trial, trials, [plan_file, recovery_from], ctx)
    refuse_idle_options(ctx)
    need_matplotlib(plot)
    if plot is not None:
        from ntp_planner.views.plots import SIMULATION_PLOTS

        pngs = ["spares.png"] if len(pools) > 1 else list(SIMULATION_PLOTS)
        check_output_folder(plot, "--plot", pngs, [plan_file, recovery_from, trace])  # before the trials
        check_apart(io.out, plot, pngs)
    p = Plan.load(plan_file)
    cfg, io = prepare(io, p, cfg, seed)
    settings = {**_settings_json(cfg, sources, recovery_from), **io.settings}
    title = f"{p.model.name} on {p.cluster.num_gpus} GPUs"
    if len(pools) > 1:
        _simulate_pools(p, cfg, names, pools, seed, plot, json_out, settings, title, io.source)
        return finish_trace(io, p, cfg, seed, json_out)
    with progress("trials", cfg.trials, json_out) as advance:
        results, series = run_simulation(p, cfg, names, np.random.default_rng(seed), progress=advance, source=io.source)
    if plot is not None:
        plot_simulation(series, results, plot, title)
    _show_simulation(p, results, cfg, sources, settings, json_out)
    if plot is not None and not json_out:
        show(f"plots written to {plot}/")
    finish_trace(io, p, cfg, seed, json_out)


def _show_simulation(plan, results, cfg, sources, settings, json_out) -> None:
    """The goodput per strategy, after the model's size: as JSON or as a table."""
    from ntp_planner.views.model import params_json, params_line

    if json_out:
        show_json({**params_json(plan.model), **{s: _result_json(r) for s, r in results.items()}, "settings": settings})
        return
    from ntp_planner.views.simulate import simulation_table

    show(params_line(plan.model))
    show(simulation_table(results, cfg, sources, settings.get("trace")))


def _simulate_pools(plan, cfg, names, pools, seed, plot, json_out, settings, title, source) -> None:
    """One simulation per pool size, each on the same failures (the same seed): per-GPU
    throughput, hours paused and goodput against the spare domains."""
    import numpy as np

    from ntp_planner.failures.simulator import pool_rows
    from ntp_planner.failures.simulator import simulate as run_simulation

    runs = {}
    with progress("trials", cfg.trials * len(pools), json_out) as advance:
        for k in pools:
            k_cfg = cfg.model_copy(update={"spares": k})
            runs[k], _ = run_simulation(
                plan, k_cfg, names, np.random.default_rng(seed), progress=advance, source=source
            )
    from ntp_planner.views.model import params_json, params_line

    rows = pool_rows(plan, runs)
    if plot is not None:
        from ntp_planner.views.plots import plot_spares

        plot_spares(rows, Path(plot) / "spares.png", title)
    if json_out:
        show_json({**params_json(plan.model), "spares_sweep": rows, "settings": settings})
        return
    from ntp_planner.views.simulate import pool_table

    show(params_line(plan.model))
    show(pool_table(rows, cfg, settings["recovery_sources"], settings.get("trace")))
    if plot is not None:
        show(f"plot written to {Path(plot) / 'spares.png'}")


def _recovery_costs(path: Path | None, restart_s: float | None) -> tuple[dict[str, float], dict[str, str]]:
    """detection_s, reconfigure_s and restart_s for SimConfig, and where each came from."""
    from ntp_planner.failures.recovery_costs import COSTS, load_recovery_costs, resolve
    from ntp_planner.failures.sim_config import SimConfig

    defaults = {k: SimConfig.model_fields[k].default for k in COSTS}
    return resolve(defaults, load_recovery_costs(path) if path else {}, {"restart_s": restart_s})


def _settings_json(cfg, sources: dict[str, str], recovery_from: Path | None) -> dict:
    return {
        "start": cfg.start,
        "batch": cfg.batch,
        "recovery_costs_s": {k: getattr(cfg, k) for k in sources},
        "recovery_sources": sources,
        "recovery_from": None if recovery_from is None else str(recovery_from),
    }


def _hours_range(text: str, option: str, scale: float) -> tuple[float, float]:
    """'3-5' -> (3, 5) and '3' -> (3, 3), times ``scale`` (days -> hours).

    >>> _hours_range("3-5", "--hw-repair-days", 24)
    (72.0, 120.0)
    """
    try:
        parts = [float(x) for x in text.split("-")] if not text.startswith("-") else [float(text)]
    except ValueError:
        raise InputError(f"{option} {text!r} must be a number or a range like 3-5") from None
    lo, hi = parts[0], parts[-1]
    if not (0 <= lo <= MAX_REPAIR[option] and 0 <= hi <= MAX_REPAIR[option]) or len(parts) > 2:
        raise InputError(
            f"{option} {text!r} must be a number or a range like 3-5, each in 0..{MAX_REPAIR[option]} (a year)"
        )
    if hi < lo:
        raise InputError(f"{option} {text!r} is reversed; write the smaller bound first")
    return lo * scale, hi * scale


def _failure_classes(hw_share: float, repair_h: tuple, blasts: tuple[str, str]) -> tuple:
    """Hardware failures (``hw_share`` of them) and software failures (the rest, if any)."""
    from ntp_planner.failures.sim_config import FailureClass

    (hw_lo, hw_hi), (sw_lo, sw_hi) = repair_h
    classes = []
    if hw_share > 0:  # --hw-share 0: software failures only
        classes.append(
            FailureClass(name="hardware", share=hw_share, repair_min_h=hw_lo, repair_max_h=hw_hi, blast=blasts[0])
        )
    if hw_share < 1:
        classes.append(
            FailureClass(name="software", share=1 - hw_share, repair_min_h=sw_lo, repair_max_h=sw_hi, blast=blasts[1])
        )
    return tuple(classes)


def _interval_s(text: str) -> float | None:
    """--checkpoint-interval in seconds: None for auto (Daly's optimum), else minutes x 60."""
    if text == "auto":
        return None
    try:
        minutes = float(text)
    except ValueError:
        raise InputError(f"--checkpoint-interval {text!r} must be auto or minutes") from None
    if not MIN_INTERVAL_MIN <= minutes <= MAX_INTERVAL_MIN:  # also refuses nan and inf
        raise InputError(
            f"--checkpoint-interval {text} must be auto or minutes from 1/60 (a second) "
            f"to {MAX_INTERVAL_MIN:,} (a year)"
        )
    return minutes * 60


def _result_json(r) -> dict:
    return {
        **r.mean.model_dump(),
        "p5": r.p5.model_dump(),
        "p95": r.p95.model_dump(),
        "checkpoint_interval_s": r.checkpoint_interval_s,
        "spares_needed_worst": r.spares_needed_worst,
    }
