"""A sized cluster: GPU ids, which tier joins two GPUs, bandwidth for a group, failed GPUs.

GPU ids run host by host: GPU ``g`` sits in host ``g // gpus_per_node`` on rail
``g % gpus_per_node``, in NVLink domain ``g // domain_size``, under scalable unit
``host // nodes_per_leaf``. Example, dgx-h100 with 16 GPUs: GPUs 0-7 form host 0 and domain 0;
GPU 3 and GPU 11 share rail 3 and leaf (0, 3), so they meet at the leaf tier.

Tier and bandwidth answers are arithmetic on ids (cheap for 100k GPUs); ``graph`` builds the
same structure as a networkx graph on first use, and tests check the two agree.
"""

from __future__ import annotations

import enum
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from topologies.clusters import ClusterSpec
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


class Cluster(BaseModel):
    """``num_gpus`` GPUs built from ``spec``, some of which may have failed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    spec: ClusterSpec
    num_gpus: int = Field(gt=0, description="Total GPUs, a whole number of NVLink domains.")
    failed_gpus: frozenset[int] = Field(default=frozenset(), description="Ids of GPUs that are down.")

    @model_validator(mode="after")
    def _check(self) -> Cluster:
        unit = max(self.spec.domain_size, self.spec.gpus_per_node)
        if self.num_gpus % unit:
            lower, upper = self.num_gpus // unit * unit, (self.num_gpus // unit + 1) * unit
            raise ValueError(
                f"{self.num_gpus} GPUs is not a multiple of {self.spec.name}'s "
                f"{'NVLink domain' if unit == self.spec.domain_size else 'host'} size {unit}; "
                f"use {lower or upper} or {upper}"
            )
        bad = sorted(g for g in self.failed_gpus if not 0 <= g < self.num_gpus)
        if bad:
            raise ValueError(f"failed GPU ids {bad[:5]} are outside 0..{self.num_gpus - 1}")
        return self

    # ---- ids ---------------------------------------------------------------------------
    @property
    def gpu(self) -> GPUSpec:
        return self.spec.gpu_spec

    @property
    def num_domains(self) -> int:
        return self.num_gpus // self.spec.domain_size

    @property
    def num_nodes(self) -> int:
        return self.num_gpus // self.spec.gpus_per_node

    def domain_of(self, gpu: int) -> int:
        return gpu // self.spec.domain_size

    def node_of(self, gpu: int) -> int:
        return gpu // self.spec.gpus_per_node

    def rail_of(self, gpu: int) -> int:
        return gpu % self.spec.gpus_per_node

    def leaf_of(self, gpu: int) -> tuple[int, int]:
        """(scalable unit, rail): the leaf switch this GPU's NIC plugs into."""
        return self.node_of(gpu) // self.spec.nodes_per_leaf, self.rail_of(gpu)

    def healthy_gpus(self) -> list[int]:
        return [g for g in range(self.num_gpus) if g not in self.failed_gpus]

    def with_failures(self, failed: set[int] | frozenset[int]) -> Cluster:
        return Cluster(spec=self.spec, num_gpus=self.num_gpus, failed_gpus=frozenset(failed))

    # ---- tiers and bandwidth -----------------------------------------------------------
    def tier(self, a: int, b: int) -> Tier:
        """Which tier joins GPUs ``a`` and ``b``.

        >>> from topologies.clusters import CLUSTERS
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
        member i of the others, so each message stays under one leaf), SPINE otherwise.
        """
        ids = np.asarray(gpus, dtype=np.int64)
        if ids.size == 0:
            raise ValueError("a group needs at least one GPU")
        _, per_domain = np.unique(ids // self.spec.domain_size, return_counts=True)
        units = np.unique(ids // self.spec.gpus_per_node // self.spec.nodes_per_leaf)
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
        ``kind``. GPU vertices carry ``failed``.
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
        units = -(-self.num_nodes // s.nodes_per_leaf)
        uplink = s.nodes_per_leaf * s.scaleout_bw_bytes_per_s / s.spine_oversubscription / s.gpus_per_node
        g.add_edges_from(
            (("leaf", u, r), ("spine", k), {"kind": "ib", "bw_bytes_per_s": uplink})
            for u in range(units)
            for r in range(s.gpus_per_node)
            for k in range(s.gpus_per_node)
        )
        return g
