"""Goodput of a training run under failures: a seeded Monte-Carlo simulation, vectorised over
trials, composed of four steps, each in its own module:

1. ``events``: failures, repairs and straggler episodes of every trial (default failure rate
   from Llama 3: 419 unexpected interruptions / (16,384 GPUs x 54 days) = 1.97e-5 per GPU-hour;
   78% hardware repaired in 3-5 days, 22% software repaired in 3 hours, one GPU each);
2. ``states``: time cut into bins, the failed units per bin, numbered by distinct state;
3. here, ``ThroughputTables``: each distinct state's throughput per strategy, from the NTP
   re-planning code (``Replanner``), computed once and cached;
4. ``goodput``: each strategy's throughput over time and its statistics over trials, with
   recoveries as a renewal process (``renewal``: a failure inside a recovery joins it).
Checkpoint intervals (Daly's optimum by default) come from ``checkpoint``; spare domains are a
pool every elastic strategy draws on (``spare_pool``), and ``spares_needed`` is the fewest that
keep a fixed batch, searched per failure state. A run starts in steady state or healthy
(``SimConfig.start``).

Work is refused up front, with the arithmetic, when it would run for more than minutes or hold
more than a few GB: see ``SimConfig`` and ``check_workload``.
"""

from __future__ import annotations

import numpy as np

from ntp_planner.failures import checkpoint_interval
from ntp_planner.failures.events import draw_events, failed_counts, straggler_share
from ntp_planner.failures.goodput import (
    Batch,
    StrategyResult,
    StrategyStats,
    Trace,
    elastic_row,
    restart_row,
    summarize,
)
from ntp_planner.failures.sim_config import (
    CHUNK,
    SimConfig,
    check_strategies,
    check_workload,
)
from ntp_planner.failures.states import Domains, failure_states
from ntp_planner.failures.tables import ThroughputTables
from ntp_planner.plan import Plan

__all__ = ["StrategyResult", "StrategyStats", "Trace", "pool_rows", "draw_events", "failed_counts", "simulate"]


def pool_rows(plan: Plan, runs: dict[int, dict[str, StrategyResult]]) -> list[dict]:
    """One row per pool size and strategy. Per-GPU throughput counts the spare domains as GPUs
    paid for: capacity goodput x job GPUs / (job GPUs + spares x GPUs per domain), relative to the
    failure-free job without spares."""
    n, domain = plan.cluster.num_gpus, plan.cluster.spec.domain_size
    rows = []
    for k, results in runs.items():
        for s, r in results.items():
            share = n / (n + k * domain)
            rows.append(
                {
                    "spares": k,
                    "strategy": s,
                    "spare_gpus": k * domain,
                    "gpu_throughput": r.mean.capacity_goodput * share,
                    "gpu_throughput_p5": r.p5.capacity_goodput * share,
                    "gpu_throughput_p95": r.p95.capacity_goodput * share,
                    "goodput": r.mean.goodput,
                    "capacity_goodput": r.mean.capacity_goodput,
                    "hours_paused": r.mean.hours_paused,
                    "hours_paused_p95": r.p95.hours_paused,
                    "spares_needed": r.mean.spares_needed,
                }
            )
    return rows


def simulate(
    plan: Plan, cfg: SimConfig, strategies: list[str], rng: np.random.Generator, progress=None, source=draw_events
) -> tuple[dict[str, StrategyResult], Trace]:
    """Simulate ``cfg.trials`` runs of ``plan``; statistics per strategy and one trial's trace.
    ``rng`` draws every event; ``progress(k)`` hears of each batch of k trials done. ``source``
    gives each batch's failures (``draw_events``' arguments): a replayed trace or a recorder
    (``trace``) stands in for the draws."""
    check_strategies(strategies)
    n = plan.cluster.num_gpus
    check_workload(cfg, n, len(strategies))
    job_rate = cfg.failure_rate_per_gpu_hour * n
    interval = checkpoint_interval.interval_s(
        cfg.checkpoint_interval_s, cfg.checkpoint_write_s, job_rate, cfg.days * 86400
    )
    productive = interval / (interval + cfg.checkpoint_write_s)
    tables = ThroughputTables(plan, cfg)
    rows: dict[str, list[dict[str, np.ndarray]]] = {s: [] for s in strategies}
    trace = Trace(cfg.bin_h, np.zeros(0), {}, {})
    for first in range(0, cfg.trials, CHUNK):
        batch = _draw_batch(plan, cfg, tables, min(CHUNK, cfg.trials - first), rng, source)
        over = (batch.states.gpus_down / n > cfg.down_threshold).mean(axis=1)
        for s in strategies:
            if s == "restart":
                row, series = restart_row(cfg, batch, tables, interval)
            else:
                row, series = elastic_row(cfg, batch, tables, s, interval)
            row["throughput_loss"] = 1 - row["capacity_goodput"]
            row["time_over_threshold"] = over
            rows[s].append(row)
            if first == 0:
                trace.throughput[s] = series * productive
        if first == 0:
            trace.failed_fraction = batch.states.gpus_down[0] / n
        if progress:
            progress(batch.trials)
    results = {}
    for s in strategies:
        results[s], trace.capacity_goodput[s] = summarize(rows[s], interval)
    return results, trace


def _draw_batch(
    plan: Plan, cfg: SimConfig, tables: ThroughputTables, size: int, rng: np.random.Generator, source=draw_events
) -> Batch:
    """Events, failure states and straggler slowdown of ``size`` trials (draws in this order)."""
    part = cfg.model_copy(update={"trials": size})
    n, cluster = plan.cluster.num_gpus, tables.cluster
    ev = source(part, n, plan.cluster.spec.gpus_per_node, rng)
    used = cluster.used_per_domain
    domains = Domains(used=used, node=tables.node, idle=cluster.spec.domain_size - used)
    states = failure_states(ev, size, cfg.bins, cfg.bin_h, domains)
    slow = 1 - straggler_share(part, n, cfg.bins, cfg.bin_h, rng) * (1 - 1 / cfg.straggler_slowdown)
    return Batch(ev, states, slow, cfg.days * 24, cfg.bin_h)
