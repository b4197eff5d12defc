"""Bad inputs that once escaped the one-line refusal (issue: hostile and malformed inputs), each
pinned to the sentence it now gets: two outputs of one command on one path, keys given twice in
a file, a runs file nested past any record, paths for launch files holding control characters.
Each case runs in this process through the real entry point (``test_fuzz.run``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.ntp_planner import test_fuzz
from tests.ntp_planner.test_fuzz import FUZZ, check, run
from topologies.errors import InputError
from topologies.files import parse

# test_fuzz's module fixtures, under their names here (a plan of 64 GPUs; a profile and its runs)
plan_file = test_fuzz.plan_file
profile_files = test_fuzz.profile_files


def _refused(args: list, message: str) -> None:
    code, out, err = run(args)
    assert code == 2, (args, code, (out + err)[-1500:])
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert message in err, err


# ---- simulate: --trace-out on the path --plot writes ------------------------------------------
# The trace used to be written after the trials and the plots, and failed there: the run's work
# was lost and the plot folder stood where the trace was asked for.
@pytest.mark.parametrize(
    ("trace_out", "folder", "message"),
    [
        ("out", False, "--trace-out out is the folder --plot out writes"),
        ("./out", False, "--trace-out out is the folder --plot out writes"),
        ("out/goodput_distribution.png", True, "is the plot goodput_distribution.png that --plot out writes"),
    ],
)
def test_trace_out_may_not_be_where_the_plots_go(plan_file, tmp_path, monkeypatch, trace_out, folder, message):
    monkeypatch.chdir(tmp_path)
    if folder:
        (tmp_path / "out").mkdir()  # empty: the plots would fill it, then the trace replace one
    _refused(["simulate", plan_file, "--days", 1, "--trials", 2, "--plot", "out", "--trace-out", trace_out], message)
    assert list(tmp_path.iterdir()) == ([tmp_path / "out"] if folder else [])  # refused before the trials
    assert not folder or list((tmp_path / "out").iterdir()) == []


# ---- a key given twice: JSON and YAML keep the last one silently ------------------------------
@pytest.mark.parametrize(
    ("text", "kind", "key"),
    [
        ('{"a": 1, "b": {"c": 1, "c": 2}}', "JSON", "c"),
        ('{"tp": 1, "tp": 8}', "JSON", "tp"),
        ("a: 1\nb: 2\na: 3\n", "YAML", "a"),
        ("a: 1\n'a': 2\n", "YAML", "a"),  # quoting does not make it another key
        ("l: [{x: 1, x: 2}]\n", "YAML", "x"),
    ],
)
def test_a_key_given_twice_is_refused(text, kind, key):
    with pytest.raises(InputError, match=f"f.txt gives the key '{key}' twice in one mapping; keep one"):
        parse(text, Path("f.txt"), "f", kind)


def test_yaml_merge_keys_may_be_overridden():
    # `<<: *base` then `a: 3` names a twice on purpose: a merge is how YAML overrides a block
    text = "base: &b {a: 1, b: 2}\nother:\n  <<: *b\n  a: 3\n"
    assert parse(text, Path("f"), "f", "YAML") == {"base": {"a": 1, "b": 2}, "other": {"a": 3, "b": 2}}
    assert parse('{"1": 1, "01": 2}', Path("f"), "f", "JSON") == {"1": 1, "01": 2}  # two keys, not one


def test_a_plan_edited_to_give_a_field_twice_is_refused(plan_file, tmp_path):
    text = plan_file.read_text()
    edited = tmp_path / "plan.json"
    edited.write_text(text.replace('"tp": ', '"tp": 8, "tp": ', 1))  # the first tp: the layout's
    assert json.loads(edited.read_text())["layout"]["tp"] == json.loads(text)["layout"]["tp"]  # last one wins
    _refused(["explain", edited], f"plan {edited} gives the key 'tp' twice in one mapping; keep one.")


# ---- calibrate: a runs file is parsed with the other files' limits ----------------------------
@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("[" * 100_000 + "]" * 100_000, "line 1 nests deeper than 32 levels"),  # was RecursionError, exit 1
        ('{"name": "a", "name": "b"}', "line 1 gives the key 'name' twice in one mapping"),
        ("9" * 5000, "line 1 holds a number of more than 4,300 digits"),  # was Python's set_int_max_str_digits advice
        ("{not json", "line 1 is not valid JSON: Expecting property name"),
    ],
)
def test_hostile_runs_files(profile_files, tmp_path, line, message):
    profile, runs = profile_files
    edited = tmp_path / "runs.jsonl"
    edited.write_text(line + "\n" + runs.read_text())
    _refused(["calibrate", edited, "--profile", profile, "-o", tmp_path / "out.json"], f"runs file {edited} {message}")
    assert not (tmp_path / "out.json").exists()


# ---- export: paths written into launch files ---------------------------------------------------
@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--save-dir", "ckpt\rrm -rf /", r"--save-dir 'ckpt\rrm -rf /' holds the control character '\r'"),
        ("--data-path", "data\x00", r"--data-path 'data\x00' holds the control character '\x00'"),
        ("--data-path", "a\x1b[2Jb", r"holds the control character '\x1b'"),
        # a byte that is not UTF-8 on the command line: used to end in "'utf-8' codec can't encode"
        ("--save-dir", "ckpt\udcff", "holds a byte that is not UTF-8 text"),
    ],
)
def test_export_paths_must_be_printable(plan_file, tmp_path, option, value, message):
    _refused(["export", plan_file, "-o", tmp_path / "out", option, value], message)
    assert not (tmp_path / "out").exists()


@settings(FUZZ, max_examples=20)
@given(value=st.text(min_size=1, max_size=12))
def test_export_paths_any_text(plan_file, tmp_path_factory, value):
    """Whatever text --save-dir is, export writes the files or refuses in one line."""
    folder = tmp_path_factory.mktemp("export")
    check(["export", plan_file, "-o", folder / "out", "--save-dir", value], folder)


# ---- two inputs from standard input -----------------------------------------------------------
# Standard input holds one file: the first reader took the plan as a recovery file, or the second
# found it empty, and the sentence named the wrong file.
@pytest.mark.parametrize(
    ("args", "pair"),
    [
        (["simulate", "-", "--recovery-from", "-"], "plan_file and --recovery-from"),
        (["simulate", "{plan}", "--recovery-from", "-", "--trace", "-"], "--recovery-from and --trace"),
        (["explain", "-", "--profile", "-"], "plan_file and --profile"),
        (["export", "-", "--replan", "-"], "plan_file and --replan"),
        (["calibrate", "-", "--profile", "-", "-o", "out.json"], "runs_file and --profile"),
        (["validate", "-", "--profile", "-"], "plan_file and --profile"),
    ],
)
def test_two_inputs_from_stdin_are_refused(plan_file, tmp_path, monkeypatch, args, pair):
    import io
    import sys

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(plan_file.read_bytes())))
    args = [str(plan_file) if a == "{plan}" else a for a in args]
    _refused(args, f"error: {pair} are both - (standard input), which holds one file; give one of them as a path.")
    assert list(tmp_path.iterdir()) == []


def test_every_path_parameter_is_an_input_or_an_output():
    """GuardedCommand knows which paths are read (two of them may not both be -) and which
    written (- is standard output): a new path option must be put in one of the two."""
    import typing

    from ntp_planner.cli import app
    from ntp_planner.cli.errors import INPUT_PATHS, OUTPUT_PATHS

    paths = set()
    for info in app.registered_commands:
        hints = typing.get_type_hints(info.callback, include_extras=True)
        paths |= {name for name, hint in hints.items() if "pathlib.Path" in str(hint)}
    assert paths == INPUT_PATHS | OUTPUT_PATHS and not INPUT_PATHS & OUTPUT_PATHS


# ---- a write the file system or standard output refuses ---------------------------------------
# A full disk, a quota, `ulimit -f`, `> /dev/full`: was "internal error: OSError ... this is a bug",
# exit 1 (and with --json a traceback, the error object failing on the same stdout).
def test_a_refused_file_write_keeps_the_old_file(plan_file, tmp_path):
    import resource
    import subprocess
    import sys

    out = tmp_path / "replan.json"
    out.write_text("old\n")
    limit = 1024  # bytes: the re-plan of the 64-GPU plan is some 2 kB

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    args = ["replan", str(plan_file), "--failed", "1", "-o", str(out)]
    code = "from ntp_planner.cli import main; main()"
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, preexec_fn=small_files, timeout=60
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: cannot write {out}: file too large; make room there or pick another folder."
    )
    assert out.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["replan.json"]  # no temp file


class FullStdout:
    """Standard output on a full device (``> /dev/full``)."""

    def write(self, text):
        import errno

        raise OSError(errno.ENOSPC, "No space left on device")

    def flush(self):
        pass

    def isatty(self):
        return False

    buffer = property(lambda self: self)


@pytest.mark.parametrize(
    "args",
    [["models"], ["explain", "{plan}", "--json"], ["replan", "{plan}", "--failed", "1", "-o", "-"]],
)
def test_a_full_stdout_is_one_sentence(plan_file, monkeypatch, args):
    import io
    import sys

    from ntp_planner.cli import main

    err = io.StringIO()
    monkeypatch.setattr(sys, "stdout", FullStdout())
    monkeypatch.setattr(sys, "stderr", err)
    monkeypatch.setattr(sys, "argv", ["ntp", *(str(plan_file) if a == "{plan}" else a for a in args)])
    with pytest.raises(SystemExit) as stop:
        main()
    assert stop.value.code == 2
    assert err.getvalue().splitlines()[-1] == (
        "error: cannot write to standard output: no space left on device; send it to a file or device with room."
    )


# ---- options the run would ignore ---------------------------------------------------------------
# Given on the command line, each was dropped without a word, and the table read as shaped by it
# (replan already refused --fallback and --max-power where its policy does not use them).
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["sweep", "--policies", "dp-drop", "--fallback", "ntp"], "--fallback ntp only applies to the spares policy"),
        (["sweep", "--policies", "ntp", "--max-power", "1.5"], "--max-power 1.5 only applies when ntp-pw decides"),
        (["sweep", "--policies", "spares", "--max-power", "1.5"], "--max-power 1.5 only applies when ntp-pw decides"),
        (["simulate", "--weibull-shape", "2"], "--weibull-shape 2.0 does nothing here: it shapes"),
        (["simulate", "--lemon-factor", "5"], "--lemon-factor 5.0 does nothing here: it applies to lemon hosts and"),
        (["simulate", "--straggler-hours", "3"], "--straggler-hours 3.0 does nothing here: it applies to stragglers"),
        (["simulate", "--straggler-slowdown", "2"], "--straggler-slowdown 2.0 does nothing here"),
        (["simulate", "--hw-share", "0", "--hw-blast", "node"], "--hw-blast node does nothing here: it applies"),
        (["simulate", "--hw-share", "1", "--sw-repair-hours", "9"], "--sw-repair-hours 9 does nothing here"),
    ],
)
def test_an_option_the_run_ignores_is_refused(plan_file, args, message):
    command, *options = args
    base = ["--samples", "2", "--fractions", "0.01"] if command == "sweep" else ["--days", "1", "--trials", "2"]
    code, out, _ = run([command, plan_file, *base, *options, "--json"])
    # refused before any trial or sample: exit 2 and, for scripts, one JSON error naming the option
    # in one sentence instead of a result
    assert code == 2, (args, code, out[-800:])
    error = json.loads(out)["error"]
    assert (error["code"], error["kind"]) == (2, "input") and error["message"].startswith(message), error
    assert error["message"].endswith(".") and "\n" not in error["message"]


@pytest.mark.parametrize(
    "options",
    [
        ["--policies", "spares", "--fallback", "ntp-pw", "--max-power", "1.5"],  # sweep: spares falls back to ntp-pw
        ["--failure-dist", "weibull", "--weibull-shape", "2"],
        ["--lemon-fraction", "0.1", "--lemon-factor", "5"],
        ["--hw-share", "0.5", "--sw-blast", "node", "--hw-repair-days", "1-2"],
    ],
)
def test_the_same_options_where_they_apply_run(plan_file, options):
    command = "sweep" if "--policies" in options else "simulate"
    base = ["--samples", "2", "--fractions", "0.01"] if command == "sweep" else ["--days", "1", "--trials", "2"]
    code, _, err = run([command, plan_file, *base, *options, "--json"])
    assert code == 0, err


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--fp8-recipe", "current"], "--fp8-recipe current scales fp8 GEMMs and --dtype bf16 runs none"),
        (["--fp8-recipe", "current", "--dtype", "mxfp8"], "--fp8-recipe current scales fp8 GEMMs and --dtype mxfp8"),
        (["--moe-capacity-factor", "1.5"], "moe_capacity_factor(1.5) caps the tokens each expert takes; llama3-8b is"),
        (["--moe-capacity-factor", "1", "--moe-pad-to-capacity"], "moe_capacity_factor(1) caps the tokens each"),
    ],
)
def test_a_training_option_the_model_or_format_ignores_is_refused(options, message):
    code, out, _ = run(["estimate", "-m", "llama3-8b", "-c", "dgx-b200", "-n", "8", "--tp", "8", *options, "--json"])
    # no step cost for a layout the options do not describe: exit 2 and one JSON error sentence
    assert code == 2, (options, code, out[-800:])
    error = json.loads(out)["error"]
    assert (error["code"], error["kind"]) == (2, "input") and error["message"].startswith(message), error
    assert "step_time_s" not in out and "\n" not in error["message"]


def test_the_same_training_options_where_they_apply_run():
    base = ["estimate", "-c", "dgx-b200", "-n", "8", "--tp", "8", "--seq-len", "2048", "--global-batch", "8", "--json"]
    for args in (
        ["-m", "llama3-8b", "--dtype", "fp8", "--fp8-recipe", "current"],
        ["-m", "llama3-8b", "--dtype", "mxfp8", "--fp8-recipe", "delayed"],  # the default passes with any format
        ["-m", "mixtral-8x7b", "--moe-capacity-factor", "1.5"],
    ):
        code, _, err = run([*base, *args])
        assert code == 0, (args, err)
