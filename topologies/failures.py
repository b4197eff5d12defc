"""Failure states: which GPUs are down. Explicit ids, or random failures with a seed.

Random failures come as events with a blast radius: one GPU (91% of GPU errors, NCSA Delta
study), a host, or a whole NVLink domain (NVLink errors that spread). ``fraction`` is the share
of blast units that fail, so with blast="gpu" it is the share of GPUs.
"""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np

from topologies.cluster import Cluster

Blast = Literal["gpu", "node", "domain"]
BLASTS: tuple[str, ...] = get_args(Blast)  # what one failure takes down


def explicit_failures(cluster: Cluster, ids: list[int]) -> frozenset[int]:
    """Validated failed GPU ids: in range, each named once."""
    bad = sorted({g for g in ids if not 0 <= g < cluster.num_gpus})
    if bad:
        raise ValueError(f"failed GPU ids {bad[:5]} are outside 0..{cluster.num_gpus - 1}")
    repeated = sorted({g for g in ids if ids.count(g) > 1}) if len(set(ids)) != len(ids) else []
    if repeated:
        raise ValueError(f"failed GPU ids {repeated[:5]} are listed more than once; name each GPU once")
    return frozenset(ids)


def blast_size(cluster: Cluster, blast: Blast) -> int:
    return {"gpu": 1, "node": cluster.spec.gpus_per_node, "domain": cluster.spec.domain_size}[blast]


def random_failures(
    cluster: Cluster, fraction: float, rng: np.random.Generator, blast: Blast = "gpu"
) -> frozenset[int]:
    """Fail round(fraction * units) distinct blast units chosen uniformly at random."""
    if not 0 <= fraction < 1:
        raise ValueError(f"failure fraction {fraction} must lie in [0, 1)")
    size = blast_size(cluster, blast)
    units = cluster.num_gpus // size
    events = round(fraction * units)
    chosen = rng.choice(units, size=events, replace=False)
    gpus = (chosen[:, None] * size + np.arange(size)[None, :]).ravel()
    return frozenset(int(g) for g in gpus)
