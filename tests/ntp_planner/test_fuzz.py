"""Property-based fuzzing of every user-facing input: model, cluster and plan files, numeric
options, output paths. Whatever hypothesis draws, a command either succeeds (exit 0) or says
what is wrong in one line on stderr and exits 2: never a traceback, never an "internal error"
(exit 1), never a hang (each case runs under an alarm), never a partial or temporary file left
behind. The draws are derandomized, so a failure reproduces in CI and here.
"""

from __future__ import annotations

import io
import json
import math
import os
import signal
import sys
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from ntp_planner.cli import app, main

CASE_LIMIT_S = 20  # one command on 2 cores: `ntp plan` for 405B takes about 1 s
FUZZ = settings(
    max_examples=50,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
SMALL = ["-m", "llama3-8b", "-c", "dgx-h100"]

# numbers a hostile or careless user types: zero, negatives, huge, non-finite, fractional
numbers = st.one_of(
    st.integers(min_value=-(10**31), max_value=10**31),
    st.sampled_from([0, -1, 1, 7, 10**9, 10**30, 2**63]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["nan", "inf", "-inf", "1e308", "1e-320", "", " ", "abc", "0x10"]),
)


@contextmanager
def alarm(seconds: int):
    """Fail the case instead of hanging the suite."""

    def fire(signum, frame):
        raise TimeoutError(f"a command ran past {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def run(args: list) -> tuple[int, str, str]:
    """``ntp args`` through the real entry point (usage errors included), in this process:
    (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    argv = sys.argv
    sys.argv = ["ntp", *map(str, args)]
    try:
        with redirect_stdout(out), redirect_stderr(err), alarm(CASE_LIMIT_S):
            try:
                main()
                code = 0
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    finally:
        sys.argv = argv
    return code, out.getvalue(), err.getvalue()


def check(args: list, folder: Path | None = None) -> None:
    """Run ``ntp args``; assert exit 0, or exit 2 (bad input) or 3 (no layout fits) with one
    `error:` line and no traceback; and no temporary or partial file left in ``folder``."""
    before = set(folder.iterdir()) if folder else set()
    code, out, err = run(args)
    assert "Traceback" not in out + err, (args, (out + err)[-2000:])
    assert code in (0, 2, 3), (args, code, (out + err)[-2000:])
    if code in (2, 3):
        err = err.strip()
        assert err.startswith("error: ") and len(err.splitlines()) == 1, (args, err[-2000:])
    if folder:
        new = set(folder.iterdir()) - before
        assert not [p for p in new if p.name.startswith(".")], (args, new)  # temp files of atomic writes


def _json_value():
    return st.one_of(
        numbers.filter(lambda x: not isinstance(x, str) or x),
        st.none(),
        st.booleans(),
        st.text(max_size=8),
        st.lists(st.integers(-3, 3), max_size=3),
        st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
    )


LLAMA_CONFIG = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
}


def _dump(value) -> str:
    """JSON with non-finite floats written as the bare words json allows (NaN, Infinity)."""
    return json.dumps(value, allow_nan=True)


@FUZZ
@given(key=st.sampled_from(sorted(LLAMA_CONFIG)), value=_json_value())
def test_model_config_files(tmp_path_factory, key, value):
    folder = tmp_path_factory.mktemp("model")
    config = {**LLAMA_CONFIG, key: value}
    (folder / "config.json").write_text(_dump(config))
    check(["estimate", "-m", str(folder / "config.json"), "-c", "dgx-h100", "-n", 8, "--tp", 8], folder)


CLUSTER = {
    "name": "my-h100",
    "gpu": "H100-SXM",
    "domain_size": 8,
    "gpus_per_node": 8,
    "nvlink_bw_bytes_per_s": 450e9,
    "nvlink_latency_s": 1e-6,
    "scaleout_bw_bytes_per_s": 50e9,
    "scaleout_latency_s": 5e-6,
}


@FUZZ
@given(key=st.sampled_from(sorted(CLUSTER)), value=_json_value())
def test_cluster_files(tmp_path_factory, key, value):
    folder = tmp_path_factory.mktemp("cluster")
    (folder / "cluster.json").write_text(_dump({**CLUSTER, key: value}))
    check(["plan", "-m", "llama3-8b", "-c", str(folder / "cluster.json"), "-n", 16, "--uniform"], folder)


@FUZZ
@given(
    option=st.sampled_from(
        ["--gpus", "--tp", "--pp", "--cp", "--dp", "--ep", "--vpp", "--micro-batch", "--seq-len", "--global-batch"]
    ),
    value=numbers,
)
def test_estimate_numbers(option, value):
    args = ["estimate", *SMALL, "-n", 16, "--seq-len", 4096, "--global-batch", 64]
    check([*args, option, value] if option not in args else _replace(args, option, value))


@FUZZ
@given(option=st.sampled_from(["--gpus", "--seq-len", "--global-batch", "--headroom", "--top"]), value=numbers)
def test_plan_numbers(option, value):
    args = ["plan", *SMALL, "-n", 16, "--seq-len", 4096, "--global-batch", 64, "--uniform"]
    check(_replace(args, option, value) if option in args else [*args, option, value])


def _replace(args: list, option: str, value) -> list:
    i = args.index(option)
    return [*args[: i + 1], value, *args[i + 2 :]]


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    runner = CliRunner()
    args = ["estimate", *SMALL, "-n", 64, "--tp", 8, "--pp", 2, "--seq-len", 4096, "--global-batch", 64]
    assert runner.invoke(app, [str(a) for a in [*args, "-o", path]]).exit_code == 0
    return path


def _paths(value, prefix=()):
    """Every (path, leaf) of a JSON value."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*prefix, i))
    else:
        yield prefix, value


def _set(doc, path, value):
    for key in path[:-1]:
        doc = doc[key]
    doc[path[-1]] = value


@FUZZ
@given(data=st.data(), command=st.sampled_from(["explain", "export", "replan", "simulate"]))
def test_hand_edited_plans(plan_file, tmp_path_factory, data, command):
    doc = json.loads(plan_file.read_text())
    leaves = [p for p, _ in _paths(doc) if p]
    path = data.draw(st.sampled_from(leaves[:400]), label="field")
    _set(doc, path, data.draw(_json_value(), label="value"))
    folder = tmp_path_factory.mktemp("edited")
    edited = folder / "plan.json"
    edited.write_text(_dump(doc))
    args = {
        "explain": ["explain", edited],
        "export": ["export", edited, "--format", "megatron", "-o", folder / "out"],
        "replan": ["replan", edited, "--failed", "3"],
        "simulate": ["simulate", edited, "--days", 1, "--trials", 2, "--strategies", "restart,ntp"],
    }[command]
    check(args, folder)


@FUZZ
@given(
    option=st.sampled_from(
        ["--days", "--trials", "--failure-rate", "--hw-share", "--checkpoint-write-s", "--restart-s",
         "--weibull-shape", "--straggler-rate", "--lemon-fraction", "--lemon-factor", "--spares"]
    ),
    value=numbers,
)  # fmt: skip
def test_simulate_numbers(plan_file, option, value):
    check(["simulate", plan_file, "--days", 2, "--trials", 3, option, value])


@FUZZ
@given(
    option=st.sampled_from(["--failed-fraction", "--max-power", "--spares", "--seed", "--failed"]),
    value=numbers,
)
def test_replan_numbers(plan_file, option, value):
    check(
        ["replan", plan_file, option, value] + ([] if option in ("--failed", "--failed-fraction") else ["--failed", 3])
    )


@FUZZ
@given(option=st.sampled_from(["--fractions", "--samples", "--max-power", "--seed"]), value=numbers)
def test_sweep_numbers(plan_file, option, value):
    base = ["sweep", plan_file, "--fractions", "0.001", "--samples", 3]
    check(_replace(base, option, value) if option in base else [*base, option, value])


@pytest.mark.parametrize("target", ["", ".", "missing/plan.json", "/proc/plan.json", "folder"])
def test_unwritable_outputs_leave_nothing_behind(tmp_path, monkeypatch, target):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder").mkdir()
    check(["estimate", *SMALL, "-n", 8, "--tp", 8, "-o", target], tmp_path)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_a_deep_json_file_is_refused_in_one_line(tmp_path):
    deep = "[" * 200_000 + "]" * 200_000
    (tmp_path / "config.json").write_text(deep)
    check(["estimate", "-m", tmp_path / "config.json", "-c", "dgx-h100", "-n", 8])


def test_non_finite_numbers_are_never_printed(plan_file):
    # a plan's own figures are finite: `explain` of the valid plan prints no nan or inf
    result = CliRunner().invoke(app, ["explain", str(plan_file), "--json"])
    assert result.exit_code == 0
    assert all(math.isfinite(v) for _, v in _paths(json.loads(result.stdout)) if isinstance(v, float))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["sweep", "{plan}", "--samples", 2, "--plot", "missing/loss.png"], "folder missing does not exist"),
        (["sweep", "{plan}", "--samples", 2, "--plot", "."], "it is a folder"),
        (
            ["simulate", "{plan}", "--days", 1, "--trials", 2, "--plot", "/proc/plots"],
            "no file can be made in folder /proc",
        ),
    ],
)
def test_plot_paths_are_checked_before_the_work(plan_file, tmp_path, monkeypatch, args, message):
    monkeypatch.chdir(tmp_path)
    code, _, err = run([str(a).replace("{plan}", str(plan_file)) for a in args])
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())  # no partial PNG, no temp file


