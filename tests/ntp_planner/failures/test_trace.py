"""Failure traces (`ntp simulate --trace`, `--trace-out`): a hand-made trace against goodput worked
out by hand, the round trip of a simulated trial, bad traces refused in one sentence naming the
line, the synthetic Llama 3 sample, a fuzz of the reader, and hostile traces."""

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cost_models import MODELS, ParallelLayout, TrainingSpec
from ntp_planner.cli import app
from ntp_planner.failures.events import draw_events
from ntp_planner.failures.llama3_trace import LLAMA3_SHARES, SAMPLE_SEED, llama3_sample
from ntp_planner.failures.sim_config import SimConfig
from ntp_planner.failures.simulator import simulate
from ntp_planner.failures.trace import (
    LLAMA3_CAUSES,
    MAX_TRACE_BYTES,
    MAX_TRACE_ROWS,
    Placement,
    Recorder,
    format_trace,
    parse_trace,
    read_trace,
)
from ntp_planner.solver.planner import plan_from_layout
from topologies import CLUSTERS, Cluster
from topologies.errors import InputError

SAMPLE = Path(__file__).parents[3] / "examples" / "llama3_trace.csv"
HEADER = "time_h,unit,cause,repair_h"


def _plan_128():
    """llama3-8b at TP8 x DP16 on 128 H100s: 16 hosts of 8 GPUs, each host an NVLink domain and a replica."""
    layout = ParallelLayout(tp=8, dp=16, global_batch=128, sequence_parallel=True, distributed_optimizer=True)
    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=128)
    return plan_from_layout(MODELS["llama3-8b"], TrainingSpec(seq_len=4096, global_batch=128), cluster, layout)


@pytest.fixture(scope="module")
def plan_128():
    return _plan_128()


