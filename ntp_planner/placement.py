"""Rank-to-GPU placement: ranks in the project's rank order, laid onto healthy GPUs so that
every TP group sits inside one NVLink domain.

Ranks are numbered tp fastest, then cp, dp, pp (cost_models.layout). Domain by domain, the
healthy GPUs are cut into runs of ``tp``; a domain's leftover GPUs (fewer than tp healthy ones
after failures) stay idle. Consecutive TP groups then fill consecutive runs.

Worked example: dgx-h100 with 16 GPUs, tp=4, GPU 5 failed, 12 ranks wanted (tp4 dp3).
Domain 0's healthy GPUs are 0-4, 6, 7: one run [0, 1, 2, 3], and [4, 6, 7] (3 < 4) stays idle.
Domain 1 gives runs [8..11] and [12..15]. Ranks 0-3 -> GPUs 0-3, 4-7 -> 8-11, 8-11 -> 12-15.

>>> from topologies.clusters import CLUSTERS
>>> place_ranks(12, 4, Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=16, failed_gpus=frozenset({5})))
[0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15]
"""

from __future__ import annotations

from topologies.cluster import Cluster


def place_ranks(world_size: int, tp: int, cluster: Cluster) -> list[int]:
    """GPU id of each rank 0..world_size-1; raises ValueError if too few healthy GPUs."""
    runs: list[list[int]] = []
    size = cluster.spec.domain_size
    for d in range(cluster.num_domains):
        healthy = [g for g in range(d * size, (d + 1) * size) if g not in cluster.failed_gpus]
        runs += [healthy[i : i + tp] for i in range(0, len(healthy) - tp + 1, tp)]
    need = world_size // tp
    if len(runs) < need:
        raise ValueError(
            f"only {len(runs)} TP groups of {tp} healthy GPUs fit inside NVLink domains, "
            f"but the layout needs {need}; lower tp or mark fewer GPUs failed"
        )
    return [g for run in runs[:need] for g in run]
