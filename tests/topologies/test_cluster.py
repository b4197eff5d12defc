"""Cluster arithmetic agrees with its networkx graph; groups, failures and sizes are checked."""

import itertools

import networkx as nx
import pytest
from pydantic import ValidationError

from topologies import CLUSTERS, Cluster, Tier

HOPS = {Tier.NVLINK: 2, Tier.LEAF: 4, Tier.SPINE: 6}  # gpu-nvswitch-gpu; gpu-nic-leaf-nic-gpu; +spine


@pytest.mark.parametrize(
    ("name", "gpus", "nodes_per_leaf", "per_domain"),
    [
        ("dgx-h100", 32, 2, None),
        ("gb200-nvl72", 144, 9, None),
        ("b200-nvl32", 64, 2, None),
        ("gb200-nvl72", 128, 9, None),  # domains of 72 and 56
        ("gb200-nvl72", 128, 32, 64),  # 16 of 18 trays per rack; rack 1's trays 32-33 in unit 1
        ("b200-nvl32", 40, 2, 16),  # domains of 16, 16, 8; idle hosts leave leaves half used
    ],
)
def test_tier_arithmetic_matches_graph_distance(name, gpus, nodes_per_leaf, per_domain):
    spec = CLUSTERS[name].model_copy(update={"nodes_per_leaf": nodes_per_leaf})
    c = Cluster(spec=spec, num_gpus=gpus, gpus_per_domain=per_domain)
    g = c.graph
    assert sum(1 for v in g.nodes if v[0] == "gpu") == gpus
    assert sum(1 for v in g.nodes if v[0] == "nvswitch") == c.num_domains
    sample = list(range(0, gpus, 3))
    for a, b in itertools.combinations(sample, 2):
        tier = c.tier(a, b)
        assert nx.shortest_path_length(g, ("gpu", a), ("gpu", b)) == HOPS[tier], (a, b, tier)
        links = c.group_links([a, b])  # its LEAF ignores rails (hierarchical collectives go rail by rail)
        assert links.domains == (1 if tier == Tier.NVLINK else 2) and (links.tier == Tier.SPINE) <= (tier == Tier.SPINE)


def test_128_gpus_of_nvl72_use_domains_of_72_and_56():
    c = Cluster(spec=CLUSTERS["gb200-nvl72"], num_gpus=128)
    assert (c.num_domains, c.used_in_domain(0), c.used_in_domain(1)) == (2, 72, 56)
    assert (c.idle_in_domain(0), c.idle_in_domain(1)) == (0, 16)
    assert c.tp_domain_size == 8  # gcd(72, 56): a TP16 group at 64-79 would straddle the racks
    assert c.tier(70, 71) == Tier.NVLINK and c.tier(72, 127) == Tier.NVLINK
    assert c.tier(71, 72) == Tier.SPINE  # different racks, rails 3 and 0
    assert c.tier(68, 72) == Tier.LEAF  # rail 0 of trays 17 and 18, one 32-tray unit
    assert (c.spare_gpus(0), c.spare_gpus(1)) == (range(128, 128), range(128, 144))


def test_64_of_each_72_leaves_8_idle_per_rack():
    c = Cluster(spec=CLUSTERS["gb200-nvl72"], num_gpus=128, gpus_per_domain=64)
    assert (c.num_domains, c.used_in_domain(1), c.idle_in_domain(1), c.tp_domain_size) == (2, 64, 8, 64)
    assert c.tier(63, 64) != Tier.NVLINK and c.tier(64, 127) == Tier.NVLINK
    # GPU 64 is the first of rack 1, on tray 18 (rack 0 has 18 trays, 2 of them idle)
    assert (c.node_of(63), c.node_of(64), c.num_nodes) == (15, 18, 32)
    # GPU 116 sits on tray 18 + 13 = 31 (unit 0), GPU 120 on tray 32 (unit 1): 32 trays per unit
    assert c.tier(0, 116) == Tier.LEAF and c.tier(0, 120) == Tier.SPINE
    assert (c.spare_gpus(0), c.spare_gpus(1)) == (range(128, 136), range(136, 144))


