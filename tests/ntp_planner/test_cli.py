"""The CLI through CliRunner: outputs, the frozen surface, and one-sentence errors with exit 2."""

import json
import subprocess
import sys

import pytest
import typer
from typer.testing import CliRunner

from cost_models import MODELS
from ntp_planner.cli import app
from topologies import CLUSTERS

runner = CliRunner()
SMALL = ["--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "32", "--seq-len", "4096", "--global-batch", "64"]


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


_ENTRY = typer.Typer()


@_ENTRY.command()
def _entry() -> None:
    from ntp_planner.cli import main

    main()


def ntp(*args):
    """Run ``args`` through the ``ntp`` entry point, as a user's shell does: usage errors typer
    finds (a value past an option's min/max) come out in main's one line, not click's usage box."""
    from unittest import mock

    with mock.patch.object(sys, "argv", ["ntp", *map(str, args)]):
        return runner.invoke(_ENTRY, [])


def test_cli_surface_is_frozen():
    """Renaming or dropping a command or option breaks users' scripts: change this list on purpose."""
    commands = typer.main.get_command(app).commands
    surface = {name: sorted(p.opts[0] for p in cmd.params) for name, cmd in commands.items()}
    assert surface == {
        "models": ["--json"],
        "clusters": ["--json"],
        "plan": sorted(
            [
                "--model",
                "--cluster",
                "--gpus",
                "--gpus-per-domain",
                "--seq-len",
                "--global-batch",
                "--dtype",
                "--fp8-recipe",
                "--fp8-params",
                "--grad-reduce",
                "--precision-aware-optimizer",
                "--fused-cross-entropy",
                "--attention-kernel",
                "--flash-attention",
                "--distributed-optimizer",
                "--headroom",
                "--max-zero",
                "--per-layer",
                "--objective",
                "--strategy",
                "--seed",
                "--top",
                "--profile",
                "--runtime",
                "--output",
                "--json",
            ]
        ),
        "estimate": sorted(
            [
                "--model",
                "--cluster",
                "--gpus",
                "--gpus-per-domain",
                "--tp",
                "--pp",
                "--dp",
                "--cp",
                "--ep",
                "--etp",
                "--moe-dispatcher",
                "--moe-overlap",
                "--moe-flex-backend",
                "--recompute-modules",
                "--moe-capacity-factor",
                "--moe-pad-to-capacity",
                "--cuda-graphs",
                "--micro-batch",
                "--vpp",
                "--pp-layers",
                "--pp-layout",
                "--account-for-embedding",
                "--account-for-loss",
                "--recompute",
                "--sequence-parallel",
                "--distributed-optimizer",
                "--zero",
                "--reshard-after-forward",
                "--overlap-grad-reduce",
                "--overlap-p2p",
                "--p2p-scatter-gather",
                "--tp-comm-overlap",
                "--seq-len",
                "--global-batch",
                "--dtype",
                "--fp8-recipe",
                "--fp8-params",
                "--grad-reduce",
                "--precision-aware-optimizer",
                "--fused-cross-entropy",
                "--attention-kernel",
                "--flash-attention",
                "--profile",
                "--runtime",
                "--output",
                "--json",
            ]
        ),
        "explain": ["--json", "--profile", "plan_file"],
        "replan": sorted(
            [
                "plan_file",
                "--failed",
                "--failed-fraction",
                "--seed",
                "--blast",
                "--policy",
                "--spares",
                "--fallback",
                "--batch",
                "--max-power",
                "--output",
                "--json",
            ]
        ),
        "sweep": sorted(
            [
                "plan_file",
                "--fractions",
                "--samples",
                "--policies",
                "--seed",
                "--blast",
                "--spares",
                "--fallback",
                "--batch",
                "--max-power",
                "--plot",
                "--json",
            ]
        ),
        "export": sorted(["plan_file", "--format", "--output", "--replan", "--data-path", "--save-dir", "--json"]),
        "validate": sorted(
            [
                "plan_file",
                "--replan",
                "--nproc",
                "--backend",
                "--steps",
                "--timeout",
                "--tolerance",
                "--seed",
                "--seq-len",
                "--profile",
                "--record",
                "--inject-fault",
                "--json",
                "--dtype",
                "--fail",
                "--repair",
                "--policy",
                "--spares",
                "--checkpoint-every",
                "--checkpoint-dir",
                "--full-size",
                "--join",
            ]
        ),
        "calibrate": sorted(["runs_file", "--profile", "--output", "--json"]),
        "capacity": sorted(
            [
                "--model",
                "--tokens",
                "--deadline-days",
                "--confidence",
                "--clusters",
                "--gpus",
                "--spares",
                "--strategies",
                "--gpu-hour-cost",
                "--seq-len",
                "--global-batch",
                "--trials",
                "--seed",
                "--plot",
                "--json",
            ]
        ),
        "profile": sorted(
            [
                "--device",
                "--backend",
                "--nproc",
                "--model",
                "--dtype",
                "--seq-len",
                "--micro-batches",
                "--tp",
                "--quick",
                "--output",
                "--cluster-out",
                "--json",
                "--seed",
            ]
        ),
        "simulate": sorted(
            [
                "plan_file",
                "--days",
                "--trials",
                "--strategies",
                "--failure-rate",
                "--hw-repair-days",
                "--sw-repair-hours",
                "--hw-share",
                "--checkpoint-interval",
                "--checkpoint-write-s",
                "--restart-s",
                "--recovery-from",
                "--spares",
                "--start",
                "--batch",
                "--failure-dist",
                "--weibull-shape",
                "--hw-blast",
                "--sw-blast",
                "--straggler-rate",
                "--straggler-hours",
                "--straggler-slowdown",
                "--down-threshold",
                "--lemon-fraction",
                "--lemon-factor",
                "--seed",
                "--plot",
                "--trace",
                "--trace-out",
                "--trace-trial",
                "--json",
            ]
        ),
    }


@pytest.mark.parametrize(
    "command",
    [
        "models",
        "clusters",
        "plan",
        "estimate",
        "explain",
        "replan",
        "sweep",
        "simulate",
        "capacity",
        "export",
        "validate",
        "profile",
    ],
)
def test_every_command_has_help_with_an_example(command):
    result = run(command, "--help")
    assert result.exit_code == 0
    assert "Example: ntp " + command in " ".join(result.output.split())


def test_models_and_clusters_json():
    models = json.loads(run("models", "--json").stdout)
    assert [m["name"] for m in models] == list(MODELS)
    assert next(m for m in models if m["name"] == "gpt3-175b")["num_params"] == MODELS["gpt3-175b"].num_params
    clusters = json.loads(run("clusters", "--json").stdout)
    assert {c["name"] for c in clusters} == set(CLUSTERS)
    table = runner.invoke(app, ["models"], env={"COLUMNS": "200"}).stdout  # the whole table, whatever the worker
    assert "llama3.1-405b" in table and "405.9B" in table


def test_plan_then_explain(tmp_path):
    out = tmp_path / "plan.json"
    result = run("plan", *SMALL, "--top", "3", "-o", out)
    assert result.exit_code == 0, result.output
    saved = json.loads(out.read_text())
    assert f"layout: {_describe(saved['layout'])}" in result.stdout
    as_json = json.loads(run("plan", *SMALL, "--top", "3", "--json").stdout)
    assert as_json["layout"] == saved["layout"] and as_json["predicted"] == saved["predicted"]
    explained = json.loads(run("explain", out, "--json").stdout)
    assert explained["step_time_s"] == saved["predicted"]["step_time_s"]
    assert len(explained["runners_up"]) == 2
    assert all(r["delta_s"] >= 0 for r in explained["runners_up"])
    text = run("explain", out).stdout
    assert "Where the time goes" in text and "Runners-up" in text
    assert "NVLink domains:" not in result.stdout + text  # whole domains go unmentioned


def _describe(layout):
    from cost_models import ParallelLayout

    return ParallelLayout(**layout).describe()


def test_estimate_json_and_saved_plan(tmp_path):
    out = tmp_path / "mine.json"
    result = run("estimate", *SMALL, "--tp", 4, "--pp", 2, "--sequence-parallel", "--json", "-o", out)
    assert result.exit_code == 0, result.output
    cost = json.loads(result.stdout)
    plan = json.loads(out.read_text())
    assert cost["step_time_s"] == plan["predicted"]["step_time_s"] > 0
    assert plan["layout"]["dp"] == 4 and plan["source"] == "user"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["plan", "--model", "llama3-7b", "--cluster", "dgx-h100", "--gpus", 8],
            "unknown model 'llama3-7b': did you mean 'llama3-70b', 'llama3-8b'",
        ),
        (
            ["plan", "--model", "llama3-8b", "--cluster", "dgx-h1000", "--gpus", 8],
            "unknown cluster 'dgx-h1000': did you mean 'dgx-h100'",
        ),
        (
            ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", 12],
            "12 GPUs is not a multiple of dgx-h100's host size 8 (12 % 8 = 4); use 8 or 16",
        ),
        (
            ["plan", "-m", "llama3-8b", "-c", "gb200-nvl72", "-n", 6],
            "6 GPUs is not a multiple of gb200-nvl72's host size 4 (6 % 4 = 2); use 4 or 8",
        ),
        (
            ["plan", "-m", "llama3-8b", "-c", "gb200-nvl72", "-n", 128, "--gpus-per-domain", 80],
            "80 GPUs per domain is more than gb200-nvl72's NVLink domain size 72; use 72 or fewer",
        ),
        (
            ["estimate", "-m", "llama3-8b", "-c", "gb200-nvl72", "-n", 128, "--gpus-per-domain", 66],
            "66 GPUs per domain is not a multiple of gb200-nvl72's host size 4 (66 % 4 = 2); use 64 or 68",
        ),
        (["estimate", *SMALL, "--tp", 8, "--pp", 2, "--dp", 4], "tp(8) * cp(1) * dp(4) * pp(2) = 64 != GPUs(32)"),
        (
            [
                "estimate",
                "--model",
                "gpt3-175b",
                "--cluster",
                "dgx-h100",
                "--gpus",
                48,
                "--tp",
                8,
                "--pp",
                6,
                "--global-batch",
                64,
                "--seq-len",
                2048,
            ],
            None,
        ),
        (
            [
                "estimate",
                "--model",
                "megatron-1.7b",
                "--cluster",
                "dgx-h100",
                "--gpus",
                16,
                "--tp",
                16,
                "--global-batch",
                16,
                "--seq-len",
                2048,
            ],
            "tp(16) must divide the NVLink domain size (8)",
        ),
        (
            [
                "estimate",
                "--model",
                "megatron-145.6b",
                "--cluster",
                "gb200-nvl72",
                "--gpus",
                72,
                "--tp",
                36,
                "--global-batch",
                16,
                "--seq-len",
                2048,
            ],
            "heads(96) % tp(36) = 24; tp must divide the heads",
        ),
        (
            ["estimate", *SMALL, "--pp", 2, "--pp-layers", "16,x"],
            "--pp-layers '16,x' must be comma-separated whole numbers",
        ),
        (["plan", "--model", "llama3.1-405b", "--cluster", "dgx-h100", "--gpus", 8, "--global-batch", 8], "GiB short"),
        (
            ["plan", *SMALL, "--dtype", "fp8", "--cluster", "dgx-a100"],
            "A100-SXM4-80GB (ampere) has no fp8 tensor cores",
        ),
        (["plan", *SMALL, "--headroom", "1.5"], "--headroom 1.5: Input should be less than or equal to 0.99"),
        (["explain", "no-such-plan.json"], "cannot read plan no-such-plan.json"),
        (["estimate", *SMALL, "--dtype", "mxfp8"], "H100-SXM (hopper) has no mxfp8 tensor cores"),
        (["estimate", *SMALL, "--pp", 2, "--pp-layout", "Et*16|t*16L"], None),
        (["estimate", *SMALL, "--pp", 2, "--pp-layout", "Et*16|t*15L"], "the pipeline chunks hold 31 layers"),
        (["estimate", *SMALL, "--pp", 2, "--pp-layout", "Et*16|t*16"], "must close its last chunk with L"),
        (["estimate", *SMALL, "--pp", 2, "--pp-layout", "Et*16|x*16L"], "has symbols 'x'"),
        (["estimate", *SMALL, "--pp", 2, "--pp-layout", "Et*16|t*9999999L"], "is too long"),
        (["estimate", *SMALL, "--pp", 4, "--pp-layout", "Et*16|t*16L"], "has 2 chunks, not a multiple of pp(4)"),
        (
            ["estimate", *SMALL, "--pp", 2, "--pp-layout", "Et*16|t*16L", "--pp-layers", "16,16"],
            "--pp-layout fixes the whole split; drop --pp-layers",
        ),
        (
            ["estimate", *SMALL, "--pp", 4, "--account-for-embedding", "--account-for-loss"],
            "is not divisible by pp(4) * vpp(1) = 4",
        ),
        (["estimate", *SMALL, "--pp", 2, "--account-for-embedding", "--account-for-loss"], None),
        (["estimate", *SMALL, "--pp", 2, "--vpp", 4, "--pp-layout", "Et*16|t*16L"], "--vpp 4 disagrees with"),
        (["estimate", *SMALL, "--no-distributed-optimizer", "--zero", 2], "--no-distributed-optimizer asks for"),
        (["estimate", *SMALL, "--zero", 1, "--keep-params-after-forward"], "only applies to ZeRO-3"),
        (["estimate", *SMALL, "--zero", 3, "--keep-params-after-forward"], None),
        (["plan", *SMALL, "--strategy", "restart"], "--strategy restart only applies to --objective goodput"),
        (["estimate", *SMALL, "--fp8-params"], "need an fp8 or fp4 format, not bf16"),
        (["estimate", *SMALL, "--tp", 8, "--seq-len", 4100], "is not divisible by tp(8)"),
    ],
)
def test_bad_input_is_one_sentence_and_exit_2(args, message):
    result = ntp(*args)
    if message is None:  # a valid control case in the same table
        assert result.exit_code == 0, result.output
        return
    assert result.exit_code == (3 if message == "GiB short" else 2), result.output  # 3: valid, but nothing fits
    assert "Traceback" not in result.output
    err = result.stderr.strip()
    assert err.startswith("error: ") and message in err and len(err.splitlines()) == 1


