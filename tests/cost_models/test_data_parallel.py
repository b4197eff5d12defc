"""Data-parallel synchronisation: the bucketed-overlap tail against an event simulation, Megatron's
bucket size, and the exposed time of every ZeRO level on hand-derived numbers."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cost_models.data_parallel import DpTraffic, bucket_count, exposed_dp_time, tail

# ---- tail ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("comm", "window", "buckets", "expected"),
    [
        (1.0, 10.0, 4, 0.25),  # hides all but the last bucket: 1 / 4
        (10.0, 4.0, 4, 7.0),  # falls behind: 10 - 4 * (1 - 1/4) = 10 - 3
        (8.0, 4.0, 2, 6.0),  # max(8/2, 8 - 4 * 1/2) = max(4, 6)
        (3.0, 100.0, 1, 3.0),  # one bucket is ready only when the window closes: nothing hides
        (0.0, 5.0, 4, 0.0),
        (-1.0, 5.0, 4, 0.0),
    ],
)
def test_tail_hand_values(comm, window, buckets, expected):
    assert tail(comm, window, buckets) == pytest.approx(expected)


def _simulated_tail(comm: float, window: float, buckets: int) -> float:
    """One stream; bucket i (0-based) becomes ready at window * (i + 1) / buckets and takes
    comm / buckets; returns how long after the window closes the last one finishes."""
    free = 0.0
    for i in range(buckets):
        free = max(free, window * (i + 1) / buckets) + comm / buckets
    return free - window


@given(
    comm=st.floats(1e-3, 100.0),
    window=st.floats(0.0, 100.0),
    buckets=st.integers(1, 64),
)
def test_tail_matches_an_event_simulation(comm, window, buckets):
    assert tail(comm, window, buckets) == pytest.approx(_simulated_tail(comm, window, buckets), rel=1e-9, abs=1e-12)


# ---- bucket_count -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "dp", "zero", "layers", "expected"),
    [
        (1e9, 8, 1, 10, 25),  # bucket max(40M, 8M) = 40M: 1e9 / 40M = 25
        (1e9, 64, 1, 10, 16),  # bucket max(40M, 64M) = 64M: ceil(15.625) = 16
        (1e9, 40, 0, 10, 25),  # 40 x 1M = 40M either way
        (40e6, 1, 0, 10, 1),
        (40e6 + 1, 1, 2, 10, 2),  # one parameter over a bucket opens a second one
        (128e6, 128, 1, 10, 1),  # bucket 128M: exactly one
        (0.0, 8, 1, 10, 1),  # never fewer than one
        (1e9, 8, 3, 10, 10),  # ZeRO-3: one piece per layer, whatever the size
        (1e9, 8, 3, 0, 1),  # ... and at least one (a stage of only the embedding)
    ],
)
def test_bucket_count_hand_values(params, dp, zero, layers, expected):
    assert bucket_count(params, dp, zero, layers) == expected


# ---- exposed_dp_time ----------------------------------------------------------------------------
# One stage: reduction 1.0 s and gathering 0.5 s if run alone, 4 buckets; a micro-batch's forward
# 0.2 s and backward 0.4 s, 8 micro-batches; the once-per-step reduction overlaps a 0.4 s window
# and the gathering a 0.2 s one, each in 4 pieces.
TRAFFIC = DpTraffic(reduce_s=1.0, gather_s=0.5, buckets=4)
ALL_REDUCE = DpTraffic(reduce_s=1.0, gather_s=0.0, buckets=4)  # ZeRO-0 gathers nothing
FWD, BWD, M, GRAD_WIN, GATHER_WIN, PIECES = 0.2, 0.4, 8, 0.4, 0.2, 4

# Overlapped tails used below (tail(C, W, b) = max(C / b, C - W (1 - 1/b))):
#   tail(1.0, 0.4, 4) = max(0.25, 1.0 - 0.3) = 0.7
#   tail(0.5, 0.2, 4) = max(0.125, 0.5 - 0.15) = 0.35
#   tail(1.5, 0.4, 4) = max(0.375, 1.5 - 0.3) = 1.2


@pytest.mark.parametrize(
    ("traffic", "zero", "overlap", "reshard", "expected"),
    [
        # Without overlap everything is exposed:
        (ALL_REDUCE, 0, False, True, (1.0, 0.0)),  # one all-reduce per step
        (TRAFFIC, 1, False, True, (1.0, 0.5)),  # one reduce-scatter, one all-gather
        (TRAFFIC, 2, False, True, (8.0, 0.5)),  # a reduce-scatter per micro-batch: 8 x 1.0
        (TRAFFIC, 3, False, True, (8.0, 8.0)),  # per micro-batch: reduce 1.0; gather 0.5 twice: 8 x 1.0
        (TRAFFIC, 3, False, False, (8.0, 4.0)),  # kept for backward: gathered once, 8 x 0.5
        # With overlap:
        (ALL_REDUCE, 0, True, True, (0.7, 0.0)),
        (TRAFFIC, 1, True, True, (0.7, 0.35)),
        # ZeRO-2: the first 7 reduce-scatters run behind the next micro-batch's 0.6 s of compute,
        # each leaving 1.0 - 0.6 = 0.4 exposed: 7 x 0.4 = 2.8; the last one tails: 0.7. Total 3.5.
        (TRAFFIC, 2, True, True, (3.5, 0.35)),
        # ZeRO-3, resharded: each backward moves reduce + re-gather = 1.5 s behind 0.4 s of backward in
        # 4 layer pieces: 8 x tail(1.5, 0.4, 4) = 8 x 1.2 = 9.6; each forward gathers 0.5 s behind
        # 0.2 s of forward: 8 x tail(0.5, 0.2, 4) = 8 x 0.35 = 2.8.
        (TRAFFIC, 3, True, True, (9.6, 2.8)),
        # ZeRO-3, kept: backward moves only the 1.0 s reduction: 8 x 0.7 = 5.6.
        (TRAFFIC, 3, True, False, (5.6, 2.8)),
    ],
)
def test_exposed_dp_time_hand_values(traffic, zero, overlap, reshard, expected):
    got = exposed_dp_time(traffic, zero, overlap, reshard, FWD, BWD, M, GRAD_WIN, GATHER_WIN, PIECES)
    assert got == pytest.approx(expected, rel=1e-12)


def test_zero2_hides_its_steady_reductions_when_compute_is_longer():
    # Reduce-scatter 0.5 s < 0.6 s of micro-batch compute: nothing exposed in the steady state,
    # only the last one's tail: tail(0.5, 0.4, 4) = max(0.125, 0.5 - 0.3) = 0.2.
    traffic = DpTraffic(reduce_s=0.5, gather_s=0.0, buckets=4)
    red, _ = exposed_dp_time(traffic, 2, True, True, FWD, BWD, M, GRAD_WIN, GATHER_WIN, PIECES)
    assert red == pytest.approx(0.2)


def test_zero1_uses_the_pieces_it_is_given_not_the_buckets():
    # A stage the drain reaches late moves its gradients in one piece: nothing hides, 1.0 s exposed,
    # although the traffic is cut into 4 buckets.
    red, gat = exposed_dp_time(TRAFFIC, 1, True, True, FWD, BWD, M, 10.0, 10.0, 1)
    assert (red, gat) == pytest.approx((1.0, 0.5))


@given(
    zero=st.sampled_from([0, 1, 2, 3]),
    reshard=st.booleans(),
    reduce_s=st.floats(0.0, 10.0),
    gather_s=st.floats(0.0, 10.0),
    buckets=st.integers(1, 32),
    fwd=st.floats(0.0, 5.0),
    bwd=st.floats(0.0, 5.0),
    m=st.integers(1, 64),
    windows=st.tuples(st.floats(0.0, 20.0), st.floats(0.0, 20.0)),
    pieces=st.integers(1, 32),
)
def test_overlap_never_exposes_more_than_no_overlap(
    zero, reshard, reduce_s, gather_s, buckets, fwd, bwd, m, windows, pieces
):
    traffic = DpTraffic(reduce_s=reduce_s, gather_s=gather_s, buckets=buckets)
    args = (fwd, bwd, m, *windows, pieces)
    red_o, gat_o = exposed_dp_time(traffic, zero, True, reshard, *args)
    red_n, gat_n = exposed_dp_time(traffic, zero, False, reshard, *args)
    # Compared in total: under ZeRO-3 the backward re-gather is booked as gathering without overlap
    # and as part of the backward stream (first element) with it.
    assert red_o >= 0.0 and gat_o >= 0.0
    assert red_o + gat_o <= (red_n + gat_n) * (1 + 1e-12) + 1e-12
