"""The membership protocol on a real in-process TCPStore (and HashStore): decisions written once
whoever races, the log's order, faults firing once, and a host counted lost when its heartbeat
stops."""

import json
import threading
import time
from datetime import timedelta

import pytest

dist = pytest.importorskip("torch.distributed", reason="torch is not installed")

from ntp_planner.executor.elastic import hosts as hosts_mod  # noqa: E402
from ntp_planner.executor.elastic import membership as ms  # noqa: E402


@pytest.fixture
def server():
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=20))
    yield store


def client(server):
    return dist.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=20))


def together(n: int, work) -> list:
    """``work(i)`` on ``n`` threads released at once; their results in thread order."""
    out, gate = [None] * n, threading.Barrier(n)

    def run(i):
        gate.wait(timeout=10)
        out[i] = work(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert not any(t.is_alive() for t in threads)
    return out


def test_eight_concurrent_votes_commit_once_with_the_summed_loss(server):
    record = {"step": 3, "generation": 1, "consumed": 12, "batch": 4}
    got = together(8, lambda r: ms.vote(client(server), 1, 3, r, 8, 0.5 * r, record, 10.0))
    assert got == ["commit"] * 8
    (logged,) = ms.read_log(server, 0)  # one record, not one per voter
    assert logged["loss"] == 14.0 and logged["step"] == 3  # 0.5 * (0 + 1 + ... + 7) = 14
    assert int(server.add("log/count", 0)) == 1


def test_an_abort_before_the_last_vote_wins_for_everyone(server):
    # ranks 0-2 of 4 vote and wait; the coordinator aborts; the waiting ranks write "abort" first,
    # so rank 3's completing vote finds the decision taken: nobody commits, nothing is logged
    record = {"step": 0, "generation": 0, "consumed": 0, "batch": 4}
    votes = [None] * 3

    def vote_early():
        votes[:] = together(3, lambda r: ms.vote(client(server), 0, 0, r, 4, 1.0, record, 10.0))

    early = threading.Thread(target=vote_early)
    early.start()
    while int(server.add("g0/votes/0", 0)) < 3:
        time.sleep(0.001)
    ms.abort(server, 0)
    early.join(timeout=10)
    assert votes == ["abort"] * 3
    assert ms.vote(client(server), 0, 0, 3, 4, 1.0, record, 10.0) == "abort"
    assert server.get("g0/decision/0") == b"abort" and ms.read_log(server, 0) == []


def test_a_vote_that_waits_past_its_timeout_aborts(server):
    record = {"step": 0, "generation": 0, "consumed": 0, "batch": 2}
    start = time.monotonic()
    assert ms.vote(server, 0, 0, 0, 2, 1.0, record, 0.2) == "abort"  # its peer never votes
    assert 0.2 <= time.monotonic() - start < 5


def test_go_and_stop_race_and_decide_once(server):
    # 6 ranks reach step 2 while the coordinator stops the generation there: whichever writes
    # first decides, and every rank sees the same
    got = together(7, lambda i: ms.stop_at(client(server), 4, 2) if i == 6 else ms.may_run(client(server), 4, 2))
    ranks, stopped = got[:6], got[6]
    assert ranks == [not stopped] * 6
    assert ms.stop_at(server, 4, 3) and not ms.may_run(server, 4, 3)  # stopped first: the step never runs
    assert ms.may_run(server, 4, 5) and not ms.stop_at(server, 4, 5)  # entered first: too late to stop


def test_the_log_stops_at_a_record_counted_but_not_yet_written():
    store = dist.HashStore()
    ms.append_log(store, {"step": 0})
    store.add("log/count", 1)  # a committer that counted its record and has not written it yet
    ms.append_log(store, {"step": 1})  # lands at index 2
    assert [r["step"] for r in ms.read_log(store, 0)] == [0]
    store.set("log/1", json.dumps({"step": 9}))
    assert [r["step"] for r in ms.read_log(store, 1)] == [9, 1]


def test_a_fault_fires_once_and_records_when():
    store = dist.HashStore()
    assert ms.last_fault(store, 3) is None
    assert ms.fire(store, 3, 2, "kill") and not ms.fire(store, 3, 2, "kill")  # a redone step does not fail again
    assert ms.fired(store, 3, 2) and not ms.fired(store, 3, 1)
    assert ms.last_fault(store, 3)["how"] == "kill" and ms.last_fault(store, 3)["step"] == 2


def test_leaving_is_counted_and_explained():
    store = dist.HashStore()
    ms.leave(store, 2, 5, "x" * 400, 7)
    ms.leave(store, 2, 1, "peer gone", 7)
    assert ms.left_count(store, 2) == 2 and ms.has_left(store, 2, 5) and not ms.has_left(store, 2, 0)
    why = ms.left_reasons(store, 2, [0, 1, 5])
    assert sorted(why) == [1, 5] and len(why[5]["why"]) == 300 and why[1]["step"] == 7


def test_a_host_whose_heartbeat_stops_is_lost_and_named(monkeypatch):
    monkeypatch.setattr(hosts_mod, "HOST_LOST_S", 0.2)
    store = dist.HashStore()
    store.set("host/3/node", json.dumps({"node": 2, "host": "h2", "agent_pid": 77}))
    view = hosts_mod.StoreHosts(store, range(4))
    store.add("host/3/beat", 1)
    assert view.lost(3) is None and view.exitcode(3) is None
    for _ in range(3):  # beating: never lost, however long
        time.sleep(0.1)
        store.add("host/3/beat", 1)
        assert view.lost(3) is None
    time.sleep(0.3)  # silent for longer than HOST_LOST_S
    assert view.lost(3).startswith("node 2 (host h2, agent pid 77) lost: no heartbeat from process 3's shell")
    assert view.exitcode(3) == -9
    assert store.check(["host/3/kill"])  # should the shell only have stalled, it kills its process on waking
    # a shell that reported its child's exit is alive: the process died, the host is not lost
    store.set("host/3/exit", "0")
    assert view.lost(3) is None and view.exitcode(3) == 0


def test_a_joiner_takes_over_a_process_whose_exit_is_history():
    store = dist.HashStore()
    store.set("host/3/exit", "-9")
    store.set("host/3/kill", "1")  # asked of the lost host
    view = hosts_mod.StoreHosts(store, range(4))
    store.add("join/count", 2)
    assert view.joins() == [0, 1]
    view.answer_join(0, 3, 5)
    view.answer_join(1, -1, 0)
    assert view.joins() == [] and view.exitcode(3) is None  # the new incarnation is up
    assert not store.check(["host/3/kill"])  # and its shell is not told to kill it
    assert json.loads(store.get("join/0/proc")) == [3, 5] and json.loads(store.get("join/1/proc")) == [-1, 0]
