"""Rank-to-GPU placement on the cluster graph.

Ranks follow the project's one rank order (``cost_models.rank_grid.RankGrid``: tp fastest, then
cp, dp, pp). A "pipeline column" is one (cp_i, dp_i) coordinate: the pp TP groups that pass
activations to one another. Rules:

- every TP group fills one aligned slot of ``tp`` GPUs inside an NVLink domain
  (GPUs [k tp, (k+1) tp) of the GPUs the job uses there), all healthy; failed GPUs are never used;
- the TP groups of a pipeline column take slots at the same offset within their hosts, so TP
  rank i of every stage sits on the same rail and pipeline sends stay under one leaf switch;
- data-parallel peers are distinct GPUs, each with its own NIC;
- when several stages share a host (a small job, or a first test on one machine), their sends
  ride NVLink and the rails cannot line up: TP groups then take the healthy slots in rank order.

On a healthy cluster this is the identity (rank r on GPU r), which satisfies the rules whenever
tp divides every used domain (``tp_domain_size``) and tp * cp * dp is a multiple of the host
size; the cost model assumes it.

Worked example, dgx-h100 with 16 GPUs (two hosts = two domains of 8), tp=2, dp=4, pp=2:
TP groups {0,1} {2,3} {4,5} {6,7} | {8,9} {10,11} {12,13} {14,15}; DP groups {0,2,4,6}
{1,3,5,7} {8,10,12,14} {9,11,13,15}; pipelines (0,8) (1,9) ... (7,15): rank 3 (rail 3 of host
0) sends to rank 11 (rail 3 of host 1). If GPU 2 fails, slot {2,3} is lost; with tp=2, dp=3,
pp=2 the columns become: column 0 -> slots {0,1} and {8,9}; column 1 -> offset 2 has only
{10,11} left, so it takes offset 4: {4,5} and {12,13}; column 2 -> {6,7} and {14,15}.

>>> from topologies.cluster_catalogue import CLUSTERS
>>> cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=16, failed_gpus=frozenset({2}))
>>> place_ranks(RankGrid(tp=2, dp=3, pp=2), cluster)
[0, 1, 4, 5, 6, 7, 8, 9, 12, 13, 14, 15]
"""

from __future__ import annotations

from cost_models.rank_grid import RankGrid
from topologies.cluster import Cluster
from topologies.errors import InputError


def place_ranks(grid: RankGrid, cluster: Cluster) -> list[int]:
    """GPU id of each rank 0..world_size-1; InputError if the healthy GPUs cannot host them."""
    world_size, tp, pp = grid.world_size, grid.tp, grid.pp
    if not cluster.failed_gpus and _identity_ok(grid, cluster):
        return list(range(world_size))
    per_node = cluster.spec.gpus_per_node
    slots: dict[int, list[int]] = {}  # offset within host -> free slot starts, ascending
    for d in range(cluster.num_domains):
        base = d * cluster.used_per_domain
        for start in range(base, base + cluster.used_in_domain(d) - tp + 1, tp):
            if not any(g in cluster.failed_gpus for g in range(start, start + tp)):
                slots.setdefault(start % per_node if tp < per_node else 0, []).append(start)
    # ranks of each pipeline column ((dp_i, cp_i), cp fastest), stage by stage, in TP order
    columns = grid.array("dp", "cp", "pp", "tp").reshape(grid.dp * grid.cp, pp, tp)
    need = len(columns) * pp
    have = sum(len(v) for v in slots.values())
    if have < need:
        raise InputError(
            f"only {have} TP groups of {tp} healthy GPUs fit inside NVLink domains, but the layout needs {need}; "
            "lower tp or mark fewer GPUs failed"
        )
    free = sorted(start for starts in slots.values() for start in starts)
    column_slots = []
    for c in range(len(columns)):
        preferred = (c * tp) % per_node if tp < per_node else 0
        offsets = [preferred] + sorted(slots, key=lambda o: -len(slots[o]))
        offset = next((o for o in offsets if len(slots.get(o, [])) >= pp), None)
        if offset is None:
            # fewer hosts than stages hold a free slot at one offset: stages share hosts, their
            # sends ride NVLink and rails cannot line up, so TP groups take the healthy slots in
            # rank order (the identity on a healthy cluster)
            return [free[rank // tp] + rank % tp for rank in range(world_size)]
        column_slots.append(slots[offset][:pp])
        slots[offset] = slots[offset][pp:]
    gpus = [0] * world_size
    for ranks, chain in zip(columns, column_slots, strict=True):
        for tp_group, start in zip(ranks, chain, strict=True):
            for i, rank in enumerate(tp_group):
                gpus[rank] = start + i
    return gpus


def _identity_ok(grid: RankGrid, cluster: Cluster) -> bool:
    """Rank r on GPU r obeys the rules: TP groups aligned in their domains, and each stage on
    whole hosts (or the whole pipeline inside hosts, where its sends ride NVLink)."""
    stride, per_node = grid.stride("pp"), cluster.spec.gpus_per_node
    return cluster.tp_domain_size % grid.tp == 0 and (grid.pp == 1 or stride % per_node == 0 or per_node % stride == 0)
