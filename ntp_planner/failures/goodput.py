"""Goodput accounting: each strategy's throughput over time in one batch of trials, and the
statistics over all trials.

- ``restart``: synchronous checkpoint-restart as a renewal process (``renewal``): a failure costs
  detection + restart and the work since the last completed checkpoint, failures during a
  recovery join it, the checkpoint clock starts again after it; the job continues on replacement
  hardware at full speed.
- ``dp-drop``, ``spares``, ``ntp``, ``ntp-pw``: the job reconfigures (detection +
  reconfiguration on a failure, reconfiguration when a repaired GPU rejoins; one landing inside
  another's recovery joins it), keeps its state
  from the surviving replicas (no rollback) and runs at the re-planned throughput; with a fixed
  batch it pauses while the re-planned throughput is 0.
Every strategy pays checkpoint writes: of the time it runs, it keeps ``renewal.kept_work_s`` (whole
cycles of interval + write, then a final checkpoint at the run's end), so with no failure every
strategy's goodput is the same W(run) / run (over a long run, interval / (interval + write)).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ntp_planner.failures.events import Events
from ntp_planner.failures.renewal import covered_share, kept_work_s, restart_work, stall_windows
from ntp_planner.failures.states import FailureStates

if TYPE_CHECKING:
    from ntp_planner.failures.sim_config import SimConfig
    from ntp_planner.failures.tables import ThroughputTables


class StrategyStats(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    goodput: float = Field(description="Productive time / wall time (Google's time-based goodput).")
    capacity_goodput: float = Field(description="Useful samples / samples of a failure-free run.")
    ettr: float = Field(description="Effective training time ratio (Meta).")
    throughput_loss: float = Field(description="1 - capacity_goodput.")
    hours_paused: float = Field(description="Hours the job stood still waiting for GPUs (fixed batch).")
    interruptions: float = Field(description="Failures that stopped or reconfigured the job.")
    restarts: float = Field(description="Checkpoint restarts.")
    reconfigurations: float = Field(description="Elastic reconfigurations: one per failure and one per rejoin.")
    spares_needed: float = Field(
        description="Fewest spare domains with which a fixed batch never pauses in a trial (its worst moment)."
    )
    idle_gpu_hours: float = Field(description="Healthy GPUs left idle by the re-planned layouts, times hours.")
    time_over_threshold: float = Field(description="Share of time with more than down_threshold of GPUs down.")


class StrategyResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    mean: StrategyStats = Field(description="Mean over trials.")
    p5: StrategyStats = Field(description="5th percentile over trials, per statistic.")
    p95: StrategyStats = Field(description="95th percentile over trials, per statistic.")
    checkpoint_interval_s: float = Field(description="Compute time between checkpoints.")
    spares_needed_worst: float = Field(default=0.0, description="spares_needed of the worst trial.")


@dataclass
class Trace:
    """One trial's time series, for plots."""

    bin_h: float
    failed_fraction: np.ndarray
    throughput: dict[str, np.ndarray]
    capacity_goodput: dict[str, np.ndarray]  # per trial, for the distribution plot


@dataclass
class Batch:
    """What every strategy's accounting reads of one batch of trials."""

    events: Events
    states: FailureStates
    slow: np.ndarray  # [trial, bin] speed under stragglers (1 = full speed)
    run_h: float
    bin_h: float
    stalls: tuple | None = None  # (trial, start s, seconds): the windows elastic strategies stand still

    @property
    def trials(self) -> int:
        return self.slow.shape[0]

    @property
    def in_run(self) -> np.ndarray:
        """Events that strike during the run (the rest were already down at its start)."""
        return self.events.start_h >= 0

    @property
    def failures(self) -> np.ndarray:
        """Failures during the run, per trial."""
        return np.bincount(self.events.trial[self.in_run], minlength=self.trials).astype(float)

    @property
    def repairs(self) -> np.ndarray:
        """Repairs during the run, per trial."""
        ev = self.events
        return np.bincount(ev.trial[(ev.end_h >= 0) & (ev.end_h < self.run_h)], minlength=self.trials).astype(float)


