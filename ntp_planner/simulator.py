"""Goodput of a training run under failures: a seeded Monte-Carlo simulation, vectorised over
trials.

Failures arrive per GPU as a Poisson process (default rate from Llama 3: 419 unexpected
interruptions / (16,384 GPUs x 54 days) = 1.97e-5 per GPU-hour). Each belongs to a class with
its share, a uniform repair time and a blast radius (default: 78% hardware repaired in 3-5 days,
22% software repaired in 3 hours, one GPU each). A share of hosts may be lemons that fail k
times more often. The run starts in steady state (failures from before time 0 that are still
in repair count as down). Time is cut into bins; the number of failed GPUs in each bin sets the
throughput through the NTP re-planning code (``Replanner``), computed once per count and cached.
The state assumes failed GPUs sit in distinct NVLink domains (collisions are rare at the
fractions that matter).

Strategies:
- ``restart``: synchronous checkpoint-restart; every failure costs detection + restart + the
  work since the last checkpoint; the job continues on a spare at full speed.
- ``dp-drop``, ``spares``, ``ntp``, ``ntp-pw``: the job reconfigures (detection +
  reconfiguration on a failure, reconfiguration when a repaired GPU rejoins), keeps its state
  from the surviving replicas (no rollback) and runs at the re-planned throughput.
Every strategy pays checkpoint writes: interval / (interval + write) of the time is productive.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ntp_planner.checkpoint import daly_interval_s
from ntp_planner.plan import Plan
from ntp_planner.replan import Replanner

STRATEGIES = ("restart", "dp-drop", "spares", "ntp", "ntp-pw")
LLAMA3_RATE_PER_GPU_HOUR = 419 / (16384 * 54 * 24)


class FailureClass(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    share: float = Field(gt=0, le=1, description="Share of failures in this class.")
    repair_min_h: float = Field(ge=0, description="Shortest repair, hours.")
    repair_max_h: float = Field(ge=0, description="Longest repair, hours (uniform in between).")

    @model_validator(mode="after")
    def _check(self) -> FailureClass:
        if self.repair_max_h < self.repair_min_h:
            raise ValueError(f"{self.name} repair range {self.repair_min_h}-{self.repair_max_h} h is reversed")
        return self

    @property
    def mean_repair_h(self) -> float:
        return (self.repair_min_h + self.repair_max_h) / 2


DEFAULT_CLASSES = (
    FailureClass(name="hardware", share=0.78, repair_min_h=72, repair_max_h=120),
    FailureClass(name="software", share=0.22, repair_min_h=3, repair_max_h=3),
)


class SimConfig(BaseModel):
    """Inputs of a simulation besides the plan."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    days: float = Field(default=30, gt=0, description="Length of the run.")
    trials: int = Field(default=1000, ge=1, description="Independent runs simulated.")
    failure_rate_per_gpu_hour: float = Field(default=LLAMA3_RATE_PER_GPU_HOUR, ge=0)
    classes: tuple[FailureClass, ...] = DEFAULT_CLASSES
    lemon_host_fraction: float = Field(default=0.0, ge=0, lt=1, description="Share of hosts that are lemons.")
    lemon_factor: float = Field(default=1.0, ge=1, description="How much more often a lemon host fails.")
    checkpoint_interval_s: float | None = Field(default=None, gt=0, description="None = Daly's optimum.")
    checkpoint_write_s: float = Field(default=300, ge=0)
    restart_s: float = Field(default=600, ge=0, description="Restart overhead of checkpoint-restart.")
    detection_s: float = Field(default=60, ge=0, description="Time to notice a failure.")
    reconfigure_s: float = Field(default=180, ge=0, description="Elastic reconfiguration (drop, NTP, rejoin).")
    spares: int = Field(default=0, ge=0, description="Idle spare NVLink domains (strategy spares).")
    batch: str = Field(default="flexible", pattern="^(flexible|fixed)$")
    bin_s: float = Field(default=600, gt=0, description="Time resolution of the failure state.")
    down_threshold: float = Field(default=0.001, ge=0, description="Report time with more than this share down.")

    @model_validator(mode="after")
    def _check(self) -> SimConfig:
        total = sum(c.share for c in self.classes)
        if abs(total - 1) > 1e-9:
            raise ValueError(f"failure class shares sum to {total:g}, not 1")
        return self

    @property
    def mean_repair_h(self) -> float:
        return sum(c.share * c.mean_repair_h for c in self.classes)


