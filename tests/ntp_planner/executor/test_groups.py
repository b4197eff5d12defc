"""The run's process groups (``executor.groups``, from ``RankGrid``) against brute-force
enumeration of what each group means, on small grids."""

import itertools

import pytest

from ntp_planner.executor.groups import dp_groups, ep_group, expert_dp_group, process_groups
from ntp_planner.executor.spec import TinyConfig, make_spec

MOE = TinyConfig(layers=1, experts=4, top_k=2, expert_ffn=8, moe_layers=(0,))


def where(spec):
    """rank -> (pipeline, stage, local position), by walking every stage."""
    return {
        r: (q, s, i)
        for q, rep in enumerate(spec.replicas)
        for s, st in enumerate(rep.stages)
        for i, r in enumerate(st.ranks)
    }


@pytest.mark.parametrize(("cp", "dp", "ep"), [(1, 4, 2), (2, 2, 2), (2, 2, 4), (1, 4, 4), (2, 3, 2)])
def test_ep_and_expert_dp_groups_are_the_pipelines_megatron_groups(cp, dp, ep):
    spec = make_spec(MOE, [[2, 2, 2]], [([2], 1)] * dp, 2, 8, cp=cp, ep=ep)
    at = where(spec)
    for rank, (q, s, i) in at.items():
        # EP: the ep consecutive pipelines (cp fastest) holding q, same stage and local position
        brute_ep = sorted(r for r, (q2, s2, i2) in at.items() if q2 // ep == q // ep and (s2, i2) == (s, i))
        assert ep_group(spec, rank) == tuple(brute_ep)
        # expert DP: every pipeline at q's place in its EP group; a degree-2 block has one copy
        brute_dp = sorted(r for r, (q2, s2, i2) in at.items() if q2 % ep == q % ep and (s2, i2) == (s, i))
        assert expert_dp_group(spec, rank, 2) == tuple(brute_dp)


@pytest.mark.parametrize(("width", "t", "replicas"), [(4, 2, 2), (4, 1, 2), (2, 2, 3), (4, 4, 2)])
def test_copy_and_dp_groups_of_uniform_replicas(width, t, replicas):
    spec = make_spec(TinyConfig(layers=1), [[width, t, width]], [([width], 1)] * replicas, 4, 8)
    at = where(spec)
    stage = spec.replicas[0].stages[0]
    # copy c's TP group: local positions c t .. c t + t - 1; in-stage DP group j: positions = j mod t
    assert stage.copy_tp_groups(t) == tuple(stage.ranks[c * t : c * t + t] for c in range(width // t))
    assert stage.copy_dp_groups(t) == tuple(tuple(r for k, r in enumerate(stage.ranks) if k % t == j) for j in range(t))
    # across replicas: TP rank j of every copy of every replica
    brute = tuple(tuple(sorted(r for r, (_, _, i) in at.items() if i % t == j)) for j in range(t))
    assert dp_groups(spec, 0, 1) == brute


def test_cp_groups_and_process_groups_of_a_cp2_run():
    spec = make_spec(TinyConfig(layers=1), [[2, 2, 2]], [([2], 1)] * 2, 2, 8, cp=2)
    at = where(spec)
    for q, rep in enumerate(spec.replicas):
        for i in range(rep.stages[0].width):
            brute = tuple(sorted(r for r, (q2, _, i2) in at.items() if q2 // 2 == q // 2 and i2 == i))
            assert spec.cp_group(q, 0, i) == brute
    groups = process_groups(spec)
    assert len(groups) == len(set(groups))
    # every cp pair, TP pair and cross-replica DP group appears: 4 stages, 4 cp pairs, 2 + 2 DP groups
    assert {(0, 2), (1, 3), (4, 6), (5, 7)} <= set(groups) and {(0, 1), (2, 3), (4, 5), (6, 7)} <= set(groups)


def test_the_ntp_dp_groups_pair_the_core_positions_of_uneven_stages():
    # a healthy replica at width 4 and a degraded one at 3: core TP ranks 0-2 of each, paired
    spec = make_spec(TinyConfig(layers=1), [[4, 4, 4]], [([4], 1), ([3], 1)], 1, 8)
    healthy, degraded = (rep.stages[0].ranks for rep in spec.replicas)
    assert dp_groups(spec, 0, 1) == tuple((healthy[j], degraded[j]) for j in range(3))
    assert list(itertools.chain(*dp_groups(spec, 0, 1))) == [0, 4, 1, 5, 2, 6]
