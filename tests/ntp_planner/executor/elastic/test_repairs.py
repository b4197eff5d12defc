"""Repairs, joiners and idle processes' faults against a stand-in coordinator (its fields, a
HashStore, the real ``StoreHosts`` for joiners): which boundary is armed, when a repaired process
starts, the step-boundary takeover of a joiner, and an idle fault firing once."""

import json
from types import SimpleNamespace

import pytest

dist = pytest.importorskip("torch.distributed", reason="torch is not installed")

from ntp_planner.executor.elastic import membership as ms  # noqa: E402
from ntp_planner.executor.elastic import repairs  # noqa: E402
from ntp_planner.executor.elastic.faults import Fault, RecoveryFailure, Repair  # noqa: E402
from ntp_planner.executor.elastic.hosts import StoreHosts  # noqa: E402


class Hosts:
    """A host that records starts; a started process says it is ready unless ``boots`` is False."""

    def __init__(self, store, boots=True, exits=None):
        self.store, self.boots, self.exits, self.started = store, boots, exits or {}, []

    def start(self, proc, first_generation):
        self.started.append((proc, first_generation))
        if self.boots:
            ms.ready(self.store, proc)

    def exitcode(self, proc):
        return self.exits.get(proc)


def coordinator(store, hosts=None, repairs_=(), dead=(), committed=0, steps=6, gens=3, faults=(), slots=4):
    co = SimpleNamespace(
        store=store,
        hosts=hosts or Hosts(store),
        repairs=list(repairs_),
        dead=set(dead),
        restarted=set(),
        gens=[None] * gens,
        cfg=SimpleNamespace(steps=steps, timeout_s=0.0, faults=tuple(faults)),
        slots=list(range(slots)),
        layout=SimpleNamespace(procs=(0, 1, 2, 3), describe=lambda: "TP4", batch=4),
        timeline=[],
        reconfigured=[],
        killed=[],
    )
    co.committed = lambda: committed
    co.error_of = lambda proc: f"process {proc} said nothing"
    co._reconfigure = lambda cause, **kw: co.reconfigured.append((cause, kw))
    co.kill = co.killed.append
    return co


def go(store, n, step):
    return store.get(f"g{n}/go/{step}").decode() if store.check([f"g{n}/go/{step}"]) else None


@pytest.mark.parametrize("start, armed", [(0, 3), (4, 5), (6, None)])
def test_a_generation_stops_before_the_earliest_repair_it_runs_through(start, armed):
    store = dist.HashStore()
    co = coordinator(store, repairs_=[Repair(1, 3), Repair(2, 5), Repair(0, 6)])  # step 6 = steps: never
    repairs.arm(co, SimpleNamespace(number=2, start_step=start))
    assert [s for s in range(8) if go(store, 2, s) == "stop"] == ([] if armed is None else [armed])


def test_a_repair_starts_once_its_predecessor_is_dead():
    store = dist.HashStore()
    ms.ready(store, 1)  # the dead predecessor's mark
    co = coordinator(store, repairs_=[Repair(1, 3), Repair(3, 4)], dead={1, 2})
    co.hosts.boots = False
    repairs.start_due(co)
    assert co.hosts.started == [(1, 3)]  # joins at the next generation (3 published so far), never an old one
    assert co.dead == {2} and co.restarted == {1} and not ms.is_ready(store, 1)
    repairs.start_due(co)
    assert co.hosts.started == [(1, 3)]  # once


def test_at_the_repair_boundary_the_process_is_started_and_the_layout_re_planned():
    store = dist.HashStore()
    co = coordinator(store, repairs_=[Repair(1, 3), Repair(2, 5)], dead={1}, committed=3)
    assert repairs.at_boundary(co)
    assert go(store, 2, 3) == "stop" and co.hosts.started == [(1, 3)]
    assert co.reconfigured == [("process 1 repaired", {"repaired": (1,), "boundary": 3})]
    assert co.repairs == [Repair(2, 5)] and co.restarted == set()


