"""Goodput of a training run under failures: a seeded Monte-Carlo simulation, vectorised over
trials, composed of four steps, each in its own module:

1. ``events``: failures, repairs and straggler episodes of every trial (default failure rate
   from Llama 3: 419 unexpected interruptions / (16,384 GPUs x 54 days) = 1.97e-5 per GPU-hour;
   78% hardware repaired in 3-5 days, 22% software repaired in 3 hours, one GPU each);
2. ``states``: time cut into bins, the failed units per bin, numbered by distinct state;
3. here, ``ThroughputTables``: each distinct state's throughput per strategy, from the NTP
   re-planning code (``Replanner``), computed once and cached;
4. ``goodput``: each strategy's throughput over time and its statistics over trials, with
   recoveries as a renewal process (``renewal``: a failure inside a recovery joins it).
Checkpoint intervals (Daly's optimum by default) come from ``checkpoint``; spare domains are a
pool every elastic strategy draws on (``spare_pool``), and ``spares_needed`` is the fewest that
keep a fixed batch, searched per failure state. A run starts in steady state or healthy
(``SimConfig.start``).

Work is refused up front, with the arithmetic, when it would run for more than minutes or hold
more than a few GB: see ``SimConfig`` and ``check_workload``.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ntp_planner.failures import checkpoint_interval
from ntp_planner.failures.events import draw_events, failed_counts, straggler_share
from ntp_planner.failures.goodput import (
    Batch,
    StrategyResult,
    StrategyStats,
    Trace,
    elastic_row,
    restart_row,
    summarize,
)
from ntp_planner.failures.replan import Replanner
from ntp_planner.failures.states import Domains, failure_states
from ntp_planner.plan import Plan
from topologies.bounds import show
from topologies.errors import InputError

__all__ = [
    "STRATEGIES",
    "LLAMA3_RATE_PER_GPU_HOUR",
    "FailureClass",
    "SimConfig",
    "StrategyResult",
    "StrategyStats",
    "Trace",
    "ThroughputTables",
    "check_pool_sweep",
    "check_strategies",
    "pool_rows",
    "check_workload",
    "draw_events",
    "failed_counts",
    "simulate",
]

STRATEGIES = ("restart", "dp-drop", "spares", "ntp", "ntp-pw")
LLAMA3_RATE_PER_GPU_HOUR = 419 / (16384 * 54 * 24)
# Physical bounds of the inputs (the CLI states them in its help, ntp_planner.cli.failures):
MAX_TRIALS = 1_000_000  # a million trials of a month is hours of work
MAX_RATE_PER_GPU_HOUR = 1.0  # every GPU failing every hour; Llama 3 saw 2e-5
MIN_RATE_PER_GPU_HOUR = 1e-12  # once per 10**8 GPU-years: below it the expected counts underflow
MAX_SECONDS = 86_400  # a checkpoint write, restart or reconfiguration longer than a day
MAX_INTERVAL_S = 365 * 86_400  # a year between checkpoints
MAX_HOURS = 8760  # a year: repairs and straggler episodes
MIN_SHAPE, MAX_SHAPE = 0.1, 10.0  # failure studies fit Weibull shapes of 0.5 to 1.5
MAX_SLOWDOWN = 100.0  # a job 100x slower is down, not slow
MAX_LEMON_FACTOR = 1000.0  # lemon hosts in studies fail 2-20x as often
MAX_SPARES = 1_000_000  # spare domains: each holds one GPU at least, of topologies.cluster.MAX_GPUS
CHUNK = 100  # trials per batch of work; fixed so results do not depend on the machine

# Bounds on the work one simulation may ask for, measured here (2 shared cores).
# benchmarks/simulate.py runs 30 days x 32,768 GPUs x 1,000 trials x 5 strategies in ~3 s:
# 1,000 trials x 4,320 ten-minute bins x 5 = 2.16e7 trial-bin-strategy cells, and
# 1.97e-5 x 32,768 x (720 + 120 h) = 542 expected failures per trial.
MAX_CELLS = 2_160_000_000  # trials x bins x strategies: 100x the benchmark, a few minutes
MAX_BINS = 200_000  # bins per trial: a batch of CHUNK trials peaks at ~130 bytes a trial-bin, 2.6 GB
# Failures per trial set how many GPUs are down at once (rate x GPUs x mean repair, M/G/inf), so
# how many distinct failure states are re-planned: 1,350 a trial on 8,192 GPUs took 13 s per 100
# trials, 4,060 took 56 s, 16,000 on 32,768 GPUs did not end in 8 minutes for 20 trials.
MAX_EVENTS_PER_TRIAL = 5_000  # ~10x the benchmark
MAX_EVENTS = 54_000_000  # over all trials (event arrays, drawing): 100x the benchmark's 542,000


class FailureClass(BaseModel):
    """One kind of failure: its share of all failures, its repair time and its blast radius."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str = Field(description="Label, e.g. hardware or software.")
    share: float = Field(gt=0, le=1, description="Share of failures in this class.")
    repair_min_h: float = Field(ge=0, le=MAX_HOURS, description="Shortest repair, hours (at most a year).")
    repair_max_h: float = Field(ge=0, le=MAX_HOURS, description="Longest repair, hours (uniform in between).")
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
    trials: int = Field(default=1000, ge=1, le=MAX_TRIALS, description="Independent runs simulated.")
    failure_rate_per_gpu_hour: float = Field(
        default=LLAMA3_RATE_PER_GPU_HOUR,
        ge=0,
        le=MAX_RATE_PER_GPU_HOUR,
        description="Failures per GPU-hour (default: Llama 3's): 0, or MIN_RATE_PER_GPU_HOUR up to every GPU hourly.",
    )
    distribution: str = Field(
        default="poisson",
        pattern="^(poisson|weibull)$",
        description="Failure arrivals: Poisson, or a Weibull renewal process of the job.",
    )
    weibull_shape: float = Field(
        default=0.7, ge=MIN_SHAPE, le=MAX_SHAPE, description="Weibull shape (< 1: bursty, > 1: regular)."
    )
    straggler_rate_per_gpu_hour: float = Field(
        default=0.0, ge=0, le=MAX_RATE_PER_GPU_HOUR, description="Slow-GPU or slow-link episodes."
    )
    straggler_hours: float = Field(
        default=0.4, ge=0, le=MAX_HOURS, description="Episode length (ByteDance study: ~24 min)."
    )
    straggler_slowdown: float = Field(
        default=1.3, ge=1, le=MAX_SLOWDOWN, description="Job slowdown while an episode lasts."
    )
    classes: tuple[FailureClass, ...] = Field(default=DEFAULT_CLASSES, description="Failure classes; shares sum to 1.")
    lemon_host_fraction: float = Field(default=0.0, ge=0, lt=1, description="Share of hosts that are lemons.")
    lemon_factor: float = Field(
        default=1.0, ge=1, le=MAX_LEMON_FACTOR, description="How much more often a lemon host fails."
    )
    checkpoint_interval_s: float | None = Field(
        default=None, gt=0, le=MAX_INTERVAL_S, description="None = Daly's optimum."
    )
    checkpoint_write_s: float = Field(
        default=300,
        gt=0,
        le=MAX_SECONDS,
        description="Time to write one checkpoint (above 0: Daly's interval divides by it; at most a day).",
    )
    restart_s: float = Field(default=600, ge=0, le=MAX_SECONDS, description="Restart overhead of checkpoint-restart.")
    detection_s: float = Field(default=60, ge=0, le=MAX_SECONDS, description="Time to notice a failure.")
    reconfigure_s: float = Field(
        default=180, ge=0, le=MAX_SECONDS, description="Elastic reconfiguration (drop, NTP, rejoin)."
    )
    spares: int = Field(
        default=0, ge=0, le=MAX_SPARES, description="Idle spare NVLink domains every elastic strategy draws on."
    )
    batch: str = Field(default="flexible", pattern="^(flexible|fixed)$", description="Global batch kept or not.")
    bin_s: float = Field(default=600, gt=0, description="Time resolution of the failure state.")
    down_threshold: float = Field(
        default=0.001, ge=0, le=1, description="Report time with more than this share of GPUs down (a share)."
    )
    start: str = Field(
        default="steady",
        pattern="^(steady|healthy)$",
        description="steady: failures already in repair at t = 0 (a job joining a running cluster); "
        "healthy: every GPU up at t = 0 (a trace from the job's first day).",
    )

    @field_validator("failure_rate_per_gpu_hour", "straggler_rate_per_gpu_hour")
    @classmethod
    def _not_underflowing(cls, rate: float) -> float:
        if 0 < rate < MIN_RATE_PER_GPU_HOUR:
            raise InputError(
                f"a rate of {rate:.3g} per GPU-hour is below {MIN_RATE_PER_GPU_HOUR:g} (once per 10**8 GPU-years), "
                "where the expected failure counts underflow; give 0 for none"
            )
        return rate

    @model_validator(mode="after")
    def _check(self) -> SimConfig:
        total = sum(c.share for c in self.classes)
        if abs(total - 1) > 1e-9:
            raise ValueError(f"failure class shares sum to {total:g}, not 1")

        if self.bins > MAX_BINS:
            raise ValueError(
                f"days({self.days:g}) x 86400 / bin_s({self.bin_s:g}) = {self.bins:,} time bins per trial is over "
                f"the {MAX_BINS:,} a batch of {CHUNK} trials can hold in a few GB; lower days"
            )
        _check_cells(self, 1)
        return self

    @property
    def bins(self) -> int:
        """Time bins of one trial."""
        return max(1, round(self.days * 86400 / self.bin_s))

    @property
    def bin_h(self) -> float:
        return self.days * 24 / self.bins

    @property
    def mean_repair_h(self) -> float:
        return sum(c.share * c.mean_repair_h for c in self.classes)

    @property
    def warm_h(self) -> float:
        """Failures are drawn from this long before the run: the longest repair from a steady
        start, none from a healthy one."""
        return max(c.repair_max_h for c in self.classes) if self.start == "steady" else 0.0

    def expected_events_per_trial(self, num_gpus: int) -> float:
        """Failures over run + warm-up, plus straggler episodes over the run, of one trial."""
        hours = self.days * 24
        failures = self.failure_rate_per_gpu_hour * num_gpus * (hours + self.warm_h)
        return failures + self.straggler_rate_per_gpu_hour * num_gpus * hours


