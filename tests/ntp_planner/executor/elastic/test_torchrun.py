"""The pieces of live recovery under torchrun that run without torchrun: the store prefix, the
``--join HOST:PORT/RUN_ID`` endpoint and the coordinator's answer, the environment read, waiting
for the shells, and a shell's loop (beats, progress, a kill request, the exit, a lost store) on a
HashStore with a fake clock and a fake child. Nothing is forked."""

import json
import os
import pickle
from types import SimpleNamespace

import pytest

dist = pytest.importorskip("torch.distributed", reason="torch is not installed")

from ntp_planner.executor.elastic import torchrun  # noqa: E402
from ntp_planner.executor.elastic.torchrun import Shell, StoreLost, Terminated, prefix  # noqa: E402
from ntp_planner.executor.parallel.comm import raise_terminated  # noqa: E402


def test_prefix():
    assert prefix("job7") == "ntp-live/job7/0/"
    assert prefix("job7", "2") == "ntp-live/job7/2/"  # a torchrun restart is a run of its own


@pytest.fixture
def joined(monkeypatch):
    """``join``'s store (a HashStore with the run's config) and what it connected to and started."""
    store, seen = dist.HashStore(), {}
    store.set("config", pickle.dumps(("CFG", 6)))

    def connect(addr, port, run_id, restart, timeout_s):
        seen["connect"] = (addr, port, run_id, restart, timeout_s)
        return store

    class FakeShell:
        def __init__(self, where, proc, cfg, total, node):
            seen["shell"] = (where, proc, cfg, total, node)

        def start(self, first_generation):
            seen["start"] = first_generation

        def serve(self):
            seen["served"] = True

    monkeypatch.setattr(torchrun, "connect", connect)
    monkeypatch.setattr(torchrun, "Shell", FakeShell)
    monkeypatch.setenv("NTP_AGENT_PID", "1")  # restored after: ``join`` sets it
    return store, seen


def test_a_joiner_becomes_the_process_it_is_given(joined):
    store, seen = joined
    store.add("join/count", 1)  # another joiner came first: this one is join 1
    store.set("join/1/proc", json.dumps([3, 5]))
    assert torchrun.join("10.0.0.2:29500/job7") == 3
    assert seen["connect"] == ("10.0.0.2", 29500, "job7", "0", 60.0)
    assert seen["shell"] == (("10.0.0.2", 29500, "job7", "0"), 3, "CFG", 6, -1)  # node -1: no agent
    assert seen["start"] == 5 and seen["served"] and os.environ["NTP_AGENT_PID"] == str(os.getpid())
    assert int(store.add("join/count", 0)) == 2


def test_an_endpoint_without_a_run_id_and_an_ipv6_host(joined):
    store, seen = joined
    store.set("join/0/proc", json.dumps([1, 2]))
    store.set("join/1/proc", json.dumps([4, 2]))
    assert torchrun.join("node-a:1234") == 1
    assert seen["connect"][:3] == ("node-a", 1234, "none")
    assert torchrun.join("::1:29500/r") == 4
    assert seen["connect"][:3] == ("::1", 29500, "r")  # the port is after the last colon


def test_a_joiner_with_nothing_to_take_over_is_sent_away_in_a_sentence(joined):
    store, seen = joined
    store.set("join/0/proc", json.dumps([-1, 0]))
    with pytest.raises(ValueError) as err:
        torchrun.join("h:1/run")
    assert str(err.value) == "the live run at h:1/run has no failed process to give back, or no step left to join"
    assert "shell" not in seen


def test_a_joiner_not_answered_gives_up(joined, monkeypatch):
    monkeypatch.setattr(torchrun, "JOIN_WAIT_S", 0.0)
    with pytest.raises(ValueError, match=r"^the live run at h:1/run did not answer within 0 s$"):
        torchrun.join("h:1/run")


def test_where_comes_from_torchruns_environment(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "10.1.2.3")
    monkeypatch.setenv("MASTER_PORT", "29400")
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    assert torchrun._where() == ("10.1.2.3", 29400, "none", "0")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert torchrun._where() == ("10.1.2.3", 29400, "abc", "1")