class StrategyStats(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    goodput: float = Field(description="Productive time / wall time (Google's time-based goodput).")
    capacity_goodput: float = Field(description="Useful samples / samples of a failure-free run.")
    ettr: float = Field(description="Effective training time ratio (Meta).")
    throughput_loss: float = Field(description="1 - capacity_goodput.")
    hours_paused: float
    interruptions: float = Field(description="Failures that stopped or reconfigured the job.")
    restarts: float
    reconfigurations: float
    spares_needed: float = Field(description="Spare domains for pause-free training with a fixed batch.")
    idle_gpu_hours: float
    time_over_threshold: float = Field(description="Share of time with more than down_threshold of GPUs down.")


class StrategyResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    mean: StrategyStats
    p5: StrategyStats
    p95: StrategyStats
    checkpoint_interval_s: float


@dataclass
class Events:
    """All failures of all trials, flattened."""

    trial: np.ndarray  # trial index
    start_h: np.ndarray  # failure time (hours; negative = before the run)
    end_h: np.ndarray  # repair time
    gpu: np.ndarray


def draw_events(cfg: SimConfig, num_gpus: int, gpus_per_host: int, rng: np.random.Generator) -> Events:
    """Poisson failures over [-longest repair, run length) for every trial."""
    warm = max(c.repair_max_h for c in cfg.classes)
    span = cfg.days * 24 + warm
    counts = rng.poisson(cfg.failure_rate_per_gpu_hour * num_gpus * span, size=cfg.trials)
    n = int(counts.sum())
    trial = np.repeat(np.arange(cfg.trials), counts)
    start = rng.uniform(-warm, cfg.days * 24, size=n)
    cls = rng.choice(len(cfg.classes), size=n, p=[c.share for c in cfg.classes])
    lo = np.array([c.repair_min_h for c in cfg.classes])[cls]
    hi = np.array([c.repair_max_h for c in cfg.classes])[cls]
    end = start + rng.uniform(lo, hi)
    if cfg.lemon_host_fraction > 0 and cfg.lemon_factor > 1:
        hosts = num_gpus // gpus_per_host
        weight = np.ones(hosts)
        weight[rng.choice(hosts, size=round(cfg.lemon_host_fraction * hosts), replace=False)] = cfg.lemon_factor
        host = rng.choice(hosts, size=n, p=weight / weight.sum())
        gpu = host * gpus_per_host + rng.integers(0, gpus_per_host, size=n)
    else:
        gpu = rng.integers(0, num_gpus, size=n)
    keep = end > 0  # repaired before the run began: irrelevant
    return Events(trial[keep], start[keep], end[keep], gpu[keep])


def failed_counts(events: Events, trials: int, bins: int, bin_h: float) -> np.ndarray:
    """[trial, bin] number of GPUs down, by adding +1 at each failure and -1 at each repair."""
    diff = np.zeros((trials, bins + 1), dtype=np.int32)
    b0 = np.clip(np.floor(events.start_h / bin_h), 0, bins).astype(np.int64)
    b1 = np.clip(np.ceil(events.end_h / bin_h), 0, bins).astype(np.int64)
    np.add.at(diff, (events.trial, b0), 1)
    np.add.at(diff, (events.trial, b1), -1)
    return np.cumsum(diff, axis=1)[:, :bins]


CHUNK = 100  # trials per batch of work; fixed so results do not depend on the machine


@dataclass
class Trace:
    """One trial's time series, for plots."""

    bin_h: float
    failed_fraction: np.ndarray
    throughput: dict[str, np.ndarray]
    capacity_goodput: dict[str, np.ndarray]  # per trial, for the distribution plot


def _restart_series(ev: Events, in_run: np.ndarray, lost_s: np.ndarray, bins: int, bin_h: float) -> np.ndarray:
    """Trial 0's throughput per bin under checkpoint-restart: 1, less the share of each bin
    spent restarting or redoing lost work (a long outage spills into the following bins)."""
    series = np.ones(bins)
    bin_s = bin_h * 3600
    starts = ev.start_h[in_run]
    for start, lost in zip(starts[ev.trial[in_run] == 0], lost_s[ev.trial[in_run] == 0], strict=True):
        b, left = int(start / bin_h), float(lost)
        while left > 0 and b < bins:
            take = min(left, series[b] * bin_s)
            series[b] -= take / bin_s
            left -= take
            b += 1
    return series


def checkpoint_interval_s(cfg: SimConfig, num_gpus: int) -> float:
    """The configured interval, or Daly's optimum for the job's MTBF."""
    if cfg.checkpoint_interval_s is not None:
        return cfg.checkpoint_interval_s
    job_rate = cfg.failure_rate_per_gpu_hour * num_gpus
    mtbf_s = 3600 / job_rate if job_rate > 0 else float("inf")
    return daly_interval_s(cfg.checkpoint_write_s, mtbf_s) if job_rate > 0 else 86400 * cfg.days


class _Tables:
    """Throughput and idle GPUs for k failed GPUs (in distinct domains), per strategy, cached."""

    def __init__(self, plan: Plan, cfg: SimConfig):
        self.replanner = Replanner(plan)
        self.cfg, self.domain = cfg, plan.cluster.spec.domain_size
        self.num_domains = plan.cluster.num_gpus // self.domain
        self.cache: dict[tuple[str, str, int], tuple[float, int]] = {}

    def get(self, strategy: str, batch: str, k: int) -> tuple[float, int]:
        key = (strategy, batch, k)
        if key not in self.cache:
            failed = frozenset(d * self.domain for d in range(min(k, self.num_domains)))
            tp = self.replanner.replan(failed, strategy, self.cfg.spares, "dp-drop", batch, detail=False)
            self.cache[key] = (tp, self.replanner.last_idle)
        return self.cache[key]

    def arrays(self, strategy: str, batch: str, kmax: int) -> tuple[np.ndarray, np.ndarray]:
        pairs = [self.get(strategy, batch, k) for k in range(kmax + 1)]
        return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs], dtype=float)


