"""The shrink of an MoE re-plan that re-hosts experts (``shrink.hosted``): the run keeps the plan's
ep, holds whole EP groups, and hosts the lost member's experts where the re-plan says, in the
run's process numbering; checked by hand on a 4-layer Mixtral at tp 2, dp 4, ep 4, etp 1."""

import pytest

from cost_models.catalogue import MODELS
from cost_models.layout import ParallelLayout
from cost_models.training import TrainingSpec
from ntp_planner.executor.shrink.hosted import hosted_units, plan_expert
from ntp_planner.executor.shrink.run import shrink
from ntp_planner.executor.spec import StageExperts
from ntp_planner.failures.replan import Replanner
from ntp_planner.solver.planner import plan_from_layout
from topologies.cluster import Cluster
from topologies.cluster_catalogue import CLUSTERS
from topologies.errors import InputError

MIXTRAL4 = MODELS["mixtral-8x7b"].model_copy(update={"name": "mixtral-8x7b-4", "num_layers": 4})


def _plan(pp=1, model=MIXTRAL4, gpus=8, **kw):
    lay = ParallelLayout(**{"tp": 2, "pp": pp, "dp": gpus // 2 // pp, "ep": 4, "etp": 1, "global_batch": 16} | kw)
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=gpus)
    return plan_from_layout(model, TrainingSpec(seq_len=2048, global_batch=lay.global_batch), cluster, lay)


@pytest.fixture(scope="module")
def replanned():
    """GPU 3 fails: the re-planner packs replica 3 onto GPU 2 at TP 1 (rank 6; rank 7 lost) and
    re-hosts rank 7's experts 6, 7 on ranks 4, 5 of EP group (4, 5, 6, 7); replicas 2 and 3 run
    in lockstep, one sequence each, replicas 0 and 1 in full (4 sequences)."""
    plan = _plan()
    r = Replanner(plan).replan(frozenset({3}), "ntp")
    (x,) = r.experts
    assert (x.ep_group, x.lost, x.mode) == ([4, 5, 6], [7], "rehosted")
    assert x.owners == [[4], [4], [5], [5], [6], [6], [4], [5]]
    assert [(y.stage_tp, y.local_batch) for y in r.replicas] == [([2], 4), ([2], 4), ([2], 1), ([1], 1)]
    return plan, r


def test_the_run_hosts_the_rehosted_group_in_its_own_process_numbers(replanned):
    plan, r = replanned
    s = shrink(plan, 7, r)
    # the re-hosted unit (replicas 2, 3) first, then the healthy one (0, 1): processes 0, 1 stand
    # for plan ranks 4, 5, process 2 for rank 6 (on GPU 2), processes 3-6 for ranks 0-3
    assert s.replicas == (2, 3, 0, 1)
    assert [p for p, _ in s.plan_ranks] == [4, 5, 6, 0, 1, 2, 3]
    assert (s.spec.ep, s.spec.etp, s.spec.zero, s.spec.cfg.experts) == (4, 1, 0, 8)
    assert [x.micro_batches for x in s.spec.replicas] == [1, 1, 2, 2]  # the lockstep pair runs fewer
    # group (4, 5, 6) -> processes (0, 1, 2): experts 0, 1 on 0; 2, 3 on 1; 4, 5 on 2; the lost
    # rank's 6 and 7 on 0 and 1. Group (0, 1, 2, 3) -> processes 3-6, two experts each in order.
    hosted = (0, 0, 1, 1, 2, 2, 0, 1)
    healthy = (3, 3, 4, 4, 5, 5, 6, 6)
    owners = tuple(tuple(sorted(pair)) for pair in zip(hosted, healthy, strict=True))
    assert s.spec.hosting == (StageExperts(((3, 4, 5, 6), (0, 1, 2)), owners),)
    note = next(n for n in s.spec.notes if n.startswith("re-plan's re-hosted experts run"))
    assert note == (
        "re-plan's re-hosted experts run (ep 4, whole experts): stage 0 (plan stage 0) EP group 4, 5, 6, 7 lost "
        "rank 7, its experts now on rank 4 (process 0) experts 6; rank 5 (process 1) experts 7 (busiest survivor 1.5x)"
    )
    assert "ep 4 kept" in next(n for n in s.spec.notes if n.startswith("experts 8 -> 8"))


def test_fewer_processes_keep_the_rehosted_group_whole_or_say_how_many_it_needs(replanned):
    plan, r = replanned
    s = shrink(plan, 6, r)  # the healthy unit (4 more processes) no longer fits
    assert s.replicas == (2, 3) and [p for p, _ in s.plan_ranks] == [4, 5, 6]
    assert s.spec.hosting == (StageExperts(((0, 1, 2),), ((0,), (0,), (1,), (1,), (2,), (2,), (0,), (1,))),)
    with pytest.raises(InputError, match=r"spans plan replicas 2, 3, which need cp\(1\) x \(2 \+ 1\) = 3 processes"):
        shrink(plan, 2, r)


def test_two_stages_each_host_their_own_groups_survivors():
    # tp2 pp2 dp2 ep4: GPU 3 fails, replica 1 runs at TP 1 on both stages (ranks 2 and 6);
    # stage 1's group (4, 5, 6, 7) is processes 3, 4, 5 of the run (stage-major numbering)
    plan = _plan(pp=2)
    r = Replanner(plan).replan(frozenset({3}), "ntp")
    s = shrink(plan, 6, r)
    assert [p for p, _ in s.plan_ranks] == [0, 1, 2, 4, 5, 6]
    assert [h.groups for h in s.spec.hosting] == [((0, 1, 2),), ((3, 4, 5),)]
    assert [h.owners for h in s.spec.hosting] == [
        ((0,), (0,), (1,), (1,), (2,), (2,), (0,), (1,)),
        ((3,), (3,), (4,), (4,), (5,), (5,), (3,), (4,)),
    ]


def test_run_experts_stand_for_every_fourth_plan_expert_where_the_replan_put_it():
    # DeepSeek-MoE (64 experts) at tp 2, dp 8, ep 8, etp 1 on 16 GPUs: GPU 3 fails, replica 7
    # drops (TP 1 does not fit), and group (8..15) re-hosts ranks 14, 15's experts 48-63 on 8-13
    plan = _plan(model=MODELS["deepseek-moe-16b"], gpus=16, ep=8, micro_batch=1, global_batch=64)
    r = Replanner(plan).replan(frozenset({3}), "ntp")
    s = shrink(plan, 16, r)
    assert s.replicas == (4, 5, 6, 0, 1, 2, 3) and s.spec.cfg.experts == 16
    assert [plan_expert(k, 64, 16) for k in (11, 12, 13, 14, 15)] == [44, 48, 52, 56, 60]
    (host,) = s.spec.hosting
    assert host.groups == ((6, 7, 8, 9, 10, 11, 12, 13), (0, 1, 2, 3, 4, 5))
    # in group (8..13) = processes 0-5: run expert k < 12 stays with member k // 2; plan experts
    # 48, 52, 56, 60 moved to ranks 8, 12, 10, 8 (the survivor holding the fewest, lowest first)
    in_group = [next(p for p in host.owners[k] if p < 6) for k in range(16)]
    assert in_group == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 0, 4, 2, 0]
    assert s.spec.notes[-1] == "run expert k stands for plan expert k * 64 // 16 (``hosted.plan_expert``)"


