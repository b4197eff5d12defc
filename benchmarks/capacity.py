"""Speed of the capacity planner (issue 26): 3 clusters x 8 GPU counts x 4 spare counts x 5
strategies = 480 candidates for a 405B-class run on 15T tokens by day 60 at 90% confidence,
200 trials each; target < 60 s on this 2-core machine. Prints wall and CPU time of the planning
and of the search, and how many candidates were simulated; with --brute, the same grid with
every candidate simulated, to show what the pruning saves (and that the answer is the same).

Run: .venv/bin/python benchmarks/capacity.py [--brute]
"""

from __future__ import annotations

import sys
import time

from cost_models import TrainingSpec, resolve_model
from ntp_planner.failures.capacity import search
from ntp_planner.failures.capacity_job import plan_grid
from ntp_planner.failures.capacity_spec import CapacitySpec
from topologies import resolve_cluster_spec
from topologies.prices import GPU_HOUR_PRICES

CLUSTERS = ("dgx-h100", "dgx-b200", "gb200-nvl72")


def clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def since(start: tuple[float, float]) -> str:
    wall, cpu = clock()
    return f"{wall - start[0]:.1f} s wall, {cpu - start[1]:.1f} s CPU"


def main(brute: bool) -> None:
    start = clock()
    specs = {name: resolve_cluster_spec(name) for name in CLUSTERS}
    spec = CapacitySpec(
        tokens=15e12,
        deadline_days=60,
        confidence=0.9,
        gpus=tuple(range(4096, 32769, 4096)),
        spares=(0, 1, 2, 4),
        trials=200,
    )
    plans = plan_grid(resolve_model("llama3.1-405b"), TrainingSpec(seq_len=8192, global_batch=2048), specs, spec.gpus)
    print(f"plans: {len(plans)} (cluster x GPU count) in {since(start)}")
    prices = {name: GPU_HOUR_PRICES[s.gpu].usd_per_gpu_hour for name, s in specs.items()}
    domains = {name: s.domain_size for name, s in specs.items()}
    searched = clock()
    result = search(spec, plans, domains, prices)
    n = len(result.candidates)
    print(f"search: {n} candidates, {result.simulated} simulated, in {since(searched)}")
    print(f"total: {since(start)} (target < 60 s)")
    print(f"cheapest: {result.cheapest.label if result.cheapest else None}")
    if brute:
        searched = clock()
        full = search(spec, plans, domains, prices, prune=False)
        print(f"brute force: {full.simulated} simulated in {since(searched)}")
        print(f"same front and cheapest: {full.front == result.front and full.cheapest == result.cheapest}")


if __name__ == "__main__":
    main("--brute" in sys.argv[1:])
