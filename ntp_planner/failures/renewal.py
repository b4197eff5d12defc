"""Recoveries as a renewal process: what a failure costs when the next one may land inside its
recovery, and checkpoint-restart's goodput in closed form.

One rule for every strategy's stall (``recovery_windows``): a failure (or rejoin) that lands
while a recovery is under way joins it; the recovery already on its way takes the new failed
GPUs' replacement along and ends when it would have. So a burst of failures costs one recovery,
not one each, and the time lost is the union of recoveries that start on a running job.

Checkpoints (``kept_work_s``): a job that runs for ``R`` seconds computes ``I``, writes a checkpoint
for ``w``, and so on, and writes a final checkpoint at the end, inside ``R``: work is kept only if
a checkpoint follows it. Every strategy keeps this much of its running time.

Checkpoint-restart (``restart_work``): the job computes ``I`` seconds, writes a checkpoint for
``w``, and so on. A failure throws away the work since the last completed checkpoint (a write in
progress is lost too), the job recovers for ``D`` = detection + restart, and the checkpoint clock
starts again when it is back. Failures are Poisson at rate ``lambda`` for the job, so each
segment of ``I + w`` completes with probability q = exp(-lambda (I + w)); between two failures
a run completes q / (1 - q) segments on average, and a failure cycle lasts D + 1/lambda (the
recovery, then an exponential wait: memoryless, so failures absorbed by the recovery change
nothing after it). Goodput = I q / (1 - q) / (D + 1/lambda) (``renewal_goodput``).
"""

from __future__ import annotations

import math

import numpy as np


def renewal_goodput(rate_per_s: float, interval_s: float, write_s: float, recovery_s: float) -> float:
    """Long-run share of wall time spent on work that is kept, under checkpoint-restart.

    lambda = 1 / 3,600 s, I = 1,500 s, w = 300 s, D = 600 s: q = exp(-0.5) = 0.60653,
    q / (1 - q) = 1.54149, so 1,500 x 1.54149 / (600 + 3,600) = 0.55053.

    >>> round(renewal_goodput(1 / 3600, 1500, 300, 600), 5)
    0.55053
    >>> renewal_goodput(0, 1500, 300, 600)  # no failures: only the writes cost, I / (I + w)
    0.8333333333333334
    """
    if rate_per_s <= 0:
        return interval_s / (interval_s + write_s)
    q = math.exp(-rate_per_s * (interval_s + write_s))
    return interval_s * q / -math.expm1(-rate_per_s * (interval_s + write_s)) / (recovery_s + 1 / rate_per_s)


def kept_work_s(running_s, interval_s: float, write_s: float) -> np.ndarray:
    """Work kept by a job running ``running_s`` seconds (an array) without a failure: ``k`` whole
    cycles of ``I + w`` (k = floor(R / (I + w))), then in the rest ``r = R - k (I + w)`` (less than
    ``I + w``) it computes ``r - w`` and writes the final checkpoint, or, with ``r <= w``, keeps
    nothing more. W(R) = k I + max(0, r - w); over a long run W(R) / R tends to I / (I + w).

    R = 86,400 s, I = 3,000 s, w = 300 s: 26 cycles (85,800 s, 78,000 s of work) and 600 s in which
    300 s of work and the final write fit: 78,300 s, 0.90625 of the day. A checkpoint interval of the
    whole run (``checkpoint_interval.interval_s`` without failures) keeps R - w.

    >>> kept_work_s(np.array([86_400.0, 10_000, 150]), 3000, 300).tolist()
    [78300.0, 9000.0, 0.0]
    >>> kept_work_s(np.array([86_400.0]), 86_400, 300).tolist()
    [86100.0]
    """
    cycle = interval_s + write_s
    running = np.clip(np.asarray(running_s, dtype=float), 0, None)
    k = np.floor(running / cycle)
    return k * interval_s + np.clip(running - k * cycle - write_s, 0, None)


def recovery_windows(trial: np.ndarray, start_s: np.ndarray, duration_s: np.ndarray, trials: int):
    """Recoveries that start on a running job, per trial: (which events start one, in the input's
    order; the ends of the recovery each event falls in, in the input's order). An event that
    lands while a recovery is under way joins it (see the module docstring).

    >>> heads, ends = recovery_windows(np.zeros(3, int), np.array([0.0, 50, 200]), np.full(3, 100.0), 1)
    >>> heads.tolist(), ends.tolist()
    ([True, False, True], [100.0, 100.0, 300.0])
    """
    order = np.lexsort((start_s, trial))
    t, s, d = trial[order], start_s[order], duration_s[order]
    heads = np.ones(t.size, dtype=bool)
    # an event that starts a trial, or comes the longest recovery after the one before, starts a
    # recovery whatever came before; only the rest need the sequential rule
    unsure = np.flatnonzero(np.r_[False, (t[1:] == t[:-1]) & (s[1:] - s[:-1] < d.max(initial=0))])
    index = np.arange(t.size)
    last_sure = np.maximum.accumulate(np.where(np.isin(index, unsure, invert=True), index, 0))
    latest = -1  # the latest head among the unsure events
    s_list, d_list = s.tolist(), d.tolist()
    for i in unsure.tolist():
        h = max(int(last_sure[i]), latest)
        if s_list[i] >= s_list[h] + d_list[h]:
            latest = i
        else:
            heads[i] = False
    head_of = np.maximum.accumulate(np.where(heads, index, 0))
    ends = (s + d)[head_of]
    out_heads, out_ends = np.empty_like(heads), np.empty_like(ends)
    out_heads[order], out_ends[order] = heads, ends
    return out_heads, out_ends


