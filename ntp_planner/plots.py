"""Every PNG ntp draws: the goodput simulation's three plots, its spares sweep and the failure sweep's loss curve.

matplotlib is an optional extra (``pip install 'ntp-planner[plot]'``): it is imported inside
each function, with the non-interactive Agg backend, so the rest of ntp runs without it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from topologies.errors import InputError

if TYPE_CHECKING:
    from ntp_planner.failures.goodput import StrategyResult, Trace
    from ntp_planner.failures.sweep import SweepRow

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


def check_plot_path(path) -> Path:
    """``path`` as a Path if a PNG can be written there, else InputError (before any work)."""
    from ntp_planner.plan import check_writable

    return check_writable(path, "plot", "plot.png")


def _save(plt, fig, path) -> None:
    """Write ``fig`` to ``path`` through a temporary file and a rename: never half a PNG."""
    path = check_plot_path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".png", dir=path.parent)
    os.close(fd)
    try:
        fig.tight_layout()
        fig.savefig(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        plt.close(fig)


def plot_simulation(trace: Trace, results: dict[str, StrategyResult], folder, title: str) -> list[Path]:
    """Three PNGs in ``folder``: throughput over time (trial 0), goodput distribution over
    trials, failed share over time (trial 0)."""
    plt = _pyplot()
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot make the plot folder {folder}: {exc.strerror.lower()}; pick another") from None
    days = np.arange(len(trace.failed_fraction)) * trace.bin_h / 24
    paths = []

    def save(fig, name):
        _save(plt, fig, folder / name)
        paths.append(folder / name)

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
    return paths


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
    _save(plt, fig, path)


def plot_spares(rows: list[dict], path, title: str) -> None:
    """Per-GPU throughput (spares counted as GPUs paid for) and hours paused against the spare
    domains, one line per strategy: the NTP study's spares figure."""
    plt = _pyplot()
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot make the plot folder {path.parent}: {exc.strerror.lower()}; pick another") from None
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
    _save(plt, fig, path)
