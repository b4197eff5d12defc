"""One cluster x GPU count of ``ntp capacity``'s grid, and its candidates (spare counts x
strategies): planned once (``plan_grid``), bounded before simulating (``candidate_bounds``: the
failure-free time and its cost, lower bounds of both) and simulated until the tokens are trained
(``train_hours``, ``simulate_candidate``).

A ``Job`` holds what its candidates share: the plan, the re-planned throughputs per spare pool
(one re-planner and its memos) and the failures it met per horizon, drawn from the search's
``capacity_sim.EventPool`` (common random numbers).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import numpy as np

from ntp_planner.failures import capacity_sim as sim
from ntp_planner.failures.capacity_spec import (
    HORIZON_SLACK,
    MAX_CELLS,
    MAX_HORIZON_H,
    MAX_SLOWDOWN,
    Candidate,
    CapacitySpec,
)
from ntp_planner.failures.checkpoint_interval import daly_interval_s
from ntp_planner.failures.tables import ThroughputTables
from ntp_planner.plan import Plan
from topologies.errors import InputError


@dataclass
class Job:
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


def plan_grid(
    model, training, clusters: dict, gpus: tuple[int, ...], progress=None
) -> dict[tuple[str, int], Plan | str]:
    """The fastest uniform layout (``make_plan``) of every cluster x GPU count, planned once and
    shared by its spare counts and strategies; where none fits or the count cannot be built, why.
    When no count of any cluster has a plan there is nothing to search: NoLayoutFits (exit code 3)
    if memory is why, else the InputError of the first. A ValidationError from the planner itself
    is a bug and propagates; only the cluster's construction is the user's input."""
    from ntp_planner.solver.search import NoLayoutFits

    plans: dict[tuple[str, int], Plan | str] = {}
    errors: list[InputError] = []
    for name, cluster_spec in clusters.items():
        for n in gpus:
            plan = _plan_or_error(model, training, name, cluster_spec, n)
            if isinstance(plan, InputError):
                errors.append(plan)
                plan = f"no layout fits {n:,} GPUs: {' '.join(str(plan).split()).rstrip('.')}"
            plans[(name, n)] = plan
            if progress:
                progress(1)
    if len(errors) == len(plans):
        raise (
            errors[0]
            if all(isinstance(e, NoLayoutFits) for e in errors)
            else next(e for e in errors if not isinstance(e, NoLayoutFits))
        )
    return plans


def _plan_or_error(model, training, name: str, cluster_spec, n: int) -> Plan | InputError:
    """The plan of ``n`` GPUs of the cluster, or the InputError that says why there is none: the
    cluster refusing ``n`` (its ValidationError's sentence, prefixed with its name) or the planner."""
    from pydantic import ValidationError

    from ntp_planner.solver.planner import make_plan
    from topologies.cluster import Cluster

    try:
        cluster = Cluster(spec=cluster_spec, num_gpus=n)
    except ValidationError as exc:
        text = exc.errors()[0]["msg"].removeprefix("Value error, ")
        return InputError(f"{name}: {' '.join(text.split()).rstrip('.')}")
    try:
        return make_plan(model, training, cluster, top=1, per_layer=False)
    except InputError as exc:
        return exc


def checkpoint_interval(spec: CapacitySpec, gpus: int) -> tuple[float, float]:
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


def candidate_bounds(spec: CapacitySpec, job: Job, k: int, strategy: str, price: float) -> Candidate:
    """The candidate before simulation: its layout, failure-free time and the cost at that time
    (both lower bounds), or, without a plan, why."""
    paid = (job.paid_domains + k) * job.domain_size
    base = Candidate(
        cluster=job.cluster, gpus=job.gpus, spares=k, strategy=strategy, paid_gpus=paid, usd_per_gpu_hour=price
    )
    if job.plan is None:
        return base.model_copy(update={"reason": job.reason})
    interval, productive = checkpoint_interval(spec, job.gpus)
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


def job_tables(job: Job, spec: CapacitySpec, k: int) -> ThroughputTables:
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


def train_hours(spec: CapacitySpec, pool: sim.EventPool, job: Job, k: int, strategy: str) -> np.ndarray:
    """Per trial, hours to train ``spec.tokens``: simulated over a horizon that doubles while a
    trial is not done, up to MAX_SLOWDOWN times the failure-free time (then inf)."""
    interval, productive = checkpoint_interval(spec, job.gpus)
    work_s = spec.tokens / job.plan.predicted.tokens_per_s
    cap = min(MAX_HORIZON_H, MAX_SLOWDOWN * work_s / productive / 3600 + 24, MAX_CELLS / spec.trials * sim.BIN_S / 3600)
    horizon = _whole_bins(HORIZON_SLACK * work_s / productive / 3600 + 24)
    tables = job_tables(job, spec, k)
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


def simulate_candidate(spec: CapacitySpec, pool: sim.EventPool, job: Job, bound: Candidate) -> Candidate:
    """The candidate's time-to-train distribution and what it costs, the spares paid for
    (``bound``: the candidate before simulating, ``candidate_bounds``)."""
    hours = train_hours(spec, pool, job, bound.spares, bound.strategy)
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
