"""`ntp validate` wall time and errors on the demo plan and on an NTP re-planned state.

- the demo plan (`make demo`: Llama-3-70B on 1,024 H100, tp4 pp2 dp128 vpp4, ZeRO-2) and the
  same job planned with gradients kept whole (`--max-zero 1`: per-layer TP 2-8 in stages of 8,
  pp4 dp32): target < 2 min with the default 16 processes, and the per-layer one with 32;
- Llama-3-8B tp8 pp2 dp4 on 64 H100 with GPU 3 failed, policy ntp (a TP8 replica beside a TP7
  one with fewer micro-batches): target < 2 min;
- a MoE plan: Mixtral-8x7B on 64 H100 (tp1 dp64 ep8 ZeRO-2; the run keeps 8 experts, top-2 and
  ep 8 over 8 replicas) and the same plan in float64.
Each prints the CLI's wall time, the errors (target <= 1e-5 in float32, 1e-9 in float64), what the
check covered (holdings compared, vocabulary ids missing) and the measured step time.

Run: .venv/bin/python benchmarks/validate.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NTP = str(Path(sys.executable).with_name("ntp"))


def ntp(*args: str) -> str:
    return subprocess.run([NTP, *args], check=True, capture_output=True, text=True).stdout


def validate(label: str, *args: str) -> None:
    start = time.perf_counter()
    out = json.loads(ntp("validate", *args, "--json"))
    wall = time.perf_counter() - start
    print(
        f"{label}: {wall:.1f} s wall, {out['processes']} processes, loss {out['max_rel_error_loss']:.1e}, "
        f"grads {out['max_rel_error_grads']:.1e}, params {out['max_rel_error_params']:.1e}, "
        f"holdings {out.get('holdings_compared')}, ids missing {out.get('vocabulary_ids_missing')}, "
        f"step {out['step_time_s']:.2f} s, passed {out['passed']}"
    )


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        names = ("demo.json", "z1.json", "p8.json", "r8.json", "moe.json")
        demo, mixed, small, replan, moe = (str(Path(tmp, n)) for n in names)
        job = ("--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "1024", "--seq-len", "8192",
               "--global-batch", "1024")  # fmt: skip
        ntp("plan", *job, "-o", demo)
        ntp("plan", *job, "--max-zero", "1", "-o", mixed)
        validate("demo plan (16 processes)", demo)
        validate("demo plan in float64 (16 processes)", demo, "--dtype", "float64")
        validate("per-layer plan (--max-zero 1, 16 processes)", mixed)
        validate("per-layer plan (--max-zero 1, 32 processes)", mixed, "--nproc", "32")
        ntp("estimate", "-m", "llama3-8b", "-c", "dgx-h100", "-n", "64", "--tp", "8", "--pp", "2", "--seq-len",
            "4096", "--global-batch", "256", "-o", small)  # fmt: skip
        ntp("replan", small, "--failed", "3", "--policy", "ntp", "-o", replan)
        validate("NTP re-plan (TP8 + TP7)", small, "--replan", replan)
        ntp("plan", "-m", "mixtral-8x7b", "-c", "dgx-h100", "-n", "64", "--seq-len", "4096", "--global-batch", "256",
            "-o", moe)  # fmt: skip
        validate("MoE plan (Mixtral-8x7B, 16 processes)", moe)
        validate("MoE plan in float64 (16 processes)", moe, "--dtype", "float64")


if __name__ == "__main__":
    main()
