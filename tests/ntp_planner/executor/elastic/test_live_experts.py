"""Live recovery of an expert-parallel run whose experts all have a peer (two EP groups, edp 2):
a killed process's experts are re-hosted on the survivors of its EP group (``hosting.rehost``),
their rows and AdamW state rebuilt from the expert-data-parallel replica that holds the same
experts, and the run goes on from memory (no checkpoint), exact against one process fed the
samples the run committed; the repaired process takes its experts back from its peers. Beside
NTP (a degraded replica running fewer micro-batches) the EP groups split by micro-batches
(``hosting.lockstep``): the degraded replica holds every expert on its own ranks."""

from dataclasses import replace

import pytest

from cost_models.catalogue import MODELS
from cost_models.layout import ParallelLayout
from cost_models.training import TrainingSpec
from ntp_planner.executor.elastic import handover
from ntp_planner.executor.elastic.faults import Fault, Repair
from ntp_planner.executor.elastic.launch import launch_live
from ntp_planner.executor.elastic.relayout import RunReplanner
from ntp_planner.executor.shrink.run import shrink
from ntp_planner.executor.spec import StageExperts
from ntp_planner.solver.planner import plan_from_layout
from topologies.cluster import Cluster
from topologies.cluster_catalogue import CLUSTERS

TOLERANCE = 1e-9  # float64
EXPERT_MOVE = 1_572_912  # bytes: experts 4-7 of both MoE layers with their AdamW state


def planned():
    """Mixtral TP1 x DP8 at ep 2 on 8 H100s, shrunk for one failure to 4 pipelines of one process:
    EP groups (0, 1) and (2, 3), each expert on two processes (0 and 2, or 1 and 3)."""
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=8)
    lay = ParallelLayout(tp=1, dp=8, ep=2, global_batch=16)
    plan = plan_from_layout(MODELS["mixtral-8x7b"], TrainingSpec(seq_len=2048, global_batch=16), cluster, lay)
    s = shrink(plan, 4, steps=5, failures=1)
    return plan, replace(s, spec=replace(s.spec, dtype="float64"))


def test_the_layout_after_a_failure_rehosts_the_lost_experts_on_its_groups_survivor():
    plan, s = planned()
    assert (s.spec.ep, s.spec.data_replicas, s.spec.cfg.experts) == (2, 4, 8)
    rr = RunReplanner(plan, s)
    after = rr.relayout(tuple(range(4)), frozenset({0, 2, 3}), "ntp")
    # 3 pipelines left: ep 2 no longer fills whole groups; process 0 (rank 0) hosts experts 4-7
    # that process 1 held, beside processes 2 and 3 (ranks 1 and 2) as before
    owners = tuple((0, 1) if e < 4 else (0, 2) for e in range(8))
    assert after.procs == (0, 2, 3) and after.spec.ep == 2 and after.spec.etp == 1
    assert after.spec.hosting == (StageExperts(((0,), (1, 2)), owners),)
    moves = handover.plan(s.spec, tuple(range(4)), after.spec, after.procs)
    # what moves is experts 4-7 to rank 0, from process 3 (their other holder): 2 MoE layers x
    # 4 experts x 3 matrices of 16 x 128, float64, as the weight, AdamW's master and two moments,
    # and the step of each of the 6 expert tensors; nothing else changes hands
    assert not moves.missing and moves.bytes_moved == 2 * 4 * 3 * 16 * 128 * 8 * 4 + 6 * 8 == EXPERT_MOVE
    # at ZeRO-0 with a peer for every expert, nothing needs the checkpoint; under dp-drop too
    assert rr.relayout(tuple(range(4)), frozenset({0, 2, 3}), "dp-drop").spec.hosting == after.spec.hosting


@pytest.mark.slow  # in `make test-slow`; faster cases of the same path stay in `make test`
@pytest.mark.timeout(300)
def test_an_ep2_run_loses_a_process_rebuilds_its_experts_from_peers_and_recovers_exact(tmp_path):
    plan, s = planned()
    result, live = launch_live(plan, s, policy="ntp", faults=(Fault(1, 2),), repairs=(Repair(1, 4),),
                               checkpoint_every=1, checkpoint_dir=str(tmp_path), timeout_s=30)  # fmt: skip
    assert [r["step"] for r in live.steps] == list(range(5)) and not result.problems
    assert result.max_rel_error_params <= TOLERANCE, (result.max_rel_error_params, result.worst_param)
    assert result.max_rel_error_loss <= TOLERANCE and result.max_rel_error_grads <= TOLERANCE
    fail, fix = live.timeline
    assert (fail["event"], fail["procs"], fail["source"]) == ("failure", [1], "memory"), fail
    assert fail["bytes_moved"] == EXPERT_MOVE and (fix["event"], fix["source"]) == ("repair", "memory")
    assert live.layouts[1].startswith("TP1 + TP1 + TP1 (ntp, replica 1 dropped)")
    assert live.layouts[2].split(" (")[0] == live.layouts[0].split(" (")[0]  # back to the base layout


def ntp_planned():
    """DeepSeek-MoE-16B TP2 x DP4 at ep 2 on 8 B200s (it fits at TP1 there, so NTP degrades a
    replica rather than dropping it), shrunk for one failure to 4 TP2 pipelines on 8 processes."""
    cluster = Cluster(spec=CLUSTERS["dgx-b200"], num_gpus=8)
    lay = ParallelLayout(tp=2, dp=4, ep=2, global_batch=16)
    plan = plan_from_layout(MODELS["deepseek-moe-16b"], TrainingSpec(seq_len=2048, global_batch=16), cluster, lay)
    s = shrink(plan, 8, steps=5, failures=1)
    return plan, replace(s, spec=replace(s.spec, dtype="float64"))


def test_ntp_beside_ep_keeps_the_healthy_groups_and_runs_the_degraded_replica_on_its_own():
    plan, s = ntp_planned()
    after = RunReplanner(plan, s).relayout(tuple(range(8)), frozenset(range(8)) - {1}, "ntp")
    # replica 0 at TP1 on process 0 with one micro-batch fewer; its EP partner pipeline 1 runs
    # two, so the groups across the two split: process 0 holds every expert, process 2 (rank 1)
    # too (its partner left), process 3 (rank 2) took process 1's experts; pipelines 2 and 3
    # keep their EP groups (ranks 3, 5 and 4, 6)
    assert after.describe().startswith("TP1 + TP2 + TP2 + TP2 (ntp)") and after.spec.ep == 2
    assert after.spec.hosting[0].groups == ((0,), (1,), (2,), (3, 5), (4, 6))
    assert not handover.plan(s.spec, tuple(range(8)), after.spec, after.procs).missing


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_ntp_beside_ep_live_recovers_exact_with_experts_from_peers(tmp_path):
    plan, s = ntp_planned()
    result, live = launch_live(plan, s, policy="ntp", faults=(Fault(1, 2),), repairs=(Repair(1, 4),),
                               checkpoint_every=1, checkpoint_dir=str(tmp_path), timeout_s=60)  # fmt: skip
    assert [r["step"] for r in live.steps] == list(range(5)) and not result.problems
    assert result.max_rel_error_params <= TOLERANCE, (result.max_rel_error_params, result.worst_param)
    assert result.max_rel_error_loss <= TOLERANCE and result.max_rel_error_grads <= TOLERANCE
    fail, fix = live.timeline
    assert (fail["source"], fix["source"]) == ("memory", "memory") and fail["bytes_moved"] > 0
    assert live.layouts[1].startswith("TP1 + TP2 + TP2 + TP2 (ntp)")
