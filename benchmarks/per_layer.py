"""Per-layer TP against uniform TP on every catalogue model, and the per-layer solver's speed.

For each model: the best uniform layout (what Megatron-LM can run: its Megatron-expressible
projection), the best per-layer layout, and the throughput gain, once with ZeRO-1 to 3 searched
and once with gradients kept whole (ZeRO-1, Megatron's distributed optimizer). Then:
- `make_plan` for llama3.1-405b on 16,384 H100 (per-layer TP, PP partition, global search) and
  the same through the CLI: target < 1 s (issue 12);
- one stage's MILP (HiGHS) for that plan's first stage with its memory budget: target < 100 ms.

Run: .venv/bin/python benchmarks/per_layer.py
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from cost_models import MODELS, TrainingSpec
from cost_models.step import CostEnv
from ntp_planner.solver.per_layer import StagePlanner, allowed_degrees
from ntp_planner.solver.planner import make_plan
from ntp_planner.solver.search import SearchSpace
from ntp_planner.solver.stage_solvers import solve_milp
from topologies import CLUSTERS, Cluster

# model -> (cluster, GPUs, sequence, global batch): published or typical training setups
SETUPS = {
    "gpt3-175b": ("dgx-a100", 1024, 2048, 1536),
    "llama3-8b": ("dgx-h100", 64, 8192, 256),
    "llama3-70b": ("dgx-h100", 1024, 8192, 1024),
    "llama3.1-405b": ("dgx-h100", 16384, 8192, 2048),
    "mixtral-8x7b": ("dgx-h100", 256, 4096, 512),
    "deepseek-moe-16b": ("dgx-h100", 128, 4096, 512),
    "megatron-1.7b": ("dgx-a100", 32, 2048, 512),
    "megatron-3.6b": ("dgx-a100", 64, 2048, 512),
    "megatron-7.5b": ("dgx-a100", 128, 2048, 512),
    "megatron-18.4b": ("dgx-a100", 256, 2048, 1024),
    "megatron-39.1b": ("dgx-a100", 512, 2048, 1536),
    "megatron-76.1b": ("dgx-a100", 1024, 2048, 1792),
    "megatron-145.6b": ("dgx-a100", 1536, 2048, 2304),
    "megatron-310.1b": ("dgx-a100", 1920, 2048, 2160),
    "megatron-529.6b": ("dgx-a100", 2520, 2048, 2520),
    "megatron-1t": ("dgx-a100", 3072, 2048, 3072),
    "ntp-480b": ("b200-nvl32", 32768, 16384, 1024),
}


def inputs(name):
    cluster, gpus, seq, batch = SETUPS[name]
    return MODELS[name], TrainingSpec(seq_len=seq, global_batch=batch), Cluster(spec=CLUSTERS[cluster], num_gpus=gpus)


def gains(console: Console, space: SearchSpace, title: str) -> None:
    t = Table(title=f"Per-layer TP vs the Megatron-expressible (uniform) plan, {title}")
    for col in ("model", "GPUs", "uniform layout", "uniform s", "per-layer layout", "per-layer s", "gain", "plan s"):
        t.add_column(col, justify="left" if "layout" in col or col == "model" else "right")
    for name in MODELS:
        if name not in SETUPS:
            continue
        start = time.perf_counter()
        try:
            plan = make_plan(*inputs(name), top=1, space=space)
        except ValueError as exc:
            t.add_row(name, str(SETUPS[name][1]), f"no fit: {exc}"[:60], "", "", "", "", "")
            continue
        elapsed = time.perf_counter() - start
        uniform = plan.megatron or plan  # when per-layer does not win, the plan is uniform
        u_layout = uniform.layout.describe()
        u_time = uniform.step_time_s if plan.megatron else plan.predicted.step_time_s
        p_layout = plan.layout.describe() if plan.megatron else "(uniform wins)"
        t.add_row(
            name,
            str(SETUPS[name][1]),
            u_layout,
            f"{u_time:.3f}",
            p_layout,
            f"{plan.predicted.step_time_s:.3f}",
            f"{plan.megatron_gap:+.1%}",
            f"{elapsed:.2f}",
        )
    console.print(t)


def speed(console: Console) -> None:
    args = inputs("llama3.1-405b")
    runs = []
    for _ in range(3):
        start = time.perf_counter()
        plan = make_plan(*args, top=1)
        runs.append(time.perf_counter() - start)
    cli = []
    ntp = str(Path(sys.executable).parent / "ntp")
    for _ in range(3):
        start = time.perf_counter()
        subprocess.run(
            [
                ntp,
                "plan",
                "-m",
                "llama3.1-405b",
                "-c",
                "dgx-h100",
                "-n",
                "16384",
                "--seq-len",
                "8192",
                "--global-batch",
                "2048",
                "--json",
            ],
            check=True,
            capture_output=True,
        )
        cli.append(time.perf_counter() - start)
    lay = plan.layout.model_copy(update={"layer_tp": None})
    env = CostEnv(plan.model, plan.training, lay, args[2])
    planner = StagePlanner(env, allowed_degrees(plan.model, lay, plan.training.seq_len), plan.headroom)
    problem = planner.problem(0, 0, lay.stage_layers(plan.model.num_layers)[0])
    solve_milp(problem)  # warm scipy's import
    milp = []
    for _ in range(5):
        start = time.perf_counter()
        solution = solve_milp(problem)
        milp.append(time.perf_counter() - start)
    console.print(
        f"405B / 16,384 H100 per-layer plan in process : {statistics.median(runs):.2f} s (target < 2 s); "
        f"layout {plan.layout.describe()}, gain over uniform {plan.megatron_gap:+.1%}"
    )
    console.print(f"405B / 16,384 H100 `ntp plan` wall time     : {statistics.median(cli):.2f} s (target < 1 s)")
    console.print(
        f"one stage's MILP ({len(problem.time_s)} blocks, memory binding: "
        f"{solution is not None and solution.memory_bytes > 0.9 * problem.budget_bytes}) : "
        f"{statistics.median(milp) * 1e3:.1f} ms (target < 100 ms)"
    )


if __name__ == "__main__":
    console = Console(width=160)
    speed(console)
    gains(console, SearchSpace(), "ZeRO-1 to 3 searched (the default)")
    gains(console, SearchSpace(zeros=(1,)), "gradients kept whole (ZeRO-1, `--max-zero 1`)")