def stall_seconds(trial, start_s, duration_s, trials: int, run_s: float) -> np.ndarray:
    """Per trial, the time the job stands still in recoveries (their union), within the run."""
    t, _, lost = stall_windows(trial, start_s, duration_s, trials, run_s)
    return np.bincount(t, weights=lost, minlength=trials).astype(float)  # int when empty


def stall_windows(trial, start_s, duration_s, trials: int, run_s: float):
    """The recoveries' union as windows: each window's trial, start and seconds within the run."""
    heads, ends = recovery_windows(trial, start_s, duration_s, trials)
    return trial[heads], start_s[heads], np.clip(ends[heads], None, run_s) - start_s[heads]


def restart_work(
    trial: np.ndarray,
    fail_s: np.ndarray,
    trials: int,
    run_s: float,
    interval_s: float,
    write_s: float,
    recovery_s: float,
) -> tuple[np.ndarray, np.ndarray, list[tuple[float, float]]]:
    """Checkpoint-restart over a run of ``run_s``: per trial the compute time kept and the
    restarts, and trial 0's kept spans ``(start, end)`` (each a whole number of checkpoint
    cycles, or the run's tail), for its throughput trace. The job starts fresh at time 0; the tail
    after the last restart keeps ``kept_work_s`` of it (a final checkpoint at the run's end).

    Two failures an hour apart, I = 1,000 s, w = 200 s, D = 300 s over 10,000 s: from 0 to
    3,600 s, 3 cycles of 1,200 s complete (3,000 s kept, nothing lost); the job is back at
    3,900 s, 2 cycles complete before 7,200 s (2,000 s kept, 900 s lost); back at 7,500 s, the
    tail of 2,500 s holds 2 cycles and 100 s, too short for work and the final write of 200 s
    (2,000 s kept): 7,000 s in all.

    >>> work, restarts, spans = restart_work(np.zeros(2, int), np.array([3600.0, 7200]), 1, 10_000, 1000, 200, 300)
    >>> work.tolist(), restarts.tolist(), spans
    ([7000.0], [2.0], [(0.0, 3600.0), (3900.0, 6300.0), (7500.0, 10000.0)])
    """
    heads, _ = recovery_windows(trial, fail_s, np.full(fail_s.shape, recovery_s), trials)
    t, f = trial[heads], fail_s[heads]
    order = np.lexsort((f, t))
    t, f = t[order], f[order]
    cycle = interval_s + write_s
    # the job (re)starts at 0 and D after each restart; each run ends at the next failure or the run's end
    first = np.r_[True, t[1:] != t[:-1]] if t.size else np.zeros(0, dtype=bool)
    begin = np.where(first, 0.0, np.r_[0.0, f[:-1]] + recovery_s)
    done = np.floor(np.clip(f - begin, 0, None) / cycle)
    work = np.bincount(t, weights=done * interval_s, minlength=trials).astype(float)  # int when empty
    restarts = np.bincount(t, minlength=trials).astype(float)
    last = np.zeros(trials)  # when the tail begins: D after the last restart, 0 without one
    last[t] = f + recovery_s  # the latest failure of each trial wins (sorted by time)
    work += kept_work_s(run_s - last, interval_s, write_s)
    zero = t == 0
    spans = [(float(b), float(b + n * cycle)) for b, n in zip(begin[zero], done[zero], strict=True)]
    if last[0] < run_s:
        spans.append((float(last[0]), float(run_s)))
    return work, restarts, spans


def covered_share(spans: list[tuple[float, float]], bins: int, bin_s: float) -> np.ndarray:
    """Share of each time bin covered by ``spans`` (disjoint ``(start, end)`` seconds).

    >>> covered_share([(0.0, 150.0), (250.0, 300.0)], bins=3, bin_s=100.0).tolist()
    [1.0, 0.5, 0.5]
    """
    edges = np.arange(bins + 1) * bin_s
    covered = np.zeros(bins + 1)
    for a, b in spans:
        covered += np.clip(edges - a, 0, b - a)
    return np.diff(covered) / bin_s
