"""Hang detection on hand-set progress counters and a fake clock: a process outside every
collective while its peers wait inside one, progress within and past the timeout, a layout where
nobody waits, and the wait for leavers after an abort (HashStore; nothing is killed for real)."""

from types import SimpleNamespace

import pytest

dist = pytest.importorskip("torch.distributed", reason="torch is not installed")

from ntp_planner.executor.elastic import membership as ms  # noqa: E402
from ntp_planner.executor.elastic import watch as watch_mod  # noqa: E402
from ntp_planner.executor.elastic.watch import Watch  # noqa: E402


class Clock:
    def __init__(self, step_s: float = 1.0):
        self.now, self.step_s = 0.0, step_s

    def monotonic(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += self.step_s  # every poll of the wait moves the clock a whole ``step_s``


class Hosts:
    """Hand-set (entered, left) collectives and exit codes per process."""

    def __init__(self, counts: dict, exits: dict | None = None):
        self.counts, self.exits = counts, exits or {}

    def progress_of(self, p):
        return self.counts[p]

    def exitcode(self, p):
        return self.exits.get(p)


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(watch_mod, "time", c)
    return c


def in_place(store, n, ranks):
    for r in ranks:
        ms.report_times(store, n, r, {"regroup_s": 0.0, "move_s": 0.0, "bytes": 0, "t": 0.0})


def test_nothing_hangs_before_every_state_is_in_place(clock):
    store, hosts = dist.HashStore(), Hosts({0: (5, 5), 1: (6, 5)})
    w = Watch(10.0, store, hosts, 2)
    clock.now = 100.0
    assert w.hung([0, 1], 0) == []  # rank 1 still carrying: 100 s outside a collective is no hang
    in_place(store, 0, [0])
    assert w.hung([0, 1], 0) == []
    in_place(store, 0, [1])
    clock.now = 105.0
    assert w.hung([0, 1], 0) == []  # in place at 100: the clock starts there


def test_the_one_outside_while_peers_wait_inside_hangs_past_the_timeout(clock):
    store = dist.HashStore()
    in_place(store, 0, range(3))
    hosts = Hosts({0: (5, 5), 1: (6, 5), 2: (6, 5)})  # 0 outside any collective, 1 and 2 inside one
    w = Watch(10.0, store, hosts, 3)
    assert w.hung([0, 1, 2], 0) == []
    clock.now = 10.0
    assert w.hung([0, 1, 2], 0) == []  # exactly the timeout: not past it
    clock.now = 11.0
    assert w.hung([0, 1, 2], 0) == [(0, "it hung: no progress for 11 s outside any collective")]


def test_progress_or_a_commit_within_the_timeout_resets_the_clock(clock):
    store = dist.HashStore()
    in_place(store, 0, range(3))
    hosts = Hosts({0: (5, 5), 1: (6, 5), 2: (6, 5)})
    w = Watch(10.0, store, hosts, 3)
    w.hung([0, 1, 2], 0)
    clock.now = 8.0
    hosts.counts[1] = (7, 6)  # rank 1 entered another collective: progress
    assert w.hung([0, 1, 2], 0) == []
    clock.now = 17.0
    assert w.hung([0, 1, 2], 0) == []  # 9 s since
    assert w.hung([0, 1, 2], 1) == []  # a step committed at 17
    clock.now = 27.0
    assert w.hung([0, 1, 2], 1) == []
    clock.now = 27.5
    assert w.hung([0, 1, 2], 1) == [(0, "it hung: no progress for 10 s outside any collective")]  # 10.5 s


def test_when_nobody_waits_inside_everyone_hangs_after_twice_the_timeout(clock):
    store = dist.HashStore()
    in_place(store, 0, range(2))
    w = Watch(10.0, store, Hosts({0: (4, 4), 1: (4, 4)}), 2)
    w.hung([0, 1], 0)
    clock.now = 15.0
    assert w.hung([0, 1], 0) == []  # past one timeout: a lone outsider would be taken, not all
    clock.now = 21.0
    assert [p for p, _ in w.hung([0, 1], 0)] == [0, 1]


def test_a_lone_process_hangs_only_after_twice_the_timeout(clock):
    store = dist.HashStore()
    in_place(store, 0, [0])
    w = Watch(10.0, store, Hosts({0: (3, 3), 1: (0, 0)}), 2)
    w.hung([0], 0)
    clock.now = 20.0
    assert w.hung([0], 0) == []
    clock.now = 20.5
    assert w.hung([0], 0) == [(0, "it hung: no progress for 20 s outside any collective")]


def generation(n, procs):
    return SimpleNamespace(number=n, layout=SimpleNamespace(procs=procs))


def test_await_leavers_sorts_the_left_the_dead_and_the_hung(clock):
    store = dist.HashStore()
    # generation 1 is procs 0-3 (ranks 0-3); 3 is known dead; 0 left; 1 exited; 2 hangs in place, outside
    in_place(store, 1, [2])
    ms.leave(store, 1, 0, "step 4 aborted", 4)
    w = Watch(10.0, store, Hosts({0: (9, 9), 1: (9, 8), 2: (4, 4), 3: (0, 0)}, {1: 1}), 4)
    clock.now = 50.0
    killed, dead = [], []
    got = w.await_leavers(generation(1, [0, 1, 2, 3]), {3}, lambda p, why: killed.append((p, why)), dead.append)
    assert ms.aborted(store, 1)
    assert dead == [1]
    assert killed == [(2, "it hung: no progress for 50 s after its generation was aborted")]
    assert list(got) == [0] and got[0]["why"] == "step 4 aborted" and got[0]["step"] == 4


def test_await_leavers_gives_one_inside_a_collective_a_second_timeout(clock):
    store = dist.HashStore()
    in_place(store, 1, [0, 1])
    ms.leave(store, 1, 1, "a peer was lost", 2)
    w = Watch(10.0, store, Hosts({0: (5, 4), 1: (5, 5)}), 2)  # 0 waits inside a collective
    clock.now = 50.0
    killed = []
    got = w.await_leavers(generation(1, [0, 1]), set(), lambda p, why: killed.append((p, why)), None)
    # taken for hung only after 2 x 10 + 10 s from the start of the wait (50): at 81 on this clock
    assert killed == [(0, "it hung: no progress for 81 s after its generation was aborted")]
    assert clock.now == 82.0 and list(got) == [1]


def test_leaving_a_collective_is_not_progress(clock):
    store = dist.HashStore()
    in_place(store, 0, range(2))
    hosts = Hosts({0: (5, 4), 1: (6, 5)})  # both inside a collective
    w = Watch(10.0, store, hosts, 2)
    w.hung([0, 1], 0)
    clock.now = 9.0
    hosts.counts[0] = (5, 5)  # 0 left its collective: no new one entered
    assert w.hung([0, 1], 0) == []
    clock.now = 11.0
    assert w.hung([0, 1], 0) == [(0, "it hung: no progress for 11 s outside any collective")]  # from 0, not 9


def test_await_leavers_stops_waiting_for_one_that_leaves(clock, monkeypatch):
    store = dist.HashStore()
    in_place(store, 1, [0])
    w = Watch(10.0, store, Hosts({0: (5, 4)}), 1)  # inside a collective: not hung, waited for

    def sleep(_):
        clock.now += 1.0
        if clock.now == 4.0:
            ms.leave(store, 1, 0, "Connection closed by peer", 3)

    monkeypatch.setattr(clock, "sleep", sleep)
    killed = []
    got = w.await_leavers(generation(1, [0]), set(), lambda p, why: killed.append(p), None)
    # seen gone at the sweep after 4 s (and one last poll): not waited for until 2 x 10 + 10 s
    assert killed == [] and clock.now == 5.0 and got[0]["why"] == "Connection closed by peer"
