"""The `ntp` program around the commands: version, `python -m`, --debug, one-line errors with the
right exit code, help at 80 columns, choices that match the library, and small messages."""

import json
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import get_args

import pytest
import typer
from typer.testing import CliRunner

from ntp_planner.cli import app, options
from topologies.errors import InputError

runner = CliRunner()
SMALL = ["-m", "llama3-8b", "-c", "dgx-h100", "-n", "32", "--seq-len", "4096", "--global-batch", "64"]
COMMANDS = [
    "models", "clusters", "plan", "estimate", "explain", "replan", "sweep", "simulate", "export", "validate", "profile",
    "calibrate", "capacity",
]  # fmt: skip


def run(*args, **kw):
    return runner.invoke(app, [str(a) for a in args], **kw)


def test_global_options_are_version_debug_and_completion():
    assert sorted(p.opts[0] for p in typer.main.get_command(app).params) == [
        "--debug",
        "--install-completion",
        "--show-completion",
        "--version",
    ]


def test_version():
    try:
        expected = version("ntp-planner")
    except PackageNotFoundError:
        from ntp_planner import __version__ as expected
    result = run("--version")
    assert result.exit_code == 0 and result.stdout == f"ntp-planner {expected}\n"


@pytest.mark.parametrize(("argv", "code", "start"), [(["--version"], 0, "ntp-planner "), ([], 0, "Usage: ntp ")])
def test_python_dash_m(argv, code, start):
    out = subprocess.run([sys.executable, "-m", "ntp_planner", *argv], capture_output=True, text=True)
    assert out.returncode == code and out.stdout.startswith(start) and out.stderr == ""


def _boom(exc):
    def raise_it(*_args, **_kw):
        raise exc

    return raise_it


@pytest.mark.parametrize(
    ("exc", "code", "line"),
    [
        (InputError("no such thing; pick another"), 2, "error: no such thing; pick another."),
        (ValueError("a plain ValueError, bad input for now"), 2, "error: a plain ValueError, bad input for now."),
        (
            KeyError("tp"),
            1,
            "internal error: KeyError: 'tp'; this is a bug in ntp-planner, please report it; "
            "rerun with --debug for the traceback",
        ),
        (
            ZeroDivisionError("division by zero\nsecond line"),
            1,
            "internal error: ZeroDivisionError: division by zero second line; this is a bug in ntp-planner, "
            "please report it; rerun with --debug for the traceback",
        ),
    ],
)
def test_input_errors_exit_2_and_bugs_exit_1_in_one_line(monkeypatch, exc, code, line):
    monkeypatch.setattr("ntp_planner.views.catalogue.models_table", _boom(exc))
    result = run("models")
    assert result.exit_code == code
    assert result.stderr == line + "\n" and result.stdout == ""
    debug = run("--debug", "models")
    assert debug.exit_code == code
    assert debug.stderr.startswith("Traceback (most recent call last):") and debug.stderr.endswith(line + "\n")
    assert "raise_it" in debug.stderr


def test_the_entry_point_reports_a_bug_with_exit_1(monkeypatch, capsys):
    from ntp_planner.cli import main

    monkeypatch.setattr("ntp_planner.views.catalogue.clusters_table", _boom(RuntimeError("oops")))
    monkeypatch.setattr(sys, "argv", ["ntp", "clusters"])
    with pytest.raises(SystemExit) as stop:
        main()
    assert stop.value.code == 1
    assert capsys.readouterr().err.startswith("internal error: RuntimeError: oops; this is a bug")


def test_a_library_field_error_names_the_option_that_set_it(tmp_path):
    plan = tmp_path / "p.json"
    assert run("estimate", *SMALL, "--tp", 8, "-o", plan).exit_code == 0
    result = run("simulate", plan, "--failure-rate", "1e-320")  # within --failure-rate's 0..1, under SimConfig's floor
    assert result.exit_code == 2
    assert result.stderr == (
        "error: --failure-rate 1e-320: a rate of 1e-320 per GPU-hour is below 1e-12 (once per 10**8 GPU-years), "
        "where the expected failure counts underflow; give 0 for none.\n"
    )


