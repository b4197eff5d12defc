"""`ntp validate --replan` says out loud when the run holds no degraded replica."""

import json

import pytest
from typer.testing import CliRunner

pytest.importorskip("torch", reason="torch is not installed")

from ntp_planner.cli import app  # noqa: E402

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.mark.timeout(180)
def test_a_replan_that_only_drops_warns_that_no_ntp_sync_runs(tmp_path):
    plan, replan = tmp_path / "plan.json", tmp_path / "r.json"
    made = run("estimate", "-m", "llama3-8b", "-c", "dgx-h100", "-n", 8, "--tp", 2, "--global-batch", 8, "-o", plan)
    assert made.exit_code == 0, made.output
    assert run("replan", plan, "--failed", 1, "--policy", "dp-drop", "-o", replan).exit_code == 0
    r = run("validate", plan, "--replan", replan, "--nproc", 2, "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["passed"] and out["plan_replicas"] == [0] and out["degraded_replicas_run"] == []
    warning = out["replan_warning"]
    assert warning.startswith("the re-plan degrades no replica: the one replica that lost GPUs is dropped (replica 3:")
    assert "policy dp-drop drops every replica with a degraded TP group" in warning
    assert r.stderr.startswith(f"warning: {warning}")


@pytest.mark.timeout(240)
def test_an_moe_replan_runs_its_rehosted_experts_at_the_plans_ep_exactly(tmp_path):
    # Mixtral (4 layers) at tp 2, dp 4, ep 4, etp 1 on 8 H100s; GPU 3 fails: replica 3 runs at TP 1
    # and its lost rank 7's experts 6, 7 go to ranks 4, 5 (``shrink/test_hosted.py`` derives it)
    from cost_models.catalogue import MODELS
    from cost_models.layout import ParallelLayout
    from cost_models.training import TrainingSpec
    from ntp_planner.solver.planner import plan_from_layout
    from topologies.cluster import Cluster
    from topologies.cluster_catalogue import CLUSTERS

    model = MODELS["mixtral-8x7b"].model_copy(update={"name": "mixtral-8x7b-4", "num_layers": 4})
    lay = ParallelLayout(tp=2, dp=4, ep=4, etp=1, global_batch=16)
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=8)
    plan, replan = tmp_path / "plan.json", tmp_path / "r.json"
    plan_from_layout(model, TrainingSpec(seq_len=2048, global_batch=16), cluster, lay).save(plan)
    made = run("replan", plan, "--failed", 3, "--policy", "ntp", "-o", replan)
    assert made.exit_code == 0, made.output
    r = run("validate", plan, "--replan", replan, "--nproc", 7, "--dtype", "float64", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["passed"] and out["max_rel_error_grads"] <= 1e-9 and out["losses"][-1] < out["losses"][0]
    assert out["ep"] == 4 and out["processes"] == 7 and out["plan_replicas"] == [2, 3, 0, 1]
    assert out["degraded_replicas_run"] == [2, 3] and out["replan_warning"] is None
    assert [x["plan_rank"] for x in out["ranks"]] == [4, 5, 6, 0, 1, 2, 3]
    # processes 0, 1, 2 (plan ranks 4, 5, 6) hold every expert, 6 and 7 of the lost rank 7 on 0 and 1
    (host,) = out["expert_hosting"]
    assert host["groups"] == [[3, 4, 5, 6], [0, 1, 2]]
    assert [min(o) for o in host["owners"]] == [0, 0, 1, 1, 2, 2, 0, 1]
    assert any(
        "EP group 4, 5, 6, 7 lost rank 7, its experts now on rank 4 (process 0) experts 6" in n for n in out["notes"]
    )
