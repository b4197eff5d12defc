"""Every process group of a run, from ``RankGrid``: within a stage, a ``RankGrid(tp=t,
dp=w // t)`` of its local ranks (``StageSpec.copy_tp_groups``, ``copy_dp_groups``); across
pipelines, ``RunSpec.pipeline_grid``, a ``RankGrid(cp, dp)`` of the pipelines (cp, EP and expert
data-parallel groups); across replicas, the data-parallel groups of each block (``dp_groups``).
Every rank creates them in one order (``process_groups``), members or not. Pure; no torch.

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
    if spec.ep > 1:
        for rep in spec.replicas:
            for st in rep.stages:
                for rank in st.ranks:
                    out[ep_group(spec, rank)] = None
                    out.update(dict.fromkeys(expert_dp_group(spec, rank, b.degree) for b in st.blocks))
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
