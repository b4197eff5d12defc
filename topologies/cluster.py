"""A sized cluster: GPU ids, which tier joins two GPUs, bandwidth for a group, failed GPUs.

A job may use part of each NVLink domain (NVL72 racks are often run with 64 GPUs active and the
rest held as spares). The job's GPU ids run 0..num_gpus-1, domain by domain: with ``u`` GPUs used
per domain, domain ``d`` holds ids ``[d u, (d+1) u)`` and the last domain may hold fewer. The used
GPUs of a domain are its first ``u`` and the idle ones come after them, so GPU ``g`` of domain
``d`` sits at physical position ``g + d (domain_size - u)``: in host ``position // gpus_per_node``,
on rail ``g % gpus_per_node``, under scalable unit ``host // nodes_per_leaf``.

Example, dgx-h100 with 16 GPUs: GPUs 0-7 form host 0 and domain 0; GPU 3 and GPU 11 share rail 3
and leaf (0, 3), so they meet at the leaf tier. Example, 128 GPUs of gb200-nvl72 (72-GPU domains
of 4-GPU trays): domains of 72 and 56 GPUs, so GPUs 71 and 72 meet over InfiniBand; with 64 used
per domain, GPU 64 sits on tray 18, the first tray of the second rack.

Tier and bandwidth answers are arithmetic on ids (cheap for 100k GPUs); ``graph`` builds the
same structure as a networkx graph on first use, and tests check the two agree.
"""

from __future__ import annotations

import enum
import math
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from topologies.bounds import Bound, bounds_validator
from topologies.cluster_catalogue import ClusterSpec
from topologies.errors import InputError
from topologies.gpus import GPUSpec

if TYPE_CHECKING:
    import networkx as nx


class Tier(enum.IntEnum):
    """The widest part of the network a message crosses, cheapest first."""

    SAME_GPU = 0
    NVLINK = 1
    LEAF = 2
    SPINE = 3


