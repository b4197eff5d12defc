"""Choose a TP degree for every block of a pipeline stage: two exact solvers.

The problem (``ChainProblem``): blocks 0..n-1 in a chain; block i at degree t costs
``time_s[i][t]`` seconds per step and ``memory_bytes[i][t]`` bytes per GPU; changing degree
between consecutive blocks costs ``switch_s[(t, t')]``. Minimise total time subject to total
memory <= ``budget_bytes``.

- ``solve_graph``: shortest path through the layered graph of (block, degree) with networkx
  (Dijkstra); exact when memory does not bind.
- ``solve_counts``: when every switch is free, the same optimum by enumeration: per group of
  identical blocks every split of its blocks over the degrees, kept to the Pareto front of
  (time, memory), fronts of groups merged. Fast for the few groups of a pipeline stage.
- ``solve_milp``: a mixed-integer program for scipy's HiGHS: x[i,t] binary (block i runs at t),
  flow variables y[i,t,t'] >= 0 for each consecutive pair with sum_t' y[i,t,t'] = x[i,t] and
  sum_t y[i,t,t'] = x[i+1,t'] (their LP relaxation is already integral without the memory row),
  and the memory row sum mem * x <= budget. When every switch is free, blocks with identical
  cost tables share one integer count variable per degree, which cannot change the optimum:
  the objective and the memory row then depend only on how many blocks take each degree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

MEMORY_RTOL = 1e-9  # sums of the same floats in another order differ in the last bits


@dataclass(frozen=True)
class ChainProblem:
    time_s: tuple[dict[int, float], ...]
    memory_bytes: tuple[dict[int, float], ...]
    switch_s: dict[tuple[int, int], float] = field(default_factory=dict)
    budget_bytes: float = math.inf

    def __post_init__(self):
        if len(self.time_s) != len(self.memory_bytes) or not self.time_s:
            raise ValueError("a chain needs at least one block, with time and memory for each")
        for i, (t, m) in enumerate(zip(self.time_s, self.memory_bytes, strict=True)):
            if not t or set(t) != set(m):
                raise ValueError(f"block {i} needs the same non-empty set of degrees for time and memory")

    def switch(self, a: int, b: int) -> float:
        return 0.0 if a == b else self.switch_s.get((a, b), 0.0)

    def objective(self, degrees: tuple[int, ...]) -> float:
        total = sum(self.time_s[i][t] for i, t in enumerate(degrees))
        return total + sum(self.switch(a, b) for a, b in zip(degrees, degrees[1:], strict=False))

    def memory(self, degrees: tuple[int, ...]) -> float:
        return sum(self.memory_bytes[i][t] for i, t in enumerate(degrees))

    def fits(self, memory_bytes: float) -> bool:
        """Within the budget, up to the rounding of summing floats (relative 1e-9): every solver
        and every check uses this one test."""
        return memory_bytes <= self.budget_bytes * (1 + MEMORY_RTOL)


@dataclass(frozen=True)
class ChainSolution:
    degrees: tuple[int, ...]
    time_s: float
    memory_bytes: float


def _solution(p: ChainProblem, degrees) -> ChainSolution:
    degrees = tuple(int(t) for t in degrees)
    return ChainSolution(degrees, p.objective(degrees), p.memory(degrees))


def solve_graph(p: ChainProblem) -> ChainSolution:
    """Shortest path over (block, degree) vertices; ignores the memory budget."""
    import networkx as nx

    g = nx.DiGraph()
    n = len(p.time_s)
    for t, cost in p.time_s[0].items():
        g.add_edge("start", (0, t), weight=cost)
    for i in range(n - 1):
        for a in p.time_s[i]:
            for b, cost in p.time_s[i + 1].items():
                g.add_edge((i, a), (i + 1, b), weight=p.switch(a, b) + cost)
    for t in p.time_s[-1]:
        g.add_edge((n - 1, t), "end", weight=0.0)
    path = nx.dijkstra_path(g, "start", "end", weight="weight")
    return _solution(p, [t for _, t in path[1:-1]])


def solve_milp(p: ChainProblem) -> ChainSolution | None:
    """Exact optimum under the memory budget; None when no assignment fits."""
    if not any(p.switch(a, b) for a in _all_degrees(p) for b in _all_degrees(p)):
        return _solve_counts(p)
    return _solve_binary(p)


def groups(p: ChainProblem) -> dict[tuple, list[int]]:
    """Blocks with identical cost tables: ((time items), (memory items)) -> block indices."""
    out: dict[tuple, list[int]] = {}
    for i, (t, m) in enumerate(zip(p.time_s, p.memory_bytes, strict=True)):
        out.setdefault((tuple(sorted(t.items())), tuple(sorted(m.items()))), []).append(i)
    return out


def _all_degrees(p: ChainProblem) -> set[int]:
    return {t for table in p.time_s for t in table}


def _run_milp(c, a_rows, lo, hi, integrality, upper):
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import csr_array

    a = csr_array(np.array(a_rows, dtype=float)) if a_rows else None
    cons = [LinearConstraint(a, lo, hi)] if a is not None else []
    res = milp(
        c=np.asarray(c, float),
        constraints=cons,
        integrality=np.asarray(integrality),
        bounds=Bounds(np.zeros(len(c)), np.asarray(upper, float)),
    )
    return res.x if res.status == 0 else None


def _memory_row(budget: float) -> tuple[float, float]:
    return (-np.inf, budget * (1 + MEMORY_RTOL) if math.isfinite(budget) else np.inf)


def _solve_binary(p: ChainProblem) -> ChainSolution | None:
    n = len(p.time_s)
    xs = [(i, t) for i in range(n) for t in sorted(p.time_s[i])]
    ys = [(i, a, b) for i in range(n - 1) for a in sorted(p.time_s[i]) for b in sorted(p.time_s[i + 1])]
    xi = {k: j for j, k in enumerate(xs)}
    yi = {k: len(xs) + j for j, k in enumerate(ys)}
    nv = len(xs) + len(ys)
    c = [p.time_s[i][t] for i, t in xs] + [p.switch(a, b) for _, a, b in ys]
    rows, lo, hi = [], [], []

    def row(entries, low, high):
        r = np.zeros(nv)
        for j, v in entries:
            r[j] += v
        rows.append(r)
        lo.append(low)
        hi.append(high)

    for i in range(n):  # one degree per block
        row([(xi[(i, t)], 1.0) for t in p.time_s[i]], 1.0, 1.0)
    for i in range(n - 1):  # flow conservation links consecutive choices
        for a in p.time_s[i]:
            row([(yi[(i, a, b)], 1.0) for b in p.time_s[i + 1]] + [(xi[(i, a)], -1.0)], 0.0, 0.0)
        for b in p.time_s[i + 1]:
            row([(yi[(i, a, b)], 1.0) for a in p.time_s[i]] + [(xi[(i + 1, b)], -1.0)], 0.0, 0.0)
    if math.isfinite(p.budget_bytes):
        row([(xi[(i, t)], p.memory_bytes[i][t]) for i, t in xs], *_memory_row(p.budget_bytes))
    x = _run_milp(c, rows, lo, hi, [1] * len(xs) + [0] * len(ys), [1.0] * nv)
    if x is None:
        return None
    chosen = {i: t for (i, t) in xs if x[xi[(i, t)]] > 0.5}
    return _solution(p, [chosen[i] for i in range(n)])


def _solve_counts(p: ChainProblem) -> ChainSolution | None:
    """Free switches: group blocks with identical tables; integer count per (group, degree)."""
    grouped = groups(p)
    keys = list(grouped)
    vs = [(g, t) for g, key in enumerate(keys) for t, _ in key[0]]
    c = [dict(keys[g][0])[t] for g, t in vs]
    rows, lo, hi = [], [], []
    for g, key in enumerate(keys):
        rows.append([1.0 if vg == g else 0.0 for vg, _ in vs])
        lo.append(len(grouped[key]))
        hi.append(len(grouped[key]))
    if math.isfinite(p.budget_bytes):
        rows.append([dict(keys[g][1])[t] for g, t in vs])
        low, high = _memory_row(p.budget_bytes)
        lo.append(low)
        hi.append(high)
    upper = [len(grouped[keys[g]]) for g, _ in vs]
    x = _run_milp(c, rows, lo, hi, [1] * len(vs), upper)
    if x is None:
        return None
    degrees = [0] * len(p.time_s)
    unfilled = {g: iter(grouped[key]) for g, key in enumerate(keys)}
    for (g, t), count in zip(vs, np.rint(x).astype(int), strict=True):
        for _ in range(count):
            degrees[next(unfilled[g])] = t
    return _solution(p, degrees)


@lru_cache(maxsize=256)
def compositions(n: int, k: int) -> np.ndarray:
    """Every way to write n as an ordered sum of k non-negative integers, one per row, in
    lexicographic order. Built a part at a time: each row of the first j parts is repeated once
    per value its next part can take (0 .. what is left), so the work is the size of the output.
    Read-only, as the cache shares it.

    >>> compositions(2, 2).tolist()
    [[0, 2], [1, 1], [2, 0]]
    >>> compositions(3, 3).shape
    (10, 3)
    """
    rows = np.zeros((1, 0), dtype=np.int64)
    left = np.array([n], dtype=np.int64)
    for _ in range(k - 1):
        counts = left + 1
        starts = np.repeat(np.cumsum(counts) - counts, counts)
        part = np.arange(int(counts.sum()), dtype=np.int64) - starts  # 0 .. left, row by row
        rows = np.column_stack([np.repeat(rows, counts, axis=0), part])
        left = np.repeat(left, counts) - part
    parts = np.column_stack([rows, left])
    parts.flags.writeable = False
    return parts


def _front(cost: np.ndarray, mem: np.ndarray) -> np.ndarray:
    """Indices of the (cost, memory) Pareto front, cheapest first."""
    order = np.lexsort((mem, cost))
    best_mem = np.minimum.accumulate(mem[order])
    keep = np.ones(len(order), dtype=bool)
    keep[1:] = mem[order][1:] < best_mem[:-1]
    return order[keep]


def solve_counts(p: ChainProblem) -> ChainSolution | None:
    """Exact optimum when switches are free: only how many blocks of each group take each
    degree matters. Enumerates splits per group, keeps Pareto fronts, merges them."""
    grouped = groups(p)
    # front entries: (cost, memory, per-group choice index)
    cost, mem, picks = np.zeros(1), np.zeros(1), np.zeros((1, 0), dtype=np.int64)
    options = []
    for (times, mems), members in grouped.items():
        comps = compositions(len(members), len(times))
        c = comps @ np.array([v for _, v in times])
        m = comps @ np.array([v for _, v in mems])
        keep = _front(c, m)
        options.append((comps[keep], [t for t, _ in times]))
        c, m = c[keep], m[keep]
        cost = (cost[:, None] + c[None, :]).ravel()
        mem = (mem[:, None] + m[None, :]).ravel()
        picks = np.column_stack([np.repeat(picks, len(keep), axis=0), np.tile(np.arange(len(keep)), len(picks))])
        front = _front(cost, mem)
        cost, mem, picks = cost[front], mem[front], picks[front]
    fits = np.flatnonzero(mem <= p.budget_bytes * (1 + MEMORY_RTOL))
    if fits.size == 0:
        return None
    best = fits[np.argmin(cost[fits])]
    degrees = [0] * len(p.time_s)
    for (members, (comps, degs)), pick in zip(zip(grouped.values(), options, strict=True), picks[best], strict=True):
        it = iter(members)
        for t, count in zip(degs, comps[pick], strict=True):
            for _ in range(int(count)):
                degrees[next(it)] = t
    return _solution(p, degrees)


def lagrangian_bound(p: ChainProblem, points: int = 49) -> float:
    """A lower bound on the optimum with free switches, without a solver: for any lam >= 0,
    sum_i min_t (time + lam * memory) - lam * budget is at most the optimum (Lagrangian
    relaxation of the memory row). Takes the best of a geometric grid of lam; inf if even the
    leanest degrees overflow the budget."""
    grouped = groups(p)
    counts = np.array([len(members) for members in grouped.values()], dtype=float)
    width = max(len(times) for times, _ in grouped)
    times = np.full((len(grouped), width), np.inf)
    mems = np.full((len(grouped), width), np.inf)
    for r, (t_items, m_items) in enumerate(grouped):
        times[r, : len(t_items)] = [v for _, v in t_items]
        mems[r, : len(m_items)] = [v for _, v in m_items]
    if counts @ mems.min(axis=1) > p.budget_bytes:
        return math.inf
    free = counts @ times.min(axis=1)
    if not math.isfinite(p.budget_bytes):
        return free
    scale = free / max(p.budget_bytes, 1.0)
    lams = np.concatenate([[0.0], scale * np.logspace(-3, 3, points)])
    values = (counts[None, :] * np.min(times[None] + lams[:, None, None] * mems[None], axis=2)).sum(axis=1)
    return float(np.max(values - lams * p.budget_bytes))
