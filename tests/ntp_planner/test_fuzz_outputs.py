"""Output paths and kills mid-write (issue 22). Whatever output path hypothesis draws, a command
either writes a regular file or refuses in one line naming the option and the path (exit 2) and
leaves every path as it was: a link stays a link, a device or FIFO is not replaced, an input is not
overwritten, whatever way the path reaches it (``..``, a hard link, a linked folder). A set of files
killed (SIGKILL) at any point of its write leaves the old set or the new one, and the next write
to that place removes the temp files of the killed one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from ntp_planner.cli import app
from ntp_planner.outputs import TMP_PREFIX
from tests.ntp_planner.test_fuzz import SMALL, run

REPO = Path(__file__).resolve().parents[2]
FUZZ = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


class PlanBytes(bytes):
    def __repr__(self) -> str:  # hypothesis prints the arguments of a failing case: not 10 kB of JSON
        return "PlanBytes(...)"


@pytest.fixture(scope="module")
def plan_bytes(tmp_path_factory) -> bytes:
    """An 8-GPU TP-8 plan, as the bytes of its file."""
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    assert CliRunner().invoke(app, ["estimate", *SMALL, "-n", "8", "--tp", "8", "-o", str(path)]).exit_code == 0
    return PlanBytes(path.read_bytes())


# Commands with an output file and the plan as an input; {out} is the output, {in} the input.
FILE_OUTPUTS = {
    "replan": (["replan", "{in}", "--failed", "3", "-o", "{out}"], "--output"),
    "sweep": (["sweep", "{in}", "--samples", "2", "--fractions", "0.01", "--plot", "{out}"], "--plot"),
    "validate": (["validate", "{in}", "--profile", "none.json", "--record", "{out}"], "--record"),
    "calibrate": (["calibrate", "{in}", "--profile", "none.json", "-o", "{out}"], "--output"),
    "profile": (["profile", "--device", "cpu", "-m", "{in}", "-o", "{out}"], "--output"),
    "simulate": (["simulate", "{in}", "--days", "1", "--trials", "2", "--trace-out", "{out}"], "--trace-out"),
}
# What a bad output path is made of, and the words of the refusal that names it.
BAD = {
    "link to a file": "it is a symbolic link",
    "link to nothing": "it is a symbolic link",
    "link to the input": "it is a symbolic link",
    "FIFO": "it is a FIFO",
    "device": "it is a character device",
    "folder": "it is a folder",
    "the input through ..": "it is the command's input",
    "a hard link of the input": "it is the command's input",
    "the input through a linked folder": "it is the command's input",
    "a name over 255 bytes": "bytes, over the 255 a file name may have",
}


def _make(kind: str, root: Path, data) -> str:
    """Make the bad output path ``kind`` under ``root`` (which holds in/plan.json) and return it
    as the user would type it (relative to ``root``, the working folder)."""
    (root / "other.txt").write_text("someone's file\n")
    if kind == "link to a file":
        os.symlink("other.txt", root / "out.json")
    elif kind == "link to nothing":
        os.symlink("missing.json", root / "out.json")
    elif kind == "link to the input":
        os.symlink("in/plan.json", root / "out.json")
    elif kind == "FIFO":
        os.mkfifo(root / "out.json")
    elif kind == "device":
        return "/dev/null"
    elif kind == "folder":
        (root / "out.json").mkdir()
    elif kind == "the input through ..":
        depth = data.draw(st.integers(1, 3), label="depth")
        (root / "in" / "a" / "b" / "c").mkdir(parents=True)
        return "in/" + "/".join("abc"[:depth]) + "/" + "../" * depth + "plan.json"
    elif kind == "a hard link of the input":
        os.link(root / "in" / "plan.json", root / "out.json")
    elif kind == "the input through a linked folder":
        os.symlink("in", root / "linked")
        return "linked/plan.json"
    elif kind == "a name over 255 bytes":
        return data.draw(st.sampled_from("xé"), label="char") * data.draw(st.integers(251, 400), label="n") + ".json"
    return "out.json"


def _state(root: Path) -> dict:
    """Every path under ``root`` with what it is: the link's target, or the file's bytes."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = ("link", os.readlink(p))
        elif p.is_file():
            out[rel] = ("file", p.read_bytes())
        else:
            out[rel] = ("other", p.lstat().st_mode)
    return out


