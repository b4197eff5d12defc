"""Per-layer TP planning: stage problems from the cost model, the pipeline partition, and the
search over every candidate layout.

A candidate fixes the stage width G (= layout.tp), pp, dp, cp, ep, micro-batch, interleaving and
recompute; each block (embedding, every layer, LM head) then picks a degree t dividing G. For a
candidate:

1. Every block's cost at every allowed degree comes from cost_models (``CostEnv``): time per
   micro-batch, bytes per GPU (state + activations held in flight), and the cost of switching
   degree between consecutive blocks.
2. ``StagePlanner.solve`` finds the best degrees for one stage under its memory budget: the
   fastest degree per block when that fits (exact when switches are free or solved by the graph
   solver), the MILP otherwise.
3. Without interleaving, ``partition`` chooses each stage's layer count by dynamic programming
   over stage boundaries, keeping the Pareto front of (slowest stage, sum of stages) so the
   pipeline time (m - 1/v) T_max + sum T / v is minimised exactly over counts within ``window``
   layers of an even split. With interleaving a stage holds chunks s, s + pp, ... of the model
   (Megatron's placement), so the candidate splits are Megatron's: even, or with the embedding
   and/or the loss counted as a layer (``chunk_splits``); each stage's degrees are solved on
   the layers its chunks really hold.

``search_per_layer`` visits candidates in order of a lower bound (perfect balance, fastest
degree everywhere, no memory limit) and stops once the bound reaches the best step time found,
starting from the best uniform layout: the result is never worse than uniform.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cost_models.efficiency import DEFAULT_EFFICIENCY, Efficiency
from cost_models.layout import ParallelLayout, block_degree_ok, sub_batch
from cost_models.memory import in_flight_micro_batches
from cost_models.model import ModelSpec
from cost_models.pipeline_layout import even_split, megatron_splits, stage_totals
from cost_models.stage import RUNTIME_RESERVED_BYTES, range_blocks, stage_blocks
from cost_models.step import EMBED, HEAD, Block, CostEnv, estimate_step, pass_cache_key
from cost_models.training import TrainingSpec
from ntp_planner.solver.search import Candidate, SearchSpace, divisors, enumerate_layouts
from ntp_planner.solver.stage_solvers import (
    ChainProblem,
    ChainSolution,
    groups,
    lagrangian_bound,
    solve_counts,
    solve_graph,
    solve_milp,
)
from topologies.cluster import Cluster


def allowed_degrees(model: ModelSpec, layout: ParallelLayout, seq_len: int) -> list[list[int]]:
    """Degrees each block may take: divisors of the stage width that its heads, KV heads and
    MLP width allow, and that split the micro-batch (or its sequences) evenly."""
    out = []
    for block in range(model.num_layers + 2):
        ok = []
        for t in divisors(layout.tp):
            if block_degree_ok(model, block, t):
                continue
            try:
                _, split = sub_batch(layout.micro_batch, t, layout.tp)
            except ValueError:
                continue
            if split > 1 and seq_len % (2 * split * layout.cp):
                continue
            ok.append(t)
        out.append(ok)
    return out


MAX_ENUMERATED_SPLITS = 400_000  # above this many count vectors per group, HiGHS is faster


def _splits(p: ChainProblem) -> int:
    """Largest number of ways one group of identical blocks can be split over its degrees."""
    return max(math.comb(len(members) + len(times) - 1, len(times) - 1) for (times, _), members in groups(p).items())


class StagePlanner:
    """Builds and solves the per-stage degree problem of one candidate layout."""

    def __init__(self, env: CostEnv, degrees: list[list[int]], headroom: float):
        self.env, self.degrees = env, degrees
        self.model, self.layout = env.model, env.layout
        self.usable = env.cluster.gpu.hbm_bytes * (1 - headroom) - RUNTIME_RESERVED_BYTES
        self._memo: dict[tuple, ChainSolution | None] = {}
        self.single_kind = len(self.model.kinds) == 1
        self._rows: dict[tuple, tuple[dict[int, float], dict[int, float], float]] = {}

    def blocks(self, stage: int, start: int, count: int) -> list[tuple[int, Block]]:
        """The blocks of ``stage`` holding layers start..start+count-1 (no interleaving)."""
        return range_blocks(self.model, self.layout, stage, start, count)

    def problem(self, stage: int, start: int, count: int) -> ChainProblem:
        return self.problem_for(stage, self.blocks(stage, start, count))

    def problem_for(self, stage: int, blocks: list[tuple[int, Block]]) -> ChainProblem:
        env, lay = self.env, self.layout
        held = in_flight_micro_batches(stage, lay.pp, lay.num_micro_batches, lay.vpp)
        time_s, memory = [], []
        working = 0.0
        for index, block in blocks:
            key = (block, tuple(self.degrees[index]), held)
            if key not in self._rows:
                mem_row = {}
                for t in self.degrees[index]:
                    state, act = env.block_memory(block, t, held)
                    mem_row[t] = state.total + act
                work = max(env.full_recompute_working_bytes(block, t) for t in self.degrees[index])
                self._rows[key] = ({t: env.block_pass(block, t).total for t in self.degrees[index]}, mem_row, work)
            t_row, m_row, work = self._rows[key]
            time_s.append(t_row)
            memory.append(m_row)
            working = max(working, work)
        degrees = sorted({t for row in time_s for t in row})
        switch = {(a, b): env.transition_time(a, b) for a in degrees for b in degrees if a != b}
        # The full-recompute working set depends on the chosen degree; reserving the largest keeps
        # every answer within memory (estimate_step then reports the exact, smaller figure).
        return ChainProblem(tuple(time_s), tuple(memory), switch, budget_bytes=self.usable - working)

    def solve(self, stage: int, start: int, count: int) -> ChainSolution | None:
        """Best degrees for layers start..start+count-1 on ``stage`` (no interleaving)."""
        lay = self.layout
        if self.single_kind:  # every layer alike: the count says it all
            kinds = (count,)
        elif lay.sequence_parallel:  # free switches: only how many layers of each kind matters
            kinds = tuple(sorted(self.model.kind_counts(start, start + count).items()))
        else:
            kinds = tuple(self.model.layer_kind(i) for i in range(start, start + count))
        return self._solve_memo(stage, kinds, lambda: self.blocks(stage, start, count))

    def solve_blocks(self, stage: int, blocks: list[tuple[int, Block]]) -> ChainSolution | None:
        """Best degrees for an explicit list of the stage's blocks (its interleaved chunks)."""
        kinds = tuple((b, tuple(self.degrees[i])) for i, b in blocks)
        return self._solve_memo(stage, ("blocks", kinds), lambda: blocks)

    def _solve_memo(self, stage: int, kinds: tuple, blocks) -> ChainSolution | None:
        lay = self.layout
        held = in_flight_micro_batches(stage, lay.pp, lay.num_micro_batches, lay.vpp)
        key = (held, stage == 0, stage == lay.pp - 1, kinds)
        if key not in self._memo:
            p = self.problem_for(stage, blocks())
            free = not any(p.switch_s.values())
            if free:
                fastest = tuple(
                    min(row, key=lambda t, row=row, i=i: (row[t], p.memory_bytes[i][t]))
                    for i, row in enumerate(p.time_s)
                )
                guess = ChainSolution(fastest, p.objective(fastest), p.memory(fastest))
            else:
                guess = solve_graph(p)
            if p.fits(guess.memory_bytes):
                self._memo[key] = guess
            elif free and _splits(p) <= MAX_ENUMERATED_SPLITS:
                self._memo[key] = solve_counts(p)
            else:
                self._memo[key] = solve_milp(p)
        return self._memo[key]


