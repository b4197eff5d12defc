"""Time to train under failures, per trial: the capacity planner's simulation (``capacity``).

Where ``simulator`` runs a plan for a fixed number of days and reports its goodput, this runs a
plan until its tokens are trained, so the time to train has a distribution over trials. It
reuses the simulator's steps: failure states (``states``), re-planned throughput per state
(``tables``), recoveries as a renewal process (``renewal``), with the same rules:

- an elastic strategy (``dp-drop``, ``spares``, ``ntp``, ``ntp-pw``; a flexible batch) trains in
  each time bin at its failure state's re-planned throughput, times ``I / (I + w)`` for the
  checkpoint writes, less the bin's share of recoveries (detection + reconfiguration after a
  failure, reconfiguration at a rejoin; one landing inside another joins it; a recovery counts in
  the bin it starts in). The time to train is where the cumulative work crosses the target,
  interpolated inside its bin;
- ``restart`` computes ``I``, writes ``w``, and so on; a failure throws away the work since the
  last completed checkpoint and costs detection + restart; the tokens are trained when the kept
  work plus the current run's reaches the target (``restart_hours``: closed form per run).

Common random numbers (``EventPool``): failures are drawn once per seed, for the largest GPU
count of the search, in chunks of ``CHUNK_H`` hours, each chunk from its own generator
``(seed, chunk)``. A job of n GPUs sees the failures of GPUs 0 .. n - 1: keeping each event of a
Poisson process of rate ``lambda N`` with probability n / N leaves one of rate ``lambda n``. So
every candidate meets the same failures, and a longer horizon only adds failures after a
shorter one's end: a trial's time to train does not depend on the horizon it was found with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ntp_planner.failures.events import Events
from ntp_planner.failures.goodput import elastic_stalls
from ntp_planner.failures.renewal import recovery_windows
from ntp_planner.failures.sampling import BLASTS
from ntp_planner.failures.sim_config import SimConfig
from ntp_planner.failures.states import Domains, FailureStates, failure_states
from ntp_planner.failures.tables import ThroughputTables

CHUNK_H = 24 * 30  # hours of failures one generator draws
BIN_S = 1800  # time resolution of the failure states (the simulator's default is 600 s)


@dataclass
class EventPool:
    """Failures of every trial on ``max_gpus`` GPUs, drawn chunk by chunk on demand."""

    cfg: SimConfig  # failure rate, classes and start (steady: failures already in repair at 0)
    trials: int
    max_gpus: int
    seed: int
    chunks: dict[int, Events] = field(default_factory=dict)

    def chunk(self, k: int) -> Events:
        """Failures starting in chunk k, [k CHUNK_H, (k + 1) CHUNK_H) hours; chunk 0 also holds
        the warm-up before time 0 (one longest repair for a steady start)."""
        if k not in self.chunks:
            cfg, rng = self.cfg, np.random.default_rng([self.seed, k])
            lo, hi = k * CHUNK_H - (cfg.warm_h if k == 0 else 0.0), (k + 1) * CHUNK_H
            counts = rng.poisson(cfg.failure_rate_per_gpu_hour * self.max_gpus * (hi - lo), size=self.trials)
            trial = np.repeat(np.arange(self.trials), counts)
            start = rng.uniform(lo, hi, size=trial.size)
            cls = rng.choice(len(cfg.classes), size=trial.size, p=[c.share for c in cfg.classes])
            repair_lo = np.array([c.repair_min_h for c in cfg.classes])[cls]
            repair_hi = np.array([c.repair_max_h for c in cfg.classes])[cls]
            end = start + rng.uniform(repair_lo, repair_hi)
            gpu = rng.integers(0, self.max_gpus, size=trial.size)
            blast = np.array([BLASTS.index(c.blast) for c in cfg.classes], dtype=np.int64)[cls]
            self.chunks[k] = Events(trial, start, end, gpu, blast)
        return self.chunks[k]

    def events(self, gpus: int, horizon_h: float) -> Events:
        """Failures of GPUs 0 .. gpus - 1 that start before ``horizon_h`` and end after 0."""
        parts = [self.chunk(k) for k in range(max(1, math.ceil(horizon_h / CHUNK_H)))]
        ev = Events(
            *(np.concatenate([getattr(p, f) for p in parts]) for f in ("trial", "start_h", "end_h", "gpu", "blast"))
        )
        return ev.take((ev.gpu < gpus) & (ev.start_h < horizon_h) & (ev.end_h > 0))


@dataclass
class JobFailures:
    """One job's failures up to a horizon: what every strategy and spare count of it shares."""

    events: Events
    horizon_h: float
    states: FailureStates
    stall_s: np.ndarray  # [trial, bin] seconds an elastic job stands still in recoveries

    @property
    def bins(self) -> int:
        return self.stall_s.shape[1]