NVL72 = ["-m", "llama3-8b", "-c", "gb200-nvl72", "--seq-len", 4096, "--global-batch", 128]


@pytest.mark.parametrize(
    ("args", "per_domain", "max_tp", "used"),
    [
        (["-n", 8], None, 8, "1 x 8"),
        (["-n", 128], None, 8, "1 x 72 + 1 x 56"),
        (["-n", 64], None, 64, "1 x 64"),
        (["-n", 128, "--gpus-per-domain", 64], 64, 64, "2 x 64"),
    ],
)
def test_plan_on_part_of_nvl72_domains(tmp_path, args, per_domain, max_tp, used):
    out = tmp_path / "plan.json"
    result = run("plan", *NVL72, *args, "--uniform", "--top", 20, "-o", out)
    assert result.exit_code == 0, result.output
    assert f"NVLink domains: {used} of 72 GPUs used (TP groups up to {max_tp})" in result.stdout
    saved = json.loads(out.read_text())
    assert saved["cluster"]["gpus_per_domain"] == per_domain
    tps = {saved["layout"]["tp"], *(r["layout"]["tp"] for r in saved["runners_up"])}
    assert max(tps) <= max_tp and max_tp % saved["layout"]["tp"] == 0


def test_estimate_stores_gpus_per_domain(tmp_path):
    out = tmp_path / "plan.json"
    result = run("estimate", *NVL72, "-n", 128, "--gpus-per-domain", 64, "--tp", 8, "-o", out)
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text())["cluster"]["gpus_per_domain"] == 64
    assert "NVLink domains: 2 x 64 of 72 GPUs used (TP groups up to 64)" in result.stdout
    zero = run("estimate", *NVL72, "-n", 128, "--gpus-per-domain", 0)
    assert zero.exit_code == 2 and "Invalid value for '--gpus-per-domain'" in zero.output  # typer's min=1
    four = run("estimate", *NVL72, "-n", 128, "--zero", 4)
    assert four.exit_code == 2 and "Invalid value for '--zero'" in four.output  # typer's max=3


