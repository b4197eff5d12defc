"""The failure state of every trial in every time bin, encoded so each distinct state is
re-planned once.

A state counts failed units in distinct NVLink domains: single GPUs, hosts, whole domains, and
domains with k = 2, 3, ... single-GPU failures at once (the re-planner puts those k GPUs in one
domain, so its TP group runs at tp - k, or its idle GPUs cover them). A host or domain failure
counts as if in a domain of its own, even when it overlaps others in the same domain. A domain's
idle GPUs (when the job uses part of each domain) stand in for a unit that fails no more GPUs
than they are, except a domain-wide failure, which takes them too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ntp_planner.failures.events import Events, failed_counts
from ntp_planner.failures.sampling import BLASTS


@dataclass(frozen=True)
class Domains:
    """GPUs per NVLink domain as the failure states see them."""

    used: int  # job GPUs per domain (the last may hold fewer)
    node: int  # GPUs one host failure takes down (at most ``used``)
    idle: int  # idle GPUs of each domain (the last may have more)

    @property
    def most(self) -> int:
        """Most failed single GPUs a state counts in one domain: its job GPUs (more only when a
        GPU fails again under repair), and at least 2, so a state always has a pairs column."""
        return max(2, self.used)


@dataclass
class FailureStates:
    """[trial, bin] counts of one batch of trials and the distinct states among them."""

    gpus_down: np.ndarray  # [trial, bin] job GPUs down
    domains_down: np.ndarray  # [trial, bin] domains whose failed GPUs outnumber their idle ones
    # [distinct, 2 + Domains.most] units: domains with one failed GPU, hosts, domains, then domains
    # with 2, 3, ... Domains.most failed single GPUs (column k + 1 for k); the same width in every batch
    states: np.ndarray
    inverse: np.ndarray  # [trial, bin] row of ``states`` each bin is in


def failure_states(ev: Events, trials: int, bins: int, bin_h: float, domains: Domains) -> FailureStates:
    """Count the failed units per bin and number the distinct states."""
    units = [failed_counts(ev.take(ev.blast == b), trials, bins, bin_h) for b in range(len(BLASTS))]
    gpus_down = units[0] + units[1] * domains.node + units[2] * domains.used
    crowd = crowding(ev.take(ev.blast == 0), domains, trials, bins, bin_h)  # crowd[k - 1]: k failed GPUs
    # domains with more failed GPUs than idle ones (a whole domain always): each needs a spare
    domains_down = units[2] + (units[1] if domains.idle < domains.node else 0)
    for k in range(domains.idle + 1, len(crowd) + 1):
        domains_down = domains_down + crowd[k - 1]
    states, inverse = distinct_states([crowd[0], units[1], units[2], *crowd[1:]])
    width = 2 + domains.most
    states = np.pad(states, ((0, 0), (0, width - states.shape[1])))  # levels no bin reached: zeros
    return FailureStates(gpus_down, domains_down, states, inverse.reshape(trials, bins))


def crowding(single: Events, domains: Domains, trials: int, bins: int, bin_h: float) -> np.ndarray:
    """[k - 1, trial, bin] NVLink domains with exactly k single-GPU failures under repair, for
    k = 1 up to the most any bin reaches (at least 1, at most ``domains.most``). Failures round
    to bins as in ``failed_counts``: one is down in bins rint(start / bin_h) to rint(end / bin_h) - 1.

    Each failure is a +1 edge at its first bin and a -1 edge after its last. Sorted by (trial,
    domain, bin), ends before starts at one bin, the running sum of the edges is the number
    down in that domain from an edge's bin to the next edge's bin; it never dips below 0, and
    returns to 0 at the end of each domain, so one cumulative sum serves every domain. Each
    stretch at level k >= 1 adds 1 to the count of k-failure domains over its bins.

    >>> ev = Events(np.zeros(3, int), np.array([0.0, 1, 2]), np.array([3.0, 4, 3]), np.array([0, 1, 9]), np.zeros(3))
    >>> crowding(ev, Domains(used=8, node=8, idle=0), trials=1, bins=5, bin_h=1.0).tolist()
    [[[1, 0, 1, 1, 0]], [[0, 1, 1, 0, 0]]]
    """
    b0 = np.clip(np.rint(single.start_h / bin_h), 0, bins).astype(np.int64)
    b1 = np.clip(np.rint(single.end_h / bin_h), 0, bins).astype(np.int64)
    keep = b1 > b0
    trial = np.tile(single.trial[keep], 2)
    domain = np.tile(single.gpu[keep] // domains.used, 2)
    edge = np.concatenate([b0[keep], b1[keep]])
    step = np.repeat([1, -1], int(keep.sum()))
    order = np.lexsort((step, edge, domain, trial))
    trial, edge, level = trial[order], edge[order], np.cumsum(step[order])
    run = np.flatnonzero(level[:-1] > 0)  # stretch i: level[i] over bins edge[i] .. edge[i + 1] - 1
    k = np.minimum(level[run], domains.most)
    most = int(k.max(initial=1))
    diff = np.zeros((most, trials, bins + 1), dtype=np.int32)
    np.add.at(diff, (k - 1, trial[run], edge[run]), 1)
    np.add.at(diff, (k - 1, trial[run], edge[run + 1]), -1)
    return np.cumsum(diff, axis=2, dtype=np.int32)[:, :, :bins]


def distinct_states(parts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of the stacked ``parts`` (counts, never negative) and, per cell, which
    row it is: each cell's counts become one mixed-radix integer (radix = largest count + 1), so
    ``np.unique`` sorts integers instead of rows; radices whose product would overflow int64
    sort the rows themselves.

    >>> states, inverse = distinct_states([np.array([[0, 2, 2]]), np.array([[1, 0, 0]])])
    >>> states.tolist(), inverse.tolist()
    ([[2, 0], [0, 1]], [1, 0, 0])
    """
    radix = [int(x.max(initial=0)) + 1 for x in parts]
    if int(np.prod(radix, dtype=object)) >= 2**63:
        rows, inverse = np.unique(np.stack([x.ravel() for x in parts], axis=1), axis=0, return_inverse=True)
        return rows, inverse.ravel()
    code = np.zeros(parts[0].shape, dtype=np.int64)
    for x, r in zip(reversed(parts), reversed(radix), strict=True):
        code = code * r + x
    codes, inverse = np.unique(code.ravel(), return_inverse=True)
    columns, rest = [], codes
    for r in radix:
        columns.append(rest % r)
        rest = rest // r
    return np.stack(columns, axis=1), inverse
