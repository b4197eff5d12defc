"""`ntp capacity`'s options at and past their bounds: every bad value ends in one sentence with
exit code 2 (3 when no layout fits anywhere), refused before any work that could eat the
machine; the option parsers fuzzed with hypothesis; the search's memory and work bounds by hand."""

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from ntp_planner.cli import app
from ntp_planner.cli.capacity import (
    MAX_COUNTS,
    MAX_USD_PER_GPU_HOUR,
    _spares,
    gpu_hour_prices,
    parse_gpus,
    result_json,
)
from ntp_planner.cli.options import MAX_GPUS
from ntp_planner.failures import capacity, capacity_job
from ntp_planner.failures.capacity_spec import Candidate, CapacityResult, CapacitySpec, check_workload
from topologies import resolve_cluster_spec
from topologies.errors import InputError

runner = CliRunner()
BASE = ["capacity", "-m", "llama3-8b", "--tokens", "1e11", "--deadline-days", "1.5", "-c", "dgx-h100",
        "--gpus", "64", "--spares", "0", "--strategies", "ntp", "--trials", "8", "--seq-len", "4096",
        "--global-batch", "256"]  # fmt: skip
FUZZ = settings(max_examples=150, deadline=None)


def _refused(args: list[str], code: int = 2) -> str:
    """The one-sentence error of ``args``, checked on stderr and as --json's object on stdout."""
    plain, as_json = runner.invoke(app, args), runner.invoke(app, [*args, "--json"])
    assert plain.exit_code == as_json.exit_code == code, plain.output
    line = plain.stderr.strip()
    assert line.startswith("error: ") and "\n" not in line and "Traceback" not in plain.output
    assert plain.stdout == ""
    error = json.loads(as_json.stdout)["error"]
    assert error["code"] == code and error["message"] == line.removeprefix("error: ")
    return line


def _with(**change: str) -> list[str]:
    args = list(BASE)
    for option, value in change.items():
        flag = "--" + option.replace("_", "-")
        args[args.index(flag) + 1] = value
    return args


@pytest.mark.parametrize(
    "args, says",
    [
        (_with(gpus="0-0"), "each count between 1 and 1,000,000"),
        # counted, not built: a range of 10^12 counts would take 40 GB as a tuple
        (_with(gpus="1-1000000000000"), "(1,000,000,000,000 - 1) / 1 + 1 = 1,000,000,000,000 GPU counts; give at most"),
        (_with(gpus="64-128:0"), "must be a range like"),
        (_with(spares="0,0"), "distinct whole numbers"),
        (_with(tokens="1e-300"), "global batch(256) x seq len(4,096) = 1,048,576 tokens"),
        ([*BASE, "--gpu-hour-cost", "dgx-h100=2", "--gpu-hour-cost", "dgx-h100=3"], "prices dgx-h100 twice (2 and 3)"),
        ([*BASE, "--gpu-hour-cost", "=nan"], "must be CLUSTER=USD"),
        ([*BASE, "--gpu-hour-cost", "dgx-h100=inf"], "must be CLUSTER=USD"),
        ([*BASE, "--gpu-hour-cost", "a=b"], "must be CLUSTER=USD"),
        # 3 clusters x 8 counts x 4 spares x 5 strategies x 100,000 trials x 3,648 bins
        (
            [*_with(deadline_days="60", gpus="64-512", spares="0,1,2,4", trials="100000"), "-c",
             "dgx-h100,dgx-b200,gb200-nvl72", "--strategies", "restart,dp-drop,spares,ntp,ntp-pw"],
            "trials(100,000) x 3,648 time bins of 1800 s to the deadline = 3.65e+08 is over 2e+07",
        ),
        (
            _with(trials="20000", deadline_days="10", gpus="64-1024:64", strategies="restart,ntp",
                  spares="0,1,2,4,8,16"),
            "192 candidates (1 clusters x 16 GPU counts x 6 spare counts x 2 strategies) x trials(20,000) x 648 "
            "time bins = 2.49e+09 is over 2e+09",
        ),
    ],
)  # fmt: skip
def test_bad_values_are_refused_up_front_in_one_sentence(args, says):
    start = time.perf_counter()
    assert says in _refused(args)
    assert time.perf_counter() - start < 5  # nothing planned, simulated or materialised first


def test_no_layout_fitting_any_count_exits_3_like_ntp_plan():
    line = _refused(["capacity", "-m", "llama3.1-405b", *_with(gpus="8,16")[3:]], 3)
    assert "llama3.1-405b fits no layout on 8 x H100-SXM" in line


def test_the_pool_of_failures_is_bounded_with_the_arithmetic():
    # 1.97e-5 x 32,768 GPUs x (720 h chunk + 120 h warm-up) x 100,000 trials = 5.43e7 > 5.4e7
    spec = CapacitySpec(tokens=1e11, deadline_days=1, confidence=0.9, gpus=(32_768,), spares=(0,), trials=100_000)
    with pytest.raises(InputError, match=r"x 32,768 GPUs x 840 h .* x trials\(100,000\) = 5.43e\+07 failures"):
        check_workload(spec)
    check_workload(spec.model_copy(update={"trials": 90_000}))  # 4.9e7: drawn in ~4 GB


@given(st.text(alphabet="0123456789-,: x", max_size=40))
@FUZZ
def test_any_gpus_text_gives_at_most_64_counts_in_bounds_or_one_input_error(text):
    try:
        counts = parse_gpus(text)
    except InputError as exc:
        assert "\n" not in str(exc) and str(exc).startswith("--gpus ")
        return
    assert 1 <= len(counts) <= MAX_COUNTS and len(set(counts)) == len(counts)
    assert all(1 <= n <= MAX_GPUS for n in counts)