@pytest.fixture(scope="module")
def profile_files(tmp_path_factory) -> tuple[Path, Path]:
    """A hand-written H100 profile with a block, a GEMM, passes and collective fits, and three
    runs recorded against it."""
    from cost_models.profile import CollectiveFit, GemmTime, PassTime, profile_json
    from tests.cost_models.test_profile import profile
    from tests.ntp_planner.test_profile_validate import _records

    folder = tmp_path_factory.mktemp("profile")
    fit = CollectiveFit(op="all_reduce", group_size=2, alpha_s=1e-5, bw_bytes_per_s=1e11, max_rel_residual=0.1)
    p = profile(
        sizes=(1, 2),
        fits=[fit],
        gemms=(GemmTime(m=8, n=8, k=8, time_s=1e-6, flops_per_s=1024 / 1e-6),),
        passes=(PassTime(op="copy", bytes=1e6, time_s=1e-4, bytes_per_s=1e10),),
    )
    (folder / "p.json").write_text(profile_json(p))
    (folder / "runs.jsonl").write_text(_records(p))
    return folder / "p.json", folder / "runs.jsonl"


@FUZZ
@given(data=st.data(), command=st.sampled_from(["estimate", "calibrate"]))
def test_hand_edited_profiles(profile_files, tmp_path_factory, data, command):
    source, runs = profile_files
    doc = json.loads(source.read_text())
    leaves = [p for p, _ in _paths(doc) if p]
    path = data.draw(st.sampled_from(leaves), label="field")
    _set(doc, path, data.draw(_json_value(), label="value"))
    folder = tmp_path_factory.mktemp("edited")
    edited = folder / "p.json"
    edited.write_text(_dump(doc))
    args = {
        "estimate": [
            "estimate",
            *SMALL,
            "-n",
            8,
            "--tp",
            2,
            "--seq-len",
            2048,
            "--global-batch",
            16,
            "--profile",
            edited,
        ],
        "calibrate": ["calibrate", runs, "--profile", edited, "-o", folder / "out.json"],
    }[command]
    check(args, folder)