@dataclass(frozen=True)
class Partition:
    counts: tuple[int, ...]
    solutions: tuple[ChainSolution, ...]
    pipeline_s: float


def chunk_splits(num_layers: int, pp: int, vpp: int) -> list[tuple[int, ...]]:
    """Megatron's splits of an interleaved pipeline: even (leading chunks one layer more), and
    those that count the embedding and/or the loss as a layer where the slots divide evenly."""
    splits = [even_split(num_layers, pp * vpp)]
    for chunks in megatron_splits(num_layers, pp, vpp).values():
        if min(stage_totals(chunks, pp)) >= 1 and chunks not in splits:
            splits.append(chunks)
    return splits


def interleaved_partition(planner: StagePlanner, chunks: tuple[int, ...]) -> Partition | None:
    """Degrees per stage for a fixed interleaved split ``chunks``; None when a stage does not
    fit memory."""
    lay = planner.layout.model_copy(update={"chunk_layers": chunks})
    m, v = lay.num_micro_batches, lay.vpp
    sols = []
    for stage in range(lay.pp):
        sol = planner.solve_blocks(stage, stage_blocks(planner.model, lay, stage))
        if sol is None:
            return None
        sols.append(sol)
    tmax, tsum = max(x.time_s for x in sols), sum(x.time_s for x in sols)
    return Partition(chunks, tuple(sols), (m - 1 / v) * tmax + tsum / v)