@given(st.integers(1, 10**15), st.integers(0, 10**15), st.integers(-5, 10**6))
@FUZZ
def test_a_range_is_multiples_of_its_step_from_its_start(lo, span, step):
    text = f"{lo}-{lo + span}" + (f":{step}" if step else "")
    expected = range(lo, lo + span + 1, step or lo) if (step or lo) > 0 else range(0)
    if 1 <= len(expected) <= MAX_COUNTS and expected[-1] <= MAX_GPUS:  # the end need not be a count
        assert parse_gpus(text) == tuple(expected)
    else:
        with pytest.raises(InputError):
            parse_gpus(text)


@given(st.lists(st.integers(-3, 10_005), max_size=6))
@FUZZ
def test_spares_are_distinct_and_in_bounds_or_refused(pools):
    text = ",".join(map(str, pools))
    if pools and len(set(pools)) == len(pools) and all(0 <= k <= 10_000 for k in pools):
        assert _spares(text) == tuple(pools)
    else:
        with pytest.raises(InputError):
            _spares(text)


SPECS = {name: resolve_cluster_spec(name) for name in ("dgx-h100", "dgx-b300")}  # B300: no default price
PRICE_TEXT = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr), st.text(alphabet="0123456789.e-+naif", max_size=8)
)


@given(
    st.lists(
        st.tuples(st.sampled_from(["dgx-h100", "dgx-b300", "", "x"]), st.sampled_from(["=", ""]), PRICE_TEXT),
        max_size=3,
    )
)
@FUZZ
def test_prices_are_given_once_per_searched_cluster_positive_and_finite(items):  # fmt: skip
    given_ = ["".join(item) for item in items]
    try:
        prices, sources = gpu_hour_prices(SPECS, given_)
    except InputError as exc:
        assert "\n" not in str(exc)
        return
    assert set(prices) == set(SPECS) and all(0 < usd <= MAX_USD_PER_GPU_HOUR for usd in prices.values())
    assert any(i.startswith("dgx-b300=") for i in given_)  # B300 has no default: priced only when given
    for name, usd in prices.items():
        mine = [float(i.rpartition("=")[2]) for i in given_ if i.rpartition("=")[0] == name]
        assert len(set(mine)) <= 1 and usd == (mine[0] if mine else 49.24 / 8)


def test_the_failures_held_for_later_candidates_are_bounded(monkeypatch):
    """Oldest jobs first lose their failures once all hold more than MAX_CACHED_CELLS trial-bins;
    the job just simulated keeps its own whatever its size."""

    class Failures:
        def __init__(self, cells):
            self.stall_s = type("A", (), {"size": cells})()

    def job(*cells):
        return capacity_job.Job("c", 8, 8, None, failures={h: Failures(c) for h, c in enumerate(cells)})

    monkeypatch.setattr(capacity, "MAX_CACHED_CELLS", 100)
    jobs = [job(30, 20), job(40), job(50)]  # 50 + 40 + 50 = 140 > 100: the first goes
    kept = capacity._forget_failures(jobs)
    assert kept == jobs[1:] and not jobs[0].failures and len(jobs[1].failures) == 1
    huge = job(1000)
    assert capacity._forget_failures([*kept, huge]) == [huge] and len(huge.failures) == 1


def test_a_candidate_with_a_trial_never_done_writes_null_not_infinity():
    inf = float("inf")
    c = Candidate(
        cluster="dgx-h100", gpus=64, spares=0, strategy="restart", paid_gpus=64, usd_per_gpu_hour=6.155,
        p50_days=2.0, p90_days=inf, p_deadline=0.85, gpu_hours=inf, cost_usd=inf, cost_usd_p90=inf, reason="slow",
    )  # fmt: skip
    out = result_json(CapacityResult(candidates=[c], cheapest=None, front=[], simulated=1))
    text = json.dumps(out, allow_nan=False)  # raises on inf
    assert json.loads(text)["candidates"][0]["cost_usd"] is None and out["candidates"][0]["p50_days"] == 2.0


def test_a_cluster_file_whose_path_holds_an_equals_sign_is_priced_by_its_path():
    specs = {"/data/a=b/cluster.json": SPECS["dgx-b300"]}
    prices, sources = gpu_hour_prices(specs, ["/data/a=b/cluster.json=3.5"])
    assert (
        prices == {"/data/a=b/cluster.json": 3.5} and sources["/data/a=b/cluster.json"]["source"] == "--gpu-hour-cost"
    )


def test_a_price_s_cluster_name_is_stripped_like_the_clusters_option():
    assert gpu_hour_prices({"dgx-b300": SPECS["dgx-b300"]}, [" dgx-b300 = 7 "])[0] == {"dgx-b300": 7.0}


def test_a_validation_error_inside_the_planner_is_a_bug_not_a_candidate_s_reason(monkeypatch):
    """Only the cluster's construction is the user's input; pydantic refusing a value the planner
    built itself propagates (the CLI reports it), where it used to read as 'no layout fits'."""
    from pydantic import BaseModel, ValidationError

    from cost_models import TrainingSpec, resolve_model
    from ntp_planner.solver import planner

    class Internal(BaseModel):
        x: int

    def broken(*args, **kwargs):
        Internal(x="not a number")

    monkeypatch.setattr(planner, "make_plan", broken)
    model, training = resolve_model("llama3-8b"), TrainingSpec(seq_len=4096, global_batch=256)
    with pytest.raises(ValidationError, match="Internal"):
        capacity_job.plan_grid(model, training, {"dgx-h100": SPECS["dgx-h100"]}, (12, 64))
