"""Speed of the goodput simulator and how its cost grows.

- 30 days x 32,768 GPUs x 1,000 trials x all five strategies: target < 10 s;
- cost against GPUs (8k to 32k) and against days (15 to 60): should grow about linearly.

Run: .venv/bin/python benchmarks/simulate.py
"""

from __future__ import annotations

import time

import numpy as np

from cost_models import MODELS, ParallelLayout, TrainingSpec
from ntp_planner.failures.simulator import STRATEGIES, SimConfig, simulate
from ntp_planner.solver.planner import plan_from_layout
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


def main() -> None:
    plan = study_plan(32768)
    seconds, results = timed(plan, 30, 1000)
    print(f"30 days x 32,768 GPUs x 1,000 trials x 5 strategies: {seconds:.2f} s (target < 10 s)")
    for name, r in results.items():
        m = r.mean
        print(
            f"  {name:8s} goodput {m.goodput:.1%}  capacity goodput {m.capacity_goodput:.1%} "
            f"[{r.p5.capacity_goodput:.1%}-{r.p95.capacity_goodput:.1%}]  interruptions {m.interruptions:.0f}  "
            f"spares needed {m.spares_needed:.0f}"
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