def test_no_repair_when_a_rank_entered_the_step_first_or_none_is_due():
    store = dist.HashStore()
    co = coordinator(store, repairs_=[Repair(1, 3)], dead={1}, committed=3)
    assert ms.may_run(store, 2, 3)  # a rank of generation 2 is in step 3 already
    assert not repairs.at_boundary(co)
    co2 = coordinator(dist.HashStore(), repairs_=[Repair(1, 4)], dead={1}, committed=3)
    assert not repairs.at_boundary(co2)
    assert co.hosts.started == co2.hosts.started == [] and co.reconfigured == co2.reconfigured == []


def test_a_repaired_process_that_dies_booting_fails_the_run_in_one_sentence():
    store = dist.HashStore()
    co = coordinator(store, repairs_=[Repair(1, 3)], dead={1}, committed=3)
    co.hosts.boots, co.hosts.exits = False, {1: 1}
    with pytest.raises(RecoveryFailure, match=r"^repaired process 1 did not start: process 1 said nothing$"):
        repairs.at_boundary(co)


def test_a_joiner_takes_over_the_lowest_failed_process_at_the_next_boundary_not_entered():
    store = dist.HashStore()
    hosts = StoreHosts(store, range(6))
    co = coordinator(store, hosts, repairs_=[Repair(1, 5)], dead={5, 3, 2, 1}, committed=3)
    co.restarted.add(1)  # 1 is being repaired already; 5 is a spare (no base slot among 4); 2 and 3 are free
    ms.may_run(store, 2, 3)  # step 3 is under way: the joiner's boundary is 4
    store.add("join/count", 1)
    repairs.take_joins(co)
    assert json.loads(store.get("join/0/proc")) == [2, 3]  # the lowest, process 2, from generation 3 on
    assert go(store, 2, 4) == "stop"
    assert co.repairs == [Repair(2, 4), Repair(1, 5)]  # by step
    assert co.dead == {1, 3, 5} and co.restarted == {1, 2} and hosts.joins() == []


def test_a_joiner_waits_while_nothing_is_down_and_is_sent_away_when_no_step_is_left():
    store = dist.HashStore()
    hosts = StoreHosts(store, range(4))
    store.add("join/count", 1)
    co = coordinator(store, hosts, committed=3)
    repairs.take_joins(co)
    assert hosts.joins() == [0] and go(store, 2, 3) is None  # a hot spare: no answer, no boundary taken
    co = coordinator(store, hosts, dead={2}, committed=5)
    ms.may_run(store, 2, 5)  # the last step is under way
    repairs.take_joins(co)
    assert json.loads(store.get("join/0/proc")) == [-1, 0] and co.dead == {2} and co.repairs == []


def test_an_idle_process_fault_fires_once_when_its_step_is_reached():
    store = dist.HashStore()
    faults = [Fault(5, 2), Fault(6, 2, "carry"), Fault(0, 2), Fault(4, 3)]
    co = coordinator(store, committed=2, faults=faults, slots=7)
    repairs.idle_faults(co)
    assert co.killed == [5]  # 0 runs in the layout: it fires its own; 4's step is not reached; carry is never idle
    assert co.slots == [0, 1, 2, 3, 4, None, 6]
    (event,) = co.timeline
    assert (event["event"], event["procs"], event["step"], event["generation"]) == ("idle failure", [5], 2, 2)
    assert ms.last_fault(store, 5)["how"] == "kill" and ms.last_fault(store, 5)["step"] == 2
    repairs.idle_faults(co)
    assert co.killed == [5] and len(co.timeline) == 1


def test_a_repaired_process_waiting_for_its_step_is_not_idle():
    store = dist.HashStore()
    co = coordinator(store, repairs_=[Repair(5, 2)], committed=2, faults=[Fault(5, 2)])
    co.restarted.add(5)
    repairs.idle_faults(co)
    assert co.killed == [] and not ms.fired(store, 5, 2)
