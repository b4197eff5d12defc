"""The shrink of an MoE re-plan that re-hosts experts (``ReplanResult.experts`` in mode
"rehosted", the plan at ep > 1): the run keeps the plan's EP groups whole, so its degraded
replica runs inside its EP group with the lost members' experts on the survivors the re-plan
names (``hosting.from_replan``), exact against one process like any other run.

An EP group spans several data-parallel replicas whenever ep x etp > tp x cp, so the run picks
replicas by *unit*: the replicas that EP groups tie together (the same at every stage: each
stage's grid is the same over its ranks). Worked example, Mixtral at tp 2, dp 4, ep 4, etp 1
(``RankGrid.expert_groups``: etp fastest, then ep, over the stage's ranks): groups (0, 1, 2, 3)
and (4, 5, 6, 7), units replicas (0, 1) and (2, 3). Rank 7 fails: replica 3 runs at TP 1 on
rank 6, and group (4, 5, 6) holds rank 7's experts as the re-plan says; replicas 2 and 3 run
in lockstep. The run holds unit (2, 3) first, then (0, 1) if the processes allow.

The run has at most ``MAX_EXPERTS`` experts, ep x a whole number (``run._experts``): run expert
``k`` stands for plan expert ``k * E // E_run`` (Mixtral's 8 at ep 8 run as 16, two per plan
expert; DeepSeek's 64 at ep 8 as 16, every fourth), which lives on the same member of a healthy
group (member ``k // (E_run / ep)`` both ways) and where the re-plan moved it in a re-hosted one.
Pure; no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from ntp_planner.executor.parallel.hosting import from_replan
from ntp_planner.executor.spec import StageExperts
from topologies.errors import InputError


@dataclass(frozen=True)
class _Group:
    """One EP group of a run stage as ``from_replan`` reads it: plan ranks, run expert ids."""

    stage: int  # run stage
    ep_group: tuple[int, ...]  # the plan ranks that hold its experts
    owners: tuple[tuple[int, ...], ...]  # per run expert, the plan rank holding it


def plan_expert(k: int, plan_experts: int, run_experts: int) -> int:
    """The plan expert run expert ``k`` stands for.

    >>> [plan_expert(k, 8, 16) for k in range(4)], [plan_expert(k, 64, 16) for k in range(3)]
    ([0, 0, 1, 1], [0, 4, 8])
    """
    return k * plan_experts // run_experts


def stage_groups(plan, stage: int) -> list[tuple[int, ...]]:
    """The plan's EP groups of pipeline ``stage`` (stage outermost in the rank order)."""
    grid = plan.layout.rank_grid
    return [g for g in grid.expert_groups("ep", plan.layout.ep, plan.layout.expert_tp) if grid.coords(g[0]).pp == stage]


def _units(plan) -> list[tuple[int, ...]]:
    """Replicas that EP groups tie together, ascending; the same at every stage."""
    replica = lambda r: plan.layout.rank_grid.coords(r).dp  # noqa: E731
    units: list[set[int]] = []
    for g in stage_groups(plan, 0):
        reps = {replica(r) for r in g}
        touching = [u for u in units if u & reps]
        units = [u for u in units if not u & reps] + [reps.union(*touching)]
    return sorted(tuple(sorted(u)) for u in units)


def _running_ranks(plan, replan, unit) -> set[int]:
    """The plan ranks a unit's replicas run on: each stage's first ``stage_tp`` TP ranks."""
    lay, state = plan.layout, {x.replica: x for x in replan.replicas}
    return {
        lay.rank_grid.rank(tp=i, cp=c, dp=r, pp=s)
        for r in unit
        for s, t in enumerate(state[r].stage_tp)
        for c in range(lay.cp)
        for i in range(t)
    }


