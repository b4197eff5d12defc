"""Megatron's interleaved 1F1B order and the tick timeline the executor runs it by (no torch)."""

import pytest

from ntp_planner.executor.parallel.interleave import destination, needs, order, table, timeline, warmup


def show(actions):
    return " ".join(f"{k}{mb}.{v}" for k, mb, v in actions)


def test_pp2_vpp2_m4_matches_the_hand_derived_megatron_order():
    # table (micro-batch.chunk), groups of pp = 2: 0.0 1.0 0.1 1.1 | 2.0 3.0 2.1 3.1; backwards take the
    # same table with the chunks reversed. Warm-up: stage 0 2 (2 - 0 - 1) + (2 - 1) 2 = 4, stage 1 2.
    assert show(order(2, 2, 4, 0)) == (
        "F0.0 F1.0 F0.1 F1.1 "  # warm-up
        "F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 "  # steady 1F1B
        "B2.1 B3.1 B2.0 B3.0"  # cool-down
    )
    assert show(order(2, 2, 4, 1)) == "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0"


def test_vpp1_is_plain_1f1b_and_warmup_is_capped():
    # stage 0 of 3: pp - 1 = 2 warm-up forwards, one forward-backward pair, two backwards to drain
    assert show(order(3, 1, 3, 0)) == "F0.0 F1.0 F2.0 B0.0 B1.0 B2.0"
    assert show(order(3, 1, 3, 2)) == "F0.0 B0.0 F1.0 B1.0 F2.0 B2.0"
    assert [warmup(4, 3, 8, s) for s in range(4)] == [14, 12, 10, 8]  # 2 (4 - s - 1) + 2 x 4
    assert [warmup(4, 3, 5, s) for s in range(4)] == [14, 12, 10, 8]  # m 5: only m = pp warms up throughout


def test_interleaved_with_m_equal_to_pp_runs_every_forward_then_every_backward():
    # Megatron-Core: num_microbatches == pipeline_parallel_size sets all_warmup_microbatches; the
    # last stage used to start 1F1B after 2 forwards (F0.0 F1.0 F0.1 B0.1 ...)
    assert [warmup(4, 3, 4, s) for s in range(4)] == [12, 12, 12, 12]
    assert show(order(2, 2, 2, 1)) == "F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0"
    assert show(order(2, 2, 2, 0)) == "F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0"
    assert table(4, 2, 2) == [(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (3, 0), (2, 1), (3, 1)]


@pytest.mark.parametrize("pp, vpp, m", [(2, 2, 2), (2, 2, 4), (2, 3, 6), (3, 2, 3), (3, 2, 9), (4, 2, 8), (4, 4, 4)])
def test_every_pass_runs_once_after_what_it_consumes(pp, vpp, m):
    ticks = timeline(pp, vpp, m)
    when = {(s, a): t for t, row in enumerate(ticks) for s, a in enumerate(row) if a is not None}
    for s in range(pp):
        assert sorted(a for (st, a) in when if st == s) == sorted(
            (k, mb, v) for k in "BF" for mb in range(m) for v in range(vpp)
        )
        assert [a for row in ticks if (a := row[s]) is not None] == order(pp, vpp, m, s)  # the order is kept
        for a in order(pp, vpp, m, s):
            assert all(when[d] < when[s, a] for d in needs(pp, vpp, s, a))  # inputs arrived in an earlier tick
            d = destination(pp, vpp, s, a)
            assert d is None or (s, a) in needs(pp, vpp, *d)  # what it sends is what the receiver waits for


def test_activations_wrap_from_the_last_stage_to_the_first_stages_next_chunk():
    assert destination(3, 2, 2, ("F", 5, 0)) == (0, ("F", 5, 1))
    assert destination(3, 2, 2, ("F", 5, 1)) is None  # the loss
    assert destination(3, 2, 0, ("B", 5, 1)) == (2, ("B", 5, 0))
    assert destination(3, 2, 0, ("B", 5, 0)) is None
    assert destination(3, 2, 1, ("B", 5, 1)) == (0, ("B", 5, 1))
