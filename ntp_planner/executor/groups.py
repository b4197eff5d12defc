"""Every process group of a run, from ``RankGrid``: within a stage, a ``RankGrid(tp=t,
dp=w // t)`` of its local ranks (``StageSpec.copy_tp_groups``, ``copy_dp_groups``); across
pipelines, ``RunSpec.pipeline_grid``, a ``RankGrid(cp, dp)`` of the pipelines (cp, EP and expert
data-parallel groups); across replicas, the data-parallel groups of each block (``dp_groups``).
Every rank creates them in one order (``process_groups``), members or not. Pure; no torch.

The routed experts have groups of their own (``expert_seat``): before parallel folding the EP
groups of the pipelines and each expert cut over the layer's TP ranks; under folding
(``RunSpec.etp``) the experts' grid etp x ep x edp over each stage's ranks (``expert_group``);
under explicit hosting (``RunSpec.hosting``, after a failure) the EP groups and owners it names.

The NTP grid is uneven: a degraded replica's stage has fewer ranks than a healthy one, so the
ranks of one block are no longer one rectangular grid. Worked example: a layer at degree 4 on a
healthy stage of ranks (0, 1, 2, 3) and at degree 3 on a degraded stage of ranks (4, 5, 6) (one
GPU of its TP group lost). Each replica holds the layer once; the gradients are summed between
the core positions the two share, TP rank j of both for j < 3 (the 1:1 exchange of resharded
slices, ``parallel.reshard``); rank 3's slice is resharded onto 0-2 first:

>>> from ntp_planner.executor.spec import Block, ReplicaSpec, RunSpec, StageSpec, TinyConfig
>>> st = lambda ranks, t: StageSpec(ranks, (Block("embed", -1, t), Block("layer", 0, t), Block("head", -1, t)))
>>> run = lambda *stages: RunSpec(TinyConfig(layers=1), tuple(ReplicaSpec((s,), 1) for s in stages), 2, 4)
>>> ntp = run(st((0, 1, 2, 3), 4), st((4, 5, 6), 3))
>>> dp_groups(ntp, 0, 1)
((0, 4), (1, 5), (2, 6))

Where every replica runs the block at one degree t the grid is even again: a stage of 4 ranks at
degree 2 is 2 copies, and group j holds TP rank j of every copy of every replica:

>>> even = run(st((0, 1, 2, 3), 2), st((4, 5, 6, 7), 2))
>>> dp_groups(even, 0, 1)
((0, 2, 4, 6), (1, 3, 5, 7))
"""

from __future__ import annotations

from dataclasses import dataclass

from cost_models.rank_grid import RankGrid
from ntp_planner.executor.spec import RunSpec


def process_groups(spec: RunSpec) -> list[tuple[int, ...]]:
    """Every group the run uses, deduplicated, in one order all ranks share: per stage its
    whole width, then per block degree the copies' TP groups and in-stage DP groups; then per
    stage and block the cross-replica groups (``dp_groups``)."""
    out: dict[tuple[int, ...], None] = {}
    for rep in spec.replicas:
        for st in rep.stages:
            out[st.ranks] = None
            for t in sorted({b.degree for b in st.blocks}):
                out.update(dict.fromkeys(st.copy_tp_groups(t)))
                out.update(dict.fromkeys(st.copy_dp_groups(t)))
    for s in range(spec.pp):
        for b in range(len(spec.replicas[0].stages[s].blocks)):
            out.update(dict.fromkeys(dp_groups(spec, s, b)))
    if spec.cp > 1:
        for i in range(0, len(spec.replicas), spec.cp):
            for s, st in enumerate(spec.replicas[i].stages):
                out.update(dict.fromkeys(spec.cp_group(i, s, local) for local in range(st.width)))
    if spec.ep > 1 or spec.hosting:
        for rep in spec.replicas:
            for st in rep.stages:
                for rank in st.ranks:
                    for b in st.blocks:
                        seat = expert_seat(spec, rank, b.degree)
                        out.update(dict.fromkeys((seat.ep_ranks, *seat.edp)))
    return list(out)


def ep_group(spec: RunSpec, rank: int) -> tuple[int, ...]:
    """The expert-parallel group of process ``rank``: the ranks at its position of its stage in
    the ``ep`` consecutive pipelines of its group (pipelines are replica-major, cp rank fastest:
    Megatron's "tp-cp-ep-dp-pp" takes ep consecutive ranks of the flattened cp x dp ranks), in
    rank order: the i-th owns the i-th block of experts (``moe.local_experts``).

    >>> from ntp_planner.executor.spec import Block, ReplicaSpec, RunSpec, StageSpec, TinyConfig
    >>> st = lambda ranks: StageSpec(ranks, (Block("embed", -1, 2), Block("layer", 0, 2), Block("head", -1, 2)))
    >>> cfg = TinyConfig(layers=1, experts=4, top_k=2, expert_ffn=8, moe_layers=(0,))
    >>> spec = RunSpec(cfg, tuple(ReplicaSpec((st((2 * i, 2 * i + 1)),), 1) for i in range(4)), 2, 4, ep=2)
    >>> ep_group(spec, 5), expert_dp_group(spec, 5, 2)
    ((5, 7), (1, 5))
    """
    pipeline, s = spec.locate(rank)
    local = spec.replicas[pipeline].stages[s].ranks.index(rank)
    return tuple(
        sorted(spec.replicas[q].stages[s].ranks[local] for q in spec.pipeline_grid.ep_group(spec.ep, pipeline))
    )