@FUZZ
@given(data=st.data())
def test_hand_edited_runs_files(profile_files, tmp_path_factory, data):
    source, runs = profile_files
    lines = runs.read_text().splitlines()
    doc = json.loads(lines[0])
    key = data.draw(st.sampled_from(sorted(doc)), label="field")
    doc[key] = data.draw(_json_value(), label="value")
    folder = tmp_path_factory.mktemp("runs")
    edited = folder / "runs.jsonl"
    edited.write_text("\n".join([_dump(doc), *lines[1:]]) + "\n")
    check(["calibrate", edited, "--profile", source, "-o", folder / "out.json"], folder)


# ---- ntp validate: its options and re-plan files, refused before any process starts ----------


@pytest.fixture
def no_launch(monkeypatch):
    """``ntp validate`` up to the launch: the shrunk run is built and checked, then, instead of
    starting processes, the arguments the ranks would take are tried the way the ranks take
    them (the collective timeout, the seeds) and the command ends as a torchrun rank other than
    0 does (exit 0, nothing printed)."""
    from datetime import timedelta

    import ntp_planner.cli.validate as export_cli
    from ntp_planner.executor.train.launch import STARTUP_S

    torch = pytest.importorskip("torch")

    def ranks_would_take(shrunk, backend, timeout, *rest):
        timedelta(seconds=2 * timeout + STARTUP_S)  # run_rank's process-group timeout
        torch.Generator().manual_seed(shrunk.spec.seed)  # the weights (Reference) and the batch (seed + 1)
        torch.Generator().manual_seed(shrunk.spec.seed + 1)
        assert all(r.micro_batches <= 64 for r in shrunk.spec.replicas), "a run far longer than the plan's"

    monkeypatch.setattr(export_cli, "_run", ranks_would_take)


