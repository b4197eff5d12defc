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
