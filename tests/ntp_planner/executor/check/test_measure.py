"""What a run measures (``measure``): the split of each rank's step time and its memory.

Multi-process runs on gloo (CPU) with a watchdog, as in test_runtime; each run is launched once
per module and checked by several tests.
"""

import statistics

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

from ntp_planner.executor.check.measure import SPLIT, ActivationMeter  # noqa: E402
from ntp_planner.executor.spec import TinyConfig, make_spec  # noqa: E402
from ntp_planner.executor.train.launch import launch  # noqa: E402

CFG = TinyConfig()  # hidden 32, 8 heads of 4, 2 KV heads, FFN 48, vocabulary 64, 2 layers
TOL = 1e-5


def _run(spec):
    result = launch(spec, timeout_s=60)
    assert max(result.max_rel_error_loss, result.max_rel_error_grads, result.max_rel_error_params) <= TOL
    return result


@pytest.fixture(scope="module")
def tp2_dp2():
    return _run(make_spec(CFG, [[2, 2, 2, 2]], [([2], 2), ([2], 2)], 2, 8))


def pp2(micro_batches: int, steps: int = 3):
    # TP1: stage 0 = embedding + layer 0, stage 1 = layer 1 + LM head
    return _run(make_spec(CFG, [[1, 1], [1, 1]], [([1, 1], micro_batches)], 2, 8, steps=steps))


@pytest.fixture(scope="module")
def pp2_m4():
    return pp2(4)


def check_split_adds_up(result, ranks_of_stage):
    steady = [statistics.mean(times[1:]) for times in result.rank_step_times_s]
    for s, ranks in enumerate(ranks_of_stage):
        split = result.stage_time_split_s[s]
        assert set(split) == set(SPLIT)
        assert all(v >= 0 for v in split.values()), split  # no part counted twice
        assert result.stage_step_time_s[s] == pytest.approx(max(steady[r] for r in ranks), rel=1e-9)
        assert sum(split.values()) == pytest.approx(result.stage_step_time_s[s], rel=1e-9)
    assert sum(result.time_split_s.values()) == pytest.approx(max(steady), rel=1e-9)
    slowest = [max(col) for col in zip(*(t[1:] for t in result.rank_step_times_s), strict=True)]
    assert result.step_time_s == pytest.approx(statistics.mean(slowest), rel=1e-9)
    assert result.step_time_median_s == pytest.approx(statistics.median(slowest), rel=1e-9)


@pytest.mark.timeout(120)
def test_tp2_dp2_split_adds_up_to_the_step_time_and_names_tp_and_dp(tp2_dp2):
    assert len(tp2_dp2.rank_step_times_s) == 4 and all(len(t) == 3 for t in tp2_dp2.rank_step_times_s)
    check_split_adds_up(tp2_dp2, [[0, 1, 2, 3]])
    split = tp2_dp2.time_split_s
    assert split["tp_comm"] > 0 and split["dp_sync"] > 0 and split["optimizer"] > 0 and split["compute"] > 0
    assert split["pp_wait"] == 0 and split["cp_comm"] == 0  # one stage, no context parallelism


@pytest.mark.timeout(120)
def test_pp2_split_adds_up_and_the_bubble_is_pipeline_wait(pp2_m4):
    check_split_adds_up(pp2_m4, [[0], [1]])
    for split in pp2_m4.stage_time_split_s:
        assert split["pp_wait"] > 0 and split["compute"] > 0
        assert split["tp_comm"] == split["cp_comm"] == split["dp_sync"] == 0  # TP1, one replica


@pytest.mark.timeout(120)
def test_cp2_key_value_gathers_are_context_comm():
    # TP1, one stage, 2 cp slices of 4 tokens: attention gathers keys and values over the pair,
    # and the slices sum their gradients like replicas
    result = _run(make_spec(CFG, [[1, 1, 1, 1]], [([1], 2)], 1, 8, cp=2))
    check_split_adds_up(result, [[0, 1]])
    split = result.time_split_s
    assert split["cp_comm"] > 0 and split["dp_sync"] > 0
    assert split["tp_comm"] == split["pp_wait"] == 0


@pytest.mark.timeout(120)
def test_tp2_weights_grads_and_optimizer_bytes_by_hand(tp2_dp2):
    # per rank at TP2, hidden 32: q 16x32 (4 of 8 heads of 4) + k 4x32 + v 4x32 (1 of 2 KV heads)
    # + o 32x16 + gate 24x32 + up 24x32 + down 32x24 (24 of 48 FFN columns) + 2 norms of 32
    layer = 512 + 128 + 128 + 512 + 768 + 768 + 768 + 64  # = 3648
    embed = 32 * 32  # 32 of 64 vocabulary rows
    head = 32 * 32 + 32  # vocabulary rows + final norm
    weights = (2 * layer + embed + head) * 4  # fp32: 37,504 bytes
    for m in tp2_dp2.memory_bytes:
        assert (m["weights"], m["grads"], m["optimizer"]) == (weights, weights, 2 * weights)
        assert m["activations_peak"] > 0 and "cuda_max_allocated" not in m
    assert tp2_dp2.stage_memory_bytes == [{k: max(m[k] for m in tp2_dp2.memory_bytes) for k in tp2_dp2.memory_bytes[0]}]


@pytest.mark.timeout(240)
def test_pp2_1f1b_first_stage_holds_two_micro_batches_of_activations(pp2_m4):
    one = pp2(1).memory_bytes
    four = pp2_m4.memory_bytes
    # stage 0 runs one warm-up forward, then forward i+1 before backward i: 2 micro-batches in
    # flight; the last stage runs each backward right after its forward: 1
    assert four[0]["activations_peak"] == pytest.approx(2 * one[0]["activations_peak"], rel=0.02)
    assert four[1]["activations_peak"] == pytest.approx(one[1]["activations_peak"], rel=0.02)


@pytest.mark.timeout(240)
def test_saved_activations_are_released_after_each_backward(pp2_m4):
    longer = pp2(4, steps=6)
    assert [m["activations_peak"] for m in longer.memory_bytes] == [m["activations_peak"] for m in pp2_m4.memory_bytes]


def test_meter_counts_a_storage_once_skips_excluded_and_releases_after_backward():
    w = torch.ones(8, requires_grad=True)
    x = torch.ones(2, 8, requires_grad=True)
    meter = ActivationMeter([w])
    with meter.hooks():
        y = x[0] * x[1]  # two views of x's storage (16 floats, 64 bytes), saved by mul
        z = (y.exp() * w).sum()  # exp saves its output (32 bytes), mul saves it again: once; w is excluded
    assert meter.current_bytes == 64 + 32
    z.backward()
    assert (meter.current_bytes, meter.peak_bytes) == (0, 96)
    meter.reset_peak()
    assert meter.peak_bytes == 0
