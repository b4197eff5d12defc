"""Placement when several pipeline stages share a host (a first test on one machine)."""

import json

import pytest

from cost_models.rank_grid import RankGrid
from ntp_planner.solver.placement import place_ranks
from topologies import CLUSTERS, Cluster
from topologies.errors import InputError


@pytest.mark.parametrize(("tp", "dp", "pp"), [(2, 2, 2), (4, 1, 2), (1, 2, 4), (2, 1, 4)])
def test_stages_inside_one_host_run_in_rank_order(tp, dp, pp):
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=8)
    assert place_ranks(RankGrid(tp=tp, dp=dp, pp=pp), cluster) == list(range(8))


def test_a_failed_gpu_shifts_the_tp_groups_of_in_host_stages():
    # One 8-GPU host, tp2 pp3 on 6 GPUs. GPU 2 fails, so slot {2,3} is lost; no three hosts hold a
    # slot at one offset, so the three stages share the host and their TP groups take the healthy
    # slots 0, 4, 6 in rank order.
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=8, failed_gpus=frozenset({2}))
    assert place_ranks(RankGrid(tp=2, pp=3), cluster) == [0, 1, 4, 5, 6, 7]


def test_stages_on_separate_hosts_keep_their_rails():
    # the module's worked example: with a host per stage the rail rule still holds after a failure
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=16, failed_gpus=frozenset({2}))
    gpus = place_ranks(RankGrid(tp=2, dp=3, pp=2), cluster)
    assert gpus == [0, 1, 4, 5, 6, 7, 8, 9, 12, 13, 14, 15]
    assert all(gpus[r] % 8 == gpus[r + 6] % 8 for r in range(6))


def test_too_few_healthy_slots_is_an_input_error():
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=8, failed_gpus=frozenset({0}))
    with pytest.raises(InputError, match="only 3 TP groups of 2 healthy GPUs"):
        place_ranks(RankGrid(tp=2, dp=2, pp=2), cluster)


def test_a_first_test_on_one_machine_saves_a_plan(tmp_path):
    from typer.testing import CliRunner

    from ntp_planner.cli import app

    args = ["estimate", "-m", "llama3-8b", "-c", "dgx-h100", "-n", "8", "--tp", "2", "--pp", "2", "--dp", "2"]
    result = CliRunner().invoke(
        app, [*args, "--seq-len", "4096", "--global-batch", "16", "-o", str(tmp_path / "p.json")]
    )
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "p.json").read_text())["placement"] == list(range(8))


@pytest.mark.parametrize(
    ("spec", "gpus", "tp", "dp", "pp", "ep", "etp"),
    [
        ("dgx-h100", 16, 2, 4, 2, 4, 1),  # folded: EP over tp x dp inside a host
        ("dgx-h100", 32, 4, 4, 2, 8, 1),  # folded, 8 ranks: one host each
        ("dgx-h100", 32, 2, 8, 2, 8, 2),  # unfolded, 16 ranks: two hosts -> flex
        ("dgx-h100", 16, 8, 2, 1, 2, 8),  # unfolded, ep 2 across the two hosts -> flex
        ("gb200-nvl72", 64, 4, 8, 2, 8, 1),  # one 72-GPU domain holds all 64
        ("gb200-nvl72", 128, 8, 8, 2, 8, 1),  # domains of 72 and 56: tp_domain_size 8
    ],
)
def test_the_searched_dispatcher_matches_where_placement_puts_each_ep_group(spec, gpus, tp, dp, pp, ep, etp):
    """Placement puts an EP group (RankGrid's expert grid) inside one NVLink domain exactly when
    the search's dispatcher rule calls for all-to-all, else it spans domains and the rule says
    flex: the rule's contiguity assumption (etp * ep consecutive ranks) holds where it is used."""
    from ntp_planner.solver.search import dispatcher

    cluster = Cluster(spec=CLUSTERS[spec], num_gpus=gpus)
    grid = RankGrid(tp=tp, dp=dp, pp=pp)
    gpu_of = place_ranks(grid, cluster)
    domain_of = {g: g // cluster.used_per_domain for g in range(gpus)}  # the job's GPU ids, domain by domain
    spans = {len({domain_of[gpu_of[r]] for r in group}) > 1 for group in grid.expert_groups("ep", ep, etp)}
    rule = dispatcher(etp, ep, cluster.tp_domain_size)
    # all-to-all only where no group leaves its domain; flex where one does (others may fit: 72 / 56)
    assert spans == {rule == "flex"} or (rule == "flex" and spans == {False, True})
