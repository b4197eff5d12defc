"""Multi-process runs on gloo (CPU) against a single-process reference: 3 AdamW steps in fp32.

Every run uses fresh processes, a fresh FileStore and a watchdog (``launch``), so a hung rank
fails the test instead of CI. Errors are normwise relative errors per tensor (``launch``).
"""

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

from ntp_planner.executor.spec import TinyConfig, make_spec  # noqa: E402
from ntp_planner.executor.train.launch import RankFailure, launch  # noqa: E402

CFG = TinyConfig()  # 8 heads, 2 KV heads, FFN 48, vocabulary 64, 2 layers
TOL = 1e-5


def check(result):
    assert result.max_rel_error_loss <= TOL
    assert result.max_rel_error_grads <= TOL
    assert result.max_rel_error_params <= TOL
    assert len(result.losses) == 3 and result.losses[2] < result.losses[0]  # it trained


@pytest.mark.timeout(120)
def test_a_uniform_tp2_dp2():
    check(launch(make_spec(CFG, [[2, 2, 2, 2]], [([2], 2), ([2], 2)], 2, 8), timeout_s=60))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_b_per_layer_degrees_1_2_4_in_a_stage_of_4():
    # embedding at 4, layers at 1 (4 copies), 2 (2 copies), 4, LM head at 2: the stream changes
    # layout between every pair of blocks and lower-degree blocks sum gradients over their copies
    spec = make_spec(TinyConfig(layers=3), [[4, 1, 2, 4, 2]], [([4], 2)], 4, 8)
    check(launch(spec, timeout_s=60))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_c_ntp_tp4_and_tp3_equal_batches():
    # TP3 splits 8 heads 3/3/2 and cuts both KV groups: uneven heads, FFN columns and vocabulary
    check(launch(make_spec(CFG, [[4, 4, 4, 4]], [([4], 2), ([3], 2)], 2, 8), timeout_s=60))


@pytest.mark.slow  # in `make test-slow`; faster cases of the same path stay in `make test`
@pytest.mark.timeout(120)
def test_d_ntp_local_batches_4_and_3_weighted_by_samples():
    check(launch(make_spec(CFG, [[4, 4, 4, 4]], [([4], 4), ([3], 3)], 1, 8), timeout_s=60))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ntp_beside_a_per_layer_replica_with_copies():
    # healthy replica: layer 0 at degree 2 in a stage of 4 (two copies); degraded replica: all at 3.
    # Layer 0 syncs between degrees 2 and 3 (n = 2) after the healthy copies add up
    spec = make_spec(CFG, [[4, 2, 4, 4]], [([4], 2), ([3], 2)], 2, 8, width=4)
    check(launch(spec, timeout_s=60))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_unweighted_average_with_unequal_batches_is_detected():
    spec = make_spec(CFG, [[4, 4, 4, 4]], [([4], 4), ([3], 3)], 1, 8, weighted=False)
    result = launch(spec, timeout_s=60)
    assert result.max_rel_error_grads > 1e-2  # the plain mean of replicas is not the batch mean
    assert result.max_rel_error_params > 100 * TOL


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_e_pp2_tp2_1f1b_with_recompute():
    # 4 micro-batches: stage 0 runs one warm-up forward, then 1F1B, then drains
    spec = make_spec(CFG, [[2, 2], [2, 2]], [([2, 2], 4)], 2, 8, recompute="full")
    check(launch(spec, timeout_s=60))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_sequence_parallel_uneven_chunks_over_two_stages():
    # TP3 cuts the 8-token sequence 3/3/2: reduce-scatter / all-gather of padded chunks; norm
    # gradients are partial per rank and summed over TP before the DP sync
    spec = make_spec(CFG, [[3, 3], [3, 3]], [([3, 3], 3)], 1, 8, sequence_parallel=True, width=3)
    check(launch(spec, timeout_s=60))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_context_parallel_cp2_pp2_tp2_with_uneven_chunks():
    # 9 tokens: cp chunks 5/4, each cut 3/2 and 2/2 by sequence parallelism; attention gathers
    # keys and values over the cp pair and masks by global position
    spec = make_spec(CFG, [[2, 2], [2, 2]], [([2, 2], 2)], 2, 9, cp=2, sequence_parallel=True)
    check(launch(spec, timeout_s=60))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_context_parallel_beside_ntp():
    # two replicas of 2 cp slices each, one at TP2 and one at TP1: the NTP sync runs over all
    # four pipelines (cp slices sum like replicas), sequence parallelism on the TP2 stages
    spec = make_spec(CFG, [[2, 2, 2, 2]], [([2], 2), ([1], 1)], 1, 8, cp=2, width=2, sequence_parallel=True)
    check(launch(spec, timeout_s=60))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_rank_that_dies_is_named():
    spec = make_spec(CFG, [[2, 2, 2, 2]], [([2], 1), ([2], 1)], 1, 8)
    with pytest.raises(RankFailure, match=r"rank 2 \(replica 1, stage 0, local rank 0\) died: .*code 3 during step 2"):
        launch(spec, timeout_s=60, fault=(2, "die", 1))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_rank_that_raises_is_named_with_its_error():
    spec = make_spec(CFG, [[2, 2, 2, 2]], [([2], 1), ([2], 1)], 1, 8)
    with pytest.raises(RankFailure, match=r"^rank 1 \(replica 0, stage 0, local rank 1\) failed during step 1: "
                       r"RuntimeError: injected fault on rank 1"):  # fmt: skip
        launch(spec, timeout_s=60, fault=(1, "raise", 0))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_rank_that_hangs_is_named_within_the_timeout():
    spec = make_spec(CFG, [[2, 2], [2, 2]], [([2, 2], 2)], 2, 8)
    with pytest.raises(
        RankFailure, match=r"^rank 3 \(replica 0, stage 1, local rank 1\) hung: no rank made progress for 5 s"
    ):
        launch(spec, timeout_s=5, fault=(3, "hang", 1))
