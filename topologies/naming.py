"""Name look-ups shared by every catalogue: exact match, else a helpful suggestion."""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import TypeVar

from topologies.errors import InputError

T = TypeVar("T")


def lookup(catalogue: Mapping[str, T], name: str, kind: str, hint: str) -> T:
    """Return ``catalogue[name]`` (case-insensitive) or raise one sentence naming close matches.

    >>> lookup({"dgx-h100": 1}, "DGX-H100", "cluster", "")
    1
    """
    by_lower = {key.lower(): key for key in catalogue}
    key = by_lower.get(name.lower())
    if key is not None:
        return catalogue[key]
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=3, cutoff=0.5)
    suggestion = (
        f"did you mean {', '.join(repr(by_lower[c]) for c in close)}?"
        if close
        else f"known: {', '.join(sorted(catalogue))}."
    )
    raise InputError(f"unknown {kind} {name!r}: {suggestion} {hint}".rstrip())
