"""`ntp capacity`'s answer: the cheapest candidate meeting the deadline, the time/cost front, why
the others lost; and its two plots. Nothing here prints; the CLI does."""

from __future__ import annotations

from pathlib import Path

from rich.console import Group
from rich.markup import escape
from rich.table import Table

from ntp_planner.failures.capacity_front import usd
from ntp_planner.failures.capacity_spec import Candidate, CapacityResult, CapacitySpec

COLUMNS = ("cluster", "GPUs", "spares", "strategy", "layout", "P50 d", "P90 d", "P(deadline)", "GPU-hours", "cost")


def hours(x: float) -> str:
    """GPU-hours, like ``usd``: 10.17M, 1.2k, 35; unbounded when a trial never finished."""
    if x == float("inf"):
        return "unbounded"
    return f"{x / 1e6:,.2f}M" if x >= 1e6 else f"{x / 1e3:,.1f}k" if x >= 1e3 else f"{x:,.0f}"


def _row(c: Candidate) -> list[str]:
    return [
        c.cluster,
        f"{c.gpus:,}",
        str(c.spares),
        c.strategy,
        c.layout or "",
        f"{c.p50_days:.1f}",
        f"{c.p90_days:.1f}",
        f"{c.p_deadline:.0%}",
        hours(c.gpu_hours),
        usd(c.cost_usd),
    ]


def capacity_view(result: CapacityResult, spec: CapacitySpec, model: str, prices: dict[str, dict]) -> Group:
    """The answer, the front, the losers (one line per cluster and GPU count) and the prices."""
    head = (
        f"{model}: {spec.tokens:.3g} tokens by day {spec.deadline_days:g} with {spec.confidence:.0%} confidence; "
        f"{len(result.candidates)} candidates, {result.simulated} simulated ({spec.trials} trials each, the same "
        f"failures for all)"
    )
    if result.cheapest is None:
        answer = "No candidate meets the deadline at that confidence: see why each lost below."
    else:
        c = result.cheapest
        answer = (
            f"Cheapest meeting it: {c.label} ({c.layout}): P50 {c.p50_days:.1f} days, P90 {c.p90_days:.1f}, "
            f"done in time in {c.p_deadline:.0%} of trials, {hours(c.gpu_hours)} GPU-hours "
            f"({c.paid_gpus:,} GPUs paid for), {usd(c.cost_usd)}"
        )
    front = Table(title=escape(f"Time/cost front (time at {spec.confidence:.0%} confidence, mean cost)"))
    for col in COLUMNS:
        front.add_column(col, justify="left" if col in ("cluster", "strategy", "layout") else "right")
    for c in result.front:
        front.add_row(*(escape(x) for x in _row(c)))
    lost = Table(title="Why the others lost (per cluster and GPU count: how many, and the closest one's reason)")
    for col in ("cluster", "GPUs", "lost", "reason"):
        lost.add_column(col, justify="right" if col in ("GPUs", "lost") else "left")
    for (cluster, gpus), reasons in _losers(result).items():
        lost.add_row(cluster, f"{gpus:,}", str(len(reasons)), escape(reasons[0]))
    price = "; ".join(f"{n} ${p['usd_per_gpu_hour']:.2f}/GPU-h ({p['source']})" for n, p in prices.items())
    parts = [escape(head), escape(answer), *([front] if result.front else []), lost]
    return Group(*parts, escape(f"Prices: {price}"))


def _losers(result: CapacityResult) -> dict[tuple[str, int], list[str]]:
    """Reasons of the candidates off the front, per cluster and GPU count, the one that came
    closest first (the fastest: at the confidence if simulated, else failure-free)."""
    out: dict[tuple[str, int], list[str]] = {}
    ranked = sorted(
        (c for c in result.candidates if c.verdict == "lost"),
        key=lambda c: (c.days_at_confidence or c.failure_free_days or float("inf"), c.cost_usd or 0.0),
    )
    for c in ranked:
        spares = f"{c.spares} spare{'s' if c.spares != 1 else ''}"
        out.setdefault((c.cluster, c.gpus), []).append(f"{spares}, {c.strategy}: {c.reason}")
    return dict(sorted(out.items()))


def plot_capacity(result: CapacityResult, spec: CapacitySpec, folder, title: str) -> list[Path]:
    """Two PNGs in ``folder``: the best probability of meeting the deadline against GPUs, one line
    per cluster (over its spare counts and strategies; a count too slow even without failures
    has 0, one pruned as dominated is left out); and time against cost of every simulated
    candidate with the front."""
    from ntp_planner.outputs import write_folder
    from ntp_planner.views.plots import _png, _pyplot

    plt = _pyplot()
    folder = Path(folder)
    pngs = {
        "deadline_probability.png": _png(plt, _deadline_plot(plt, result, spec, title)),
        "front.png": _png(plt, _front_plot(plt, result, spec, title)),
    }
    write_folder(folder, pngs)
    return [folder / name for name in pngs]


def _deadline_plot(plt, result: CapacityResult, spec: CapacitySpec, title: str):
    """The best P(deadline) of each cluster's GPU counts, against the confidence asked for."""
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    for cluster in dict.fromkeys(c.cluster for c in result.candidates):
        best: dict[int, float] = {}
        for c in result.candidates:
            if c.cluster == cluster and c.p_deadline is not None:
                best[c.gpus] = max(best.get(c.gpus, 0.0), c.p_deadline)
        xs = sorted(best)
        ax.plot(xs, [100 * best[x] for x in xs], marker="o", label=cluster)
    ax.axhline(100 * spec.confidence, color="grey", ls="--", lw=1, label=f"confidence {spec.confidence:.0%}")
    ax.set(xlabel="GPUs", ylabel=f"P(trained by day {spec.deadline_days:g}) (%)", title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    return fig


def _front_plot(plt, result: CapacityResult, spec: CapacitySpec, title: str):
    """Time at the confidence against mean cost of every simulated candidate, and the front."""
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    for cluster in dict.fromkeys(c.cluster for c in result.candidates):
        mine = [c for c in result.candidates if c.cluster == cluster and c.days_at_confidence is not None]
        ax.scatter(
            [c.days_at_confidence for c in mine], [c.cost_usd / 1e6 for c in mine], s=12, alpha=0.6, label=cluster
        )
    ax.plot(
        [c.days_at_confidence for c in result.front],
        [c.cost_usd / 1e6 for c in result.front],
        "k-o",
        ms=4,
        label="front",
    )
    ax.axvline(spec.deadline_days, color="grey", ls="--", lw=1, label="deadline")
    ax.set(xlabel=f"days to train at {spec.confidence:.0%} confidence", ylabel="mean cost (M$)", title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    return fig
