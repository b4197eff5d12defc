"""RankGrid: hand-derived ranks and groups, round trips, and Megatron-Core's RankGenerator."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cost_models import ParallelLayout
from cost_models.rank_grid import AXES, Coords, RankGrid

# 16 GPUs, every axis 2: rank = tp_i + 2 cp_i + 4 dp_i + 8 pp_i
G16 = RankGrid(tp=2, cp=2, dp=2, pp=2)

degrees = st.integers(min_value=1, max_value=5)


def test_each_axis_has_its_stride():
    assert [G16.rank(**{a: 1}) for a in AXES] == [1, 2, 4, 8]
    assert G16.rank(tp=1, cp=1, dp=1, pp=1) == 15
    assert G16.rank(tp=1, cp=0, dp=1, pp=0) == 5
    grid = RankGrid(tp=8, cp=2, dp=4, pp=3)
    assert [grid.stride(a) for a in AXES] == [1, 8, 16, 64]
    assert grid.rank(tp=3, cp=1, dp=2, pp=2) == 3 + 8 * 1 + 16 * 2 + 64 * 2 == 171
    assert grid.coords(171) == Coords(tp=3, cp=1, dp=2, pp=2)
    assert grid.world_size == 192 and grid.sizes == {"tp": 8, "cp": 2, "dp": 4, "pp": 3}


def test_groups_of_sixteen_gpus():
    assert G16.groups("tp") == ((0, 1), (2, 3), (4, 5), (6, 7), (8, 9), (10, 11), (12, 13), (14, 15))
    assert G16.groups("cp") == ((0, 2), (1, 3), (4, 6), (5, 7), (8, 10), (9, 11), (12, 14), (13, 15))
    assert G16.groups("dp") == ((0, 4), (1, 5), (2, 6), (3, 7), (8, 12), (9, 13), (10, 14), (11, 15))
    assert G16.groups("pp") == ((0, 8), (1, 9), (2, 10), (3, 11), (4, 12), (5, 13), (6, 14), (7, 15))
    assert G16.groups("dp_cp") == ((0, 2, 4, 6), (1, 3, 5, 7), (8, 10, 12, 14), (9, 11, 13, 15))
    assert G16.group("dp_cp", 11) == (9, 11, 13, 15)
    assert G16.group("pp", 13) == (5, 13) and G16.group("tp", 13) == (12, 13) and G16.group("dp", 13) == (9, 13)


def test_array_views():
    grid = RankGrid(tp=2, dp=3, pp=2)
    assert grid.array().shape == (2, 3, 1, 2) and grid.array().ravel().tolist() == list(range(12))
    # replica 2: stage 0 on ranks 4, 5 and stage 1 on ranks 10, 11
    assert grid.array("dp", "pp", "tp")[2].tolist() == [[4, 5], [10, 11]]
    assert grid.array("tp", "pp")[1].tolist() == [1, 7]  # dp 0 (left out): TP rank 1 of each stage
    with pytest.raises(ValueError, match="distinct names"):
        grid.array("tp", "tp")


def test_out_of_range_coordinates_are_refused():
    with pytest.raises(IndexError, match=r"dp coordinate 2 is outside 0..1"):
        G16.rank(dp=2)
    with pytest.raises(IndexError, match=r"rank 16 is outside 0..15"):
        G16.coords(16)
    with pytest.raises(ValueError):
        RankGrid(tp=0)


def test_layout_grid():
    lay = ParallelLayout(tp=4, cp=2, dp=3, pp=5, global_batch=3)
    assert lay.rank_grid == RankGrid(tp=4, cp=2, dp=3, pp=5)


@given(degrees, degrees, degrees, degrees, st.data())
def test_rank_and_coords_are_inverse(tp, cp, dp, pp, data):
    grid = RankGrid(tp=tp, cp=cp, dp=dp, pp=pp)
    rank = data.draw(st.integers(0, grid.world_size - 1))
    c = grid.coords(rank)
    assert grid.rank(**c._asdict()) == rank
    assert rank == c.tp + tp * (c.cp + cp * (c.dp + dp * c.pp))  # the formula, written once more here
    assert grid.array()[c.pp, c.dp, c.cp, c.tp] == rank


@given(degrees, degrees, degrees, degrees)
def test_groups_partition_the_ranks(tp, cp, dp, pp):
    grid = RankGrid(tp=tp, cp=cp, dp=dp, pp=pp)
    for axis, size in [*grid.sizes.items(), ("dp_cp", dp * cp)]:
        groups = grid.groups(axis)
        assert sorted(r for g in groups for r in g) == list(range(grid.world_size))
        assert all(len(g) == size for g in groups)
        for g in groups:
            varying = {"dp_cp": {"dp", "cp"}}.get(axis, {axis})
            coords = [grid.coords(r) for r in g]
            for other in set(AXES) - varying:  # members differ only on the group's axes
                assert len({getattr(c, other) for c in coords}) == 1
            assert grid.group(axis, g[-1]) == g


@pytest.mark.parametrize(("tp", "cp", "dp", "pp"), [(2, 1, 2, 2), (2, 2, 2, 2), (4, 2, 3, 2), (1, 3, 2, 4)])
def test_megatron_core_rank_generator_agrees(tp, cp, dp, pp):
    """Megatron-Core's own grid, order "tp-cp-ep-dp-pp", gives the same groups."""
    parallel_state = pytest.importorskip("megatron.core.parallel_state", reason="megatron-core is not installed")
    megatron = parallel_state.RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=cp, order="tp-cp-ep-dp-pp")
    grid = RankGrid(tp=tp, cp=cp, dp=dp, pp=pp)
    for ours, theirs in [("tp", "tp"), ("cp", "cp"), ("dp", "dp"), ("pp", "pp"), ("dp_cp", "dp-cp")]:
        assert sorted(grid.groups(ours)) == sorted(tuple(g) for g in megatron.get_ranks(theirs)), ours


