"""Speed of NTP re-planning on the NTP study's setup, and the loss each policy leaves.

The plan: ntp-480b on 32,768 B200 in NVL32 domains, TP32 x PP8 x 128 replicas, sequence 16K,
1,024 sequences per step (the study's layout, given to `ntp estimate -o`).
- one re-plan with 0.1% of GPUs failed, in process: target < 50 ms;
- `ntp replan` on the same: target < 1 s;
- `ntp sweep` over 4 fractions x 200 samples x 3 policies: target < 10 s.

Run: .venv/bin/python benchmarks/replan.py
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from cost_models import MODELS, ParallelLayout, TrainingSpec
from ntp_planner.failures.replan import Replanner
from ntp_planner.failures.sampling import random_failures
from ntp_planner.solver.planner import plan_from_layout
from topologies import CLUSTERS, Cluster


def main() -> None:
    model, training = MODELS["ntp-480b"], TrainingSpec(seq_len=16384, global_batch=1024)
    cluster = Cluster(spec=CLUSTERS["b200-nvl32"], num_gpus=32768)
    layout = ParallelLayout(
        tp=32, pp=8, dp=128, global_batch=1024, sequence_parallel=True, distributed_optimizer=True, recompute="full"
    )
    plan = plan_from_layout(model, training, cluster, layout)
    replanner = Replanner(plan)
    rng = np.random.default_rng(1)
    failed = random_failures(cluster, 0.001, rng)
    print(f"plan: {layout.describe()}, healthy step {plan.predicted.step_time_s:.2f} s")
    for policy in ("dp-drop", "ntp", "ntp-pw", "spares"):
        times = []
        for _ in range(5):
            start = time.perf_counter()
            result = replanner.replan(failed, policy, spares=2)
            times.append(time.perf_counter() - start)
        print(
            f"replan {policy:8s} 0.1% failed ({len(failed)} GPUs): {statistics.median(times) * 1e3:6.1f} ms "
            f"(target < 50 ms), throughput kept {result.throughput_relative:.2%}"
        )
    ntp = str(Path(sys.executable).parent / "ntp")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plan.json"
        plan.save(path)
        cli = []
        for _ in range(3):
            start = time.perf_counter()
            subprocess.run(
                [ntp, "replan", str(path), "--failed-fraction", "0.001", "--seed", "1", "--json"],
                check=True,
                capture_output=True,
            )
            cli.append(time.perf_counter() - start)
        start = time.perf_counter()
        out = subprocess.run(
            [
                ntp,
                "sweep",
                str(path),
                "--fractions",
                "0.0005,0.001,0.002,0.004",
                "--samples",
                "200",
                "--policies",
                "dp-drop,ntp,ntp-pw",
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        sweep_s = time.perf_counter() - start
    print(f"ntp replan wall time: {statistics.median(cli):.2f} s (target < 1 s)")
    print(f"ntp sweep 4 x 200 x 3 wall time: {sweep_s:.2f} s (target < 10 s)")
    print(out.stdout)


if __name__ == "__main__":
    main()