def _check_cells(cfg: SimConfig, strategies: int) -> None:
    cells = cfg.trials * cfg.bins * strategies
    if cells > MAX_CELLS:
        per = f" x strategies({strategies})" if strategies > 1 else ""
        raise InputError(
            f"trials({cfg.trials:,}) x bins({cfg.bins:,}){per} = {cells:.3g} trial-bins to simulate is over "
            f"{MAX_CELLS:.3g} (minutes of work); lower trials or days"
        )


def check_workload(cfg: SimConfig, num_gpus: int, strategies: int) -> None:
    """InputError, with the arithmetic, for a simulation that would run for hours or hold more
    memory than a workstation has (bounds derived from benchmarks/simulate.py, above)."""
    _check_cells(cfg, strategies)
    per_trial = cfg.expected_events_per_trial(num_gpus)
    arithmetic = (
        f"(failure rate({cfg.failure_rate_per_gpu_hour:.3g} per GPU-hour) x (days({cfg.days:g}) x 24 + "
        f"{cfg.warm_h:g} h warm-up) + straggler rate({cfg.straggler_rate_per_gpu_hour:.3g} per GPU-hour) x days x 24)"
        f" x {num_gpus:,} GPUs"
        f" = {per_trial:.3g} events per trial"
    )
    if per_trial > MAX_EVENTS_PER_TRIAL:
        raise InputError(f"{arithmetic} is over {MAX_EVENTS_PER_TRIAL:,}; lower the rates or days")
    if per_trial * cfg.trials > MAX_EVENTS:
        raise InputError(
            f"{arithmetic} x trials({cfg.trials:,}) = {per_trial * cfg.trials:.3g} is over {MAX_EVENTS:.3g};"
            " lower trials, the rates or days"
        )


