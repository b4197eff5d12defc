"""Live recovery for real (gloo, spawned processes, faults injected by SIGKILL, an exception in a
collective or a hang): the run re-plans, carries its state and keeps training, and its final
parameters, loss curve and last synced gradients equal one process fed the samples it committed.
Every case checks that the committed steps are 0..steps-1 in order (no update lost or applied
twice) and that the timeline has an event per failure or repair with every part of its
recovery time."""

from functools import cache

import pytest

from cost_models.catalogue import MODELS
from cost_models.layout import ParallelLayout
from cost_models.training import TrainingSpec
from ntp_planner.executor.elastic.faults import Fault, RecoveryFailure, Repair
from ntp_planner.executor.elastic.launch import launch_live
from ntp_planner.executor.elastic.timeline import PARTS, recovery_costs
from ntp_planner.executor.shrink.run import shrink
from ntp_planner.solver.planner import plan_from_layout
from tests.support.mutations import plant
from topologies.cluster import Cluster
from topologies.cluster_catalogue import CLUSTERS

TOLERANCE = 1e-9  # float64: a clean run errs near 1e-15


@cache
def planned(tp: int, dp: int, pp: int = 1, steps: int = 6, model: str = "llama3-8b", failures: int = 0):
    """``model`` on 8 H100s at TP x PP (and the DP that fills them), shrunk to ``dp`` replicas: tp * pp
    * dp processes, in float64, keeping the cuts of the widths ``failures`` lost processes lead to."""
    from dataclasses import replace

    n = tp * pp * dp
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=8)
    lay = ParallelLayout(tp=tp, pp=pp, dp=8 // (tp * pp), global_batch=16)
    plan = plan_from_layout(MODELS[model], TrainingSpec(seq_len=2048, global_batch=16), cluster, lay)
    s = shrink(plan, n, steps=steps, failures=failures)
    return plan, replace(s, spec=replace(s.spec, dtype="float64"))


def run(tp, dp, pp=1, steps=6, **kw):
    # a small model at TP2 so that a replica losing a GPU still fits at TP1 (llama3-8b does not)
    failures = len(kw.get("faults", ()))
    plan, s = planned(tp, dp, pp, steps, "llama3-8b" if tp > 2 else "megatron-1.7b", failures)
    return launch_live(plan, s, timeout_s=kw.pop("timeout_s", 30.0), **kw)


def assert_exact_and_accounted(result, live, steps: int, events: int) -> None:
    """Final state equal to the reference, every step committed once in order, each event timed."""
    assert [r["step"] for r in live.steps] == list(range(steps))
    assert result.max_rel_error_params <= TOLERANCE, (result.max_rel_error_params, result.worst_param)
    assert result.max_rel_error_loss <= TOLERANCE and result.max_rel_error_grads <= TOLERANCE
    assert len(live.timeline) == events
    for e in live.timeline:
        assert all(e[p] >= 0 for p in PARTS) and e["total_s"] == pytest.approx(sum(e[p] for p in PARTS))


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("policy", ["ntp", "ntp-pw", "dp-drop"])
def test_tp4_dp2_loses_a_rank_mid_run_and_keeps_training(policy):
    result, live = run(4, 2, policy=policy, faults=(Fault(1, 2),))
    assert_exact_and_accounted(result, live, 6, 1)
    (e,) = live.timeline
    assert e["event"] == "failure" and e["procs"] == [1] and e["step"] == 2
    assert e["source"] == "memory" and not live.lost
    before, after = live.steps[1]["batch"], live.steps[2]["batch"]
    if policy == "dp-drop":  # replica 0 gone: half the batch, nothing moves
        assert (before, after) == (4, 2) and e["bytes_moved"] == 0 and e["layout"].startswith("TP4 (dp-drop")
    else:  # replica 0 runs TP3 on processes 0, 2, 3, which fetched the rows they now own
        assert e["bytes_moved"] > 0 and e["layout"].startswith("TP3 + TP4")
        assert (before, after) == (4, 3)  # TP3 needs 1.34x the speed: even ntp-pw cannot keep 2 micro-batches
    # the samples the reference was fed: the stream continues where the committed steps left it
    assert [r["consumed"] for r in live.steps[:4]] == [0, 4, 8, 8 + after]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_kill_during_the_gradient_sync_redoes_the_step_once():
    result, live = run(2, 2, steps=4, policy="ntp", faults=(Fault(3, 1, "sync"),))
    assert_exact_and_accounted(result, live, 4, 1)
    assert live.timeline[0]["step"] == 1 and live.timeline[0]["source"] == "memory"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_pipeline_stage_loses_a_rank():
    result, live = run(2, 2, pp=2, steps=4, policy="ntp", faults=(Fault(5, 1),))
    assert_exact_and_accounted(result, live, 4, 1)
    assert "TP1" in live.timeline[0]["layout"] or "TP2/1" in live.timeline[0]["layout"]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_failures_in_different_replicas():
    result, live = run(4, 2, steps=6, policy="ntp", faults=(Fault(1, 1), Fault(6, 3)))
    assert_exact_and_accounted(result, live, 6, 2)
    assert [e["procs"] for e in live.timeline] == [[1], [6]]
    assert live.timeline[1]["layout"].startswith("TP3 + TP3")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_repair_restores_the_full_degree():
    result, live = run(4, 2, steps=6, policy="ntp", faults=(Fault(2, 1),), repairs=(Repair(2, 3),))
    assert_exact_and_accounted(result, live, 6, 2)
    fail, fix = live.timeline
    assert fix["event"] == "repair" and fix["procs"] == [2] and fix["redo_s"] == 0.0
    assert fix["layout"].startswith("TP4 + TP4") and fix["batch"] == 4 and fix["bytes_moved"] > 0
    assert live.steps[-1]["batch"] == 4


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_no_live_copy_falls_back_to_the_checkpoint(tmp_path):
    # TP rank 1 of both replicas dies in the same step: the rows it held exist nowhere else
    result, live = run(
        4, 2, steps=6, policy="ntp", faults=(Fault(1, 3), Fault(5, 3)), checkpoint_every=2, checkpoint_dir=str(tmp_path)
    )
    assert_exact_and_accounted(result, live, 6, 1)
    (e,) = live.timeline
    assert e["source"] == "checkpoint" and "checkpoint of step 1" in e["note"] and e["redo_from"] == 2
    assert [r["step"] for r in live.lost] == [2]  # committed, then rolled back with the checkpoint


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_restart_reloads_the_checkpoint_on_the_new_layout(tmp_path):
    result, live = run(2, 2, steps=6, policy="restart", faults=(Fault(1, 4),), checkpoint_every=3,
                       checkpoint_dir=str(tmp_path))  # fmt: skip
    assert_exact_and_accounted(result, live, 6, 1)
    (e,) = live.timeline
    assert e["event"] == "restart" and e["source"] == "checkpoint" and e["redo_from"] == 3
    assert [r["step"] for r in live.lost] == [3]
    assert set(recovery_costs(live.timeline)) == {"detection_s", "restart_s"}


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_an_exception_inside_a_collective_and_a_hang_are_failures_too():
    result, live = run(2, 2, steps=4, policy="ntp", faults=(Fault(0, 1, "raise"), Fault(3, 2, "hang")), timeout_s=5)
    assert_exact_and_accounted(result, live, 4, 2)
    assert live.timeline[1]["detect_s"] >= 5  # a hang is noticed after the timeout without progress


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_spare_process_stands_in_and_pulls_every_row_from_its_peers():
    result, live = run(2, 2, steps=4, policy="spares", spares=1, faults=(Fault(1, 1),))
    assert_exact_and_accounted(result, live, 4, 1)
    (e,) = live.timeline
    # process 4 (the spare) takes base rank 1: the same layout, the full batch, its rows moved to it
    assert e["layout"].startswith("TP2 + TP2") and e["batch"] == live.steps[0]["batch"] and e["bytes_moved"] > 0


@pytest.mark.slow
def test_a_kill_in_the_final_gather_regathers_the_committed_state():
    # every step is committed when process 3 dies in the gather of the holdings (a fault at step
    # ``steps``): the next generation runs no step, its ranks carry the state and gather again
    result, live = run(2, 2, steps=3, policy="ntp", faults=(Fault(3, 3),))
    assert_exact_and_accounted(result, live, 3, 1)
    (e,) = live.timeline
    assert e["procs"] == [3] and e["step"] == 3 and e["redo_s"] == 0.0 and e["source"] == "memory"
    assert live.grad_step is None and result.worst_grad_holder == "no holding carries a gradient"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_process_dying_while_the_state_moves_after_another_failure():
    # process 1 dies in step 1; as replica 0 (process 0 alone, at TP1) fetches its rows, process 0
    # dies too: replica 1's ranks may have their state in place already, but the coordinator
    # carries from the layout before (the last with every rank in place), which they must keep
    result, live = run(2, 2, steps=4, policy="ntp", faults=(Fault(1, 1), Fault(0, 1, "carry")))
    assert_exact_and_accounted(result, live, 4, 2)
    assert [e["procs"] for e in live.timeline] == [[1], [0]] and live.timeline[1]["source"] == "memory"
    assert live.steps[-1]["batch"] == 2 and not live.lost


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_repaired_process_failing_in_its_first_step_back():
    # the newcomer waits idle for step 3; its fault in step 3 fires in that step once it is back
    # (it was killed as an idle process before it rejoined: the repair then failed the run)
    result, live = run(2, 2, steps=5, policy="ntp", faults=(Fault(1, 1), Fault(1, 3)), repairs=(Repair(1, 3),))
    assert_exact_and_accounted(result, live, 5, 3)
    assert [(e["event"], e["step"], e["procs"]) for e in live.timeline] == [
        ("failure", 1, [1]),
        ("repair", 3, [1]),
        ("failure", 3, [1]),
    ]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_an_idle_spare_dying_is_on_the_timeline_and_changes_nothing():
    result, live = run(2, 2, steps=3, policy="spares", spares=1, faults=(Fault(4, 1),))
    assert_exact_and_accounted(result, live, 3, 1)
    (e,) = live.timeline
    assert (e["event"], e["procs"], e["total_s"]) == ("idle failure", [4], 0.0)
    assert recovery_costs(live.timeline) == {}  # it costs the run nothing


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_hang_and_a_kill_in_one_step_fail_only_those_two():
    # process 0 waits on hung process 1 in their TP group: the group's collective timeout (5 s)
    # frees it; with the 30-minute default of a new group it stayed blocked, was killed at the
    # agreement's deadline as if it had failed, and replica 0's rows were lost with it
    result, live = run(2, 2, steps=4, policy="ntp", faults=(Fault(1, 1, "hang"), Fault(2, 1)), timeout_s=5)
    failed = sorted(p for e in live.timeline for p in e["procs"])
    assert failed == [1, 2] and all(e["source"] == "memory" for e in live.timeline) and not live.lost
    assert_exact_and_accounted(result, live, 4, len(live.timeline))


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_every_process_crashing_on_the_same_error_ends_in_a_sentence_with_that_error(tmp_path):
    # the checkpoint folder is a file: every rank fails to save after step 0, and all die
    (tmp_path / "ck").write_text("x")
    # the first to die did of its own error, not of a --fail: the run fails there, naming it
    with pytest.raises(RecoveryFailure, match=r"process \d died of its own error, not of an injected --fail "
                       r"\(ValueError: cannot write checkpoint file"):  # fmt: skip
        run(2, 2, steps=2, policy="ntp", checkpoint_every=1, checkpoint_dir=str(tmp_path / "ck"))


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_collective_timeout_too_short_ends_in_a_sentence_not_a_loop():
    # every generation times out as it forms, nobody dies: the state was never in place (the
    # next layout carried from nowhere: KeyError), and re-planning the same layout went on forever
    with pytest.raises(RecoveryFailure, match=r"none failed and no step committed .*--timeout of 0.001 s may be too"):
        run(2, 2, steps=2, policy="ntp", timeout_s=0.001)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_lone_process_that_hangs_ends_the_run():
    # after three failures process 3 runs alone (TP1, no collective), then hangs: nobody waits
    # on it inside a collective, so only the lack of progress tells, and the run must end
    faults = (Fault(0, 1), Fault(1, 1), Fault(2, 2), Fault(3, 3, "hang"))
    with pytest.raises(RecoveryFailure, match="a process hung: no replica can run any more"):
        run(2, 2, steps=5, policy="ntp", faults=faults, timeout_s=5)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_repaired_spare_comes_back_idle():
    # spare process 4 has no base slot: the repair crashed the launcher with an IndexError
    result, live = run(2, 2, steps=4, policy="ntp", spares=1, faults=(Fault(4, 0),), repairs=(Repair(4, 2),))
    assert_exact_and_accounted(result, live, 4, 2)
    assert [(e["event"], e["procs"]) for e in live.timeline] == [("idle failure", [4]), ("repair", [4])]


@pytest.mark.timeout(120)
def test_a_kill_mid_step_recovers_exact_fast():
    # the one live case in ``make test``: TP2 x DP2, process 1 SIGKILLed at its first collective of
    # step 1; replica 0 goes on at TP1 on process 0, fetching the rows process 1 held from replica 1
    result, live = run(2, 2, steps=3, policy="ntp", faults=(Fault(1, 1),), timeout_s=20)
    assert_exact_and_accounted(result, live, 3, 1)
    assert not result.problems and live.batches[:2] == [4, 3]
    (e,) = live.timeline
    assert (e["event"], e["procs"], e["source"], e["redo_from"]) == ("failure", [1], "memory", 1)
    assert e["bytes_moved"] > 0 and e["layout"].startswith("TP1 + TP2")
    # the stream the reference drew: 4 samples, then 3 (TP1 keeps fewer micro-batches), contiguous
    assert [(r["consumed"], r["batch"]) for r in live.steps] == [(0, 4), (4, 3), (7, 3)]
    # the layout after the failure had its cuts checked too: degree 1 beside the base's 2
    assert {(c["unit"], c["degree"]) for c in live.cuts} >= {("heads", 1), ("heads", 2), ("vocab", 1)}


# Planted bugs that a live run used to PASS with (``tests/support/mutations``): each must now fail it.


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_crash_of_our_own_code_fails_the_run_even_when_recovery_could_go_on(monkeypatch):
    bug = plant(monkeypatch, "live-crash-proc3")  # process 3 raises in step 1; nothing injected it
    with pytest.raises(RecoveryFailure, match=r"process 3 died of its own error, not of an injected --fail "
                       r"\(RuntimeError: planted bug: process 3 crashes in step 1"):  # fmt: skip
        run(2, 2, steps=3, policy="ntp", faults=(Fault(1, 2),), worker_init=bug)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_recovery_that_skips_a_sample_fails_the_run(monkeypatch):
    bug = plant(monkeypatch, "skip-a-sample")  # the layout after the failure starts one sample late
    result, live = run(2, 2, steps=3, policy="ntp", faults=(Fault(1, 1),), worker_init=bug)
    # the ranks used and logged samples 5..7: fed that log the reference would agree; it draws 4..6
    assert live.steps[1]["consumed"] == 5
    assert "step 1 committed samples 5..7, but the stream continues at sample 4 with 3 samples" in result.problems
    assert result.max_rel_error_params > 1e-6


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_wrong_cut_at_a_degree_only_the_re_plan_reaches_fails_the_run(monkeypatch):
    bug = plant(monkeypatch, "cuts-reversed-odd")  # TP4 cuts right; TP3 (after the failure) reversed
    with pytest.raises(RecoveryFailure, match=r"generation 1 \(TP3 \+ TP4.*heads at degree 3: executor 10/11/11, "
                       r"planner 11/11/10"):  # fmt: skip
        run(4, 2, steps=3, policy="ntp", faults=(Fault(1, 1),), worker_init=bug)
