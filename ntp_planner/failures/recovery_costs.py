"""Measured recovery costs for the simulator: ``ntp simulate --recovery-from FILE``.

FILE is JSON with an object ``"recovery_costs_s"`` holding any of ``detection_s``,
``reconfigure_s`` and ``restart_s``: seconds measured by the executor's live-recovery runs.
Other top-level keys are ignored, so the file may be the whole ``ntp validate --json`` output.
Each value replaces the simulator's default (``SimConfig``); a cost given on the command line
(``--restart-s``) wins over the file. ``resolve`` says where each value came from.
"""

from __future__ import annotations

import math
from pathlib import Path

from topologies.errors import InputError
from topologies.files import read_mapping

COSTS = ("detection_s", "reconfigure_s", "restart_s")
MAX_RECOVERY_BYTES = 64 * 2**20  # a validate --json output with its timeline and sample log: a few MB


def load_recovery_costs(path: Path) -> dict[str, float]:
    """The costs of ``path``'s ``recovery_costs_s`` object, checked: known names, finite
    non-negative numbers."""
    what = "recovery file"
    data = read_mapping(Path(path), what, max_bytes=MAX_RECOVERY_BYTES, kind="JSON")
    costs = data.get("recovery_costs_s")
    if not isinstance(costs, dict):
        got = "has none" if costs is None else f"has a {type(costs).__name__} there"
        raise InputError(
            f'{what} {path} needs an object "recovery_costs_s" with any of {", ".join(COSTS)} in seconds; it {got}.'
        )
    unknown = sorted(k for k in costs if k not in COSTS)
    if unknown:
        raise InputError(
            f"{what} {path} names recovery costs {unknown}; the simulator takes {', '.join(COSTS)} (seconds)."
        )
    out = {}
    for name, value in costs.items():
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
        if not ok:
            raise InputError(f"{what} {path}: {name} is {value!r}; it must be a finite number of seconds, 0 or more.")
        out[name] = float(value)
    return out


def resolve(
    defaults: dict[str, float], from_file: dict[str, float], from_cli: dict[str, float | None]
) -> tuple[dict[str, float], dict[str, str]]:
    """(the value of each cost, where it came from: "default", "file" or "command line"); the
    command line wins over the file, the file over the defaults.

    >>> resolve({"restart_s": 600.0, "detection_s": 60.0}, {"restart_s": 90.0, "detection_s": 4.5},
    ...         {"restart_s": 300.0})
    ({'restart_s': 300.0, 'detection_s': 4.5}, {'restart_s': 'command line', 'detection_s': 'file'})
    """
    values, sources = {}, {}
    for name, default in defaults.items():
        if from_cli.get(name) is not None:
            values[name], sources[name] = float(from_cli[name]), "command line"
        elif name in from_file:
            values[name], sources[name] = from_file[name], "file"
        else:
            values[name], sources[name] = default, "default"
    return values, sources
