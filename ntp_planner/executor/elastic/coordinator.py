"""Live recovery, the coordinator's side: watch the generation, agree on who failed, re-plan.

The coordinator runs beside the store (``membership``): in the launcher of a one-host run, or in
rank 0's torchrun worker, whose agent hosts torchrun's store (``torchrun``). It sees the
processes through ``hosts`` (their exit codes, their progress through collectives) and the
processes report what they see (a collective that failed: ``membership.leave``). On a failure it:

1. detect: notices the dead process (or lost host) or the first survivor that left;
2. agree: aborts the generation and waits until every live process of the layout has left it (a
   process that neither leaves nor dies within the collective timeout is killed): the failed set
   is then the processes that died;
3. re-plan: empties the failed processes' base slots and asks ``relayout.RunReplanner`` (the
   plan's Replanner under the run's policy) for the next layout;
4. regroup: publishes generation n + 1; each process destroys its old groups and builds the new
   layout's (``worker``);
5. move state: from the survivors' memory, a checkpoint or the initial weights (``source``);
6. redo: the interrupted step (never committed, ``worker``'s protocol) runs again on the new layout.

Repairs and joiners are ``repairs``'s; the events and their costs ``timeline``'s.
"""

from __future__ import annotations

import time

from ntp_planner.executor.elastic import membership as ms
from ntp_planner.executor.elastic import repairs, timeline
from ntp_planner.executor.elastic.faults import RecoveryFailure
from ntp_planner.executor.elastic.relayout import Layout, RunReplanner
from ntp_planner.executor.elastic.source import state_source
from ntp_planner.executor.elastic.timeline import LiveRun
from ntp_planner.executor.elastic.watch import Watch
from ntp_planner.executor.elastic.worker import Generation, LiveConfig

PARTS = timeline.PARTS
__all__ = ["PARTS", "Coordinator", "LiveRun", "RecoveryFailure", "live_spec"]