@pytest.fixture(scope="module")
def replan_files(tmp_path_factory) -> tuple[Path, Path]:
    """A TP-4 plan (2 stages, 2 replicas, 32 micro-batches of 1) and its NTP re-plan after GPU 3
    failed: replica 1 degraded to TP 3 with 24 sequences."""
    folder = tmp_path_factory.mktemp("replan")
    plan, replan = folder / "plan.json", folder / "replan.json"
    code, _, err = run(["estimate", *SMALL, "-n", 16, "--tp", 4, "--pp", 2, "--seq-len", 4096, "--global-batch", 64,
                        "-o", plan])  # fmt: skip
    assert code == 0, err
    code, _, err = run(["replan", plan, "--failed", 3, "-o", replan])
    assert code == 0, err
    return plan, replan


@FUZZ
@given(data=st.data(), command=st.sampled_from(["validate", "export"]))
def test_hand_edited_replans(replan_files, no_launch, tmp_path_factory, data, command):
    plan, source = replan_files
    doc = json.loads(source.read_text())
    leaves = [p for p, _ in _paths(doc) if p] + [("replicas", 1, "stage_tp"), ("rank_to_gpu",)]
    path = data.draw(st.sampled_from(leaves), label="field")
    value = data.draw(st.one_of(_json_value(), st.lists(st.integers(-1, 9), max_size=3)), label="value")
    _set(doc, path, value)
    folder = tmp_path_factory.mktemp("edited")
    edited = folder / "replan.json"
    edited.write_text(_dump(doc))
    args = {
        "validate": ["validate", plan, "--replan", edited, "--nproc", 7, "--steps", 1],
        "export": ["export", plan, "--replan", edited, "-o", folder / "out"],
    }[command]
    check(args, folder)


