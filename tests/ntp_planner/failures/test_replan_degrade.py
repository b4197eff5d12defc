"""Why a re-plan degrades or drops a replica: per-layer stages, cp slices, and the reason it gives."""

import json
import re

import pytest
from typer.testing import CliRunner

from cost_models import MODELS, ParallelLayout, TrainingSpec
from cost_models.degraded import degraded_step_time
from cost_models.step import estimate_step
from ntp_planner.cli import app
from ntp_planner.failures.replan import Replanner
from ntp_planner.plan import Plan
from ntp_planner.solver.planner import plan_from_layout
from topologies import CLUSTERS, Cluster

GIB = 2**30
HALF = MODELS["llama3-8b"].model_copy(update={"name": "llama3-8b-16", "num_layers": 16})


def per_layer_cp_plan():
    """llama3-8b cut to 16 layers, tp2 pp2 dp2 cp2 (16 GPUs, two NVLink domains): the embedding and
    layers 8-15 at degree 2, layers 0-7 at degree 1 (two copies per stage). GPUs 0-3 are replica 0's
    stage 0 (cp slices 0 and 1), GPUs 4-7 replica 1's."""
    layer_tp = (2,) + (1,) * 8 + (2,) * 8 + (2,)
    lay = ParallelLayout(tp=2, pp=2, dp=2, cp=2, global_batch=16, layer_tp=layer_tp, sequence_parallel=True)
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=16)
    return plan_from_layout(HALF, TrainingSpec(seq_len=4096, global_batch=16), cluster, lay)


def test_a_per_layer_cp_replica_with_three_failed_gpus_in_one_domain_runs_degraded():
    plan = per_layer_cp_plan()
    replanner = Replanner(plan)
    r = replanner.replan(frozenset({1, 3, 5}), "ntp")  # one GPU of each of three TP groups of domain 0
    healthy, degraded = r.replicas
    assert healthy.status == "healthy" and degraded.status == "degraded"
    # packing puts the three degraded groups and one healthy group in replica 1: every stage and
    # both cp slices run at TP 1, the healthy group's second GPU idles
    assert degraded.stage_tp == [1, 1] and (degraded.gpus_used, degraded.gpus_idle) == (4, 1)
    assert 0 < degraded.local_batch < healthy.local_batch
    assert (
        "its 2 cp slices at one width" in degraded.reason and "every block of a stage at its width" in degraded.reason
    )
    assert healthy.reason is None


def test_a_per_layer_replica_is_costed_with_every_block_at_the_stage_width():
    """The per-layer plan holds its degree-1 layers whole on both GPUs of a stage; scaling its own
    memory by the TP2 -> TP1 work ratio (2) counted them twice and dropped the replica."""
    plan = per_layer_cp_plan()
    replanner = Replanner(plan)
    cost = plan.predicted
    usable = cost.hbm_bytes * (1 - plan.headroom)
    reserved = cost.memory_breakdown_bytes["runtime_reserved"]
    assert (cost.memory_per_gpu_bytes - reserved) * 2 + reserved > usable  # the plan's own memory, doubled
    uniform = estimate_step(
        plan.model, plan.training, plan.layout.model_copy(update={"layer_tp": None}), plan.cluster.build()
    )
    assert uniform.memory_per_gpu_bytes < cost.memory_per_gpu_bytes
    assert replanner.work[1] == 2.0
    assert replanner.memory_at(1) == pytest.approx((uniform.memory_per_gpu_bytes - reserved) * 2 + reserved)
    assert replanner.memory_at(1) <= usable and replanner.min_degree == 1
    # the degraded replica's step scales from the uniform layout's breakdown (the ratio of the
    # plan's step to a re-costing of its own layout is 1: the plan was costed the same way)
    m = plan.layout.num_micro_batches
    mm = replanner.sequences_at(1)  # micro-batches of one sequence
    assert degraded_step_time(uniform.time_breakdown_s, m, mm, 2, 1, 2.0) <= cost.step_time_s
    assert degraded_step_time(uniform.time_breakdown_s, m, mm + 1, 2, 1, 2.0) > cost.step_time_s