def test_estimate_tp32_on_64_gpus_of_each_domain():
    result = run("estimate", *NVL72, "-n", 128, "--gpus-per-domain", 64, "--tp", 32)
    assert result.exit_code == 0, result.output


def test_malformed_files(tmp_path):
    bad_yaml = tmp_path / "c.yaml"
    bad_yaml.write_text("gpu: [H100")
    result = run("plan", "--model", "llama3-8b", "--cluster", bad_yaml, "--gpus", 8)
    assert result.exit_code == 2 and "is not valid YAML" in result.stderr
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"hidden_size": 4096, "num_hidden_layers": 32}))
    result = run("plan", "--model", cfg, "--cluster", "dgx-h100", "--gpus", 8)
    assert result.exit_code == 2
    assert "lacks required key(s) num_attention_heads, vocab_size, intermediate_size" in result.stderr
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    assert "is not valid JSON" in run("plan", "--model", broken, "--cluster", "dgx-h100", "--gpus", 8).stderr
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"schema_version": 0}))
    result = run("explain", plan)
    assert result.exit_code == 2 and "schema version 0; this ntp reads version 2" in result.stderr


def test_custom_model_file_plans(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(
        json.dumps(
            {
                "hidden_size": 2048,
                "intermediate_size": 8192,
                "num_hidden_layers": 16,
                "num_attention_heads": 16,
                "vocab_size": 32000,
                "hidden_act": "silu",
            }
        )
    )
    result = run(
        "plan", "--model", cfg, "--cluster", "dgx-h100", "--gpus", 16, "--seq-len", 2048, "--global-batch", 32, "--json"
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["model"]["hidden_size"] == 2048


@pytest.mark.parametrize("argv", [["--help"], ["plan", *SMALL], ["estimate", *SMALL, "--tp", "8"]])
def test_commands_never_import_torch(argv):
    code = (
        "import sys\nfrom typer.testing import CliRunner\nfrom ntp_planner.cli import app\n"
        f"r = CliRunner().invoke(app, {argv!r})\nassert r.exit_code == 0, r.output\n"
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("False")


@pytest.mark.parametrize(
    "args, message",
    [
        (["plan", *SMALL, "--seq-len", "-5"], "error: --seq-len -5: Input should be greater than or equal to 1;"),
        (
            ["estimate", *SMALL, "--micro-batch", "0"],
            "error: --micro-batch 0: Input should be greater than or equal to 1;",
        ),
        (["estimate", *SMALL, "--gpus", "0"], "error: --gpus 0: Input should be greater than or equal to 1;"),
        (["simulate", "x.json", "--seed", "-1"], "error: --seed -1: Input should be greater than or equal to 0;"),
        (["replan", "x.json", "--max-power", "nan"], "error: --max-power nan: Input should be a finite number;"),
    ],
)
def test_field_errors_name_the_option_and_the_value(args, message):
    result = ntp(*args)
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1].startswith(message)


def test_estimate_takes_megatrons_pipeline_layouts(tmp_path):
    """--pp-layout, --account-for-* and --pp-layers all land in one chunk description, saved in
    the plan as which layers each virtual chunk of each stage holds."""
    out = tmp_path / "p.json"
    accounted = run("estimate", *SMALL, "--pp", 2, "--account-for-embedding", "--account-for-loss", "-o", out)
    assert accounted.exit_code == 0, accounted.output
    # 32 layers + embedding + loss = 34 slots, 17 per stage: each end stage gives one to its extra
    assert json.loads(out.read_text())["layout"]["chunk_layers"] == [16, 16]
    args = ["estimate", *SMALL, "--tp", 2, "--pp", 2, "--vpp", 2, "--json", "-o", out]
    explicit = run(*args, "--pp-layout", "Et*7|t*8|t*9|t*8L")
    assert explicit.exit_code == 0, explicit.output
    chunks = json.loads(out.read_text())["pipeline"]
    assert [(c["stage"], c["virtual_chunk"], len(c["layers"])) for c in chunks] == [
        (0, 0, 7),
        (1, 0, 8),
        (0, 1, 9),
        (1, 1, 8),
    ]
    assert chunks[0]["layers"][0] == 0 and chunks[2]["layers"] == list(range(15, 24))  # stage 0 holds 0-6, 15-23
    assert chunks[0]["embedding"] and chunks[-1]["loss"] and chunks[0]["tp"] == [2] * 8  # embedding + 7 layers


def test_estimate_defaults_follow_the_frameworks_recipes():
    """Sequence parallelism with TP, the distributed optimizer with DP, and for fp8 gradients
    reduced in bf16 (NeMo's and Megatron-Bridge's recipes): what a user copying a published run
    would leave unsaid."""
    base = ["estimate", *SMALL, "--tp", 2, "--json"]
    plain = json.loads(run(*base).stdout)
    explicit = json.loads(run(*base, "--sequence-parallel", "--zero", 1, "--grad-reduce", "fp32").stdout)
    assert plain["memory_breakdown_bytes"] == explicit["memory_breakdown_bytes"]
    fp8 = json.loads(run(*base, "--dtype", "fp8").stdout)["memory_breakdown_bytes"]
    assert fp8["grads"] == pytest.approx(plain["memory_breakdown_bytes"]["grads"] / 2)  # 2 bytes, not 4
    off = json.loads(run(*base, "--no-sequence-parallel", "--no-distributed-optimizer").stdout)
    assert off["memory_breakdown_bytes"]["optimizer"] > 10 * plain["memory_breakdown_bytes"]["optimizer"]


@pytest.fixture
def small_plan(tmp_path):
    path = tmp_path / "small.json"
    assert run("estimate", *SMALL, "--tp", "8", "-o", str(path)).exit_code == 0
    return str(path)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["simulate", "{plan}", "--days", "inf"], "--days inf: Input should be a finite number"),
        (["simulate", "{plan}", "--days", "1e9"], "--days 1e9: Input should be less than or equal to 1388"),
        (["simulate", "{plan}", "--checkpoint-write-s", "nan"], "--checkpoint-write-s nan: Input should be a finite"),
        (
            ["simulate", "{plan}", "--checkpoint-write-s", "0"],
            "--checkpoint-write-s 0.0: Input should be greater than 0",
        ),
        (["simulate", "{plan}", "--checkpoint-write-s", "1e308"], "--checkpoint-write-s 1e308: Input should be less"),
        (["simulate", "{plan}", "--checkpoint-interval", "inf"], "--checkpoint-interval inf must be auto or minutes"),
        (["simulate", "{plan}", "--failure-rate", "1e-320"], "--failure-rate 1e-320: a rate of 1e-320 per GPU-hour"),
        (["simulate", "{plan}", "--down-threshold", "2"], "--down-threshold 2: Input should be less than or equal"),
        (["simulate", "{plan}", "--spares", "0,2000000"], "--spares 2,000,000 is outside 0..1,000,000"),
        (["replan", "{plan}", "--failed", "3", "--spares", str(2**63)], "--spares 9223372036854775808: Input should"),
        (["replan", "{plan}", "--failed", "3", "--max-power", "1e308"], "--max-power 1e308: Input should be less"),
        (["validate", "{plan}", "--nproc", str(10**30)], "--nproc 1000000000000000000000000000000: Input should"),
        (["simulate", "{plan}", "--strategies", ","], "--strategies ',' lists nothing; give comma-separated names"),
        (
            ["replan", "{plan}", "--failed", "3", "--max-power", "nan"],
            "--max-power nan: Input should be a finite number",
        ),
        (["estimate", *SMALL, "-o", "{folder}"], "it is a folder; give a file name"),
    ],
)
def test_non_finite_values_empty_lists_and_folders_are_refused(args, message, small_plan, tmp_path):
    (tmp_path / "out").mkdir()
    argv = [a.replace("{plan}", small_plan).replace("{folder}", str(tmp_path / "out")) for a in map(str, args)]
    result = ntp(*argv)
    assert result.exit_code == 2, result.output
    err = result.stderr.strip()
    assert err.startswith("error: ") and message in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["estimate", *SMALL, "--zero", "5"], 2, "error: --zero 5: Input should be less than or equal to 3;"),
        (["estimate", *SMALL, "--tp", "0"], 2, "error: --tp 0: Input should be greater than or equal to 1;"),
        (["estimate", "--bogus"], 2, "error: No such option: --bogus"),
        ([], 0, None),
    ],
)
def test_the_entry_point_reports_usage_errors_in_one_line(argv, code, message, monkeypatch, capsys):
    from ntp_planner.cli import main

    monkeypatch.setattr(sys, "argv", ["ntp", *argv])
    with pytest.raises(SystemExit) as stop:
        main()
    assert stop.value.code == code
    out, err = capsys.readouterr()
    if message is None:  # bare `ntp` prints the help
        assert "Usage:" in out and "simulate" in out and err == ""
    else:
        assert err.startswith(message) and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "command",
    [
        ["explain"],
        ["replan", "--failed", "3"],
        ["sweep", "--samples", "1"],
        ["simulate", "--trials", "2", "--days", "1"],
        ["export", "--format", "json", "-o", "{out}"],
        ["validate", "--nproc", "2"],
    ],
)
def test_every_command_refuses_a_plan_edited_after_it_was_predicted(command, small_plan, tmp_path):
    """seq_len edited by hand: the old prediction must not be explained, re-planned, simulated,
    exported or validated as if it were the new one's."""
    data = json.loads(open(small_plan).read())
    data["training"]["seq_len"] = 2048
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(data))
    argv = [command[0], str(edited), *(a.replace("{out}", str(tmp_path / "out")) for a in command[1:])]
    result = ntp(*argv)
    assert result.exit_code == 2, result.output
    err = result.stderr.strip()
    assert err.startswith(f"error: {edited} was edited after it was predicted") and len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_hw_share_0_means_software_failures_only(small_plan):
    """--hw-share's help allows 0 (0<=x<=1); it was refused ("share: greater than 0")."""
    result = ntp("simulate", small_plan, "--trials", "3", "--days", "1", "--hw-share", "0", "--json")
    assert result.exit_code == 0, result.output
    assert "nan" not in result.stdout and json.loads(result.stdout)["ntp"]["goodput"] > 0


