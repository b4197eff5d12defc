"""The figures of `benchmarks/gpu_check.sh`: the profile's block times against the analytical
model's, and the summary of every step.

    python benchmarks/gpu_check.py blocks --profile DIR/profile.json --model MODEL --out DIR/blocks.json
    python benchmarks/gpu_check.py summary DIR [--device cuda|cpu]
    python benchmarks/gpu_check.py slug DIR/profile.json

``blocks``: for every block the profile measured (embedding, layer, LM head at each TP degree and
micro-batch), the analytical model's forward and backward seconds of the same block on the same
GPU (``cost_models.blocks.CostEnv`` with no profile: the catalogue GPU's peak times the fitted
GEMM and attention fractions; for a CPU or an unknown GPU, the one ``ntp profile``'s cluster file
describes from its measured GEMM rate and copy bandwidth), costed as the executor runs (unfused
cross-entropy), and measured / analytical. A ratio above 1: the block runs slower than the model
says. ``summary``: one table of every step's time, the validate run's exactness, its predicted
against measured step time and memory (``torch.cuda.max_memory_allocated`` on a GPU), the
blocks, and DIR/gpu_check.json with all of it; exit 1 when a step failed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

STEPS = ("profile", "plan", "validate", "blocks")
MEMORY_PARTS = ("weights", "grads", "optimizer", "activations")


def gpu_slug(profile: dict) -> str:
    """The file name of a profile's GPU: the catalogue name when torch's device name is one
    (``NVIDIA H200`` -> ``h200``), else the device name's slug.

    >>> gpu_slug({"device": {"gpu": "H100-SXM"}}), gpu_slug({"device": {"gpu": "cuda-nvidia-l4"}})
    ('h100-sxm', 'nvidia-l4')
    """
    return profile["device"]["gpu"].lower().removeprefix("cuda-")


def analytical_blocks(profile_path: Path, model_ref: str) -> list[dict]:
    """One row per measured block: measured and analytical forward, backward and total seconds."""
    from cost_models import resolve_model
    from cost_models.blocks import EMBED, HEAD, CostEnv
    from cost_models.efficiency import DEFAULT_EFFICIENCY
    from cost_models.layout import ParallelLayout
    from cost_models.profile import load_profile
    from cost_models.training import TrainingSpec
    from ntp_planner.profiler.cluster import local_cluster
    from topologies.cluster import Cluster

    profile = load_profile(profile_path)
    model = resolve_model(model_ref)
    if model.name != profile.model:
        raise SystemExit(f"error: the profile measured {profile.model}'s blocks, not {model.name}'s")
    base = local_cluster(profile)
    eff = DEFAULT_EFFICIENCY.model_copy(update={"runtime": "executor"})
    rows = []
    for b in profile.blocks:
        s = b.shape
        training = TrainingSpec(seq_len=s.seq_len * s.cp, global_batch=b.micro_batch, fused_cross_entropy=False)
        layout = ParallelLayout(tp=s.tp, cp=s.cp, micro_batch=b.micro_batch, global_batch=b.micro_batch)
        spec = base.model_copy(update={"domain_size": s.tp * s.cp, "gpus_per_node": s.tp * s.cp})
        env = CostEnv(model, training, layout, Cluster(spec=spec, num_gpus=s.tp * s.cp), eff)
        block = {"embedding": EMBED, "head": HEAD}.get(s.kind) or _layer_kind(model, s.kind)
        p = env.block_pass(block, s.tp)
        measured, analytical = b.fwd_s + b.bwd_s, p.fwd + p.bwd
        rows.append(
            {
                "block": f"{s.kind} tp{s.tp} mb{b.micro_batch} s{s.seq_len}",
                "kind": s.kind, "tp": s.tp, "micro_batch": b.micro_batch, "seq_len": s.seq_len,
                "measured_fwd_s": b.fwd_s, "measured_bwd_s": b.bwd_s, "measured_s": measured,
                "analytical_fwd_s": p.fwd, "analytical_bwd_s": p.bwd, "analytical_s": analytical,
                "ratio": measured / analytical,
            }
        )  # fmt: skip
    return rows


def _layer_kind(model, kind: str):
    """The model's first layer of the profile's kind (dense "layer" or "moe_layer")."""
    want = kind == "moe_layer"
    return next(model.layer_kind(i) for i in range(model.num_layers) if model.is_moe_layer(i) == want)


def blocks_table(rows: list[dict], gpu: str) -> Table:
    t = Table(title=f"Blocks on {gpu}: measured (ntp profile) against analytical (forward + backward)")
    for col in ("block", "measured s", "analytical s", "ratio"):
        t.add_column(col, justify="left" if col == "block" else "right")
    for r in rows:
        t.add_row(r["block"], f"{r['measured_s']:.4g}", f"{r['analytical_s']:.4g}", f"{r['ratio']:.2f}")
    return t


def nbytes(n: float) -> str:
    """'1.23 GiB', '4.5 MiB' or '812.0 KiB': a size in the unit that shows it."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n / 1024:.1f} KiB"


