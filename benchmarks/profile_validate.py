"""Predicted against measured step time of validate runs on this machine (issue 13).

Profiles the machine (`ntp profile --quick`, or --profile P), then runs a matrix of plans with the
executor exactly as `ntp validate --profile` does: each plan shrunk to the processes given, its
blocks measured on the spot, the run predicted by the cost model (``executor.predict``) and timed
(median of the steady steps of the slowest rank). Prints each run's predicted and measured step,
the error, and the mean absolute percentage error (MAPE):

- "honest": runs with at most as many processes as cores (timing of more processes than cores is
  the OS scheduler's, not the model's business; the issue's goal counts these);
- "all": every run;
- "calibrated, left out": each honest run predicted by a calibration (``cost_models.calibrate``)
  fitted to the other honest runs.

The same script runs on GPUs with --backend nccl (one process per GPU).

Run: .venv/bin/python benchmarks/profile_validate.py [--backend gloo|nccl] [--profile P] [--steps 8]
                                                      [--seq-len 128] [--only NAME] [--json] [--record runs.jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cost_models import ParallelLayout, TrainingSpec, resolve_model  # noqa: E402
from cost_models.calibrate import calibrate  # noqa: E402
from cost_models.profile import load_profile  # noqa: E402
from ntp_planner.plan import Plan  # noqa: E402
from topologies import Cluster, resolve_cluster_spec  # noqa: E402

SEQ_LEN = 128  # tokens per sequence of the shrunk runs: enough compute that gloo's latency is not all


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    layout: dict  # ParallelLayout fields (global_batch and dp filled in)
    nproc: int
    failed: tuple[int, ...] = ()  # GPUs to fail before running: an NTP re-plan
    seq_len: int = 2048


def _per_layer(model: str, tp: int, low: int) -> tuple[int, ...]:
    """Embedding and head at ``tp``, the first half of the layers at ``low``, the rest at ``tp``."""
    L = resolve_model(model).num_layers
    return (tp, *([low] * (L // 2)), *([tp] * (L - L // 2)), tp)


CASES = [
    Case("TP2", "llama3-8b", dict(tp=2, sequence_parallel=False), 2),
    Case("TP2 sequence parallel", "llama3-8b", dict(tp=2, sequence_parallel=True), 2),
    Case("TP2 full recompute", "llama3-8b", dict(tp=2, recompute="full"), 2),
    Case("TP2 per-layer 2/1", "llama3-8b", dict(tp=2, layer_tp=_per_layer("llama3-8b", 2, 1)), 2),
    Case("TP2 llama2-7b (MHA)", "llama2-7b", dict(tp=2), 2),
    Case("TP2 llama3-70b", "llama3-70b", dict(tp=2), 2),
    Case("PP2 1F1B", "llama3-8b", dict(pp=2), 2),
    Case("PP2 1F1B recompute", "llama3-8b", dict(pp=2, recompute="full"), 2),
    Case("CP2", "llama3-8b", dict(cp=2), 2),
    Case("DP2", "llama3-8b", dict(), 2),
    Case("DP2 llama2-7b", "llama2-7b", dict(), 2),
    Case("TP1 one process", "llama3-8b", dict(), 1),
    Case("TP4", "llama3-8b", dict(tp=4, sequence_parallel=False), 4),
    Case("TP4 sequence parallel", "llama3-8b", dict(tp=4), 4),
    Case("TP2 x PP2", "llama3-8b", dict(tp=2, pp=2), 4),
    Case("NTP: TP4 beside TP3", "llama3-8b", dict(tp=4), 7, failed=(3,)),
]


def make_plan(case: Case, gpus: int = 8) -> Plan:
    from ntp_planner.solver.planner import plan_from_layout

    model = resolve_model(case.model)
    cluster = Cluster(spec=resolve_cluster_spec("dgx-h100"), num_gpus=gpus)
    fields = {"tp": 1, "pp": 1, "cp": 1, "micro_batch": 1, **case.layout}
    fields["dp"] = gpus // (fields["tp"] * fields["pp"] * fields["cp"])
    fields["global_batch"] = 16 * fields["dp"]
    training = TrainingSpec(seq_len=case.seq_len, global_batch=fields["global_batch"])
    return plan_from_layout(model, training, cluster, ParallelLayout(**fields))


def run_case(case: Case, profile, backend: str, steps: int, seq_len: int, repeat: int) -> dict:
    from ntp_planner.executor.check.timing import compare_run, run_record
    from ntp_planner.executor.shrink.run import shrink
    from ntp_planner.executor.train.launch import launch
    from ntp_planner.failures.replan import Replanner
    from ntp_planner.profiler.cluster import local_cluster
    from ntp_planner.profiler.for_run import complete_profile

    plan = make_plan(case)
    replan = Replanner(plan).replan(frozenset(case.failed), "ntp") if case.failed else None
    shrunk = shrink(plan, case.nproc, replan, steps, seed=0, seq_len=seq_len)
    prof = complete_profile(profile, shrunk.spec, plan.model.name)
    results = [launch(shrunk.spec, backend, timeout_s=300.0) for _ in range(repeat)]
    runs = [compare_run(prof, local_cluster(prof), shrunk.spec, plan.model.name, r) for r in results]
    data = sorted(runs, key=lambda d: d["measured_step_time_s"])[len(runs) // 2]  # the median run
    record = run_record(case.name, prof, data)
    return {
        "name": case.name,
        "processes": shrunk.spec.world_size,
        "predicted_step_time_s": data["predicted_step_time_s"],
        "measured_step_time_s": data["measured_step_time_s"],
        "step_time_error": data["step_time_error"],
        "measured_each_s": sorted(d["measured_step_time_s"] for d in runs),
        "max_rel_error_params": max(r.max_rel_error_params for r in results),
        "record": json.loads(record.model_dump_json()),
        "profile": prof,
    }


def mape(errors: list[float]) -> float:
    return sum(abs(e) for e in errors) / len(errors) if errors else float("nan")


def left_out_errors(rows: list[dict], base) -> list[float]:
    """Each run predicted by a calibration fitted to the others (at least three)."""
    from cost_models.calibrate import RunRecord
    from ntp_planner.executor.check.timing import relative_error

    records = [RunRecord.model_validate(r["record"]) for r in rows]
    out = []
    for i, r in enumerate(records):
        others = records[:i] + records[i + 1 :]
        if len(others) < 3:
            return []
        cal = calibrate(base, others).calibration
        scale_c, scale_k = (
            cal.compute_scale / base.calibration.compute_scale,
            cal.comm_scale / base.calibration.comm_scale,
        )
        predicted = scale_c * r.compute_s + scale_k * r.comm_s + (cal.step_overhead_s or 0.0)
        out.append(relative_error(predicted, r.measured_step_time_s))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", choices=["gloo", "nccl"], default="gloo")
    ap.add_argument("--profile", type=Path, help="a profile of this machine (default: measure one with --quick)")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=SEQ_LEN, help="tokens per sequence of the shrunk runs")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each case; the median run counts")
    ap.add_argument("--only", action="append", help="run only the cases with this name (repeatable)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--record", type=Path, help="write the runs as JSON lines for `ntp calibrate`")
    args = ap.parse_args()
    cases = [c for c in CASES if not args.only or c.name in args.only]
    if args.backend == "nccl":
        import torch

        gpus = torch.cuda.device_count()
        cases = [c for c in cases if c.nproc <= gpus]
    cores = len(os.sched_getaffinity(0))
    if args.profile is not None:
        profile = load_profile(args.profile)
    else:
        from ntp_planner.profiler.machine import profile_machine, resolve_settings

        nproc = max(c.nproc for c in cases)
        device = "cuda" if args.backend == "nccl" else "cpu"
        settings = resolve_settings(device, args.backend, max(nproc, 2), None, None, None, None, None, quick=True)
        print(f"profiling this machine ({device}, {settings.nproc} processes, quick) ...", file=sys.stderr)
        profile = profile_machine(settings)
    rows = []
    for case in cases:
        print(f"running {case.name} ...", file=sys.stderr)
        rows.append(run_case(case, profile, args.backend, args.steps, args.seq_len, args.repeat))
    honest = [r for r in rows if r["processes"] <= cores or args.backend == "nccl"]
    summary = {
        "cores": cores,
        "backend": args.backend,
        "device": profile.device.name,
        "mape_honest": mape([r["step_time_error"] for r in honest]),
        "honest_runs": len(honest),
        "mape_all": mape([r["step_time_error"] for r in rows]),
        "runs": len(rows),
        "mape_calibrated_left_out": mape(left_out_errors(honest, rows[0]["profile"] if rows else profile)),
    }
    if args.record:
        args.record.write_text("".join(json.dumps(r["record"]) + "\n" for r in rows))
    if args.json:
        print(json.dumps({"summary": summary, "runs": [{k: v for k, v in r.items() if k != "profile"} for r in rows]}))
        return
    print(f"{'run':28} {'procs':>5} {'predicted ms':>13} {'measured ms':>12} {'error':>8}")
    for r in rows:
        mark = "" if r in honest else "  (more processes than cores)"
        print(
            f"{r['name']:28} {r['processes']:5d} {r['predicted_step_time_s'] * 1e3:13.2f} "
            f"{r['measured_step_time_s'] * 1e3:12.2f} {r['step_time_error']:+8.1%}{mark}"
        )
    print(
        f"MAPE honest ({summary['honest_runs']} runs, <= {cores} processes): {summary['mape_honest']:.1%}; "
        f"all {summary['runs']} runs: {summary['mape_all']:.1%}; "
        f"calibrated, each honest run left out of its fit: {summary['mape_calibrated_left_out']:.1%}"
    )


if __name__ == "__main__":
    main()
