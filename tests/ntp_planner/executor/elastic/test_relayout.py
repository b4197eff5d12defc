"""The next layout of a running job after processes die or come back, pinned to hand-derived
ranks, widths, micro-batches and idle processes on real plans shrunk to a few processes."""

import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cost_models.catalogue import MODELS
from cost_models.layout import ParallelLayout
from cost_models.training import TrainingSpec
from ntp_planner.executor.elastic.relayout import POLICIES, RunReplanner
from ntp_planner.executor.shrink.run import scaled_micro_batches, shrink
from ntp_planner.plan import Plan
from ntp_planner.solver.planner import plan_from_layout
from topologies.cluster import Cluster
from topologies.cluster_catalogue import CLUSTERS

EIGHT = tuple(range(8))
PLANS = Path(__file__).parents[2] / "plans"


@cache
def tp4_dp2(system: str = "dgx-h100"):
    """llama3-8b at TP4 x DP2 on 8 H100s: micro-batch 1, 8 micro-batches per replica; shrunk to 8
    processes: replica 0 on base ranks 0-3, replica 1 on 4-7, 2 micro-batches each
    (min(8, max(2 * pp, 2)) = 2)."""
    cluster = Cluster(spec=CLUSTERS[system], num_gpus=8)
    lay = ParallelLayout(tp=4, dp=2, global_batch=16)
    plan = plan_from_layout(MODELS["llama3-8b"], TrainingSpec(seq_len=2048, global_batch=16), cluster, lay)
    return plan, shrink(plan, 8)


@cache
def tp4_pp2_dp2():
    """TP4 x PP2 x DP2 on 16 H100s, shrunk to 16 processes (both stages and replicas kept).
    Base ranks stage-major: stage 0 of replica 0 = 0-3, of replica 1 = 4-7; stage 1 of replica 0
    = 8-11, of replica 1 = 12-15. 4 micro-batches per replica (min(8, max(2 * 2, 2)))."""
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=16)
    lay = ParallelLayout(tp=4, pp=2, dp=2, global_batch=16)
    plan = plan_from_layout(MODELS["llama3-8b"], TrainingSpec(seq_len=2048, global_batch=16), cluster, lay)
    return plan, shrink(plan, 16)


def ranks(spec):
    return [[s.ranks for s in rep.stages] for rep in spec.replicas]


def degrees(spec, replica, stage=0):
    return [b.degree for b in spec.replicas[replica].stages[stage].blocks]


def without(*dead, n=8, spares=0):
    return frozenset(range(n + spares)) - set(dead)


def test_the_base_shrink_is_what_these_tests_assume():
    _, s = tp4_dp2()
    assert s.spec.world_size == 8 and s.replicas == (0, 1) and s.stage_groups == ((0,),)
    assert [r.micro_batches for r in s.spec.replicas] == [2, 2] and s.spec.micro_batch == 1
    assert ranks(s.spec) == [[(0, 1, 2, 3)], [(4, 5, 6, 7)]]
    _, s = tp4_pp2_dp2()
    assert ranks(s.spec) == [[(0, 1, 2, 3), (8, 9, 10, 11)], [(4, 5, 6, 7), (12, 13, 14, 15)]]
    assert [r.micro_batches for r in s.spec.replicas] == [4, 4]


def test_base_is_the_shrunk_run_with_spares_idle():
    plan, s = tp4_dp2()
    base = RunReplanner(plan, s, spares=2).base()
    assert base.spec == s.spec and base.procs == EIGHT and base.idle == (8, 9) and base.slots == EIGHT
    assert [x.status for x in base.replicas] == ["healthy", "healthy"] and base.batch == 4
    assert base.describe() == "TP4 + TP4 (none), PP1, 2+2 micro-batches of 1"


def test_ntp_gives_the_replica_that_lost_a_process_a_tp3_stage_and_fewer_micro_batches():
    plan, s = tp4_dp2()
    lay = RunReplanner(plan, s).relayout(EIGHT, without(1), "ntp")
    # processes 0, 2, 3 become ranks 0-2 of replica 0; replica 1's processes 4-7 become ranks 3-6
    assert lay.procs == (0, 2, 3, 4, 5, 6, 7) and lay.idle == () and lay.slots == (0, None, 2, 3, 4, 5, 6, 7)
    assert ranks(lay.spec) == [[(0, 1, 2)], [(3, 4, 5, 6)]]
    assert degrees(lay.spec, 0) == [3, 3, 3, 3]  # embedding, 2 layers, head: every block at the width
    assert lay.spec.replicas[1].stages[0].blocks == s.spec.replicas[1].stages[0].blocks
    # fewer than 8 of 8 plan micro-batches fit at TP3; any ratio < 1 of the base's 2 is 1
    assert [r.micro_batches for r in lay.spec.replicas] == [1, 2] and lay.batch == 3
    assert [x.status for x in lay.replicas] == ["degraded", "healthy"] and lay.replicas[0].widths == (3,)
    assert lay.replicas[0].reason.startswith("runs at TP 3") and lay.replicas[1].reason is None
    assert lay.describe() == "TP3 + TP4 (ntp), PP1, 1+2 micro-batches of 1"


