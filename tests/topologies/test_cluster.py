"""Cluster arithmetic agrees with its networkx graph; groups, failures and sizes are checked."""

import itertools

import networkx as nx
import pytest

from topologies import CLUSTERS, Cluster, Tier

HOPS = {Tier.NVLINK: 2, Tier.LEAF: 4, Tier.SPINE: 6}  # gpu-nvswitch-gpu; gpu-nic-leaf-nic-gpu; +spine


@pytest.mark.parametrize(
    ("name", "gpus", "nodes_per_leaf"), [("dgx-h100", 32, 2), ("gb200-nvl72", 144, 9), ("b200-nvl32", 64, 2)]
)
def test_tier_arithmetic_matches_graph_distance(name, gpus, nodes_per_leaf):
    spec = CLUSTERS[name].model_copy(update={"nodes_per_leaf": nodes_per_leaf})
    c = Cluster(spec=spec, num_gpus=gpus)
    g = c.graph
    sample = list(range(0, gpus, 3))
    for a, b in itertools.combinations(sample, 2):
        tier = c.tier(a, b)
        assert nx.shortest_path_length(g, ("gpu", a), ("gpu", b)) == HOPS[tier], (a, b, tier)


def test_graph_has_every_part():
    c = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=64, failed_gpus=frozenset({3}))
    kinds = {v[0] for v in c.graph.nodes}
    assert kinds == {"gpu", "host", "nvswitch", "nic", "leaf", "spine"}
    assert c.graph.nodes[("gpu", 3)]["failed"] and not c.graph.nodes[("gpu", 4)]["failed"]
    assert sum(1 for v in c.graph.nodes if v[0] == "nvswitch") == 8


def test_group_links_shapes():
    c = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=2048)  # 256 nodes = 8 scalable units of 32
    assert c.group_links(range(8)).tier == Tier.NVLINK
    inside_unit = c.group_links(range(0, 256, 8))  # one GPU per node, 32 nodes = 1 unit
    assert (inside_unit.tier, inside_unit.domains, inside_unit.per_domain) == (Tier.LEAF, 32, 1)
    across = c.group_links(range(0, 2048, 8))
    assert across.tier == Tier.SPINE
    over = Cluster(spec=CLUSTERS["dgx-h100"].model_copy(update={"spine_oversubscription": 2.0}), num_gpus=2048)
    assert over.group_links(range(0, 2048, 8)).scaleout_bw_bytes_per_s == 25e9
    assert over.group_links(range(0, 256, 8)).scaleout_bw_bytes_per_s == 50e9


def test_gpu_count_must_be_whole_domains():
    with pytest.raises(
        ValueError, match=r"100 GPUs is not a multiple of gb200-nvl72's NVLink domain size 72; use 72 or 144"
    ):
        Cluster(spec=CLUSTERS["gb200-nvl72"], num_gpus=100)


def test_failed_ids_are_checked():
    with pytest.raises(ValueError, match=r"outside 0\.\.15"):
        Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=16, failed_gpus=frozenset({16}))
    c = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=16).with_failures({2, 9})
    assert c.healthy_gpus() == [g for g in range(16) if g not in (2, 9)]


def test_strided_links_are_memoised_and_equal_group_links():
    c = Cluster(spec=CLUSTERS["dgx-a100"], num_gpus=512)
    assert c.strided_links(0, 8, 64) == c.group_links(range(0, 512, 8))
    assert c.strided_links(0, 8, 64) is c.strided_links(0, 8, 64)
