"""Hostile failure traces (`ntp simulate --trace`): numbers in other digits than 0-9, ids past any
range, line breaks that editors do not count, and odd but valid files (a BOM, CRLF, comments between
rows, reordered columns, "-0", leading zeros) read as the same failures as a plain file."""

import json

import numpy as np
import pytest

from ntp_planner.failures.sim_config import SimConfig
from ntp_planner.failures.trace import Placement, format_trace, parse_trace, read_trace
from tests.ntp_planner.failures.test_trace import HEADER, _plan_128, run
from topologies import CLUSTERS, Cluster
from topologies.errors import InputError


@pytest.fixture(scope="module")
def plan_128():
    return _plan_128()


@pytest.fixture(scope="module")
def plan_file(plan_128, tmp_path_factory):
    path = tmp_path_factory.mktemp("hostile") / "plan.json"
    plan_128.save(path)
    return path


BAD = [
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
]


@pytest.mark.parametrize(("text", "message"), BAD)
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


@pytest.mark.parametrize("first_h", [1.0, 1.05, 1.1])
def test_the_failure_that_pauses_the_job_costs_no_recovery_in_either_half_of_its_bin(plan_file, tmp_path, first_h):
    """A fixed batch pauses from the bin where the first failure's state begins, rint(t / 10 min): 6 for
    1 h and 1.05 h, 7 for 1.1 h; its recovery (240 s) overlaps the pause and costs nothing, whichever half
    of the bin the failure falls in (bins were taken by floor for the stalls, by rint for the states:
    a failure at 1.1 h was charged 240 s). It runs 3,600 s or 4,200 s in cycles of 3,000 s of work and a
    60 s write: 3,000 + (540 - 60) = 3,480 s or 3,000 + (1,140 - 60) = 4,080 s of work."""
    trace = tmp_path / "pause.csv"
    rows = [f"{first_h + 0.5 * i},gpu:{i},hardware,100" for i in range(31)]
    trace.write_text("\n".join([HEADER, *rows]) + "\n")
    out = run(plan_file, "--days", "1", "--batch", "fixed", "--strategies", "dp-drop", "--checkpoint-interval", "50",
              "--checkpoint-write-s", "60", "--trace", trace, "--json")  # fmt: skip
    got = json.loads(out.stdout)["dp-drop"]
    ran_bins = 7 if first_h == 1.1 else 6
    assert got["hours_paused"] == pytest.approx((144 - ran_bins) / 6, rel=1e-12)
    assert got["goodput"] == pytest.approx({6: 3480, 7: 4080}[ran_bins] / 86400, rel=1e-12)
