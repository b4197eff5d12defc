"""Plan and validate from a profile: `ntp validate --profile` reports predicted against measured
step time (and records it), `ntp calibrate` fits the record, `ntp plan|estimate|explain --profile`
cost from it without torch, and mismatched profiles are refused in one sentence."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime

import pytest
from typer.testing import CliRunner

from cost_models.calibrate import RunRecord
from cost_models.profile import (
    CollectiveFit,
    GemmTime,
    PassTime,
    Profile,
    ProfileDevice,
    load_profile,
    profile_json,
)
from ntp_planner.cli import app

runner = CliRunner()
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def cpu_profile(cores: int = 2) -> Profile:
    """A profile of a 2-process CPU host, written out by hand (no measuring in the test)."""
    device = ProfileDevice(
        kind="cpu", name="test cpu", gpu="cpu-test", count=2, cores=cores, memory_bytes=8 * 2**30, backend="gloo",
        torch_version="2.13.0",
    )  # fmt: skip
    fits = [CollectiveFit(op=op, group_size=2, alpha_s=2e-4, bw_bytes_per_s=1e9, max_rel_residual=0.1) for op in OPS]
    return Profile(
        created=datetime(2026, 12, 1, tzinfo=UTC), device=device, dtype="float32",
        gemms=(GemmTime(m=256, n=256, k=256, time_s=1e-3, flops_per_s=256**3 * 2 / 1e-3),),
        passes=(
            PassTime(op="copy", bytes=2**21, time_s=2e-4, bytes_per_s=2**21 / 2e-4),
            PassTime(op="optimizer", bytes=28 * 2**20, time_s=3e-3, bytes_per_s=28 * 2**20 / 3e-3),
            PassTime(op="optimizer", bytes=28 * 2**14, tensors=16, time_s=5e-4, bytes_per_s=28 * 2**14 / 5e-4),
        ),
        collective_fits=tuple(fits),
    )  # fmt: skip


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("profiled")
    (d / "cpu.json").write_text(profile_json(cpu_profile()))
    h100 = cpu_profile().model_copy(
        update={"device": cpu_profile().device.model_copy(update={"kind": "cuda", "gpu": "H100-SXM", "name": "H100"})}
    )
    (d / "h100.json").write_text(profile_json(h100))
    common = ["-m", "llama3-8b", "-c", "dgx-h100", "-n", 8, "--seq-len", 2048, "--global-batch", 16]
    assert run("estimate", *common, "--tp", 2, "-o", d / "tp2.json").exit_code == 0
    return d


@pytest.mark.slow  # in `make test-slow`; faster cases of the same path stay in `make test`
@pytest.mark.timeout(240)
def test_validate_reports_predicted_and_measured_step_time_and_records_them(files):
    record = files / "runs.jsonl"
    r = run("validate", files / "tp2.json", "--nproc", 2, "--profile", files / "cpu.json", "--record", record, "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    predicted, measured = data["predicted_step_time_s"], data["measured_step_time_s"]
    assert data["passed"] and predicted > 0 and measured > 0
    assert data["step_time_error"] == pytest.approx((predicted - measured) / measured, rel=1e-12)
    split = data["time_split_s"]
    # TP by hand: the shrunk run is one TP2 replica (sequence parallel), 2 layers, 2 micro-batches of one
    # sequence (34 tokens: the batch holds each of the 64 vocabulary ids, on a length TP2 divides), hidden
    # 32 heads x 4 = 128, vocabulary 64, float32. Per micro-batch, every call costs 0.2 ms + bytes / 1 GB/s:
    # each layer 4 all-gathers and 4 reduce-scatters of the activation, the embedding one of each, the head
    # one of each and an all-gather of the logits.
    seq = data["seq_len"]
    assert seq == 34
    call = 2e-4 + 4 * seq * 128 / 1e9
    assert split["tp_comm"]["predicted"] == pytest.approx(2 * ((2 * 8 + 2 + 2) * call + 2e-4 + 4 * seq * 64 / 1e9))
    assert split["tp_comm"]["predicted"] > 0 and split["tp_comm"]["measured"] > 0  # TP2: both sides communicate
    assert data["steps"] == 8  # --profile times 8 steps unless told otherwise
    # the shrunk model's blocks were measured on the spot: no block is analytical
    assert not [n for n in data["prediction_notes"] if "not profiled: analytical compute" in n]
    (stage,) = data["stages"]
    # memory: weights and gradients of the same parameters, AdamW's two moments twice that, on both sides
    meas, pred = stage["measured_memory_bytes"], stage["predicted_memory_bytes"]
    assert meas["grads"] == meas["weights"] and meas["optimizer"] == 2 * meas["weights"]
    assert pred["optimizer"] == pytest.approx(2 * pred["weights"])
    # the cost model's parameters per rank (vocabulary unpadded, as the executor holds it) are the executor's
    assert pred["weights"] == pytest.approx(meas["weights"])
    lines = record.read_text().splitlines()
    assert len(lines) == 1
    rec = RunRecord.model_validate_json(lines[0])
    assert rec.measured_step_time_s == measured and rec.predicted_step_time_s == predicted
    assert rec.compute_s + rec.comm_s + rec.overhead_s == pytest.approx(predicted, rel=1e-9)


def _records(profile: Profile, a: float = 1.5, b: float = 2.0, c: float = 0.003) -> str:
    rows = []
    for i, (x, y) in enumerate([(0.01, 0.02), (0.03, 0.01), (0.02, 0.05), (0.05, 0.03)]):
        rows.append(
            RunRecord(
                name=f"run {i}", profile_created=profile.created, profile_gpu=profile.device.gpu,
                measured_step_time_s=a * x + b * y + c, predicted_step_time_s=x + y, compute_s=x, comm_s=y,
                overhead_s=0.0,
            ).model_dump_json()
        )  # fmt: skip
    return "\n".join(rows) + "\n"


def test_calibrate_writes_the_fitted_profile(files, tmp_path):
    runs = tmp_path / "runs.jsonl"
    runs.write_text(_records(cpu_profile()))
    out = tmp_path / "calibrated.json"
    r = run("calibrate", runs, "--profile", files / "cpu.json", "-o", out, "--json")
    assert r.exit_code == 0, r.output
    cal = load_profile(out).calibration
    assert (cal.compute_scale, cal.comm_scale) == (pytest.approx(1.5), pytest.approx(2.0))
    assert cal.step_overhead_s == pytest.approx(0.003)
    assert [x["residual"] for x in json.loads(r.stdout)["runs"]] == pytest.approx([0.0] * 4, abs=1e-9)
    shown = run("calibrate", runs, "--profile", files / "cpu.json", "-o", out)
    assert shown.exit_code == 0 and "compute multiplier" in shown.stdout and "run 3" in shown.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["estimate", "-m", "llama3-8b", "-c", "dgx-a100", "-n", 8, "--tp", 2, "--profile", "{d}/h100.json"],
         "error: profile {d}/h100.json was measured on H100 (H100-SXM) but the cluster's GPU is A100-SXM4-80GB; "
         "plan for a cluster of H100-SXM (the cluster file `ntp profile` wrote) or profile a A100-SXM4-80GB machine."),
        (["validate", "{d}/tp2.json", "--nproc", 2, "--profile", "{d}/h100.json"],
         "error: profile {d}/h100.json was measured on cuda (H100) but a gloo run computes on cpu; profile this "
         "machine with `ntp profile --device cpu`."),
        (["validate", "{d}/tp2.json", "--record", "{d}/runs.jsonl"],
         "error: --record stores predicted against measured step times; give --profile too."),
        (["calibrate", "{d}/missing.jsonl", "--profile", "{d}/cpu.json", "-o", "{d}/x.json"],
         "error: cannot read runs file {d}/missing.jsonl: No such file or directory."),
    ],
)  # fmt: skip
def test_mismatches_are_one_sentence_and_exit_2(files, args, message):
    r = run(*[str(a).format(d=files) for a in args])
    assert r.exit_code == 2
    assert r.output == message.format(d=files) + "\n"


def test_plan_and_explain_from_a_profile_never_import_torch(files):
    h100 = files / "h100.json"
    code = (
        "import sys\nfrom typer.testing import CliRunner\nfrom ntp_planner.cli import app\n"
        f"r = CliRunner().invoke(app, ['plan', '-m', 'llama3-8b', '-c', 'dgx-h100', '-n', '8', '--seq-len', '2048', "
        f"'--global-batch', '16', '--profile', {str(h100)!r}, '-o', {str(files / 'p.json')!r}])\n"
        "assert r.exit_code == 0, r.output\n"
        f"r = CliRunner().invoke(app, ['explain', {str(files / 'p.json')!r}, '--profile', {str(h100)!r}, '--json'])\n"
        "assert r.exit_code == 0, r.output\nimport json\nprint(json.loads(r.stdout)['profile_notes'])\n"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    notes, imported = out.stdout.strip().splitlines()[-2:]
    assert imported == "False"
    assert "not profiled: analytical compute" in notes  # the hand-made profile has no llama3-8b blocks


@pytest.mark.parametrize(
    ("zero", "dtype", "held"),
    [
        # TP2 x DP2 of the test model: 9,376 parameters per rank (test_optimizer's TP2_PARAMS), each
        # state divided by the 2 replicas from its ZeRO level on: the bytes the runs measure there
        (0, "float64", (75008, 75008, 150016)),
        (1, "float64", (75008, 75008, 75008)),
        (2, "float64", (75008, 37504, 75008)),
        (3, "float64", (37504, 37504, 75008)),
        (1, "bfloat16", (2 * 9376, 4 * 9376, 12 * 9376 // 2)),  # Megatron's 2 + 4 + 12 / d
    ],
)
def test_predicted_model_state_follows_the_zero_level(zero, dtype, held):
    from ntp_planner.executor.check.predict import predict_run
    from ntp_planner.executor.spec import TinyConfig, make_spec
    from ntp_planner.profiler.cluster import local_cluster

    profile = cpu_profile().model_copy(update={"dtype": dtype})
    spec = make_spec(TinyConfig(), [[2, 2, 2, 2]], [([2], 2), ([2], 2)], 2, 8, dtype=dtype, zero=zero)
    (stage,) = predict_run(spec, "llama3-8b", profile, local_cluster(profile)).memory_bytes
    assert (stage["weights"], stage["grads"], stage["optimizer"]) == held


def test_predicted_sharded_sync_is_a_reduce_scatter_and_an_all_gather_per_tensor():
    from ntp_planner.executor.check.predict import predict_run
    from ntp_planner.executor.spec import TinyConfig, make_spec
    from ntp_planner.profiler.cluster import local_cluster

    # TP2 x DP2, ZeRO-1: a rank holds 21 parameter tensors (embedding; 9 per layer; final norm and
    # LM head), each reduce-scattered and all-gathered once per step: 42 calls of 0.2 ms, plus
    # 9,376 x 4 bytes each way at 1 GB/s (less than one more call)
    profile = cpu_profile()
    spec = make_spec(TinyConfig(), [[2, 2, 2, 2]], [([2], 2), ([2], 2)], 2, 8, zero=1)
    dp_sync = predict_run(spec, "llama3-8b", profile, local_cluster(profile)).time_split_s["dp_sync"]
    assert 42 * 2e-4 < dp_sync < 43 * 2e-4
