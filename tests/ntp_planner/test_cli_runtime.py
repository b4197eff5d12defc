"""`--runtime` on `ntp estimate` and `ntp plan`: torchtitan's costs selected, recorded in the plan,
and an unknown runtime refused with exit 2."""

import json

import pytest
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


def test_a_torchtitan_plan_defaults_to_sdpa_flash2_unless_the_user_names_a_kernel(tmp_path):
    kernels = {}
    for name, extra in {
        "titan": ["--runtime", "torchtitan"],
        "titan-cudnn": ["--runtime", "torchtitan", "--attention-kernel", "cudnn"],
        "megatron": [],
    }.items():
        out = tmp_path / f"{name}.json"
        assert run("estimate", *FSDP8, *LAYOUT, *extra, "-o", out).exit_code == 0
        kernels[name] = json.loads(out.read_text())["training"]["attention_kernel"]
    assert kernels == {"titan": "flash2", "titan-cudnn": "cudnn", "megatron": "cudnn"}


def test_an_edited_runtime_is_refused_like_any_edited_input_and_megatron_keeps_the_old_hash(tmp_path):
    from ntp_planner.plan import Plan, inputs_hash

    out = tmp_path / "plan.json"
    assert run("estimate", *FSDP8, *LAYOUT, "--runtime", "torchtitan", "-o", out).exit_code == 0
    assert run("explain", out).exit_code == 0
    plan = Plan.load(out)
    old = inputs_hash(plan.model, plan.training, plan.cluster, plan.layout)  # the hash before runtimes were hashed
    assert plan.inputs_hash != old
    assert inputs_hash(plan.model, plan.training, plan.cluster, plan.layout, "megatron") == old
    data = json.loads(out.read_text())
    for edit in ("megatron", "executor"):
        out.write_text(json.dumps(data | {"runtime": edit}))
        refused = run("explain", out)
        assert refused.exit_code == 2 and "runtime" in refused.output and "Traceback" not in refused.output
    del data["runtime"]  # dropping the field reads as megatron: refused too
    out.write_text(json.dumps(data))
    assert run("explain", out).exit_code == 2


def _per_layer_titan_plan(path):
    """llama3-8b cut to 16 layers, tp2 pp2 dp2 cp2 on 16 GPUs, layers 0-7 at degree 1, costed for
    torchtitan (the per-layer plan of tests/ntp_planner/failures/test_replan_degrade.py)."""
    from cost_models import MODELS, ParallelLayout, TrainingSpec
    from cost_models.efficiency import DEFAULT_EFFICIENCY
    from ntp_planner.solver.planner import plan_from_layout
    from topologies import CLUSTERS, Cluster

    half = MODELS["llama3-8b"].model_copy(update={"name": "llama3-8b-16", "num_layers": 16})
    layer_tp = (2,) + (1,) * 8 + (2,) * 8 + (2,)
    lay = ParallelLayout(tp=2, pp=2, dp=2, cp=2, global_batch=16, layer_tp=layer_tp, sequence_parallel=True, zero=3)
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=16)
    eff = DEFAULT_EFFICIENCY.with_profile(None, "torchtitan")
    plan = plan_from_layout(half, TrainingSpec(seq_len=4096, global_batch=16), cluster, lay, efficiency=eff)
    plan.save(path)
    return plan


def _spy_on_recosting(monkeypatch):
    """The runtimes a re-plan's re-costing (failures.degrade) and the per-layer view ran with."""
    from cost_models import step
    from ntp_planner.failures import degrade
    from ntp_planner.solver import per_layer

    seen = []

    def estimate(*args, **kwargs):
        seen.append(args[4].runtime)
        return step.estimate_step(*args, **kwargs)

    def explain(model, training, layout, cluster, efficiency, *rest):
        seen.append(efficiency.runtime)
        return real_explain(model, training, layout, cluster, efficiency, *rest)

    real_explain = per_layer.explain_degrees
    monkeypatch.setattr(degrade, "estimate_step", estimate)
    monkeypatch.setattr(per_layer, "explain_degrees", explain)
    return seen


@pytest.mark.parametrize(
    "command",
    [
        ["replan", "--failed", "1,3,5", "--policy", "ntp", "--json"],
        ["sweep", "--fractions", "0.1", "--samples", "2", "--policies", "ntp", "--json"],
        ["simulate", "--days", "2", "--trials", "2", "--strategies", "ntp", "--json"],
        ["explain"],
    ],
    ids=["replan", "sweep", "simulate", "explain"],
)
def test_commands_that_recost_a_plan_cost_it_for_the_plans_runtime(tmp_path, monkeypatch, command):
    path = tmp_path / "plan.json"
    _per_layer_titan_plan(path)
    seen = _spy_on_recosting(monkeypatch)
    result = run(command[0], path, *command[1:])
    assert result.exit_code == 0, result.output
    assert seen and set(seen) == {"torchtitan"}


def test_a_torchtitan_replica_degrades_from_torchtitans_memory():
    import tempfile
    from pathlib import Path

    from cost_models.efficiency import DEFAULT_EFFICIENCY
    from cost_models.step import estimate_step
    from ntp_planner.failures.replan import Replanner

    with tempfile.TemporaryDirectory() as tmp:
        plan = _per_layer_titan_plan(Path(tmp) / "plan.json")
    uniform = plan.layout.model_copy(update={"layer_tp": None})
    titan = estimate_step(
        plan.model, plan.training, uniform, plan.cluster.build(), DEFAULT_EFFICIENCY.with_profile(None, "torchtitan")
    )
    megatron = estimate_step(plan.model, plan.training, uniform, plan.cluster.build())
    reserved = titan.memory_breakdown_bytes["runtime_reserved"]
    replanner = Replanner(plan)
    assert replanner.memory_at(1) == pytest.approx((titan.memory_per_gpu_bytes - reserved) * 2 + reserved)
    assert titan.memory_per_gpu_bytes != pytest.approx(megatron.memory_per_gpu_bytes, rel=0.01)  # runtimes differ
