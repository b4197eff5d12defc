"""Speed targets of the foundation, measured as wall time on this machine.

- `ntp plan --model llama3.1-405b --cluster dgx-h100 --gpus 16384 --seq-len 8192
  --global-batch 2048 --uniform` (the uniform search): target < 1 s end to end, and its chosen
  MFU (target 35-55%); the same command without --uniform (per-layer TP, the default since the
  per-layer issue; issue 12): target < 1 s.
- `ntp --help`: target < 0.3 s. Neither may import torch.
- Building the networkx graph of a 32,768-GPU cluster (lazy; only on first use).
- The in-process layout search for the 405B case.

Each timing is the median of several runs. Run: .venv/bin/python benchmarks/speed.py
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent
PLAN_ARGS = [
    "plan",
    "--model",
    "llama3.1-405b",
    "--cluster",
    "dgx-h100",
    "--gpus",
    "16384",
    "--seq-len",
    "8192",
    "--global-batch",
    "2048",
]


def wall(cmd: list[str], runs: int = 5) -> tuple[float, str]:
    times, out = [], ""
    for _ in range(runs):
        t = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def in_process(fn, runs: int = 3) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ntp = str(BIN / "ntp")
    plan_s, out = wall([ntp, *PLAN_ARGS, "--uniform", "--json"])
    plan = json.loads(out)
    per_layer_s, out = wall([ntp, *PLAN_ARGS, "--json"])
    per_layer = json.loads(out)
    help_s, _ = wall([ntp, "--help"])
    probe = (
        "import sys; from typer.testing import CliRunner; from ntp_planner.cli import app; "
        f"CliRunner().invoke(app, {PLAN_ARGS!r}); print('torch' in sys.modules)"
    )
    torch_loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip()

    from cost_models import MODELS, TrainingSpec
    from ntp_planner.solver.search import search
    from topologies import CLUSTERS, Cluster

    def graph():
        return Cluster(spec=CLUSTERS["b200-nvl32"], num_gpus=32768).graph

    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=16384)
    training = TrainingSpec(seq_len=8192, global_batch=2048)
    search_s = in_process(lambda: search(MODELS["llama3.1-405b"], training, cluster))
    result = search(MODELS["llama3.1-405b"], training, cluster)

    print(f"ntp plan --uniform 405B / 16,384 H100 : {plan_s:.2f} s   (target < 1 s)")
    best, mfu = result.ranked[0].layout.describe(), plan["predicted"]["mfu"]
    print(f"  chosen layout, MFU                  : {best}, {mfu:.1%}   (target 35-55%)")
    print(f"  layouts costed in the search        : {result.evaluated} ({result.rejected_memory} over memory)")
    print(f"  search in process                   : {search_s:.3f} s")
    print(
        f"ntp plan (per-layer, default) 405B    : {per_layer_s:.2f} s   (target < 1 s), MFU "
        f"{per_layer['predicted']['mfu']:.1%}, per-layer TP {sorted(set(per_layer['per_layer_tp']))}"
    )
    print(f"ntp --help wall time                  : {help_s:.2f} s   (target < 0.3 s)")
    print(f"torch imported by ntp plan            : {torch_loaded}")
    print(f"graph of 32,768 GPUs (lazy) built in  : {in_process(graph, 1):.2f} s")


if __name__ == "__main__":
    main()
