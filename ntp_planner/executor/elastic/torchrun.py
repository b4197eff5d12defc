"""Live recovery under torchrun, across rendezvous nodes.

``torchrun --nnodes N --nproc-per-node K --rdzv-backend c10d ... ntp validate PLAN --fail ...``
starts N x K workers. A worker here is not itself a live process: it is that process's *shell*.
It forks the live process (``hosts.live_process``), watches it, and tells the coordinator through
the store what becomes of it (``hosts.StoreHosts``'s keys: a heartbeat, the child's exit code,
its progress through collectives; it kills its child when asked). The reason is torchrun's agent:
when one of its workers fails it stops all the others on its node (or restarts the whole worker
group, on every node, with ``--max-restarts``), which would throw away the survivors' state that
live recovery keeps. A shell whose child was killed by a ``--fail`` stays up and healthy, so the
agent never acts; every shell exits 0 when the run is over.

The store is the one torchrun's agents share with their workers (``MASTER_ADDR:MASTER_PORT``,
``TORCHELASTIC_USE_AGENT_STORE``), hosted by the agent of rendezvous rank 0, under a
``PrefixStore`` per run and restart (``prefix``). The coordinator runs beside it, in rank 0's
shell (a thread there keeps up the shell's own duties): the agent hosting the store outlives any
of its workers' children, so a process that dies takes neither the membership nor the
coordinator with it.

Losing a node: when a whole agent other than rank 0's is lost (its agent, shells and processes
killed), its shells' heartbeats stop; after ``hosts.HOST_LOST_S`` its processes count as dead,
lost with their host, and the survivors re-plan as for any failure; the timeline names the node
(``lost_hosts``). Losing rank 0's node loses the store, and the membership with it: every other
shell's next store operation fails, and it kills its process and ends with one sentence saying
so (a coordinator that outlived node 0 would need a store that does too: torchft's lighthouse
or etcd on a host of its own). The node hosting the rendezvous endpoint's store cannot be lost
either: torchrun's agents themselves fail without it. Rendezvous ranks follow the agents'
addresses, sorted (then their pids), so the two are one node when the endpoint's host sorts first.
torchrun's surviving agents then wait in their exit barrier for the lost agent (five minutes,
torchrun's default) before they exit; the report is out before.

Repair: a new process joins the run (``join``): ``ntp validate PLAN --join HOST:PORT/RUN_ID``,
started anywhere that reaches the store (rank 0 prints the address). It asks in the store, the
coordinator answers with a failed process's number and the next step boundary, and the joiner
becomes that process's shell. A new torchrun agent cannot do it: an agent that joins a running
rendezvous makes every other agent restart its workers, the opposite of live recovery.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import socket
import threading
import time
from datetime import timedelta

from ntp_planner.executor.elastic.hosts import BEAT_S
from ntp_planner.executor.parallel.comm import Terminated, raise_terminated

JOIN_WAIT_S = 300.0  # how long a joiner waits for the coordinator's answer (it waits for a failure too)
STARTUP_S = 60.0  # extra patience for every worker to start


class StoreLost(RuntimeError):
    """The store (and with it the run's membership) is gone: its host, rank 0's node, was lost."""


def prefix(run_id: str, restart: str = "0") -> str:
    """The keys of one run (and torchrun restart) in the shared store: 'ntp-live/<run>/<restart>/'."""
    return f"ntp-live/{run_id}/{restart}/"


def connect(addr: str, port: int, run_id: str, restart: str, timeout_s: float):
    import torch.distributed as dist

    base = dist.TCPStore(addr, port, is_master=False, timeout=timedelta(seconds=timeout_s))
    return dist.PrefixStore(prefix(run_id, restart), base)


class Shell:
    """The torchrun worker that hosts live process ``proc``: it forks it and reports on it."""

    def __init__(self, where: tuple[str, int, str, str], proc: int, cfg, total: int, node: int):
        self.where, self.proc, self.cfg, self.total, self.node = where, proc, cfg, total, node
        self.child = None

    def _store(self):
        addr, port, run, restart = self.where
        return connect(addr, port, run, restart, min(self.cfg.timeout_s + 60, 300.0))

    def start(self, first_generation: int) -> None:
        """Fork the live process. ``fork``, not the executor's forkserver: this worker has imported
        torch already and started no thread yet, and a forkserver would import it a second time
        in every shell (seconds of CPU each on a small machine)."""
        import multiprocessing as mp

        from ntp_planner.executor.elastic.hosts import live_process

        os.environ.setdefault("NTP_AGENT_PID", str(os.getppid()))  # what a ``host`` fault kills: this node
        ctx = mp.get_context("fork")
        self.progress = ctx.Array("q", 3 * self.total, lock=False)
        addr, port, run, restart = self.where
        args = (self.proc, addr, port, prefix(run, restart), self.cfg, self.progress, first_generation, None)
        self.child = ctx.Process(target=live_process, args=args, daemon=True)
        self.child.start()
        store = self._store()
        info = {"node": self.node, "host": socket.gethostname(), "agent_pid": os.getppid(), "pid": self.child.pid}
        store.set(f"host/{self.proc}/node", json.dumps(info))
        store.set(f"host/{self.proc}/started", json.dumps(time.time()))
        store.add(f"host/{self.proc}/beat", 1)

    def serve(self) -> None:
        """Beat, mirror the child's progress, kill it when asked, report its exit; until ``end``.
        torchrun's agent SIGTERMs its workers when it fails itself (its rendezvous store gone with
        node 0, say), often before this loop's next store operation: the signal is taken as a
        failed store operation, so that the shell still says what happened."""
        store, p = self._store(), self.proc
        last, beat, exited = None, 0.0, False
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, raise_terminated)
        try:
            while not store.check(["end"]):
                now = time.monotonic()
                if now - beat >= BEAT_S:
                    store.add(f"host/{p}/beat", 1)
                    beat = now
                counts = [self.progress[3 * p + i] for i in range(3)]
                if counts != last:
                    store.set(f"host/{p}/progress", json.dumps(counts))
                    last = counts
                if store.check([f"host/{p}/kill"]):
                    store.delete_key(f"host/{p}/kill")
                    self.child.kill()
                    self.child.join(5)
                if self.child.exitcode is not None and not exited:
                    store.set(f"host/{p}/exit", json.dumps(self.child.exitcode))
                    exited = True
                time.sleep(0.05)  # the coordinator's hang detection works in seconds
        except (RuntimeError, OSError) as exc:  # a store operation failed: the store's host is gone
            self.stop()
            if isinstance(exc, Terminated) and _store_alive(self.where):
                raise StoreLost(f"process {p}'s shell was stopped by torchrun's agent; the run cannot go on") from None
            addr, port, *_ = self.where
            raise StoreLost(
                f"process {p}'s shell lost the store at {addr}:{port} ({str(exc).splitlines()[0][:120]}): "
                "rank 0's node, which hosts it and the coordinator, is gone, and the run's membership with it; "
                "the run cannot go on"
            ) from None
        self.child.join(10)
        self.stop()

    def stop(self) -> None:
        if self.child is not None and self.child.is_alive():
            self.child.kill()
            self.child.join(5)


def _store_alive(where) -> bool:
    """Whether the store still answers (within 2 s: a refused connection is retried until the timeout)."""
    try:
        connect(*where, 2.0).check(["end"])
    except (RuntimeError, OSError):
        return False
    return True


def _where() -> tuple[str, int, str, str]:
    return (
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        os.environ.get("TORCHELASTIC_RUN_ID", "none"),
        os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"),
    )


def run_live_torchrun(plan, shrunk, policy, faults, spares: int, every: int, folder: str, timeout_s: float, say=None):
    """Be torchrun worker $RANK of a live run: the shell of process $RANK, and on rank 0 the
    coordinator too. Rank 0 returns (``launch.Result``, ``LiveRun``), the others None.
    ``say(line)``: where rank 0 tells how a repair joins."""
    from ntp_planner.executor.elastic.coordinator import Coordinator
    from ntp_planner.executor.elastic.hosts import StoreHosts
    from ntp_planner.executor.elastic.launch import compare_live, live_config
    from ntp_planner.executor.elastic.relayout import RunReplanner

    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        raise ValueError("live recovery under torchrun needs its agent's store (torchrun's elastic agent)")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    shrunk, cfg = live_config(shrunk, faults, every, folder, "gloo", timeout_s)
    where = _where()
    shell = Shell(where, rank, cfg, world, int(os.environ.get("GROUP_RANK", "0")))
    shell.start(0)
    if rank != 0:
        shell.serve()
        return None
    store = connect(where[0], where[1], where[2], where[3], timeout_s + 60)
    store.set("config", pickle.dumps((cfg, world)))  # what a joiner needs to become a process of the run
    if say is not None:
        say(f"live membership on torchrun's store {where[0]}:{where[1]}; a repair joins with: "
            f"ntp validate PLAN --join {where[0]}:{where[1]}/{where[2]}")  # fmt: skip
    duty = threading.Thread(target=_serve_quietly, args=(shell,), daemon=True)
    duty.start()
    replanner = RunReplanner(plan, shrunk, spares)
    hosts = StoreHosts(store, range(world))
    try:
        _await_shells(store, world, timeout_s + STARTUP_S)
        run = Coordinator(replanner, policy, cfg, store, hosts, spares).run()
    finally:
        store.set("end", "1")
        duty.join(15)
    return compare_live(shrunk.spec, run), run


def _await_shells(store, world: int, wait_s: float) -> None:
    """Wait until every worker's shell has started its process: a worker still importing torch
    has no heartbeat yet and would pass for a lost host."""
    deadline = time.monotonic() + wait_s
    while not all(store.check([f"host/{p}/started"]) for p in range(world)):
        if time.monotonic() > deadline:
            late = [p for p in range(world) if not store.check([f"host/{p}/started"])]
            raise ValueError(f"torchrun workers {late} did not start their processes within {wait_s:g} s")
        time.sleep(0.05)


def _serve_quietly(shell: Shell) -> None:
    try:
        shell.serve()
    except StoreLost:
        pass  # rank 0 hosts the coordinator beside the store: it says what happened


def join(endpoint: str) -> int:
    """A repair: join the live run whose store is at ``endpoint`` ('HOST:PORT/RUN_ID'), become
    the failed process the coordinator gives back, and serve until the run is over. Returns that
    process's number; raises ValueError when the run has no process to give back."""
    host_port, _, run_id = endpoint.partition("/")
    addr, _, port = host_port.rpartition(":")
    store = connect(addr, int(port), run_id or "none", "0", 60.0)
    cfg, total = pickle.loads(store.get("config"))
    i = int(store.add("join/count", 1)) - 1
    deadline = time.monotonic() + JOIN_WAIT_S
    while not store.check([f"join/{i}/proc"]):
        if time.monotonic() > deadline:
            raise ValueError(f"the live run at {endpoint} did not answer within {JOIN_WAIT_S:g} s")
        time.sleep(0.05)
    proc, first_generation = json.loads(store.get(f"join/{i}/proc"))
    if proc < 0:
        raise ValueError(f"the live run at {endpoint} has no failed process to give back, or no step left to join")
    os.environ["NTP_AGENT_PID"] = str(os.getpid())  # a joiner has no agent: its host is itself
    shell = Shell((addr, int(port), run_id or "none", "0"), proc, cfg, total, -1)
    shell.start(first_generation)
    shell.serve()
    return proc