def restart_row(
    cfg: SimConfig, batch: Batch, tables: ThroughputTables, interval_s: float
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Checkpoint-restart as a renewal process (``renewal``): per-trial statistics and trial 0's
    throughput per bin. A failure loses the work since the last completed checkpoint and costs
    detection + restart; one landing inside that recovery joins it."""
    ev, in_run, size = batch.events, batch.in_run, batch.trials
    run_s = cfg.days * 86400
    productive = interval_s / (interval_s + cfg.checkpoint_write_s)
    work, restarts, spans = restart_work(
        ev.trial[in_run],
        ev.start_h[in_run] * 3600,
        size,
        run_s,
        interval_s,
        cfg.checkpoint_write_s,
        cfg.detection_s + cfg.restart_s,
    )
    good = work / run_s
    needed = spares_needed(tables, "restart", batch.states.states)[batch.states.inverse].max(axis=1)
    row = dict(
        goodput=good,
        capacity_goodput=good * batch.slow.mean(axis=1),
        ettr=good,
        hours_paused=np.zeros(size),
        interruptions=batch.failures,
        restarts=restarts,
        reconfigurations=np.zeros(size),
        spares_needed=needed,
        idle_gpu_hours=np.zeros(size),
    )
    # the spans are whole checkpoint cycles: the simulator scales the trace by I / (I + w)
    series = covered_share(spans, batch.slow.shape[1], batch.bin_h * 3600) / productive
    return row, series * batch.slow[0]


def elastic_row(
    cfg: SimConfig, batch: Batch, tables: ThroughputTables, strategy: str, interval_s: float
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """An elastic strategy: per-trial statistics and trial 0's throughput per bin, from the
    re-planned throughput of each bin's failure state."""
    size, bins, bin_h = batch.trials, batch.slow.shape[1], batch.bin_h
    states, inverse = batch.states.states, batch.states.inverse
    run_s = cfg.days * 86400
    failures, repairs = batch.failures, batch.repairs
    tp, idle = tables.arrays(strategy, cfg.batch, states)
    tput = tp[inverse] * batch.slow
    paused = (tp[inverse] == 0) if cfg.batch == "fixed" else np.zeros((size, bins), dtype=bool)
    paused_s = paused.sum(axis=1) * bin_h * 3600
    if batch.stalls is None:  # the same windows for every elastic strategy
        batch.stalls = elastic_stalls(cfg, batch.events, batch.run_h, size, run_s)
    stall = running_stalls(batch.stalls, paused, bin_h, size)
    write_s = cfg.checkpoint_write_s
    # the job keeps its state through stalls and pauses: one checkpoint clock over the time it runs
    running_s = np.clip(run_s - stall - paused_s, 0, None)
    work_s = kept_work_s(running_s, interval_s, write_s)
    good = work_s / run_s
    # capacity: the throughput per bin (0 while paused), less the stalls' share of the time it is
    # not paused, of which the share of the time it runs that is kept work
    unpaused_s = run_s - paused_s
    stalled = np.divide(stall, unpaused_s, out=np.zeros(size), where=unpaused_s > 0)
    productive = np.divide(work_s, running_s, out=np.zeros(size), where=running_s > 0)
    cap = tput.mean(axis=1) * np.clip(1 - stalled, 0, None) * productive
    needed = spares_needed(tables, strategy, states)[inverse].max(axis=1)
    row = dict(
        goodput=good,
        capacity_goodput=cap,
        ettr=good,
        hours_paused=paused_s / 3600,
        interruptions=failures,
        restarts=np.zeros(size),
        reconfigurations=failures + repairs,
        spares_needed=needed,
        idle_gpu_hours=idle[inverse].sum(axis=1) * bin_h,
    )
    return row, tput[0]


def elastic_stalls(
    cfg: SimConfig, ev: Events, run_h: float, trials: int, run_s: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The windows (trial, start s, seconds up to ``run_s``) in which an elastic job stands still:
    detection + reconfiguration after each failure during the run, reconfiguration when a repaired
    GPU rejoins before ``run_h``; one that lands inside another's recovery joins it
    (``renewal.recovery_windows``). The capacity planner bins the same windows."""
    fails, rejoins = ev.start_h >= 0, (ev.end_h >= 0) & (ev.end_h < run_h)
    trial = np.concatenate([ev.trial[fails], ev.trial[rejoins]])
    start = np.concatenate([ev.start_h[fails], ev.end_h[rejoins]]) * 3600
    duration = np.concatenate(
        [np.full(int(fails.sum()), cfg.detection_s + cfg.reconfigure_s), np.full(int(rejoins.sum()), cfg.reconfigure_s)]
    )
    return stall_windows(trial, start, duration, trials, run_s)


def running_stalls(windows, paused: np.ndarray, bin_h: float, trials: int) -> np.ndarray:
    """Per trial, the seconds of the stall windows that start in a bin where the job runs: a job
    paused for GPUs loses nothing more to a recovery then (it reconfigures while it waits). A window
    starting at ``t`` belongs to bin rint(t / bin_h), the first bin whose state holds the failure
    that starts it (as ``failed_counts`` rounds), so the failure that pauses the job is never charged.

    >>> w = (np.array([0, 0, 1]), np.array([100.0, 4000.0, 100.0]), np.array([60.0, 60.0, 30.0]))
    >>> paused = np.array([[False, True], [False, False]])
    >>> running_stalls(w, paused, bin_h=1.0, trials=2).tolist()
    [60.0, 30.0]
    """
    trial, start_s, lost_s = windows
    bins = paused.shape[1]
    b = np.clip(np.rint(start_s / (bin_h * 3600)).astype(np.int64), 0, bins - 1)
    keep = ~paused[trial, b]
    return np.bincount(trial[keep], weights=lost_s[keep], minlength=trials).astype(float)


def spares_needed(tables: ThroughputTables, strategy: str, states: np.ndarray) -> np.ndarray:
    """Fewest spare domains each state needs to keep a fixed batch without pausing, searched by
    the re-planner over every use of the pool (``Replanner.fewest_spares``). Restart restarts at
    full size: it needs what dropping replicas needs."""
    policy = "dp-drop" if strategy in ("restart", "spares") else strategy  # spares falls back to dp-drop
    return np.array([tables.need(policy, tuple(int(x) for x in row)) for row in states], dtype=float)


def summarize(rows: list[dict[str, np.ndarray]], interval_s: float) -> tuple[StrategyResult, np.ndarray]:
    """Mean, p5 and p95 over all trials of one strategy, and every trial's capacity goodput."""
    merged = {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}
    pick = {
        q: StrategyStats(**{k: float(f(v)) for k, v in merged.items()})
        for q, f in (
            ("mean", np.mean),
            ("p5", lambda v: np.percentile(v, 5)),
            ("p95", lambda v: np.percentile(v, 95)),
        )
    }
    result = StrategyResult(
        **pick, checkpoint_interval_s=interval_s, spares_needed_worst=float(merged["spares_needed"].max())
    )
    return result, merged["capacity_goodput"]
