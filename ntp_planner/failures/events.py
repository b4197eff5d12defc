"""Failure, repair and straggler events of every trial, drawn from a numpy ``Generator`` the
caller passes in, and counted per time bin.

Failures arrive per GPU as a Poisson process, or as a Weibull renewal process of the whole job
with the same mean rate. Each belongs to a failure class (share, uniform repair time, blast
radius). A share of hosts may be lemons that fail ``lemon_factor`` times more often. A run that
starts in steady state (``SimConfig.start``) draws failures from one longest repair before
time 0, and those still in repair at 0 count as down; a run that starts healthy draws them from
time 0 on, and reaches the steady state one longest repair later. The order of the draws is
part of the result: the same seed gives the same events only while it stays as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gamma
from typing import TYPE_CHECKING

import numpy as np

from ntp_planner.failures.sampling import BLASTS

if TYPE_CHECKING:
    from ntp_planner.failures.sim_config import SimConfig


@dataclass
class Events:
    """All failures of all trials, flattened."""

    trial: np.ndarray  # trial index
    start_h: np.ndarray  # failure time (hours; negative = before the run)
    end_h: np.ndarray  # repair time
    gpu: np.ndarray
    blast: np.ndarray  # index into BLASTS: 0 = one GPU, 1 = a host, 2 = an NVLink domain
    cause: np.ndarray | None = None  # index into SimConfig.classes (failures only), for traces

    def take(self, mask: np.ndarray) -> Events:
        cause = None if self.cause is None else self.cause[mask]
        return Events(self.trial[mask], self.start_h[mask], self.end_h[mask], self.gpu[mask], self.blast[mask], cause)


def arrivals(
    cfg: SimConfig, rate_per_h: float, span_h: float, warm_h: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(trial, time) of every arrival over [-warm_h, span_h - warm_h) for every trial.

    Weibull: inter-arrival times k-shaped with scale 1 / (rate Gamma(1 + 1/k)), so their mean is
    1 / rate; rows are drawn with room for the mean count plus 10 standard deviations, and the
    rare short row is extended."""
    if cfg.distribution == "poisson" or rate_per_h == 0:
        counts = rng.poisson(rate_per_h * span_h, size=cfg.trials)
        return np.repeat(np.arange(cfg.trials), counts), rng.uniform(-warm_h, span_h - warm_h, size=int(counts.sum()))
    k = cfg.weibull_shape
    scale = 1 / rate_per_h / gamma(1 + 1 / k)
    draws = int(rate_per_h * span_h * 1.5 + 10 * (rate_per_h * span_h) ** 0.5 + 20)
    times = np.cumsum(scale * rng.weibull(k, size=(cfg.trials, draws)), axis=1)
    while (times[:, -1] < span_h).any():
        more = times[:, -1:] + np.cumsum(scale * rng.weibull(k, size=(cfg.trials, draws)), axis=1)
        times = np.concatenate([times, more], axis=1)
    trial, col = np.nonzero(times < span_h)
    return trial, times[trial, col] - warm_h


def draw_events(cfg: SimConfig, num_gpus: int, gpus_per_host: int, rng: np.random.Generator) -> Events:
    """Failures over [-longest repair, run length) for every trial, with their repair times,
    GPUs and blast radii; those repaired before the run began are left out."""
    warm = cfg.warm_h
    span = cfg.days * 24 + warm
    trial, start = arrivals(cfg, cfg.failure_rate_per_gpu_hour * num_gpus, span, warm, rng)
    n = trial.size
    cls = rng.choice(len(cfg.classes), size=n, p=[c.share for c in cfg.classes])
    lo = np.array([c.repair_min_h for c in cfg.classes])[cls]
    hi = np.array([c.repair_max_h for c in cfg.classes])[cls]
    end = start + rng.uniform(lo, hi)
    if cfg.lemon_host_fraction > 0 and cfg.lemon_factor > 1:
        gpu = _lemon_weighted_gpus(cfg, num_gpus, gpus_per_host, n, rng)
    else:
        gpu = rng.integers(0, num_gpus, size=n)
    blast = np.array([BLASTS.index(c.blast) for c in cfg.classes])[cls]
    keep = end > 0
    return Events(trial[keep], start[keep], end[keep], gpu[keep], blast[keep], cls[keep])


def _lemon_weighted_gpus(
    cfg: SimConfig, num_gpus: int, gpus_per_host: int, n: int, rng: np.random.Generator
) -> np.ndarray:
    """``n`` failed GPUs: a host drawn with lemons ``lemon_factor`` times likelier, then a GPU in it."""
    hosts = num_gpus // gpus_per_host
    weight = np.ones(hosts)
    weight[rng.choice(hosts, size=round(cfg.lemon_host_fraction * hosts), replace=False)] = cfg.lemon_factor
    host = rng.choice(hosts, size=n, p=weight / weight.sum())
    return host * gpus_per_host + rng.integers(0, gpus_per_host, size=n)


def straggler_share(cfg: SimConfig, num_gpus: int, bins: int, bin_h: float, rng: np.random.Generator) -> np.ndarray:
    """[trial, bin] 1 while at least one straggler episode (Poisson, fixed length) is under way, else 0."""
    if cfg.straggler_rate_per_gpu_hour == 0 or cfg.straggler_hours == 0:
        return np.zeros((cfg.trials, bins))
    counts = rng.poisson(cfg.straggler_rate_per_gpu_hour * num_gpus * cfg.days * 24, size=cfg.trials)
    trial = np.repeat(np.arange(cfg.trials), counts)
    start = rng.uniform(0, cfg.days * 24, size=trial.size)
    ev = Events(trial, start, start + cfg.straggler_hours, np.zeros_like(trial), np.zeros_like(trial))
    return (failed_counts(ev, cfg.trials, bins, bin_h) > 0).astype(float)


def failed_counts(events: Events, trials: int, bins: int, bin_h: float) -> np.ndarray:
    """[trial, bin] number of units down, by adding +1 at each failure and -1 at each repair.
    Both ends round to the nearest bin boundary, so durations are right on average.

    >>> ev = Events(np.array([0, 0]), np.array([0.4, 1.6]), np.array([2.6, 9.0]), np.zeros(2), np.zeros(2))
    >>> failed_counts(ev, trials=1, bins=4, bin_h=1.0).tolist()
    [[1, 1, 2, 1]]
    """
    diff = np.zeros((trials, bins + 1), dtype=np.int32)
    b0 = np.clip(np.rint(events.start_h / bin_h), 0, bins).astype(np.int64)
    b1 = np.clip(np.rint(events.end_h / bin_h), 0, bins).astype(np.int64)
    np.add.at(diff, (events.trial, b0), 1)
    np.add.at(diff, (events.trial, b1), -1)
    return np.cumsum(diff, axis=1)[:, :bins]
