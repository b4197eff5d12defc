"""The inputs of a simulation besides the plan (``SimConfig``, its failure classes), and the bounds
on the work one simulation may ask for, refused up front with the arithmetic (``check_workload``).
Pure data: the simulator's steps (``events``, ``goodput``, ``simulator``) import it, it imports none
of them.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from topologies.bounds import show
from topologies.errors import InputError

STRATEGIES = ("restart", "dp-drop", "spares", "ntp", "ntp-pw")
LLAMA3_RATE_PER_GPU_HOUR = 419 / (16384 * 54 * 24)
# Physical bounds of the inputs (the CLI states them in its help, ntp_planner.cli.simulate):
MAX_TRIALS = 1_000_000  # a million trials of a month is hours of work
MAX_RATE_PER_GPU_HOUR = 1.0  # every GPU failing every hour; Llama 3 saw 2e-5
MIN_RATE_PER_GPU_HOUR = 1e-12  # once per 10**8 GPU-years: below it the expected counts underflow
MAX_SECONDS = 86_400  # a checkpoint write, restart or reconfiguration longer than a day
MAX_INTERVAL_S = 365 * 86_400  # a year between checkpoints
MIN_INTERVAL_S = 1.0  # a checkpoint a second: below it the productive share I / (I + w) underflows
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
        default=None,
        ge=MIN_INTERVAL_S,
        le=MAX_INTERVAL_S,
        description="None = Daly's optimum; else at least a second and at most a year.",
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


def check_strategies(strategies: list[str]) -> None:
    """InputError unless ``strategies`` names at least one strategy, each a known one."""
    if not strategies:
        raise InputError(f"no strategy to simulate; choose from {', '.join(STRATEGIES)}")
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise InputError(f"unknown strategies {unknown}; choose from {', '.join(STRATEGIES)}")