def _no_temp_files(root: Path) -> bool:
    return not [p for p in root.rglob(TMP_PREFIX + "*")]


@FUZZ
@given(data=st.data(), command=st.sampled_from(sorted(FILE_OUTPUTS)), kind=st.sampled_from(sorted(BAD)))
def test_bad_output_paths_are_refused_and_left_alone(plan_bytes, tmp_path_factory, monkeypatch, data, command, kind):
    root = tmp_path_factory.mktemp("out")
    monkeypatch.chdir(root)
    (root / "in").mkdir()
    (root / "in" / "plan.json").write_bytes(plan_bytes)
    target = _make(kind, root, data)
    before = _state(root)
    argv, option = FILE_OUTPUTS[command]
    code, _, err = run([a.replace("{in}", "in/plan.json").replace("{out}", target) for a in argv])
    assert code == 2, err
    assert err.startswith(f"error: cannot write {option} {target}: ") and BAD[kind] in err, err
    assert len(err.splitlines()) == 1
    assert _state(root) == before  # nothing replaced, nothing written, no temp file


@pytest.mark.parametrize("command", sorted(FILE_OUTPUTS))
def test_every_command_refuses_to_write_over_its_own_input(plan_bytes, tmp_path, monkeypatch, command):
    # the cases, each always run: replan P -o P, sweep P --plot P, calibrate R -o R,
    # profile -m cfg.json -o cfg.json, validate P --record P (each wrote over its input, exit 0)
    monkeypatch.chdir(tmp_path)
    Path("p.json").write_bytes(plan_bytes)
    argv, option = FILE_OUTPUTS[command]
    code, _, err = run([a.replace("{in}", "p.json").replace("{out}", "p.json") for a in argv])
    assert code == 2 and err.startswith(f"error: cannot write {option} p.json: it is the command's input p.json"), err
    assert Path("p.json").read_bytes() == plan_bytes and sorted(os.listdir()) == ["p.json"]


@settings(FUZZ, max_examples=12)  # each writes a file (a PNG for sweep): 0.5 s
@given(data=st.data(), command=st.sampled_from(["replan", "sweep"]), size=st.integers(200, 255))
def test_long_legal_names_are_written_and_leave_no_temp_file(plan_bytes, tmp_path_factory, monkeypatch, data, size,
                                                             command):  # fmt: skip
    # a 250-character --plot name once made a temp name over the limit: temp names are short now
    root = tmp_path_factory.mktemp("long")
    monkeypatch.chdir(root)
    (root / "plan.json").write_bytes(plan_bytes)
    suffix = ".png" if command == "sweep" else ".json"
    name = data.draw(st.sampled_from("ab"), label="char") * (size - len(suffix)) + suffix
    argv, _ = FILE_OUTPUTS[command]
    code, _, err = run([a.replace("{in}", "plan.json").replace("{out}", name) for a in argv])
    assert code == 0, err
    assert (root / name).is_file() and (root / name).stat().st_size > 0 and _no_temp_files(root)


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        ("link to a folder", "is a symbolic link, not a folder"),
        ("FIFO", "is a FIFO (named pipe), not a folder"),
        ("file", "is a file, not a folder"),
        ("set file is a link", "it is a symbolic link"),
        ("set file is the input", "it is the command's input"),
    ],
)
def test_bad_export_folders_are_refused_and_left_alone(plan_bytes, tmp_path, monkeypatch, kind, words):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "keep").mkdir()
    plan = "plan.json"
    if kind == "link to a folder":
        os.symlink("keep", "out")
    elif kind == "FIFO":
        os.mkfifo("out")
    elif kind == "file":
        Path("out").write_text("a file\n")
    elif kind == "set file is a link":
        Path("out").mkdir()
        os.symlink("../keep/x", "out/plan_export.json")
    else:  # the plan lies in the folder under the name the json export writes
        Path("out").mkdir()
        plan = "out/plan_export.json"
    Path(plan).write_bytes(plan_bytes)
    before = _state(tmp_path)
    code, _, err = run(["export", plan, "--format", "json", "-o", "out"])
    assert code == 2 and err.startswith("error: ") and words in err and "--output out" in err, err
    assert len(err.splitlines()) == 1 and _state(tmp_path) == before