def test_a_catalogue_name_wins_over_a_folder_of_that_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "llama3-8b").mkdir()
    assert run("estimate", *SMALL, "--tp", "8").exit_code == 0  # the catalogue's llama3-8b
    result = ntp("estimate", *[a if a != "llama3-8b" else "./llama3-8b" for a in SMALL], "--tp", "8")
    assert result.exit_code == 2 and "cannot read model file llama3-8b: it is a folder" in result.stderr


MOE = ["--model", "mixtral-8x7b", "--cluster", "dgx-h100", "--gpus", "16", "--seq-len", "4096", "--global-batch", "16"]


def test_every_command_shows_total_and_active_parameters(tmp_path):
    """The model's size in each command's --json (exact integers, the ModelSpec properties) and
    table (one line): models, plan, estimate, explain, export, simulate."""
    m, dense = MODELS["mixtral-8x7b"], MODELS["llama3-8b"]
    assert m.params_active < m.params_total  # top-2 of 8 experts: the two counts must differ
    models = {d["name"]: d for d in json.loads(run("models", "--json").stdout)}
    assert all((d["params_total"], d["params_active"]) == (MODELS[n].params_total, MODELS[n].params_active)
               for n, d in models.items())  # fmt: skip
    table = " ".join(run("models").stdout.split())
    assert f"mixtral-8x7b {m.params_total / 1e9:.1f}B {m.params_active / 1e9:.1f}B" in table
    line = f"mixtral-8x7b: {m.params_total / 1e9:.1f}B parameters, {m.params_active / 1e9:.1f}B active per token"
    saved = tmp_path / "moe.json"
    est = run("estimate", *MOE, "--tp", 2, "--ep", 8, "--sequence-parallel", "--json", "-o", saved)
    assert est.exit_code == 0, est.output
    outputs = {"estimate": json.loads(est.stdout)}
    assert line in run("estimate", *MOE, "--tp", 2, "--ep", 8, "--sequence-parallel").stdout
    outputs["explain"] = json.loads(run("explain", saved, "--json").stdout)
    assert line in run("explain", saved).stdout
    exported = run("export", saved, "--format", "megatron", "--output", tmp_path / "out", "--json")
    assert exported.exit_code == 0, exported.output
    outputs["export"] = json.loads(exported.stdout)
    sim = ntp("simulate", saved, "--trials", "2", "--days", "1", "--json")
    assert sim.exit_code == 0, sim.output
    outputs["simulate"] = json.loads(sim.stdout)
    assert line in " ".join(ntp("simulate", saved, "--trials", "2", "--days", "1").stdout.split())
    for command, data in outputs.items():
        assert (data["params_total"], data["params_active"]) == (m.params_total, m.params_active), command
    planned = json.loads(run("plan", *SMALL, "--top", "1", "--json").stdout)
    assert planned["params_total"] == planned["params_active"] == dense.params_total == dense.num_params
    assert f"llama3-8b: {dense.params_total / 1e9:.1f}B parameters" in run("plan", *SMALL, "--top", "1").stdout