@pytest.mark.parametrize(
    ("where", "value", "message"),
    [
        # an IndexError (exit 1) before: the run looked the replica up in the plan's grid
        (("replicas", 1, "replica"), 5, "replicas are numbered 0, 5; they must be numbered 0, 1, 2, ... in order"),
        # a ZeroDivisionError (exit 1): a stage of a running replica on no GPU
        (("replicas", 1, "stage_tp"), [0, 3], "replica 1 is degraded but runs stage_tp [0, 3]"),
        # an IndexError (exit 1): more TP ranks than the plan's TP group has
        (("replicas", 1, "stage_tp"), [5, 5], "replica 1 runs stage_tp [5, 5] but the plan has 2 stages of TP 4"),
        # ran 62,500,000 micro-batches: the run never ended
        (("replicas", 1, "local_batch"), 10**9, "replica 1 runs local_batch 1e+09; it must be at most the plan's"),
        # ran as if degraded: a healthy replica runs the plan's TP
        (("replicas", 1, "status"), "healthy", "replica 1 is healthy but runs stage_tp [3, 3]"),
        # ran a degraded replica with no sequence as one of a micro-batch
        (("replicas", 1, "local_batch"), 0, "replica 1 is degraded but runs stage_tp [3, 3] with local_batch 0"),
        # `export` said "min() arg is an empty sequence"
        (("replicas", 1, "stage_tp"), [], "replica 1 gives 2 power multipliers for 0 stages"),
        (("rank_to_gpu", 0), 99, "rank_to_gpu must name distinct GPUs of the plan's cluster, ids 0..15"),
        (("replicas", 1, "power", 0), float("nan"), "replicas.1.power.0: Input should be a finite number"),
    ],
)
@pytest.mark.parametrize("command", ["validate", "export"])
def test_a_re_plan_that_cannot_come_from_the_plan_is_refused(
    replan_files, no_launch, tmp_path, where, value, message, command
):
    plan, source = replan_files
    doc = json.loads(source.read_text())
    _set(doc, where, value)
    edited = tmp_path / "replan.json"
    edited.write_text(_dump(doc))
    args = ["validate", plan, "--nproc", 7] if command == "validate" else ["export", plan, "-o", tmp_path / "out"]
    code, _, err = run([*args, "--replan", edited])
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_a_re_plan_that_is_not_a_file_is_refused_before_it_is_read(replan_files, tmp_path):
    plan, _ = replan_files
    pipe = tmp_path / "replan.json"
    os.mkfifo(pipe)  # before, read as a file: a pipe with no writer blocked for ever, /dev/zero filled memory
    code, _, err = run(["validate", plan, "--replan", pipe, "--nproc", 7])
    assert code == 2 and "it is not a regular file" in err


@FUZZ
@given(option=st.sampled_from(["--nproc", "--steps", "--timeout", "--tolerance", "--seed", "--seq-len"]), value=numbers)
def test_validate_numbers(replan_files, no_launch, option, value):
    plan, _ = replan_files
    check(["validate", plan, "--nproc", 4, "--steps", 1, option, value])


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        # each started the processes, which failed (exit 1) or never ended
        ("--seed", 2**64, "--seed 18446744073709551616: Input should be less than or equal to 9223372036854775806"),
        ("--seed", -1, "--seed -1: Input should be greater than or equal to 0"),
        ("--timeout", "inf", "--timeout inf: Input should be a finite number"),
        ("--timeout", "1e300", "--timeout 1e300: Input should be less than or equal to 86400"),
        ("--steps", 10**9, "--steps 1000000000: Input should be less than or equal to 1000"),
    ],
)
def test_validate_numbers_the_ranks_cannot_take_are_refused(replan_files, no_launch, option, value, message):
    plan, _ = replan_files
    code, _, err = run(["validate", plan, "--nproc", 4, option, value])
    assert code == 2 and message in err, err


def test_a_re_plan_onto_idle_in_domain_gpus_is_accepted(tmp_path):
    # 64 of each 72-GPU domain used: GPU 0's ranks move to idle GPU 128 of its domain (ids past the job's)
    plan, replan = tmp_path / "plan.json", tmp_path / "replan.json"
    args = ["-m", "llama3-8b", "-c", "gb200-nvl72", "-n", 128, "--gpus-per-domain", 64, "--tp", 8, "--pp", 2]
    assert run(["estimate", *args, "--seq-len", 4096, "--global-batch", 64, "-o", plan])[0] == 0
    assert run(["replan", plan, "--failed", 0, "-o", replan])[0] == 0
    assert 128 in json.loads(replan.read_text())["rank_to_gpu"]
    code, _, err = run(["export", plan, "--replan", replan, "-o", tmp_path / "out"])
    assert code == 0, err