class GroupLinks(BaseModel):
    """What a group of GPUs has to talk over, as the collective cost model needs it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    size: int = Field(description="GPUs in the group.")
    domains: int = Field(description="NVLink domains the group touches.")
    per_domain: int = Field(description="Most group members inside one domain.")
    tier: Tier = Field(description="Widest tier between two members.")
    nvlink_bw_bytes_per_s: float = Field(description="Per-GPU NVLink bandwidth, one way.")
    scaleout_bw_bytes_per_s: float = Field(
        description="Per-GPU scale-out bandwidth one way, after spine oversubscription."
    )
    nvlink_latency_s: float
    scaleout_latency_s: float


def _nearest(value: int, step: int, most: int | None = None) -> str:
    """The multiples of ``step`` either side of ``value``, positive and at most ``most``.

    >>> _nearest(6, 4), _nearest(2, 4), _nearest(70, 4, 72)
    ('4 or 8', '4', '68 or 72')
    """
    lower = value // step * step
    fits = [x for x in (lower, lower + step) if x > 0 and (most is None or x <= most)]
    return " or ".join(str(x) for x in fits)


MAX_GPUS = 10**6
"""Most GPUs a cluster may hold: ten times the largest training clusters (about 10**5 GPUs).
Placement, failure sampling and the graph walk every GPU, so a count far beyond this only makes
a run that never ends or a list that does not fit in memory."""


class Cluster(BaseModel):
    """``num_gpus`` GPUs built from ``spec``, some of which may have failed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    spec: ClusterSpec
    num_gpus: int = Field(gt=0, description="GPUs the job uses, a whole number of hosts, at most MAX_GPUS.")
    gpus_per_domain: int | None = Field(
        default=None,
        gt=0,
        description="GPUs the job uses in each NVLink domain, a whole number of hosts; None = every GPU of "
        "the domain. The rest of a domain is idle: spares inside the domain for the failure tools.",
    )
    failed_gpus: frozenset[int] = Field(default=frozenset(), description="Ids of GPUs that are down.")

    _bounds = bounds_validator(
        {
            "num_gpus": Bound(
                1, MAX_GPUS, "GPUs", "the largest training clusters hold about 100,000; more cannot be planned here"
            )
        }
    )

    @model_validator(mode="after")
    def _check(self) -> Cluster:
        s = self.spec
        node, domain = s.gpus_per_node, s.domain_size
        if self.num_gpus % node:
            raise InputError(
                f"{self.num_gpus} GPUs is not a multiple of {s.name}'s host size {node} "
                f"({self.num_gpus} % {node} = {self.num_gpus % node}); use {_nearest(self.num_gpus, node)}"
            )
        used = self.gpus_per_domain
        if used is not None:
            if used > domain:
                raise InputError(
                    f"{used} GPUs per domain is more than {s.name}'s NVLink domain size {domain}; use {domain} or fewer"
                )
            if domain < node:
                if used != domain:
                    raise InputError(
                        f"{used} GPUs per domain cannot be: {s.name}'s NVLink domains ({domain} GPUs) lie inside "
                        f"one {node}-GPU host, so a job uses all of a domain; use {domain}"
                    )
            elif used % node:
                raise InputError(
                    f"{used} GPUs per domain is not a multiple of {s.name}'s host size {node} "
                    f"({used} % {node} = {used % node}); use {_nearest(used, node, domain)}"
                )
        bad = sorted(g for g in self.failed_gpus if not 0 <= g < self.num_gpus)
        if bad:
            raise InputError(f"failed GPU ids {bad[:5]} are outside 0..{self.num_gpus - 1}")
        return self

    # ---- ids ---------------------------------------------------------------------------
    @property
    def gpu(self) -> GPUSpec:
        return self.spec.gpu_spec

    @property
    def used_per_domain(self) -> int:
        """GPUs the job uses in each NVLink domain but perhaps the last (``u`` above)."""
        return self.gpus_per_domain or self.spec.domain_size

    @property
    def num_domains(self) -> int:
        """NVLink domains the job uses, the last perhaps only in part."""
        return -(-self.num_gpus // self.used_per_domain)

    @property
    def num_nodes(self) -> int:
        """Hosts the job uses."""
        return self.num_gpus // self.spec.gpus_per_node

    @property
    def tp_domain_size(self) -> int:
        """The largest group of consecutive ids that stays inside one domain wherever it is aligned:
        the gcd of the used domain sizes. 128 GPUs of gb200-nvl72 use domains of 72 and 56, so 8;
        with 64 used per domain, 64 and 64, so 64. A TP degree must divide it.

        >>> from topologies.cluster_catalogue import CLUSTERS
        >>> nvl72 = CLUSTERS["gb200-nvl72"]
        >>> [Cluster(spec=nvl72, num_gpus=n, gpus_per_domain=u).tp_domain_size for n, u in
        ...  [(128, None), (128, 64), (64, None), (8, None), (144, None)]]
        [8, 64, 64, 8, 72]
        """
        return math.gcd(min(self.used_per_domain, self.num_gpus), self.num_gpus)

    def used_in_domain(self, domain: int) -> int:
        """GPUs the job uses in ``domain``: ``used_per_domain``, fewer in a partial last domain."""
        return min(self.used_per_domain, self.num_gpus - domain * self.used_per_domain)

    def idle_in_domain(self, domain: int) -> int:
        """GPUs of ``domain`` that the job does not use: its in-domain spares."""
        return self.spec.domain_size - self.used_in_domain(domain)

    def spare_gpus(self, domain: int) -> range:
        """Ids of ``domain``'s idle GPUs. They follow the job's ids, domain by domain (ids
        num_gpus and up); they are no part of the job (``tier``, ``group_links`` and ``graph``
        are about ids below num_gpus) until a re-plan moves a rank onto one.

        >>> from topologies.cluster_catalogue import CLUSTERS
        >>> c = Cluster(spec=CLUSTERS["gb200-nvl72"], num_gpus=128, gpus_per_domain=64)
        >>> c.spare_gpus(0), c.spare_gpus(1)
        (range(128, 136), range(136, 144))
        """
        start = self.num_gpus + domain * (self.spec.domain_size - self.used_per_domain)
        return range(start, start + self.idle_in_domain(domain))

    def domain_of(self, gpu: int) -> int:
        return gpu // self.used_per_domain

    def position_of(self, gpu: int) -> int:
        """Physical position of a job GPU, counting the idle GPUs of the domains before it."""
        return gpu + gpu // self.used_per_domain * (self.spec.domain_size - self.used_per_domain)

    def node_of(self, gpu: int) -> int:
        """Physical host: hosts of idle GPUs keep their numbers, so ids of used hosts may skip."""
        return self.position_of(gpu) // self.spec.gpus_per_node

    def rail_of(self, gpu: int) -> int:
        return gpu % self.spec.gpus_per_node

    def leaf_of(self, gpu: int) -> tuple[int, int]:
        """(scalable unit, rail): the leaf switch this GPU's NIC plugs into."""
        return self.node_of(gpu) // self.spec.nodes_per_leaf, self.rail_of(gpu)

    def healthy_gpus(self) -> list[int]:
        return [g for g in range(self.num_gpus) if g not in self.failed_gpus]

    def with_failures(self, failed: set[int] | frozenset[int]) -> Cluster:
        return Cluster(
            spec=self.spec, num_gpus=self.num_gpus, gpus_per_domain=self.gpus_per_domain, failed_gpus=frozenset(failed)
        )

    # ---- tiers and bandwidth -----------------------------------------------------------
    def tier(self, a: int, b: int) -> Tier:
        """Which tier joins GPUs ``a`` and ``b``.

        >>> from topologies.cluster_catalogue import CLUSTERS
        >>> c = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=16)
        >>> c.tier(0, 7).name, c.tier(3, 11).name, c.tier(3, 12).name
        ('NVLINK', 'LEAF', 'SPINE')
        """
        if a == b:
            return Tier.SAME_GPU
        if self.domain_of(a) == self.domain_of(b):
            return Tier.NVLINK
        if self.leaf_of(a) == self.leaf_of(b):
            return Tier.LEAF
        return Tier.SPINE

    def group_links(self, gpus: list[int] | range | np.ndarray) -> GroupLinks:
        """Bandwidth and shape of the links a collective over ``gpus`` uses.

        The tier is NVLINK inside one domain, LEAF inside one scalable unit (a hierarchical
        collective moves data between domains rail by rail, member i of each domain talking to
        member i of the others, so each message stays under one leaf), SPINE otherwise. Domains
        are the job's (``domain_of``), so a group across a partly used domain's edge crosses
        InfiniBand:

        >>> from topologies.cluster_catalogue import CLUSTERS
        >>> c = Cluster(spec=CLUSTERS["gb200-nvl72"], num_gpus=128)  # domains of 72 and 56
        >>> links = c.group_links(range(64, 80))
        >>> links.tier.name, links.domains, links.per_domain
        ('LEAF', 2, 8)
        """
        ids = np.asarray(gpus, dtype=np.int64)
        if ids.size == 0:
            raise ValueError("a group needs at least one GPU")
        _, per_domain = np.unique(self.domain_of(ids), return_counts=True)
        units = np.unique(self.node_of(ids) // self.spec.nodes_per_leaf)
        if ids.size == 1:
            tier = Tier.SAME_GPU
        elif per_domain.size == 1:
            tier = Tier.NVLINK
        elif units.size == 1:
            tier = Tier.LEAF
        else:
            tier = Tier.SPINE
        nic = self.spec.scaleout_bw_bytes_per_s
        if tier == Tier.SPINE:
            nic /= self.spec.spine_oversubscription
        return GroupLinks(
            size=int(ids.size),
            domains=int(per_domain.size),
            per_domain=int(per_domain.max()),
            tier=tier,
            nvlink_bw_bytes_per_s=self.spec.nvlink_bw_bytes_per_s,
            scaleout_bw_bytes_per_s=nic,
            nvlink_latency_s=self.spec.nvlink_latency_s,
            scaleout_latency_s=self.spec.scaleout_latency_s,
        )

    def strided_links(self, start: int, stride: int, count: int) -> GroupLinks:
        """``group_links`` of GPUs start, start+stride, ... (count of them), memoised: the
        layout search asks for the same few rank groups thousands of times."""
        key = (start, stride, count)
        cache = self._links_cache
        if key not in cache:
            cache[key] = self.group_links(range(start, start + stride * count, stride))
        return cache[key]

    def neighbour_links(self, stride: int, count: int) -> frozenset[GroupLinks]:
        """The distinct links between GPU pairs (s * stride, (s + 1) * stride), s < count:
        between neighbouring pipeline stages. Memoised; they repeat with the hosts, so a few kinds.

        >>> from topologies.cluster_catalogue import CLUSTERS
        >>> c = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=32)
        >>> sorted(links.tier.name for links in c.neighbour_links(4, 7))  # in a host, across hosts
        ['LEAF', 'NVLINK']
        """
        key = ("neighbours", stride, count)
        cache = self._links_cache
        if key not in cache:
            cache[key] = frozenset(self.strided_links(s * stride, stride, 2) for s in range(count))
        return cache[key]

    def grid_links(self, inner_stride: int, inner_count: int, outer_stride: int, outer_count: int) -> GroupLinks:
        """Links of the group {i * inner_stride + j * outer_stride}, memoised: a per-layer TP
        group's data-parallel peers are its copies inside the stage times the outer replicas."""
        if inner_count == 1:
            return self.strided_links(0, outer_stride, outer_count)
        if outer_count == 1:
            return self.strided_links(0, inner_stride, inner_count)
        key = (inner_stride, inner_count, outer_stride, outer_count)
        cache = self._links_cache
        if key not in cache:
            inner = np.arange(inner_count) * inner_stride
            outer = np.arange(outer_count) * outer_stride
            cache[key] = self.group_links((outer[:, None] + inner[None, :]).ravel())
        return cache[key]

    @cached_property
    def _links_cache(self) -> dict[tuple[int, int, int], GroupLinks]:
        return {}

    # ---- graph -------------------------------------------------------------------------
    @cached_property
    def graph(self) -> nx.Graph:
        """The cluster as a networkx graph; built on first access (about 0.1 s per 10k GPUs).

        Vertices are tuples: ("gpu", g), ("host", n), ("nvswitch", d), ("nic", g),
        ("leaf", unit, rail), ("spine", k). Edges carry ``bw_bytes_per_s`` (one way) and
        ``kind``. GPU vertices carry ``failed``. Only the job's GPUs are vertices; hosts keep
        their physical numbers (``node_of``), as the leaf a GPU's NIC plugs into depends on them.
        """
        import networkx as nx

        s = self.spec
        g = nx.Graph()
        gpus = range(self.num_gpus)
        g.add_nodes_from((("gpu", i), {"failed": i in self.failed_gpus}) for i in gpus)
        g.add_edges_from(
            (("gpu", i), ("nvswitch", self.domain_of(i)), {"kind": "nvlink", "bw_bytes_per_s": s.nvlink_bw_bytes_per_s})
            for i in gpus
        )
        g.add_edges_from((("gpu", i), ("host", self.node_of(i)), {"kind": "pcie"}) for i in gpus)
        g.add_edges_from(
            (("gpu", i), ("nic", i), {"kind": "pcie", "bw_bytes_per_s": s.scaleout_bw_bytes_per_s}) for i in gpus
        )
        g.add_edges_from(
            (("nic", i), ("leaf", *self.leaf_of(i)), {"kind": "ib", "bw_bytes_per_s": s.scaleout_bw_bytes_per_s})
            for i in gpus
        )
        units = self.node_of(self.num_gpus - 1) // s.nodes_per_leaf + 1  # hosts count idle ones too
        uplink = s.nodes_per_leaf * s.scaleout_bw_bytes_per_s / s.spine_oversubscription / s.gpus_per_node
        g.add_edges_from(
            (("leaf", u, r), ("spine", k), {"kind": "ib", "bw_bytes_per_s": uplink})
            for u in range(units)
            for r in range(s.gpus_per_node)
            for k in range(s.gpus_per_node)
        )
        return g