def test_a_group_across_partial_domains_goes_over_infiniband():
    c = Cluster(spec=CLUSTERS["gb200-nvl72"], num_gpus=128, gpus_per_domain=64)
    inside = c.group_links(range(48, 64))
    assert (inside.tier, inside.domains, inside.per_domain) == (Tier.NVLINK, 1, 16)
    across = c.group_links(range(56, 72))  # 8 GPUs in each rack, though 72 GPUs would fit one rack
    assert (across.tier, across.domains, across.per_domain) == (Tier.LEAF, 2, 8)
    assert across.scaleout_bw_bytes_per_s == 400e9 / 8  # one 400 Gb/s NIC per GPU


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


@pytest.mark.parametrize(
    ("gpus", "per_domain", "message"),
    [
        (6, None, "6 GPUs is not a multiple of gb200-nvl72's host size 4 (6 % 4 = 2); use 4 or 8"),
        (2, None, "2 GPUs is not a multiple of gb200-nvl72's host size 4 (2 % 4 = 2); use 4"),
        (128, 80, "80 GPUs per domain is more than gb200-nvl72's NVLink domain size 72; use 72 or fewer"),
        (128, 66, "66 GPUs per domain is not a multiple of gb200-nvl72's host size 4 (66 % 4 = 2); use 64 or 68"),
        (128, 71, "71 GPUs per domain is not a multiple of gb200-nvl72's host size 4 (71 % 4 = 3); use 68 or 72"),
        (128, 2, "2 GPUs per domain is not a multiple of gb200-nvl72's host size 4 (2 % 4 = 2); use 4"),
    ],
)
def test_gpu_counts_are_whole_hosts(gpus, per_domain, message):
    with pytest.raises(ValidationError) as err:
        Cluster(spec=CLUSTERS["gb200-nvl72"], num_gpus=gpus, gpus_per_domain=per_domain)
    assert err.value.errors()[0]["msg"] == "Value error, " + message


def test_any_whole_number_of_hosts_is_a_cluster():
    for gpus in (4, 8, 64, 100, 128):
        assert Cluster(spec=CLUSTERS["gb200-nvl72"], num_gpus=gpus).num_nodes == gpus // 4
    assert Cluster(spec=CLUSTERS["gb200-nvl72"], num_gpus=8, gpus_per_domain=64).num_domains == 1
    small_domains = CLUSTERS["dgx-h100"].model_copy(update={"domain_size": 4})  # two domains per host
    with pytest.raises(ValueError, match="lie inside one 8-GPU host, so a job uses all of a domain; use 4"):
        Cluster(spec=small_domains, num_gpus=16, gpus_per_domain=2)
    assert Cluster(spec=small_domains, num_gpus=16, gpus_per_domain=4).tp_domain_size == 4


def test_failed_ids_are_checked():
    with pytest.raises(ValueError, match=r"outside 0\.\.15"):
        Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=16, failed_gpus=frozenset({16}))
    c = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=16).with_failures({2, 9})
    assert c.healthy_gpus() == [g for g in range(16) if g not in (2, 9)]
    partial = Cluster(spec=CLUSTERS["gb200-nvl72"], num_gpus=128, gpus_per_domain=64).with_failures({3})
    assert (partial.gpus_per_domain, partial.failed_gpus) == (64, frozenset({3}))


def test_strided_links_are_memoised_and_equal_group_links():
    c = Cluster(spec=CLUSTERS["dgx-a100"], num_gpus=512)
    assert c.strided_links(0, 8, 64) == c.group_links(range(0, 512, 8))
    assert c.strided_links(0, 8, 64) is c.strided_links(0, 8, 64)
