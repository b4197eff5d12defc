"""`ntp validate` end to end on gloo: a plan, an NTP re-plan, failures named, input errors."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("torch", reason="torch is not installed")

from ntp_planner.cli import app  # noqa: E402
from tests.support.mutations import plant  # noqa: E402

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """tp4 pp2 dp2 (16 GPUs) and tp4 pp1 dp2 (8 GPUs) with GPU 1 failed under NTP."""
    d = tmp_path_factory.mktemp("plans")
    common = ["-m", "llama3-8b", "-c", "dgx-h100", "--seq-len", "2048"]
    assert (
        run("estimate", *common, "-n", 16, "--tp", 4, "--pp", 2, "--global-batch", 32, "-o", d / "pp.json").exit_code
        == 0
    )
    assert run("estimate", *common, "-n", 8, "--tp", 4, "--global-batch", 16, "-o", d / "dp.json").exit_code == 0
    r = run("replan", d / "dp.json", "--failed", 1, "--policy", "ntp", "-o", d / "r.json", "--json")
    assert r.exit_code == 0, r.output
    states = [x["status"] for x in json.loads(r.stdout)["replicas"]]
    assert sorted(states) == ["degraded", "healthy"]
    return d


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_validate_a_pipelined_plan(plans):
    r = run("validate", plans / "pp.json", "--nproc", 8, "--dtype", "float64", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["passed"] and out["processes"] == 8 and out["plan_stages"] == [[0], [1]]
    assert out["dtype"] == "float64" and out["tolerance"] == 1e-9
    assert max(out["max_rel_error_loss"], out["max_rel_error_params"], out["max_rel_error_grads"]) <= 1e-9
    # every rank's copy: stage 0 holds the embedding and 2 layers (19 tensors), stage 1 2 layers, norm and head (20)
    assert out["holdings_compared"] == 4 * 19 + 4 * 20
    assert out["cuts_match"] and {(c["unit"], c["degree"]) for c in out["cuts"]} == {
        ("heads", 4),
        ("kv_heads", 4),
        ("ffn", 4),
        ("vocab", 4),
    }
    assert out["vocabulary_ids_missing"] == 0
    assert out["step_time_s"] > 0
    assert len(out["max_rel_error_params_per_pipeline"]) == 1  # one replica, one pipeline
    # process k stands for plan rank k's GPU: stage 1 starts at plan rank tp * dp = 8
    assert [x["plan_rank"] for x in out["ranks"]] == [0, 1, 2, 3, 8, 9, 10, 11]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_validate_an_ntp_replan_runs_tp4_beside_tp3_with_fewer_micro_batches(plans):
    r = run("validate", plans / "dp.json", "--replan", plans / "r.json", "--nproc", 8, "--dtype", "float64")
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    # the plan's degraded replica keeps 7 of 8 micro-batches; the shrunk run keeps fewer too
    assert "4 ranks: TP 4 x 2 micro-batches" in text and "3 ranks: TP 3 x 1 micro-batches" in text
    # 3 sequences need 25 tokens (24 dealt each) to hold all 72 ids of the shrunk vocabulary; sequence
    # parallelism over the TP4 stage rounds that up to 28
    assert "sequence 2048 -> 28 tokens" in text and "all 72 ids an input and a target" in text
    assert "147 holdings (every rank's copy of every parameter)" in text
    assert "as the planner deals them (heads, kv_heads, ffn, vocab at degree 3, 4)" in text
    assert "PASS (float64, all <= 1e-09)" in text


def test_validate_fails_when_the_cuts_differ_from_the_planners(plans, monkeypatch):
    from functools import partial

    from ntp_planner.executor.train import launch as launcher

    bug = plant(monkeypatch, "cuts-reversed")  # fuller ranks last: here, where the CLI checks the cuts
    monkeypatch.setattr(launcher, "launch", partial(launcher.launch, worker_init=bug))  # and in the CLI's ranks
    r = run("validate", plans / "dp.json", "--replan", plans / "r.json", "--nproc", 8, "--dtype", "float64")
    assert r.exit_code == 1
    assert "the executor's shard cuts differ from the planner's shares (heads at degree 3: executor 10/11/11, " \
        "planner 11/11/10" in " ".join(r.output.split())  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_dead_rank_fails_validate_with_its_name(plans):
    r = run("validate", plans / "dp.json", "--nproc", 8, "--inject-fault", "5:die:0", "--timeout", 30)
    assert r.exit_code == 1
    assert "rank 5 (replica 1, stage 0, local rank 1) died" in " ".join(r.output.split())


@pytest.mark.parametrize(
    "args, message",
    [
        (["--backend", "nccl"], "--backend nccl needs CUDA GPUs"),
        (["--backend", "mpi"], "'--backend': Value error, 'mpi' is not one of 'gloo', 'nccl'"),
        (["--nproc", 2], "needs 4 processes (its stage width); run at least 4 processes"),
        (["--steps", 0], "'--steps': Input should be greater than or equal to 1"),
        (["--dtype", "float16"], "'--dtype': Value error, 'float16' is not one of 'float64', 'float32', 'bfloat16'"),
        (["--tolerance", 0], "--tolerance 0 must lie between 0 and 1"),
        (["--tolerance", -1], "'--tolerance': Input should be greater than or equal to 0"),
        (["--timeout", 0], "'--timeout': Input should be greater than or equal to 1"),
        (["--timeout", 1e-300], "'--timeout': Input should be greater than or equal to 1"),  # ran, as hung at once
        (["--inject-fault", "x"], "must look like RANK:die|hang|raise:STEP"),
    ],
)
def test_validate_input_errors_are_one_sentence(plans, args, message):
    r = run("validate", plans / "pp.json", *args)
    assert r.exit_code == 2
    assert message in " ".join(r.output.split())
    assert "Traceback" not in r.output


def test_validate_rejects_a_replan_of_another_plan(plans):
    r = run("validate", plans / "pp.json", "--replan", plans / "r.json")
    assert r.exit_code == 2
    assert "validate the plan it was made from" in " ".join(r.output.split())


def torchrun_validate(nproc: int, *args) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc_per_node NPROC ntp validate ARGS` on this host, on loopback."""
    bin_dir = Path(sys.executable).parent
    torchrun, ntp = bin_dir / "torchrun", bin_dir / "ntp"
    if not torchrun.exists() or not ntp.exists():
        pytest.skip("torchrun or ntp is not installed next to this Python")
    env = os.environ | {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    argv = [torchrun, "--standalone", "--nproc_per_node", nproc, ntp, "validate", *args]
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=170, env=env)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_same_command_runs_under_torchrun(plans):
    """Across hosts torchrun starts the processes; each `ntp validate` becomes one rank."""
    out = torchrun_validate(7, plans / "dp.json", "--replan", plans / "r.json", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    data = json.loads(out.stdout)  # only rank 0 prints
    assert data["passed"] and data["processes"] == 7
    assert [x["replica"] for x in data["ranks"]] == [0, 0, 0, 0, 1, 1, 1]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_rank_killed_under_torchrun_is_named_once(plans):
    """Rank 5 of 8 exits at the start of step 2 (``--inject-fault``, which torchrun runs used to
    ignore): every rank fails, one of them says so, naming rank 5, not itself; one JSON object."""
    out = torchrun_validate(8, plans / "dp.json", "--inject-fault", "5:die:1", "--timeout", "20", "--json")
    assert out.returncode != 0
    data = json.loads(out.stdout)  # one object: a second would make this fail
    assert data["passed"] is False
    assert data["failure"].startswith("rank 5 (replica 1, stage 0, local rank 1, in step 2) died without a word")
    said = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert said == [f"error: {data['failure']}"]
