"""Capacity planning: which cluster, how many GPUs, how many spare domains and which fault strategy
train ``tokens`` by the deadline with the asked confidence, at the lowest cost.

Every cluster x GPU count x spare count x strategy is a candidate. Each (cluster, GPU count) is
planned once (``make_plan``: the fastest uniform layout), and its plan, failures, failure states
and re-planned throughputs are shared by its spare counts and strategies; every candidate meets
the same failures (common random numbers, ``capacity_sim.EventPool``). A candidate is simulated
until its tokens are trained (``capacity_sim``): P50 / P90 time to train, the probability of
meeting the deadline, GPU-hours and cost with the spare domains paid for (whole NVLink domains:
a job of 4,096 GPUs in 72-GPU racks pays for 57 racks).

A candidate *meets the deadline* when P(time to train <= deadline) >= confidence. Among those,
the time/cost front: time = the time to train at the confidence (its quantile), cost = the mean
cost; the cheapest is the front's first (ties: the faster, then the earlier in the grid).

Pruned without simulating, with no change to the answer (a test checks it against the search
that simulates everything):
- a candidate whose failure-free time to train is past the deadline: it never meets it (failures
  only slow a job down: each bin trains at most at the failure-free speed, restart's runs at most
  as fast as its first);
- a candidate whose lower bounds (failure-free time, cost at that time) are no better than a
  simulated candidate that meets the deadline, and worse in one: it is dominated, whatever its
  failures, so it is neither on the front nor the cheapest. Candidates go cheapest bound first.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ntp_planner.failures import capacity_sim as sim
from ntp_planner.failures.checkpoint_interval import daly_interval_s
from ntp_planner.failures.sim_config import MAX_EVENTS, MAX_EVENTS_PER_TRIAL, STRATEGIES, SimConfig
from ntp_planner.failures.tables import ThroughputTables
from ntp_planner.plan import Plan
from topologies.errors import InputError

HORIZON_SLACK = 1.25  # first horizon: this times the failure-free time, plus a day
MAX_SLOWDOWN = 16  # a trial not done in this times its failure-free time (or MAX_CELLS) counts as never done
MAX_HORIZON_H = 3650 * 24  # ten years
MAX_CELLS = 20_000_000  # trials x time bins of one job: ~160 MB a float array, a few of them at once
# Trials x bins over the whole search (every candidate simulated, to the deadline): the brute force
# of benchmarks/capacity.py, 480 x 200 trials x 3,648 bins = 3.5e8, took 87 s on 2 cores, so this
# is at most ~8 minutes unpruned (the pruned search simulates a sixth); 1,000 trials of that grid pass.
MAX_SEARCH_CELLS = 2_000_000_000
MAX_CACHED_CELLS = 2 * MAX_CELLS  # failures kept for the next candidates of recently simulated jobs
BOUND_TOLERANCE = 1e-9  # bounds are lowered by this share: a simulated time may round below its exact bound


class CapacitySpec(BaseModel):
    """What to train and by when, and the grid of candidates to search."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    tokens: float = Field(gt=0, le=1e18, description="Tokens to train (15e12 for Llama 3).")
    deadline_days: float = Field(gt=0, le=3650, description="Days by which the tokens must be trained.")
    confidence: float = Field(gt=0, lt=1, description="Probability of meeting the deadline asked for.")
    gpus: tuple[int, ...] = Field(min_length=1, description="GPU counts to try, per cluster.")
    spares: tuple[int, ...] = Field(default=(0,), min_length=1, description="Spare NVLink domains to try.")
    strategies: tuple[str, ...] = Field(default=STRATEGIES, min_length=1, description="Fault strategies to try.")
    trials: int = Field(default=200, ge=1, le=100_000, description="Monte-Carlo trials per candidate.")
    seed: int = Field(default=0, ge=0, description="Seed of the failures every candidate meets.")
    sim: SimConfig = Field(default_factory=SimConfig, description="Failure model and recovery costs (days unused).")


