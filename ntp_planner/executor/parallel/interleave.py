"""The order of Megatron's interleaved 1F1B schedule, and a timeline that runs it without
deadlock. Pure arithmetic, no torch: ``pipeline`` follows the timeline.

With ``vpp`` model chunks per stage (chunk c on stage c % pp as its virtual chunk c // pp), a
stage runs micro-batches in groups of ``pp`` per chunk (Megatron-Core's default
``microbatch_group_size_per_vp_stage``): forwards of the group's micro-batches through virtual
chunk 0, then chunk 1, ..., then the next group. Backwards follow the same table with the chunks
reversed. Stage s of P first runs ``2 (P - s - 1) + (vpp - 1) P`` warm-up forwards (capped at
its m vpp passes; all of them when m = P, as Megatron's ``all_warmup_microbatches``), then
alternates one forward and one backward, then drains the backwards (``schedules.py``:
``get_pp_rank_microbatches``, ``get_schedule_table``). With ``vpp`` 1 this is plain 1F1B
(P - s - 1 warm-up forwards).

Worked example, pp 2, vpp 2, m 4 (table: mb/chunk 0/0 1/0 0/1 1/1 2/0 3/0 2/1 3/1). Stage 0
warms up with 2 + 2 = 4 forwards, stage 1 with 2:

>>> " ".join(f"{k}{mb}.{v}" for k, mb, v in order(2, 2, 4, 0))
'F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0'
>>> " ".join(f"{k}{mb}.{v}" for k, mb, v in order(2, 2, 4, 1))
'F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0'

Data flow: the output of (mb, v) on stage s feeds (mb, v) on stage s + 1, and on the last stage
(mb, v + 1) on stage 0; gradients travel the reverse way.
"""

from __future__ import annotations

Action = tuple[str, int, int]  # ("F" or "B", micro-batch, virtual chunk)


def table(m: int, vpp: int, group: int) -> list[tuple[int, int]]:
    """(micro-batch, virtual chunk) of every forward in order: groups of ``group`` micro-batches
    (the last group takes the rest), each through chunk 0, then 1, ...

    >>> table(5, 2, 3)  # Megatron's own example: PP2 N3 M5 VP2
    [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1), (3, 0), (4, 0), (3, 1), (4, 1)]
    """
    out = []
    for first in range(0, m, group):
        mbs = range(first, m if first + group >= m else first + group)
        out += [(mb, v) for v in range(vpp) for mb in mbs]
    return out


def warmup(pp: int, vpp: int, m: int, stage: int) -> int:
    """Forwards before the first backward on ``stage``. Interleaved with as many micro-batches
    as stages, Megatron runs every forward, then every backward (``all_warmup_microbatches`` in
    ``get_pp_rank_microbatches``).

    >>> [warmup(4, 2, 8, s) for s in range(4)], [warmup(4, 1, 8, s) for s in range(4)]
    ([10, 8, 6, 4], [3, 2, 1, 0])
    >>> [warmup(4, 2, 4, s) for s in range(4)]
    [8, 8, 8, 8]
    """
    if vpp > 1 and m == pp:
        return m * vpp
    n = pp - stage - 1 if vpp == 1 else 2 * (pp - stage - 1) + (vpp - 1) * pp
    return min(n, m * vpp)


def order(pp: int, vpp: int, m: int, stage: int) -> list[Action]:
    """Every forward and backward ``stage`` runs in one step, in order (module docstring)."""
    rows = table(m, vpp, pp)
    fwd = [("F", mb, v) for mb, v in rows]
    bwd = [("B", mb, vpp - 1 - v) for mb, v in rows]
    w = warmup(pp, vpp, m, stage)
    steady = [a for k in range(len(rows) - w) for a in (fwd[w + k], bwd[k])]
    return fwd[:w] + steady + bwd[len(rows) - w :]


def needs(pp: int, vpp: int, stage: int, action: Action) -> list[tuple[int, Action]]:
    """(stage, action) whose output ``action`` on ``stage`` consumes: the previous chunk's forward,
    or the next chunk's backward (and the micro-batch's own forward)."""
    kind, mb, v = action
    if kind == "F":
        if stage > 0:
            return [(stage - 1, ("F", mb, v))]
        return [(pp - 1, ("F", mb, v - 1))] if v > 0 else []
    own = [(stage, ("F", mb, v))]
    if stage < pp - 1:
        return own + [(stage + 1, ("B", mb, v))]
    return own + ([(0, ("B", mb, v + 1))] if v < vpp - 1 else [])


def timeline(pp: int, vpp: int, m: int) -> list[tuple[Action | None, ...]]:
    """The schedule in ticks: in each tick every stage runs its next action if what it consumes
    was produced in an earlier tick (else it idles), then every stage exchanges its output with
    its neighbours. Each stage keeps ``order``; a tick in which no stage can move would be a
    deadlock, and raises.

    >>> [" ".join(f"{a[0]}{a[1]}.{a[2]}" if a else "--" for a in t) for t in timeline(2, 1, 2)]
    ['F0.0 --', 'F1.0 F0.0', '-- B0.0', 'B0.0 F1.0', '-- B1.0', 'B1.0 --']
    """
    orders = [order(pp, vpp, m, s) for s in range(pp)]
    done: dict[tuple[int, Action], int] = {}
    at = [0] * pp
    ticks: list[tuple[Action | None, ...]] = []
    while any(at[s] < len(orders[s]) for s in range(pp)):
        t = len(ticks)
        row = []
        for s in range(pp):
            a = orders[s][at[s]] if at[s] < len(orders[s]) else None
            ready = a is not None and all(done.get(d, t) < t for d in needs(pp, vpp, s, a))
            row.append(a if ready else None)
            at[s] += ready
        if not any(row):
            raise RuntimeError(f"the interleaved order deadlocks at tick {t} (pp {pp}, vpp {vpp}, m {m})")
        done.update({(s, a): t for s, a in enumerate(row) if a is not None})
        ticks.append(tuple(row))
    return ticks


def destination(pp: int, vpp: int, stage: int, action: Action) -> tuple[int, Action] | None:
    """(stage, action) that consumes the output of ``action`` on ``stage``; None for the loss
    (last chunk's forward) and the first chunk's backward on stage 0.

    >>> destination(2, 2, 1, ("F", 3, 0)), destination(2, 2, 0, ("B", 3, 1))
    ((0, ('F', 3, 1)), (1, ('B', 3, 0)))
    """
    kind, mb, v = action
    if kind == "F":
        if stage < pp - 1:
            return stage + 1, ("F", mb, v)
        return (0, ("F", mb, v + 1)) if v < vpp - 1 else None
    if stage > 0:
        return stage - 1, ("B", mb, v)
    return (pp - 1, ("B", mb, v - 1)) if v > 0 else None