# ---- kills mid-write ---------------------------------------------------------------------------------
# A child process runs the CLI with ntp_planner.outputs patched to SIGKILL itself at one point:
# before the N-th file of a set is written (write:N), before the folder swap (exchange), after it
# (swapped: the old set not yet removed), or before the first rename of per-file moves (replace:1).
CHILD = """
import os, signal, sys
import ntp_planner.outputs as o
point, n = sys.argv[1].split(":")[0], int((sys.argv[1].split(":") + ["1"])[1])
count = {"write": 0, "replace": 0}
die = lambda: os.kill(os.getpid(), signal.SIGKILL)
real_write, real_exchange, real_replace = o._write, o._exchange, os.replace
def write(*a):
    count["write"] += 1
    if point == "write" and count["write"] == n:
        die()
    return real_write(*a)
def exchange(*a):
    if point == "exchange":
        die()
    done = real_exchange(*a)
    if point == "swapped":
        die()
    return done
def replace(*a):
    count["replace"] += 1
    if point == "replace" and count["replace"] == n:
        die()
    return real_replace(*a)
o._write, o._exchange, o.os.replace = write, exchange, replace
if sys.argv[2] == "write_files":
    from pathlib import Path
    o.write_files({Path(p): "new " + p for p in sys.argv[3:]})
else:
    from ntp_planner.cli import main
    sys.argv = ["ntp", *sys.argv[2:]]
    main()
"""


def _child(tmp: Path, point: str, *args) -> int:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-c", CHILD, point, *map(str, args)], cwd=tmp, env=env, timeout=120,
                          capture_output=True, text=True)  # fmt: skip
    return proc.returncode


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if not p.name.startswith(TMP_PREFIX)}


def _export_sets(tmp: Path, plan_bytes: bytes, replan: bool) -> tuple[list[str], dict, dict]:
    """The export command, and the old and new sets it writes (old: with --save-dir /old)."""
    (tmp / "plan.json").write_bytes(plan_bytes)
    base = ["export", "plan.json", "--save-dir"]
    assert run([*base, "/new", "-o", "new"])[0] == 0
    new = _files(tmp / "new")
    assert run([*base, "/old", "-o", "out"])[0] == 0
    old = _files(tmp / "out")
    if replan:  # an older export with a third file, which the new set lacks
        (tmp / "out" / "nonuniform_tp.json").write_text("{}\n")
        old = _files(tmp / "out")
    return [*base, "/new", "-o", "out"], old, new


@pytest.mark.parametrize(
    ("point", "keeps"),
    [("write:1", "old"), ("write:2", "old"), ("exchange", "old"), ("swapped", "new")],
)
@pytest.mark.parametrize("replan", [False, True])
def test_a_killed_export_leaves_the_old_set_or_the_new(plan_bytes, tmp_path, monkeypatch, point, keeps, replan):
    monkeypatch.chdir(tmp_path)
    argv, old, new = _export_sets(tmp_path, plan_bytes, replan)
    assert old != new and set(new) == {"launch_megatron.sh", "megatron_args.json"}
    assert _child(tmp_path, point, *argv) == -signal.SIGKILL
    assert _files(tmp_path / "out") == (old if keeps == "old" else new)
    assert not _no_temp_files(tmp_path)  # the killed writer's temp folder is left ...
    assert run(argv)[0] == 0
    assert _files(tmp_path / "out") == new and _no_temp_files(tmp_path)  # ... and the next write removes it
    assert os.access(tmp_path / "out" / "launch_megatron.sh", os.X_OK)


def test_a_killed_export_into_a_shared_folder_leaves_the_old_files_and_the_others(plan_bytes, tmp_path, monkeypatch):
    # a folder with other files is not swapped: the set is written whole beside them, then moved in
    monkeypatch.chdir(tmp_path)
    argv, old, new = _export_sets(tmp_path, plan_bytes, False)
    (tmp_path / "out" / "notes.txt").write_text("mine\n")
    for point in ("write:2", "replace:1"):
        assert _child(tmp_path, point, *argv) == -signal.SIGKILL
        assert _files(tmp_path / "out") == {**old, "notes.txt": b"mine\n"}
    assert not _no_temp_files(tmp_path / "out")
    assert run(argv)[0] == 0
    assert _files(tmp_path / "out") == {**new, "notes.txt": b"mine\n"} and _no_temp_files(tmp_path)