def simulate(
    plan: Plan, cfg: SimConfig, strategies: list[str], rng: np.random.Generator, progress=None
) -> tuple[dict[str, StrategyResult], Trace]:
    """Simulate ``cfg.trials`` runs of ``plan``; statistics per strategy and one trial's trace."""
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise ValueError(f"unknown strategies {unknown}; choose from {', '.join(STRATEGIES)}")
    n = plan.cluster.num_gpus
    interval = checkpoint_interval_s(cfg, n)
    productive = interval / (interval + cfg.checkpoint_write_s)
    bins = max(1, round(cfg.days * 86400 / cfg.bin_s))
    bin_h = cfg.days * 24 / bins
    run_s = cfg.days * 86400
    tables = _Tables(plan, cfg)
    per_domain = max(1, plan.cluster.spec.domain_size // plan.layout.tp)
    stats: dict[str, list[dict[str, np.ndarray]]] = {s: [] for s in strategies}
    trace = Trace(bin_h, np.zeros(0), {}, {})
    for first in range(0, cfg.trials, CHUNK):
        size = min(CHUNK, cfg.trials - first)
        ev = draw_events(cfg.model_copy(update={"trials": size}), n, plan.cluster.spec.gpus_per_node, rng)
        down = failed_counts(ev, size, bins, bin_h)
        kmax = int(down.max(initial=0))
        in_run = ev.start_h >= 0
        failures = np.bincount(ev.trial[in_run], minlength=size).astype(float)
        repairs = np.bincount(ev.trial[(ev.end_h >= 0) & (ev.end_h < cfg.days * 24)], minlength=size).astype(float)
        over = (down / n > cfg.down_threshold).mean(axis=1)
        worst = down.max(axis=1)
        if first == 0:
            trace.failed_fraction = down[0] / n
        for s in strategies:
            if s == "restart":
                phase = np.mod(ev.start_h[in_run] * 3600, interval + cfg.checkpoint_write_s)
                lost = np.bincount(ev.trial[in_run], weights=cfg.detection_s + cfg.restart_s + phase, minlength=size)
                good = np.clip(run_s - lost, 0, None) * productive / run_s
                row = dict(
                    goodput=good,
                    capacity_goodput=good,
                    ettr=good,
                    hours_paused=np.zeros(size),
                    interruptions=failures,
                    restarts=failures,
                    reconfigurations=np.zeros(size),
                    spares_needed=np.ceil(worst / per_domain),
                    idle_gpu_hours=np.zeros(size),
                )
                series = _restart_series(ev, in_run, cfg.detection_s + cfg.restart_s + phase, bins, bin_h)
            else:
                tp, idle = tables.arrays(s, cfg.batch, kmax)
                tput = tp[down]
                paused = (tput == 0) if cfg.batch == "fixed" else np.zeros_like(tput, dtype=bool)
                paused_s = paused.sum(axis=1) * bin_h * 3600
                stall = failures * (cfg.detection_s + cfg.reconfigure_s) + repairs * cfg.reconfigure_s
                good = np.clip(run_s - stall - paused_s, 0, None) * productive / run_s
                cap = tput.mean(axis=1) * np.clip(1 - stall / run_s, 0, None) * productive
                fixed_tp, _ = tables.arrays(s, "fixed", kmax)
                free = int(np.argmax(fixed_tp == 0)) - 1 if (fixed_tp == 0).any() else kmax
                needed = np.ceil(np.clip(worst - free, 0, None) / per_domain)
                row = dict(
                    goodput=good,
                    capacity_goodput=cap,
                    ettr=good,
                    hours_paused=paused_s / 3600,
                    interruptions=failures,
                    restarts=np.zeros(size),
                    reconfigurations=failures + repairs,
                    spares_needed=needed,
                    idle_gpu_hours=idle[down].sum(axis=1) * bin_h,
                )
                series = tput[0]
            row["throughput_loss"] = 1 - row["capacity_goodput"]
            row["time_over_threshold"] = over
            stats[s].append(row)
            if first == 0:
                trace.throughput[s] = series * productive
        if progress:
            progress(size)
    results = {}
    for s in strategies:
        merged = {k: np.concatenate([r[k] for r in stats[s]]) for k in stats[s][0]}
        pick = {
            q: StrategyStats(**{k: float(f(v)) for k, v in merged.items()})
            for q, f in (
                ("mean", np.mean),
                ("p5", lambda v: np.percentile(v, 5)),
                ("p95", lambda v: np.percentile(v, 95)),
            )
        }
        results[s] = StrategyResult(**pick, checkpoint_interval_s=interval)
        trace.capacity_goodput[s] = merged["capacity_goodput"]
    return results, trace


def plot_simulation(trace: Trace, results: dict[str, StrategyResult], folder, title: str) -> list:
    """Three PNGs: throughput over time (trial 0), goodput distribution, failed share over time."""
    import matplotlib

    matplotlib.use("Agg")
    from pathlib import Path

    import matplotlib.pyplot as plt

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    days = np.arange(len(trace.failed_fraction)) * trace.bin_h / 24
    paths = []

    def save(fig, name):
        path = folder / name
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
        paths.append(path)

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    window = max(1, round(6 / trace.bin_h))  # 6-hour moving average: restarts every hour or two otherwise blur
    kernel = np.ones(window) / window
    for s, series in trace.throughput.items():
        smooth = np.convolve(series, kernel, mode="valid")
        ax.plot(days[: len(smooth)], 100 * smooth, label=s, lw=1.2)
    ax.set(xlabel="day", ylabel="throughput (% of failure-free)", title=f"{title}: one trial, 6-hour average")
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