def _hostable(plan, replan, unit) -> bool:
    """Whether whole experts can hold ``unit``'s EP groups as the re-plan says: each group it
    runs in is listed (re-hosted on its survivors) or runs whole. Not so for an unfolded plan
    (etp = tp) whose degraded replica keeps its EP groups and re-shards its experts over its
    surviving TP ranks (``failures.experts.lost_ranks``): whole-expert hosting cannot say that."""
    holders = {tuple(sorted(x.ep_group + x.lost)): x.ep_group for x in replan.experts if x.mode == "rehosted"}
    running = _running_ranks(plan, replan, unit)
    groups = [g for s in range(plan.layout.pp) for g in stage_groups(plan, s)]
    return all(set(holders.get(g, g)) <= running for g in groups if set(g) & running)


def hosted_units(plan, replan) -> list[list[tuple[int, list[int], int]]] | None:
    """The picks (plan replica, stage widths, micro-batches) of each unit worth running, the
    units with re-hosted groups first, one per kind (its replicas' widths and batches), dropped
    replicas left out; None when the run cannot host the re-plan's experts (no re-hosted group,
    ep 1, or none whose unit whole experts can hold: ``_hostable``)."""
    lay = plan.layout
    if replan is None or lay.ep == 1 or not any(x.mode == "rehosted" for x in replan.experts):
        return None
    coords = lay.rank_grid.coords
    hit = {coords(r).dp for x in replan.experts if x.mode == "rehosted" for r in x.ep_group + x.lost}
    state = {x.replica: x for x in replan.replicas}
    kinds: dict[tuple, list] = {}
    for unit in sorted(_units(plan), key=lambda u: (not set(u) & hit, u)):
        running = tuple(r for r in unit if state[r].status != "dropped")
        if not running or not _hostable(plan, replan, running):
            continue
        picks = [(r, list(state[r].stage_tp), state[r].local_batch // lay.micro_batch) for r in running]
        kinds.setdefault((bool(set(unit) & hit), tuple((tuple(p[1]), p[2]) for p in picks)), picks)
    units = list(kinds.values())
    return units if units and set(p[0] for p in units[0]) & hit else None


def run_stages(groups: list[tuple[int, ...]], picks: list, widths: list[list[int]]) -> list[int]:
    """The plan stage each run stage stands for: of the plan stages merged into it, the first at
    which every picked replica runs at its run width (its EP groups are that stage's)."""
    out = []
    for j, g in enumerate(groups):
        s = next((s for s in g if all(p[1][s] == ws[j] for p, ws in zip(picks, widths, strict=True))), None)
        if s is None:
            raise InputError(
                f"run stage {j} merges plan stages {'+'.join(map(str, g))}, at which the picked replicas narrow "
                f"differently, so no one stage's EP groups hold its ranks; run {len(g)} times as many stages "
                "(more processes)"
            )
        out.append(s)
    return out


def run_hosting(plan, replan, stages: list[int], rank_of: dict[int, int], experts: int) -> tuple[StageExperts, ...]:
    """The run's hosting: per run stage, the EP groups of the plan stage it stands for
    (``stages``), re-hosted ones as the re-plan's ``owners`` say, the others as the plan's
    contiguous split (member i holds plan experts i q .. (i + 1) q - 1), in the run's ``experts``
    (``plan_expert``) and its process ranks (``rank_of``: plan rank -> process)."""
    total, ep = plan.model.num_experts, plan.layout.ep
    listed = {(x.stage, tuple(sorted(x.ep_group + x.lost))): x for x in replan.experts}
    entries = []
    for j, s in enumerate(stages):
        for g in stage_groups(plan, s):
            x = listed.get((s, g))
            if x is not None and x.mode == "dropped":
                continue  # its replicas are dropped, not run
            members = g if x is None else tuple(x.ep_group)
            owners = [(g[e * ep // total],) for e in range(total)] if x is None else [tuple(o) for o in x.owners]
            entries.append(_Group(j, members, tuple(owners[plan_expert(k, total, experts)] for k in range(experts))))
    return from_replan(entries, len(stages), rank_of)
