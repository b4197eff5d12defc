"""Spare NVLink domains as a pool every policy draws on, and the fewest that keep a fixed batch.

A pool of K idle domains holds K x g TP slots (g = TP groups per domain). The job may use them
two ways, in any mix:

- replace degraded TP slots, worst first (x of them): the replicas then re-pack the degraded
  slots that are left;
- join as whole extra replicas of R = pp x cp healthy slots each, running the plan's local
  batch, to make up samples that degraded or dropped replicas no longer process (NTP keeps a
  fixed batch this way with a couple of replicas' worth of spares).

The global batch never grows past the plan's: extra replicas only make up what is missing.

Packing puts the degraded slots (worst first) at the end of the replica order, so the last
replicas hold R degraded slots each whatever x is, and only the first degraded replica, which
also holds healthy or spare slots, changes with x. ``reached_by_replacements`` uses that to give
the sequences per step for every x at the cost of one replica decision each; the choice of x
and of the extra replicas is then exhaustive (``best_use``, ``fewest_domains``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class PoolShape:
    """What the pool arithmetic needs of a plan."""

    replicas: int  # dp
    stages: int  # pp
    cp: int
    tp: int
    local: int  # sequences per step of a healthy replica
    target: int  # the global batch
    per_domain: int  # TP slots one spare domain holds

    @property
    def slots(self) -> int:
        """TP slots per replica, R = pp x cp."""
        return self.stages * self.cp


def reached_by_replacements(
    shape: PoolShape, survivors: np.ndarray, sequences: Callable[[tuple[int, ...]], int], most: int | None = None
) -> np.ndarray:
    """Sequences per step, before extra replicas, when the x worst degraded slots are replaced,
    for x = 0 .. len(survivors) (or .. ``most``). ``survivors``: the healthy GPUs of each degraded slot, worst
    first; ``sequences(stage_survivors)``: what a replica whose fewest survivors per stage are
    those runs.

    Example: R = 2 slots per replica (pp 2), 3 replicas of 4 sequences, TP 4, degraded slots
    with 2, 3 and 3 survivors, a replica at TP 3 running 3 sequences and at TP 2 running 1.
    x = 0: the last replica holds (3, 3) -> 3, the first degraded one (4, 2) -> 1, one healthy: 8;
    x = 1: (3, 3) -> 3 and two healthy: 11; x = 2: (4, 3) -> 3 and two healthy: 11; x = 3: 12.

    >>> shape = PoolShape(replicas=3, stages=2, cp=1, tp=4, local=4, target=12, per_domain=1)
    >>> run = lambda stage_min: {4: 4, 3: 3, 2: 1}[min(stage_min)]
    >>> reached_by_replacements(shape, np.array([2, 3, 3]), run).tolist()
    [8, 11, 11, 12]
    """
    R, n = shape.slots, shape.tp
    count = len(survivors)
    kind = lambda slots: sequences(tuple(int(v) for v in slots.reshape(shape.stages, shape.cp).min(axis=1)))  # noqa: E731
    # full degraded replicas from the end: replica k holds survivors[count - (k + 1) R : count - k R]
    full = [0]
    for k in range(count // R):
        full.append(full[-1] + kind(survivors[count - (k + 1) * R : count - k * R]))
    top = count if most is None else min(most, count)
    reached = np.empty(top + 1, dtype=np.int64)
    for x in range(top + 1):
        left = count - x
        k, part = divmod(left, R)
        partial = 0
        if part:
            slots = np.full(R, n, dtype=np.int64)
            slots[R - part :] = survivors[x : x + part]
            partial = kind(slots)
        healthy = shape.replicas - k - (1 if part else 0)
        reached[x] = healthy * shape.local + full[k] + partial
    return reached


def extra_needed(shape: PoolShape, reached: int) -> int:
    """Extra replicas that make up the batch from ``reached`` sequences.

    >>> extra_needed(PoolShape(4, 2, 1, 8, local=8, target=32, per_domain=1), 27)
    1
    """
    return max(0, -(-(shape.target - reached) // shape.local))


def best_use(shape: PoolShape, reached: np.ndarray, pool_domains: int) -> tuple[int, int, int]:
    """(slots replaced, extra replicas, domains used) that keep the most of the batch from a pool of
    ``pool_domains``; among those, the fewest domains, then the most replacements."""
    pool = pool_domains * shape.per_domain
    best = (min(int(reached[0]), shape.target), 0, 0, 0)  # kept, -domains, x, extra
    for x in range(min(pool, len(reached) - 1) + 1):
        extra = min((pool - x) // shape.slots, extra_needed(shape, int(reached[x])))
        kept = min(int(reached[x]) + extra * shape.local, shape.target)
        domains = -(-(x + extra * shape.slots) // shape.per_domain)
        key = (kept, -domains, x, extra)
        if key[:3] > best[:3]:
            best = key
    return best[2], best[3], -best[1]


def fewest_domains(shape: PoolShape, reached: np.ndarray) -> int:
    """The fewest spare domains with which the whole batch is kept: every number of replacements
    tried, each with the extra replicas it still needs.

    >>> shape = PoolShape(replicas=3, stages=2, cp=1, tp=4, local=4, target=12, per_domain=1)
    >>> fewest_domains(shape, np.array([8, 11, 11, 12]))  # x = 0 and one extra replica of 2: 2; x = 3: 3
    2
    """
    need = [
        -(-(x + extra_needed(shape, int(r)) * shape.slots) // shape.per_domain) for x, r in enumerate(reached.tolist())
    ]
    return int(min(need))


def describe(replaced: int, extra: int, domains: int, pool: int) -> str | None:
    """How the pool was used, in one sentence (None when there is no pool).

    >>> describe(1, 2, 17, 20)
    '17 of 20 spare domains used: 1 degraded TP group replaced, 2 extra replicas formed'
    """
    if pool == 0:
        return None
    if domains == 0:
        return f"none of {pool} spare domains used: they would keep no more of the batch"
    s = lambda k, word: f"{k} {word}{'s' if k != 1 else ''}"  # noqa: E731
    parts = [f"{s(replaced, 'degraded TP group')} replaced"] if replaced else []
    parts += [f"{s(extra, 'extra replica')} formed"] if extra else []
    return f"{domains} of {pool} spare domains used: " + ", ".join(parts)
