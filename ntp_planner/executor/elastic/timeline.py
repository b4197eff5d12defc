"""A live run's timeline: one event per failure, repair or idle death, and its recovery time split
into the parts ``ntp simulate --recovery-from`` reads.

An event is a dict (it goes to ``--json`` as it is). Its parts (``PARTS``) are measured where they
happen: detect (from the fault firing to the coordinator noticing), agree (until every survivor
left the generation), re-plan (the Replanner), regroup and move state (the slowest rank of the
new generation, as it reported them: ``membership.times``) and redo (from the state in place to
the interrupted step committed again). Regroup, move and redo are known only once the new
generation got there: an event waits in the coordinator's pending list until then
(``finish``), or is closed by the next failure with what is known (``cut_short``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ntp_planner.executor.elastic import membership as ms

PARTS = ("detect_s", "agree_s", "replan_s", "regroup_s", "move_state_s", "redo_s")


@dataclass
class LiveRun:
    """What a live run did: its committed steps (those the final state is made of), the steps
    lost to a rollback, the timeline of events and the final holdings (``holders``)."""

    steps: list[dict]  # step, generation, loss, consumed, batch, replicas ([first, end) samples of each replica)
    lost: list[dict]  # steps committed and then rolled back (a checkpoint fallback or a restart)
    timeline: list[dict]
    holders: list[dict]
    grad_step: int | None  # index in ``steps`` of the step whose synced gradients ``holders`` carry (None: none)
    wall_s: float
    layouts: list[str]  # each generation's layout, described
    batches: list[int] = field(default_factory=list)  # sequences per step of each generation's layout (0: none runs)
    cuts: list[dict] = field(default_factory=list)  # every layout's shard cuts against the planner's (``cuts``)


def failure_event(kind: str, cause: str, procs: list[int], gen, layout, source, note: str, **parts) -> dict:
    """The event of a re-plan into generation ``gen`` (its number) with ``layout``: ``kind`` is
    failure, repair or restart; ``parts`` carries detect/agree/re-plan and the rest of the fields."""
    return {
        "event": kind,
        "cause": cause,
        "procs": procs,
        "generation": gen,
        "layout": layout.describe(),
        "batch": layout.batch,
        "source": source,
        "note": note,
        # why each replica that changed runs as it does (the Replanner's reasons): e.g. dropped for memory
        "replicas": [
            f"replica {i} {x.status}: {x.reason}" for i, x in enumerate(layout.replicas) if x.status != "healthy"
        ],  # fmt: skip
        **parts,
    }


def idle_event(proc: int, step: int, generation: int, layout) -> dict:
    """An idle process died: nothing runs on it, so nothing is re-planned, moved or redone (every
    part 0; ``recovery_costs`` leaves it out)."""
    event = {
        "step": step,
        "event": "idle failure",
        "cause": f"idle process {proc} died",
        "procs": [proc],
        "generation": generation,
        "layout": layout.describe(),
        "batch": layout.batch,
        "source": "memory",
        "note": "the process was idle: the layout does not change",
        "bytes_moved": 0,
        "redo_from": step,
        "redo_to": step,
    }
    return event | dict.fromkeys(PARTS, 0.0) | {"total_s": 0.0}


def cut_short(pending: list[dict], store, n: int, world: int, published_t: float, t_notice: float) -> None:
    """Close the events whose generation ``n`` fails before it finished their recovery (a process
    died while the state moved, or before the step was redone): each part is what the ranks that
    got there reported, the regroup of those that did not lasts until the failure was noticed, and
    the redo is the time from the state in place until then."""
    for event in [e for e in pending if e["generation"] == n]:
        got = ms.times(store, n, range(world))
        complete = len(got) == world
        event["regroup_s"] = max(t["regroup_s"] for t in got) if complete else t_notice - published_t
        event["move_state_s"] = max((t["move_s"] for t in got), default=0.0) if complete else 0.0
        ready = max(t["t"] for t in got) if complete else t_notice
        event["redo_s"] = 0.0 if event["event"] == "repair" else max(0.0, t_notice - ready)
        event["total_s"] = sum(event[p] for p in PARTS)
        event["note"] = (event["note"] + "; " if event["note"] else "") + "cut short by the next failure"
        pending.remove(event)


def finish(pending: list[dict], store, worlds: dict[int, int], records: list[dict], steps: int) -> None:
    """Fill in an event's regroup, move and redo times once its generation has redone the steps
    the failure cost. ``worlds``: each generation's number of ranks."""
    for event in list(pending):
        n = event["generation"]
        if not ms.in_place(store, n, range(worlds[n])):
            continue
        got = ms.times(store, n, range(worlds[n]))
        event["regroup_s"] = max(t["regroup_s"] for t in got)
        event["move_state_s"] = max(t["move_s"] for t in got)
        ready = max(t["t"] for t in got)
        target = event["redo_to"]
        if event["event"] == "repair" or target >= steps:
            event["redo_s"] = 0.0  # stopped at a step boundary, or every step was done: nothing to redo
        else:
            done = [r for r in records if r["generation"] == n and r["step"] == target]
            if not done:
                continue
            event["redo_s"] = max(0.0, done[0]["t"] - ready)
        event["total_s"] = sum(event[p] for p in PARTS)
        pending.remove(event)


def recovery_costs(timeline: list[dict]) -> dict[str, float]:
    """The simulator's recovery costs from a run's timeline (``ntp simulate --recovery-from``):
    detection, the reconfiguration of a re-plan kept in memory (agree + re-plan + regroup + move +
    redo) and a restart (the same for a restart from a checkpoint); means over the events."""
    out: dict[str, float] = {}

    def mean(events, parts):
        return sum(sum(e.get(p, 0.0) for p in parts) for e in events) / len(events)

    failures = [e for e in timeline if e["event"] in ("failure", "restart") and "total_s" in e]
    if failures:
        out["detection_s"] = mean(failures, ("detect_s",))
    kept = [e for e in failures if e["source"] == "memory"]
    if kept:
        out["reconfigure_s"] = mean(kept, PARTS[1:])
    restarts = [e for e in failures if e["source"] != "memory"]
    if restarts:
        out["restart_s"] = mean(restarts, PARTS[1:])
    return out
