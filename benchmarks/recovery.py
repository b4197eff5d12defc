"""Live recovery on this machine: recovery time and its parts, and the goodput NTP keeps.

- the recovery cases of the tests (gloo, float32, llama3-8b TP4 x DP2 = 8 processes unless
  said): one process SIGKILLed mid-step under ntp, ntp-pw and dp-drop; a kill during the gradient
  sync; a TP2 x PP2 x DP2 plan losing a rank in one stage; two failures in different replicas; a
  repair; a failure no live copy survives (checkpoint fallback); restart from a checkpoint. Each
  prints detect / agree / re-plan / regroup / move state / redo and the bytes moved;
- a 50-step run with a failure at step 20 under restart (checkpoint every 10 steps) and under
  NTP: goodput = samples committed / (the healthy run's samples per second x the time from the
  first step's start to the last commit);
- writes the measured costs (``recovery_costs_s``) to benchmarks/recovery_costs.json, the file
  ``ntp simulate --recovery-from`` reads, and prints them beside the simulator's defaults.

Run: .venv/bin/python benchmarks/recovery.py
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

from cost_models.catalogue import MODELS
from cost_models.layout import ParallelLayout
from cost_models.training import TrainingSpec
from ntp_planner.executor.elastic.faults import Fault, Repair
from ntp_planner.executor.elastic.launch import launch_live
from ntp_planner.executor.elastic.timeline import PARTS, recovery_costs
from ntp_planner.executor.shrink.run import shrink
from ntp_planner.solver.planner import plan_from_layout
from topologies.cluster import Cluster
from topologies.cluster_catalogue import CLUSTERS

OUT = Path(__file__).with_name("recovery_costs.json")
SIMULATOR_DEFAULTS_S = {"detection_s": 60.0, "reconfigure_s": 180.0, "restart_s": 600.0}


def planned(tp: int, pp: int = 1, steps: int = 6, failures: int = 0):
    model = "llama3-8b" if tp > 2 else "megatron-1.7b"  # TP1 of a TP2 replica must fit memory
    lay = ParallelLayout(tp=tp, pp=pp, dp=8 // (tp * pp), global_batch=16)
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=8)
    plan = plan_from_layout(MODELS[model], TrainingSpec(seq_len=2048, global_batch=16), cluster, lay)
    # the model keeps the remainders of the widths the failures lead to (their cuts are checked)
    s = shrink(plan, tp * pp * 2, steps=steps, failures=failures)
    return plan, s


def live(tp=4, pp=1, steps=6, **kw):
    plan, s = planned(tp, pp, steps, len(kw.get("faults", ())))
    return launch_live(plan, s, timeout_s=kw.pop("timeout_s", 30.0), **kw)


def show(label: str, result, run) -> list[dict]:
    ok = result.max_rel_error_params <= 1e-5 and [r["step"] for r in run.steps] == list(range(len(run.steps)))
    print(f"{label}: wall {run.wall_s:.1f} s, params error {result.max_rel_error_params:.1e}, exact {ok}")
    for e in run.timeline:
        parts = "  ".join(f"{p[:-2]} {e.get(p, float('nan')):.3f}" for p in PARTS)
        print(
            f"  step {e['step']} {e['event']} {e['procs']} -> {e['layout']} (state from {e['source']}): {parts}  "
            f"total {e.get('total_s', float('nan')):.3f} s, {e['bytes_moved'] / 1e6:.2f} MB moved"
        )
    return run.timeline


def goodput(run) -> tuple[float, float]:
    """(measured, modelled) goodput: samples committed over what the healthy layout commits in
    the same time. Measured: the wall time on this machine, from the first step's start to the
    last commit; its processes share 2 cores, so a layout with fewer processes steps faster than
    it would on GPUs. Modelled: every step executed (committed, rolled back or cut short) at the
    healthy step time, as on GPUs where a degraded replica is sized to keep it, plus the measured
    recovery time (detect + agree + re-plan + regroup + move state; the redo is the steps)."""
    healthy = [r for r in run.steps if r["generation"] == 0]
    step_s = statistics.median(b["t"] - a["t"] for a, b in zip(healthy, healthy[1:], strict=False))
    samples = sum(r["batch"] for r in run.steps)
    full = healthy[0]["batch"]
    elapsed = run.steps[-1]["t"] - run.steps[0]["t"] + step_s  # the first step's own time counted once
    executed = len(run.steps) + len(run.lost) + sum(1 for e in run.timeline if e["event"] != "repair")
    stalls = sum(e.get(p, 0.0) for e in run.timeline for p in PARTS[:5])
    return samples / (full / step_s * elapsed), samples / (full * (executed + stalls / step_s))


def main() -> None:
    events: list[dict] = []
    for policy in ("ntp", "ntp-pw", "dp-drop"):
        events += show(f"TP4 x DP2, process 1 killed at step 2, {policy}", *live(policy=policy, faults=(Fault(1, 2),)))
    events += show("TP2 x DP2, killed in the gradient sync", *live(tp=2, steps=4, faults=(Fault(3, 1, "sync"),)))
    events += show("TP2 x PP2 x DP2, stage 1 loses a rank", *live(tp=2, pp=2, steps=4, faults=(Fault(5, 1),)))
    events += show("two failures in different replicas", *live(faults=(Fault(1, 1), Fault(6, 3))))
    events += show("failure then repair", *live(faults=(Fault(2, 1),), repairs=(Repair(2, 3),)))
    with tempfile.TemporaryDirectory() as ck:
        both = (Fault(1, 3), Fault(5, 3))
        events += show("no live copy: checkpoint fallback", *live(faults=both, checkpoint_every=2, checkpoint_dir=ck))
    with tempfile.TemporaryDirectory() as ck:
        restart = live(tp=2, policy="restart", faults=(Fault(1, 4),), checkpoint_every=3, checkpoint_dir=ck)
        events += show("restart from checkpoint (TP2 x DP2)", *restart)
    print("\n50 steps, failure at step 20 (TP4 x DP2, float32; restart checkpoints every 8 steps):")
    for policy in ("restart", "ntp", "ntp-pw", "dp-drop"):
        with tempfile.TemporaryDirectory() as ck:
            kw = {"checkpoint_every": 8, "checkpoint_dir": ck} if policy == "restart" else {}
            result, run = live(steps=50, policy=policy, faults=(Fault(1, 20),), **kw)
        measured, modelled = goodput(run)
        print(
            f"  {policy}: goodput modelled {modelled:.3f} (measured here {measured:.3f}), samples "
            f"{sum(r['batch'] for r in run.steps)} of {50 * run.steps[0]['batch']}, steps rolled back "
            f"{len(run.lost)}, recovery {sum(e.get('total_s', 0.0) for e in run.timeline):.2f} s, "
            f"params error {result.max_rel_error_params:.1e}"
        )
        events += run.timeline
    costs = recovery_costs(events)
    OUT.write_text(json.dumps({"recovery_costs_s": costs, "source": "benchmarks/recovery.py"}, indent=1) + "\n")
    print("\nmeasured recovery costs (mean over events) vs the simulator's defaults:")
    for key, default in SIMULATOR_DEFAULTS_S.items():
        print(f"  {key}: measured {costs.get(key, float('nan')):.3f} s, simulator default {default:g} s")
    print(f"written to {OUT}")


if __name__ == "__main__":
    sys.exit(main())
