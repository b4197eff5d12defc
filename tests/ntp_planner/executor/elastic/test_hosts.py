"""The processes as the coordinator sees them. ``StoreHosts`` on an in-process HashStore with a
fake clock: heartbeat loss exactly at ``HOST_LOST_S``, exit codes, progress, a kill request, a
joiner's takeover. ``LocalHosts``' progress array read per process, without spawning anything."""

import json
from types import SimpleNamespace

import pytest

dist = pytest.importorskip("torch.distributed", reason="torch is not installed")

from ntp_planner.executor.elastic import hosts as hosts_mod  # noqa: E402
from ntp_planner.executor.elastic.hosts import HOST_LOST_S, LocalHosts, StoreHosts  # noqa: E402


class Clock:
    def __init__(self):
        self.now, self.sleeps = 100.0, 0

    def monotonic(self):
        return self.now

    def time(self):
        return 1_700_000_000.0 + self.now

    def sleep(self, s):
        self.now += s
        self.sleeps += 1


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(hosts_mod, "time", c)
    return c


def test_the_heartbeat_constants():
    assert (hosts_mod.BEAT_S, HOST_LOST_S) == (0.25, 6.0)  # 24 beats missed before a host counts as lost


def test_a_host_is_lost_once_its_beat_stands_still_for_host_lost_s(clock):
    store = dist.HashStore()
    store.set("host/2/node", json.dumps({"node": 1, "host": "n1", "agent_pid": 4242}))
    view = StoreHosts(store, range(3))
    assert view.lost(2) is None  # first look (beat 0): the clock starts now, at 100
    clock.now = 105.0
    store.add("host/2/beat", 1)
    assert view.lost(2) is None  # it beat: the clock starts again at 105
    clock.now = 110.9
    assert view.lost(2) is None and view.exitcode(2) is None  # 5.9 s still
    clock.now = 111.0
    assert view.lost(2) == "node 1 (host n1, agent pid 4242) lost: no heartbeat from process 2's shell for 6 s"
    assert store.check(["host/2/kill"])  # a shell that only stalled kills its process when it wakes
    assert view.exitcode(2) == -9


def test_a_host_never_described_is_named_with_question_marks(clock):
    view = StoreHosts(dist.HashStore(), range(1))
    view.lost(0)
    clock.now += 30.0
    assert view.lost(0) == "node ? (host ?, agent pid ?) lost: no heartbeat from process 0's shell for 30 s"


def test_a_reported_exit_is_the_exit_code_and_no_lost_host(clock):
    store = dist.HashStore()
    view = StoreHosts(store, range(2))
    view.lost(1)
    store.set("host/1/exit", json.dumps(-9))
    clock.now += 60.0
    assert view.lost(1) is None and view.exitcode(1) == -9
    assert not store.check(["host/1/kill"])


def test_progress_and_start_time_come_from_the_shell_keys(clock):
    store = dist.HashStore()
    view = StoreHosts(store, range(2))
    assert view.progress_of(0) == (0, 0) and view.started_t(0) == 0.0
    store.set("host/0/progress", json.dumps([7, 31, 30]))  # step 7, 31 collectives entered, 30 left
    store.set("host/0/started", json.dumps(123.5))
    assert view.progress_of(0) == (31, 30) and view.started_t(0) == 123.5
    view.reset_progress()  # the shells count per generation: nothing to reset here
    assert view.progress_of(0) == (31, 30)


def test_kill_asks_the_shell_and_waits_five_seconds_at_most(clock):
    store = dist.HashStore()
    view = StoreHosts(store, range(2))
    store.add("host/1/beat", 1)
    view.kill(1)
    assert store.check(["host/1/kill"]) and view.exitcode(1) is None
    assert 105.0 <= clock.now < 105.1  # gave up after 5 s of polling, not counted lost (under 6 s)


def test_kill_returns_as_soon_as_the_shell_reports_the_exit(clock, monkeypatch):
    store = dist.HashStore()
    view = StoreHosts(store, range(2))

    def shell_answers(s):
        clock.now += s
        store.set("host/1/exit", json.dumps(-9))

    monkeypatch.setattr(clock, "sleep", shell_answers)
    view.kill(1)
    assert clock.now == pytest.approx(100.02) and view.exitcode(1) == -9


def test_joiners_start_and_the_end_of_the_run(clock):
    store = dist.HashStore()
    view = StoreHosts(store, range(2))
    view.start(5, 3)  # a joiner starts itself: only counted
    assert list(view.procs) == [0, 1, 5]
    store.add("join/count", 1)
    view.answer_join(0, 4, 7)
    assert json.loads(store.get("join/0/proc")) == [4, 7] and 4 in view.procs
    assert json.loads(store.get("host/4/started")) == 1_700_000_100.0
    view.stop_all()
    assert store.get("end") == b"1"


def test_local_hosts_read_each_process_slots_of_the_progress_array():
    cfg = SimpleNamespace(timeout_s=1.0)
    view = LocalHosts(3, cfg, "127.0.0.1", 1, None)
    assert len(view.progress) == 9
    view.progress[3 * 2 + 0], view.progress[3 * 2 + 1], view.progress[3 * 2 + 2] = 4, 12, 11
    view.progress[3 * 1 + 1] = 99
    assert view.progress_of(2) == (12, 11) and view.progress_of(1) == (99, 0) and view.progress_of(0) == (0, 0)
    view.reset_progress()
    assert list(view.progress) == [0] * 9
    assert view.lost(2) is None and view.joins() == [] and view.started_t(2) == 0.0
