"""Property-based checks of inputs that lie or overflow: hand-edited plans and re-plans, HF
config values of the wrong type, numeric options at and past their bounds (issue 22).

A plan or re-plan edited at random is refused in one sentence, or it loads and still proves what
it claims: the hash of its inputs, a prediction a step can have, a rank map that matches its
degrees. A numeric option past its bound exits 2 with one line naming the option; at its bound
it runs or is refused the same way; no output holds nan or inf. The draws are derandomized.
"""

from __future__ import annotations

import io
import json
import math
import re
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from cost_models.hf_config import model_from_hf_config
from ntp_planner.cli import main
from ntp_planner.plan import Plan, inputs_hash
from ntp_planner.replan_result import ReplanResult
from topologies.errors import InputError

FROZEN = Path(__file__).parent / "plans"
FUZZ = settings(
    max_examples=80,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
INPUTS = ("model", "training", "cluster", "layout")
NOT_FINITE = re.compile(r"\b(nan|inf)\b|nan%", re.IGNORECASE)

values = st.one_of(
    st.integers(min_value=-(10**20), max_value=10**20),
    st.sampled_from([0, -1, 1, 2, 3, 7, 8, 64, 2**63, 0.5, 5.0, -0.5, 1e308, 1e-320]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.sampled_from(["banana", "", "bf16", "fp8", "ntp", "dropped", "healthy", "goodput", "4096", "false"]),
    st.lists(st.integers(-2, 70), max_size=3),
)


def run(args: list) -> tuple[int, str, str]:
    """``ntp args`` through the real entry point, in this process: (exit code, stdout, stderr)."""
    out, err, argv = io.StringIO(), io.StringIO(), sys.argv
    sys.argv = ["ntp", *map(str, args)]
    try:
        with redirect_stdout(out), redirect_stderr(err):
            try:
                main()
                code = 0
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    finally:
        sys.argv = argv
    return code, out.getvalue(), err.getvalue()


def check(args: list) -> tuple[int, str]:
    """Run ``ntp args``: exit 0, or exit 2 with one ``error:`` line and no traceback; (code, stdout)."""
    code, out, err = run(args)
    assert "Traceback" not in out + err and code in (0, 2, 3), (args, code, (out + err)[-2000:])
    if code == 2:
        assert err.strip().startswith("error: ") and len(err.strip().splitlines()) == 1, (args, err[-2000:])
    return code, out


def _leaves(data, path=()):
    """Paths of every scalar (number, string, bool, null) in a JSON tree, lists included."""
    if isinstance(data, dict):
        return [p for k, v in data.items() for p in _leaves(v, (*path, k))]
    if isinstance(data, list):
        return [path] + [p for i, v in enumerate(data) for p in _leaves(v, (*path, i))]
    return [path]


def _set(data, path, value):
    data = json.loads(json.dumps(data))
    *parents, last = path
    node = data
    for key in parents:
        node = node[key]
    node[last] = value
    return data


def _finite_positive(x) -> bool:
    return math.isfinite(x) and x > 0


# ---- hand-edited plans -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def plan_data():
    return json.loads((FROZEN / "ntp_replanned.json").read_text())


@FUZZ
@given(data=st.data(), value=values)
def test_an_edited_plan_is_refused_or_still_proves_its_prediction(plan_data, tmp_path, data, value):
    path = data.draw(st.sampled_from(_leaves(plan_data)))
    file = tmp_path / "plan.json"
    file.write_text(json.dumps(_set(plan_data, path, value)))
    try:
        plan = Plan.load(file)
    except InputError as exc:
        assert "\n" not in str(exc) and str(file) in str(exc), str(exc)
        return
    # it loaded: its inputs are those it was predicted from, and the prediction is one a step can have
    assert inputs_hash(plan.model, plan.training, plan.cluster, plan.layout) == plan_data["inputs_hash"], path
    if path[0] in INPUTS:  # an input edit loads only when it changes nothing (4096 -> 4096.0)
        for part in INPUTS:
            now = getattr(plan, part)
            assert now == type(now).model_validate(plan_data[part]), (path, value)
    p = plan.predicted
    assert 0 < p.mfu <= 1 and 0 < p.mfu_causal <= 1, (path, value)
    assert all(_finite_positive(x) for x in [p.step_time_s, p.tokens_per_s, *p.stage_time_s]), (path, value)
    assert len(p.stage_time_s) == len(p.stage_memory_bytes) == plan.layout.pp, (path, value)
    assert plan.objective in ("step-time", "goodput") and plan.source in ("search", "user")


# ---- hand-edited re-plans ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def replan_pair():
    return Plan.load(FROZEN / "ntp_replanned.json"), json.loads((FROZEN / "ntp_replanned.replan.json").read_text())


def _rank_counts(plan: Plan, rank_to_gpu: list) -> list[int]:
    """GPUs placed per replica, counted from the rank map: rank r belongs to replica
    (r // tp) % dp in this plan's order (tp fastest, then dp, then pp; cp = 1)."""
    lay = plan.layout
    counts = [0] * lay.dp
    for rank, gpu in enumerate(rank_to_gpu):
        counts[(rank // lay.tp) % lay.dp] += gpu is not None
    return counts


@FUZZ
@given(data=st.data(), value=values)
def test_an_edited_re_plan_is_refused_or_still_consistent(replan_pair, data, value):
    plan, original = replan_pair
    path = data.draw(st.sampled_from(_leaves(original)))
    edited = _set(original, path, value)
    try:
        result = ReplanResult.model_validate(edited)
        result.check_against(plan)
    except (ValidationError, InputError) as exc:
        text = str(exc) if isinstance(exc, InputError) else exc.errors()[0]["msg"]
        assert text and "\n" not in text
        return
    # accepted: what it says holds, computed here from its own fields
    assert result.plan_hash == plan.inputs_hash
    assert 0 <= result.throughput_relative <= 1 and math.isfinite(result.healthy_step_time_s)
    if not result.paused:
        assert result.throughput_relative == pytest.approx(result.global_batch_reached / result.global_batch_target)
    placed = [g for g in result.rank_to_gpu if g is not None]
    assert len(set(placed)) == len(placed) and all(0 <= g < plan.cluster.num_gpus for g in placed)
    assert _rank_counts(plan, result.rank_to_gpu) == [x.gpus_used for x in result.replicas], (path, value)
    for x in result.replicas:
        assert all(0 <= w <= 2.0 for w in x.power) and len(x.power) == plan.layout.pp
        if x.status == "dropped":
            assert x.gpus_used == 0 and not any(x.stage_tp)
        else:
            assert min(x.stage_tp) >= 1 and x.gpus_used <= sum(x.stage_tp) * plan.layout.cp


def test_the_rank_count_helper_matches_the_committed_re_plan(replan_pair):
    """The helper above is right on the committed pair (replica 3 lost GPUs 3 and 12: 7 + 7)."""
    plan, original = replan_pair
    assert _rank_counts(plan, original["rank_to_gpu"]) == [16, 16, 16, 14]


# ---- HF values of the wrong type ---------------------------------------------------------------
LLAMA = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "hidden_act": "silu",
    "rope_theta": 500000.0,
}
MOE = {**LLAMA, "n_routed_experts": 64, "moe_intermediate_size": 1408, "num_experts_per_tok": 6}
NUMBER_KEYS = [*(k for k in LLAMA if k not in ("hidden_act", "rope_theta")), "head_dim", "attention_dropout"]
MOE_NUMBER_KEYS = ["n_routed_experts", "moe_intermediate_size", "num_experts_per_tok", "first_k_dense_replace"]
FLAG_KEYS = ["tie_word_embeddings", "attention_bias"]


@FUZZ
@given(
    key=st.sampled_from([*NUMBER_KEYS, *MOE_NUMBER_KEYS]),
    value=st.one_of(st.booleans(), st.text(max_size=6), st.integers(1, 10**4).map(str)),
)
def test_a_string_or_boolean_where_a_number_belongs_is_refused_naming_the_key(key, value):
    cfg = {**(MOE if key in MOE_NUMBER_KEYS else LLAMA), key: value}
    with pytest.raises(InputError) as err:
        model_from_hf_config(cfg, "x", where="cfg.json")
    text = str(err.value)
    assert text.startswith(f"cfg.json: {key} is ") and "\n" not in text, text


@FUZZ
@given(
    key=st.sampled_from(FLAG_KEYS),
    value=st.one_of(st.sampled_from(["false", "true", "False", "0", ""]), st.integers(-1, 2), st.floats()),
)
def test_anything_but_true_or_false_for_a_flag_is_refused_naming_the_key(key, value):
    with pytest.raises(InputError, match=f"^cfg.json: {key} is .*; it must be true or false"):
        model_from_hf_config({**LLAMA, key: value}, "x", where="cfg.json")


# ---- numeric options at and past their bounds --------------------------------------------------
@pytest.fixture(scope="module")
def plan16(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    code, _, err = run(["estimate", "-m", "llama3-8b", "-c", "dgx-h100", "-n", 16, "--tp", 8, "--pp", 2,
                        "--seq-len", 4096, "--global-batch", 32, "-o", path])  # fmt: skip
    assert code == 0, err
    return str(path)


SIM = ["simulate", "{plan}", "--trials", 2, "--days", 1]
REPLAN = ["replan", "{plan}", "--failed", 3]
ESTIMATE = ["estimate", "-m", "llama3-8b", "-c", "dgx-h100", "-n", 16, "--tp", 8, "--seq-len", 4096,
            "--global-batch", 32]  # fmt: skip
# (base command, option, its largest value, a value past it); the largest is run only where cheap
BOUNDS = [
    (SIM, "--checkpoint-write-s", 86400, 86401),
    (SIM, "--restart-s", 86400, 1e308),
    (SIM, "--down-threshold", 1, 2),
    (SIM, "--hw-share", 1, 1.5),
    (SIM, "--failure-rate", None, 1.5),
    (SIM, "--straggler-rate", None, 2),
    (SIM, "--straggler-hours", 8760, 8761),
    (SIM, "--straggler-slowdown", 100, 101),
    (SIM, "--lemon-factor", 1000, 1001),
    (SIM, "--lemon-fraction", 0.99, 1),  # the help's bound: 1 was listed as allowed, then refused
    (SIM, "--weibull-shape", 10, 11),
    (SIM, "--days", None, 1389),
    (SIM, "--trials", None, 10**6 + 1),
    (SIM, "--seed", 2**63 - 1, 2**63),
    (REPLAN, "--spares", None, 2**63),
    (REPLAN, "--max-power", 2, 1e308),
    (REPLAN, "--seed", 2**63 - 1, 2**64),
    (REPLAN, "--failed-fraction", None, 1.01),
    (ESTIMATE, "--gpus", None, 10**7),
    (ESTIMATE, "--tp", None, 10**7),
    (ESTIMATE, "--micro-batch", None, 10**8),
    (ESTIMATE, "--seq-len", None, 10**10),
    (ESTIMATE, "--headroom", None, 1.5),
    (["validate", "{plan}"], "--nproc", None, 10**30),
    (["plan", "-m", "llama3-8b", "-c", "dgx-h100", "-n", 16], "--top", None, 101),
]


def _argv(base: list, option: str, value, plan: str) -> list:
    args = [plan if a == "{plan}" else a for a in base]
    if option in args:  # replace the base's own value
        i = args.index(option)
        return [*args[:i], option, value, *args[i + 2 :]]
    return [*args, option, value]


@pytest.mark.parametrize(("base", "option", "largest", "past"), BOUNDS, ids=[b[1] for b in BOUNDS])
def test_a_value_past_the_bound_is_one_line_naming_the_option(plan16, base, option, largest, past):
    code, out, err = run(_argv(base, option, past, plan16))
    assert code == 2 and "Traceback" not in out + err, (option, code, err[-500:])
    line = err.strip()
    assert line.startswith("error: ") and len(line.splitlines()) == 1 and option in line, line
    if largest is not None:  # at the bound: it runs, or it is refused for another reason in one line
        code, out = check(_argv(base, option, largest, plan16))
        assert not NOT_FINITE.search(out), (option, out[-500:])


def test_every_bounded_option_states_its_bound_in_its_help():
    """The help of every numeric option shows its upper bound (typer prints min<=x<=max or x<=max),
    and no numeric option is left without a range."""
    for command in ("plan", "estimate", "replan", "sweep", "simulate", "validate", "profile"):
        code, out, _ = run([command, "--help"])
        assert code == 0
        for m in re.finditer(r"^\s+(--[\w-]+)(?: / -\w)? <(int|float) range>", out, re.MULTILINE):
            block = out[m.start() : out.find("\n  --", m.end())]
            assert "x<=" in block, (command, m.group(1), block)
        unbounded = re.findall(r"^\s+(--[\w-]+)(?: / -\w)? <(?:int|float)>", out, re.MULTILINE)
        assert not unbounded, (command, unbounded)


@FUZZ
@given(
    option=st.sampled_from(["--checkpoint-write-s", "--restart-s", "--failure-rate", "--straggler-hours",
                            "--down-threshold", "--weibull-shape", "--checkpoint-interval", "--hw-share"]),
    value=st.one_of(st.sampled_from(["0", "1e-320", "5e-324", "1e308", "nan", "-inf"]), st.floats(0, 1e6)),
)  # fmt: skip
def test_no_simulate_figure_is_nan_or_inf(plan16, option, value):
    code, out = check(_argv(SIM, option, value, plan16))
    if code == 0:
        assert not NOT_FINITE.search(out), (option, value, out[-800:])


def test_checkpoint_write_0_is_refused_not_a_division_by_zero(plan16):
    code, _, err = run(_argv(SIM, "--checkpoint-write-s", 0, plan16))
    assert code == 2 and err.strip().startswith("error: --checkpoint-write-s 0.0: Input should be greater than 0")


@pytest.mark.parametrize("minutes", ["1e-320", "0.001"])
def test_a_checkpoint_interval_under_a_second_is_refused_not_a_division_by_zero(plan16, minutes):
    # 1e-320 minutes made the productive share I / (I + w) zero and the trace 0 / 0 (numpy warned)
    code, _, err = run(_argv(SIM, "--checkpoint-interval", minutes, plan16))
    assert code == 2
    assert err.strip() == (
        f"error: --checkpoint-interval {minutes} must be auto or minutes from 1/60 (a second) to 525,600 (a year)."
    )