def test_without_rehosted_groups_the_shrink_is_unchanged():
    plan = _plan()
    dropped = Replanner(plan).replan(frozenset({3}), "dp-drop")  # the group is dropped, not re-hosted
    assert [x.mode for x in dropped.experts] == ["dropped"] and hosted_units(plan, dropped) is None
    s = shrink(plan, 8, dropped)
    assert s.spec.hosting == () and s.replicas == (0, 1) and s.spec.ep == 2  # the old shrink: ep over 2 pipelines
    assert hosted_units(plan, None) is None and shrink(plan, 8).spec.hosting == ()


def _cp_run():
    """tp2 cp2 dp2 ep4 etp1: each replica's tp x cp = 4 ranks are one EP group. GPU 3 fails:
    replica 1 runs at TP 1 on ranks 4 (cp 0) and 6 (cp 1); ranks 5, 7 are lost."""
    plan = _plan(cp=2, dp=2)
    return shrink(plan, 6, Replanner(plan).replan(frozenset({3}), "ntp"))


def test_an_ep_group_across_cp_slices_is_hosted_on_both():
    s = _cp_run()
    # processes 0, 1: replica 1's cp slices (ranks 4, 6); 2-5: replica 0's ranks 0-3
    assert s.replicas == (1, 0) and [p for p, _ in s.plan_ranks] == [4, 6, 0, 1, 2, 3] and s.spec.cp == 2
    # rank 5's experts 2, 3 and rank 7's 6, 7 go in expert order to the survivor holding the
    # fewest (both hold 2: rank 4 first): 2 -> 4, 3 -> 6, 6 -> 4, 7 -> 6
    hosted = (0, 0, 0, 1, 1, 1, 0, 1)
    healthy = (2, 2, 3, 3, 4, 4, 5, 5)
    owners = tuple(tuple(sorted(pair)) for pair in zip(hosted, healthy, strict=True))
    assert s.spec.hosting == (StageExperts(((2, 3, 4, 5), (0, 1)), owners),)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_an_ep_group_across_cp_slices_runs_exactly():
    pytest.importorskip("torch", reason="torch is not installed")
    from dataclasses import replace

    from ntp_planner.executor.train.launch import launch

    result = launch(replace(_cp_run().spec, dtype="float64"), timeout_s=200)
    assert max(result.max_rel_error_loss, result.max_rel_error_grads, result.max_rel_error_params) <= 1e-9
    assert result.losses[-1] < result.losses[0]