def test_a_worker_without_the_agent_store_is_refused(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)
    with pytest.raises(ValueError) as err:
        torchrun.run_live_torchrun(None, None, "ntp", (), 0, 0, "", 1.0)
    assert str(err.value) == "live recovery under torchrun needs its agent's store (torchrun's elastic agent)"


def test_the_coordinator_waits_for_every_shell():
    store = dist.HashStore()
    for p in (0, 2):
        store.set(f"host/{p}/started", "1.0")
    with pytest.raises(ValueError, match=r"^torchrun workers \[1, 3\] did not start their processes within 0 s$"):
        torchrun._await_shells(store, 4, 0.0)
    for p in (1, 3):
        store.set(f"host/{p}/started", "1.0")
    torchrun._await_shells(store, 4, 0.0)


class Child:
    def __init__(self):
        self.exitcode, self.killed = None, 0

    def kill(self):
        self.killed += 1
        self.exitcode = -9

    def join(self, timeout=None):
        pass

    def is_alive(self):
        return self.exitcode is None


def shell(store, proc=2):
    s = Shell(("h", 29500, "run", "0"), proc, SimpleNamespace(timeout_s=1.0), 4, 1)
    s.child, s.progress = Child(), [0] * 12
    s._store = lambda: store
    return s


@pytest.fixture
def quiet(monkeypatch):
    """No SIGTERM handler installed in the test process."""
    handlers = []
    monkeypatch.setattr(torchrun.signal, "signal", lambda sig, f: handlers.append(sig))
    return handlers


def test_a_shell_beats_mirrors_progress_kills_on_request_and_reports_the_exit(monkeypatch, quiet):
    store = dist.HashStore()
    s = shell(store)
    clock = SimpleNamespace(now=100.0, sleeps=0)

    def sleep(_):
        clock.sleeps += 1
        clock.now += 0.125  # exact in binary: beats at 100, 100.25, 100.5
        if clock.sleeps == 1:  # the child enters a collective and the coordinator asks for a kill
            s.progress[6:9] = [1, 5, 4]
            store.set("host/2/kill", "1")
        if clock.sleeps == 5:
            store.set("end", "1")

    monkeypatch.setattr(torchrun, "time", SimpleNamespace(monotonic=lambda: clock.now, sleep=sleep))
    s.serve()
    assert clock.sleeps == 5 and int(store.add("host/2/beat", 0)) == 3
    assert json.loads(store.get("host/2/progress")) == [1, 5, 4]
    assert s.child.killed == 1 and not store.check(["host/2/kill"])  # done once, the request taken
    assert json.loads(store.get("host/2/exit")) == -9
    assert len(quiet) == 1


class BrokenStore:
    def __init__(self, exc):
        self.exc = exc

    def check(self, keys):
        raise self.exc


def test_a_shell_that_loses_the_store_kills_its_child_and_says_why(quiet):
    s = shell(BrokenStore(RuntimeError("Connection reset by peer\nat TCPStore.cpp:123")))
    with pytest.raises(StoreLost) as err:
        s.serve()
    assert str(err.value) == (
        "process 2's shell lost the store at h:29500 (Connection reset by peer): rank 0's node, which hosts it "
        "and the coordinator, is gone, and the run's membership with it; the run cannot go on"
    )
    assert s.child.killed == 1


def test_a_shell_stopped_by_its_agent_while_the_store_lives(monkeypatch, quiet):
    monkeypatch.setattr(torchrun, "_store_alive", lambda where: True)
    s = shell(BrokenStore(Terminated("stopped by torchrun's agent (SIGTERM)")))
    with pytest.raises(StoreLost, match=r"^process 2's shell was stopped by torchrun's agent; the run cannot go on$"):
        s.serve()
    assert s.child.killed == 1
    with pytest.raises(Terminated, match=r"^stopped by torchrun's agent \(SIGTERM\)$"):
        raise_terminated(15, None)
