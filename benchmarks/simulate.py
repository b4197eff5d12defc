"""Speed of the goodput simulator, how its cost grows, and the figures of the NTP study's setup.

- 30 days x 32,768 GPUs x 1,000 trials x all five strategies: target < 10 s;
- cost against GPUs (8k to 32k) and against days (15 to 60): should grow about linearly;
- restart against the renewal closed form, 4K and 32K GPUs at 1x and 3x Llama 3's rate;
- the spares sweep with a fixed batch, 15 and 30 days, steady and healthy starts (PNGs next to
  this file).

Run: .venv/bin/python benchmarks/simulate.py [--quick]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from cost_models import MODELS, ParallelLayout, TrainingSpec
from ntp_planner.failures.renewal import renewal_goodput
from ntp_planner.failures.sim_config import LLAMA3_RATE_PER_GPU_HOUR, STRATEGIES, SimConfig
from ntp_planner.failures.simulator import pool_rows, simulate
from ntp_planner.solver.planner import plan_from_layout
from ntp_planner.views.plots import plot_spares
from topologies import CLUSTERS, Cluster


def study_plan(gpus: int):
    dp = gpus // (32 * 8)
    layout = ParallelLayout(
        tp=32, pp=8, dp=dp, global_batch=8 * dp, sequence_parallel=True, distributed_optimizer=True, recompute="full"
    )
    return plan_from_layout(
        MODELS["ntp-480b"],
        TrainingSpec(seq_len=16384, global_batch=8 * dp),
        Cluster(spec=CLUSTERS["b200-nvl32"], num_gpus=gpus),
        layout,
    )


def timed(plan, days: float, trials: int) -> tuple[float, dict]:
    start = time.perf_counter()
    results, _ = simulate(plan, SimConfig(days=days, trials=trials), list(STRATEGIES), np.random.default_rng(0))
    return time.perf_counter() - start, results


POOLS = (0, 8, 16, 24, 32, 48, 64, 80)  # spare NVL32 domains: 0 to 10 replicas' worth of 8


def renewal_check(trials: int) -> None:
    """Simulated restart goodput against I q / (1 - q) / (D + 1 / lambda), 30-minute checkpoints."""
    print("restart vs the renewal closed form (30-min checkpoints, 5-min writes, D = 660 s, 30 days):")
    for gpus in (4096, 32768):
        plan = study_plan(gpus)
        for times in (1, 3):
            rate = times * LLAMA3_RATE_PER_GPU_HOUR
            cfg = SimConfig(days=30, trials=trials, failure_rate_per_gpu_hour=rate, checkpoint_interval_s=1800)
            r = simulate(plan, cfg, ["restart"], np.random.default_rng(0))[0]["restart"]
            closed = renewal_goodput(rate * gpus / 3600, 1800, 300, 660)
            print(f"  {gpus:6d} GPUs x{times}: simulated {r.mean.goodput:.2%}, closed form {closed:.2%}")


def spares_sweep(trials: int) -> None:
    """Fixed batch: per-GPU throughput, hours paused and spares needed against the pool."""
    plan = study_plan(32768)
    names = ["restart", "dp-drop", "ntp", "ntp-pw"]
    for days, start in ((30, "steady"), (30, "healthy"), (15, "steady"), (15, "healthy")):
        cfg = SimConfig(days=days, trials=trials, batch="fixed", start=start)
        began = time.perf_counter()
        runs = {
            k: simulate(plan, cfg.model_copy(update={"spares": k}), names, np.random.default_rng(0))[0] for k in POOLS
        }
        seconds = time.perf_counter() - began
        rows = pool_rows(plan, runs)
        needed = {s: runs[0][s] for s in names}
        print(f"spares sweep, {days} days, {start} start, fixed batch ({trials} trials, {seconds:.1f} s):")
        print(
            "  spares needed (mean [p5-p95], worst): "
            + "; ".join(
                f"{s} {r.mean.spares_needed:.1f} [{r.p5.spares_needed:.0f}-{r.p95.spares_needed:.0f}], "
                f"{r.spares_needed_worst:.0f}"
                for s, r in needed.items()
            )
        )
        print("  K    " + "".join(f"{s:>22s}" for s in names) + "   (per-GPU throughput / hours paused)")
        for k in POOLS:
            cells = [next(r for r in rows if r["spares"] == k and r["strategy"] == s) for s in names]
            print(f"  {k:3d}  " + "".join(f"{c['gpu_throughput']:>14.1%} / {c['hours_paused']:5.0f}" for c in cells))
        plot_spares(
            rows,
            Path(__file__).parent / f"spares_{days}d_{start}.png",
            f"ntp-480b on 32,768 B200, {days} days, {start} start",
        )


def main() -> None:
    quick = "--quick" in sys.argv
    renewal_check(200)
    spares_sweep(100 if quick else 1000)
    plan = study_plan(32768)
    seconds, results = timed(plan, 30, 1000)
    print(f"30 days x 32,768 GPUs x 1,000 trials x 5 strategies: {seconds:.2f} s (target < 10 s)")
    for name, r in results.items():
        m = r.mean
        print(
            f"  {name:8s} goodput {m.goodput:.1%}  capacity goodput {m.capacity_goodput:.1%} "
            f"[{r.p5.capacity_goodput:.1%}-{r.p95.capacity_goodput:.1%}]  interruptions {m.interruptions:.0f}  "
            f"spares needed {m.spares_needed:.1f} [{r.p5.spares_needed:.0f}-{r.p95.spares_needed:.0f}], "
            f"worst {r.spares_needed_worst:.0f}"
        )
    # A fixed part (re-planning each failure count once per strategy, ~0.3 s) does not grow with
    # trials or days; the rest (events, the failure-state grid, table look-ups) grows linearly.
    print("scaling in GPUs (30 days, 1,000 trials):")
    for gpus in (8192, 16384, 32768):
        print(f"  {gpus:6d} GPUs: {timed(study_plan(gpus), 30, 1000)[0]:.2f} s")
    print("scaling in days (32,768 GPUs, 1,000 trials):")
    for days in (15, 30, 60, 120):
        print(f"  {days:3d} days: {timed(plan, days, 1000)[0]:.2f} s")


if __name__ == "__main__":
    main()