def test_ntp_pw_keeps_the_micro_batches_when_power_keeps_pace():
    # nemotron4-15b at TP7 of 8: 1.15x the work on the fullest rank, within the speed 1.3x power gives
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=16)
    lay = ParallelLayout(tp=8, dp=2, global_batch=16)
    plan = plan_from_layout(MODELS["nemotron4-15b"], TrainingSpec(seq_len=2048, global_batch=16), cluster, lay)
    s = shrink(plan, 16)
    rr = RunReplanner(plan, s)
    boosted = rr.relayout(tuple(range(16)), without(1, n=16), "ntp-pw")
    assert [r.micro_batches for r in boosted.spec.replicas] == [2, 2] and boosted.batch == 4
    assert boosted.replicas[0].status == "degraded" and "power" in boosted.replicas[0].reason
    assert [st.width for r in boosted.spec.replicas for st in r.stages] == [7, 8]
    assert [r.micro_batches for r in rr.relayout(tuple(range(16)), without(1, n=16), "ntp").spec.replicas] == [1, 2]
    # llama3-8b at TP3 of 4 needs 1.34x the speed, more than any power gives: fewer micro-batches
    plan, s = tp4_dp2()
    capped = RunReplanner(plan, s, max_power=1.4).relayout(EIGHT, without(1), "ntp-pw")
    assert [r.micro_batches for r in capped.spec.replicas] == [1, 2]


def test_dp_drop_and_restart_drop_the_replica_and_idle_its_survivors():
    plan, s = tp4_dp2()
    for policy in ("dp-drop", "restart"):
        lay = RunReplanner(plan, s).relayout(EIGHT, without(1), policy)
        assert lay.procs == (4, 5, 6, 7) and lay.idle == (0, 2, 3) and ranks(lay.spec) == [[(0, 1, 2, 3)]]
        assert lay.batch == 2 and lay.replicas[0].status == "dropped" and lay.replicas[0].widths == (0,)
        assert lay.spec.replicas[0].stages[0].blocks == s.spec.replicas[1].stages[0].blocks
        assert lay.describe() == f"TP4 ({policy}, replica 0 dropped), PP1, 2 micro-batches of 1"


def test_a_spare_process_stands_in_at_full_width():
    plan, s = tp4_dp2()
    rr = RunReplanner(plan, s, spares=1)
    lay = rr.relayout(EIGHT, without(1, spares=1), "spares")
    assert lay.slots == (0, 8, 2, 3, 4, 5, 6, 7) and lay.procs == (0, 8, 2, 3, 4, 5, 6, 7) and lay.idle == ()
    assert lay.spec == s.spec  # the same run, process 8 at rank 1
    assert [x.status for x in lay.replicas] == ["replaced", "healthy"] and lay.batch == 4
    assert lay.replicas[0].reason == "spare processes stand in at full width: 8 at base rank 1"
    # two failures, one spare: the first empty slot (base rank 1) gets it, replica 1 falls back to dp-drop
    two = rr.relayout(EIGHT, without(1, 6, spares=1), "spares")
    assert [x.status for x in two.replicas] == ["replaced", "dropped"] and two.procs == (0, 8, 2, 3)
    assert two.idle == (4, 5, 7) and two.batch == 2
    # the spare is a process like the others: if it dies too, its slot is empty again
    again = rr.relayout(lay.slots, without(1, 8, spares=1), "ntp")
    assert again.slots == (0, None, 2, 3, 4, 5, 6, 7) and again.procs == (0, 2, 3, 4, 5, 6, 7)


def test_two_failures_in_different_replicas_narrow_both():
    plan, s = tp4_dp2()
    rr = RunReplanner(plan, s)
    lay = rr.relayout(EIGHT, without(1, 6), "ntp")
    assert lay.procs == (0, 2, 3, 4, 5, 7) and ranks(lay.spec) == [[(0, 1, 2)], [(3, 4, 5)]]
    assert [x.widths for x in lay.replicas] == [(3,), (3,)] and lay.batch == 2
    assert degrees(lay.spec, 0) == degrees(lay.spec, 1) == [3, 3, 3, 3]
    # two in one replica: TP2 does not fit llama3-8b's memory, the Replanner drops it and says why
    two_in_one = rr.relayout(EIGHT, without(1, 2), "ntp")
    assert two_in_one.procs == (4, 5, 6, 7) and two_in_one.idle == (0, 3)
    assert two_in_one.replicas[0].reason.startswith("memory: at TP 2")


