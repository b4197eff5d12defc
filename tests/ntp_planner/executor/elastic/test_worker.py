"""A live process's side, without a process group: which exceptions are a lost peer, the fault
hooks (each fires once, a ``sync`` fault only in the gradient sync; ``os.kill`` and ``kill_host``
recorded, never called), the progress view, and a process walking generations it is idle in."""

import os
import signal

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
dist = pytest.importorskip("torch.distributed", reason="torch is not installed")

from types import SimpleNamespace  # noqa: E402

from ntp_planner.executor.elastic import membership as ms  # noqa: E402
from ntp_planner.executor.elastic import worker  # noqa: E402
from ntp_planner.executor.elastic.faults import Fault  # noqa: E402
from ntp_planner.executor.elastic.worker import Generation, InjectedFault, Leave, LiveConfig, is_peer_loss  # noqa: E402
from ntp_planner.executor.spec import TinyConfig, make_spec  # noqa: E402


@pytest.mark.parametrize(
    "exc, lost",
    [
        (RuntimeError("[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:4321"), True),
        (RuntimeError("Timed out waiting 60000ms for recv operation to complete"), True),
        (dist.DistError("a store operation failed"), True),
        (InjectedFault("injected fault in a collective of step 3 (gloo timeout)"), False),  # our own fault
        (Leave("step 3 aborted"), False),
        (ValueError("mat1 and mat2 shapes cannot be multiplied (4x8 and 16x4)"), False),  # a bug of this process
    ],
    ids=["gloo-closed", "timeout", "dist-error", "injected", "leave", "own-bug"],
)
def test_is_peer_loss(exc, lost):
    assert is_peer_loss(exc) is lost


@pytest.fixture
def kills(monkeypatch):
    sent = []
    monkeypatch.setattr(worker.os, "kill", lambda pid, sig: sent.append((pid, sig)))
    return sent


FAULTS = (Fault(1, 3, "raise"), Fault(1, 4, "sync"), Fault(1, 5, "kill"), Fault(2, 3, "carry"), Fault(1, 6, "host"))


def test_no_hook_where_no_fault_of_this_process_fires():
    store = dist.HashStore()
    assert worker._injector(FAULTS, 1, 2, store) is None  # no fault in step 2
    assert worker._injector(FAULTS, 0, 3, store) is None  # another process's
    assert worker._injector(FAULTS, 2, 3, store) is None  # a carry fault fires in the carry, not in a collective


def test_a_raise_fault_raises_in_the_first_collective_once(kills):
    store = dist.HashStore()
    fire = worker._injector(FAULTS, 1, 3, store)
    with pytest.raises(InjectedFault, match=r"^injected fault in a collective of step 3$"):
        fire("tp")
    assert ms.fired(store, 1, 3) and ms.last_fault(store, 1)["how"] == "raise" and kills == []
    assert worker._injector(FAULTS, 1, 3, store) is None  # the step redone after a rollback does not fail again


def test_a_sync_fault_waits_for_the_gradient_sync(kills):
    store = dist.HashStore()
    fire = worker._injector(FAULTS, 1, 4, store)
    assert fire("tp") is None and fire("pp") is None and fire(None) is None
    assert not ms.fired(store, 1, 4) and kills == []
    with pytest.raises(InjectedFault):  # only because the SIGKILL was not delivered here
        fire("dp")
    assert kills == [(os.getpid(), signal.SIGKILL)] and ms.last_fault(store, 1)["step"] == 4


def test_a_kill_fault_sigkills_at_any_collective(kills):
    store = dist.HashStore()
    with pytest.raises(InjectedFault):
        worker._injector(FAULTS, 1, 5, store)(None)
    assert kills == [(os.getpid(), signal.SIGKILL)] and ms.last_fault(store, 1)["how"] == "kill"


def test_a_host_fault_kills_the_agent_named_in_the_environment(monkeypatch, kills):
    lost = []
    monkeypatch.setattr(worker, "kill_host", lost.append)
    monkeypatch.setenv("NTP_AGENT_PID", "4321")
    with pytest.raises(InjectedFault):
        worker._injector(FAULTS, 1, 6, dist.HashStore())("tp")
    monkeypatch.delenv("NTP_AGENT_PID")
    with pytest.raises(InjectedFault):
        worker._injector(FAULTS, 1, 6, dist.HashStore())("tp")
    assert lost == [4321, os.getppid()] and kills == []  # without one: this process's parent (its shell)


def test_a_hang_fault_sleeps_forever(monkeypatch):
    naps = []

    def sleep(s):
        naps.append(s)
        if len(naps) == 3:
            raise KeyboardInterrupt  # out of the test's loop

    monkeypatch.setattr(worker.time, "sleep", sleep)
    fire = worker._injector((Fault(0, 1, "hang"),), 0, 1, dist.HashStore())
    with pytest.raises(KeyboardInterrupt):
        fire("tp")
    assert naps == [3600, 3600, 3600]


def test_a_carry_fault_fires_once(kills):
    store = dist.HashStore()
    worker._fail_in_carry(FAULTS, 2, 4, store)  # another step: nothing
    worker._fail_in_carry(FAULTS, 2, 3, store)
    worker._fail_in_carry(FAULTS, 2, 3, store)
    assert kills == [(os.getpid(), signal.SIGKILL)] and ms.last_fault(store, 2)["how"] == "carry"


def test_the_progress_view_shifts_a_rank_slot_to_its_process():
    progress = [0] * 12
    view = worker._ProcView(progress, proc=3, rank=1)  # rank 1 of this generation is process 3
    view[4], view[5] = 7, 6  # Comm writes rank 1's slots 3 * 1 + 1, + 2; the launcher reads process 3's 10, 11
    assert progress == [0] * 10 + [7, 6] and view[4] == 7


@pytest.fixture
def torch_defaults():
    dtype, threads = torch.get_default_dtype(), torch.get_num_threads()
    yield
    torch.set_default_dtype(dtype)
    torch.set_num_threads(threads)


def test_a_process_walks_the_generations_it_is_idle_in_from_its_first(monkeypatch, torch_defaults):
    spec = make_spec(TinyConfig(), [[4, 4, 4, 4]], [([1], 1)], 1, 4, width=4)
    cfg = LiveConfig(base=spec, steps=2, backend="gloo", timeout_s=1.0)
    idle = SimpleNamespace(spec=spec, procs=(0,))  # process 5 is not in it
    gens = {
        2: Generation(2, idle, 0, 0, "init"),
        3: Generation(3, idle, 1, 4, "memory"),
        4: Generation(4, None, 2, 8, "memory"),
    }
    asked = []
    monkeypatch.setattr(ms, "await_generation", lambda store, n: asked.append(n) or gens[n])
    store = dist.HashStore()
    worker.serve(5, store, cfg, None, first_generation=2)  # a repair: never generation 0 or 1
    assert asked == [2, 3, 4] and ms.is_ready(store, 5)
