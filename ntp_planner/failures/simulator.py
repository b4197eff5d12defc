"""Goodput of a training run under failures: a seeded Monte-Carlo simulation, vectorised over
trials.

Failures arrive per GPU as a Poisson process (default rate from Llama 3: 419 unexpected
interruptions / (16,384 GPUs x 54 days) = 1.97e-5 per GPU-hour), or as a Weibull renewal process
of the whole job with the same mean rate. Each belongs to a class with its share, a uniform
repair time and a blast radius (default: 78% hardware repaired in 3-5 days, 22% software
repaired in 3 hours, one GPU each). A share of hosts may be lemons that fail k times more often.
Straggler episodes (a slow GPU or link) slow the synchronous job by a factor while they last.
The run starts in steady state (failures from before time 0 still in repair count as down).
Time is cut into bins; the failed units per blast type in each bin form the failure state, whose
throughput comes from the NTP re-planning code (``Replanner``), computed once per distinct state
and cached. The state places failed units in distinct NVLink domains (collisions are rare at
the fractions that matter). Failures hit the job's GPUs; when the job uses part of each domain,
a unit that fails no more GPUs than its domain has idle is covered by those in-domain spares
(``ntp_planner.failures.sampling.in_domain_cover``), except a domain-wide failure, which takes the idle GPUs too.

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

from ntp_planner.failures.checkpoint import daly_interval_s
from ntp_planner.failures.replan import Replanner
from ntp_planner.failures.sampling import BLASTS
from ntp_planner.plan import Plan

STRATEGIES = ("restart", "dp-drop", "spares", "ntp", "ntp-pw")
LLAMA3_RATE_PER_GPU_HOUR = 419 / (16384 * 54 * 24)


class FailureClass(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str
    share: float = Field(gt=0, le=1, description="Share of failures in this class.")
    repair_min_h: float = Field(ge=0, description="Shortest repair, hours.")
    repair_max_h: float = Field(ge=0, description="Longest repair, hours (uniform in between).")
    blast: str = Field(default="gpu", pattern="^(gpu|node|domain)$", description="What one failure takes down.")

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

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    days: float = Field(default=30, gt=0, le=3650, description="Length of the run (at most ten years).")
    trials: int = Field(default=1000, ge=1, description="Independent runs simulated.")
    failure_rate_per_gpu_hour: float = Field(default=LLAMA3_RATE_PER_GPU_HOUR, ge=0)
    distribution: str = Field(
        default="poisson",
        pattern="^(poisson|weibull)$",
        description="Failure arrivals: Poisson, or a Weibull renewal process of the job.",
    )
    weibull_shape: float = Field(default=0.7, gt=0, description="Weibull shape (< 1: bursty, > 1: regular).")
    straggler_rate_per_gpu_hour: float = Field(default=0.0, ge=0, description="Slow-GPU or slow-link episodes.")
    straggler_hours: float = Field(default=0.4, ge=0, description="Episode length (ByteDance study: ~24 min).")
    straggler_slowdown: float = Field(default=1.3, ge=1, description="Job slowdown while an episode lasts.")
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
    blast: np.ndarray  # 0 = one GPU, 1 = a host, 2 = an NVLink domain

    def take(self, mask: np.ndarray) -> Events:
        return Events(self.trial[mask], self.start_h[mask], self.end_h[mask], self.gpu[mask], self.blast[mask])


def _arrivals(cfg: SimConfig, rate_per_h: float, span: float, warm: float, rng: np.random.Generator):
    """(trial, time) of every arrival over [-warm, span - warm) for every trial."""
    if cfg.distribution == "poisson" or rate_per_h == 0:
        counts = rng.poisson(rate_per_h * span, size=cfg.trials)
        return np.repeat(np.arange(cfg.trials), counts), rng.uniform(-warm, span - warm, size=int(counts.sum()))
    from math import gamma

    k = cfg.weibull_shape
    scale = 1 / rate_per_h / gamma(1 + 1 / k)  # mean inter-arrival = 1 / rate
    draws = int(rate_per_h * span * 1.5 + 10 * (rate_per_h * span) ** 0.5 + 20)
    times = np.cumsum(scale * rng.weibull(k, size=(cfg.trials, draws)), axis=1)
    while (times[:, -1] < span).any():  # rare: extend the short rows
        more = times[:, -1:] + np.cumsum(scale * rng.weibull(k, size=(cfg.trials, draws)), axis=1)
        times = np.concatenate([times, more], axis=1)
    trial, col = np.nonzero(times < span)
    return trial, times[trial, col] - warm


def draw_events(cfg: SimConfig, num_gpus: int, gpus_per_host: int, rng: np.random.Generator) -> Events:
    """Poisson failures over [-longest repair, run length) for every trial."""
    warm = max(c.repair_max_h for c in cfg.classes)
    span = cfg.days * 24 + warm
    trial, start = _arrivals(cfg, cfg.failure_rate_per_gpu_hour * num_gpus, span, warm, rng)
    n = trial.size
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
    blast = np.array([BLASTS.index(c.blast) for c in cfg.classes])[cls]
    keep = end > 0  # repaired before the run began: irrelevant
    return Events(trial[keep], start[keep], end[keep], gpu[keep], blast[keep])


def pair_overlaps(ev: Events, domain_size: int) -> Events:
    """Intervals during which two single-GPU failures share an NVLink domain (consecutive
    failures of one domain that overlap in time; rarer triple overlaps count as pairs)."""
    single = ev.take(ev.blast == 0)
    if single.trial.size < 2:
        return single.take(np.zeros(single.trial.size, dtype=bool))
    domain = single.gpu // domain_size
    order = np.lexsort((single.start_h, domain, single.trial))
    t, d, a, b = single.trial[order], domain[order], single.start_h[order], single.end_h[order]
    same = (t[1:] == t[:-1]) & (d[1:] == d[:-1]) & (a[1:] < b[:-1])
    start, end = a[1:][same], np.minimum(b[:-1], b[1:])[same]
    zeros = np.zeros(start.size, dtype=np.int64)
    return Events(t[1:][same], start, end, zeros, zeros)


def straggler_share(cfg: SimConfig, num_gpus: int, bins: int, bin_h: float, rng: np.random.Generator) -> np.ndarray:
    """[trial, bin] 1 while at least one straggler episode is under way, else 0."""
    if cfg.straggler_rate_per_gpu_hour == 0 or cfg.straggler_hours == 0:
        return np.zeros((cfg.trials, bins))
    counts = rng.poisson(cfg.straggler_rate_per_gpu_hour * num_gpus * cfg.days * 24, size=cfg.trials)
    trial = np.repeat(np.arange(cfg.trials), counts)
    start = rng.uniform(0, cfg.days * 24, size=trial.size)
    ev = Events(trial, start, start + cfg.straggler_hours, np.zeros_like(trial), np.zeros_like(trial))
    return (failed_counts(ev, cfg.trials, bins, bin_h) > 0).astype(float)


def failed_counts(events: Events, trials: int, bins: int, bin_h: float) -> np.ndarray:
    """[trial, bin] number of units down, by adding +1 at each failure and -1 at each repair.
    Both ends round to the nearest bin boundary, so durations are right on average."""
    diff = np.zeros((trials, bins + 1), dtype=np.int32)
    b0 = np.clip(np.rint(events.start_h / bin_h), 0, bins).astype(np.int64)
    b1 = np.clip(np.rint(events.end_h / bin_h), 0, bins).astype(np.int64)
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


def _spares_per_state(tables: _Tables, strategy: str, states: np.ndarray) -> np.ndarray:
    """Spare domains each state needs to run without pausing under a fixed batch. Spares replace
    the worst domains first: if the single-GPU failures alone would not pause the job, only the
    severe units (hosts, whole domains, doubly failed domains) need spares; else every one."""
    fixed, _ = tables.arrays(strategy, "fixed", states)
    singles_only = states.copy()
    singles_only[:, 1:] = 0
    singles_fixed, _ = tables.arrays(strategy, "fixed", singles_only)
    severe = states[:, 1:].sum(axis=1)
    every = states.sum(axis=1)
    return np.where(fixed > 0, 0, np.where(singles_fixed > 0, severe, every)).astype(float)


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
        self.cfg, self.cluster = cfg, self.replanner.cluster
        self.node = min(self.cluster.spec.gpus_per_node, self.cluster.used_per_domain)
        self.cache: dict[tuple[str, str, int], tuple[float, int]] = {}

    def get(self, strategy: str, batch: str, state: tuple[int, ...]) -> tuple[float, int]:
        """State = failed units (one GPU, a host, a domain, two GPUs of a domain), each unit in its
        own NVLink domain; a failed domain is every GPU the job uses there, and its idle GPUs."""
        key = (strategy, batch, state)
        if key not in self.cache:
            c = self.cluster
            failed, down, d = set(), set(), 0
            for kind, count in enumerate(state):
                for _ in range(count):
                    if d < c.num_domains:
                        width = min((1, self.node, c.used_per_domain, 2)[kind], c.used_in_domain(d))
                        failed.update(range(d * c.used_per_domain, d * c.used_per_domain + width))
                        if kind == 2:
                            down.add(d)
                    d += 1
            kept = self.replanner.throughput(
                frozenset(failed),
                strategy,
                self.cfg.spares,
                "dp-drop",
                batch,
                domains_down=frozenset(down),
            )
            self.cache[key] = (kept.throughput_relative, kept.idle_gpus)
        return self.cache[key]

    def arrays(self, strategy: str, batch: str, states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Throughput and idle GPUs for each row of ``states`` ([n, 4] unit counts)."""
        pairs = [self.get(strategy, batch, tuple(int(x) for x in row)) for row in states]
        return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs], dtype=float)