def partition(planner: StagePlanner, window: int = 2) -> Partition | None:
    """Layers per chunk and degrees per stage minimising the pipeline time; None when no split
    fits memory. Without interleaving: counts per stage within ``window`` of an even split, by
    dynamic programming. With it: the best of Megatron's splits (``chunk_splits``)."""
    lay, L = planner.layout, planner.model.num_layers
    if lay.vpp > 1:
        parts = [interleaved_partition(planner, c) for c in chunk_splits(L, lay.pp, lay.vpp)]
        parts = [p for p in parts if p is not None]
        return min(parts, key=lambda p: p.pipeline_s) if parts else None
    pp, m = lay.pp, lay.num_micro_batches
    v = lay.vpp if pp > 1 else 1
    lo, hi = max(1, L // pp - window), -(-L // pp) + window
    fronts: dict[int, list[tuple[float, float, tuple[int, ...], tuple[ChainSolution, ...]]]] = {0: [(0.0, 0.0, (), ())]}
    for stage in range(pp):
        left = pp - stage - 1
        new: dict[int, list] = {}
        for used, front in fronts.items():
            for n in range(lo, hi + 1):
                done = used + n
                if not left * lo <= L - done <= left * hi or (left == 0 and done != L):
                    continue
                if n < lay.vpp:
                    continue
                sol = planner.solve(stage, used, n)
                if sol is None:
                    continue
                for tmax, tsum, counts, sols in front:
                    new.setdefault(done, []).append(
                        (max(tmax, sol.time_s), tsum + sol.time_s, counts + (n,), sols + (sol,))
                    )
        fronts = {k: _pareto(entries) for k, entries in new.items()}
        if not fronts:
            return None
    final = fronts.get(L)
    if not final:
        return None
    tmax, tsum, counts, sols = min(final, key=lambda e: (m - 1 / v) * e[0] + e[1] / v)
    return Partition(counts, sols, (m - 1 / v) * tmax + tsum / v)


def _pareto(entries):
    """Entries not dominated in (slowest stage, sum of stages)."""
    entries.sort(key=lambda e: (e[0], e[1]))
    kept, best_sum = [], math.inf
    for e in entries:
        if e[1] < best_sum:
            kept.append(e)
            best_sum = e[1]
    return kept


def assemble(planner: StagePlanner, part: Partition) -> ParallelLayout:
    """The layout with per-block degrees on the layers each stage really holds and the chosen
    split (``part.counts``: layers per stage without interleaving, per chunk with it)."""
    model, lay = planner.model, planner.layout
    chunks = tuple(part.counts)  # without interleaving a stage is one chunk
    split = lay.model_copy(update={"chunk_layers": chunks})
    degrees = [0] * (model.num_layers + 2)
    for stage, sol in enumerate(part.solutions):
        for (index, _), t in zip(stage_blocks(model, split, stage), sol.degrees, strict=True):
            degrees[index] = t
    even = lay.model_copy(update={"chunk_layers": None}).chunks(model.num_layers)
    return split.model_copy(update={"layer_tp": tuple(degrees), "chunk_layers": None if chunks == even else chunks})


def lower_bound(env: CostEnv, degrees: list[list[int]]) -> float:
    """No layout of this candidate is faster: every block at its fastest degree, stages
    perfectly balanced, no memory limit, no DP or optimizer time."""
    lay, m = env.layout, env.model
    L = m.num_layers
    first_of_kind = {m.layer_kind(i): i for i in reversed(range(L))} if m.layer_overrides else None

    def fastest(block: Block, index: int) -> float:
        return min((env.block_pass(block, t).total for t in degrees[index]), default=math.inf)

    total = fastest(EMBED, 0) + fastest(HEAD, L + 1)
    for kind, n in m.kind_counts(0, L).items():
        index = first_of_kind[kind] + 1 if first_of_kind else next(i for i in range(L) if m.layer_kind(i) == kind) + 1
        total += n * fastest(kind, index)
    v = lay.vpp if lay.pp > 1 else 1
    return (lay.num_micro_batches - 1 / v) * total / lay.pp + total / v


def first_stage_bound(planner: StagePlanner, window: int) -> float:
    """A lower bound that sees memory: the first stage holds the most micro-batches in flight,
    and even with its fewest allowed layers it needs at least its constrained optimum (bounded
    from below by Lagrangian relaxation, switches ignored); the pipeline can be no faster than
    m - 1/v times that."""
    lay, L = planner.layout, planner.model.num_layers
    if lay.vpp > 1:  # the fewest layers stage 0 holds in any of Megatron's splits
        fewest = min(stage_totals(c, lay.pp)[0] for c in chunk_splits(L, lay.pp, lay.vpp))
    else:
        fewest = max(1, L // lay.pp - window)
    v = lay.vpp if lay.pp > 1 else 1
    return (lay.num_micro_batches - 1 / v) * lagrangian_bound(planner.problem(0, 0, fewest))


def search_per_layer(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: Cluster,
    headroom: float,
    space: SearchSpace,
    best_uniform_s: float,
    window: int = 2,
    pass_caches: dict | None = None,
    efficiency: Efficiency = DEFAULT_EFFICIENCY,
) -> list[Candidate]:
    """Per-layer layouts that beat ``best_uniform_s``, fastest first. ``pass_caches``: block
    passes the uniform search already costed (``cost_models.step.pass_cache_key``)."""
    pass_caches = {} if pass_caches is None else pass_caches
    degree_cache: dict[tuple, list[list[int]]] = {}
    queue = []
    for layout in enumerate_layouts(model, training, cluster, space):
        if layout.tp == 1:
            continue  # one GPU per stage replica: nothing to choose per layer
        env = CostEnv(model, training, layout, cluster, efficiency, pass_caches.setdefault(pass_cache_key(layout), {}))
        dkey = (layout.tp, layout.micro_batch, layout.cp)
        if dkey not in degree_cache:
            degree_cache[dkey] = allowed_degrees(model, layout, training.seq_len)
        degrees = degree_cache[dkey]
        if any(not d for d in degrees):
            continue
        queue.append((lower_bound(env, degrees), layout.describe(), env, degrees))
    queue.sort(key=lambda q: (q[0], q[1]))
    best, found = best_uniform_s, []
    for bound, _, env, degrees in queue:
        if bound >= best:
            break
        planner = StagePlanner(env, degrees, headroom)
        if first_stage_bound(planner, window) >= best:
            continue
        part = partition(planner, window)
        if part is None:
            continue
        layout = assemble(planner, part)
        if len(set(layout.layer_tp)) == 1:
            continue  # one degree everywhere: the uniform search already has it (with more replicas)
        cost = estimate_step(model, training, layout, cluster, efficiency, pass_caches)
        if cost.fits(headroom):
            found.append(Candidate(layout=layout, cost=cost))
            best = min(best, cost.step_time_s)
    found.sort(key=lambda c: (c.cost.step_time_s, c.layout.describe()))
    return found


@dataclass(frozen=True)
class DegreeRun:
    """Consecutive blocks of one stage at one degree, and why they deviate (if they do)."""

    stage: int
    first: int  # block index: 0 = embedding, i + 1 = layer i, L + 1 = LM head
    last: int
    degree: int
    why: str | None


def block_label(first: int, last: int, num_layers: int) -> str:
    """'embedding', 'layers 3-9', 'layer 4', 'LM head' (block indices, inclusive)."""
    names = []
    if first == 0:
        names.append("embedding")
    lo, hi = max(first, 1) - 1, min(last, num_layers) - 1
    if lo <= hi:
        names.append(f"layer {lo}" if lo == hi else f"layers {lo}-{hi}")
    if last == num_layers + 1:
        names.append("LM head")
    return " + ".join(names)


def explain_degrees(
    model: ModelSpec,
    training: TrainingSpec,
    layout: ParallelLayout,
    cluster: Cluster,
    efficiency: Efficiency = DEFAULT_EFFICIENCY,
) -> tuple[int, list[DegreeRun]]:
    """The majority degree of the layers and the runs of equal degree per stage; a run off the
    majority says whether it is faster at its degree or trades speed for memory."""
    L = model.num_layers
    degrees = layout.block_tp(L)
    layer_degrees = list(degrees[1:-1])
    majority = max(sorted(set(layer_degrees)), key=layer_degrees.count)
    env = CostEnv(model, training, layout, cluster, efficiency)
    runs: list[DegreeRun] = []
    for stage in range(layout.pp):
        blocks = [index for index, _ in stage_blocks(model, layout, stage)]
        held = in_flight_micro_batches(stage, layout.pp, layout.num_micro_batches, layout.vpp)
        group: list[int] = []
        for b in blocks + [None]:
            if group and (b is None or degrees[b] != degrees[group[0]] or b != group[-1] + 1):
                runs.append(_run(env, stage, group, degrees[group[0]], majority, held))
                group = []
            if b is not None:
                group.append(b)
    return majority, runs


def _run(env: CostEnv, stage: int, group: list[int], t: int, majority: int, held: float) -> DegreeRun:
    m = env.model
    first, last = group[0], group[-1]
    if t == majority:
        return DegreeRun(stage, first, last, t, None)
    block: Block = EMBED if first == 0 else HEAD if first == m.num_layers + 1 else m.layer_kind(first - 1)
    try:
        here, there = env.block_pass(block, t).total, env.block_pass(block, majority).total
        state_here, act_here = env.block_memory(block, t, held)
        state, act = env.block_memory(block, majority, held)
        saved = state.total + act - (state_here.total + act_here)
    except ValueError:
        return DegreeRun(stage, first, last, t, f"degree {majority} is not allowed here")
    if here < there:
        why = f"faster: {here * 1e3:.2f} ms vs {there * 1e3:.2f} ms per micro-batch at degree {majority}"
        if block not in (EMBED, HEAD):
            why += f"; memory admits no more layers at degree {t}"
    else:
        why = (
            f"memory: saves {saved / 2**30:.2f} GiB per block on stage {stage}, whose memory binds "
            f"({(here - there) * 1e3:.2f} ms slower per micro-batch than degree {majority})"
        )
    return DegreeRun(stage, first, last, t, why)


def rebalance_uniform(
    model: ModelSpec,
    training: TrainingSpec,
    cluster: Cluster,
    headroom: float,
    candidate: Candidate,
    window: int = 2,
    efficiency: Efficiency = DEFAULT_EFFICIENCY,
) -> Candidate | None:
    """The same uniform layout with the pipeline split chosen by ``partition`` (every block
    pinned to tp): uneven first/last stages are something Megatron-LM can run. None when the
    even split is already best or the rebalanced one does not fit."""
    layout = candidate.layout
    if layout.pp == 1:
        return None
    env = CostEnv(model, training, layout, cluster, efficiency)
    planner = StagePlanner(env, [[layout.tp]] * (model.num_layers + 2), headroom)
    part = partition(planner, window)
    if (
        part is None
        or tuple(part.counts) == layout.chunks(model.num_layers)
        or (layout.vpp == 1 and tuple(part.counts) == layout.stage_layers(model.num_layers))
    ):
        return None
    rebalanced = layout.model_copy(update={"chunk_layers": tuple(part.counts)})
    cost = estimate_step(model, training, rebalanced, cluster, efficiency)
    if not cost.fits(headroom) or cost.step_time_s >= candidate.cost.step_time_s:
        return None
    return Candidate(layout=rebalanced, cost=cost)
