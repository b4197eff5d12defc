"""The failure state of every trial in every time bin, encoded so each distinct state is
re-planned once.

A state counts failed units in distinct NVLink domains: single GPUs, hosts, whole domains, and
domains with two single-GPU failures at once (collisions of more are rare at the fractions that
matter). A domain's idle GPUs (when the job uses part of each domain) stand in for a unit that
fails no more GPUs than they are, except a domain-wide failure, which takes them too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ntp_planner.failures.events import Events, failed_counts, pair_overlaps
from ntp_planner.failures.sampling import BLASTS


@dataclass(frozen=True)
class Domains:
    """GPUs per NVLink domain as the failure states see them."""

    used: int  # job GPUs per domain (the last may hold fewer)
    node: int  # GPUs one host failure takes down (at most ``used``)
    idle: int  # idle GPUs of each domain (the last may have more)


@dataclass
class FailureStates:
    """[trial, bin] counts of one batch of trials and the distinct states among them."""

    gpus_down: np.ndarray  # [trial, bin] job GPUs down
    domains_down: np.ndarray  # [trial, bin] domains whose failed GPUs outnumber their idle ones
    states: np.ndarray  # [distinct, 4] units: singles, hosts, domains, pairs
    inverse: np.ndarray  # [trial, bin] row of ``states`` each bin is in


def failure_states(ev: Events, trials: int, bins: int, bin_h: float, domains: Domains) -> FailureStates:
    """Count the failed units per bin and number the distinct states."""
    units = [failed_counts(ev.take(ev.blast == b), trials, bins, bin_h) for b in range(len(BLASTS))]
    gpus_down = units[0] + units[1] * domains.node + units[2] * domains.used
    # two single-GPU failures in one domain form one doubly degraded domain
    pairs = failed_counts(pair_overlaps(ev, domains.used), trials, bins, bin_h)
    singles = units[0] - 2 * pairs
    # domains with more failed GPUs than idle ones (a whole domain always): each needs a spare
    domains_down = (
        units[2]
        + (singles if domains.idle < 1 else 0)
        + (units[1] if domains.idle < domains.node else 0)
        + (pairs if domains.idle < 2 else 0)
    )
    states, inverse = distinct_states([singles, units[1], units[2], pairs])
    return FailureStates(gpus_down, domains_down, states, inverse.reshape(trials, bins))


def distinct_states(parts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of the stacked ``parts`` and, per cell, which row it is: each cell's
    counts become one mixed-radix integer (radix = largest count + 1), so ``np.unique`` sorts
    integers instead of rows.

    >>> states, inverse = distinct_states([np.array([[0, 2, 2]]), np.array([[1, 0, 0]])])
    >>> states.tolist(), inverse.tolist()
    ([[2, 0], [0, 1]], [1, 0, 0])
    """
    radix = [int(x.max(initial=0)) + 1 for x in parts]
    code = np.zeros_like(parts[0])
    for x, r in zip(reversed(parts), reversed(radix), strict=True):
        code = code * r + x
    codes, inverse = np.unique(code.ravel(), return_inverse=True)
    columns, rest = [], codes
    for r in radix:
        columns.append(rest % r)
        rest = rest // r
    return np.stack(columns, axis=1), inverse
