"""Live recovery, the launcher's side: membership, the re-plan and the timeline.

Membership is store-based, with a generation number. The store is a ``TCPStore`` hosted by the
launcher process, which also spawned the ranks, so a dying rank cannot take it down (torchft's
lighthouse plays the same part; torchft's reconfigurable process groups are not used: they
rebuild whole data-parallel replicas, while a replica here changes its TP degree and layout, so
every group is rebuilt anyway). The launcher watches each process (its exit code, and the
progress array for a hang: no process makes progress for ``timeout_s`` while one is outside any
collective and the others wait inside one) and the processes report what they see (a collective
that failed: ``g<n>/left/<proc>``). On a failure it:

1. detect: notices the dead process or the first survivor that left;
2. agree: aborts the generation (``g<n>/abort``) and waits until every live process of the
   layout has left it (a process that neither leaves nor dies within the collective timeout is
   killed): the failed set is then the processes that died;
3. re-plan: empties the failed processes' base slots and asks ``relayout.RunReplanner`` (the
   plan's Replanner under the run's policy) for the next layout;
4. regroup: publishes generation n + 1; each process destroys its old groups and builds the new
   layout's (``worker``);
5. move state: the survivors of a degraded replica fetch from their peers the rows they now own
   (``state.plan_moves``: only rows that change owner); when no up-to-date process holds some rows
   (or under ``--policy restart``) the state comes from the last complete checkpoint instead
   (``checkpoint``), or from the initial weights when there is none, and the steps since are
   redone;
6. redo: the interrupted step (never committed, ``worker``'s protocol) runs again on the new layout.

A repair (``Repair``) starts a fresh process for the failed one; once it is up, the generation is
stopped at the next step boundary and the next one gives it back its slot: the replica returns to
its full degree and the newcomer pulls its rows from its peers.
"""

from __future__ import annotations

import json
import os
import pickle
import tempfile
import time
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from ntp_planner.executor.elastic.faults import Repair
from ntp_planner.executor.elastic.relayout import Layout, RunReplanner
from ntp_planner.executor.elastic.worker import Generation, LiveConfig, serve
from ntp_planner.executor.train.launch import error_line
from ntp_planner.executor.train.processes import context

PARTS = ("detect_s", "agree_s", "replan_s", "regroup_s", "move_state_s", "redo_s")


class RecoveryFailure(RuntimeError):
    """The run could not go on (nothing left to run, or a process failed outside a step)."""


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


def _worker(proc: int, port: int, cfg: LiveConfig, err_dir: str, progress, first_generation: int, init) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if init is not None:  # ``launch_live``'s worker_init, in every process it starts (repairs too)
        init()
    try:
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=cfg.timeout_s + 60))
        serve(proc, store, cfg, progress, first_generation)
    except BaseException as exc:  # this process is broken: say why and die; the others recover
        Path(err_dir, f"{proc}.txt").write_text(error_line(exc))
        os._exit(1)
    os._exit(0)


