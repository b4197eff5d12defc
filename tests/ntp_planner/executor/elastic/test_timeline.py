"""A live run's timeline: events as the coordinator writes them, their recovery parts filled in
from what the ranks reported (on an in-process HashStore), and the simulator's recovery costs as
means over hand-made events, computed by hand."""

from types import SimpleNamespace

import pytest

dist = pytest.importorskip("torch.distributed", reason="torch is not installed")

from ntp_planner.executor.elastic import membership as ms  # noqa: E402
from ntp_planner.executor.elastic import timeline  # noqa: E402
from ntp_planner.executor.elastic.timeline import PARTS, cut_short, finish, recovery_costs  # noqa: E402


def layout(batch=6):
    replicas = [SimpleNamespace(status="healthy", reason=""), SimpleNamespace(status="shrunk", reason="lost rank 1")]
    return SimpleNamespace(describe=lambda: "TP4 + TP3", batch=batch, replicas=replicas)


def event(kind="failure", source="memory", total=True, **parts):
    e = {"event": kind, "source": source, **dict.fromkeys(PARTS, 0.0), **parts}
    if total:
        e["total_s"] = sum(e[p] for p in PARTS)
    return e


def test_recovery_costs_are_means_over_the_finished_failures():
    events = [
        event(detect_s=1.0, agree_s=2.0, replan_s=0.5, regroup_s=1.5, move_state_s=1.0, redo_s=3.0),  # 8 after detect
        event(detect_s=3.0, agree_s=1.0, replan_s=0.5, regroup_s=0.5, redo_s=1.0),  # 3
        event("restart", "checkpoint", detect_s=2.0, agree_s=1.0, replan_s=1.0, regroup_s=2.0, redo_s=6.0),  # 10
        event("failure", "init", detect_s=6.0, agree_s=4.0),  # 4
        event(detect_s=100.0, agree_s=100.0, total=False),  # still pending: not counted
        event("repair", detect_s=50.0, agree_s=50.0),  # a repair is no failure
        event("idle failure", detect_s=70.0),
    ]
    got = recovery_costs(events)
    assert got == {
        "detection_s": pytest.approx((1 + 3 + 2 + 6) / 4),  # 3.0
        "reconfigure_s": pytest.approx((8 + 3) / 2),  # 5.5: kept in memory
        "restart_s": pytest.approx((10 + 4) / 2),  # 7.0: from a checkpoint or the initial weights
    }


def test_recovery_costs_name_only_what_happened():
    assert recovery_costs([]) == {}
    assert recovery_costs([event("repair", detect_s=1.0)]) == {}
    assert recovery_costs([event(detect_s=0.5, agree_s=0.25)]) == {"detection_s": 0.5, "reconfigure_s": 0.25}


def test_failure_event_names_each_replica_that_changed():
    e = timeline.failure_event("failure", "process 1 died", [1], 2, layout(), "memory", "", detect_s=0.5)
    assert e == {
        "event": "failure",
        "cause": "process 1 died",
        "procs": [1],
        "generation": 2,
        "layout": "TP4 + TP3",
        "batch": 6,
        "source": "memory",
        "note": "",
        "replicas": ["replica 1 shrunk: lost rank 1"],
        "detect_s": 0.5,
    }


def test_an_idle_failure_costs_nothing():
    e = timeline.idle_event(5, 3, 1, layout())
    assert [e[p] for p in PARTS] == [0.0] * 6 and e["total_s"] == 0.0
    assert (e["event"], e["cause"], e["procs"], e["redo_from"], e["redo_to"]) == (
        "idle failure",
        "idle process 5 died",
        [5],
        3,
        3,
    )
    assert recovery_costs([e]) == {}


def report(store, n, rank, regroup, move, t):
    ms.report_times(store, n, rank, {"regroup_s": regroup, "move_s": move, "bytes": 0, "t": t})


def pending_event(kind="failure", generation=1, redo_to=4, note=""):
    return {"event": kind, "generation": generation, "redo_to": redo_to, "note": note,
            "detect_s": 1.0, "agree_s": 0.5, "replan_s": 0.25}  # fmt: skip


def test_finish_waits_for_every_rank_and_the_redone_step():
    store = dist.HashStore()
    e = pending_event()
    pending = [e]
    report(store, 1, 0, 0.5, 0.25, 100.0)
    records = [{"generation": 0, "step": 4, "t": 50.0}]  # step 4 of an older generation: not the redo
    finish(pending, store, {1: 2}, records, steps=6)
    assert pending == [e] and "total_s" not in e  # rank 1's state is not in place yet
    report(store, 1, 1, 0.75, 0.125, 101.0)
    finish(pending, store, {1: 2}, records, steps=6)
    assert pending == [e]  # in place, but step 4 is not redone
    records.append({"generation": 1, "step": 4, "t": 103.5})
    finish(pending, store, {1: 2}, records, steps=6)
    assert pending == []
    assert (e["regroup_s"], e["move_state_s"], e["redo_s"]) == (0.75, 0.25, 2.5)  # slowest ranks; 103.5 - 101
    assert e["total_s"] == 1.0 + 0.5 + 0.25 + 0.75 + 0.25 + 2.5


@pytest.mark.parametrize("kind, redo_to", [("repair", 2), ("failure", 6)], ids=["repair", "after-the-last-step"])
def test_finish_redoes_nothing_at_a_boundary_or_past_the_end(kind, redo_to):
    store = dist.HashStore()
    report(store, 3, 0, 0.5, 0.25, 100.0)
    e = pending_event(kind, 3, redo_to)
    pending = [e]
    finish(pending, store, {3: 1}, [], steps=6)  # no record needed
    assert pending == [] and e["redo_s"] == 0.0 and e["total_s"] == 1.0 + 0.5 + 0.25 + 0.5 + 0.25


def test_cut_short_with_ranks_missing_counts_the_regroup_until_the_notice():
    store = dist.HashStore()
    report(store, 2, 0, 0.5, 0.25, 100.0)  # rank 1 never got its state
    e, other = pending_event(generation=2), pending_event(generation=1, note="x")
    pending = [e, other]
    cut_short(pending, store, 2, 2, published_t=98.0, t_notice=104.0)
    assert pending == [other] and "total_s" not in other  # another generation's event stays
    assert (e["regroup_s"], e["move_state_s"], e["redo_s"]) == (6.0, 0.0, 0.0)  # 104 - 98
    assert e["total_s"] == 1.0 + 0.5 + 0.25 + 6.0
    assert e["note"] == "cut short by the next failure"


def test_cut_short_with_every_rank_in_place_redoes_until_the_notice():
    store = dist.HashStore()
    report(store, 2, 0, 0.5, 0.25, 100.0)
    report(store, 2, 1, 1.5, 0.75, 102.0)
    e, r = pending_event(generation=2, note="from memory"), pending_event("repair", 2)
    pending = [e, r]
    cut_short(pending, store, 2, 2, published_t=98.0, t_notice=105.0)
    assert pending == []
    assert (e["regroup_s"], e["move_state_s"], e["redo_s"]) == (1.5, 0.75, 3.0)  # 105 - 102
    assert e["note"] == "from memory; cut short by the next failure"
    assert r["redo_s"] == 0.0  # a repair stops at a boundary: nothing to redo
