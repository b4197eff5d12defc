"""Checkpoint-restart as a renewal process, against its closed form and by hand."""

import math

import numpy as np
import pytest
from scipy.optimize import minimize_scalar

from ntp_planner.failures.checkpoint_interval import daly_interval_s
from ntp_planner.failures.renewal import (
    kept_work_s,
    recovery_windows,
    renewal_goodput,
    restart_work,
    stall_seconds,
)
from ntp_planner.failures.sim_config import LLAMA3_RATE_PER_GPU_HOUR

RECOVERY_S, WRITE_S, RUN_S = 660.0, 300.0, 30 * 86400.0  # detection 60 s + restart 600 s; 5-minute writes; 30 days


def test_renewal_closed_form_by_hand():
    # the issue's case: 32,768 GPUs at 3x Llama 3's rate, 30-minute checkpoints:
    # lambda = 3 x 419 / (16,384 x 54 x 24 h) x 32,768 / 3,600 = 2,514 / 4,665,600 = 5.38837e-4 /s;
    # q = exp(-lambda x 2,100) = exp(-1.131559) = 0.322530; q / (1 - q) = 0.476080;
    # 1,800 x 0.476080 / (660 + 1,855.847) = 856.945 / 2,515.847 = 0.340619
    rate = 3 * LLAMA3_RATE_PER_GPU_HOUR * 32768 / 3600
    assert rate == pytest.approx(5.38837e-4, rel=1e-5)
    assert renewal_goodput(rate, 1800, WRITE_S, RECOVERY_S) == pytest.approx(0.340619, abs=1e-6)


@pytest.mark.parametrize("gpus", [4096, 32768])
@pytest.mark.parametrize("times_llama3", [1, 3])
@pytest.mark.parametrize("interval", ["daly", 1800.0])
def test_restart_goodput_is_the_renewal_closed_form(gpus, times_llama3, interval):
    rate = times_llama3 * LLAMA3_RATE_PER_GPU_HOUR * gpus / 3600
    interval_s = daly_interval_s(WRITE_S, 1 / rate) if interval == "daly" else interval
    rng = np.random.default_rng(gpus + times_llama3)
    trials = 100
    counts = rng.poisson(rate * RUN_S, size=trials)
    trial, fail_s = np.repeat(np.arange(trials), counts), rng.uniform(0, RUN_S, size=int(counts.sum()))
    work, restarts, _ = restart_work(trial, fail_s, trials, RUN_S, interval_s, WRITE_S, RECOVERY_S)
    goodput = work / RUN_S
    closed = renewal_goodput(rate, interval_s, WRITE_S, RECOVERY_S)
    # Monte-Carlo error, plus the run's ends (a fresh start, a tail kept whole): under one cycle of 30 days
    tolerance = 4 * goodput.std() / math.sqrt(trials) + (interval_s + WRITE_S) / RUN_S
    assert abs(goodput.mean() - closed) < tolerance
    # failures that land inside a recovery join it: fewer restarts than failures, by about lambda x D
    assert restarts.mean() == pytest.approx(counts.mean() / (1 + rate * RECOVERY_S), rel=0.02)


@pytest.mark.parametrize("gpus", [4096, 32768])
@pytest.mark.parametrize("times_llama3", [1, 3])
def test_dalys_interval_is_the_renewal_optimum(gpus, times_llama3):
    rate = times_llama3 * LLAMA3_RATE_PER_GPU_HOUR * gpus / 3600
    best = minimize_scalar(lambda i: -renewal_goodput(rate, i, WRITE_S, RECOVERY_S), bounds=(10, 1e5), method="bounded")
    daly = daly_interval_s(WRITE_S, 1 / rate)
    assert daly == pytest.approx(best.x, rel=0.005)
    assert renewal_goodput(rate, daly, WRITE_S, RECOVERY_S) == pytest.approx(-best.fun, abs=1e-6)


def test_a_burst_of_failures_costs_one_recovery():
    # failures at 1,000 s, 1,100 s (inside the first recovery, which ends at 1,660 s) and 5,000 s; I = 400 s,
    # w = 100 s: 2 cycles kept before 1,000 s (800 s of work), then back at 1,660 s, 6 cycles of 500 s
    # before 5,000 s (2,400 s), back at 5,660 s, a tail of 4,340 s = 8 cycles + 340 s, in which 240 s of
    # work and the final write of 100 s fit (3,440 s): 6,640 s
    work, restarts, spans = restart_work(
        np.zeros(3, int), np.array([1100.0, 1000.0, 5000.0]), 1, 10_000, 400, 100, RECOVERY_S
    )
    assert (work.tolist(), restarts.tolist()) == ([6640.0], [2.0])
    assert spans == [(0.0, 1000.0), (1660.0, 4660.0), (5660.0, 10000.0)]


def test_elastic_stalls_are_the_union_of_recoveries_that_start_on_a_running_job():
    # trial 0: 0-240 s, a failure at 100 s joins it, 1,000-1,240 s; trial 1: a stall at 9,900 s cut at the end
    trial = np.array([0, 0, 0, 1])
    start = np.array([100.0, 0.0, 1000.0, 9900.0])
    assert stall_seconds(trial, start, np.full(4, 240.0), 2, 10_000).tolist() == [480.0, 100.0]


