"""Capacity planning: which cluster, how many GPUs, how many spare domains and which fault strategy
train ``tokens`` by the deadline with the asked confidence, at the lowest cost.

Every cluster x GPU count x spare count x strategy is a candidate. Each (cluster, GPU count) is
planned once (``capacity_job.plan_grid``: the fastest uniform layout), and its plan, failures,
failure states and re-planned throughputs are shared by its spare counts and strategies
(``capacity_job.Job``); every candidate meets the same failures (common random numbers,
``capacity_sim.EventPool``). A candidate is simulated until its tokens are trained
(``capacity_sim``): P50 / P90 time to train, the probability of meeting the deadline, GPU-hours
and cost with the spare domains paid for (whole NVLink domains: a job of 4,096 GPUs in 72-GPU
racks pays for 57 racks).

A candidate *meets the deadline* when P(time to train <= deadline) >= confidence. Among those,
the time/cost front (``capacity_front``): time = the time to train at the confidence (its
quantile), cost = the mean cost; the cheapest is the front's first (ties: the faster, then the
earlier in the grid).

Pruned without simulating, with no change to the answer (a test checks it against the search
that simulates everything):
- a candidate whose failure-free time to train is past the deadline: it never meets it (failures
  only slow a job down: each bin trains at most at the failure-free speed, restart's runs at most
  as fast as its first);
- a candidate whose lower bounds (failure-free time, cost at that time) are no better than a
  simulated candidate that meets the deadline, and worse in one: it is dominated, whatever its
  failures, so it is neither on the front nor the cheapest. Candidates go cheapest bound first.

The spec, a candidate and the result, and the workload a search may ask for: ``capacity_spec``.
"""

from __future__ import annotations

from collections.abc import Callable

from ntp_planner.failures import capacity_sim as sim
from ntp_planner.failures.capacity_front import rank, usd
from ntp_planner.failures.capacity_job import Job, candidate_bounds, simulate_candidate
from ntp_planner.failures.capacity_spec import MAX_CELLS, Candidate, CapacityResult, CapacitySpec, check_workload
from ntp_planner.plan import Plan

MAX_CACHED_CELLS = 2 * MAX_CELLS  # failures kept for the next candidates of recently simulated jobs
BOUND_TOLERANCE = 1e-9  # bounds are lowered by this share: a simulated time may round below its exact bound


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
    grid = _grid(spec, plans, domain_sizes, prices)
    order = sorted(range(len(grid)), key=lambda i: (grid[i][1].cost_usd or 0.0, grid[i][1].failure_free_days or 0.0, i))
    done: dict[int, Candidate] = {}
    winners: list[Candidate] = []  # simulated, meeting the deadline
    recent: list[Job] = []  # jobs holding failures, the least recently simulated first
    simulated = 0
    for i in order:
        job, bound = grid[i]
        done[i] = _pruned(spec, bound, winners) if prune and job.plan is not None else bound
        if not done[i].reason:
            done[i] = simulate_candidate(spec, pool, job, bound)
            simulated += 1
            recent = _forget_failures([j for j in recent if j is not job] + [job])
            if done[i].p_deadline >= spec.confidence:
                winners.append(done[i])
        if progress:
            progress(1)
    return rank(spec, [done[i] for i in range(len(grid))], simulated)


def _grid(
    spec: CapacitySpec, plans: dict[tuple[str, int], Plan | str], domain_sizes: dict[str, int], prices: dict[str, float]
) -> list[tuple[Job, Candidate]]:
    """Every candidate in grid order (cluster, GPUs, spares, strategy), before simulating, with the
    job it shares with the other spare counts and strategies of its cluster and GPU count."""
    grid = []
    for (name, n), plan in plans.items():
        job = Job(
            name,
            n,
            domain_sizes[name],
            plan if isinstance(plan, Plan) else None,
            "" if isinstance(plan, Plan) else plan,
        )
        for k in spec.spares:
            for s in spec.strategies:
                grid.append((job, candidate_bounds(spec, job, k, s, prices[name])))
    return grid


def _forget_failures(recent: list[Job]) -> list[Job]:
    """Drop the failures of the least recently simulated jobs (``recent``, oldest first) while
    all of them hold more than MAX_CACHED_CELLS trial-bins, never the last one's: a grid of 64
    GPU counts x 3 clusters would otherwise keep ~160 MB a job. They are drawn again, the same
    (``EventPool``), if one of their candidates comes later. The jobs still holding some."""
    cells = [sum(f.stall_s.size for f in job.failures.values()) for job in recent]
    while len(recent) > 1 and sum(cells) > MAX_CACHED_CELLS:
        recent[0].failures.clear()
        recent, cells = recent[1:], cells[1:]
    return recent


def _pruned(spec: CapacitySpec, bound: Candidate, winners: list[Candidate]) -> Candidate:
    """The candidate of a job with a plan, with a reason when it loses without simulating: a
    failure-free time past the deadline, or bounds dominated by a simulated winner."""
    t, c = bound.failure_free_days * (1 - BOUND_TOLERANCE), bound.cost_usd * (1 - BOUND_TOLERANCE)
    if t > spec.deadline_days:
        return bound.model_copy(
            update={
                "p_deadline": 0.0,
                "reason": f"too slow: {bound.failure_free_days:.1f} days even without failures, past the "
                f"{spec.deadline_days:g}-day deadline",
            }
        )
    for w in winners:
        if (w.days_at_confidence < t and w.cost_usd <= c) or (w.days_at_confidence <= t and w.cost_usd < c):
            return bound.model_copy(
                update={"reason": f"dominated by {w.label}: it needs at least {t:.1f} days and {usd(c)}"}
            )
    return bound
