"""The shell conventions of `ntp` (issue 25): completion, --json errors on stdout with a code,
``-`` for standard input and output, progress on stderr, the table width from ``COLUMNS``, and
exit code 3 for "no layout fits", apart from bad input's 2. Through real subprocesses where a pipe
or a terminal matters, else CliRunner."""

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from ntp_planner.cli import app
from ntp_planner.plan import Plan

runner = CliRunner()
SMALL = ["--model", "llama3-8b", "--cluster", "dgx-h100", "--gpus", "16", "--seq-len", "4096", "--global-batch", "32"]
NTP = [sys.executable, "-m", "ntp_planner"]


def ntp(*args, stdin: bytes | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*NTP, *map(str, args)], input=stdin, capture_output=True, timeout=120, env={**os.environ, **(env or {})}
    )


@pytest.fixture(scope="module")
def plan_text(tmp_path_factory) -> bytes:
    out = ntp("plan", *SMALL, "--top", "2", "-o", "-")
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_plan_to_stdout_is_the_plan_file_and_its_table_goes_to_stderr(plan_text, tmp_path):
    """`-o -` puts the plan file, whole and alone, on stdout (it loads as a Plan); the table the
    command prints goes to stderr, so the pipe is not mixed; `-o file` writes the same plan."""
    path = tmp_path / "p.json"
    path.write_bytes(plan_text)
    plan = Plan.load(path)
    assert plan.model.name == "llama3-8b" and plan.cluster.num_gpus == 16
    again = ntp("plan", *SMALL, "--top", "2", "-o", tmp_path / "q.json")
    assert again.returncode == 0 and b"layout:" in again.stdout
    assert json.loads((tmp_path / "q.json").read_text()) == json.loads(plan_text)


def test_a_plan_read_from_stdin_is_the_plan_read_from_its_file(plan_text, tmp_path):
    (tmp_path / "p.json").write_bytes(plan_text)
    piped = ntp("explain", "-", "--json", stdin=plan_text)
    from_file = ntp("explain", tmp_path / "p.json", "--json")
    assert piped.returncode == from_file.returncode == 0, piped.stderr
    assert json.loads(piped.stdout) == json.loads(from_file.stdout)


@pytest.mark.parametrize(
    ("stdin", "says"),
    [(b"", "plan on standard input is empty"), (b"\xff\xfe{", "is not UTF-8"), (b"{}", "- is not a plan file")],
)
def test_a_bad_or_empty_stdin_is_one_sentence_and_exit_2(stdin, says):
    out = ntp("explain", "-", stdin=stdin)
    assert out.returncode == 2 and out.stdout == b""
    line = out.stderr.decode()
    assert line.startswith("error: ") and says in line and line.count("\n") == 1 and "Traceback" not in line


def test_a_folder_output_refuses_stdout(plan_text, tmp_path):
    (tmp_path / "p.json").write_bytes(plan_text)
    out = ntp("export", tmp_path / "p.json", "-o", "-")
    assert out.returncode == 2 and out.stdout == b""
    assert b"writes a folder of files, which standard output cannot hold" in out.stderr
    assert not os.path.exists("-")


def test_json_errors_are_an_object_on_stdout_with_the_exit_code():
    """With --json a script gets the error as JSON on stdout (bad input 2, usage error 2, no fit 3),
    and the one line on stderr still; without --json, stdout stays empty."""
    cases = [
        (["plan", "--model", "no-such-model", "--cluster", "dgx-h100", "--gpus", "8"], 2, "input", "unknown model"),
        (["plan", *SMALL, "--no-such-option"], 2, "input", "No such option: --no-such-option"),
        (["plan", "--model", "llama3.1-405b", "--cluster", "dgx-h100", "--gpus", "8"], 3, "no-fit", "fits no layout"),
    ]
    for args, code, kind, says in cases:
        out = ntp(*args, "--json")
        assert out.returncode == code, out.stderr
        error = json.loads(out.stdout)["error"]
        assert error["code"] == code and error["kind"] == kind and says in error["message"]
        assert out.stderr.decode().startswith("error: ") and says in out.stderr.decode()
        plain = ntp(*args)
        assert plain.returncode == code and plain.stdout == b""


def test_no_layout_fits_exits_3_and_bad_input_2():
    assert (
        runner.invoke(app, ["plan", "--model", "llama3.1-405b", "--cluster", "dgx-h100", "--gpus", "8"]).exit_code == 3
    )
    assert runner.invoke(app, ["plan", "--model", "llama3-8b", "--cluster", "no-such", "--gpus", "8"]).exit_code == 2


def test_the_help_lists_the_exit_codes_and_completion():
    out = runner.invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert out.exit_code == 0
    text = " ".join(out.stdout.split())
    assert "--install-completion" in text and "--show-completion" in text
    assert "Exit codes: 0 success; 1 a check failed" in text and "3 no layout fits" in text


def test_completion_completes_the_commands():
    """The completion protocol the installed script speaks (``--show-completion`` prints it for
    the shell it detects): asked for ``ntp pl``, the program answers ``plan``."""
    words = subprocess.run(
        NTP,
        capture_output=True,
        timeout=60,
        env={**os.environ, "_NTP_COMPLETE": "complete_bash", "COMP_WORDS": "ntp pl", "COMP_CWORD": "1"},
    )
    assert words.stdout.split() == [b"plan"]


def test_columns_sets_the_table_width_and_pipes_default_to_120():
    """The runners-up table is wider than 120 columns: a pipe cuts it at 120, COLUMNS=200 lets it
    spread, COLUMNS=70 narrows it."""
    widths = {}
    for columns in ("", "70", "200"):
        out = ntp("plan", *SMALL, "--top", "3", env={"COLUMNS": columns})
        assert out.returncode == 0, out.stderr
        widths[columns] = max(map(len, out.stdout.decode().splitlines()))
    assert widths[""] == 120 and widths["70"] <= 70 and 120 < widths["200"] <= 200


def test_progress_goes_to_stderr():
    """With the live display forced on (TTY_INTERACTIVE, as on a terminal), the bar draws on
    stderr and stdout carries nothing."""
    code = "from ntp_planner.cli.output import progress\nwith progress('counting', 3, False) as tick:\n tick(3)"
    env = {**os.environ, "TTY_INTERACTIVE": "1", "TTY_COMPATIBLE": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60, env=env)
    assert out.returncode == 0 and out.stdout == b""
    assert b"counting" in out.stderr