def read_json(path: Path) -> dict | None:
    """The JSON object a step printed, or None: the whole file, or else the object that starts at
    its first line reading ``{`` (a library that logs to stdout, NCCL_DEBUG's, say, puts lines first).

    >>> import tempfile
    >>> f = Path(tempfile.mkdtemp()) / "x.out"
    >>> _ = f.write_text('NCCL INFO ring 0\\n{\\n "passed": true\\n}\\n')
    >>> read_json(f), read_json(f.with_name("missing.out"))
    ({'passed': True}, None)
    """
    try:
        text = path.read_text()
    except OSError:
        return None
    try:
        return json.loads(text)
    except ValueError:
        start = text.find("\n{\n")
        try:
            return json.JSONDecoder().raw_decode(text[start + 1 :])[0] if start >= 0 else None
        except ValueError:
            return None


def _steps(folder: Path) -> list[dict]:
    """steps.tsv's rows (step, seconds, rc; rc -1 = skipped), and the steps never reached."""
    rows = []
    lines = (folder / "steps.tsv").read_text().splitlines()[1:] if (folder / "steps.tsv").exists() else []
    for line in lines:
        name, seconds, rc = line.split("\t")
        rows.append({"step": name, "seconds": float(seconds), "rc": int(rc), "ok": rc == "0"})
    seen = {r["step"] for r in rows}
    return rows + [{"step": s, "seconds": 0.0, "rc": -1, "ok": False} for s in STEPS if s not in seen]


def validate_figures(v: dict) -> dict:
    """The validate run's exactness, predicted against measured step time, and memory: the
    prediction's weights + grads + optimizer + activations against the run's own count of them
    and, on a GPU, against ``torch.cuda.max_memory_allocated``."""
    stage = v["stages"][0]
    predicted = sum(stage["predicted_memory_bytes"].get(k, 0.0) for k in MEMORY_PARTS)
    counted = sum(stage["measured_memory_bytes"].get(k, 0) for k in MEMORY_PARTS)
    cuda = v["stage_memory_bytes"][0].get("cuda_max_allocated")
    return {
        "passed": v["passed"],
        "dtype": v["dtype"],
        "tolerance": v["tolerance"],
        "max_rel_error_loss": v["max_rel_error_loss"],
        "max_rel_error_grads": v["max_rel_error_grads"],
        "max_rel_error_params": v["max_rel_error_params"],
        "holdings_compared": v["holdings_compared"],
        "vocabulary_ids_missing": v["vocabulary_ids_missing"],
        "steps": v["steps"],
        "seq_len": v["seq_len"],
        "micro_batch": v["micro_batch"],
        "predicted_step_time_s": v["predicted_step_time_s"],
        "measured_step_time_s": v["measured_step_time_s"],
        "step_time_ratio": v["measured_step_time_s"] / v["predicted_step_time_s"],
        "time_split_s": v["time_split_s"],
        "predicted_memory_bytes": predicted,
        "counted_memory_bytes": counted,
        "cuda_max_allocated_bytes": cuda,
        "memory_ratio": (cuda if cuda is not None else counted) / predicted,
        "prediction_notes": v.get("prediction_notes", []),
        "notes": v.get("notes", []),
    }


