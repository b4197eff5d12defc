"""A re-plan of a per-layer cp2 plan, shrunk and run: the NTP sync runs and is exact; the shrink
says what it cut and warns when a re-plan's run holds no degraded replica."""

import dataclasses

import pytest

from cost_models.catalogue import MODELS
from cost_models.layout import ParallelLayout
from cost_models.training import TrainingSpec
from ntp_planner.executor.groups import dp_groups
from ntp_planner.executor.shrink.notes import no_degraded_warning
from ntp_planner.executor.shrink.run import shrink
from ntp_planner.failures.replan import Replanner
from ntp_planner.solver.planner import plan_from_layout
from topologies.cluster import Cluster
from topologies.cluster_catalogue import CLUSTERS

HALF = MODELS["llama3-8b"].model_copy(update={"name": "llama3-8b-16", "num_layers": 16})
THREE_IN_DOMAIN_0 = frozenset({1, 3, 5})  # one GPU of three of the four TP2 groups of GPUs 0-7


def per_layer_cp_plan():
    """tp2 pp2 dp2 cp2 on 16 GPUs: embedding and layers 8-15 at degree 2, layers 0-7 at degree 1."""
    layer_tp = (2,) + (1,) * 8 + (2,) * 8 + (2,)
    lay = ParallelLayout(tp=2, pp=2, dp=2, cp=2, global_batch=16, layer_tp=layer_tp, sequence_parallel=True)
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=16)
    return plan_from_layout(HALF, TrainingSpec(seq_len=4096, global_batch=16), cluster, lay)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_degraded_per_layer_cp_replica_runs_the_ntp_sync_exactly():
    pytest.importorskip("torch", reason="torch is not installed")
    from ntp_planner.executor.train.launch import launch

    plan = per_layer_cp_plan()
    replan = Replanner(plan).replan(THREE_IN_DOMAIN_0, "ntp")
    shrunk = shrink(plan, 6, replan)
    spec = dataclasses.replace(shrunk.spec, dtype="float64")
    assert shrunk.replicas == (0, 1) and spec.cp == 2 and spec.world_size == 6
    assert no_degraded_warning(replan, list(shrunk.replicas), 6) is None
    # replica 0 keeps its per-layer degrees (2, 1, 2 | head 2) in a stage of 2; the degraded replica
    # runs every block at its width 1 in both cp slices
    degrees = [[b.degree for b in rep.stages[0].blocks] for rep in spec.replicas]
    assert degrees == [[2, 1, 2, 2], [2, 1, 2, 2], [1, 1, 1, 1], [1, 1, 1, 1]]
    # the embedding syncs between degrees 2 and 1: the NTP exchange, one group per rank of the narrower
    assert dp_groups(spec, 0, 0) == ((0, 2, 4, 5),)
    result = launch(spec, timeout_s=150)
    assert result.max_rel_error_loss <= 1e-10
    assert result.max_rel_error_grads <= 1e-10
    assert result.max_rel_error_params <= 1e-10


def test_no_degraded_replica_in_the_run_is_said_with_its_cause():
    plan = per_layer_cp_plan()
    replanner = Replanner(plan)
    dropped = replanner.replan(frozenset({1}), "dp-drop")
    warning = no_degraded_warning(dropped, list(shrink(plan, 16, dropped).replicas), 16)
    assert warning.startswith("the re-plan degrades no replica: the one replica that lost GPUs is dropped (replica 1:")
    assert "policy dp-drop" in warning and warning.endswith("checks no NTP sync")
    none = replanner.replan(frozenset(), "ntp")
    warning = no_degraded_warning(none, list(shrink(plan, 16, none).replicas), 16)
    assert warning == (
        "the re-plan degrades no replica: it has no failed GPU, so the run is the healthy plan's and checks no NTP sync"
    )
    # two processes hold one replica (TP2, cp folded): the healthy one
    ntp = replanner.replan(THREE_IN_DOMAIN_0, "ntp")
    small = shrink(plan, 2, ntp)
    assert small.replicas == (0,)
    warning = no_degraded_warning(ntp, [0], 2)
    assert warning.startswith("the shrink to 2 processes kept only healthy replicas (0), none of the re-plan's 1")
    assert any(n.startswith("re-plan replicas not run") for n in small.spec.notes)
    # every group loses a GPU: both replicas degrade alike, so no two widths meet
    alike = replanner.replan(frozenset(range(0, 16, 2)), "ntp")
    assert [x.status for x in alike.replicas] == ["degraded", "degraded"]
    warning = no_degraded_warning(alike, list(shrink(plan, 16, alike).replicas), 16)
    assert warning.startswith("every replica the run holds has stage widths [1, 1]")


def test_a_stage_cut_to_six_runs_says_which_and_why():
    """One stage of 8 GPUs whose layers form 7 runs of equal degree: 4, 2, 4, 2, 8, 4, 1."""
    layer_tp = (8,) + (4,) * 10 + (2,) * 10 + (4,) * 10 + (2,) * 10 + (8,) * 10 + (4,) * 10 + (1,) * 20 + (8,)
    lay = ParallelLayout(tp=8, dp=1, global_batch=64, micro_batch=8, layer_tp=layer_tp)
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=8)
    plan = plan_from_layout(MODELS["llama3-70b"], TrainingSpec(seq_len=2048, global_batch=64), cluster, lay)
    s = shrink(plan, 8)
    assert [b.degree for b in s.spec.replicas[0].stages[0].blocks] == [8, 4, 2, 4, 2, 8, 4, 8]
    (note,) = [n for n in s.spec.notes if "runs of equal TP degree," in n]
    assert note == (
        "stage 0 (plan stage 0): kept 6 of 7 runs of equal TP degree, 4,2,4,2,8,4, cutting 1 (one layer per run "
        "would make a longer, slower run; degree 1 no longer runs on this stage)"
    )