def test_an_export_into_a_shared_folder_removes_the_older_sets_extra_file(plan_bytes, tmp_path, monkeypatch):
    """A re-planned export wrote nonuniform_tp.json; the next export of the plain plan into the
    same folder (with a file of the user's beside) must not leave it next to the new launch script."""
    monkeypatch.chdir(tmp_path)
    argv, _, new = _export_sets(tmp_path, plan_bytes, True)
    (tmp_path / "out" / "notes.txt").write_text("mine\n")
    assert run(argv)[0] == 0
    assert _files(tmp_path / "out") == {**new, "notes.txt": b"mine\n"} and _no_temp_files(tmp_path)


SIM = ["simulate", "plan.json", "--days", "1", "--trials", "2", "--strategies", "restart,ntp", "--plot", "plots"]


@pytest.mark.parametrize("point", ["write:2", "exchange"])  # one PNG of three drawn; all three
def test_a_killed_simulate_leaves_the_old_three_plots(plan_bytes, tmp_path, monkeypatch, point):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plan.json").write_bytes(plan_bytes)
    plots = tmp_path / "plots"
    plots.mkdir()
    old = {name: f"old {name}".encode() for name in ("throughput_over_time.png", "goodput_distribution.png",
                                                      "failed_fraction.png")}  # fmt: skip
    for name, data in old.items():
        (plots / name).write_bytes(data)
    assert _child(tmp_path, point, *SIM) == -signal.SIGKILL
    assert _files(plots) == old and not _no_temp_files(tmp_path)
    code, _, err = run(SIM)
    assert code == 0, err
    new = _files(plots)
    assert set(new) == set(old) and all(v.startswith(b"\x89PNG") for v in new.values()) and _no_temp_files(tmp_path)


@pytest.mark.parametrize("point", ["write:1", "write:2", "replace:1"])
def test_a_killed_profile_write_leaves_both_old_files(tmp_path, point):
    # `ntp profile` writes the profile and the cluster file with write_files (measuring takes minutes,
    # so the child calls it directly)
    (tmp_path / "sub").mkdir()
    names = ["profile.json", "sub/profile.cluster.json"]
    for name in names:
        (tmp_path / name).write_text("old " + name)
    assert _child(tmp_path, point, "write_files", *names) == -signal.SIGKILL
    assert all((tmp_path / n).read_text() == "old " + n for n in names)
    from ntp_planner.outputs import write_files

    write_files({tmp_path / n: "new " + n for n in names})
    assert all((tmp_path / n).read_text() == "new " + n for n in names) and _no_temp_files(tmp_path)


def test_a_killed_single_write_keeps_the_old_file_and_the_next_removes_its_temp(plan_bytes, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plan.json").write_bytes(plan_bytes)
    (tmp_path / "r.json").write_text("old\n")
    argv = ["replan", "plan.json", "--failed", "3", "-o", "r.json"]
    assert _child(tmp_path, "replace:1", *argv) == -signal.SIGKILL
    assert (tmp_path / "r.json").read_text() == "old\n" and not _no_temp_files(tmp_path)
    assert run(argv)[0] == 0
    assert json.loads((tmp_path / "r.json").read_text())["policy"] == "ntp" and _no_temp_files(tmp_path)


def test_a_live_writers_temp_files_are_kept(tmp_path):
    # only a dead writer's temp files are removed: this process's and a running one's stay
    from ntp_planner.outputs import remove_stale

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        mine, live, dead = (tmp_path / f"{TMP_PREFIX}{pid}.x" for pid in (os.getpid(), sleeper.pid, 2**22 + 1))
        for p in (mine, live, dead):
            p.write_text("")
        (tmp_path / ".ntp-tmpx.1.y").write_text("")  # not our name
        remove_stale(tmp_path)
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([mine.name, live.name, ".ntp-tmpx.1.y"])
    finally:
        sleeper.kill()
        sleeper.wait()
