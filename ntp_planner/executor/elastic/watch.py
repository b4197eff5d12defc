"""Hang detection and the agreement on who left, for the ``Coordinator``.

A process hangs when it makes no progress while outside any collective and the others wait for
it inside one (``hosts.progress_of``: collectives entered and left). Progress is a collective
entered, a step committed, or the layout's state in place (booting and carrying state are done
outside collectives, and are not hangs).
"""

from __future__ import annotations

import time

from ntp_planner.executor.elastic import membership as ms


class Watch:
    """What the coordinator has seen of the current generation's progress."""

    def __init__(self, timeout_s: float, store, hosts, total: int):
        self.timeout_s, self.store, self.hosts, self.total = timeout_s, store, hosts, total
        self.reset(0, 0)

    def reset(self, n: int, records: int) -> None:
        """Generation ``n`` is published; ``records`` steps are committed so far."""
        self.n, self.records = n, records
        self.seen: dict[int, tuple[int, int]] = {}
        self.in_place = False  # whether every rank of the layout has its state in place
        self.changed = [time.monotonic()] * self.total

    def hung(self, procs, records: int) -> list[tuple[int, str]]:
        """The processes of ``procs`` that hang, and why (to be killed). When none waits inside a
        collective (a layout of one process, or every process hung) and no collective was entered
        and no step committed for twice the timeout, they all hang: a step of this tiny model
        takes far less than a collective's timeout. Only once every rank has its state in place:
        before, a process still booting looks the same; one that hangs there is killed by the
        agreement once its peers time out."""
        now = time.monotonic()
        counts = {p: self.hosts.progress_of(p) for p in procs}
        for p in procs:
            if counts[p][0] != self.seen.get(p, (-1, -1))[0]:
                self.seen[p], self.changed[p] = counts[p], now
        if records != self.records:  # a committed step is progress too
            self.records, self.changed = records, [now] * self.total
        if not self.in_place:  # and so is the layout's state in place: booting and carrying are done
            self.in_place = ms.in_place(self.store, self.n, range(len(procs)))
            if self.in_place:
                self.changed = [now] * self.total
        still = now - max(self.changed[p] for p in procs)
        if still <= self.timeout_s or not self.in_place:
            return []  # a process booting or carrying is outside collectives, not hung
        outside = [p for p in procs if counts[p][0] == counts[p][1]]
        culprits = outside if outside and len(outside) < len(procs) else []
        if len(outside) == len(procs) and still > 2 * self.timeout_s:
            culprits = outside
        return [(p, f"it hung: no progress for {still:.0f} s outside any collective") for p in culprits]

    def await_leavers(self, gen, dead: set[int], kill, mark_dead) -> dict[int, dict]:
        """Abort generation ``gen`` and wait until each live process of it has left it or died;
        what each survivor said. A process is killed (``kill(proc, why)``) as hung only when it
        shows it: its state in place, outside any collective and without progress for the
        collective timeout (counted from before the abort, so a hang the survivors timed out on is
        not waited for again). A process still inside a collective, or making progress, is
        waiting on a peer or working: it is given a second timeout before it is taken for hung."""
        n = gen.number
        ms.abort(self.store, n)
        ranks = {p: r for r, p in enumerate(gen.layout.procs)}
        pending = {p for p in gen.layout.procs if p not in dead}
        seen = {p: self.hosts.progress_of(p) for p in pending}
        since = {p: self.changed[p] for p in pending}
        start = time.monotonic()
        while pending:
            now = time.monotonic()
            for p in list(pending):
                if self.hosts.exitcode(p) is not None:
                    pending.discard(p)
                    mark_dead(p)
                    continue
                if ms.has_left(self.store, n, p):
                    pending.discard(p)
                    continue
                counts = self.hosts.progress_of(p)
                if counts != seen.get(p):
                    seen[p], since[p] = counts, now
                still = now - since[p]
                hung = ms.in_place(self.store, n, [ranks[p]]) and counts[0] == counts[1] and still > self.timeout_s
                if hung or now - start > 2 * self.timeout_s + 10:
                    pending.discard(p)
                    kill(p, f"it hung: no progress for {still:.0f} s after its generation was aborted")
            time.sleep(0.005)
        return ms.left_reasons(self.store, n, [p for p in gen.layout.procs if p not in dead])
