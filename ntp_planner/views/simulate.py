"""Goodput under failures: `ntp simulate`'s results, `ntp sweep`'s table and the spare-pool table.
Nothing here prints; the CLI does."""

from __future__ import annotations

from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text


def sweep_table(rows) -> Table:
    t = Table(title="Throughput loss over random failures (mean, p5, p95)")
    for col in ("policy", "failed", "mean loss", "p5", "p95"):
        t.add_column(col, justify="left" if col == "policy" else "right")
    for r in rows:
        t.add_row(r.policy, f"{r.fraction:.3%}", f"{r.mean_loss:.2%}", f"{r.p5_loss:.2%}", f"{r.p95_loss:.2%}")
    return t


def runs_title(cfg, trace: dict | None, what: str) -> str:
    """What a table is over: ``cfg.trials`` random trials, or the one replay of a trace file
    (``settings.trace``: its name, failures during the run, the hours they span).

    >>> from types import SimpleNamespace
    >>> runs_title(SimpleNamespace(days=54, trials=1), {"name": "t.csv", "failures": 419,
    ...     "first_failure_h": 0.3, "last_failure_h": 1291.46, "run_h": 1296}, "mean")
    'over 54 days (1,296 h), replay of t.csv: 419 failures at 0.3-1,291.5 h'
    >>> runs_title(SimpleNamespace(days=30, trials=1000), None, "mean [p5-p95]")
    'over 30 days, 1000 trials (mean [p5-p95])'
    """
    if trace is None:
        return f"over {cfg.days:g} days, {cfg.trials} trials ({what})"
    span = f" at {trace['first_failure_h']:,.1f}-{trace['last_failure_h']:,.1f} h" if trace["failures"] else ""
    return (
        f"over {cfg.days:g} days ({trace['run_h']:,g} h), replay of {trace['name']}: {trace['failures']} failures{span}"
    )


def simulation_table(results, cfg, sources: dict[str, str] | None = None, trace: dict | None = None) -> Group:
    """Goodput per strategy: over random trials (mean [p5-p95]), or a replay's one run (``trace``:
    ``settings.trace``), where a range would be one number twice."""
    t = Table(title=escape("Goodput " + runs_title(cfg, trace, "mean [p5-p95]")))
    for col in (
        "strategy",
        "goodput",
        "capacity goodput",
        "throughput loss",
        "hours paused",
        "interruptions",
        "spares needed",
        "idle GPU-h",
    ):
        t.add_column(col, justify="left" if col == "strategy" else "right")

    def spread(x: float, a: float, b: float, f: str, fx: str | None = None) -> str:
        fx = fx or f
        return escape(f"{x:{fx}}" if trace else f"{x:{fx}} [{a:{f}}-{b:{f}}]")

    for name, r in results.items():
        m, lo, hi = r.mean, r.p5, r.p95
        t.add_row(
            name,
            f"{m.goodput:.1%}",
            spread(m.capacity_goodput, lo.capacity_goodput, hi.capacity_goodput, ".1%"),
            f"{m.throughput_loss:.1%}",
            f"{m.hours_paused:.1f}",
            f"{m.interruptions:.0f}",
            spread(m.spares_needed, lo.spares_needed, hi.spares_needed, ".0f", ".0f" if trace else ".1f"),
            f"{m.idle_gpu_hours:,.0f}",
        )
    first = next(iter(results.values()))
    over = first.mean.time_over_threshold
    spares = "spares needed: fewest spare domains that keep a fixed batch without pausing"
    if trace is None:
        spares += "; worst trial: " + ", ".join(f"{name} {r.spares_needed_worst:.0f}" for name, r in results.items())
    return Group(t, Text(_simulation_footer(cfg, first.checkpoint_interval_s, over, sources, trace)), Text(spares))


def _failures_said(cfg, trace: dict | None) -> str:
    """Where the failures come from: the rate and start of the draws, or the trace (whose rate,
    if any, only set Daly's interval)."""
    if trace is None:
        return f"failures {cfg.failure_rate_per_gpu_hour:.3g} per GPU-hour, {cfg.start} start"
    rate = cfg.failure_rate_per_gpu_hour
    daly = "" if cfg.checkpoint_interval_s is not None else f" (Daly's interval for {rate:.3g} per GPU-hour)"
    return f"failures from the trace{daly}, {trace['in_repair_at_start']} in repair at the start"


def _simulation_footer(cfg, interval_s: float, over: float, sources: dict[str, str] | None, trace=None) -> str:
    """Checkpoints, recovery costs (and where they came from), failures, start, time over threshold."""
    src = sources or {}

    def cost(name: str, label: str) -> str:
        where = src.get(name, "default")
        return f"{label} {getattr(cfg, name):g} s" + (f" ({where})" if where != "default" else "")

    return (
        f"checkpoint every {interval_s / 60:.1f} min ({'Daly' if cfg.checkpoint_interval_s is None else 'fixed'}), "
        f"write {cfg.checkpoint_write_s:g} s; {cost('detection_s', 'detection')}, {cost('restart_s', 'restart')}, "
        f"{cost('reconfigure_s', 'reconfigure')}; {_failures_said(cfg, trace)}, "
        f"{cfg.spares} spare domains; {over:.1%} of the time more than "
        f"{cfg.down_threshold:.3g} of GPUs down" + ("; stragglers, if any, drawn" if trace else "")
    )


def pool_table(rows: list[dict], cfg, sources: dict[str, str] | None = None, trace: dict | None = None) -> Group:
    """The spares sweep: per-GPU throughput (spares counted as GPUs paid for), goodput and hours
    paused against the pool size, per strategy; over random trials or a replay (``trace``)."""
    t = Table(title=escape(f"Spare domains {runs_title(cfg, trace, 'mean')}, {cfg.batch} batch"))
    for col in ("spares", "strategy", "per-GPU throughput", "goodput", "capacity goodput", "hours paused"):
        t.add_column(col, justify="left" if col == "strategy" else "right")
    for r in rows:
        t.add_row(
            str(r["spares"]),
            r["strategy"],
            escape(
                f"{r['gpu_throughput']:.1%}"
                + ("" if trace else f" [{r['gpu_throughput_p5']:.1%}-{r['gpu_throughput_p95']:.1%}]")
            ),
            f"{r['goodput']:.1%}",
            f"{r['capacity_goodput']:.1%}",
            f"{r['hours_paused']:.1f}",
        )
    note = "per-GPU throughput: capacity goodput x job GPUs / (job GPUs + spare GPUs)"
    if any(r["strategy"] == "restart" for r in rows):
        note += "; restart restarts on replacement hardware and does not draw on the pool"
    src = sources or {}
    used = ", ".join(
        f"{k.removesuffix('_s')} {getattr(cfg, k):g} s ({src.get(k, 'default')})"
        for k in ("detection_s", "restart_s", "reconfigure_s")
    )
    start = (_failures_said(cfg, trace) + "; stragglers, if any, drawn") if trace else f"{cfg.start} start"
    return Group(t, Text(note), Text(f"{start}; recovery costs: {used}"))