@pytest.mark.parametrize(
    ("kind", "message"), [("pipe", "--record {runs}: it is a FIFO"), ("binary", "runs file {runs}")]
)
def test_a_runs_file_that_cannot_be_appended_to_is_refused_before_the_run(replan_files, tmp_path, kind, message):
    # before, it was read after the run (whose minutes were lost); the profile is not even read
    plan, _ = replan_files
    runs = tmp_path / "runs.jsonl"
    os.mkfifo(runs) if kind == "pipe" else runs.write_bytes(b"\xff\xfe")
    code, _, err = run(["validate", plan, "--nproc", 4, "--profile", tmp_path / "none.json", "--record", runs])
    assert code == 2 and message.format(runs=runs) in err, err


@pytest.fixture(scope="module")
def moe_plan_file(tmp_path_factory) -> Path:
    """Mixtral on 64 GPUs: tp 2, pp 4, ep 8, ZeRO-1."""
    path = tmp_path_factory.mktemp("moe") / "plan.json"
    args = ["-m", "mixtral-8x7b", "-c", "dgx-h100", "-n", 64, "--tp", 2, "--pp", 4, "--ep", 8]
    assert run(["estimate", *args, "--seq-len", 4096, "--global-batch", 64, "-o", path])[0] == 0
    return path


EXECUTOR_FIELDS = [
    ("layout", k) for k in ["vpp", "ep", "zero", "reshard_after_forward", "recompute", "chunk_layers", "cp",
                            "sequence_parallel", "micro_batch", "layer_tp"]
] + [
    ("model", k) for k in ["num_experts", "moe_top_k", "moe_ffn_hidden_size", "moe_layer_freq", "family",
                           "moe_first_dense_layers", "moe_shared_ffn_hidden_size", "tie_embeddings", "dropout",
                           "gated_mlp", "bias", "norm", "position", "num_heads", "num_kv_heads", "vocab_size"]
] + [("pipeline", 0, "tp"), ("pipeline", 1, "layers"), ("pipeline",)]  # fmt: skip


@FUZZ
@given(data=st.data(), nproc=st.integers(1, 4))
def test_hand_edited_plans_for_validate(moe_plan_file, no_launch, tmp_path_factory, data, nproc):
    doc = json.loads(moe_plan_file.read_text())
    path = data.draw(st.sampled_from(EXECUTOR_FIELDS), label="field")
    _set(doc, path, data.draw(st.one_of(_json_value(), st.sampled_from(["gpt", "nemotron", "full"])), label="value"))
    _rehash(doc)  # the executor's own checks, not the hash, are what this fuzzes
    folder = tmp_path_factory.mktemp("edited")
    (folder / "plan.json").write_text(_dump(doc))
    check(["validate", folder / "plan.json", "--nproc", nproc, "--steps", 1], folder)


def _rehash(doc: dict) -> None:
    """Give an edited plan the hash of its edited inputs, as a plan made for them carries (an
    edited plan is refused before the executor sees it); inputs that do not validate keep the old
    hash, and are refused on load all the same."""
    from pydantic import ValidationError

    from cost_models import ModelSpec, ParallelLayout, TrainingSpec
    from ntp_planner.plan import ClusterInputs, inputs_hash

    parts = {"model": ModelSpec, "training": TrainingSpec, "cluster": ClusterInputs, "layout": ParallelLayout}
    try:
        doc["inputs_hash"] = inputs_hash(*(t.model_validate(doc[k]) for k, t in parts.items()))
    except (ValidationError, ValueError, TypeError, KeyError):
        pass


@pytest.mark.parametrize(
    ("field", "value", "what"), [("gated_mlp", False, "a gelu MLP"), ("bias", True, "a swiglu MLP and linear biases")]
)
def test_a_moe_plan_the_executor_cannot_build_says_why(moe_plan_file, no_launch, tmp_path, field, value, what):
    # before: "MoE layers run SwiGLU experts without biases; this config has a gelu MLP", the executor's words
    doc = json.loads(moe_plan_file.read_text())
    doc["model"][field] = value
    _rehash(doc)
    (tmp_path / "plan.json").write_text(_dump(doc))
    code, _, err = run(["validate", tmp_path / "plan.json", "--nproc", 4])
    assert code == 2 and f"the plan's model mixtral-8x7b has MoE layers with {what}" in err, err
    assert "ntp validate runs experts as SwiGLU without biases" in err
