"""Parallel folding (expert tensor parallelism etp apart from the attention TP): the experts'
grid etp x ep x edp over each stage's ranks (``groups.expert_group``, ``RankGrid.expert_group``),
each rank's experts and width slice, and whole runs on gloo exact against one process (float64)."""

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

from ntp_planner.executor.groups import expert_group, expert_seat, process_groups  # noqa: E402
from ntp_planner.executor.spec import TinyConfig, make_spec  # noqa: E402
from ntp_planner.executor.train.launch import launch  # noqa: E402

# 4 experts of width 12, top-2, a shared expert; both layers MoE
MOE = TinyConfig(layers=2, experts=4, top_k=2, expert_ffn=12, moe_layers=(0, 1), shared_ffn=8)
TOL = 1e-9  # float64


def check(result):
    assert result.max_rel_error_loss <= TOL
    assert result.max_rel_error_grads <= TOL
    assert result.max_rel_error_params <= TOL
    assert result.losses[2] < result.losses[0]  # it trained


def tp2(replicas: int, **run):
    """``replicas`` pipelines of one TP2 stage: pipeline q on ranks (2q, 2q + 1)."""
    return make_spec(MOE, [[2, 2, 2, 2]], [([2], 2)] * replicas, 2, 8, dtype="float64", **run)


# ---- the grid ------------------------------------------------------------------------------
def test_etp1_folds_the_ep_group_over_the_attention_tp_ranks():
    # tp 2 x dp 2 = 4 ranks, etp 1, ep 2: grid [edp 2, ep 2, etp 1] over ranks 0..3
    spec = tp2(2, ep=2, etp=1)
    assert [expert_group(spec, r, "ep") for r in range(4)] == [(0, 1), (0, 1), (2, 3), (2, 3)]
    assert [expert_group(spec, r, "edp") for r in range(4)] == [(0, 2), (1, 3), (0, 2), (1, 3)]
    seat = expert_seat(spec, 3, 2)
    assert (seat.ep_ranks, seat.mine, seat.etp, seat.etp_rank, seat.edp) == ((2, 3), (2, 3), 1, 0, ((1, 3),) * 2)
    # ep 4: each rank one whole expert, one EP group, no expert data parallelism
    spec = tp2(2, ep=4, etp=1)
    assert [expert_seat(spec, r, 2).mine for r in range(4)] == [(0,), (1,), (2,), (3,)]
    assert expert_seat(spec, 1, 2).edp == ((1,),)
    assert (0, 1, 2, 3) in process_groups(spec)


def test_etp_equal_tp_is_the_layout_before_folding():
    folded, plain = tp2(4, ep=2, etp=2), tp2(4, ep=2)
    for r in range(8):
        a, b = expert_seat(folded, r, 2), expert_seat(plain, r, 2)
        assert (a.ep_ranks, a.owned, a.etp_rank, a.edp) == (b.ep_ranks, b.owned, b.etp_rank, b.edp)
    assert expert_seat(folded, 5, 2).ep_ranks == (5, 7)  # TP rank 1 of pipelines 2 and 3


def test_folding_refusals_show_the_arithmetic():
    with pytest.raises(ValueError, match=r"etp\(1\) \* ep\(4\) = 4 does not divide its 2 ranks"):
        tp2(1, ep=4, etp=1)
    with pytest.raises(ValueError, match=r"etp\(2\) must divide the TP degree of layers.0 \(1\)"):
        make_spec(MOE, [[1, 1, 1, 1]], [([1], 2)] * 2, 2, 8, ep=1, etp=2)
    with pytest.raises(ValueError, match="ZeRO 1 beside parallel folding"):
        tp2(2, ep=2, etp=1, zero=1)


# ---- whole runs ------------------------------------------------------------------------------
@pytest.mark.timeout(180)
def test_etp1_tp2_ep2_on_four_ranks_exact_against_one_process():
    # each TP rank dispatches half of its copy's tokens to the two ranks of its EP group (its TP
    # group), which hold two whole experts each; expert gradients sum over edp (0, 2) / (1, 3)
    check(launch(tp2(2, ep=2, etp=1), timeout_s=150))


@pytest.mark.slow  # in `make test-slow`; faster cases of the same path stay in `make test`
@pytest.mark.timeout(180)
def test_etp1_tp2_ep4_on_four_ranks_exact_against_one_process():
    # the EP group spans both pipelines' TP ranks: one whole expert per rank, edp 1
    check(launch(tp2(2, ep=4, etp=1), timeout_s=150))


