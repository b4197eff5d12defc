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


def simulation_table(results, cfg, sources: dict[str, str] | None = None) -> Group:
    t = Table(title=escape(f"Goodput over {cfg.days:g} days, {cfg.trials} trials (mean [p5-p95])"))
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
    for name, r in results.items():
        m, lo, hi = r.mean, r.p5, r.p95
        t.add_row(
            name,
            f"{m.goodput:.1%}",
            escape(f"{m.capacity_goodput:.1%} [{lo.capacity_goodput:.1%}-{hi.capacity_goodput:.1%}]"),
            f"{m.throughput_loss:.1%}",
            f"{m.hours_paused:.1f}",
            f"{m.interruptions:.0f}",
            escape(f"{m.spares_needed:.0f} [{lo.spares_needed:.0f}-{hi.spares_needed:.0f}]"),
            f"{m.idle_gpu_hours:,.0f}",
        )
    first = next(iter(results.values()))
    worst = ", ".join(f"{name} {r.spares_needed_worst:.0f}" for name, r in results.items())
    return Group(
        t,
        Text(_simulation_footer(cfg, first.checkpoint_interval_s, first.mean.time_over_threshold, sources)),
        Text(f"spares needed: fewest spare domains that keep a fixed batch without pausing; worst trial: {worst}"),
    )


def _simulation_footer(cfg, interval_s: float, over: float, sources: dict[str, str] | None) -> str:
    """Checkpoints, recovery costs (and where they came from), failures, start, time over threshold."""
    src = sources or {}

    def cost(name: str, label: str) -> str:
        where = src.get(name, "default")
        return f"{label} {getattr(cfg, name):g} s" + (f" ({where})" if where != "default" else "")

    return (
        f"checkpoint every {interval_s / 60:.1f} min ({'Daly' if cfg.checkpoint_interval_s is None else 'fixed'}), "
        f"write {cfg.checkpoint_write_s:g} s; {cost('detection_s', 'detection')}, {cost('restart_s', 'restart')}, "
        f"{cost('reconfigure_s', 'reconfigure')}; failures {cfg.failure_rate_per_gpu_hour:.3g} per GPU-hour, "
        f"{cfg.start} start, {cfg.spares} spare domains; {over:.1%} of the time more than "
        f"{cfg.down_threshold:.3g} of GPUs down"
    )


def pool_table(rows: list[dict], cfg, sources: dict[str, str] | None = None) -> Group:
    """The spares sweep: per-GPU throughput (spares counted as GPUs paid for), goodput and hours
    paused against the pool size, per strategy."""
    t = Table(title=escape(f"Spare domains over {cfg.days:g} days, {cfg.trials} trials, {cfg.batch} batch (mean)"))
    for col in ("spares", "strategy", "per-GPU throughput", "goodput", "capacity goodput", "hours paused"):
        t.add_column(col, justify="left" if col == "strategy" else "right")
    for r in rows:
        t.add_row(
            str(r["spares"]),
            r["strategy"],
            escape(f"{r['gpu_throughput']:.1%} [{r['gpu_throughput_p5']:.1%}-{r['gpu_throughput_p95']:.1%}]"),
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
    return Group(t, Text(note), Text(f"{cfg.start} start; recovery costs: {used}"))
