"""How many stages, replicas and cp slices of a plan fit the run's processes (``shrink.run``):
the replicas a plain shrink or a re-plan picks (``fit``), or whole expert-parallel groups of
replicas when the run hosts a re-plan's re-hosted experts (``fit_units``). Pure arithmetic on
stage widths; no torch.
"""

from __future__ import annotations

from topologies.errors import InputError


def split_stages(n: int, parts: int) -> list[list[int]]:
    """``n`` stages in ``parts`` contiguous groups, leading groups one larger.

    >>> split_stages(5, 2)
    [[0, 1, 2], [3, 4]]
    """
    base, extra = divmod(n, parts)
    out, start = [], 0
    for i in range(parts):
        size = base + (i < extra)
        out.append(list(range(start, start + size)))
        start += size
    return out


def run_ranks(k: int, reps: list, pp: int, cp: int) -> int:
    """Processes of ``reps`` ((replica, stage widths, micro-batches)) on ``k`` run stages merged
    from the plan's ``pp``: a merged stage runs at its narrowest width, once per cp slice.

    >>> run_ranks(1, [(0, [2, 2], 4), (1, [2, 1], 2)], 2, 1), run_ranks(2, [(0, [2, 2], 4), (1, [2, 1], 2)], 2, 1)
    (3, 7)
    """
    return cp * sum(sum(min(tps[s] for s in g) for g in split_stages(pp, k)) for _, tps, _ in reps)


def fit(picks: list, pp: int, w: int, nproc: int, prefer_replicas: bool, cp: int) -> tuple[int, list, int]:
    """Stages, replicas and context-parallel degree that fit in ``nproc`` processes. Start from
    at most 2 stages, the picked replicas and the plan's cp; while too many, give up replicas,
    then cp, then stages (for a re-plan, whose point is its replicas: stages, cp, replicas);
    then add stages up to 4 while they fit."""
    k, reps, c = min(pp, 2), list(picks), cp
    while run_ranks(k, reps, pp, c) > nproc:
        steps = ["stages", "cp", "replicas"] if prefer_replicas else ["replicas", "cp", "stages"]
        possible = [x for x in steps if {"stages": k > 1, "cp": c > 1, "replicas": len(reps) > 1}[x]]
        if not possible:
            need = run_ranks(1, reps[:1], pp, 1)
            raise InputError(
                f"one replica of this plan needs {need} processes (its stage width); run at least {need} processes"
            )
        if possible[0] == "stages":
            k -= 1
        elif possible[0] == "cp":
            c = 1
        else:
            reps.pop()
    while k < min(pp, 4) and run_ranks(k + 1, reps, pp, c) <= nproc:
        k += 1
    return k, reps, c


def fit_units(units: list[list], pp: int, nproc: int, cp: int) -> tuple[int, list]:
    """Stages and replicas of a run that holds whole EP groups (``units``: lists of picks, the
    replicas one EP group or more span together; the first is the one the run is for). The first
    unit on at most 2 stages, fewer if it needs (a merged stage runs at its narrowest width), at
    the plan's cp (an EP group spans cp slices too); then each further unit that fits; then up
    to 4 stages while they fit. InputError, saying how many processes it needs, when even one
    stage of the first unit does not fit.

    >>> fit_units([[(2, [2], 1), (3, [1], 1)], [(0, [2], 4), (1, [2], 4)]], 1, 7, 1)
    (1, [(2, [2], 1), (3, [1], 1), (0, [2], 4), (1, [2], 4)])
    >>> fit_units([[(2, [2], 1), (3, [1], 1)], [(0, [2], 4), (1, [2], 4)]], 1, 6, 1)[1]
    [(2, [2], 1), (3, [1], 1)]
    """
    first = list(units[0])
    k = min(pp, 2)
    while k > 1 and run_ranks(k, first, pp, cp) > nproc:
        k -= 1
    need = run_ranks(1, first, pp, cp)
    if need > nproc:
        widths = " + ".join(str(min(tps)) for _, tps, _ in first)
        raise InputError(
            f"the re-plan's re-hosted EP group spans plan replicas {', '.join(str(p[0]) for p in first)}, which need "
            f"cp({cp}) x ({widths}) = {need} processes on one stage to run whole; run at least {need} processes"
        )
    picks = first
    for unit in units[1:]:
        if run_ranks(k, picks + list(unit), pp, cp) <= nproc:
            picks = picks + list(unit)
    while k < min(pp, 4) and run_ranks(k + 1, picks, pp, cp) <= nproc:
        k += 1
    return k, picks