def check_strategies(strategies: list[str]) -> None:
    """ValueError unless ``strategies`` names at least one strategy, each a known one."""
    if not strategies:
        raise ValueError(f"no strategy to simulate; choose from {', '.join(STRATEGIES)}")
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise ValueError(f"unknown strategies {unknown}; choose from {', '.join(STRATEGIES)}")


def simulate(
    plan: Plan, cfg: SimConfig, strategies: list[str], rng: np.random.Generator, progress=None
) -> tuple[dict[str, StrategyResult], Trace]:
    """Simulate ``cfg.trials`` runs of ``plan``; statistics per strategy and one trial's trace."""
    check_strategies(strategies)
    n = plan.cluster.num_gpus
    interval = checkpoint_interval_s(cfg, n)
    productive = interval / (interval + cfg.checkpoint_write_s)
    bins = max(1, round(cfg.days * 86400 / cfg.bin_s))
    bin_h = cfg.days * 24 / bins
    run_s = cfg.days * 86400
    tables = _Tables(plan, cfg)
    cluster = tables.cluster
    used = cluster.used_per_domain  # job GPUs per domain (the last may hold fewer)
    per_domain = max(1, used // plan.layout.tp)
    stats: dict[str, list[dict[str, np.ndarray]]] = {s: [] for s in strategies}
    trace = Trace(bin_h, np.zeros(0), {}, {})
    node = tables.node
    in_domain = cluster.spec.domain_size - used  # idle GPUs of each domain (the last may have more)
    for first in range(0, cfg.trials, CHUNK):
        size = min(CHUNK, cfg.trials - first)
        part = cfg.model_copy(update={"trials": size})
        ev = draw_events(part, n, plan.cluster.spec.gpus_per_node, rng)
        units = [failed_counts(ev.take(ev.blast == b), size, bins, bin_h) for b in range(len(BLASTS))]
        gpus_down = units[0] + units[1] * node + units[2] * used
        # two single-GPU failures in one domain form one doubly degraded domain
        pairs = failed_counts(pair_overlaps(ev, used), size, bins, bin_h)
        singles = units[0] - 2 * pairs
        # domains with more failed GPUs than idle ones (a whole domain always): each needs a spare
        domains_down = (
            units[2]
            + (singles if in_domain < 1 else 0)
            + (units[1] if in_domain < node else 0)
            + (pairs if in_domain < 2 else 0)
        )
        # one integer per failure state; each distinct state is re-planned once
        parts = [singles, units[1], units[2], pairs]
        radix = [int(x.max(initial=0)) + 1 for x in parts]
        code = np.zeros_like(singles)
        for x, r in zip(reversed(parts), reversed(radix), strict=True):
            code = code * r + x
        codes, inverse = np.unique(code.ravel(), return_inverse=True)
        inverse = inverse.reshape(size, bins)
        columns, rest = [], codes
        for r in radix:
            columns.append(rest % r)
            rest = rest // r
        states = np.stack(columns, axis=1)
        slow = 1 - straggler_share(part, n, bins, bin_h, rng) * (1 - 1 / cfg.straggler_slowdown)
        in_run = ev.start_h >= 0
        failures = np.bincount(ev.trial[in_run], minlength=size).astype(float)
        repairs = np.bincount(ev.trial[(ev.end_h >= 0) & (ev.end_h < cfg.days * 24)], minlength=size).astype(float)
        over = (gpus_down / n > cfg.down_threshold).mean(axis=1)
        worst = domains_down.max(axis=1)
        if first == 0:
            trace.failed_fraction = gpus_down[0] / n
        for s in strategies:
            if s == "restart":
                phase = np.mod(ev.start_h[in_run] * 3600, interval + cfg.checkpoint_write_s)
                lost = np.bincount(ev.trial[in_run], weights=cfg.detection_s + cfg.restart_s + phase, minlength=size)
                good = np.clip(run_s - lost, 0, None) * productive / run_s
                row = dict(
                    goodput=good,
                    capacity_goodput=good * slow.mean(axis=1),
                    ettr=good,
                    hours_paused=np.zeros(size),
                    interruptions=failures,
                    restarts=failures,
                    reconfigurations=np.zeros(size),
                    spares_needed=np.ceil(worst / per_domain),
                    idle_gpu_hours=np.zeros(size),
                )
                series = _restart_series(ev, in_run, cfg.detection_s + cfg.restart_s + phase, bins, bin_h) * slow[0]
            else:
                tp, idle = tables.arrays(s, cfg.batch, states)
                tput = tp[inverse] * slow
                paused = (tp[inverse] == 0) if cfg.batch == "fixed" else np.zeros((size, bins), dtype=bool)
                paused_s = paused.sum(axis=1) * bin_h * 3600
                stall = failures * (cfg.detection_s + cfg.reconfigure_s) + repairs * cfg.reconfigure_s
                good = np.clip(run_s - stall - paused_s, 0, None) * productive / run_s
                cap = tput.mean(axis=1) * np.clip(1 - stall / run_s, 0, None) * productive
                needed = np.ceil(_spares_per_state(tables, s, states)[inverse].max(axis=1) / per_domain)
                row = dict(
                    goodput=good,
                    capacity_goodput=cap,
                    ettr=good,
                    hours_paused=paused_s / 3600,
                    interruptions=failures,
                    restarts=np.zeros(size),
                    reconfigurations=failures + repairs,
                    spares_needed=needed,
                    idle_gpu_hours=idle[inverse].sum(axis=1) * bin_h,
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
