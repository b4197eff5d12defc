"""Checkpoint intervals and the expected effective training time of checkpoint-restart.

Young (1974): tau = sqrt(2 delta M). Daly (2006): tau = sqrt(2 delta M) [1 + (1/3) sqrt(delta /
(2M)) + (1/9) (delta / (2M))] - delta for delta < 2M, else M; delta = checkpoint write time,
M = mean time between failures of the job. Meta (Kokolis et al., arXiv 2410.21680):
E[ETTR] ~ (1 - n r (u0 + dt/2)) / (1 + w/dt), n r = the job's failure rate, u0 = restart
overhead, dt = checkpoint interval, w = checkpoint write time. (shared/reference/failures.md)
"""

from __future__ import annotations

import math


def young_interval_s(write_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum checkpoint interval.

    >>> young_interval_s(300, 3600 * 3)
    2545.584412271571
    """
    return math.sqrt(2 * write_s * mtbf_s)


def daly_interval_s(write_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum checkpoint interval (compute time between checkpoints)."""
    if write_s >= 2 * mtbf_s:
        return mtbf_s
    x = write_s / (2 * mtbf_s)
    return math.sqrt(2 * write_s * mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9) - write_s


def meta_ettr(job_failures_per_s: float, restart_s: float, interval_s: float, write_s: float) -> float:
    """Meta's expected ETTR of synchronous checkpoint-restart."""
    return (1 - job_failures_per_s * (restart_s + interval_s / 2)) / (1 + write_s / interval_s)


def interval_s(configured_s: float | None, write_s: float, job_failures_per_h: float, run_s: float) -> float:
    """The checkpoint interval a run uses: the configured one, else Daly's optimum for the job's
    mean time between failures (3600 / failures per hour), else, with no failures, the whole run
    (one checkpoint at the end)."""
    if configured_s is not None:
        return configured_s
    if job_failures_per_h <= 0:
        return run_s
    return daly_interval_s(write_s, 3600 / job_failures_per_h)