def summary(folder: Path, device: str) -> tuple[dict, list]:
    """(gpu_check.json's content, the renderables to print)."""
    steps = _steps(folder)
    profile = read_json(folder / "profile.json")
    plan_out = read_json(folder / "plan.out")
    val = read_json(folder / "validate.out")
    blocks = read_json(folder / "blocks.json")
    data: dict = {"device": device, "passed": all(s["ok"] for s in steps), "steps": steps}
    if profile is not None:
        best = max(profile["gemms"], key=lambda g: g["flops_per_s"])
        data["profile"] = {
            "gpu": profile["device"]["gpu"], "name": profile["device"]["name"], "dtype": profile["dtype"],
            "torch": profile["device"]["torch_version"], "cuda": profile["device"].get("cuda_version"),
            "gemm_peak_flops_per_s": best["flops_per_s"], "blocks": len(profile["blocks"]),
            "file": f"profiles/{gpu_slug(profile)}.json",
        }  # fmt: skip
    if plan_out is not None:
        data["plan"] = {
            "predicted_step_time_s": plan_out["step_time_s"],
            "memory_bytes": plan_out["memory_per_gpu_bytes"],
        }
    if val is not None and "stages" in val:
        data["validate"] = validate_figures(val)
    elif val is not None:
        data["validate"] = {"passed": False, "failure": val.get("failure")}
    if blocks is not None:
        data["blocks"] = blocks
    return data, _views(data)


def _views(data: dict) -> list:
    t = Table(title=f"GPU check ({data['device']}): {'every step ran' if data['passed'] else 'A STEP FAILED'}")
    t.add_column("figure")
    t.add_column("value", justify="right")
    for s in data["steps"]:
        state = "ok" if s["ok"] else ("skipped" if s["rc"] == -1 else f"FAILED (exit {s['rc']})")
        t.add_row(f"step {s['step']}", f"{s['seconds']:.1f} s, {state}")
    p = data.get("profile")
    if p:
        t.add_row("device", f"{p['name']} ({p['gpu']}), torch {p['torch']}, CUDA {p['cuda']}")
        rate = p["gemm_peak_flops_per_s"]
        shown = f"{rate / 1e12:.1f} TFLOP/s" if rate >= 1e12 else f"{rate / 1e9:.1f} GFLOP/s"
        t.add_row(f"GEMM peak ({p['dtype']})", shown)
    v = data.get("validate")
    if v and "predicted_step_time_s" in v:
        verdict = "PASS" if v["passed"] else "FAIL"
        errors = ", ".join(f"{k} {v[f'max_rel_error_{k}']:.2g}" for k in ("loss", "grads", "params"))
        t.add_row(f"exactness ({v['dtype']}, <= {v['tolerance']:g})", f"{verdict}: {errors}")
        times = f"{v['predicted_step_time_s']:.4g} s / {v['measured_step_time_s']:.4g} s"
        t.add_row("step time predicted / measured", f"{times} (measured x{v['step_time_ratio']:.2f})")
        t.add_row("memory predicted", nbytes(v["predicted_memory_bytes"]))
        t.add_row("memory counted (tensors)", nbytes(v["counted_memory_bytes"]))
        if v["cuda_max_allocated_bytes"] is not None:
            t.add_row("torch.cuda.max_memory_allocated", nbytes(v["cuda_max_allocated_bytes"]))
    elif v:
        t.add_row("validate", f"FAILED: {v.get('failure')}")
    out = [t]
    if data.get("blocks"):
        out.append(blocks_table(data["blocks"], (p or {}).get("gpu", "?")))
    return out


def _finite_positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("blocks", help="profile blocks against the analytical model's")
    b.add_argument("--profile", type=Path, required=True)
    b.add_argument("--model", required=True, help="the model the profile measured: catalogue name or config path")
    b.add_argument("--out", type=Path, required=True)
    s = sub.add_parser("summary", help="the summary table and DIR/gpu_check.json")
    s.add_argument("folder", type=Path)
    s.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    g = sub.add_parser("slug", help="the file name of a profile's GPU")
    g.add_argument("profile", type=Path)
    args = ap.parse_args(argv)
    console = Console(width=120)
    if args.command == "slug":
        print(gpu_slug(json.loads(args.profile.read_text())))
        return 0
    if args.command == "blocks":
        rows = analytical_blocks(args.profile, args.model)
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
        gpu = json.loads(args.profile.read_text())["device"]["gpu"]
        console.print(blocks_table(rows, gpu))
        return 0 if all(_finite_positive(r["ratio"]) for r in rows) else 1
    data, views = summary(args.folder, args.device)
    (args.folder / "gpu_check.json").write_text(json.dumps(data, indent=1) + "\n")
    for view in views:
        console.print(view)
    console.print(f"every figure in {args.folder / 'gpu_check.json'}")
    return 0 if data["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