@pytest.mark.timeout(180)
def test_etp_equal_tp_exact_against_one_process():
    check(launch(tp2(2, ep=2, etp=2), timeout_s=150))


def _every_rank_dispatches_every_token():
    """Planted bug: with etp < t each TP rank sends all of its copy's tokens, not its share
    (the TP sum then counts each routed expert output t / etp times)."""
    from ntp_planner.executor.parallel import expert

    expert._token_share = lambda rows, place, tp_ranks: (0, rows)


@pytest.mark.slow  # in `make test-slow`; faster cases of the same path stay in `make test`
@pytest.mark.timeout(180)
def test_every_rank_dispatching_every_token_is_caught():
    result = launch(tp2(2, ep=2, etp=1, steps=1), timeout_s=150, worker_init=_every_rank_dispatches_every_token)
    assert result.max_rel_error_loss > 1e-4 and result.max_rel_error_grads > 1e-2


@pytest.mark.slow  # in `make test-slow`; faster cases of the same path stay in `make test`
@pytest.mark.timeout(180)
def test_etp2_inside_tp4_with_sequence_parallel_exact_against_one_process():
    # one TP4 pipeline, etp 2, ep 2: expert-TP groups (0, 1), (2, 3) each take half the tokens,
    # EP groups (0, 2), (1, 3) split the experts; every expert cut 6/6 over its etp group
    spec = make_spec(MOE, [[4, 4, 4, 4]], [([4], 2)], 1, 8, dtype="float64", ep=2, etp=2, sequence_parallel=True)
    assert [expert_seat(spec, r, 4).ep_ranks for r in range(4)] == [(0, 2), (1, 3), (0, 2), (1, 3)]
    assert [expert_seat(spec, r, 4).etp_rank for r in range(4)] == [0, 1, 0, 1]
    check(launch(spec, timeout_s=150))


@pytest.mark.slow  # in `make test-slow`; faster cases of the same path stay in `make test`
@pytest.mark.timeout(180)
def test_a_folded_plan_shrinks_to_a_folded_run_exact_against_one_process():
    # Mixtral TP2 x DP4 at ep 4, etp 1 (EP over the attention TP ranks) on 8 H100s, shrunk to 4
    # processes: two TP2 pipelines, one EP group of all 4 ranks, each holding 2 whole experts
    from dataclasses import replace

    from cost_models.catalogue import MODELS
    from cost_models.layout import ParallelLayout
    from cost_models.training import TrainingSpec
    from ntp_planner.executor.shrink.run import shrink
    from ntp_planner.solver.planner import plan_from_layout
    from topologies.cluster import Cluster
    from topologies.cluster_catalogue import CLUSTERS

    cluster = Cluster(spec=CLUSTERS["dgx-h100"], num_gpus=8)
    lay = ParallelLayout(tp=2, dp=4, ep=4, etp=1, global_batch=16)
    plan = plan_from_layout(MODELS["mixtral-8x7b"], TrainingSpec(seq_len=2048, global_batch=16), cluster, lay)
    spec = shrink(plan, 4).spec
    assert (spec.ep, spec.etp, spec.cfg.experts, spec.world_size) == (4, 1, 8, 4)
    assert [expert_seat(spec, r, 2).mine for r in range(4)] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert any(n.startswith("etp 1 kept (parallel folding)") for n in spec.notes)
    check(launch(replace(spec, dtype="float64"), timeout_s=150))
    # ZeRO keeps the layout before folding (etp = tp), and the notes say so
    zero = ParallelLayout(tp=2, dp=4, ep=4, etp=1, global_batch=16, zero=1)
    plan = plan_from_layout(MODELS["mixtral-8x7b"], TrainingSpec(seq_len=2048, global_batch=16), cluster, zero)
    unfolded = shrink(plan, 6).spec
    assert unfolded.etp is None
    assert "etp 1 -> the layout before folding (etp = tp 2): ZeRO 1 beside folding is not run" in unfolded.notes


def test_every_rank_has_a_seat_beside_ntp_at_ep1():
    # TP2 beside TP1 without EP: each rank holds every expert at its own TP slice (no grid to cut)
    spec = make_spec(MOE, [[2, 2, 2, 2]], [([2], 2), ([1], 2)], 2, 8)
    seats = [expert_seat(spec, r, w) for r, w in ((0, 2), (1, 2), (2, 1))]
    assert [(s.ep_ranks, s.mine, s.etp, s.etp_rank) for s in seats] == [
        ((0,), (0, 1, 2, 3), None, 0),
        ((1,), (0, 1, 2, 3), None, 1),
        ((2,), (0, 1, 2, 3), None, 0),
    ]
