"""Faults and repairs as values (the choices, the one-sentence refusal) and what losing a host
signals: ``kill_host`` on a hand-made process tree, with ``os.killpg`` recorded, never called."""

import dataclasses
import os
import signal

import pytest

from ntp_planner.executor.elastic import faults
from ntp_planner.executor.elastic.faults import HOWS, TEST_HOWS, Fault, Repair, host_tree, kill_host


def test_the_choices_and_the_default():
    assert HOWS == ("kill", "sync", "raise", "hang", "host")
    assert TEST_HOWS == (*HOWS, "carry")
    assert Fault(2, 5) == Fault(2, 5, "kill")  # the first choice is the default
    assert Fault(2, 5, "carry").how == "carry"  # a test-only way is a fault too
    assert Repair(1, 3) == Repair(proc=1, step=3)


def test_an_unknown_way_to_fail_is_refused_in_one_sentence():
    with pytest.raises(ValueError) as err:
        Fault(0, 1, "explode")
    assert str(err.value) == "a fault is one of kill, sync, raise, hang, host, carry, not 'explode'"


def test_faults_and_repairs_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Fault(0, 1).step = 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        Repair(0, 1).proc = 2


def test_host_tree_walks_every_descendant(monkeypatch):
    # 10 -> 11, 12; 12 -> 13; 13 -> 14; 99 is someone else's
    monkeypatch.setattr(faults, "_children", lambda: {10: [11, 12], 12: [13], 13: [14], 1: [99]})
    assert host_tree(10) == [10, 12, 13, 14, 11]  # depth first, last child first
    assert host_tree(11) == [11]
    assert host_tree(99) == [99]


def test_children_reads_this_process_under_its_parent():
    assert os.getpid() in faults._children()[os.getppid()]


def test_kill_host_sigkills_each_group_once_and_its_own_last(monkeypatch):
    # agent 10 (group 100), shells 11, 12 in sessions of their own (200 is this process's), 13 gone
    groups = {10: 100, 11: 200, 12: 300, 13: None, 14: 100, 0: 200}
    monkeypatch.setattr(faults, "host_tree", lambda pid: [10, 11, 12, 13, 14] if pid == 10 else [])

    def getpgid(pid):
        if groups[pid] is None:
            raise ProcessLookupError(pid)
        return groups[pid]

    sent = []

    def killpg(pgid, sig):
        sent.append((pgid, sig))
        if pgid == 300:
            raise ProcessLookupError(pgid)  # died meanwhile: ignored, the rest still go

    monkeypatch.setattr(os, "getpgid", getpgid)
    monkeypatch.setattr(os, "killpg", killpg)
    kill_host(10)
    assert sent == [(100, signal.SIGKILL), (300, signal.SIGKILL), (200, signal.SIGKILL)]


def test_kill_host_of_a_tree_all_gone_still_ends_this_process(monkeypatch):
    monkeypatch.setattr(faults, "host_tree", lambda pid: [pid])

    def getpgid(pid):
        if pid:
            raise ProcessLookupError(pid)
        return 7

    sent = []
    monkeypatch.setattr(os, "getpgid", getpgid)
    monkeypatch.setattr(os, "killpg", lambda pgid, sig: sent.append((pgid, sig)))
    kill_host(55)
    assert sent == [(7, signal.SIGKILL)]
