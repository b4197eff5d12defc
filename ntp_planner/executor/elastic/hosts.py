"""Where a live run's processes live, as the coordinator sees them: whether each is up, its
progress through collectives (for hang detection), and how to kill or start one.

Two hosts of the one membership protocol (``membership``):

* ``LocalHosts``: the coordinator spawned every process on this host (``ntp validate --fail``);
  it reads their exit codes and a shared progress array directly.
* ``StoreHosts``: under torchrun each process is the child of a torchrun worker (its *shell*,
  ``torchrun.Shell``) on some node; the shell publishes its child's exit code and progress in the
  store, beats a heartbeat, and kills its child when asked. A whole node lost (its agent, shells
  and children killed) shows as heartbeats that stop: its processes count as dead, lost with
  their host (``lost``), which is a failure to recover from, not a bug of ours.

Store keys (``host/<p>/...``, p a process number): ``beat`` a counter the shell adds to every
``BEAT_S``; ``exit`` the child's exit code; ``progress`` [step, collectives entered, left];
``kill`` a request; ``node`` which node and agent hosts it; ``started`` when its child started.
"""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta

BEAT_S = 0.25  # a shell's heartbeat period
HOST_LOST_S = 6.0  # a host whose heartbeat has not moved for this long is lost (a loaded 2-core box stalls ~1 s)


def live_process(proc: int, addr: str, port: int, prefix: str, cfg, progress, first_generation: int, init) -> None:
    """A live process's whole life (the target of every spawn): join the store, ``serve``, and on
    an error of its own say it in one line in the store (``membership.say_error``) and die; the
    others recover. ``init``: the launcher's ``worker_init`` hook (a test's planted bug), run
    first, in every process started (repairs too)."""
    import torch.distributed as dist

    from ntp_planner.executor.elastic import membership as ms
    from ntp_planner.executor.elastic.worker import serve
    from ntp_planner.executor.train.launch import error_line

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if init is not None:
        init()
    store = None
    try:
        store = dist.TCPStore(addr, port, is_master=False, timeout=timedelta(seconds=cfg.timeout_s + 60))
        store = dist.PrefixStore(prefix, store) if prefix else store
        serve(proc, store, cfg, progress, first_generation)
    except BaseException as exc:  # this process is broken: say why and die; the others recover
        try:
            if store is not None:
                ms.say_error(store, proc, error_line(exc))
        finally:
            os._exit(1)
    os._exit(0)


class LocalHosts:
    """The processes of a one-host live run, spawned by the coordinator's launcher. ``addr``,
    ``port``: the launcher's store; ``total``: processes, spares included."""

    def __init__(self, total: int, cfg, addr: str, port: int, worker_init=None):
        from ntp_planner.executor.train.processes import context

        self.ctx, self.cfg, self.addr, self.port, self.init = context(), cfg, addr, port, worker_init
        self.progress = self.ctx.Array("q", 3 * total, lock=False)
        self.procs: dict[int, object] = {}
        self._started: dict[int, float] = {}

    def start(self, proc: int, first_generation: int) -> None:
        """Start process ``proc``; it joins at ``first_generation`` (a repair: never an old one)."""
        args = (proc, self.addr, self.port, "", self.cfg, self.progress, first_generation, self.init)
        p = self.ctx.Process(target=live_process, args=args, daemon=True)
        self._started[proc] = time.time()
        p.start()
        self.procs[proc] = p

    def started_t(self, proc: int) -> float:
        return self._started.get(proc, 0.0)

    def exitcode(self, proc: int) -> int | None:
        return self.procs[proc].exitcode

    def progress_of(self, proc: int) -> tuple[int, int]:
        """Collectives ``proc`` has entered and left in its current generation."""
        return self.progress[3 * proc + 1], self.progress[3 * proc + 2]

    def reset_progress(self) -> None:
        """A new generation: every process has left the old one, its counts start again."""
        for i in range(len(self.progress)):
            self.progress[i] = 0

    def kill(self, proc: int) -> None:
        self.procs[proc].kill()
        self.procs[proc].join(5)

    def lost(self, proc: int) -> str | None:
        return None  # the launcher's host is every process's: it is never lost without the run

    def joins(self) -> list[int]:
        return []  # a process on this host is started by the coordinator, never joins on its own

    def stop_all(self) -> None:
        deadline = time.monotonic() + 10
        for p in self.procs.values():
            p.join(max(0.0, deadline - time.monotonic()))
        for p in self.procs.values():
            if p.is_alive():
                p.kill()
                p.join(5)


