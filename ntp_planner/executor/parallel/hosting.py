"""Explicit expert hosting (``spec.StageExperts``): the folded grid at etp 1 written out, and the
re-hosting after a failure, when the failed rank's experts move to the survivors of its EP group
(NTP beside EP: its replica runs at reduced TP, its EP group keeps every expert). Pure; no torch.

Worked example: tp 2, dp 2 (ranks 0-3), etp 1, ep 2: EP groups (0, 1) and (2, 3), each rank two
whole experts. Rank 3 fails: its experts 2 and 3 go to rank 2, the one survivor of its group;
ranks close the gap (none above 3 here):

>>> from ntp_planner.executor.spec import StageExperts
>>> healthy = (StageExperts(((0, 1), (2, 3)), ((0, 2), (0, 2), (1, 3), (1, 3))),)
>>> rehost(healthy, 3)[0]
StageExperts(groups=((0, 1), (2,)), owners=((0, 2), (0, 2), (1, 2), (1, 2)))
>>> moves(healthy, 3)
{(0, 2): (1, 2), (0, 3): (1, 2)}
"""

from __future__ import annotations

from cost_models.rank_grid import rehost_experts
from ntp_planner.executor.groups import expert_seat, stage_ranks
from ntp_planner.executor.spec import RunSpec, StageExperts


def as_hosting(spec: RunSpec) -> tuple[StageExperts, ...]:
    """The run's placement of experts written out whole, per stage: its EP groups, each rank
    holding whole the experts it holds (a slice of, before folding or at etp > 1). At etp 1 it
    is the folded grid itself; otherwise the whole-expert layout a live run moves to after a
    failure (``elastic.relayout``)."""
    out = []
    for s in range(spec.pp):
        groups, owners = {}, [[] for _ in range(spec.cfg.experts)]
        for r in stage_ranks(spec, s):
            seat = expert_seat(spec, r, spec.replicas[spec.locate(r)[0]].stages[s].blocks[0].degree)
            groups[seat.ep_ranks] = None
            for e in seat.mine:
                owners[e].append(r)
        out.append(StageExperts(tuple(groups), tuple(tuple(o) for o in owners)))
    return tuple(out)


def _rehosted(host: StageExperts, failed: int) -> dict[int, int]:
    """expert -> the survivor of ``failed``'s EP group that takes it over (old rank numbers):
    each in turn to the survivor holding the fewest, lowest rank on a tie."""
    group = next((g for g in host.groups if failed in g), None)
    if group is None:
        return {}
    survivors = [r for r in group if r != failed]
    if not survivors:
        raise ValueError(f"rank {failed} was the last of its EP group {group}: nobody can take its experts")
    mine = [next(r for r in owners if r in group) for owners in host.owners]  # each expert's holder in the group
    moved = rehost_experts(mine, list(group), {failed})
    return {e: to for e, (was, to) in enumerate(zip(mine, moved, strict=True)) if was != to}


def rehost(hosting: tuple[StageExperts, ...], failed: int) -> tuple[StageExperts, ...]:
    """``hosting`` after rank ``failed`` is lost: on its stage its experts re-hosted on the
    survivors of its EP group (``_rehosted``), then every rank above it renumbered one down (the
    live ranks in order, as ``spec.make_spec`` numbers a replica that lost a rank)."""
    new = lambda r: r - (r > failed)  # noqa: E731
    out = []
    for host in hosting:
        taken = _rehosted(host, failed)
        owners = tuple(tuple(sorted(new(taken[e] if r == failed else r) for r in o)) for e, o in enumerate(host.owners))
        groups = tuple(tuple(new(r) for r in g if r != failed) for g in host.groups)
        out.append(StageExperts(groups, owners))
    return tuple(out)