MAX_POOLS = 32  # pool sizes one sweep simulates


def check_pool_sweep(pools: list[int], cfg: SimConfig, strategies: int) -> None:
    """InputError unless ``pools`` (spare domains per simulation) are distinct whole numbers of 0
    or more, at most ``MAX_POOLS`` of them, and their simulations together stay within the bounds."""
    bad = [k for k in pools if not 0 <= k <= MAX_SPARES]
    if bad:
        raise InputError(
            f"--spares {show(bad[0])} is outside 0..{MAX_SPARES:,}; give spare domains as whole numbers of 0 or more "
            "(a domain holds at least one of at most 1,000,000 GPUs)"
        )
    if len(set(pools)) < len(pools) or len(pools) > MAX_POOLS:
        raise InputError(f"--spares lists {len(pools)} pool sizes; give at most {MAX_POOLS}, each once")
    _check_cells(cfg.model_copy(update={"trials": cfg.trials * len(pools)}), strategies)


def pool_rows(plan: Plan, runs: dict[int, dict[str, StrategyResult]]) -> list[dict]:
    """One row per pool size and strategy. Per-GPU throughput counts the spare domains as GPUs
    paid for: capacity goodput x job GPUs / (job GPUs + spares x GPUs per domain), relative to the
    failure-free job without spares."""
    n, domain = plan.cluster.num_gpus, plan.cluster.spec.domain_size
    rows = []
    for k, results in runs.items():
        for s, r in results.items():
            share = n / (n + k * domain)
            rows.append(
                {
                    "spares": k,
                    "strategy": s,
                    "spare_gpus": k * domain,
                    "gpu_throughput": r.mean.capacity_goodput * share,
                    "gpu_throughput_p5": r.p5.capacity_goodput * share,
                    "gpu_throughput_p95": r.p95.capacity_goodput * share,
                    "goodput": r.mean.goodput,
                    "capacity_goodput": r.mean.capacity_goodput,
                    "hours_paused": r.mean.hours_paused,
                    "hours_paused_p95": r.p95.hours_paused,
                    "spares_needed": r.mean.spares_needed,
                }
            )
    return rows


