"""Time of NCCL-style collectives on a group of GPUs, from the links the group spans.

Alpha-beta model (Thakur, Rabenseifner, Gropp 2005; NCCL's ring algorithms). ``nbytes`` is the
size of the full buffer on each GPU. Inside one NVLink domain a ring moves
2(n-1)/n * nbytes per GPU for an all-reduce. A group spanning k domains with m members in each
runs hierarchically (NCCL's NVLS/tree-ring hybrids behave alike): reduce-scatter inside the
domain, all-reduce of the 1/m shard across domains with every member using its own NIC, then
all-gather inside the domain. Latency terms use a tree's 2 log2(n) steps, since NCCL switches to
trees (and, for reduce-scatter and all-gather across many nodes, its PAT algorithm) where latency
matters.

What grows with scale: the latency term (log2 of the group), the tier a group's traffic crosses
(``GroupLinks.tier``: NVLink, one leaf switch on one rail, or spines, where ``spine_efficiency``
applies), and, in ``cost_models.data_parallel``, the number of buckets a data-parallel group
reduces (Megatron's bucket grows with dp) and the compute left to hide them behind as the
micro-batches per replica fall.
"""

from __future__ import annotations

import math

from cost_models.efficiency import Efficiency
from topologies.cluster import GroupLinks, Tier


def _nvl_bw(links: GroupLinks, eff: Efficiency) -> float:
    return links.nvlink_bw_bytes_per_s * eff.nvlink_efficiency


def _net_bw(links: GroupLinks, eff: Efficiency) -> float:
    """NIC bandwidth a collective sustains: NCCL's efficiency on InfiniBand, less again when the
    group spans scalable units and its traffic crosses spine switches."""
    spine = eff.spine_efficiency if links.tier == Tier.SPINE else 1.0
    return links.scaleout_bw_bytes_per_s * eff.scaleout_efficiency * spine


def _latency(links: GroupLinks) -> float:
    steps = 2 * math.ceil(math.log2(max(links.size, 2)))
    alpha = links.nvlink_latency_s if links.domains <= 1 else links.scaleout_latency_s
    return steps * alpha


def reduce_scatter_time(nbytes: float, links: GroupLinks, eff: Efficiency) -> float:
    """Each GPU ends with the reduced 1/n shard: (n-1)/n * nbytes moved per GPU and tier."""
    n = links.size
    if n <= 1 or nbytes <= 0:
        return 0.0
    if links.domains <= 1:
        return (n - 1) / n * nbytes / _nvl_bw(links, eff) + _latency(links) / 2
    m, k = links.per_domain, links.domains
    inner = (m - 1) / m * nbytes / _nvl_bw(links, eff) if m > 1 else 0.0
    outer = (k - 1) / k * (nbytes / m) / _net_bw(links, eff)
    return inner + outer + _latency(links) / 2


def all_gather_time(nbytes: float, links: GroupLinks, eff: Efficiency) -> float:
    """Mirror image of reduce-scatter: same bytes on the same links. ``nbytes`` = gathered size."""
    return reduce_scatter_time(nbytes, links, eff)


def all_reduce_time(nbytes: float, links: GroupLinks, eff: Efficiency) -> float:
    """Reduce-scatter followed by all-gather: 2(n-1)/n * nbytes per GPU for a flat ring."""
    return 2 * reduce_scatter_time(nbytes, links, eff)


def all_to_all_time(nbytes: float, links: GroupLinks, eff: Efficiency) -> float:
    """Each GPU sends nbytes/n to every other member: the share bound for its own domain goes
    over NVLink, the rest over its NIC; the two proceed concurrently."""
    n = links.size
    if n <= 1 or nbytes <= 0:
        return 0.0
    m = links.per_domain if links.domains > 1 else n
    inside = (m - 1) / n * nbytes / _nvl_bw(links, eff)
    outside = (n - m) / n * nbytes / _net_bw(links, eff) if links.domains > 1 else 0.0
    return max(inside, outside) + _latency(links) / 2


def send_recv_time(nbytes: float, links: GroupLinks, eff: Efficiency) -> float:
    """Point-to-point between the two GPUs of ``links`` (a pipeline neighbour pair)."""
    if nbytes <= 0 or links.size <= 1:
        return 0.0
    if links.domains <= 1:
        return nbytes / _nvl_bw(links, eff) + links.nvlink_latency_s
    return nbytes / _net_bw(links, eff) + links.scaleout_latency_s
