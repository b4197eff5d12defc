"""Planted bugs, for tests that prove the exactness check catches them. Off unless the
environment variable ``NTP_EXECUTOR_MUTATION`` names one; spawned ranks inherit the parent's
environment, so a test sets it (``monkeypatch.setenv``) before ``launch``. Production code asks
``planted("name")`` at the one place the bug would live; nothing else reads the variable.

Planted so far: ``doubled-grad-copy1`` (``data``: copy 1 of a block keeps twice its synced
gradient), ``embed-mask-off-by-one`` (``stage``: a rank also looks up the first id of the next
rank's vocabulary rows), ``cuts-reversed`` (``ownership``: fuller ranks last; ``cuts-reversed-odd``
only at odd degrees, which a TP4 run reaches only by a re-plan), ``nan-grad-copy1`` (``data``: a
NaN in copy 1's synced gradients), ``live-crash-proc3`` (``worker``: process 3 raises in step 1, a
crash no --fail injected), ``skip-a-sample`` (``coordinator``: the layout after a failure starts one
sample late), and in ``moe``, ``zero`` and ``stage`` ``moe-combine-wrong-weight``,
``zero-shard-offset``, ``chunk-layers-reversed`` and ``row-bias-twice``.

>>> planted("doubled-grad-copy1")
False
"""

from __future__ import annotations

import os

VARIABLE = "NTP_EXECUTOR_MUTATION"


def planted(name: str) -> bool:
    """True when the bug ``name`` is to be planted in this process."""
    return os.environ.get(VARIABLE) == name


def carried() -> str | None:
    """The bug planted in this (the launching) process, for ``plant`` in the processes it starts:
    they are forked from a server started earlier (``processes.context``), with its environment."""
    return os.environ.get(VARIABLE)


def plant(name: str | None) -> None:
    """Plant ``carried()``'s bug (or none) in this process, as the launcher had it."""
    if name is None:
        os.environ.pop(VARIABLE, None)
    else:
        os.environ[VARIABLE] = name
