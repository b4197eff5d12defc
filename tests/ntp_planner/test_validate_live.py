"""`ntp validate --fail/--repair`: live recovery from the command line, and its input errors."""

import json

import pytest
from typer.testing import CliRunner

pytest.importorskip("torch", reason="torch is not installed")

from ntp_planner.cli import app  # noqa: E402

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    """llama3-8b at TP4 x DP2 on 8 H100s (8 processes: replica 0 on 0-3, replica 1 on 4-7), ZeRO-0: a
    lost process's optimizer rows live on in the other replica (at ZeRO >= 1 its shard has no other
    holder, and the run falls back to a checkpoint: test_live_sharded)."""
    d = tmp_path_factory.mktemp("live")
    args = ["-m", "llama3-8b", "-c", "dgx-h100", "--seq-len", "2048", "-n", 8, "--tp", 4, "--global-batch", 16]
    args += ["--zero", "0"]
    assert run("estimate", *args, "-o", d / "dp.json").exit_code == 0
    return d / "dp.json"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fail", "one@2"], "is not RANK@STEP[:HOW]"),
        (["--fail", "1@2:explode"], "HOW one of kill, sync, raise, hang"),
        (["--fail", "8@2"], "names process 8 but the run has 8 processes (0..7)"),
        (["--fail", "1@3"], "the run has steps 0..2; raise --steps"),
        (["--fail", "1@1", "--fail", "1@1"], "names the same process and step twice"),
        (["--fail", "1@1", "--repair", "2@2"], "repairs a process that has not failed before step 2"),
        (["--fail", "1@1", "--policy", "spares"], "needs idle spare processes: add --spares 1"),
        (["--fail", "1@1", "--policy", "elastic"], "--policy 'elastic' is not one of ntp, ntp-pw"),
        (["--fail", "1@1", "--checkpoint-dir", "ck"], "--checkpoint-dir needs --checkpoint-every"),
        (["--policy", "dp-drop"], "shape a live recovery; add --fail RANK@STEP"),
        (["--fail", "1@1", "--backend", "nccl"], "without --replan, --profile, --inject-fault or --backend nccl"),
        (["--fail", "1@0", "--repair", "1@1", "--repair", "1@2"], "--repair 1@2 repairs a process that has not"),
        (["--fail", "1@0", "--fail", "1@2"], "which failed in step 0 and is not repaired before"),
        (["--fail", "1@0", "--repair", "1@0"], "has not failed before step 0"),
        (["--fail", "8@1", "--spares", 0], "names process 8 but the run has 8 processes (0..7)"),
        (["--fail", "9@1", "--spares", 1], "and 1 spares (0..8)"),
        (["--fail", "1@1", "--spares", -1], "Invalid value for '--spares'"),
        (["--fail", "1@1", "--spares", 10**6], "Invalid value for '--spares'"),
        (["--fail", "1@1", "--checkpoint-every", -2], "Invalid value for '--checkpoint-every'"),
        (["--fail", "1@1", "--checkpoint-every", 10**9], "Invalid value for '--checkpoint-every'"),
        (["--fail", "1@99999999"], "is not RANK@STEP"),
        (["--fail", "1@-1"], "is not RANK@STEP"),
        (["--fail", "-1@1"], "is not RANK@STEP"),
        (["--repair", " @ "], "is not RANK@STEP"),
        (["--fail", "1@1:host"], "loses a whole torchrun node; run it under torchrun"),
        (["--join", "nohost"], "--join 'nohost' is not HOST:PORT/RUN_ID"),
        (["--join", "127.0.0.1:99999/r"], "--join port 99999 must be 1..65535"),
        (["--join", "a" * 300 + ":29500/r"], "--join host of 300 characters is longer than a host name can be"),
        (["--join", "nohost.invalid:29500/r"], "--join host 'nohost.invalid' does not resolve"),
        (["--join", "127.0.0.1:1/r"], "nothing accepts connections at 127.0.0.1:1"),
    ],
)
def test_live_input_errors_are_one_sentence_before_any_process_starts(plan, args, message):
    r = run("validate", plan, "--nproc", 8, "--steps", 3, *args)
    assert r.exit_code == 2, r.output
    assert message in " ".join(r.output.split()) and "Traceback" not in r.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fail", "1@1", "--repair", "1@2"], "under torchrun a repair is a process that joins the run"),
        (["--fail", "1@1", "--checkpoint-every", 1], "--checkpoint-every needs --checkpoint-dir, a folder every host"),
        (["--fail", "1@1", "--nproc", 4], "--nproc 4 differs from torchrun's 8 processes"),
        (["--fail", "1@1", "--spares", 8], "--spares 8 leaves none of torchrun's 8 processes to train"),
    ],
)
def test_torchrun_live_input_errors_are_one_sentence_before_any_store_is_reached(plan, monkeypatch, args, message):
    # torchrun's variables, with no agent store behind them: refused before anything connects
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    r = run("validate", plan, "--steps", 3, *args)
    assert r.exit_code == 2, r.output
    assert message in " ".join(r.output.split()) and "Traceback" not in r.output


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("file", "is not a folder"),
        ("file/sub", "is a file, not a folder"),
        ("old", "already holds checkpoints (step-00000001, ...)"),
    ],
)
def test_a_checkpoint_dir_the_run_cannot_use_is_refused_and_nothing_is_written(plan, tmp_path, where, message):
    (tmp_path / "file").write_text("x")
    (tmp_path / "old" / "step-00000001").mkdir(parents=True)
    (tmp_path / "old" / "step-00000001" / "manifest.json").write_text("{}")
    before = sorted(tmp_path.rglob("*"))
    r = run("validate", plan, "--nproc", 8, "--steps", 3, "--fail", "1@1", "--checkpoint-every", 1,
            "--checkpoint-dir", tmp_path / where)  # fmt: skip
    assert r.exit_code == 2, r.output
    assert message in " ".join(r.output.split()) and "Traceback" not in r.output
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_validate_fail_recovers_live_and_reports_the_timeline_and_the_samples(plan):
    r = run("validate", plan, "--nproc", 8, "--steps", 4, "--fail", "1@1", "--policy", "ntp", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["passed"] and data["steps_committed"] == 4 and data["max_rel_error_params"] <= 1e-5
    (event,) = data["timeline"]
    assert event["procs"] == [1] and event["source"] == "memory" and event["layout"].startswith("TP3 + TP4")
    assert event["replicas"] == [
        "replica 0 degraded: runs at TP 3, the fewest survivors of its TP groups; 6 of 8 micro-batches fit the "
        "healthy step"
    ]
    # the sample stream: 4 per step before the failure, 3 after (replica 0 at TP3 keeps 1 of 2 micro-batches)
    assert [(s["consumed"], s["batch"]) for s in data["samples"]] == [(0, 4), (4, 3), (7, 3), (10, 3)]
    assert data["samples"][1]["replicas"] == [[4, 5], [5, 7]]
    assert set(data["recovery_costs_s"]) == {"detection_s", "reconfigure_s"}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_validate_restart_writes_checkpoints_and_reloads_the_last(plan, tmp_path):
    folder = tmp_path / "ck"
    r = run("validate", plan, "--nproc", 8, "--steps", 6, "--fail", "5@4", "--policy", "restart",
            "--checkpoint-every", 2, "--checkpoint-dir", folder, "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    (event,) = data["timeline"]
    assert event["event"] == "restart" and event["redo_from"] == 4 and data["lost_steps"] == []
    # checkpoints after steps 1, 3, 5 (and 3, 5 again on the new layout): the last two complete ones kept
    assert sorted(p.name for p in folder.iterdir()) == ["step-00000003", "step-00000005"]
    assert (folder / "step-00000005" / "manifest.json").exists()