def moves(hosting: tuple[StageExperts, ...], failed: int) -> dict[tuple[int, int], tuple[int, int]]:
    """(stage, expert) -> (the rank that sends its rows and AdamW state, the rank that takes it
    over), in the numbering after the failure: the sender is a surviving holder of the same
    expert in another EP group (its expert-data-parallel replica), lowest rank first."""
    new = lambda r: r - (r > failed)  # noqa: E731
    out = {}
    for s, host in enumerate(hosting):
        for e, to in _rehosted(host, failed).items():
            peers = [r for r in host.owners[e] if r != failed]
            if not peers:
                raise ValueError(f"expert {e} of stage {s} had no other holder than rank {failed}: its state is lost")
            out[s, e] = (new(min(peers)), new(to))
    return out


def _spread(group: tuple[int, ...], holders: list[set[int]]) -> list[int]:
    """Expert -> the one member of ``group`` that holds it: a member that held it already where
    there is one (the one holding the fewest so far, lowest rank on a tie), then each expert
    no member held to the member holding the fewest."""
    held, out = dict.fromkeys(group, 0), [-1] * len(holders)
    for orphans in (False, True):
        for e, had in enumerate(holders):
            keep = [r for r in group if r in had]
            if bool(keep) == orphans or out[e] >= 0:
                continue
            out[e] = min(keep or group, key=lambda r: (held[r], r))
            held[out[e]] += 1
    return out


def lockstep(hosting: tuple[StageExperts, ...], kind: dict[int, object]) -> tuple[StageExperts, ...]:
    """``hosting`` with every EP group inside one lockstep class (``kind[rank]``: its pipeline's
    micro-batches; the ranks of a group meet in every all-to-all, so they must run the same
    micro-batches). A group whose ranks differ splits by class; the parts of one class that no
    longer hold every expert merge into one group (a degraded replica's own ranks: EP over its
    TP ranks), and every group then holds each expert once (``_spread``: kept where a member
    held it, else to the member holding the fewest)."""
    out = []
    for host in hosting:
        whole, short = [], {}
        for g in host.groups:
            for k in dict.fromkeys(kind[r] for r in g):
                part = tuple(r for r in g if kind[r] == k)
                if all(any(r in o for r in part) for o in host.owners):
                    whole.append(part)
                else:
                    short[k] = short.get(k, ()) + part
        groups = tuple(sorted(whole + [tuple(sorted(p)) for p in short.values()]))
        owners = [[] for _ in host.owners]
        for g in groups:
            for e, r in enumerate(_spread(g, [set(o) for o in host.owners])):
                owners[e].append(r)
        out.append(StageExperts(groups, tuple(tuple(sorted(o)) for o in owners)))
    return tuple(out)


def from_replan(entries, pp: int, rank_of: dict[int, int]) -> tuple[StageExperts, ...]:
    """The executor's hosting from a re-plan's expert hosting (``ReplanResult``'s ``experts``:
    per stage and EP group an entry with ``stage``, ``ep_group``, the group's global ranks, and
    ``owners``, per expert id the global ranks holding it), ``rank_of`` giving the run's rank of
    each global rank it keeps (the others are left out, with the groups they empty).

    >>> from types import SimpleNamespace as E
    >>> x = [E(stage=0, ep_group=(8, 9), owners=((8,), (9,))), E(stage=0, ep_group=(10,), owners=((10,), (10,)))]
    >>> from_replan(x, 1, {8: 0, 9: 1, 10: 2})
    (StageExperts(groups=((0, 1), (2,)), owners=((0, 2), (1, 2))),)
    """
    out = []
    for s in range(pp):
        mine = [x for x in entries if x.stage == s]
        groups = [tuple(rank_of[r] for r in x.ep_group if r in rank_of) for x in mine]
        experts = len(mine[0].owners) if mine else 0
        owners = tuple(
            tuple(sorted(rank_of[r] for x in mine for r in x.owners[e] if r in rank_of and r in x.ep_group))
            for e in range(experts)
        )
        out.append(StageExperts(tuple(g for g in groups if g), owners))
    return tuple(out)