class Candidate(BaseModel):
    """One cluster x GPU count x spare count x strategy, and how it did."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cluster: str = Field(description="Cluster catalogue name.")
    gpus: int = Field(description="GPUs the job trains on.")
    spares: int = Field(description="Spare NVLink domains held for it.")
    strategy: str = Field(description="Fault strategy.")
    paid_gpus: int = Field(description="GPUs paid for: the NVLink domains the job touches, and the spares.")
    usd_per_gpu_hour: float = Field(description="Price of one GPU-hour.")
    layout: str | None = Field(default=None, description="The plan's layout; None when none fits.")
    tokens_per_s: float | None = Field(default=None, description="Failure-free training throughput.")
    checkpoint_interval_s: float | None = Field(default=None, description="Compute between checkpoints (Daly).")
    failure_free_days: float | None = Field(default=None, description="Time to train without failures.")
    p50_days: float | None = Field(default=None, description="Median time to train over trials (None: pruned).")
    p90_days: float | None = Field(default=None, description="90th percentile of the time to train.")
    days_at_confidence: float | None = Field(default=None, description="Time to train at the confidence.")
    p_deadline: float | None = Field(default=None, description="Share of trials done by the deadline.")
    gpu_hours: float | None = Field(default=None, description="Mean GPU-hours paid (spares included).")
    cost_usd: float | None = Field(default=None, description="Mean cost.")
    cost_usd_p90: float | None = Field(default=None, description="Cost at the P90 time to train.")
    verdict: str = Field(default="lost", description="cheapest, front (the time/cost front) or lost.")
    reason: str = Field(default="", description="Why it lost, in a sentence.")

    @property
    def label(self) -> str:
        """'gb200-nvl72 x 16384 + 2 spares, ntp'"""
        return f"{self.cluster} x {self.gpus} + {self.spares} spare{'s' if self.spares != 1 else ''}, {self.strategy}"


class CapacityResult(BaseModel):
    """Every candidate, the cheapest that meets the deadline and the time/cost front."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    candidates: list[Candidate] = Field(description="In grid order: cluster, GPUs, spares, strategy.")
    cheapest: Candidate | None = Field(description="Cheapest candidate that meets the deadline; None if none does.")
    front: list[Candidate] = Field(description="Time/cost front of the candidates meeting the deadline, by cost.")
    simulated: int = Field(description="Candidates simulated (the rest were planned out or pruned by bounds).")