def test_estimate_takes_the_experts_grid_and_dispatch(tmp_path):
    from typing import get_args

    from cost_models import layout as library
    from ntp_planner.cli import options

    assert get_args(options.Dispatcher) == get_args(library.Dispatcher)
    assert get_args(options.MoeOverlap) == get_args(library.MoeOverlap)
    out = tmp_path / "folded.json"
    args = [
        "--tp",
        2,
        "--ep",
        4,
        "--etp",
        1,
        "--moe-dispatcher",
        "flex",
        "--moe-overlap",
        "1f1b",
        "--pp",
        2,
        "--vpp",
        2,
    ]
    result = run("estimate", *MOE, *args, "-o", out)
    assert result.exit_code == 0, result.output
    layout = json.loads(out.read_text())["layout"]
    assert (layout["etp"], layout["ep"], layout["moe_dispatcher"], layout["moe_overlap"]) == (1, 4, "flex", "1f1b")
    text = " ".join(result.stdout.split())
    assert "etp1 moe-flex a2a-1f1b" in text
    # tp 2 x dp 4 = 8 GPUs a stage hold ep 4 x etp 1, so 2 copies of each expert shard
    grid = "experts: ep 4 x etp 1 x edp 2 over the 8 GPUs of a stage (folded over the attention TP), flex dispatch"
    assert grid + ", 1f1b A2A overlap" in text
    assert grid.replace("folded over", "split like") not in text
    refused = ntp("estimate", *SMALL, "--tp", 2, "--etp", 1)
    assert refused.exit_code == 2 and "etp(1) needs an MoE model" in refused.stderr