def test_a_pipeline_plan_narrows_only_the_stage_that_lost_a_process_under_ntp_pw():
    plan, s = tp4_pp2_dp2()
    rr = RunReplanner(plan, s, max_power=1.5)
    lay = rr.relayout(tuple(range(16)), without(9, n=16), "ntp-pw")
    # stage 1 of replica 0 keeps processes 8, 10, 11; ranks renumber in base order: 0-7 unchanged,
    # 8, 10, 11 -> 8-10, 12-15 -> 11-14
    assert lay.procs == (0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12, 13, 14, 15) and lay.idle == ()
    assert ranks(lay.spec) == [[(0, 1, 2, 3), (8, 9, 10)], [(4, 5, 6, 7), (11, 12, 13, 14)]]
    assert lay.replicas[0].widths == (4, 3) and lay.spec.replicas[0].stages[0] == s.spec.replicas[0].stages[0]
    # the Replanner keeps 6 of the plan's 8 micro-batches at up to 1.5x power: 4 * 6 / 8 = 3 of the run's 4
    assert "6 of 8 micro-batches" in lay.replicas[0].reason
    assert set(degrees(lay.spec, 0, 1)) == {3} and lay.replicas[0].micro_batches == 3
    assert lay.describe() == "TP4/3 + TP4 (ntp-pw), PP2, 3+4 micro-batches of 1"
    # ntp runs every stage of the replica at its worst width: process 3 idles
    ntp = RunReplanner(plan, s).relayout(tuple(range(16)), without(9, n=16), "ntp")
    assert ntp.replicas[0].widths == (3, 3) and ntp.idle == (3,)
    assert ranks(ntp.spec) == [[(0, 1, 2), (7, 8, 9)], [(3, 4, 5, 6), (10, 11, 12, 13)]]
    # micro-batch 1: the sequences the Replanner keeps are its micro-batches
    plan_micro = RunReplanner(plan, s).replanner.decide("ntp", [4, 3]).sequences
    assert ntp.replicas[0].micro_batches == scaled_micro_batches(plan_micro / 8, 4, 1) < 4


def test_scaled_micro_batches_rounds_to_whole_units_below_a_healthy_replica():
    assert [scaled_micro_batches(r / 8, 4, 1) for r in range(1, 9)] == [1, 1, 2, 2, 2, 3, 3, 4]
    assert scaled_micro_batches(5 / 8, 4, 2) == 2 and scaled_micro_batches(1 / 8, 4, 2) == 2
    assert scaled_micro_batches(1 / 2, 1, 1) == 1  # a one-micro-batch run cannot go lower


def test_repair_returns_the_replica_to_its_base_layout():
    plan, s = tp4_dp2()
    rr = RunReplanner(plan, s, spares=1)
    hurt = rr.relayout(EIGHT, without(1, spares=1), "ntp")
    assert hurt.spec != s.spec
    healed = rr.relayout(hurt.slots[:1] + (1,) + hurt.slots[2:], without(spares=1), "ntp")
    assert healed.spec == s.spec and healed.procs == EIGHT and healed.idle == (8,)
    assert [x.status for x in healed.replicas] == ["healthy", "healthy"]
    # a spare stood in, then the repaired process takes its slot back: the spare idles again
    spared = rr.relayout(EIGHT, without(1, spares=1), "spares")
    assert rr.relayout(spared.slots, without(spares=1), "spares").idle == (1,)  # repaired, not yet back
    back = rr.relayout(EIGHT, without(spares=1), "spares")
    assert back.spec == s.spec and back.procs == EIGHT and back.idle == (8,)
    pp_plan, pp_s = tp4_pp2_dp2()
    pp = RunReplanner(pp_plan, pp_s)
    assert pp.relayout(tuple(range(16)), without(n=16), "ntp").spec == pp_s.spec


def test_nothing_runs_when_every_replica_is_lost():
    plan, s = tp4_dp2()
    rr = RunReplanner(plan, s, spares=1)
    dead = rr.relayout(EIGHT, frozenset({8}), "ntp")
    assert dead.spec is None and dead.procs == () and dead.idle == (8,) and dead.batch == 0
    assert dead.describe() == "nothing runs (ntp): every replica dropped"
    dropped = rr.relayout(EIGHT, without(1, 6, spares=1), "dp-drop")
    assert dropped.spec is None and dropped.idle == (0, 2, 3, 4, 5, 7, 8)