@dataclass
class _Job:
    """One cluster x GPU count: its plan and what its spare counts and strategies share."""

    cluster: str
    gpus: int
    domain_size: int
    plan: Plan | None
    reason: str = ""
    tables: dict[int, ThroughputTables] = field(default_factory=dict)
    failures: dict[float, sim.JobFailures] = field(default_factory=dict)

    @property
    def paid_domains(self) -> int:
        return self.plan.cluster.build().num_domains if self.plan else -(-self.gpus // self.domain_size)


def search(
    spec: CapacitySpec,
    plans: dict[tuple[str, int], Plan | str],
    domain_sizes: dict[str, int],
    prices: dict[str, float],
    prune: bool = True,
    progress: Callable[[int], None] | None = None,
) -> CapacityResult:
    """Search the grid. ``plans[(cluster, gpus)]``: the plan, or why none fits; ``prices``: USD per
    GPU-hour per cluster. ``prune=False`` simulates every candidate that has a plan (the brute
    force the pruned search must agree with)."""
    check_workload(spec, len({name for name, _ in plans}))
    pool = sim.EventPool(spec.sim, spec.trials, max(spec.gpus), spec.seed)
    grid = []
    for (name, n), plan in plans.items():
        job = _Job(
            name,
            n,
            domain_sizes[name],
            plan if isinstance(plan, Plan) else None,
            "" if isinstance(plan, Plan) else plan,
        )
        for k in spec.spares:
            for s in spec.strategies:
                grid.append((job, k, s, _bounds(spec, job, k, s, prices[name])))
    order = sorted(range(len(grid)), key=lambda i: (grid[i][3].cost_usd or 0.0, grid[i][3].failure_free_days or 0.0, i))
    done: dict[int, Candidate] = {}
    winners: list[Candidate] = []  # simulated, meeting the deadline
    recent: list[_Job] = []  # jobs holding failures, the least recently simulated first
    simulated = 0
    for i in order:
        job, k, s, bound = grid[i]
        done[i] = _verdict_before(spec, job, bound, winners if prune else [], prune)
        if not done[i].reason:
            done[i] = _simulate(spec, pool, job, k, s, bound)
            simulated += 1
            recent = _forget_failures([j for j in recent if j is not job] + [job])
            if done[i].p_deadline >= spec.confidence:
                winners.append(done[i])
        if progress:
            progress(1)
    return _rank(spec, [done[i] for i in range(len(grid))], simulated)


def _forget_failures(recent: list[_Job]) -> list[_Job]:
    """Drop the failures of the least recently simulated jobs (``recent``, oldest first) while
    all of them hold more than MAX_CACHED_CELLS trial-bins, never the last one's: a grid of 64
    GPU counts x 3 clusters would otherwise keep ~160 MB a job. They are drawn again, the same
    (``EventPool``), if one of their candidates comes later. The jobs still holding some."""
    cells = [sum(f.stall_s.size for f in job.failures.values()) for job in recent]
    while len(recent) > 1 and sum(cells) > MAX_CACHED_CELLS:
        recent[0].failures.clear()
        recent, cells = recent[1:], cells[1:]
    return recent


def check_workload(spec: CapacitySpec, clusters: int = 1) -> None:
    """InputError, with the arithmetic, for a search that would hold GBs or run for hours: the
    failures of the largest job until the deadline (bounds of ``sim_config``: MAX_EVENTS_PER_TRIAL
    failures a trial, MAX_EVENTS drawn, measured there), one job's trials x time bins to the
    deadline, and every candidate's (``clusters`` x GPU counts x spares x strategies)."""
    hours = spec.deadline_days * 24 * HORIZON_SLACK + 24
    cells = spec.trials * hours * 3600 / sim.BIN_S
    if cells > MAX_CELLS:
        raise InputError(
            f"trials({spec.trials:,}) x {hours * 3600 / sim.BIN_S:,.0f} time bins of {sim.BIN_S} s to the deadline "
            f"= {cells:.3g} is over {MAX_CELLS:.3g} (GBs of memory); lower --trials or --deadline-days"
        )
    _check_events(spec, hours)
    candidates = clusters * len(spec.gpus) * len(spec.spares) * len(spec.strategies)
    if candidates * cells > MAX_SEARCH_CELLS:
        raise InputError(
            f"{candidates:,} candidates ({clusters} clusters x {len(spec.gpus)} GPU counts x {len(spec.spares)} spare "
            f"counts x {len(spec.strategies)} strategies) x trials({spec.trials:,}) x {hours * 3600 / sim.BIN_S:,.0f} "
            f"time bins = {candidates * cells:.3g} is over {MAX_SEARCH_CELLS:.3g} (minutes of simulating); lower "
            "--trials, --deadline-days or the grid"
        )


def _check_events(spec: CapacitySpec, hours: float) -> None:
    """InputError for more failures than a trial or the whole pool may draw: the pool draws every
    trial's failures on the largest job in whole chunks of CHUNK_H hours, up to the longest horizon
    a candidate may simulate (``train_hours``' cap for a job done by the deadline)."""
    rate, gpus = spec.sim.failure_rate_per_gpu_hour, max(spec.gpus)
    if rate * gpus * (hours + spec.sim.warm_h) > MAX_EVENTS_PER_TRIAL:
        raise InputError(
            f"failure rate({rate:.3g} per GPU-hour) x {gpus:,} GPUs x {hours + spec.sim.warm_h:,.0f} h (the deadline, "
            f"with slack and warm-up) = {rate * gpus * (hours + spec.sim.warm_h):,.0f} failures a trial is over "
            f"{MAX_EVENTS_PER_TRIAL:,} (hours of re-planning); lower --gpus or --deadline-days"
        )
    longest_h = min(
        MAX_HORIZON_H, MAX_SLOWDOWN * spec.deadline_days * 24 + 24, MAX_CELLS / spec.trials * sim.BIN_S / 3600
    )
    drawn_h = math.ceil(longest_h / sim.CHUNK_H) * sim.CHUNK_H + spec.sim.warm_h
    events = rate * gpus * drawn_h * spec.trials
    if events > MAX_EVENTS:
        raise InputError(
            f"failure rate({rate:.3g} per GPU-hour) x {gpus:,} GPUs x {drawn_h:,.0f} h (whole {sim.CHUNK_H} h chunks "
            f"of failures to the longest horizon) x trials({spec.trials:,}) = {events:.3g} failures to draw is over "
            f"{MAX_EVENTS:.3g} (GBs of memory); lower --trials or --gpus"
        )


def _bounds(spec: CapacitySpec, job: _Job, k: int, strategy: str, price: float) -> Candidate:
    """The candidate before simulation: its layout, failure-free time and the cost at that time
    (both lower bounds), or, without a plan, why."""
    paid = (job.paid_domains + k) * job.domain_size
    base = Candidate(
        cluster=job.cluster, gpus=job.gpus, spares=k, strategy=strategy, paid_gpus=paid, usd_per_gpu_hour=price
    )
    if job.plan is None:
        return base.model_copy(update={"reason": job.reason})
    interval, productive = _interval(spec, job.gpus)
    work_s = spec.tokens / job.plan.predicted.tokens_per_s
    if strategy == "restart":
        hours = sim.restart_hours(_no_events(), 1, math.inf, work_s, interval, spec.sim.checkpoint_write_s, 0.0)[0]
    else:
        hours = work_s / productive / 3600
    return base.model_copy(
        update={
            "layout": job.plan.layout.describe(),
            "tokens_per_s": job.plan.predicted.tokens_per_s,
            "checkpoint_interval_s": interval,
            "failure_free_days": hours / 24,
            "cost_usd": paid * hours * price,
        }
    )


def _no_events():
    from ntp_planner.failures.events import Events

    empty = np.zeros(0, dtype=np.int64)
    return Events(empty, empty.astype(float), empty.astype(float), empty, empty)


def _interval(spec: CapacitySpec, gpus: int) -> tuple[float, float]:
    """Checkpoint interval (the configured one, else Daly's optimum for the job's failure rate;
    none without failures) and the share of time it leaves productive, I / (I + w)."""
    cfg = spec.sim
    rate_per_h = cfg.failure_rate_per_gpu_hour * gpus
    if cfg.checkpoint_interval_s is not None:
        interval = cfg.checkpoint_interval_s
    elif rate_per_h == 0:
        return math.inf, 1.0
    else:
        interval = daly_interval_s(cfg.checkpoint_write_s, 3600 / rate_per_h)
    return interval, interval / (interval + cfg.checkpoint_write_s)


def _verdict_before(
    spec: CapacitySpec, job: _Job, bound: Candidate, winners: list[Candidate], prune: bool
) -> Candidate:
    """The candidate with a reason when it loses without simulating: no plan, or (pruning) a
    failure-free time past the deadline or bounds dominated by a simulated winner."""
    if job.plan is None:
        return bound
    if not prune:
        return bound
    if bound.failure_free_days * (1 - BOUND_TOLERANCE) > spec.deadline_days:
        return bound.model_copy(
            update={
                "p_deadline": 0.0,
                "reason": f"too slow: {bound.failure_free_days:.1f} days even without failures, past the "
                f"{spec.deadline_days:g}-day deadline",
            }
        )
    for w in winners:
        t, c = bound.failure_free_days * (1 - BOUND_TOLERANCE), bound.cost_usd * (1 - BOUND_TOLERANCE)
        if (w.days_at_confidence < t and w.cost_usd <= c) or (w.days_at_confidence <= t and w.cost_usd < c):
            return bound.model_copy(
                update={"reason": f"dominated by {w.label}: it needs at least {t:.1f} days and {usd(c)}"}
            )
    return bound


def usd(x: float) -> str:
    """Dollars, rounded to what a budget reads; a mean over trials one of which never finished
    (by its horizon's cap) is unbounded.

    >>> usd(106_772_035.2), usd(14_515.0), usd(12.5), usd(math.inf)
    ('$106.8M', '$14.5k', '$12', 'unbounded')
    """
    if math.isinf(x):
        return "unbounded"
    return f"${x / 1e6:,.1f}M" if x >= 1e6 else f"${x / 1e3:,.1f}k" if x >= 1e3 else f"${x:,.0f}"


def _tables(job: _Job, spec: CapacitySpec, k: int) -> ThroughputTables:
    """The job's re-planned throughputs with a pool of k spare domains; one re-planner (its
    memos) shared by every pool size."""
    if k not in job.tables:
        cfg = spec.sim.model_copy(update={"spares": k, "batch": "flexible"})
        if job.tables:
            tables = copy.copy(next(iter(job.tables.values())))
            tables.cfg, tables.cache, tables.needs = cfg, {}, {}
        else:
            tables = ThroughputTables(job.plan, cfg)
        job.tables[k] = tables
    return job.tables[k]


def train_hours(spec: CapacitySpec, pool: sim.EventPool, job: _Job, k: int, strategy: str) -> np.ndarray:
    """Per trial, hours to train ``spec.tokens``: simulated over a horizon that doubles while a
    trial is not done, up to MAX_SLOWDOWN times the failure-free time (then inf)."""
    interval, productive = _interval(spec, job.gpus)
    work_s = spec.tokens / job.plan.predicted.tokens_per_s
    cap = min(MAX_HORIZON_H, MAX_SLOWDOWN * work_s / productive / 3600 + 24, MAX_CELLS / spec.trials * sim.BIN_S / 3600)
    horizon = _whole_bins(HORIZON_SLACK * work_s / productive / 3600 + 24)
    tables = _tables(job, spec, k)
    cfg = spec.sim
    while True:
        if horizon not in job.failures:
            job.failures[horizon] = sim.job_failures(pool, tables, job.gpus, horizon)
        fails = job.failures[horizon]
        if strategy == "restart":
            recovery = cfg.detection_s + cfg.restart_s
            hours = sim.restart_hours(
                fails.events, spec.trials, horizon, work_s, interval, cfg.checkpoint_write_s, recovery
            )
        else:
            tp, _ = tables.arrays(strategy, "flexible", fails.states.states)
            hours = sim.elastic_hours(fails, tp, productive, work_s)
        if np.isfinite(hours).all() or horizon >= cap:
            return hours
        horizon = _whole_bins(min(2 * horizon, cap))


def _whole_bins(hours: float) -> float:
    return math.ceil(hours * 3600 / sim.BIN_S) * sim.BIN_S / 3600


def _simulate(spec: CapacitySpec, pool: sim.EventPool, job: _Job, k: int, strategy: str, bound: Candidate) -> Candidate:
    """The candidate's time-to-train distribution and what it costs."""
    hours = train_hours(spec, pool, job, k, strategy)
    q = lambda p: float(np.quantile(hours, p, method="inverted_cdf")) / 24  # noqa: E731
    price = bound.paid_gpus * bound.usd_per_gpu_hour
    return bound.model_copy(
        update={
            "p50_days": q(0.5),
            "p90_days": q(0.9),
            "days_at_confidence": q(spec.confidence),
            "p_deadline": float(np.mean(hours <= spec.deadline_days * 24)),
            "gpu_hours": float(np.mean(hours)) * bound.paid_gpus,
            "cost_usd": float(np.mean(hours)) * price,
            "cost_usd_p90": q(0.9) * 24 * price,
        }
    )


def _rank(spec: CapacitySpec, done: list[Candidate], simulated: int) -> CapacityResult:
    """Front and cheapest among the simulated candidates that meet the deadline; a reason for
    every other candidate."""
    meets = [i for i, c in enumerate(done) if not c.reason and c.p_deadline >= spec.confidence]
    meets.sort(key=lambda i: (done[i].cost_usd, done[i].days_at_confidence, i))
    front: list[int] = []
    for i in meets:
        if not front or done[i].days_at_confidence < done[front[-1]].days_at_confidence:
            front.append(i)
    out = list(done)
    for i, c in enumerate(done):
        if i in front:
            out[i] = c.model_copy(update={"verdict": "cheapest" if i == front[0] else "front"})
        elif not c.reason and c.p_deadline < spec.confidence:
            out[i] = c.model_copy(
                update={
                    "reason": f"too slow at that confidence: done by day {spec.deadline_days:g} in "
                    f"{100 * c.p_deadline:.0f}% of trials, under {100 * spec.confidence:g}%"
                }
            )
        elif not c.reason:
            by = next(
                done[j]
                for j in front
                if done[j].cost_usd <= c.cost_usd and done[j].days_at_confidence <= c.days_at_confidence
            )
            out[i] = c.model_copy(
                update={"reason": f"dominated by {by.label}: {by.days_at_confidence:.1f} days, {usd(by.cost_usd)}"}
            )
    fronts = [out[i] for i in front]
    return CapacityResult(candidates=out, cheapest=fronts[0] if fronts else None, front=fronts, simulated=simulated)


def plan_grid(
    model, training, clusters: dict, gpus: tuple[int, ...], progress=None
) -> dict[tuple[str, int], Plan | str]:
    """The fastest uniform layout (``make_plan``) of every cluster x GPU count, planned once and
    shared by its spare counts and strategies; where none fits or the count cannot be built, why.
    When no count of any cluster has a plan there is nothing to search: NoLayoutFits (exit code 3)
    if memory is why, else the InputError of the first. A ValidationError from the planner itself
    is a bug and propagates; only the cluster's construction is the user's input."""
    from pydantic import ValidationError

    from ntp_planner.solver.planner import make_plan
    from ntp_planner.solver.search import NoLayoutFits
    from topologies.cluster import Cluster

    plans: dict[tuple[str, int], Plan | str] = {}
    errors: list[InputError] = []
    for name, cluster_spec in clusters.items():
        for n in gpus:
            try:
                cluster = Cluster(spec=cluster_spec, num_gpus=n)
            except ValidationError as exc:
                text = exc.errors()[0]["msg"].removeprefix("Value error, ")
                errors.append(InputError(f"{name}: {' '.join(text.split()).rstrip('.')}"))
            else:
                try:
                    plans[(name, n)] = make_plan(model, training, cluster, top=1, per_layer=False)
                except InputError as exc:
                    errors.append(exc)
            if (name, n) not in plans:
                plans[(name, n)] = f"no layout fits {n:,} GPUs: {' '.join(str(errors[-1]).split()).rstrip('.')}"
            if progress:
                progress(1)
    if len(errors) == len(plans):
        raise (
            errors[0]
            if all(isinstance(e, NoLayoutFits) for e in errors)
            else next(e for e in errors if not isinstance(e, NoLayoutFits))
        )
    return plans
