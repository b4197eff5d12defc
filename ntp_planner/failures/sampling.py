"""Failure states: which GPUs are down. Explicit ids, or random failures with a seed.

Random failures come as events with a blast radius: one GPU (91% of GPU errors, NCSA Delta
study), a host, or a whole NVLink domain (NVLink errors that spread). ``fraction`` is the share
of blast units that fail, so with blast="gpu" it is the share of GPUs. Failures hit the job's
GPUs only: a domain blast fails the GPUs the job uses in that domain (a partial last domain is
a unit too), and ``lost_domains`` names the domains whose idle GPUs went with them.
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
    """Job GPUs one failure takes down (the last domain may hold fewer)."""
    return {"gpu": 1, "node": cluster.spec.gpus_per_node, "domain": cluster.used_per_domain}[blast]


def random_failures(
    cluster: Cluster, fraction: float, rng: np.random.Generator, blast: Blast = "gpu"
) -> frozenset[int]:
    """Fail round(fraction * units) distinct blast units chosen uniformly at random."""
    if not 0 <= fraction < 1:
        raise ValueError(f"failure fraction {fraction} must lie in [0, 1)")
    size = blast_size(cluster, blast)
    units = -(-cluster.num_gpus // size)
    events = round(fraction * units)
    chosen = rng.choice(units, size=events, replace=False)
    gpus = (chosen[:, None] * size + np.arange(size)[None, :]).ravel()
    return frozenset(int(g) for g in gpus[gpus < cluster.num_gpus])


def lost_domains(cluster: Cluster, failed: frozenset[int], blast: Blast) -> frozenset[int]:
    """Domains lost whole, idle GPUs included, so no in-domain spare can stand in: those of
    ``failed`` when a failure takes down a domain (blast="domain"), else none."""
    if blast != "domain":
        return frozenset()
    return frozenset(cluster.domain_of(g) for g in failed)


def in_domain_cover(
    cluster: Cluster, failed: np.ndarray, domains_down: frozenset[int] = frozenset()
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(failed ids left, failed ids covered, the spare id covering each): the idle GPUs of a
    partly used domain stand in for its failed GPUs, lowest ids first, while they last; a
    domain in ``domains_down`` was lost whole and has none left.

    Example, 128 GPUs using 64 of each 72-GPU domain, so 8 idle in each (ids 128-135 and 136-143):
    of 9 failures in domain 0 the highest is left; with domain 1 lost, its failures stay.

    >>> from topologies.cluster_catalogue import CLUSTERS
    >>> c = Cluster(spec=CLUSTERS["gb200-nvl72"], num_gpus=128, gpus_per_domain=64)
    >>> [x.tolist() for x in in_domain_cover(c, np.arange(9) * 7)]
    [[56], [0, 7, 14, 21, 28, 35, 42, 49], [128, 129, 130, 131, 132, 133, 134, 135]]
    >>> [x.tolist() for x in in_domain_cover(c, np.array([100, 3, 70]), frozenset({1}))]
    [[70, 100], [3], [128]]
    """
    u, size, n = cluster.used_per_domain, cluster.spec.domain_size, cluster.num_gpus
    ids = np.sort(np.asarray(failed, dtype=np.int64))
    if (u == size and n % u == 0) or ids.size == 0:  # every domain fully used: no idle GPU anywhere
        return ids, ids[:0], ids[:0]
    domain = ids // u
    idle = size - np.minimum(u, n - domain * u)
    if domains_down:
        idle[np.isin(domain, list(domains_down))] = 0
    rank = np.arange(ids.size) - np.searchsorted(domain, domain)  # 0, 1, ... within each domain
    covered = rank < idle
    spare = n + domain * (size - u) + rank  # cluster.spare_gpus(domain)[rank]
    return ids[~covered], ids[covered], spare[covered]