@pytest.mark.parametrize("command", COMMANDS)
def test_help_fits_80_columns_and_names_every_option_whole(command):
    result = run(command, "--help", terminal_width=80)
    assert result.exit_code == 0
    assert max(len(line) for line in result.stdout.splitlines()) <= 80
    assert "…" not in result.stdout and "<bool>" not in result.stdout
    cmd = typer.main.get_command(app).commands[command]
    for param in cmd.params:
        if not param.hidden:
            assert all(name in result.stdout for name in [*param.opts[:1], *param.secondary_opts])


def test_plan_help_says_per_layer_is_the_default():
    text = " ".join(run("plan", "--help").stdout.split())
    assert "every uniform layout" not in text
    assert "with --per-layer, the default, per-layer TP degrees too" in text
    assert "--per-layer / --uniform" in text and "[default: per-layer]" in text


@pytest.mark.parametrize(
    ("cli_choice", "library"),
    [
        ("Dtype", "cost_models.training:Dtype"),
        ("Recompute", "cost_models.layout:Recompute"),
        ("Policy", "ntp_planner.replan_result:Policy"),
        ("BatchMode", "ntp_planner.replan_result:BatchMode"),
        ("Blast", "ntp_planner.failures.sampling:Blast"),
    ],
)
def test_choices_match_the_library(cli_choice, library):
    import importlib

    module, name = library.split(":")
    assert get_args(getattr(options, cli_choice)) == get_args(getattr(importlib.import_module(module), name))


@pytest.mark.parametrize(
    ("cli_bound", "library"),
    [
        ("ntp_planner.cli.options:MAX_GPUS", "topologies.cluster:MAX_GPUS"),
        ("ntp_planner.cli.options:MAX_GLOBAL_BATCH", "cost_models.training:MAX_GLOBAL_BATCH"),
        ("ntp_planner.cli.options:MAX_LAYERS", "cost_models.model:MAX_LAYERS"),
        ("ntp_planner.cli.options:MAX_POWER", "cost_models.degraded:MAX_POWER"),
        ("ntp_planner.cli.simulate:MAX_TRIALS", "ntp_planner.failures.sim_config:MAX_TRIALS"),
        ("ntp_planner.cli.simulate:MAX_RATE_PER_GPU_HOUR", "ntp_planner.failures.sim_config:MAX_RATE_PER_GPU_HOUR"),
        ("ntp_planner.cli.simulate:MIN_RATE_PER_GPU_HOUR", "ntp_planner.failures.sim_config:MIN_RATE_PER_GPU_HOUR"),
        ("ntp_planner.cli.simulate:MAX_SECONDS", "ntp_planner.failures.sim_config:MAX_SECONDS"),
        ("ntp_planner.cli.simulate:MAX_HOURS", "ntp_planner.failures.sim_config:MAX_HOURS"),
        ("ntp_planner.cli.simulate:MIN_SHAPE", "ntp_planner.failures.sim_config:MIN_SHAPE"),
        ("ntp_planner.cli.simulate:MAX_SHAPE", "ntp_planner.failures.sim_config:MAX_SHAPE"),
        ("ntp_planner.cli.simulate:MAX_SLOWDOWN", "ntp_planner.failures.sim_config:MAX_SLOWDOWN"),
        ("ntp_planner.cli.simulate:MAX_LEMON_FACTOR", "ntp_planner.failures.sim_config:MAX_LEMON_FACTOR"),
        ("ntp_planner.cli.options:MAX_GPUS", "ntp_planner.failures.sim_config:MAX_SPARES"),
        ("ntp_planner.cli.capacity:MAX_USD_PER_GPU_HOUR", "topologies.prices:MAX_USD_PER_GPU_HOUR"),
    ],
)
def test_option_bounds_match_the_library(cli_bound, library):
    """The CLI spells its bounds so that `ntp --help` imports nothing heavy; they must be the library's."""
    import importlib

    def value(where):
        module, name = where.split(":")
        return getattr(importlib.import_module(module), name)

    assert value(cli_bound) == value(library)
    from cost_models.training import _BOUNDS

    assert options.MAX_SEQ_LEN == _BOUNDS["seq_len"].hi
    assert value("ntp_planner.cli.simulate:MAX_INTERVAL_MIN") * 60 == value(
        "ntp_planner.failures.sim_config:MAX_INTERVAL_S"
    )
    assert value("ntp_planner.cli.simulate:MIN_INTERVAL_MIN") * 60 == value(
        "ntp_planner.failures.sim_config:MIN_INTERVAL_S"
    )
    repair = value("ntp_planner.cli.simulate:MAX_REPAIR")
    assert (
        repair["--hw-repair-days"] * 24
        == repair["--sw-repair-hours"]
        == value("ntp_planner.failures.sim_config:MAX_HOURS")
    )


