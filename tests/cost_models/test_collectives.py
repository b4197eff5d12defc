"""Collective times against hand-computed alpha-beta values."""

import math

import pytest

from cost_models.collectives import (
    all_gather_time,
    all_reduce_time,
    all_to_all_time,
    reduce_scatter_time,
    send_recv_time,
)
from cost_models.efficiency import Efficiency
from topologies import CLUSTERS, Cluster

EFF = Efficiency(nvlink_efficiency=1.0, scaleout_efficiency=1.0)
H100 = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=256)
NVL, NIC = 450e9, 50e9
A_NVL, A_NIC = 1e-6, 5e-6


def test_ring_all_reduce_inside_one_domain():
    links = H100.group_links(range(8))
    nbytes = 1e9
    expected = 2 * 7 / 8 * nbytes / NVL + 2 * math.ceil(math.log2(8)) * A_NVL
    assert all_reduce_time(nbytes, links, EFF) == pytest.approx(expected)


def test_flat_ring_across_domains_uses_one_nic_per_member():
    links = H100.group_links(range(0, 256, 8))  # 32 GPUs, one per DGX (a TP8 layout's DP group)
    assert (links.domains, links.per_domain) == (32, 1)
    nbytes = 4e9
    expected = 2 * (31 / 32 * nbytes / NIC) + 2 * math.ceil(math.log2(32)) * A_NIC
    assert all_reduce_time(nbytes, links, EFF) == pytest.approx(expected)


def test_hierarchical_all_reduce_spreads_over_all_nics_of_a_domain():
    links = H100.group_links(range(64))  # 8 domains x 8 GPUs (a TP1 layout's DP group)
    nbytes = 4e9
    inner = 7 / 8 * nbytes / NVL
    outer = 7 / 8 * (nbytes / 8) / NIC
    expected = 2 * (inner + outer) + 2 * math.ceil(math.log2(64)) * A_NIC
    assert all_reduce_time(nbytes, links, EFF) == pytest.approx(expected)
    two_per_domain = H100.group_links(range(0, 256, 4))  # 64 GPUs, 2 in each of 32 domains
    assert (two_per_domain.domains, two_per_domain.per_domain) == (32, 2)
    assert all_reduce_time(nbytes, two_per_domain, EFF) > all_reduce_time(nbytes, links, EFF)


def test_all_gather_mirrors_reduce_scatter_and_sums_to_all_reduce():
    links = H100.group_links(range(0, 128, 2))
    assert all_gather_time(3e8, links, EFF) == reduce_scatter_time(3e8, links, EFF)
    assert all_reduce_time(3e8, links, EFF) == pytest.approx(2 * reduce_scatter_time(3e8, links, EFF))


def test_all_to_all_and_send_recv():
    links = H100.group_links(range(16))  # two domains of 8
    nbytes = 1.6e9
    inside = 7 / 16 * nbytes / NVL
    outside = 8 / 16 * nbytes / NIC
    assert all_to_all_time(nbytes, links, EFF) == pytest.approx(max(inside, outside) + 4 * A_NIC)
    assert send_recv_time(1e9, H100.group_links([0, 8]), EFF) == pytest.approx(1e9 / NIC + A_NIC)
    assert send_recv_time(1e9, H100.group_links([0, 1]), EFF) == pytest.approx(1e9 / NVL + A_NVL)


def test_single_gpu_groups_cost_nothing():
    one = H100.group_links([5])
    assert all_reduce_time(1e9, one, EFF) == all_to_all_time(1e9, one, EFF) == send_recv_time(1e9, one, EFF) == 0.0
