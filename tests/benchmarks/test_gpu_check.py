"""`benchmarks/gpu_check.sh --device cpu`: the GPU check's dry run on CPU and gloo, so that the
script a GPU machine will run stays working where there is none (about 25 s on two cores)."""

import doctest
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
# benchmarks/gpu_check/tiny.json: 2 layers x (q 64x64, k and v 16x64, o 64x64; gate, up, down 176x64;
# two norms of 64) = 2 x 44,160, embedding and LM head 256 x 64 each, final norm 64
TINY_PARAMS = 2 * (64 * 64 * 2 + 16 * 64 * 2 + 3 * 176 * 64 + 2 * 64) + 2 * 256 * 64 + 64


def _load_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(*args, **env):
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=300, cwd=ROOT,
        env={**os.environ, "PYTHON": sys.executable, **env},
    )  # fmt: skip


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check")
    done = _run("--device", "cpu", "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    return out, done, json.loads((out / "gpu_check.json").read_text())


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_every_step_ran_and_was_timed(dry_run):
    out, done, data = dry_run
    assert data["passed"] and data["device"] == "cpu"
    assert [s["step"] for s in data["steps"]] == ["profile", "plan", "validate", "blocks"]
    assert all(s["ok"] and s["rc"] == 0 and _positive(s["seconds"]) for s in data["steps"])
    assert sum(s["seconds"] for s in data["steps"]) < 120  # a budget of 150 s: each step gets what is left
    for name in ("profile", "plan", "validate", "blocks"):  # each step's output kept
        assert (out / f"{name}.out").stat().st_size > 0 and (out / f"{name}.err").exists()
    assert "GPU check (cpu): every step ran" in done.stdout and "every figure in" in done.stdout


def test_the_full_size_run_is_exact_and_its_memory_is_the_models(dry_run):
    _, _, data = dry_run
    v = data["validate"]
    assert v["passed"] and v["dtype"] == "float64" and v["tolerance"] == 1e-9
    assert all(0 <= v[f"max_rel_error_{k}"] <= 1e-9 for k in ("loss", "grads", "params"))
    assert v["holdings_compared"] == 21 and v["vocabulary_ids_missing"] == 0  # 2 x 9 layer tensors + 3
    assert (v["steps"], v["seq_len"], v["micro_batch"]) == (4, 64, 2)
    assert _positive(v["predicted_step_time_s"]) and _positive(v["measured_step_time_s"])
    assert v["step_time_ratio"] == pytest.approx(v["measured_step_time_s"] / v["predicted_step_time_s"])
    # float64 weights, gradients and two AdamW moments of the toy's 121,152 parameters, and activations
    assert TINY_PARAMS == 121_152
    assert v["predicted_memory_bytes"] > 32 * TINY_PARAMS and v["counted_memory_bytes"] > 32 * TINY_PARAMS
    assert v["cuda_max_allocated_bytes"] is None  # CPU: tensor accounting only
    assert v["memory_ratio"] == pytest.approx(v["counted_memory_bytes"] / v["predicted_memory_bytes"])


def test_the_plan_and_the_run_hold_the_toy_at_its_own_size(dry_run):
    out, _, _ = dry_run
    stage = json.loads((out / "validate.out").read_text())["stages"][0]
    for counted in (stage["measured_memory_bytes"], stage["predicted_memory_bytes"]):
        assert (counted["weights"], counted["grads"], counted["optimizer"]) == (
            8 * TINY_PARAMS, 8 * TINY_PARAMS, 16 * TINY_PARAMS,
        )  # fmt: skip
    plan = json.loads((out / "plan.json").read_text())
    assert plan["layout"]["tp"] == plan["layout"]["pp"] == plan["layout"]["dp"] == 1
    assert plan["cluster"]["num_gpus"] == 1


def test_blocks_table_has_every_profiled_block_against_the_analytical_model(dry_run):
    out, done, data = dry_run
    profile = json.loads((out / "profile.json").read_text())
    rows = {(r["kind"], r["tp"], r["micro_batch"], r["seq_len"]): r for r in data["blocks"]}
    measured = {(b["shape"]["kind"], b["shape"]["tp"], b["micro_batch"], b["shape"]["seq_len"]): b for b in
                profile["blocks"]}  # fmt: skip
    assert set(rows) == set(measured) == {(k, 1, 2, 64) for k in ("embedding", "layer", "head")}
    for key, r in rows.items():
        assert r["measured_s"] == pytest.approx(measured[key]["fwd_s"] + measured[key]["bwd_s"])
        assert _positive(r["analytical_fwd_s"]) and _positive(r["analytical_bwd_s"])
        assert r["analytical_s"] == pytest.approx(r["analytical_fwd_s"] + r["analytical_bwd_s"])
        assert r["ratio"] == pytest.approx(r["measured_s"] / r["analytical_s"])
    # a layer does more work than the embedding's lookup, in either model
    assert rows["layer", 1, 2, 64]["analytical_s"] > rows["embedding", 1, 2, 64]["analytical_s"]
    assert "layer tp1 mb2 s64" in done.stdout


def test_the_dry_run_keeps_its_profile_under_its_folder_and_leaves_the_repo_alone(dry_run):
    out, _, data = dry_run
    profile = json.loads((out / "profile.json").read_text())
    slug = profile["device"]["gpu"].lower()
    assert slug.startswith("cpu-") and data["profile"]["file"] == f"profiles/{slug}.json"
    assert (out / "profiles" / f"{slug}.json").read_text() == (out / "profile.json").read_text()
    assert not (ROOT / "profiles" / f"{slug}.json").exists()


def test_a_failed_step_fails_the_summary_and_names_it(tmp_path):
    check = _load_check()
    (tmp_path / "steps.tsv").write_text("step\tseconds\trc\nprofile\t1.5\t0\nplan\t0.5\t0\nvalidate\t9.0\t1\n")
    (tmp_path / "validate.out").write_text(json.dumps({"passed": False, "failure": "rank 0 died"}))
    assert check.main(["summary", str(tmp_path), "--device", "cpu"]) == 1
    data = json.loads((tmp_path / "gpu_check.json").read_text())
    assert not data["passed"] and data["validate"] == {"passed": False, "failure": "rank 0 died"}
    assert [(s["step"], s["rc"], s["ok"]) for s in data["steps"]] == [
        ("profile", 0, True), ("plan", 0, True), ("validate", 1, False), ("blocks", -1, False),
    ]  # fmt: skip


def test_a_failed_step_skips_the_steps_that_need_it_and_exits_1(tmp_path):
    # a Python that answers the probe and fails `ntp profile` (exit 3), as a machine might
    fake = tmp_path / "python"
    fake.write_text(
        f'#!/bin/sh\ncase "$*" in *"ntp_planner profile"*) echo boom >&2; exit 3;; esac\nexec {sys.executable} "$@"\n'
    )
    fake.chmod(0o755)
    out = tmp_path / "out"
    done = _run("--device", "cpu", "--out", str(out), PYTHON=str(fake))
    assert done.returncode == 1
    assert "== profile FAILED (exit 3)" in done.stderr and "boom" in done.stderr
    assert "== plan: skipped (it needs step profile)" in done.stderr
    rows = [line.split("\t") for line in (out / "steps.tsv").read_text().splitlines()[1:]]
    assert [(r[0], r[2]) for r in rows] == [("profile", "3"), ("plan", "-1"), ("validate", "-1"), ("blocks", "-1")]
    data = json.loads((out / "gpu_check.json").read_text())
    assert not data["passed"] and "profile" not in data and "A STEP FAILED" in done.stdout


def test_the_gpu_slug_and_byte_sizes():
    check = _load_check()
    ran = doctest.testmod(check)  # pytest skips benchmarks/: gpu_slug's and read_json's examples
    assert ran.failed == 0 and ran.attempted >= 4
    assert check.gpu_slug({"device": {"gpu": "H200"}}) == "h200"
    assert check.gpu_slug({"device": {"gpu": "cuda-nvidia-l40s"}}) == "nvidia-l40s"
    assert (check.nbytes(3 * 2**30), check.nbytes(1.5 * 2**20), check.nbytes(512)) == ("3.00 GiB", "1.50 MiB",
                                                                                      "0.5 KiB")  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--device", "tpu"], "error: --device must be cuda or cpu, not 'tpu'; usage:"),
        (["--bogus"], "error: unknown argument '--bogus'; usage:"),
        (["--out"], "error: --out needs a value; usage:"),
    ],
)
def test_bad_arguments_exit_2_in_one_line(args, message):
    done = _run(*args)
    assert done.returncode == 2 and done.stderr.startswith(message) and done.stderr.count("\n") == 1


def test_cuda_without_a_cuda_torch_says_so(tmp_path):
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    done = _run("--out", str(tmp_path))  # $PYTHON's torch sees no GPU, nor any other Python's here
    assert done.returncode == 2
    assert "no Python here can run the cuda check" in done.stderr
    assert f"{sys.executable}: torch {torch.__version__}, CUDA build {torch.version.cuda}, torch.cuda UNAVAILABLE" in (
        done.stderr
    )
    assert not list(tmp_path.iterdir())  # nothing measured, nothing written
