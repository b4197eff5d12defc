"""`ntp profile` end to end on a tiny model (two gloo processes, a few message sizes), the
profile's JSON round trip, the local cluster, and bad input in one line with exit code 2."""

import json

import pytest
from typer.testing import CliRunner

from cost_models.profile import Profile, load_profile, profile_json
from ntp_planner.cli import app
from ntp_planner.profiler.cluster import local_cluster
from topologies.cluster_catalogue import load_cluster_spec

runner = CliRunner()


def run(*args):
    return runner.invoke(app, ["profile", *[str(a) for a in args]])


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """One real quick profile of the tiny model, shared by the tests that read it."""
    import tests.ntp_planner.profiler.conftest as c

    folder = tmp_path_factory.mktemp("profile")
    model = folder / "tiny.json"
    model.write_text(json.dumps(c.TINY_MODEL))
    out = folder / "p.json"
    result = run("--quick", "--device", "cpu", "--nproc", 2, "--model", model, "--seq-len", 8, "-o", out, "--json")
    assert result.exit_code == 0, result.output
    return out, json.loads(result.stdout)


def test_profile_writes_a_profile_and_a_cluster_file(measured):
    out, summary = measured
    profile = load_profile(out)
    assert summary["profile"] == str(out) and summary["cluster"] == str(out.with_name("p.cluster.json"))
    assert profile.device.kind == "cpu" and profile.device.count == 2 and profile.dtype == "float32"
    assert {(b.shape.kind, b.shape.tp) for b in profile.blocks} == {
        (k, t) for k in ("embedding", "layer", "head") for t in (1, 2)
    }  # tiny.json: 8 heads, 2 KV heads, FFN 48: the planner tries TP 1 and 2 on two devices
    assert {(f.op, f.group_size) for f in profile.collective_fits} == {
        (op, 2) for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
    }
    assert {p.op for p in profile.passes} == {"norm", "activation", "optimizer", "copy"}
    assert profile.gemms and profile.attention[0].kernel == "cpu"
    cluster = load_cluster_spec(out.with_name("p.cluster.json"))
    assert cluster.gpu == profile.device.gpu and cluster.custom_gpu.architecture == "cpu"
    assert cluster.domain_size == cluster.gpus_per_node == 2
    assert cluster.custom_gpu.bf16_flops_per_s == max(g.flops_per_s for g in profile.gemms)


def test_profile_round_trips_through_json(measured, tmp_path):
    profile = load_profile(measured[0])
    again = tmp_path / "again.json"
    again.write_text(profile_json(profile))
    assert load_profile(again) == profile
    assert Profile.model_validate_json(profile_json(profile)) == profile


def test_local_cluster_links_reproduce_the_fits(measured):
    """The cost model divides the link rate by its NVLink efficiency and charges an all-reduce on
    2 ranks 2 ceil(log2 2) = 2 latency steps: the cluster file undoes both."""
    profile = load_profile(measured[0])
    cluster = local_cluster(profile)
    ar = profile.collective_fit("all_reduce", 2)
    assert cluster.nvlink_latency_s == pytest.approx(ar.alpha_s / 2)
    assert cluster.scaleout_bw_bytes_per_s == cluster.nvlink_bw_bytes_per_s
    assert "measured by ntp profile on" in cluster.sources["nvlink_bw_bytes_per_s"]


def test_a_catalogue_gpu_keeps_its_catalogue_name(measured):
    profile = load_profile(measured[0])
    h100 = profile.model_copy(update={"device": profile.device.model_copy(update={"kind": "cuda", "gpu": "H100-SXM"})})
    cluster = local_cluster(h100)
    assert cluster.gpu == "H100-SXM" and cluster.custom_gpu is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--device", "cpu", "--backend", "nccl"], "error: --backend nccl runs on CUDA GPUs only; use --backend gloo"),
        (["--device", "cpu", "--model", "llama-9000"], "error: unknown model 'llama-9000'"),
        (["--device", "cpu", "--tp", "4"], "error: --tp 4 exceeds the 2 devices (processes) of this profile"),
        (["--device", "cpu", "--micro-batches", "1,x"], "error: --micro-batches '1,x' must be comma-separated"),
        (["--device", "cpu", "--dtype", "int8"], "error: --dtype 'int8' is not one of float32, bfloat16"),
        (["--device", "cpu", "-o", "no/such/folder/p.json"], "error: cannot write --output no/such/folder/p.json"),
        (["--device", "cpu", "--model", "llama3-70b", "--seq-len", "8192"], "error: measuring llama3-70b's blocks"),
    ],
)
def test_bad_input_is_one_line_and_exit_2_and_writes_nothing(args, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(message) and result.stderr.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_nproc_0_is_refused_by_the_option():
    result = run("--nproc", 0)
    assert result.exit_code == 2 and "--nproc" in result.output