@pytest.fixture(scope="module")
def plan_file(plan_128, tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "plan.json"
    plan_128.save(path)
    return path


def run(*args, code=0):
    result = CliRunner().invoke(app, ["simulate", *map(str, args)])
    assert result.exit_code == code, result.output
    return result


def test_a_hand_made_trace_gives_the_goodput_worked_out_by_hand(plan_file, tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text(
        "# three failures of a 128-GPU job\n"
        f"{HEADER}\n"
        "-1,gpu:100,hardware,2\n"  # down at the start, back at 1 h
        "2.0,gpu:5,hardware,4.0\n"  # 2 h to 6 h
        "10.5,host:3,software,\n"  # 10.5 h, the software repair law: 3 h, back at 13.5 h
    )
    # a day in 144 bins of 10 min; checkpoint every 50 min, 10 min writes (cycles of 3,600 s), and a
    # final checkpoint at the end: of R seconds of running, floor(R / 3,600) x 3,000 s + max(0, rest - 600 s)
    out = run(plan_file, "--days", "1", "--checkpoint-interval", "50", "--checkpoint-write-s", "600",
              "--strategies", "restart,dp-drop", "--trace", trace, "--json")  # fmt: skip
    got = json.loads(out.stdout)
    # restart (I = 3,000 s, w = 600 s, D = 60 + 600 s), failures at 7,200 s and 37,800 s (the one before the
    # start is replaced hardware): 2 cycles kept (6,000 s); back at 7,860 s, 29,940 s to the next failure hold
    # 8 cycles (24,000 s); back at 38,460 s, the tail of 47,940 s holds 13 cycles and 1,140 s, of which
    # 540 s are work the final checkpoint saves (39,540 s)
    assert got["restart"]["goodput"] == pytest.approx((6000 + 24000 + 39540) / 86400, rel=1e-12)
    assert got["restart"]["interruptions"] == 2 and got["restart"]["restarts"] == 2
    # dp-drop stands still 60 + 180 s per failure and 180 s per rejoin (1 h, 6 h, 13.5 h): 1,020 s, and runs a
    # replica short (15/16) while a GPU or host is down: bins 0-6, 12-36 and 63-81, 48 of 144. It runs
    # 85,380 s: 23 cycles (69,000 s of work) and 2,580 s, of which 1,980 s are work: 70,980 s kept
    stall = 2 * 240 + 3 * 180
    assert got["dp-drop"]["goodput"] == pytest.approx(70980 / 86400, rel=1e-12)
    capacity = (1 - 48 / 144 / 16) * (1 - stall / 86400) * 70980 / 85380
    assert got["dp-drop"]["capacity_goodput"] == pytest.approx(capacity, rel=1e-12)
    assert got["dp-drop"]["reconfigurations"] == 2 + 3
    assert got["settings"]["trace"] == {
        "path": str(trace),
        "name": "t.csv",
        "failures": 2,  # during the run; the third was in repair at the start
        "in_repair_at_start": 1,
        "first_failure_h": 2.0,
        "last_failure_h": 10.5,
        "run_h": 24.0,
    }
    assert got["settings"]["start"] == "trace"


HAND_MADE = f"{HEADER}\n-1,gpu:100,hardware,2\n2.0,gpu:5,hardware,4.0\n10.5,host:3,software,\n"


def _words(text: str) -> str:
    return " ".join(text.split())  # rich wraps titles and footers at the terminal's width


def test_a_replays_table_says_it_is_one_run_of_the_trace(plan_file, tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text(HAND_MADE)
    out = _words(run(plan_file, "--days", "1", "--checkpoint-interval", "50", "--trace", trace).output)
    assert "Goodput over 1 days (24 h), replay of t.csv: 2 failures at 2.0-10.5 h" in out
    assert "failures from the trace, 1 in repair at the start, 0 spare domains;" in out
    assert out.endswith("spares needed: fewest spare domains that keep a fixed batch without pausing")
    for said_of_draws in ("trials", "[", "steady start", "per GPU-hour", "worst trial"):
        assert said_of_draws not in out, said_of_draws  # one run: no ranges, no rate, no --start
    # Daly's interval, when the run asks for it, comes from --failure-rate: the footer says so
    out = _words(run(plan_file, "--days", "1", "--failure-rate", "1e-4", "--trace", trace).output)
    assert "failures from the trace (Daly's interval for 0.0001 per GPU-hour), 1 in repair" in out


def test_a_replays_spares_sweep_says_it_is_one_run_of_the_trace(plan_file, tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text(HAND_MADE)
    out = _words(run(plan_file, "--days", "1", "--strategies", "ntp", "--spares", "0,8", "--trace", trace).output)
    assert "Spare domains over 1 days (24 h), replay of t.csv: 2 failures at 2.0-10.5 h, flexible batch" in out
    assert "failures from the trace (Daly's interval for 1.97e-05 per GPU-hour), 1 in repair at the start" in out
    assert "[" not in out and "trials" not in out and "steady start" not in out


@pytest.mark.parametrize(
    ("option", "why"),
    [
        (["--trials", "2"], "--trials 2 does not apply to --trace: a replay is one run of the trace's failures."),
        (["--start", "healthy"], "--start does not apply to --trace: the trace's negative times say what is in"),
        (["--failure-dist", "poisson"], "--failure-dist does not apply to --trace: the trace's times are the arrivals"),
        (["--weibull-shape", "0.7"], "--weibull-shape does not apply to --trace: the trace's times are the arrivals."),
        (["--hw-blast", "gpu"], "--hw-blast does not apply to --trace: each line's unit (gpu:G, host:H, domain:D)"),
        (["--sw-blast", "node"], "--sw-blast does not apply to --trace: each line's unit"),
        (["--lemon-fraction", "0"], "--lemon-fraction does not apply to --trace: the trace's units say which hosts"),
        (["--lemon-factor", "3"], "--lemon-factor does not apply to --trace: the trace's units say which hosts"),
    ],
)
def test_an_option_for_random_draws_is_refused_with_trace_naming_it(plan_file, tmp_path, option, why):
    trace = tmp_path / "t.csv"
    trace.write_text(HAND_MADE)
    out = run(plan_file, "--days", "1", "--trace", trace, *option, code=2)  # given, even at its default value
    assert out.output.startswith(f"error: {why}") and out.output.count("\n") == 1, out.output
    # without --trace it is the draws' option (with the draws it shapes: alone, simulate refuses it as idle)
    run(plan_file, "--days", "1", *option, *SHAPED_DRAWS.get(option[0], []))


SHAPED_DRAWS = {"--weibull-shape": ["--failure-dist", "weibull"], "--lemon-factor": ["--lemon-fraction", "0.1"]}


def test_trials_1_is_what_a_replay_is_and_accepted(plan_file, tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text(HAND_MADE)
    base = [plan_file, "--days", "1", "--trace", trace, "--json"]
    assert json.loads(run(*base, "--trials", "1").stdout) == json.loads(run(*base).stdout)


@pytest.mark.parametrize(
    ("first_h", "write_s", "work_s"), [(1.0, 600, 3000), (1.05, 60, 3480), (1.1, 60, 4080)]
)  # fmt: skip
def test_a_job_that_ran_an_hour_then_paused_keeps_that_hours_work(plan_file, tmp_path, first_h, write_s, work_s):
    """A fixed batch pauses from the first failure to the end; the 31 failures' recoveries (240 s
    each) all start in the pause, where the job waits for GPUs and loses nothing more to them. With a
    first failure at 1 h it ran 3,600 s, of which 3,000 s are kept work (no whole cycle of 3,600 s +
    600 s: 3,600 s less the final write of 600 s): time and capacity goodput are both 3,000 / 86,400.
    The pause begins in the bin where the first failure's state does, rint(t / 10 min): bin 6 for 1 h
    and 1.05 h, 7 for 1.1 h, and the first recovery costs nothing in either half of its bin (stalls
    were binned by floor, states by rint: one at 1.1 h was charged 240 s). With 60 s writes (cycles
    of 3,060 s) it keeps 3,000 + (540 - 60) = 3,480 s of 3,600 s, or 3,000 + (1,140 - 60) = 4,080 s
    of 4,200 s."""
    trace = tmp_path / "pause.csv"
    rows = [f"{first_h + 0.5 * i},gpu:{i},hardware,100" for i in range(31)]
    trace.write_text("\n".join([HEADER, *rows]) + "\n")
    out = run(plan_file, "--days", "1", "--batch", "fixed", "--strategies", "dp-drop", "--checkpoint-interval", "50",
              "--checkpoint-write-s", write_s, "--trace", trace, "--json")  # fmt: skip
    got = json.loads(out.stdout)["dp-drop"]
    ran_bins = 7 if first_h == 1.1 else 6
    assert got["hours_paused"] == pytest.approx((144 - ran_bins) / 6, rel=1e-12)
    assert got["goodput"] == pytest.approx(work_s / 86400, rel=1e-12)
    assert got["capacity_goodput"] == pytest.approx(work_s / 86400, rel=1e-12)


def test_a_stall_before_a_pause_is_charged_and_capacity_never_exceeds_time(plan_file, tmp_path):
    """One failure at 0.25 h that the job rides out at reduced size (no pause) costs its 240 s of
    detection and reconfiguration: it runs 86,160 s in cycles of 3,000 s of work and a 600 s write,
    23 of them (69,000 s of work) and 3,360 s, of which 2,760 s are work before the final write:
    71,760 s. Capacity goodput, the throughput (at most 1) over the time not stalled, is never
    above time goodput."""
    trace = tmp_path / "one.csv"
    trace.write_text(f"{HEADER}\n0.25,gpu:0,hardware,100\n")
    out = run(plan_file, "--days", "1", "--checkpoint-interval", "50", "--checkpoint-write-s", "600",
              "--trace", trace, "--json")  # fmt: skip
    for s in ("dp-drop", "ntp", "ntp-pw"):
        got = json.loads(out.stdout)[s]
        assert got["goodput"] == pytest.approx(71_760 / 86_400, rel=1e-12), s
        assert got["capacity_goodput"] <= got["goodput"] + 1e-12, s


def test_a_trace_without_failures_gives_every_strategy_the_same_goodput(plan_file, tmp_path):
    trace = tmp_path / "none.csv"
    trace.write_text(f"{HEADER}\n")
    got = json.loads(run(plan_file, "--days", "2", "--checkpoint-interval", "39.8", "--trace", trace, "--json").stdout)
    # 172,800 s of cycles of 2,388 + 300 s: 64 (152,832 s of work) and 768 s, 468 s of work then the final
    # write: 153,300 s (restart kept all 768 s, 0.8889; the others I / (I + w) = 0.8884)
    for s in ("restart", "dp-drop", "spares", "ntp", "ntp-pw"):
        assert got[s]["goodput"] == pytest.approx(153_300 / 172_800, rel=1e-12), s
    assert got["settings"]["trace"]["failures"] == 0


def test_trace_out_then_trace_gives_the_same_result(plan_file, tmp_path):
    """A run of one trial, written with --trace-out and replayed (another seed: nothing is drawn)."""
    out = tmp_path / "drawn.csv"
    base = ["--days", "4", "--failure-rate", "2e-3", "--hw-blast", "node", "--sw-blast", "domain", "--json"]
    original = json.loads(run(plan_file, *base, "--trials", "1", "--seed", "3", "--trace-out", out).stdout)
    replay = [x for x in base if x not in ("--hw-blast", "node", "--sw-blast", "domain")]  # the units say it
    replayed = json.loads(run(plan_file, *replay, "--trace", out, "--seed", "99").stdout)
    lines = [x for x in out.read_text().splitlines() if not x.startswith("#")]
    units = {x.split(",")[1].split(":")[0] for x in lines[1:]}
    assert units == {"host", "domain"} and len(lines) > 20  # hosts and domains both round-trip
    assert min(float(x.split(",")[0]) for x in lines[1:]) < 0  # as do failures still in repair at the start
    for s in ("restart", "dp-drop", "spares", "ntp", "ntp-pw"):
        assert replayed[s] == original[s], s


def test_trace_trial_k_writes_that_trials_draws(plan_128):
    cfg = SimConfig(days=3, trials=12, failure_rate_per_gpu_hour=1e-3)
    recorder = Recorder(7)
    simulate(plan_128, cfg, ["dp-drop"], np.random.default_rng(5), source=recorder)
    drawn = draw_events(cfg, 128, 8, np.random.default_rng(5))  # the simulator's first (and only) batch
    drawn = drawn.take(drawn.trial == 7)
    placement = Placement.of(plan_128.cluster.build())
    text = format_trace(recorder.kept, placement, cfg.classes)
    back = parse_trace(iter(text.splitlines()), placement, cfg, np.random.default_rng(0))
    order = np.argsort(drawn.start_h, kind="stable")
    assert back.start_h.tolist() == drawn.start_h[order].tolist() and back.start_h.size > 5
    np.testing.assert_allclose(back.end_h, drawn.end_h[order], rtol=1e-13)
    assert back.gpu.tolist() == drawn.gpu[order].tolist() and back.cause.tolist() == drawn.cause[order].tolist()


def test_missing_repairs_are_drawn_from_the_causes_law_with_the_seed(plan_128):
    placement, cfg = Placement.of(plan_128.cluster.build()), SimConfig(days=30)
    lines = [HEADER] + [f"{i},gpu:{i},{c}," for i, c in enumerate(["hardware", "gsp"] * 50)]
    ev = parse_trace(iter(lines), placement, cfg, np.random.default_rng(1))
    repair = ev.end_h - ev.start_h
    assert 72 <= repair.min() and repair.max() <= 120 and repair.std() > 5  # hardware: 3-5 days, uniform
    again = parse_trace(iter(lines), placement, cfg, np.random.default_rng(1))
    assert again.end_h.tolist() == ev.end_h.tolist()
    software = parse_trace(iter([HEADER, "1,gpu:0,nccl-watchdog,"]), placement, cfg, np.random.default_rng(1))
    assert (software.end_h - software.start_h).tolist() == [3.0]


BAD = [
    (f"{HEADER}\n5,gpu:1,hardware,1\n4,gpu:2,hardware,1\n", "line 3: time 4 h comes before the previous line's 5 h"),
    (f"{HEADER}\n1,gpu:128,hardware,1\n", "line 2: gpu:128 is not in the plan, whose job has GPUs 0..127"),
    (f"{HEADER}\n1,host:16,hardware,1\n", "line 2: host:16 is not in the plan, whose job has hosts 0..15"),
    (f"{HEADER}\n1,domain:99,hardware,1\n", "line 2: domain:99 is not in the plan, whose job has domains 0..15"),
    (f"{HEADER}\n1,rack:1,hardware,1\n", "line 2: unit 'rack:1' must be gpu:G, host:H or domain:D"),
    (f"# c\n{HEADER}\n1,gpu:1,hardware,-2\n", "line 3: repair_h -2 must be 0 to 8760 hours"),
    (f"{HEADER}\nnan,gpu:1,hardware,1\n", "line 2: time_h 'nan' is not a finite number"),
    (f"{HEADER}\n1,gpu:1,hardware,inf\n", "line 2: repair_h 'inf' is not a finite number"),
    (f"{HEADER}\n1e400,gpu:1,hardware,1\n", "line 2: time_h '1e400' is not a finite number"),
    (f"{HEADER}\n1,gpu:1,cosmic-ray,1\n", "line 2: cause 'cosmic-ray' is not a failure class here"),
    (f"{HEADER}\n1,gpu:1\n", "line 2 has 2 fields; the header names 4"),
    ("time_h,unit\n1,gpu:1\n", "line 1: the header has missing columns ['cause']"),
    ("time_h,unit,cause,where\n", "line 1: the header has unknown columns ['where']"),
    (f"{HEADER}\n97,gpu:1,hardware,1\n", "line 2: time 97 h is outside the run"),
    (f"{HEADER}\n-9000,gpu:1,hardware,1\n", "line 2: time -9000 h is outside the run"),
    ("# only a comment\n", "has no header line"),
    (f"{HEADER}\n" + "x" * 300 + "\n", "line 2 has 300 characters"),
]


@pytest.mark.parametrize(("text", "message"), BAD)
def test_a_bad_trace_is_refused_in_one_sentence_naming_the_line(plan_file, tmp_path, text, message):
    trace = tmp_path / "bad.csv"
    trace.write_text(text)
    out = run(plan_file, "--days", "4", "--trace", trace, code=2)
    assert out.output.count("\n") == 1 and "Traceback" not in out.output
    assert out.output.startswith(f"error: trace {trace} ") and message in out.output, out.output


def test_a_bad_trace_under_json_is_an_error_object(plan_file, tmp_path):
    trace = tmp_path / "bad.csv"
    trace.write_text(BAD[0][0])
    error = json.loads(run(plan_file, "--days", "4", "--trace", trace, "--json", code=2).stdout)["error"]
    assert error["code"] == 2 and error["kind"] == "input" and BAD[0][1] in error["message"]


def test_ten_million_rows_are_refused_after_the_cap_not_read_whole(plan_128):
    consumed = itertools.count()
    lines = (f"{next(consumed) * 1e-5:.5f},gpu:1,software,0.001" for _ in range(10**7))
    placement = Placement.of(plan_128.cluster.build())
    message = f"line {MAX_TRACE_ROWS + 2}: the trace holds more than {MAX_TRACE_ROWS:,} failures"
    with pytest.raises(InputError, match=message):
        parse_trace(itertools.chain([HEADER], lines), placement, SimConfig(days=30), np.random.default_rng(0))
    assert next(consumed) == MAX_TRACE_ROWS + 1  # it stopped reading at the first row past the cap


def test_a_file_of_ten_million_rows_is_refused_before_it_is_read(plan_file, tmp_path):
    trace = tmp_path / "huge.csv"
    with trace.open("wb") as f:
        f.truncate(10**7 * 30)  # sparse: 300 MB that take no disk
    out = run(plan_file, "--days", "4", "--trace", trace, "--json", code=2)
    message = json.loads(out.stdout)["error"]["message"]
    assert f"holds 3e+08 bytes, more than the {MAX_TRACE_BYTES:,} a trace can need" in message


def test_trace_trial_must_be_a_trial_of_the_run(plan_file, tmp_path):
    out = run(plan_file, "--trials", "3", "--trace-out", tmp_path / "t.csv", "--trace-trial", "3", code=2)
    assert "--trace-trial 3 is not a trial of this run: --trials 3 numbers them 0..2" in out.output
    out = run("-", "--trace", "-", code=2)  # the plan from standard input too (cli.errors.GuardedCommand)
    assert "plan_file and --trace are both - (standard input), which holds one file; give one" in out.output
    out = run(plan_file, "--trials", "3", "--trace-trial", "2", "--json", code=2)  # no --trace-out: it would do nothing
    message = "--trace-trial 2 picks the trial --trace-out writes; give --trace-out FILE too."
    assert json.loads(out.stdout)["error"]["message"] == message
    out = run(plan_file, "--trace-out", plan_file, code=2)
    assert "--trace-out" in out.output and not (tmp_path / "t.csv").exists()


def test_the_sample_is_the_seeded_draw_from_llama3s_statistics():
    text = SAMPLE.read_text()
    assert text == llama3_sample(np.random.default_rng(SAMPLE_SEED))
    assert text.startswith("# SYNTHETIC, not a real log")
    rows = [x.split(",") for x in text.splitlines() if not x.startswith("#")][1:]
    assert len(rows) == 419 and max(float(r[0]) for r in rows) < 54 * 24
    assert sum(LLAMA3_SHARES.values()) == pytest.approx(100)
    hardware = sum(LLAMA3_CAUSES[r[2]] == "hardware" for r in rows) / 419
    assert abs(hardware - 0.764) < 3 * math.sqrt(0.764 * 0.236 / 419)  # the mapped share, within 3 sigma


def test_the_readme_example_replays_the_sample(tmp_path):
    """ntp480 on 16,384 B200s (the README's plan at half size, as many GPUs as Llama 3 had)."""
    layout = ParallelLayout(tp=32, pp=8, dp=64, global_batch=512, sequence_parallel=True,
                            distributed_optimizer=True, recompute="full")  # fmt: skip
    cluster = Cluster(spec=CLUSTERS["b200-nvl32"], num_gpus=16384)
    plan = plan_from_layout(MODELS["ntp-480b"], TrainingSpec(seq_len=16384, global_batch=512), cluster, layout)
    plan.save(tmp_path / "p.json")
    got = json.loads(run(tmp_path / "p.json", "--days", "54", "--trace", SAMPLE, "--json").stdout)
    assert got["restart"]["interruptions"] == 419 and got["settings"]["trace"]["failures"] == 419
    assert got["restart"]["goodput"] < got["dp-drop"]["goodput"] == got["ntp"]["goodput"]
    assert got["dp-drop"]["capacity_goodput"] < got["ntp"]["capacity_goodput"] < got["ntp-pw"]["capacity_goodput"]


cells = st.one_of(
    st.sampled_from(["0", "1.5", "-3", "1e9", "nan", "-inf", "", " ", "gpu:0", "gpu:127", "gpu:128", "host:15",
                     "host:-1", "domain:0", "domain:16", "hardware", "software", "hbm3", "HBM3", "x:1", "gpu:1e3"]),
    st.text(max_size=8),
)  # fmt: skip
FUZZ = settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(
    header=st.sampled_from([HEADER, "unit,time_h,cause", "time_h,unit,cause,repair_h,x", "time_h,,cause"]),
    rows=st.lists(st.lists(cells, min_size=2, max_size=5).map(",".join), max_size=6),
)
def test_the_reader_returns_valid_events_or_refuses_naming_a_line(header, rows):
    placement = Placement.of(_PLAN_CLUSTER)
    cfg = SimConfig(days=2)
    try:
        ev = parse_trace(iter([header, *rows]), placement, cfg, np.random.default_rng(0))
    except InputError as exc:
        assert "line " in str(exc) and "\n" not in str(exc)
        return
    assert np.isfinite(ev.start_h).all() and np.isfinite(ev.end_h).all()
    assert (np.diff(ev.start_h) >= 0).all() and (ev.start_h < 48).all() and (ev.end_h > 0).all()
    assert (ev.end_h >= ev.start_h).all() and ((0 <= ev.gpu) & (ev.gpu < 128)).all()


_PLAN_CLUSTER = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=128)


# Hostile traces: numbers in other digits than 0-9, ids past any range, line breaks that editors do
# not count, and odd but valid files (a BOM, CRLF, comments between rows, reordered columns, "-0",
# leading zeros) read as the same failures as a plain file.

HOSTILE = [
    # float() reads full-width and Arabic-Indic digits and underscores; a trace is ASCII decimals
    (f"{HEADER}\n\uff11,gpu:1,hardware,1\n", "line 2: time_h '\uff11' is not a decimal number in the digits 0-9"),
    (f"{HEADER}\n1,gpu:1,hardware,\u0662\n", "line 2: repair_h '\u0662' is not a decimal number"),
    (f"{HEADER}\n1_0,gpu:1,hardware,1\n", "line 2: time_h '1_0' is not a decimal number"),
    # a whole number too long for the old 12-digit cap is out of the plan's range, not "not a whole number"
    (f"{HEADER}\n1,gpu:99999999999999999999,hardware,1\n", "line 2: gpu:99999999999999999999 is not in the plan"),
    # a form feed or U+2028 is not a line break: the next line is line 3, as an editor numbers it
    (f"{HEADER}\n1,gpu:1,hardware,1\x0c\n2,gpu:200,hardware,1\n", "line 3: gpu:200 is not in the plan"),
    (f"{HEADER}\n1,gpu:1,hardware,1\u20282,gpu:2,hardware,1\n", "line 2 has 7 fields; the header names 4"),
    (f"{HEADER}\r\n1,gpu:1,hardware,1\r\n2,gpu:200,hardware,1\r\n", "line 3: gpu:200 is not in the plan"),
    (f"{HEADER}\r1,gpu:1,hardware,1\r2,gpu:200,hardware,1\r", "line 3: gpu:200 is not in the plan"),
    ("time_h,unit,cause,cause\n1,gpu:1,hardware,hardware\n", "line 1: the header has ['cause'] twice; it must name"),
    (f"# x\n{HEADER},\n1,gpu:1,hardware,1,\n", "line 2: the header has an empty column name (a trailing comma?)"),
]


@pytest.mark.parametrize(("text", "message"), HOSTILE)
def test_a_hostile_trace_is_refused_in_one_sentence_naming_the_line(plan_file, tmp_path, text, message):
    trace = tmp_path / "bad.csv"
    trace.write_bytes(text.encode())
    out = run(plan_file, "--days", "4", "--trace", trace, code=2)
    assert out.output.count("\n") == 1 and "Traceback" not in out.output
    assert out.output.startswith(f"error: trace {trace} ") and message in out.output, out.output


PLAIN = f"{HEADER}\n-1,gpu:100,hardware,2\n0,host:3,software,0.5\n2.5,domain:7,hardware,4\n"
ODD = (
    "\ufeff# a BOM, CRLF, blank lines, comments between rows, reordered columns\r\n"
    "\r\n  cause , time_h,repair_h ,unit  \r\n"
    "hardware,-1.0,2,gpu:0100\r\n# a comment\r\n\r\n"
    "software,-0,0.50,host:03\r\n"
    "   # an indented comment\r\n"
    "hardware,+2.5e0,4.,domain:007\r\n"
)


def test_an_odd_but_valid_trace_reads_as_the_plain_one_and_round_trips(plan_128, tmp_path):
    placement, cfg = Placement.of(plan_128.cluster.build()), SimConfig(days=1)
    files = {}
    for name, text in (("plain", PLAIN), ("odd", ODD)):
        files[name] = tmp_path / f"{name}.csv"
        files[name].write_bytes(text.encode())
    plain, odd = (read_trace(files[k], placement, cfg, np.random.default_rng(0)) for k in ("plain", "odd"))
    assert plain.start_h.tolist() == odd.start_h.tolist() == [-1.0, 0.0, 2.5]
    fields = ("end_h", "gpu", "blast", "cause")  # host 3 starts at GPU 24, domain 7 at 56 (8 GPUs each)
    assert [getattr(plain, f).tolist() for f in fields] == [[1.0, 0.5, 6.5], [100, 24, 56], [0, 1, 2], [0, 1, 0]]
    assert [getattr(odd, f).tolist() for f in fields] == [getattr(plain, f).tolist() for f in fields]
    text = format_trace(plain, placement, cfg.classes)
    again = parse_trace(iter(text.splitlines()), placement, cfg, np.random.default_rng(1))
    assert format_trace(again, placement, cfg.classes) == text
    assert "-1.0,gpu:100,hardware,2.0\n0.0,host:3,software,0.5\n2.5,domain:7,hardware,4.0\n" in text


def test_a_replay_of_a_trace_with_a_long_path_writes_a_trace_that_reads_back(plan_file, tmp_path):
    # --trace-out's note names the replayed file: a path of 250 characters made a comment line the
    # reader refused as longer than a trace line's 200
    folder = tmp_path / ("d" * 120) / ("e" * 100)
    folder.mkdir(parents=True)
    trace, again = folder / "in.csv", tmp_path / "again.csv"
    trace.write_text(f"# {'c' * 300}\n{HEADER}\n1,gpu:5,hardware,2\n")
    first = run(plan_file, "--days", "1", "--trace", trace, "--trace-out", again, "--json")
    assert len(str(trace)) > 200 and any(len(line) > 200 for line in again.read_text().splitlines())
    second = run(plan_file, "--days", "1", "--trace", again, "--json")
    drop = ("settings",)  # the trace's path differs
    assert {k: v for k, v in json.loads(first.stdout).items() if k not in drop} == {
        k: v for k, v in json.loads(second.stdout).items() if k not in drop
    }


def test_a_note_with_line_breaks_stays_one_comment_line(plan_128):
    # the note names the replayed file, and a file name may hold a line break
    placement, cfg = Placement.of(plan_128.cluster.build()), SimConfig(days=1)
    ev = parse_trace(iter([HEADER, "1,gpu:5,hardware,2"]), placement, cfg, np.random.default_rng(0))
    text = format_trace(ev, placement, cfg.classes, note="replay of a\nb\r\nc\rd.csv")
    assert "# replay of a b c d.csv\ntime_h," in text
    again = parse_trace(iter(text.splitlines()), placement, cfg, np.random.default_rng(1))
    assert text.endswith(format_trace(again, placement, cfg.classes).split("\n", 2)[2])  # the rows past the header


def test_a_host_of_idle_gpus_in_a_partly_used_domain_is_refused_naming_why():
    # 128 GPUs using 64 of each 72-GPU domain, 4 a host: hosts 16 and 17 hold domain 0's 8 idle GPUs
    placement = Placement.of(Cluster(spec=CLUSTERS["gb200-nvl72"], num_gpus=128, gpus_per_domain=64))
    assert placement.unit("host:18", "t") == (64, 1) and placement.name(64, 1) == "host:18"
    assert placement.unit("domain:1", "t") == (64, 2) and placement.name(127, 2) == "domain:1"
    for host in ("host:16", "host:17"):
        with pytest.raises(InputError, match=f"t: {host} is not in the plan, whose job has hosts 0..33 "
                           r"\(that host holds only idle GPUs\)"):  # fmt: skip
            placement.unit(host, "t")
    with pytest.raises(InputError, match=r"t: host:34 is not in the plan, whose job has hosts 0..33$"):
        placement.unit("host:34", "t")
