"""Every PNG ntp draws: the goodput simulation's three plots, its spares sweep and the failure sweep's loss curve.

matplotlib is an optional extra (``pip install 'ntp-planner[plot]'``): it is imported inside
each function, with the non-interactive Agg backend, so the rest of ntp runs without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ntp_planner.outputs import write_atomic, write_folder
from topologies.errors import InputError

if TYPE_CHECKING:
    from ntp_planner.failures.goodput import StrategyResult, Trace
    from ntp_planner.failures.sweep import SweepRow

SIMULATION_PLOTS = ("throughput_over_time.png", "goodput_distribution.png", "failed_fraction.png")
SMOOTH_H = 6  # moving average of the throughput plot: restarts every hour or two blur it otherwise


def _pyplot():
    """matplotlib.pyplot on the Agg backend, or InputError saying how to install it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("plots need matplotlib; install the extra: pip install 'ntp-planner[plot]'") from None
    return plt


def _png(plt, fig):
    """The function that writes ``fig`` as a PNG at a path (the file name need not end in .png)."""

    def write(path: Path) -> None:
        try:
            fig.tight_layout()
            fig.savefig(path, format="png")
        finally:
            plt.close(fig)

    return write


def plot_simulation(trace: Trace, results: dict[str, StrategyResult], folder, title: str) -> list[Path]:
    """Three PNGs in ``folder``: throughput over time (trial 0), goodput distribution over
    trials, failed share over time (trial 0)."""
    plt = _pyplot()
    folder = Path(folder)
    days = np.arange(len(trace.failed_fraction)) * trace.bin_h / 24
    pngs = {}

    def save(fig, name):
        pngs[name] = _png(plt, fig)

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    window = max(1, round(SMOOTH_H / trace.bin_h))
    kernel = np.ones(window) / window
    for s, series in trace.throughput.items():
        smooth = np.convolve(series, kernel, mode="valid")
        ax.plot(days[: len(smooth)], 100 * smooth, label=s, lw=1.2)
    ax.set(xlabel="day", ylabel="throughput (% of failure-free)", title=f"{title}: one trial, {SMOOTH_H}-hour average")
    ax.legend()
    ax.grid(alpha=0.3)
    save(fig, "throughput_over_time.png")
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    for s, values in trace.capacity_goodput.items():
        ax.hist(100 * values, bins=40, alpha=0.5, label=f"{s} (mean {100 * results[s].mean.capacity_goodput:.1f}%)")
    ax.set(xlabel="capacity-weighted goodput (%)", ylabel="trials", title=f"{title}: goodput over trials")
    ax.legend()
    save(fig, "goodput_distribution.png")
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    ax.plot(days, 100 * trace.failed_fraction, lw=1)
    ax.set(xlabel="day", ylabel="GPUs down (%)", title=f"{title}: failed share, one trial")
    ax.grid(alpha=0.3)
    save(fig, "failed_fraction.png")
    write_folder(folder, pngs)  # all three or none: drawn first, moved into place together
    return [folder / name for name in pngs]


def plot_sweep(rows: list[SweepRow], path, title: str) -> None:
    """Mean loss per policy against the failed fraction, with the p5-p95 band."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for policy in dict.fromkeys(r.policy for r in rows):
        mine = [r for r in rows if r.policy == policy]
        x = [100 * r.fraction for r in mine]
        ax.plot(x, [100 * r.mean_loss for r in mine], marker="o", label=policy)
        ax.fill_between(x, [100 * r.p5_loss for r in mine], [100 * r.p95_loss for r in mine], alpha=0.2)
    ax.set_xlabel("GPUs failed (%)")
    ax.set_ylabel("throughput loss (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    write_atomic(path, _png(plt, fig))


def plot_spares(rows: list[dict], path, title: str) -> None:
    """Per-GPU throughput (spares counted as GPUs paid for) and hours paused against the spare
    domains, one line per strategy: the NTP study's spares figure."""
    plt = _pyplot()
    path = Path(path)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6.5), dpi=120, sharex=True)
    for strategy in dict.fromkeys(r["strategy"] for r in rows):
        mine = sorted((r for r in rows if r["strategy"] == strategy), key=lambda r: r["spares"])
        k = [r["spares"] for r in mine]
        top.plot(k, [100 * r["gpu_throughput"] for r in mine], marker="o", label=strategy)
        top.fill_between(
            k, [100 * r["gpu_throughput_p5"] for r in mine], [100 * r["gpu_throughput_p95"] for r in mine], alpha=0.15
        )
        bottom.plot(k, [r["hours_paused"] for r in mine], marker="o", label=strategy)
    top.set(ylabel="throughput per GPU paid for (%)", title=title)
    bottom.set(xlabel="spare NVLink domains", ylabel="hours paused")
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
    top.legend()
    write_folder(path.parent, {path.name: _png(plt, fig)})  # the folder is made when missing