def expert_dp_group(spec: RunSpec, rank: int, degree: int) -> tuple[int, ...]:
    """Ranks that hold the same slice of the same experts as ``rank`` for a layer at ``degree``:
    its TP rank in every copy of its stage, in every pipeline at its place in an EP group
    (``RankGrid.expert_dp_group`` of the pipelines)."""
    pipeline, s = spec.locate(rank)
    stage = spec.replicas[pipeline].stages[s]
    _, j = stage.position(rank, degree)
    peers = spec.pipeline_grid.expert_dp_group(spec.ep, pipeline)
    return tuple(r for q in peers for r in spec.replicas[q].stages[s].copy_dp_groups(degree)[j])


def dp_groups(spec: RunSpec, stage: int, block: int) -> tuple[tuple[int, ...], ...]:
    """Groups that sum block ``block`` of ``stage`` across replicas. When every replica runs it
    at one degree t: group j holds TP rank j of every copy of every replica. Otherwise (NTP):
    group j < n = the smallest degree holds TP rank j of copy 0 of every replica (the 1:1
    exchange of resharded slices; the module's worked example).
    """
    holders = [rep.stages[stage] for rep in spec.replicas]
    degrees = {st.blocks[block].degree for st in holders}
    if len(degrees) == 1:
        (t,) = degrees
        return tuple(tuple(r for st in holders for r in st.copy_dp_groups(t)[j]) for j in range(t))
    n = min(degrees)
    return tuple(tuple(st.ranks[j] for st in holders) for j in range(n))


# ---- the experts' grid (parallel folding) and explicit hosting -------------------------------
@dataclass(frozen=True)
class ExpertSeat:
    """Where a rank sits for its stage's routed experts.

    ``owned[i]``: the experts (ascending) that member i of ``ep_ranks`` holds; the rank's tokens
    go to them. ``etp``: the width slices of each expert (None: the layer's TP degree, the rank's
    TP slice, the layout before parallel folding); ``etp_rank``: which slice it holds. ``edp``:
    per expert it holds, the ranks holding the same slice of it (its gradient's sum)."""

    ep_ranks: tuple[int, ...]
    ep_rank: int
    owned: tuple[tuple[int, ...], ...]
    etp: int | None
    etp_rank: int
    edp: tuple[tuple[int, ...], ...]

    @property
    def mine(self) -> tuple[int, ...]:
        return self.owned[self.ep_rank]


def stage_ranks(spec: RunSpec, stage: int) -> tuple[int, ...]:
    """Every pipeline's ranks of ``stage`` in rank order (the expert grid's numbering)."""
    return tuple(sorted(r for rep in spec.replicas for r in rep.stages[stage].ranks))


def expert_group(spec: RunSpec, rank: int, axis: str) -> tuple[int, ...]:
    """Under parallel folding (``spec.etp`` set): ``rank``'s group of the experts' grid, etp
    fastest, then ep, then edp over its stage's ranks in rank order (``RankGrid.expert_group``).

    >>> from ntp_planner.executor.spec import Block, ReplicaSpec, RunSpec, StageSpec, TinyConfig
    >>> st = lambda ranks: StageSpec(ranks, (Block("embed", -1, 2), Block("layer", 0, 2), Block("head", -1, 2)))
    >>> cfg = TinyConfig(layers=1, experts=4, top_k=2, expert_ffn=8, moe_layers=(0,))
    >>> spec = RunSpec(cfg, (ReplicaSpec((st((0, 1)),), 1), ReplicaSpec((st((2, 3)),), 1)), 2, 4, ep=2, etp=1)
    >>> expert_group(spec, 2, "ep"), expert_group(spec, 2, "edp"), expert_group(spec, 2, "etp")
    ((2, 3), (0, 2), (2,))
    """
    ranks = stage_ranks(spec, spec.locate(rank)[1])
    grid = RankGrid(dp=len(ranks))
    return tuple(ranks[i] for i in grid.expert_group(axis, ranks.index(rank), spec.ep, spec.etp))


def expert_seat(spec: RunSpec, rank: int, degree: int) -> ExpertSeat:
    """``rank``'s seat for an MoE layer at TP ``degree``: from the stage's hosting when the spec
    has one, else the experts' grid (``etp`` set), else the layout before folding (EP over the
    pipelines, experts cut over the layer's TP ranks)."""
    cfg, (pipeline, s) = spec.cfg, spec.locate(rank)
    if spec.hosting:
        host = spec.hosting[s]
        group = next(g for g in host.groups if rank in g)
        owned = tuple(tuple(e for e, o in enumerate(host.owners) if r in o) for r in group)
        edp = tuple(host.owners[e] for e in owned[group.index(rank)])
        return ExpertSeat(group, group.index(rank), owned, 1, 0, edp)
    if spec.etp is not None:
        group, edp = expert_group(spec, rank, "ep"), expert_group(spec, rank, "edp")
        etp_rank = expert_group(spec, rank, "etp").index(rank)
    else:
        group = ep_group(spec, rank) if spec.ep > 1 else (rank,)
        edp = expert_dp_group(spec, rank, degree) if spec.ep > 1 else (rank,)  # ep 1: the dense sync sums them
        etp_rank = spec.replicas[pipeline].stages[s].position(rank, degree)[1]
    per = cfg.experts // len(group)
    owned = tuple(tuple(range(i * per, (i + 1) * per)) for i in range(len(group)))
    return ExpertSeat(group, group.index(rank), owned, spec.etp, etp_rank, (edp,) * per)