class Coordinator:
    """Runs a live run on ``store`` and ``hosts``: publishes generations, reacts to failures,
    repairs and joiners, and keeps the log and the timeline."""

    def __init__(self, replanner: RunReplanner, policy: str, cfg: LiveConfig, store, hosts, spares=0, fixes=(),
                 tick=None):  # fmt: skip
        self.replanner, self.policy, self.cfg, self.store, self.hosts = replanner, policy, cfg, store, hosts
        self.cuts: dict[tuple[str, int], dict] = {}  # (unit, degree) -> the row, over every layout published
        self.repairs = sorted(fixes, key=lambda r: r.step)
        self.tick = tick
        base = replanner.base()
        self.total = base.spec.world_size + spares
        self.dead: set[int] = set()
        self.slots: list[int | None] = list(range(base.spec.world_size))
        self.gens: list[Generation] = []
        self._published: list[float] = []  # when each generation was published
        # the generation whose layout holds the committed state: the last one whose every rank had
        # its state in place (None until one did: no step is committed before, the state is the
        # initial weights)
        self.state_gen: int | None = None
        self._fruitless, self._committed_before, self._t_last = 0, None, None
        self.records: list[dict] = []  # committed steps, in commit order
        self.lost: list[dict] = []
        self.timeline: list[dict] = []
        self.pending: list[dict] = []  # timeline events waiting for their regroup / move / redo times
        self._first_layout = base
        self.restarted: set[int] = set()  # repaired processes started and not yet back in a layout
        self.watch = Watch(cfg.timeout_s, store, hosts, self.total)

    def run(self) -> LiveRun:
        start = time.perf_counter()
        try:
            for proc in range(self.total):
                self.hosts.start(proc, 0)
            self._publish(Generation(0, self._first_layout, 0, 0, "init", previous=None))
            self._loop()
            got = ms.result(self.store)
        finally:
            if self.gens and self.gens[-1].layout is not None:
                self._publish(Generation(len(self.gens), None, 0, 0, "init"))
            self.hosts.stop_all()
        self._read_log()
        steps = self.effective()
        final = self.gens[got["generation"]]
        # None when the last generation ran no step (a rank failed in the final gather): its
        # holdings carry no gradients
        grad_step = next((i for i, r in enumerate(steps) if r["step"] == final.start_step), None)
        specs = [g.layout for g in self.gens if g.layout is not None and g.layout.spec is not None]
        return LiveRun(
            steps=steps,
            lost=self.lost,
            timeline=self.timeline,
            holders=got["holders"],
            grad_step=grad_step,
            wall_s=time.perf_counter() - start,
            layouts=[lay.describe() for lay in specs],
            batches=[0 if g.layout is None else g.layout.batch for g in self.gens],
            cuts=list(self.cuts.values()),
        )

    def _check_cuts(self, gen: Generation) -> None:
        """Refuse to run a layout whose shard cuts differ from the planner's shares of the plan's
        model: a re-plan's new degree (TP3 after TP4 lost a GPU) is checked as the base's is."""
        from ntp_planner.executor.check.cuts import compare_cuts, mismatches

        rows = compare_cuts(gen.layout.spec, self.replanner.plan.model)
        for row in rows:
            self.cuts.setdefault((row["unit"], row["degree"]), row)
        if mismatches(rows):
            raise RecoveryFailure(f"generation {gen.number} ({gen.layout.describe()}): {mismatches(rows)}")

    def _publish(self, gen: Generation) -> None:
        if gen.layout is not None and gen.layout.spec is not None:
            self._check_cuts(gen)
        self.gens.append(gen)
        self._published.append(time.time())
        if gen.layout is not None:
            repairs.arm(self, gen)
        # every process has left the old layout by now: its counts (a collective that failed
        # leaves it "inside" one) start again, as its new ``Comm``'s do
        self.hosts.reset_progress()
        ms.publish(self.store, gen)
        self.watch.reset(gen.number, len(self.records))

    @property
    def layout(self) -> Layout:
        return self.gens[-1].layout

    def _loop(self) -> None:
        while True:
            self._read_log()
            if self.tick is not None:
                self.tick(len(self.effective()))
            if ms.is_done(self.store):
                return
            n = len(self.gens) - 1
            repairs.idle_faults(self)
            repairs.take_joins(self)
            for proc in list(self.hosts.procs):
                if self.hosts.exitcode(proc) is not None and proc not in self.dead and not ms.is_done(self.store):
                    self.mark_dead(proc)
                    if proc in self.layout.procs:
                        self._reconfigure(self.hosts.lost(proc) or f"process {proc} died")
                        break
            else:
                if ms.left_count(self.store, n) > 0:
                    if not repairs.at_boundary(self):
                        self._reconfigure("a process lost a peer")
                elif self._hung():
                    self._reconfigure("a process hung")
            time.sleep(0.02)

    def _read_log(self) -> None:
        for rec in ms.read_log(self.store, len(self.records)):
            spec = self.gens[rec["generation"]].layout.spec
            rec["replicas"] = [
                [
                    rec["consumed"] + spec.first_sequence(r),
                    rec["consumed"] + spec.first_sequence(r) + rep.micro_batches * spec.micro_batch,
                ]
                for r, rep in enumerate(spec.replicas)
                if rep.cp_rank == 0
            ]
            self.records.append(rec)
        timeline.finish(self.pending, self.store, self._worlds(), self.records, self.cfg.steps)

    def _worlds(self) -> dict[int, int]:
        return {g.number: g.layout.spec.world_size for g in self.gens if g.layout is not None and g.layout.spec}

    def effective(self) -> list[dict]:
        return [r for r in self.records if not r.get("lost")]

    def committed(self) -> int:
        """Steps whose updates the state holds: the next step to run."""
        eff = self.effective()
        return eff[-1]["step"] + 1 if eff else 0

    def _hung(self) -> bool:
        """Kill the processes that hang (``Watch.hung``); True if one was killed."""
        culprits = self.watch.hung(self.layout.procs, len(self.records))
        for p, why in culprits:
            self.kill(p, why)
        return bool(culprits)

    def error_of(self, proc: int) -> str:
        """What process ``proc`` said before it died, or how it died."""
        said = ms.error_of(self.store, proc)
        if said is not None:
            return said
        code = self.hosts.exitcode(proc)
        return "still running" if code is None else f"exit code {code}"

    def kill(self, proc: int, why: str = "") -> None:
        """Kill ``proc`` (``why``: what it did that it had to be killed, e.g. it hung)."""
        self.hosts.kill(proc)
        self.mark_dead(proc, why)

    def mark_dead(self, proc: int, why: str = "") -> None:
        """Count ``proc`` as dead. A death that no --fail injected, nor the loss of its host, is
        the executor's own bug (or the machine's): recovering around it would pass a run that is
        wrong, so the run fails, naming the process and its error."""
        self.dead.add(proc)
        fault = ms.last_fault(self.store, proc)
        injected = fault is not None and fault["t"] >= self.hosts.started_t(proc)
        if not injected and not self.hosts.lost(proc):
            raise RecoveryFailure(
                f"process {proc} died of its own error, not of an injected --fail ({why or self.error_of(proc)}); "
                "a live run recovers only from the failures it injects, so this run fails"
            )

    def _reconfigure(self, cause: str, repaired: tuple[int, ...] = (), boundary: int | None = None) -> None:
        t_notice, gen = time.time(), self.gens[-1]
        n = gen.number
        left = self.watch.await_leavers(gen, self.dead, self.kill, self.mark_dead)
        t_agree = time.time()
        self._read_log()
        timeline.cut_short(self.pending, self.store, n, gen.layout.spec.world_size, self._published[n], t_notice)
        fails = [f for f in (ms.last_fault(self.store, p) for p in sorted(self.dead)) if f is not None]
        failed_now = sorted(p for p in self.dead if p in gen.layout.procs or p in self.slots)
        lost = sorted({why for why in map(self.hosts.lost, failed_now) if why})
        self.slots = [None if s in self.dead else s for s in self.slots]
        for p in repaired:
            if p < len(self.slots) and self.slots[p] is None:  # a repaired spare (no base slot) comes back idle
                self.slots[p] = p
        alive = frozenset(p for p in self.hosts.procs if p not in self.dead)
        t0 = time.perf_counter()
        layout = self.replanner.relayout(tuple(self.slots), alive, self.policy)
        replan_s = time.perf_counter() - t0
        self.slots = list(layout.slots)
        if layout.spec is None:
            said = [f"process {p}: {ms.error_of(self.store, p)}" for p in failed_now if ms.error_of(self.store, p)]
            why = f" ({said[0]}{' and others' if len(said) > 1 else ''})" if said else ""
            raise RecoveryFailure(f"{cause}{why}: no replica can run any more under --policy {self.policy}")
        # the committed state is held in gen n's layout once every rank of it has its state in place
        if ms.in_place(self.store, n, range(gen.layout.spec.world_size)):
            self.state_gen = n
        self._check_fruitless(n, bool(failed_now or repaired))
        interrupted = self.committed()
        held = None if self.state_gen is None else self.gens[self.state_gen]
        src = state_source(self.policy, held, layout, interrupted, self._consumed(), self.cfg.checkpoint_dir,
                           self.records)  # fmt: skip
        self.lost += [r for r in self.records if r.get("lost") and r not in self.lost]
        previous = (self.state_gen, held.layout.spec, held.layout.procs) if src.source == "memory" else None
        self._publish(Generation(n + 1, layout, src.start, src.consumed, src.source, src.checkpoint_step, previous))
        t_fail = min((f["t"] for f in fails if f["t"] >= (self._t_last or 0)), default=t_notice)
        last = max(left, key=lambda p: left[p]["t"], default=None)
        kind = "repair" if repaired else ("restart" if self.policy == "restart" else "failure")
        note = "; ".join([*([src.note] if src.note else []), *lost])
        event = timeline.failure_event(
            kind, cause, list(repaired) or failed_now, n + 1, layout, src.source, note,
            step=interrupted if boundary is None else boundary, lost_hosts=lost,
            detect_s=0.0 if repaired else max(0.0, t_notice - t_fail), agree_s=t_agree - t_notice, replan_s=replan_s,
            bytes_moved=0 if src.moves is None else src.moves.bytes_moved,
            last_to_leave=None if last is None else {"proc": last, "why": left[last]["why"]},
            redo_from=src.start, redo_to=interrupted if boundary is None else boundary,
        )  # fmt: skip
        self._t_last = t_notice
        repairs.start_due(self)
        self.timeline.append(event)
        self.pending.append(event)

    def _check_fruitless(self, n: int, lost_one: bool) -> None:
        """Processes that keep leaving generations with nobody failed and no step committed (a
        collective timeout too short for this machine, say) would re-plan forever: the third
        such re-plan in a row ends the run, with the reasons they gave."""
        committed = self.committed()
        fruitless = not lost_one and committed == self._committed_before
        self._fruitless = self._fruitless + 1 if fruitless else 0
        self._committed_before = committed
        if self._fruitless >= 3:
            why = sorted({x["why"] for x in ms.left_reasons(self.store, n, self.gens[n].layout.procs).values()})
            raise RecoveryFailure(
                f"processes left {self._fruitless + 1} layouts in a row with none failed and no step committed "
                f"({why[0] if why else 'no reason given'}); a --timeout of {self.cfg.timeout_s:g} s may be too "
                "short for this machine"
            )

    def _consumed(self) -> int:
        eff = self.effective()
        return eff[-1]["consumed"] + eff[-1]["batch"] if eff else 0


def live_spec(spec):
    """The run a live recovery trains: the plan's, at its ZeRO level and ep (state moves shard by
    shard, ``handover``); only mixed precision is refused (its fp32 masters are not carried)."""
    if spec.dtype in ("bfloat16", "float16"):
        raise ValueError(f"live recovery runs in float32 or float64, not {spec.dtype}; use --dtype float32")
    return spec