class Coordinator:
    """Runs a live run from the launcher: spawns the processes, publishes generations, reacts to
    failures and repairs, and keeps the log and the timeline."""

    def __init__(
        self,
        replanner: RunReplanner,
        policy: str,
        cfg: LiveConfig,
        spares: int = 0,
        repairs: tuple[Repair, ...] = (),
        tick=None,
        worker_init=None,
    ):
        self.replanner, self.policy, self.cfg = replanner, policy, cfg
        self.worker_init = worker_init
        self.cuts: dict[tuple[str, int], dict] = {}  # (unit, degree) -> the row, over every layout published
        self._spawned_t: dict[int, float] = {}  # when each process (its latest incarnation) was started
        self.repairs = sorted(repairs, key=lambda r: r.step)
        self.tick = tick
        base = replanner.base()
        self.base_world = base.spec.world_size
        self.total = self.base_world + spares
        self.ctx = context()
        self.progress = self.ctx.Array("q", 3 * self.total, lock=False)
        self.procs: dict[int, object] = {}
        self.dead: set[int] = set()
        self.slots: list[int | None] = list(range(self.base_world))
        self.gens: list[Generation] = []
        self._published: list[float] = []  # when each generation was published
        # the generation whose layout holds the committed state: the last one whose every rank had
        # its state in place (None until one did: no step is committed before, the state is the
        # initial weights)
        self.state_gen: int | None = None
        self._fruitless = 0  # re-plans in a row with no process lost and no step committed since the last
        self.records: list[dict] = []  # committed steps, in commit order
        self.lost: list[dict] = []
        self.timeline: list[dict] = []
        self.pending: list[dict] = []  # timeline events waiting for their regroup / move / redo times
        self._first_layout = base
        self._restarted: set[int] = set()  # repaired processes started and not yet back in a layout

    # ---- life cycle -----------------------------------------------------------------------
    def run(self) -> LiveRun:
        start = time.perf_counter()
        self.store = dist.TCPStore(
            "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=self.cfg.timeout_s + 60)
        )
        with tempfile.TemporaryDirectory(prefix="ntp-live-") as tmp:
            self.err_dir = Path(tmp, "errors")
            self.err_dir.mkdir()
            self.cfg = LiveConfig(**{**self.cfg.__dict__, "out_file": str(Path(tmp, "out.pt"))})
            try:
                for proc in range(self.total):
                    self._spawn(proc)
                self._publish(Generation(0, self._first_layout, 0, 0, "init", previous=None))
                self._loop()
                got = torch.load(self.cfg.out_file, weights_only=False)
            finally:
                self._stop_all()
        self._read_log()
        steps = self._effective()
        final = self.gens[got["generation"]]
        # None when the last generation ran no step (a rank failed in the final gather): its
        # holdings carry no gradients
        grad_step = next((i for i, r in enumerate(steps) if r["step"] == final.start_step), None)
        return LiveRun(
            steps=steps,
            lost=self.lost,
            timeline=self.timeline,
            holders=got["holders"],
            grad_step=grad_step,
            wall_s=time.perf_counter() - start,
            layouts=[g.layout.describe() for g in self.gens if g.layout is not None and g.layout.spec is not None],
            batches=[0 if g.layout is None else g.layout.batch for g in self.gens],
            cuts=list(self.cuts.values()),
        )

    def _spawn(self, proc: int) -> None:
        # a process started later (a repair) joins at the next generation, never an old one
        args = (proc, self.store.port, self.cfg, str(self.err_dir), self.progress, len(self.gens), self.worker_init)
        p = self.ctx.Process(target=_worker, args=args, daemon=True)
        self._spawned_t[proc] = time.time()
        p.start()
        self.procs[proc] = p
        self.dead.discard(proc)

    def _stop_all(self) -> None:
        if self.gens and self.gens[-1].layout is not None:
            self._publish(Generation(len(self.gens), None, 0, 0, "init"))
        deadline = time.monotonic() + 10
        for p in self.procs.values():
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self.procs.values():
            if p.is_alive():
                p.kill()
                p.join(5)

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
            self._arm_repair(gen)
        self.store.set(f"layout/{gen.number}", pickle.dumps(gen))
        # every process has left the old layout by now: its counts (a collective that failed
        # leaves it "inside" one) start again, as its new ``Comm``'s do
        for i in range(3 * self.total):
            self.progress[i] = 0
        self._progress_seen = [-1] * self.total
        self._records_seen = len(self.records)
        self._in_place = False  # whether every rank of the layout has its state in place
        self._progress_changed = [time.monotonic()] * self.total

    @property
    def layout(self) -> Layout:
        return self.gens[-1].layout

    # ---- watching ---------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            self._read_log()
            if self.tick is not None:
                self.tick(len(self._effective()))
            if self.store.check(["done"]):
                return
            n = len(self.gens) - 1
            self._idle_faults()
            for proc, p in self.procs.items():
                if p.exitcode is not None and proc not in self.dead and not self.store.check(["done"]):
                    self._mark_dead(proc)
                    if proc in self.layout.procs:
                        self._reconfigure(f"process {proc} died")
                        break
            else:
                if int(self.store.add(f"g{n}/left", 0)) > 0:
                    if not self._repair_at_boundary():
                        self._reconfigure("a process lost a peer")
                elif self._hung():
                    self._reconfigure("a process hung")
            time.sleep(0.02)

    def _read_log(self) -> None:
        count = int(self.store.add("log/count", 0))
        while len(self.records) < count:
            key = f"log/{len(self.records)}"
            if not self.store.check([key]):
                break  # counted but not written yet
            rec = json.loads(self.store.get(key))
            gen = self.gens[rec["generation"]]
            spec = gen.layout.spec
            rec["replicas"] = [
                [
                    rec["consumed"] + spec.first_sequence(r),
                    rec["consumed"] + spec.first_sequence(r) + rep.micro_batches * spec.micro_batch,
                ]
                for r, rep in enumerate(spec.replicas)
                if rep.cp_rank == 0
            ]
            self.records.append(rec)
        self._finish_events()

    def _effective(self) -> list[dict]:
        return [r for r in self.records if not r.get("lost")]

    def _committed(self) -> int:
        """Steps whose updates the state holds: the next step to run."""
        eff = self._effective()
        return eff[-1]["step"] + 1 if eff else 0

    def _hung(self) -> bool:
        """Kill the processes that hang (outside any collective while the others wait inside one,
        with no progress anywhere for ``timeout_s``); True if one was killed. When none waits
        inside one (a layout of one process, or every process hung) and no collective was
        entered and no step committed for twice ``timeout_s``, they all hang: a step of this
        tiny model takes far less than a collective's timeout. Only once every rank has its state
        in place: before, a process still booting (spawned, importing torch on a busy machine)
        looks the same; one that hangs there is killed by ``_reconfigure`` once its peers time out."""
        now, procs = time.monotonic(), self.layout.procs
        for p in procs:
            if self.progress[3 * p + 1] != self._progress_seen[p]:
                self._progress_seen[p], self._progress_changed[p] = self.progress[3 * p + 1], now
        if len(self.records) != self._records_seen:  # a committed step is progress too
            self._records_seen, self._progress_changed = len(self.records), [now] * self.total
        if not self._in_place:  # and so is the layout's state in place: booting and carrying are done
            n = len(self.gens) - 1
            self._in_place = all(self.store.check([f"g{n}/times/{r}"]) for r in range(len(procs)))
            if self._in_place:
                self._progress_changed = [now] * self.total
        still = now - max(self._progress_changed[p] for p in procs)
        if still <= self.cfg.timeout_s or not self._in_place:
            return False  # a process booting or carrying is outside collectives, not hung
        outside = [p for p in procs if self.progress[3 * p + 1] == self.progress[3 * p + 2]]
        culprits = outside if outside and len(outside) < len(procs) else []
        if len(outside) == len(procs) and still > 2 * self.cfg.timeout_s:
            culprits = outside
        for p in culprits:
            self._kill(p, f"it hung: no progress for {still:.0f} s outside any collective")
        return bool(culprits)

    def _error_of(self, proc: int) -> str:
        """What process ``proc`` said before it died, or how it died."""
        path = Path(self.err_dir, f"{proc}.txt")
        if path.exists():
            return path.read_text()
        code = self.procs[proc].exitcode
        return "still running" if code is None else f"exit code {code}"

    def _kill(self, proc: int, why: str = "") -> None:
        """Kill ``proc`` (``why``: what it did that it had to be killed, e.g. it hung)."""
        self.procs[proc].kill()
        self.procs[proc].join(5)
        self._mark_dead(proc, why)

    def _injected(self, proc: int) -> bool:
        """Whether the death of ``proc`` was an injected fault: one fired in its latest incarnation
        (``fail/<proc>``, written by the fault itself or by ``_idle_faults`` before it kills)."""
        key = f"fail/{proc}"
        if not self.store.check([key]):
            return False
        return json.loads(self.store.get(key))["t"] >= self._spawned_t.get(proc, 0.0)

    def _mark_dead(self, proc: int, why: str = "") -> None:
        """Count ``proc`` as dead. A death that no --fail injected is the executor's own bug (or
        the machine's): recovering around it would pass a run that is wrong, so the run fails,
        naming the process and its error."""
        self.dead.add(proc)
        if not self._injected(proc):
            said = why or self._error_of(proc)
            raise RecoveryFailure(
                f"process {proc} died of its own error, not of an injected --fail ({said}); a live run recovers "
                "only from the failures it injects, so this run fails"
            )

    def _idle_faults(self) -> None:
        """A fault of a process outside the layout (idle) fires when its step is reached. A
        repaired process waiting for its step to rejoin is not idle: its fault in that step
        fires in the step, once it is back."""
        step = self._committed()
        for f in self.cfg.faults:
            waiting = f.proc in self._restarted and any(r.proc == f.proc and r.step == f.step for r in self.repairs)
            if f.how == "carry" or waiting:
                continue
            if f.step <= step and f.proc not in self.layout.procs and f.proc not in self.dead:
                if not self.store.check([f"fired/{f.proc}/{f.step}"]):
                    self.store.set(f"fired/{f.proc}/{f.step}", "1")
                    self.store.set(f"fail/{f.proc}", json.dumps({"t": time.time(), "how": "kill", "step": f.step}))
                    self._kill(f.proc)
                    self.slots = [None if s == f.proc else s for s in self.slots]
                    self._idle_event(f.proc, step)

    def _idle_event(self, proc: int, step: int) -> None:
        """The timeline's event for an idle process that died: nothing runs on it, so nothing is
        re-planned, moved or redone (every part 0; ``recovery_costs`` leaves it out)."""
        event = {
            "step": step,
            "event": "idle failure",
            "cause": f"idle process {proc} died",
            "procs": [proc],
            "generation": len(self.gens) - 1,
            "layout": self.layout.describe(),
            "batch": self.layout.batch,
            "source": "memory",
            "note": "the process was idle: the layout does not change",
            "bytes_moved": 0,
            "redo_from": step,
            "redo_to": step,
        }
        self.timeline.append(event | dict.fromkeys(PARTS, 0.0) | {"total_s": 0.0})

    # ---- repairs ----------------------------------------------------------------------------
    # A repair happens at its step exactly: every generation that runs through that step is told
    # to stop before it (``g<n>/go/<step>`` = "stop", armed when the generation is published), and
    # the repaired process is started as soon as its predecessor is dead, so that it has booted
    # by then (the job waits for it at the boundary if not).
    def _arm_repair(self, gen: Generation) -> None:
        for rep in self.repairs:
            if gen.start_step <= rep.step < self.cfg.steps:
                self.store.compare_set(f"g{gen.number}/go/{rep.step}", "", "stop")
                return  # the earliest; the generation after it arms the next

    def _start_repairs(self) -> None:
        for rep in self.repairs:
            if rep.proc in self.dead and rep.proc not in self._restarted:
                self.store.delete_key(f"ready/{rep.proc}")
                self._restarted.add(rep.proc)
                self._spawn(rep.proc)

    def _repair_at_boundary(self) -> bool:
        """If the layout stopped before a repair's step, carry the repair out; True if so."""
        n, k = len(self.gens) - 1, self._committed()
        rep = next((r for r in self.repairs if r.step == k), None)
        if rep is None or self.store.compare_set(f"g{n}/go/{k}", "", "stop") != b"stop":
            return False
        self._start_repairs()
        deadline = time.monotonic() + self.cfg.timeout_s + 60
        while not self.store.check([f"ready/{rep.proc}"]):
            if time.monotonic() > deadline or self.procs[rep.proc].exitcode is not None:
                raise RecoveryFailure(f"repaired process {rep.proc} did not start: {self._error_of(rep.proc)}")
            time.sleep(0.02)
        self.repairs.remove(rep)
        self._restarted.discard(rep.proc)
        self._reconfigure(f"process {rep.proc} repaired", repaired=(rep.proc,), boundary=k)
        return True

    # ---- the re-plan ------------------------------------------------------------------------
    def _reconfigure(self, cause: str, repaired: tuple[int, ...] = (), boundary: int | None = None) -> None:
        t_notice = time.time()
        gen = self.gens[-1]
        n = gen.number
        left = self._await_leavers(gen)
        t_agree = time.time()
        last = max(left, key=lambda p: left[p]["t"], default=None)
        self._read_log()
        self._cut_short(n, t_notice)
        fails = [json.loads(self.store.get(f"fail/{p}")) for p in sorted(self.dead) if self.store.check([f"fail/{p}"])]
        failed_now = sorted(p for p in self.dead if p in gen.layout.procs or p in self.slots)
        self.slots = [None if s in self.dead else s for s in self.slots]
        for p in repaired:
            if p < len(self.slots) and self.slots[p] is None:  # a repaired spare (no base slot) comes back idle
                self.slots[p] = p
        alive = frozenset(p for p in self.procs if p not in self.dead)
        t0 = time.perf_counter()
        layout = self.replanner.relayout(tuple(self.slots), alive, self.policy)
        replan_s = time.perf_counter() - t0
        self.slots = list(layout.slots)
        if layout.spec is None:
            # a process that crashed (not an injected fault) says why: often the reason all died
            said = [f"process {p}: {self._error_of(p)}" for p in failed_now if Path(self.err_dir, f"{p}.txt").exists()]
            why = f" ({said[0]}{' and others' if len(said) > 1 else ''})" if said else ""
            raise RecoveryFailure(f"{cause}{why}: no replica can run any more under --policy {self.policy}")
        # the committed state is held in gen n's layout once every rank of it has its state in place
        ranks = range(gen.layout.spec.world_size)
        if all(self.store.check([f"g{n}/times/{r}"]) for r in ranks):
            self.state_gen = n
        self._check_fruitless(n, bool(failed_now or repaired))
        interrupted = self._committed()
        start, consumed, source, ckpt, note, moves = self._state_source(layout)
        held = None if self.state_gen is None else self.gens[self.state_gen]
        previous = (self.state_gen, held.layout.spec, held.layout.procs) if source == "memory" else None
        self._publish(Generation(n + 1, layout, start, consumed, source, ckpt, previous))
        t_fail = min((f["t"] for f in fails if f["t"] >= (self._t_last or 0)), default=t_notice)
        event = {
            "step": interrupted if boundary is None else boundary,
            "event": "repair" if repaired else ("restart" if self.policy == "restart" else "failure"),
            "cause": cause,
            "procs": list(repaired) or failed_now,
            "generation": n + 1,
            "layout": layout.describe(),
            "batch": layout.batch,
            "source": source,
            "note": note,
            # why each replica that changed runs as it does (the Replanner's reasons): e.g. dropped for memory
            "replicas": [
                f"replica {i} {x.status}: {x.reason}" for i, x in enumerate(layout.replicas) if x.status != "healthy"
            ],
            "detect_s": 0.0 if repaired else max(0.0, t_notice - t_fail),
            "agree_s": t_agree - t_notice,
            "replan_s": replan_s,
            "bytes_moved": 0 if moves is None else moves.bytes_moved,
            "last_to_leave": None if last is None else {"proc": last, "why": left[last]["why"]},
            "redo_from": start,
            "redo_to": interrupted if boundary is None else boundary,
        }
        self._t_last = t_notice
        self._start_repairs()
        self.timeline.append(event)
        self.pending.append(event)

    def _await_leavers(self, gen: Generation) -> dict[int, dict]:
        """Abort generation ``gen`` and wait until each live process of it has left it or died;
        what each survivor said. A process is killed as hung only when it shows it: its state in
        place, outside any collective and without progress for the collective timeout (counted
        from before the abort, so a hang the survivors timed out on is not waited for again). A
        process still inside a collective, or making progress, is waiting on a peer or working:
        it is given a second timeout before it is taken for hung too."""
        n = gen.number
        self.store.set(f"g{n}/abort", "1")
        ranks = {p: r for r, p in enumerate(gen.layout.procs)}
        pending = {p for p in gen.layout.procs if p not in self.dead}
        seen = {p: (self.progress[3 * p + 1], self.progress[3 * p + 2]) for p in pending}
        since = {p: self._progress_changed[p] for p in pending}
        start = time.monotonic()
        while pending:
            now = time.monotonic()
            for p in list(pending):
                if self.procs[p].exitcode is not None:
                    pending.discard(p)
                    self._mark_dead(p)
                elif self.store.check([f"g{n}/left/{p}"]):
                    pending.discard(p)
                    continue
                entered, left = self.progress[3 * p + 1], self.progress[3 * p + 2]
                if (entered, left) != seen.get(p):
                    seen[p], since[p] = (entered, left), now
                still = now - since[p]
                in_place = self.store.check([f"g{n}/times/{ranks[p]}"])
                hung = in_place and entered == left and still > self.cfg.timeout_s
                if p in pending and (hung or now - start > 2 * self.cfg.timeout_s + 10):
                    pending.discard(p)
                    self._kill(p, f"it hung: no progress for {still:.0f} s after its generation was aborted")
            time.sleep(0.005)
        keys = {p: f"g{n}/left/{p}" for p in gen.layout.procs if p not in self.dead}
        return {p: json.loads(self.store.get(k)) for p, k in keys.items() if self.store.check([k])}

    def _state_source(self, layout: Layout):
        """Where the next layout's state comes from, and from which step it runs: (start step,
        samples consumed before it, source, checkpoint step, note, the move plan). From memory when
        every row has a live up-to-date holder; else (and always under restart) from the last
        complete checkpoint, or the initial weights when there is none; the committed steps after
        it are marked lost."""
        from ntp_planner.executor import checkpoint
        from ntp_planner.executor.elastic import handover

        held = None if self.state_gen is None else self.gens[self.state_gen]
        start, consumed, source, ckpt, note, moves = self._committed(), self._consumed(), "memory", None, "", None
        if held is None:
            return 0, 0, "init", None, "no layout had its state in place yet, so from the initial weights", None
        if self.policy == "restart":
            source = "checkpoint"
        else:
            moves = handover.plan(held.layout.spec, held.layout.procs, layout.spec, layout.procs)
            if moves.missing:
                source = "checkpoint"
                names = sorted({m[0] for m in moves.missing})
                note = f"no live copy of rows of {len(names)} parameters ({names[0]}, ...): "
        if source == "checkpoint":
            ckpt = checkpoint.latest(self.cfg.checkpoint_dir) if self.cfg.checkpoint_dir else None
            if ckpt is None:
                start, consumed, source = 0, 0, "init"
                note += "no checkpoint yet, so from the initial weights"
            else:
                meta = checkpoint.info(self.cfg.checkpoint_dir, ckpt)
                start, consumed = ckpt + 1, int(meta["consumed_samples"])
                note += f"from the checkpoint of step {ckpt}"
            for r in self.records:
                if not r.get("lost") and r["step"] >= start:
                    r["lost"] = True
                    self.lost.append(r)
        return start, consumed, source, ckpt, note, moves

    _t_last: float | None = None

    def _check_fruitless(self, n: int, lost_one: bool) -> None:
        """Processes that keep leaving generations with nobody failed and no step committed (a
        collective timeout too short for this machine, say) would re-plan forever: the third
        such re-plan in a row ends the run, with the reasons they gave."""
        committed = self._committed()
        fruitless = not lost_one and committed == getattr(self, "_committed_before", None)
        self._fruitless = self._fruitless + 1 if fruitless else 0
        self._committed_before = committed
        if self._fruitless >= 3:
            keys = [f"g{n}/left/{p}" for p in self.gens[n].layout.procs]
            why = sorted({json.loads(self.store.get(k))["why"] for k in keys if self.store.check([k])})
            raise RecoveryFailure(
                f"processes left {self._fruitless + 1} layouts in a row with none failed and no step committed "
                f"({why[0] if why else 'no reason given'}); a --timeout of {self.cfg.timeout_s:g} s may be too "
                "short for this machine"
            )

    def _consumed(self) -> int:
        eff = self._effective()
        return eff[-1]["consumed"] + eff[-1]["batch"] if eff else 0

    def _cut_short(self, n: int, t_notice: float) -> None:
        """Close the events whose generation ``n`` fails before it finished their recovery (a
        process died while the state moved, or before the step was redone): each part is what the
        ranks that got there reported, the regroup of those that did not lasts until the failure
        was noticed, and the redo is the time from the state in place until then."""
        for event in [e for e in self.pending if e["generation"] == n]:
            keys = [f"g{n}/times/{r}" for r in range(self.gens[n].layout.spec.world_size)]
            times = [json.loads(self.store.get(k)) for k in keys if self.store.check([k])]
            complete = len(times) == len(keys)
            start = self._published[n]
            event["regroup_s"] = max(t["regroup_s"] for t in times) if complete else t_notice - start
            event["move_state_s"] = max((t["move_s"] for t in times), default=0.0) if complete else 0.0
            ready = max(t["t"] for t in times) if complete else t_notice
            event["redo_s"] = 0.0 if event["event"] == "repair" else max(0.0, t_notice - ready)
            event["total_s"] = sum(event[p] for p in PARTS)
            event["note"] = (event["note"] + "; " if event["note"] else "") + "cut short by the next failure"
            self.pending.remove(event)

    def _finish_events(self) -> None:
        """Fill in an event's regroup, move and redo times once its generation has redone the
        steps the failure cost."""
        for event in list(self.pending):
            n = event["generation"]
            spec = self.gens[n].layout.spec
            keys = [f"g{n}/times/{r}" for r in range(spec.world_size)]
            if not all(self.store.check([k]) for k in keys):
                continue
            times = [json.loads(self.store.get(k)) for k in keys]
            event["regroup_s"] = max(t["regroup_s"] for t in times)
            event["move_state_s"] = max(t["move_s"] for t in times)
            ready = max(t["t"] for t in times)
            target = event["redo_to"]
            if event["event"] == "repair" or target >= self.cfg.steps:
                event["redo_s"] = 0.0  # stopped at a step boundary, or every step was done: nothing to redo
            else:
                done = [r for r in self.records if r["generation"] == n and r["step"] == target]
                if not done:
                    continue
                event["redo_s"] = max(0.0, done[0]["t"] - ready)
            event["total_s"] = sum(event[p] for p in PARTS)
            self.pending.remove(event)


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