def test_a_gpu_the_plan_covers_in_its_domain_needs_a_spare_process_or_narrows_at_the_full_batch():
    plan, s = tp4_dp2("gb200-nvl72")  # 8 GPUs of a 72-GPU domain: 64 idle ones, the plan stays healthy
    assert plan.cluster.build().spec.domain_size == 72
    lay = RunReplanner(plan, s).relayout(EIGHT, without(1), "ntp")
    assert lay.replicas[0].status == "degraded" and lay.replicas[0].widths == (3,)
    assert [r.micro_batches for r in lay.spec.replicas] == [2, 2] and "no spare process" in lay.replicas[0].reason
    spared = RunReplanner(plan, s, spares=1).relayout(EIGHT, without(1, spares=1), "ntp")
    assert spared.replicas[0].status == "replaced" and spared.slots[1] == 8 and spared.spec == s.spec


def test_bad_input_says_what_was_expected():
    plan, s = tp4_dp2()
    rr = RunReplanner(plan, s)
    with pytest.raises(ValueError, match="unknown policy"):
        rr.relayout(EIGHT, without(), "pray")
    with pytest.raises(ValueError, match="8 base ranks"):
        rr.relayout(EIGHT[:7], without(), "ntp")
    with pytest.raises(ValueError, match="distinct process id"):
        rr.relayout((0, 0, 2, 3, 4, 5, 6, 7), without(), "ntp")


def test_zero3_and_expert_parallelism_give_way_only_beside_a_narrower_replica():
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=8)
    lay = ParallelLayout(tp=4, dp=2, global_batch=16, zero=3, reshard_after_forward=False)
    plan = plan_from_layout(MODELS["llama3-8b"], TrainingSpec(seq_len=2048, global_batch=16), cluster, lay)
    s = shrink(plan, 8)
    rr = RunReplanner(plan, s)
    assert (s.spec.zero, s.spec.reshard_after_forward) == (3, False)
    ntp = rr.relayout(EIGHT, without(1), "ntp").spec  # ZeRO-3 gathers cannot pair TP3 with TP4
    assert (ntp.zero, ntp.reshard_after_forward) == (2, True)
    drop = rr.relayout(EIGHT, without(1), "dp-drop").spec  # one replica left: still alike
    assert (drop.zero, drop.reshard_after_forward) == (3, False)
    assert rr.relayout(EIGHT, without(), "ntp").spec == s.spec
    # the MoE plan (ep 8) shrunk to 16 processes runs 4 replicas at ep 4: 3 left hold ep 1, 2 hold ep 2
    moe = Plan.load(PLANS / "moe.json")
    s = shrink(moe, 16)
    rr = RunReplanner(moe, s)
    assert s.spec.ep == 4 and s.spec.data_replicas == 4
    assert rr.relayout(tuple(range(16)), without(1, n=16), "dp-drop").spec.ep == 1
    assert rr.relayout(tuple(range(16)), without(1, 3, n=16), "dp-drop").spec.ep == 2
    assert rr.relayout(tuple(range(16)), without(1, n=16), "ntp").spec.ep == 1  # widths differ


@cache
def saved(name: str, nproc: int):
    plan = Plan.load(PLANS / f"{name}.json")
    return plan, shrink(plan, nproc)


@settings(max_examples=80, deadline=None)
@given(
    which=st.sampled_from(["tp4_dp2", "tp4_pp2_dp2", "moe", "dense_pp_interleaved"]),
    dead=st.sets(st.integers(0, 17)),
    policy=st.sampled_from(POLICIES),
    spares=st.integers(0, 2),
)
def test_every_live_process_runs_or_idles_exactly_once(which, dead, policy, spares):
    plans = {"tp4_dp2": tp4_dp2, "tp4_pp2_dp2": tp4_pp2_dp2}
    plan, s = plans[which]() if which in plans else saved(which, 16 if which == "moe" else 8)
    n = s.spec.world_size
    alive = frozenset(range(n + spares)) - dead
    lay = RunReplanner(plan, s, spares).relayout(tuple(range(n)), alive, policy)
    assert sorted(lay.procs + lay.idle) == sorted(alive) and len(set(lay.procs)) == len(lay.procs)
    assert set(lay.procs) <= {p for p in lay.slots if p is not None}
    if lay.spec is None:
        assert lay.procs == () and all(x.status == "dropped" for x in lay.replicas)
    else:  # RunSpec checks itself on construction
        assert lay.spec.world_size == len(lay.procs)
        running = [x for x in lay.replicas if x.status != "dropped"]
        assert [x.micro_batches for x in running] == [r.micro_batches for r in lay.spec.replicas]
    if not dead & set(range(n)):
        assert lay.spec == s.spec and lay.procs == tuple(range(n))


def test_relayout_imports_no_torch():
    code = "import sys, ntp_planner.executor.elastic.relayout; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
