"""`--runtime` on `ntp estimate` and `ntp plan`: torchtitan's costs selected, recorded in the plan,
and an unknown runtime refused with exit 2."""

import json

from typer.testing import CliRunner

from ntp_planner.cli import app

runner = CliRunner()
FSDP8 = ["--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "8", "--seq-len", "8192", "--global-batch", "16"]
LAYOUT = ["--dp", "8", "--zero", "3", "--micro-batch", "2", "--recompute", "selective"]


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_estimate_costs_torchtitans_memory_and_the_plan_records_the_runtime(tmp_path):
    out = tmp_path / "plan.json"
    titan = run("estimate", *FSDP8, *LAYOUT, "--runtime", "torchtitan", "--json", "-o", out)
    assert titan.exit_code == 0, titan.output
    parts = json.loads(titan.stdout)["memory_breakdown_bytes"]
    assert {"fsdp_buffers", "allocator_reserve"} <= set(parts)  # FSDP2's buffers, the allocator's reserve
    assert json.loads(out.read_text())["runtime"] == "torchtitan"
    megatron = run("estimate", *FSDP8, *LAYOUT, "--json")
    assert "fsdp_buffers" not in json.loads(megatron.stdout)["memory_breakdown_bytes"]


def test_an_unknown_runtime_is_refused_with_exit_2():
    result = run("estimate", *FSDP8, *LAYOUT, "--runtime", "deepspeed")
    assert result.exit_code == 2 and "deepspeed" in result.output
