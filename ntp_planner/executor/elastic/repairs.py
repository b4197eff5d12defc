"""Processes coming back (repairs, joiners) and faults of idle processes, for the ``Coordinator``.

A repair happens at a step boundary exactly: every generation that runs through the repair's step
is told to stop before it (``membership.stop_at``, armed when the generation is published), and
the repaired process is started as soon as its predecessor is dead, so that it has booted by then
(the run waits for it at the boundary if not). Under torchrun a repair is a process that joins
the run (``torchrun.join``): the coordinator gives it a failed process's number and the next step
boundary not yet entered becomes that process's repair step.
"""

from __future__ import annotations

import time

from ntp_planner.executor.elastic import membership as ms
from ntp_planner.executor.elastic import timeline
from ntp_planner.executor.elastic.faults import RecoveryFailure, Repair


def arm(co, gen) -> None:
    """Stop generation ``gen`` before the earliest repair it runs through (the next one is armed
    by the generation after it)."""
    for rep in co.repairs:
        if gen.start_step <= rep.step < co.cfg.steps:
            ms.stop_at(co.store, gen.number, rep.step)
            return


def start_due(co) -> None:
    """Start the repaired processes whose predecessors are dead (each once)."""
    for rep in co.repairs:
        if rep.proc in co.dead and rep.proc not in co.restarted:
            ms.unready(co.store, rep.proc)
            co.restarted.add(rep.proc)
            co.hosts.start(rep.proc, len(co.gens))
            co.dead.discard(rep.proc)


def at_boundary(co) -> bool:
    """If the layout stopped before a repair's step, carry the repair out; True if so."""
    n, k = len(co.gens) - 1, co.committed()
    rep = next((r for r in co.repairs if r.step == k), None)
    if rep is None or not ms.stop_at(co.store, n, k):
        return False
    start_due(co)
    deadline = time.monotonic() + co.cfg.timeout_s + 60
    while not ms.is_ready(co.store, rep.proc):
        if time.monotonic() > deadline or co.hosts.exitcode(rep.proc) is not None:
            raise RecoveryFailure(f"repaired process {rep.proc} did not start: {co.error_of(rep.proc)}")
        time.sleep(0.02)
    co.repairs.remove(rep)
    co.restarted.discard(rep.proc)
    co._reconfigure(f"process {rep.proc} repaired", repaired=(rep.proc,), boundary=k)
    return True


def take_joins(co) -> None:
    """Answer each process that asked to join: it becomes the lowest failed process with a base
    slot, repaired at the next step boundary no rank entered. A joiner waits while no process is
    down (a hot spare), and is told -1 (and leaves) when no step is left to join at."""
    for i in co.hosts.joins():
        free = sorted(p for p in co.dead if p < len(co.slots) and p not in co.restarted)
        if not free and co.committed() < co.cfg.steps:
            continue
        n = len(co.gens) - 1
        k = next((s for s in range(co.committed(), co.cfg.steps) if ms.stop_at(co.store, n, s)), None)
        if k is None:
            co.hosts.answer_join(i, -1, 0)
            continue
        proc = free[0]
        ms.unready(co.store, proc)
        co.repairs = sorted([*co.repairs, Repair(proc, k)], key=lambda r: r.step)
        co.restarted.add(proc)
        co.hosts.answer_join(i, proc, len(co.gens))
        co.dead.discard(proc)


def idle_faults(co) -> None:
    """A fault of a process outside the layout (idle) fires when its step is reached. A repaired
    process waiting for its step to rejoin is not idle: its fault in that step fires in the step,
    once it is back."""
    step = co.committed()
    for f in co.cfg.faults:
        waiting = f.proc in co.restarted and any(r.proc == f.proc and r.step == f.step for r in co.repairs)
        if f.how == "carry" or waiting:
            continue
        if f.step <= step and f.proc not in co.layout.procs and f.proc not in co.dead:
            if ms.fire(co.store, f.proc, f.step, "kill"):
                co.kill(f.proc)
                co.slots = [None if s == f.proc else s for s in co.slots]
                co.timeline.append(timeline.idle_event(f.proc, step, len(co.gens) - 1, co.layout))