def test_recovery_windows_agree_with_the_rule_applied_one_event_at_a_time():
    rng = np.random.default_rng(0)
    trial = rng.integers(0, 5, size=400)
    start = rng.uniform(0, 20_000, size=400)
    duration = rng.choice([180.0, 240.0], size=400)
    heads, ends = recovery_windows(trial, start, duration, 5)
    for t in range(5):
        mine = np.flatnonzero(trial == t)
        end = -math.inf
        for i in mine[np.argsort(start[mine])]:
            if start[i] >= end:
                end = start[i] + duration[i]
                assert heads[i]
            else:
                assert not heads[i]
            assert ends[i] == end
    assert 0 < (~heads).sum() < 400


def test_a_run_without_failures_keeps_every_cycle_and_the_work_the_final_checkpoint_saves():
    # 10,000 s of cycles of 1,200 s: 8 cycles (8,000 s of compute) and a tail of 400 s: 200 s of compute,
    # then the final checkpoint's 200 s write
    none = np.zeros(0, dtype=int)
    work, restarts, spans = restart_work(none, np.zeros(0), 2, 10_000, 1000, 200, 300)
    assert (work.tolist(), restarts.tolist(), spans) == ([8200.0, 8200.0], [0.0, 0.0], [(0.0, 10000.0)])
    assert stall_seconds(none, np.zeros(0), np.zeros(0), 2, 10_000).tolist() == [0.0, 0.0]


@pytest.mark.parametrize(
    ("run_s", "interval_s", "write_s", "kept_s"),
    [
        (86_400, 3000, 300, 78_300),  # 26 cycles of 3,300 s (78,000 s of work), 600 s left: 300 s and the write
        (86_400, 3300, 300, 79_200),  # 24 whole cycles, nothing left: the last regular checkpoint is the final one
        (86_400, 3000, 3000, 42_000),  # 14 cycles (42,000 s of work), 2,400 s left: shorter than a write
        (10_000, 1000, 200, 8200),  # 8 cycles, 400 s left: 200 s of work, the 200 s final write
        (10_000, 1000, 0, 10_000),  # free writes: all of it
        (2_592_000, 2_592_000, 300, 2_591_700),  # the whole run as the interval (no failures): one write at the end
        (100, 1000, 300, 0),  # shorter than a write: nothing saved
    ],
)
def test_kept_work_is_whole_cycles_then_the_work_the_final_checkpoint_saves(run_s, interval_s, write_s, kept_s):
    assert kept_work_s(np.array([float(run_s)]), interval_s, write_s).tolist() == [kept_s]


def test_kept_work_tends_to_interval_over_interval_plus_write():
    # W(R) / R -> I / (I + w): within w / R of it for any R
    run_s = np.linspace(1e6, 2e6, 1001)
    share = kept_work_s(run_s, 2388.0, 300) / run_s
    assert np.all(np.abs(share - 2388 / 2688) <= 300 / run_s)
    assert share.max() <= 2388 / 2688 + 1e-15  # never above it: a partial cycle pays a whole write


@pytest.mark.slow
def test_simulated_restart_is_the_renewal_form_on_the_ntp_study_setup():
    """The whole simulator (events drawn per GPU, 32,768 B200 at TP32 x PP8) at 3x Llama 3's rate
    and 30-minute checkpoints: the renewal form gives 34.06%, where the old per-failure charge gave 7%."""
    from cost_models import MODELS, ParallelLayout, TrainingSpec
    from ntp_planner.failures.sim_config import SimConfig
    from ntp_planner.failures.simulator import simulate
    from ntp_planner.solver.planner import plan_from_layout
    from topologies import CLUSTERS, Cluster

    layout = ParallelLayout(
        tp=32, pp=8, dp=128, global_batch=1024, sequence_parallel=True, distributed_optimizer=True, recompute="full"
    )
    plan = plan_from_layout(
        MODELS["ntp-480b"],
        TrainingSpec(seq_len=16384, global_batch=1024),
        Cluster(spec=CLUSTERS["b200-nvl32"], num_gpus=32768),
        layout,
    )
    rate = 3 * LLAMA3_RATE_PER_GPU_HOUR
    cfg = SimConfig(days=30, trials=200, failure_rate_per_gpu_hour=rate, checkpoint_interval_s=1800)
    results, _ = simulate(plan, cfg, ["restart"], np.random.default_rng(3))
    r = results["restart"]
    closed = renewal_goodput(rate * 32768 / 3600, 1800, WRITE_S, RECOVERY_S)
    spread = (r.p95.goodput - r.p5.goodput) / (2 * 1.645)  # about one standard deviation of a trial
    assert closed == pytest.approx(0.3406, abs=1e-4)
    assert abs(r.mean.goodput - closed) < 4 * spread / math.sqrt(cfg.trials) + 2100 / RUN_S