def live_spec(spec):
    """The run a live recovery trains: the plan's, at its ZeRO level and ep (state moves shard by
    shard, ``handover``); only mixed precision is refused (its fp32 masters are not carried)."""
    if spec.dtype in ("bfloat16", "float16"):
        raise ValueError(f"live recovery runs in float32 or float64, not {spec.dtype}; use --dtype float32")
    return spec


def launch_live(plan, shrunk, policy: str = "ntp", faults=(), repairs=(), spares: int = 0, checkpoint_every: int = 0,
                checkpoint_dir: str = "", backend: str = "gloo", timeout_s: float = 60.0, tick=None,
                worker_init=None):  # fmt: skip
    """Run ``shrunk`` (of ``plan``) live with injected ``faults`` and ``repairs``, recovering under
    ``policy``; compare the final state with one process fed the samples the run committed.
    ``worker_init()`` runs in every process started, as ``launch``'s. Returns (``launch.Result``,
    ``LiveRun``)."""
    from ntp_planner.executor import checkpoint
    from ntp_planner.executor.check.holders import compare, loss_errors, non_finite_losses
    from ntp_planner.executor.model.batch import stream_draws
    from ntp_planner.executor.model.reference import zero_gradient_params
    from ntp_planner.executor.train.launch import Result
    from ntp_planner.executor.train.runtime import reference_run

    if checkpoint_dir and checkpoint.complete_steps(checkpoint_dir):
        # a fallback loads the newest complete checkpoint there: another run's would pass for this one's
        raise ValueError(f"checkpoint folder {checkpoint_dir} already holds checkpoints; give an empty one")
    shrunk = replace(shrunk, spec=live_spec(shrunk.spec))
    spec = shrunk.spec
    cfg = LiveConfig(
        base=spec,
        steps=spec.steps,
        backend=backend,
        timeout_s=timeout_s,
        faults=tuple(faults),
        checkpoint_every=checkpoint_every,
        checkpoint_dir=checkpoint_dir,
    )
    run = Coordinator(RunReplanner(plan, shrunk, spares), policy, cfg, spares, tuple(repairs), tick, worker_init).run()
    grad_step = -1 if run.grad_step is None else run.grad_step  # -1: no step's gradients
    # the reference draws its samples from the stream itself; the run's log must be that stream
    draws, stream_problems = stream_draws(run.steps, spec.steps, run.batches)
    ref = reference_run(spec, draws, grad_step)
    losses = [r["loss"] for r in run.steps]
    zero = zero_gradient_params(spec.cfg)
    noise = frozenset(k for k in ref["grads"] if k.rsplit(".", 1)[-1] in zero)
    pairs = zip(run.steps, run.steps[1:], strict=False)
    gaps = [b["t"] - a["t"] for a, b in pairs if a["generation"] == b["generation"]]
    held = compare(run.holders, ref["params"], ref["grads"], noise)
    held["problems"] = stream_problems + non_finite_losses(losses, ref["losses"]) + held["problems"]
    result = Result(
        losses=losses,
        reference_losses=ref["losses"],
        max_rel_error_loss=loss_errors(losses, ref["losses"]),
        wall_s=run.wall_s,
        step_time_s=sum(gaps) / len(gaps) if gaps else 0.0,
        **held,
    )
    return result, run