def test_choice_tuples_match_the_library():
    from ntp_planner.emitters import FORMATS
    from ntp_planner.failures.sim_config import STRATEGIES

    assert get_args(options.Strategy) == STRATEGIES
    assert get_args(options.Format) == tuple(FORMATS)


def test_validate_without_torch_says_how_to_install_it(tmp_path, monkeypatch):
    plan = tmp_path / "p.json"
    assert run("estimate", *SMALL, "--tp", 8, "-o", plan).exit_code == 0
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    result = run("validate", plan)
    assert result.exit_code == 2
    assert result.stderr == (
        "error: `ntp validate` runs the plan with PyTorch, which is not installed here; "
        "install it with: pip install 'ntp-planner[torch]'.\n"
    )


def test_estimate_saves_a_layout_that_does_not_fit_with_one_warning(tmp_path):
    out = tmp_path / "big.json"
    args = ["estimate", "-m", "llama3-70b", "-c", "dgx-h100", "-n", 8, "--tp", 8, "--global-batch", 8]
    result = run(*args, "-o", out, "--json")
    assert result.exit_code == 0 and out.exists()
    cost = json.loads(result.stdout)
    need, have = cost["memory_per_gpu_bytes"] / 2**30, cost["hbm_bytes"] / 2**30
    assert need > have
    assert result.stderr == (
        f"warning: {out} holds a layout that does not fit: needs {need:.1f} GiB of {have:.1f} GiB per GPU\n"
    )
    assert run(*args, "--json").stderr == ""  # nothing saved, nothing to warn about


def test_a_gpu_count_below_one_host_suggests_one_host():
    result = run("plan", "-m", "llama3-8b", "-c", "dgx-h100", "-n", 7)
    assert result.exit_code == 2
    assert result.stderr.endswith("(7 % 8 = 7); use 8.\n")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["replan", "{plan}", "--failed", ""], "error: --failed '' lists nothing; give comma-separated whole numbers"),
        (["replan", "{plan}", "--failed", "3,x"], "error: --failed '3,x' must be comma-separated whole numbers"),
        (["sweep", "{plan}", "--fractions", "0.1,y"], "error: --fractions '0.1,y' must be comma-separated numbers"),
        (["sweep", "{plan}", "--policies", " , "], "error: --policies ' , ' lists nothing; give comma-separated names"),
        (["sweep", "{plan}", "--fractions", "1.5"], "error: --fractions must be numbers in [0, 1); got [1.5]"),
        (["estimate", *SMALL, "--pp", 2, "--pp-layers", ","], "error: --pp-layers ',' lists nothing"),
    ],
)
def test_every_list_option_goes_through_one_parser(tmp_path, args, message):
    plan = tmp_path / "p.json"
    assert run("estimate", *SMALL, "--tp", 8, "-o", plan).exit_code == 0
    result = run(*[str(a).replace("{plan}", str(plan)) for a in args])
    assert result.exit_code == 2 and result.stderr.startswith(message) and len(result.stderr.splitlines()) == 1