class StoreHosts:
    """The processes of a torchrun live run, seen through the keys their shells publish."""

    def __init__(self, store, procs):
        self.store = store
        self.procs = {p: None for p in procs}
        self._beat: dict[int, tuple[int, float]] = {}  # proc -> (last beat seen, when it changed)

    def _get(self, proc: int, name: str):
        key = f"host/{proc}/{name}"
        return json.loads(self.store.get(key)) if self.store.check([key]) else None

    def start(self, proc: int, first_generation: int) -> None:
        self.procs.setdefault(proc, None)  # a joiner starts its own process (``torchrun.join``)

    def started_t(self, proc: int) -> float:
        return self._get(proc, "started") or 0.0

    def exitcode(self, proc: int) -> int | None:
        code = self._get(proc, "exit")
        if code is not None:
            return int(code)
        return -9 if self.lost(proc) else None

    def progress_of(self, proc: int) -> tuple[int, int]:
        got = self._get(proc, "progress") or [0, 0, 0]
        return got[1], got[2]

    def reset_progress(self) -> None:
        pass  # each generation's ``Comm`` counts from 0 again; the shells mirror what it writes

    def kill(self, proc: int) -> None:
        """Ask ``proc``'s shell to kill it; wait (5 s at most) until it has, or its host is lost."""
        self.store.set(f"host/{proc}/kill", "1")
        deadline = time.monotonic() + 5
        while self.exitcode(proc) is None and time.monotonic() < deadline:
            time.sleep(0.02)

    def lost(self, proc: int) -> str | None:
        """Why the host of ``proc`` counts as lost ('node 2 (agent pid 123) lost: ...'), None if not."""
        beat = int(self.store.add(f"host/{proc}/beat", 0))
        now = time.monotonic()
        seen, since = self._beat.get(proc, (None, now))
        if beat != seen:
            self._beat[proc] = (beat, now)
            return None
        if now - since < HOST_LOST_S or self._get(proc, "exit") is not None:
            return None
        # should the shell only have stalled, it kills its process when it wakes: counted dead, it must be
        self.store.set(f"host/{proc}/kill", "1")
        node = self._get(proc, "node") or {}
        return (
            f"node {node.get('node', '?')} (host {node.get('host', '?')}, agent pid {node.get('agent_pid', '?')}) "
            f"lost: no heartbeat from process {proc}'s shell for {now - since:.0f} s"
        )

    def joins(self) -> list[int]:
        """Join requests (``torchrun.join``) not yet answered: their indices."""
        count = int(self.store.add("join/count", 0))
        return [i for i in range(count) if not self.store.check([f"join/{i}/proc"])]

    def answer_join(self, i: int, proc: int, first_generation: int) -> None:
        """Tell joiner ``i`` which process it becomes (-1: none) and the generation it starts at."""
        if proc >= 0:  # the joiner's predecessor's exit is history: it starts now
            self.store.delete_key(f"host/{proc}/exit")
            self.store.delete_key(f"host/{proc}/kill")  # asked of the lost host, not of the joiner
            self.store.set(f"host/{proc}/started", json.dumps(time.time()))
        self.store.set(f"join/{i}/proc", json.dumps([proc, first_generation]))
        if proc >= 0:
            self.procs.setdefault(proc, None)
            self._beat.pop(proc, None)

    def stop_all(self) -> None:
        """The run is over: every shell stops its child and leaves (``end``)."""
        self.store.set("end", "1")