@pytest.fixture(scope="module")
def demo_plan(tmp_path_factory):
    """The plan `make demo` writes."""
    path = tmp_path_factory.mktemp("demo") / "plan.json"
    made = CliRunner().invoke(
        app,
        ["plan", "--model", "llama3-70b", "--cluster", "dgx-h100", "--gpus", "1024", "--seq-len", "8192"]
        + ["--global-batch", "1024", "-o", str(path), "--json"],
    )
    assert made.exit_code == 0, made.output
    return path


@pytest.mark.parametrize("failed, degree", [("3", 3), ("1,2,3", 1)])
def test_the_demo_plan_drops_for_memory_and_says_so(demo_plan, failed, degree):
    plan = Plan.load(demo_plan)
    cost, tp = plan.predicted, plan.layout.tp
    usable = cost.hbm_bytes * (1 - plan.headroom)
    # with every part but the runtime's reserve growing by at least tp / (tp - 1), no reduced
    # degree fits: the demo plan cannot degrade, whatever the failures
    reserved = cost.memory_breakdown_bytes["runtime_reserved"]
    assert (cost.memory_per_gpu_bytes - reserved) * tp / (tp - 1) + reserved > usable
    runner = CliRunner()
    out = runner.invoke(app, ["replan", str(demo_plan), "--failed", failed, "--policy", "ntp", "--json"])
    assert out.exit_code == 0, out.output
    changed = [x for x in json.loads(out.stdout)["replicas"] if x["status"] != "healthy"]
    assert [x["status"] for x in changed] == ["dropped"]
    why = changed[0]["reason"]
    need = float(re.search(rf"memory: at TP {degree} the fullest GPU needs ([\d.]+) GiB", why).group(1))
    assert need * GIB > usable and f"of {usable / GIB:.1f} GiB usable (no degree below {tp} fits)" in why
    text = " ".join(runner.invoke(app, ["replan", str(demo_plan), "--failed", failed]).stdout.split())
    assert f"dropped (replica {changed[0]['replica']}): memory: at TP {degree}" in text


def test_each_drop_names_its_rule():
    plan = per_layer_cp_plan()
    replanner = Replanner(plan)
    dropped = replanner.replan(frozenset({1}), "dp-drop").replicas[1]
    assert (
        dropped.status == "dropped" and dropped.reason == "policy dp-drop drops every replica with a degraded TP group"
    )
    lost = replanner.replan(frozenset({0, 1}), "ntp").replicas[1]  # a whole TP2 group
    assert lost.status == "dropped" and lost.reason == "a TP group lost all 2 of its GPUs"


def test_a_replica_too_slow_for_one_micro_batch_says_by_how_much():
    """llama3-8b cut to 4 layers at tp4 dp2, two micro-batches a step: at TP2 (twice the work per
    GPU) a step of one micro-batch overruns the healthy step of two, though memory would fit."""
    model = MODELS["llama3-8b"].model_copy(update={"name": "four", "num_layers": 4})
    lay = ParallelLayout(tp=4, dp=2, global_batch=4, sequence_parallel=True)
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=8)
    plan = plan_from_layout(model, TrainingSpec(seq_len=2048, global_batch=4), cluster, lay)
    replanner = Replanner(plan)
    assert replanner.min_degree == 1 and replanner.work[2] == 2.0
    x = replanner.replan(frozenset({1, 2}), "ntp").replicas[1]
    assert x.status == "dropped"
    one = degraded_step_time(plan.predicted.time_breakdown_s, 2, 1, 4, 2, 2.0)
    assert one > plan.predicted.step_time_s
    assert x.reason == (
        f"step time: at TP 2 a step of one micro-batch takes {one:.3f} s, over the healthy step of "
        f"{plan.predicted.step_time_s:.3f} s"
    )