def test_explain_signs_runner_up_deltas(tmp_path):
    from ntp_planner.plan import Plan
    from ntp_planner.views.plan import why_lost

    out = tmp_path / "plan.json"
    assert run("plan", *SMALL, "--top", 2, "-o", out).exit_code == 0
    plan = Plan.load(out)
    best, runner_up = plan.predicted, plan.runners_up[0]
    faster = runner_up.model_copy(update={"step_time_s": best.step_time_s - 0.011})
    slower = runner_up.model_copy(update={"step_time_s": best.step_time_s + 0.011})
    assert why_lost(best, faster).startswith("-0.011 s (")
    assert why_lost(best, slower).startswith("+0.011 s (")


def test_a_bad_choice_reads_as_one_sentence_without_pydantic_prefixes(monkeypatch, capsys):
    from ntp_planner.cli import main

    monkeypatch.setattr(sys, "argv", ["ntp", "estimate", "-m", "mixtral-8x7b", "-c", "dgx-h100", "-n", "16",
                                      "--moe-dispatcher", "bogus"])  # fmt: skip
    with pytest.raises(SystemExit) as stop:
        main()
    assert stop.value.code == 2
    assert capsys.readouterr().err == (
        "error: --moe-dispatcher bogus: 'bogus' is not one of 'alltoall', 'allgather', 'flex'; "
        "run `ntp estimate --help` for the options.\n"
    )


def test_estimate_takes_the_moe_recipe_settings():
    def cost(*extra):
        args = ["estimate", "-m", "qwen3-30b-a3b", "-c", "dgx-h100", "-n", "16", "--ep", "8", "--global-batch", "64",
                "--seq-len", "4096", "--json", *extra]  # fmt: skip
        out = run(*args)
        assert out.exit_code == 0, out.stderr
        return json.loads(out.stdout)

    base, modules = cost(), cost("--recompute-modules", "mlp,moe_act")
    # recomputing the MLP keeps fewer activations and pays its forward again
    assert modules["memory_breakdown_bytes"]["activations"] < base["memory_breakdown_bytes"]["activations"]
    assert modules["step_time_s"] > base["step_time_s"]
    # a padded capacity factor of 1 runs the balanced rows exactly, with no host sync: faster than dropless
    assert cost("--moe-capacity-factor", "1", "--moe-pad-to-capacity")["step_time_s"] < base["step_time_s"]
    assert cost("--cuda-graphs")["step_time_s"] < base["step_time_s"]


def test_estimate_takes_the_flex_dispatchers_backend():
    def step(*extra):
        args = ["estimate", "-m", "qwen3-30b-a3b", "-c", "dgx-b200", "-n", "64", "--ep", "8", "--global-batch", "256",
                "--seq-len", "4096", "--moe-dispatcher", "flex", "--json", *extra]  # fmt: skip
        out = run(*args)
        assert out.exit_code == 0, out.stderr
        return json.loads(out.stdout)["step_time_s"]

    # on an 8-GPU host the cluster's rule is DeepEP; HybridEP permutes inside its kernels, so it is faster
    default, deepep, hybridep = step(), step("--moe-flex-backend", "deepep"), step("--moe-flex-backend", "hybridep")
    assert default == deepep and hybridep < deepep
    refused = run("estimate", *SMALL, "--moe-flex-backend", "hybridep")
    assert refused.exit_code == 2
    assert refused.stderr == (
        "error: --moe-flex-backend hybridep picks the flex dispatcher's backend and --moe-dispatcher is alltoall; "
        "add --moe-dispatcher flex or drop it.\n"
    )


def test_a_flex_backend_on_a_dense_model_is_refused():
    from cost_models import MODELS, ParallelLayout, TrainingSpec
    from cost_models.layout import check_layout
    from topologies.errors import InputError

    training = TrainingSpec(seq_len=4096, global_batch=64, moe_flex_backend="hybridep")
    layout = ParallelLayout(tp=8, pp=1, dp=1, micro_batch=1, global_batch=64)
    with pytest.raises(InputError, match=r"moe_flex_backend\(hybridep\) picks how MoE tokens are dispatched; llama3"):
        check_layout(layout, MODELS["llama3-8b"], training, 8, 8)