def check_strategies(strategies: list[str]) -> None:
    """InputError unless ``strategies`` names at least one strategy, each a known one."""
    if not strategies:
        raise InputError(f"no strategy to simulate; choose from {', '.join(STRATEGIES)}")
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise InputError(f"unknown strategies {unknown}; choose from {', '.join(STRATEGIES)}")


class ThroughputTables:
    """Throughput and idle GPUs of each failure state (failed units in distinct domains), per
    strategy and batch mode, re-planned once and cached."""

    def __init__(self, plan: Plan, cfg: SimConfig):
        self.replanner = Replanner(plan)
        self.cfg, self.cluster = cfg, self.replanner.cluster
        self.node = min(self.cluster.spec.gpus_per_node, self.cluster.used_per_domain)
        self.cache: dict[tuple[str, str, int], tuple[float, int]] = {}
        self.needs: dict[tuple, int] = {}
        self.states: dict[tuple[int, ...], tuple[frozenset[int], frozenset[int]]] = {}

    def failed(self, state: tuple[int, ...]) -> tuple[frozenset[int], frozenset[int]]:
        """(failed GPUs, domains lost whole) of a state = failed units (one GPU, a host, a domain,
        two GPUs of a domain), each unit in its own NVLink domain; a failed domain is every GPU
        the job uses there, and its idle GPUs."""
        if state in self.states:
            return self.states[state]
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
        self.states[state] = (frozenset(failed), frozenset(down))
        return self.states[state]

    def get(self, strategy: str, batch: str, state: tuple[int, ...]) -> tuple[float, int]:
        """Throughput and idle GPUs of ``state`` (see ``failed``) with the pool of ``cfg.spares``."""
        key = (strategy, batch, state)
        if key not in self.cache:
            failed, down = self.failed(state)
            kept = self.replanner.throughput(failed, strategy, self.cfg.spares, "dp-drop", batch, domains_down=down)
            self.cache[key] = (kept.throughput_relative, kept.idle_gpus)
        return self.cache[key]

    def need(self, policy: str, state: tuple[int, ...]) -> int:
        """Fewest spare domains with which ``state`` keeps a fixed batch (``Replanner.fewest_spares``)."""
        key = ("need", policy, state)
        if key not in self.needs:
            failed, down = self.failed(state)
            self.needs[key] = self.replanner.fewest_spares(failed, policy, "dp-drop", domains_down=down)
        return self.needs[key]

    def arrays(self, strategy: str, batch: str, states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Throughput and idle GPUs for each row of ``states`` ([n, 4] unit counts)."""
        pairs = [self.get(strategy, batch, tuple(int(x) for x in row)) for row in states]
        return np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs], dtype=float)


def simulate(
    plan: Plan, cfg: SimConfig, strategies: list[str], rng: np.random.Generator, progress=None
) -> tuple[dict[str, StrategyResult], Trace]:
    """Simulate ``cfg.trials`` runs of ``plan``; statistics per strategy and one trial's trace.
    ``rng`` draws every event; ``progress(k)`` hears of each batch of k trials done."""
    check_strategies(strategies)
    n = plan.cluster.num_gpus
    check_workload(cfg, n, len(strategies))
    job_rate = cfg.failure_rate_per_gpu_hour * n
    interval = checkpoint_interval.interval_s(
        cfg.checkpoint_interval_s, cfg.checkpoint_write_s, job_rate, cfg.days * 86400
    )
    productive = interval / (interval + cfg.checkpoint_write_s)
    tables = ThroughputTables(plan, cfg)
    rows: dict[str, list[dict[str, np.ndarray]]] = {s: [] for s in strategies}
    trace = Trace(cfg.bin_h, np.zeros(0), {}, {})
    for first in range(0, cfg.trials, CHUNK):
        batch = _draw_batch(plan, cfg, tables, min(CHUNK, cfg.trials - first), rng)
        over = (batch.states.gpus_down / n > cfg.down_threshold).mean(axis=1)
        for s in strategies:
            if s == "restart":
                row, series = restart_row(cfg, batch, tables, interval)
            else:
                row, series = elastic_row(cfg, batch, tables, s, interval)
            row["throughput_loss"] = 1 - row["capacity_goodput"]
            row["time_over_threshold"] = over
            rows[s].append(row)
            if first == 0:
                trace.throughput[s] = series * productive
        if first == 0:
            trace.failed_fraction = batch.states.gpus_down[0] / n
        if progress:
            progress(batch.trials)
    results = {}
    for s in strategies:
        results[s], trace.capacity_goodput[s] = summarize(rows[s], interval)
    return results, trace


def _draw_batch(plan: Plan, cfg: SimConfig, tables: ThroughputTables, size: int, rng: np.random.Generator) -> Batch:
    """Events, failure states and straggler slowdown of ``size`` trials (draws in this order)."""
    part = cfg.model_copy(update={"trials": size})
    n, cluster = plan.cluster.num_gpus, tables.cluster
    ev = draw_events(part, n, plan.cluster.spec.gpus_per_node, rng)
    used = cluster.used_per_domain
    domains = Domains(used=used, node=tables.node, idle=cluster.spec.domain_size - used)
    states = failure_states(ev, size, cfg.bins, cfg.bin_h, domains)
    slow = 1 - straggler_share(part, n, cfg.bins, cfg.bin_h, rng) * (1 - 1 / cfg.straggler_slowdown)
    return Batch(ev, states, slow, cfg.days * 24, cfg.bin_h)
