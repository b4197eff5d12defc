"""What a live run is told to go through: failures injected for real, and repairs. No torch."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

# how a process fails (the CLI's choices); the first is the default; "host" only under torchrun
HOWS = ("kill", "sync", "raise", "hang", "host")
# a failure during the recovery of another, for tests: SIGKILL as the process starts to carry
# state into a generation whose first step is ``step`` (never fires if no such generation comes)
TEST_HOWS = (*HOWS, "carry")


@dataclass(frozen=True)
class Fault:
    """Process ``proc`` fails in step ``step``: ``kill`` (SIGKILL at its first collective of the
    step, mid-step), ``sync`` (SIGKILL on entering the gradient sync), ``raise`` (an exception
    raised inside its first collective of the step: the process crashes), ``hang`` (it stops
    there and never returns) or ``host`` (under torchrun: its whole node is lost, ``kill_host``).
    A fault at step ``steps`` (one past the last, which the CLI does not offer) fires in the final
    gather of the holdings, after every step is committed."""

    proc: int
    step: int
    how: str = "kill"

    def __post_init__(self):
        if self.how not in TEST_HOWS:
            raise ValueError(f"a fault is one of {', '.join(TEST_HOWS)}, not {self.how!r}")


class RecoveryFailure(RuntimeError):
    """The run could not go on (nothing left to run, or a process failed outside a step)."""


@dataclass(frozen=True)
class Repair:
    """Process ``proc`` comes back (a fresh process) once step ``step`` is reached."""

    proc: int
    step: int


def _children() -> dict[int, list[int]]:
    """Every process's children, from /proc (parent pid -> child pids)."""
    out: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        out.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    return out


def host_tree(agent_pid: int) -> list[int]:
    """``agent_pid`` and all its descendants (a torchrun node: the agent, its workers and theirs)."""
    children, tree, todo = _children(), [], [agent_pid]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo += children.get(pid, [])
    return tree


def kill_host(agent_pid: int) -> None:
    """Lose a torchrun node at once, as a host that goes down: SIGKILL the process group of its
    agent and of every process under it. torchrun starts each worker in a session of its own, so
    the agent's group alone would leave its workers running; this process (one of them) goes last."""
    groups = []
    for pid in host_tree(agent_pid):
        try:
            groups.append(os.getpgid(pid))
        except ProcessLookupError:
            pass
    mine = os.getpgid(0)
    for pgid in [g for g in dict.fromkeys(groups) if g != mine] + [mine]:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
