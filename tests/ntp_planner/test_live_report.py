"""What a live run reports, from a hand-made run (no processes): the recovery costs the simulator
reads, the --json fields and the timeline tables with their notes and samples log."""

import pytest
from rich.console import Console

pytest.importorskip("torch", reason="torch is not installed")

from ntp_planner.cli.live import live_json, timeline_view  # noqa: E402
from ntp_planner.executor.elastic.timeline import (
    LiveRun,
    recovery_costs,  # noqa: E402
)


def event(step, kind, source, detect, rest, **extra):
    """A timeline event whose agree/re-plan/regroup/move/redo are ``rest`` (5 numbers)."""
    parts = dict(zip(("agree_s", "replan_s", "regroup_s", "move_state_s", "redo_s"), rest, strict=True))
    e = {"step": step, "event": kind, "procs": [1], "layout": "TP3 + TP4 (ntp), PP1, 1+2 micro-batches of 1"}
    e |= {"batch": 3, "source": source, "note": "", "detect_s": detect, **parts, "redo_from": step, "redo_to": step}
    e["total_s"] = detect + sum(rest)
    return e | extra


TIMELINE = [
    event(2, "failure", "memory", 0.1, (0.2, 0.0, 0.1, 0.1, 0.5)),  # reconfigure 0.9
    event(4, "failure", "memory", 0.3, (0.4, 0.0, 0.2, 0.1, 0.4)),  # reconfigure 1.1
    event(
        6, "failure", "checkpoint", 0.2, (0.1, 0.0, 0.1, 0.2, 1.6), redo_from=4, note="from the checkpoint of step 3"
    ),
    event(7, "repair", "memory", 0.0, (0.0, 0.0, 1.0, 1.0, 0.0)),  # not a failure: left out
]


def test_recovery_costs_are_means_over_failures_split_by_where_the_state_came_from():
    costs = recovery_costs(TIMELINE)
    assert costs["detection_s"] == pytest.approx((0.1 + 0.3 + 0.2) / 3)
    assert costs["reconfigure_s"] == pytest.approx((0.9 + 1.1) / 2)
    assert costs["restart_s"] == pytest.approx(2.0)
    assert recovery_costs(TIMELINE[3:]) == {}  # a repair costs the simulator nothing


def run() -> LiveRun:
    steps = [
        {"step": k, "generation": int(k >= 2), "loss": 4.0 - k / 10, "consumed": c, "batch": b, "replicas": [], "t": k}
        for k, (c, b) in enumerate([(0, 4), (4, 4), (8, 3), (11, 3)])
    ]
    lost = [{"step": 2, "generation": 1, "loss": 3.9, "consumed": 8, "batch": 3, "t": 1.5}]
    timeline = [TIMELINE[0] | {"replicas": ["replica 0 degraded: runs at TP 3"]}, TIMELINE[2]]
    return LiveRun(steps, lost, timeline, [], 0, 1.0, ["TP4 + TP4", "TP3 + TP4"])


def test_live_json_carries_the_samples_log_the_lost_steps_and_the_costs():
    data = live_json(None, run(), 1e-5)
    assert [(s["consumed"], s["batch"]) for s in data["samples"]] == [(0, 4), (4, 4), (8, 3), (11, 3)]
    assert data["lost_steps"] == [{"step": 2, "generation": 1, "loss": 3.9, "consumed": 8, "batch": 3}]
    assert data["steps_committed"] == 4 and data["layouts"] == ["TP4 + TP4", "TP3 + TP4"]
    assert set(data["recovery_costs_s"]) == {"detection_s", "reconfigure_s", "restart_s"}


def test_the_timeline_view_shows_each_event_its_times_its_reasons_and_the_samples():
    console = Console(width=200, record=True)
    console.print(timeline_view(run()))
    text = console.export_text()
    assert "checkpoint 3" in text and "steps 4-6" in text and "memory" in text
    assert "1.000" in text and "2.200" in text  # total seconds of the two events
    assert "step 2: replica 0 degraded: runs at TP 3" in text
    assert "step 6: from the checkpoint of step 3" in text
    assert "step 2: samples 8..10" in text and "Rolled back: steps 2." in text
