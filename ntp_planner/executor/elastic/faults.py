"""What a live run is told to go through: failures injected for real, and repairs. No torch."""

from __future__ import annotations

from dataclasses import dataclass

HOWS = ("kill", "sync", "raise", "hang")  # how a process fails (the CLI's choices); the first is the default
# a failure during the recovery of another, for tests: SIGKILL as the process starts to carry
# state into a generation whose first step is ``step`` (never fires if no such generation comes)
TEST_HOWS = (*HOWS, "carry")


@dataclass(frozen=True)
class Fault:
    """Process ``proc`` fails in step ``step``: ``kill`` (SIGKILL at its first collective of the
    step, mid-step), ``data`` (SIGKILL on entering the gradient sync), ``raise`` (an exception
    raised inside its first collective of the step: the process crashes) or ``hang`` (it stops
    there and never returns). A fault at step ``steps`` (one past the last, which the CLI does not
    offer) fires in the final gather of the holdings, after every step is committed."""

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