@pytest.mark.parametrize(
    ("tp", "cp", "dp", "pp", "ep"), [(2, 1, 4, 2, 2), (1, 2, 2, 1, 4), (2, 2, 3, 1, 2), (1, 3, 2, 2, 3)]
)
def test_ep_and_expert_dp_groups_against_brute_force(tp, cp, dp, pp, ep):
    g = RankGrid(tp=tp, cp=cp, dp=dp, pp=pp)
    flat = {r: g.coords(r).cp + cp * g.coords(r).dp for r in range(g.world_size)}  # cp fastest
    for r in range(g.world_size):
        c = g.coords(r)
        same = [x for x in range(g.world_size) if (g.coords(x).tp, g.coords(x).pp) == (c.tp, c.pp)]
        assert g.ep_group(ep, r) == tuple(x for x in same if flat[x] // ep == flat[r] // ep)
        assert g.expert_dp_group(ep, r) == tuple(x for x in same if flat[x] % ep == flat[r] % ep)


def test_ep_must_divide_the_cp_dp_ranks():
    with pytest.raises(ValueError, match=r"ep 4 does not divide cp\(1\) x dp\(6\) = 6"):
        RankGrid(dp=6).ep_group(4, 0)


@pytest.mark.parametrize(
    ("tp", "cp", "dp", "pp", "ep", "etp"),
    [
        (4, 1, 2, 1, 8, 1),
        (2, 1, 4, 2, 4, 1),
        (4, 1, 2, 2, 2, 2),
        (2, 2, 2, 1, 4, 2),
        (8, 1, 1, 2, 8, 1),
        (2, 1, 3, 1, 3, 2),
    ],
)
def test_expert_grid_matches_megatrons_expert_rank_generator(tp, cp, dp, pp, ep, etp):
    """Parallel folding: our expert groups are megatron-core's expert RankGenerator's
    (order "tp-ep-dp-pp" over etp x ep x edp x pp)."""
    parallel_state = pytest.importorskip("megatron.core.parallel_state")
    grid = RankGrid(tp=tp, cp=cp, dp=dp, pp=pp)
    edp = tp * cp * dp // (etp * ep)
    megatron = parallel_state.RankGenerator(tp=etp, ep=ep, dp=edp, pp=pp, cp=1, order="tp-ep-dp-pp")
    for ours, theirs in [("etp", "tp"), ("ep", "ep"), ("edp", "dp")]:
        assert sorted(grid.expert_groups(ours, ep, etp)) == sorted(tuple(g) for g in megatron.get_ranks(theirs)), ours


@pytest.mark.parametrize(("tp", "cp", "dp", "pp", "ep"), [(2, 1, 4, 2, 2), (1, 2, 2, 1, 4), (2, 2, 3, 1, 2)])
def test_expert_grid_at_etp_equal_tp_is_the_unfolded_grouping(tp, cp, dp, pp, ep):
    g = RankGrid(tp=tp, cp=cp, dp=dp, pp=pp)
    for r in range(g.world_size):
        assert g.expert_group("ep", r, ep) == g.ep_group(ep, r)
        assert g.expert_group("edp", r, ep) == g.expert_dp_group(ep, r)
        assert g.expert_group("etp", r, ep) == g.group("tp", r)


def test_expert_grid_must_tile_the_stage():
    with pytest.raises(ValueError, match=r"etp\(1\) \* ep\(3\) = 3 does not divide tp\(4\) x cp\(1\) x dp\(2\) = 8"):
        RankGrid(tp=4, dp=2).expert_group("ep", 0, ep=3, etp=1)