def job_failures(pool: EventPool, tables: ThroughputTables, gpus: int, horizon_h: float) -> JobFailures:
    """The failure states and elastic recoveries of a job of ``gpus`` GPUs over ``horizon_h``
    (a whole number of bins)."""
    cfg, trials = pool.cfg, pool.trials
    bins = round(horizon_h * 3600 / BIN_S)
    ev = pool.events(gpus, horizon_h)
    cluster = tables.cluster
    used = cluster.used_per_domain
    domains = Domains(used=used, node=tables.node, idle=cluster.spec.domain_size - used)
    states = failure_states(ev, trials, bins, BIN_S / 3600, domains)
    trial, start_s, lost = elastic_stalls(cfg, ev, horizon_h, trials, math.inf)  # simulate's windows, unclipped
    stall = np.zeros((trials, bins))
    np.add.at(stall, (trial, np.minimum(start_s // BIN_S, bins - 1).astype(np.int64)), lost)
    return JobFailures(ev, horizon_h, states, stall)


def crossing_hours(step_s: np.ndarray, work_s: float) -> np.ndarray:
    """Per trial (row), when the cumulative work of ``step_s`` (work done in each bin of BIN_S
    seconds) reaches ``work_s``, interpolated linearly inside the bin; inf when it never does.

    >>> crossing_hours(np.array([[1800.0, 900.0, 1800.0], [0.0, 0.0, 900.0]]), 3600.0).tolist()
    [1.25, inf]
    """
    cum = np.cumsum(step_s, axis=1)
    reached = cum[:, -1] >= work_s
    idx = np.argmax(cum >= work_s, axis=1)
    rows = np.arange(step_s.shape[0])
    step = step_s[rows, idx]
    before = cum[rows, idx] - step
    inside = np.divide(work_s - before, step, out=np.zeros_like(step), where=step > 0)
    return np.where(reached, (idx + inside) * BIN_S / 3600, np.inf)


def elastic_hours(job: JobFailures, throughput: np.ndarray, productive: float, work_s: float) -> np.ndarray:
    """Per trial, hours until ``work_s`` seconds of failure-free work are done by an elastic
    strategy whose relative throughput in each failure state is ``throughput`` (one per row of
    ``job.states.states``); inf for a trial that needs more than the horizon."""
    speed = throughput[job.states.inverse] * productive * np.clip(1 - job.stall_s / BIN_S, 0, None)
    return crossing_hours(speed * BIN_S, work_s)


def restart_hours(
    ev: Events, trials: int, horizon_h: float, work_s: float, interval_s: float, write_s: float, recovery_s: float
) -> np.ndarray:
    """Per trial, hours until checkpoint-restart has kept ``work_s`` seconds of work; inf past
    the horizon (failures after it were not drawn).

    A run starts at 0 or ``recovery_s`` after a failure that starts a recovery, and ends at the
    next one. With K kept before it and R = work_s - K left, it is done after n = ceil(R / I) - 1
    whole cycles of I + w and r = R - n I more compute: at start + n (I + w) + r, if that comes
    before its end. Two failures at 3,600 s and 7,200 s, I = 1,000, w = 200, D = 300, 5,000 s of
    work: 3 cycles kept by 3,600 s; from 3,900 s, 2 more by 6,300 s (5,000 kept at 6,100 s).

    >>> h = restart_hours(Events(np.zeros(2, int), np.array([1.0, 2.0]), np.array([2.0, 3.0]), np.zeros(2, int),
    ...     np.zeros(2, int)), 1, 10.0, 5000.0, 1000.0, 200.0, 300.0)
    >>> (h * 3600).tolist()
    [6100.0]
    """
    seg_t, seg_begin, seg_end = _runs(ev, trials, horizon_h, recovery_s)
    cycle = interval_s + write_s
    closed = np.isfinite(seg_end)  # every run but each trial's last, which no failure ends
    kept = np.zeros(seg_t.size)
    if not math.isinf(interval_s):  # without checkpoints nothing is kept but by the last run
        kept[closed] = np.floor(np.clip(seg_end[closed] - seg_begin[closed], 0, None) / cycle) * interval_s
    total = np.cumsum(kept)
    group_first = np.searchsorted(seg_t, seg_t)  # index of each trial's first run
    before = total - kept - (total[group_first] - kept[group_first])
    left = work_s - before
    if math.isinf(interval_s):
        done_at = seg_begin + left
    else:
        n = np.maximum(np.ceil(left / interval_s) - 1, 0)
        done_at = seg_begin + n * cycle + (left - n * interval_s)
    done_at = np.where((left > 0) & (done_at <= seg_end), done_at, np.inf)
    out = np.full(trials, np.inf)
    np.minimum.at(out, seg_t, done_at)
    return np.where(out <= horizon_h * 3600, out / 3600, np.inf)


def _runs(ev: Events, trials: int, horizon_h: float, recovery_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Checkpoint-restart's runs, by trial then start: trial, start and end in seconds. Each trial's
    first starts at 0, the others ``recovery_s`` after a failure that starts a recovery (one inside
    another's recovery joins it), each ends at the next such failure, the last never (inf)."""
    in_run = (ev.start_h >= 0) & (ev.start_h < horizon_h)
    trial, fail_s = ev.trial[in_run], ev.start_h[in_run] * 3600
    heads, _ = recovery_windows(trial, fail_s, np.full(fail_s.shape, recovery_s), trials)
    t, f = trial[heads], fail_s[heads]
    order = np.lexsort((f, t))
    t, f = t[order], f[order]
    first = np.r_[True, t[1:] != t[:-1]] if t.size else np.zeros(0, dtype=bool)
    begin = np.where(first, 0.0, np.r_[0.0, f[:-1]] + recovery_s)
    last_begin = np.zeros(trials)
    last_begin[t] = f + recovery_s  # sorted by time: the latest failure of each trial wins
    seg_t = np.concatenate([t, np.arange(trials)])
    seg_begin = np.concatenate([begin, last_begin])
    seg_end = np.concatenate([f, np.full(trials, np.inf)])
    order = np.lexsort((seg_begin, seg_t))
    return seg_t[order], seg_begin[order], seg_end[order]
