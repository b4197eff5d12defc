"""NTP beside expert parallelism: a degraded replica (reduced TP) inside an EP group, the failed
rank's experts re-hosted on the survivors of its EP group (``parallel.hosting``), run on gloo
exact against one process (float64); the hosting's checks and its arithmetic by hand."""

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

from ntp_planner.executor.groups import expert_seat, process_groups  # noqa: E402
from ntp_planner.executor.parallel.hosting import as_hosting, lockstep, moves, rehost  # noqa: E402
from ntp_planner.executor.spec import StageExperts, TinyConfig, make_spec  # noqa: E402
from ntp_planner.executor.train.launch import launch  # noqa: E402

MOE = TinyConfig(layers=2, experts=4, top_k=2, expert_ffn=12, moe_layers=(0, 1), shared_ffn=8)
TOL = 1e-9  # float64


def check(result):
    assert result.max_rel_error_loss <= TOL
    assert result.max_rel_error_grads <= TOL
    assert result.max_rel_error_params <= TOL
    assert result.losses[2] < result.losses[0]  # it trained


def run(widths, ep, hosting=None, stages=1, **kw):
    """Pipelines of ``stages`` stages at the given TP widths (2 healthy), 2 micro-batches each."""
    degrees = [[2, 2, 2, 2]] if stages == 1 else [[2, 2], [2, 2]]
    reps = [([w] * stages, 2) for w in widths]
    return make_spec(MOE, degrees, reps, 2, 8, dtype="float64", ep=ep, etp=1, hosting=hosting or (), **kw)


def test_as_hosting_is_the_folded_grid_and_rehost_moves_to_the_survivors():
    healthy = run([2, 2], ep=2)
    (host,) = as_hosting(healthy)
    assert host == StageExperts(((0, 1), (2, 3)), ((0, 2), (0, 2), (1, 3), (1, 3)))
    # ep 4 over both pipelines: rank 1 fails, its expert 1 goes to the survivor holding the
    # fewest (all hold one: the lowest, rank 0); ranks 2, 3 become 1, 2
    (wide,) = as_hosting(run([2, 2], ep=4))
    (after,) = rehost((wide,), 1)
    assert after == StageExperts(((0, 1, 2),), ((0,), (0,), (1,), (2,)))
    with pytest.raises(ValueError, match="no other holder than rank 1"):
        moves((wide,), 1)
    assert moves((host,), 0) == {(0, 0): (1, 0), (0, 1): (1, 0)}  # rank 2 (now 1) holds experts 0, 1 too
    # before folding (etp = tp 2, ep 2 over 4 pipelines): groups of TP rank j, experts whole
    plain = make_spec(MOE, [[2, 2, 2, 2]], [([2], 2)] * 4, 2, 8, ep=2)
    assert as_hosting(plain)[0] == StageExperts(
        ((0, 2), (1, 3), (4, 6), (5, 7)), ((0, 1, 4, 5), (0, 1, 4, 5), (2, 3, 6, 7), (2, 3, 6, 7))
    )
    seat = expert_seat(run([2, 1], ep=2, hosting=rehost((host,), 3)), 2, 1)
    assert (seat.ep_ranks, seat.owned, seat.edp) == ((2,), ((0, 1, 2, 3),), ((0, 2), (0, 2), (1, 2), (1, 2)))


def test_hosting_refusals():
    host = StageExperts(((0, 1), (2,)), ((0, 2), (0, 2), (1, 2), (1, 2)))
    with pytest.raises(ValueError, match=r"expert 3 is held by \(1,\)"):
        run([2, 1], ep=2, hosting=(StageExperts(host.groups, host.owners[:3] + ((1,),)),))
    with pytest.raises(ValueError, match="must split its ranks"):
        run([2, 1], ep=2, hosting=(StageExperts(((0, 1),), host.owners),))
    across = StageExperts(((0, 2), (1,)), ((0, 1), (0, 1), (1, 2), (1, 2)))
    with pytest.raises(ValueError, match=r"EP group \(0, 2\) spans pipelines of \[1, 2\] micro-batches"):
        make_spec(MOE, [[2, 2, 2, 2]], [([2], 2), ([1], 1)], 2, 8, ep=2, etp=1, hosting=(across,))
    make_spec(MOE, [[2, 2, 2, 2]], [([2], 2), ([1], 1)], 2, 8, ep=2, etp=1, hosting=(host,))  # each group in step


@pytest.mark.slow  # in `make test-slow`; faster cases of the same path stay in `make test`
@pytest.mark.timeout(180)
def test_tp2_replica_beside_a_tp1_replica_that_hosts_all_its_groups_experts():
    # 4 ranks, etp 1 ep 2; rank 3 lost: pipeline 1 runs TP1 on rank 2, which now holds all four
    # experts (its EP group is itself); experts 2, 3 sum their gradients over ranks (1, 2)
    (host,) = as_hosting(run([2, 2], ep=2))
    spec = run([2, 1], ep=2, hosting=rehost((host,), 3))
    assert (2,) in process_groups(spec) and (1, 2) in process_groups(spec)
    check(launch(spec, timeout_s=150))


@pytest.mark.timeout(180)
def test_an_ep_group_spanning_a_healthy_and_a_degraded_replica():
    # ep 4 over two TP2 pipelines; rank 2 lost: the group (0, 1, 2) holds experts (0, 3), (1,),
    # (2,) -- uneven splits in both all-to-alls; pipeline 1's surviving rank is TP1
    (wide,) = as_hosting(run([2, 2], ep=4))
    wide = StageExperts(wide.groups, tuple(o if e != 3 else (3,) for e, o in enumerate(wide.owners)))
    after = rehost((wide,), 2)
    assert after[0].owners == ((0,), (1,), (0,), (2,))
    check(launch(run([2, 1], ep=4, hosting=after), timeout_s=150))


@pytest.mark.slow  # in `make test-slow`; faster cases of the same path stay in `make test`
@pytest.mark.timeout(300)
def test_two_stages_rehosted_where_the_failed_rank_sat():
    # pp 2 x (tp 2, dp 2) = 8 ranks (stage 0 on 0-3, stage 1 on 4-7); rank 7 lost. NTP runs the
    # whole replica at TP1, so rank 3 leaves stage 0 too: on each stage the pipeline's survivor
    # (2, then 6 -> 5) takes its partner's experts
    healthy = run([2, 2], ep=2, stages=2)
    host = as_hosting(healthy)
    after = rehost(rehost(host, 7), 3)  # the replica at TP1: ranks 3 and 7 both leave
    spec = run([2, 1], ep=2, hosting=after, stages=2)
    assert [h.groups for h in after] == [((0, 1), (2,)), ((3, 4), (5,))]
    check(launch(spec, timeout_s=250))


def _experts_not_summed():
    """Planted bug: expert gradients stay each holder's own (no sum over the expert's owners)."""
    from ntp_planner.executor.parallel import data

    data.sum_experts = lambda grad, edp, comm: grad


@pytest.mark.slow  # in `make test-slow`; faster cases of the same path stay in `make test`
@pytest.mark.timeout(180)
def test_a_rehosted_expert_not_summed_over_its_owners_is_caught():
    (host,) = as_hosting(run([2, 2], ep=2))
    spec = run([2, 1], ep=2, hosting=rehost((host,), 3), steps=1)
    result = launch(spec, timeout_s=150, worker_init=_experts_not_summed)
    assert result.max_rel_error_grads > 1e-2


# ---- checkpoints under hosting: every expert in the checkpoint layout --------------------------
def _hosted_spec():
    (host,) = as_hosting(run([2, 2], ep=2))
    return run([2, 1], ep=2, hosting=rehost((host,), 3))


def _checkpoint_rows(rank: int) -> dict:
    from types import SimpleNamespace

    from ntp_planner.executor.elastic.handover import _gather_hosted
    from ntp_planner.executor.model.reference import Reference
    from ntp_planner.executor.parallel.comm import Comm
    from ntp_planner.executor.train.stage import StageModel

    torch.set_default_dtype(torch.float64)
    spec = _hosted_spec()
    replica, s = spec.locate(rank)
    comm = Comm(spec, rank)
    model = StageModel(spec, spec.replicas[replica].stages[s], rank, Reference(MOE, seed=4), comm, torch.device("cpu"))
    rows = {
        name: {"param": t.detach().clone(), "exp_avg": t.detach() + 1, "exp_avg_sq": t.detach() * 2}
        for name, _, _, t in model.named_parameters()
    }
    _gather_hosted(SimpleNamespace(spec=spec, model=model, comm=comm), rows)
    # plain arrays: a forked rank exits at once, so tensors shared by file descriptor cannot follow
    return {name: {k: v.numpy().copy() for k, v in row.items()} for name, row in rows.items() if "expert_" in name}


def test_a_hosted_run_checkpoints_every_expert_in_the_layout_before_hosting(tmp_path):
    # ranks 0, 1 (TP2) hold experts 0-1 / 2-3 whole; rank 2 (TP1) all four. The checkpoint layout
    # (ep 1) holds every expert at the rank's TP slice: 0..5 / 6..11 of the width on ranks 0 / 1
    from ntp_planner.executor.model.reference import Reference
    from ntp_planner.executor.parallel.tensor import rank_slice
    from tests.support.gloo_ranks import run_ranks

    results = run_ranks(3, _checkpoint_rows, tmp_path, timeout_s=60)
    torch.set_default_dtype(torch.float64)
    try:
        ref = dict(Reference(MOE, seed=4).named_parameters())
    finally:
        torch.set_default_dtype(torch.float32)
    for rank, degree, j in ((0, 2, 0), (1, 2, 1), (2, 1, 0)):
        for name, row in results[rank].items():
            want = rank_slice(ref[name], MOE, name.rsplit(".", 1)[-1], degree, j).detach()
            got = {k: torch.from_numpy(v) for k, v in row.items()}
            assert got["param"].shape[0] == 4, (rank, name)
            torch.testing.assert_close(got["param"], want, rtol=0, atol=0, msg=f"rank {rank} {name}")
            torch.testing.assert_close(got["exp_avg"], want + 1, rtol=0, atol=0)
            torch.testing.assert_close(got["exp_avg_sq"], want * 2, rtol=0, atol=0)


def test_lockstep_splits_groups_by_micro_batches_and_merges_the_short_parts():
    # before folding, TP4 x 2 pipelines, ep 2: groups (j, 4 + j); pipeline 0 holds experts 0-1,
    # pipeline 1 experts 2-3, each TP rank whole. Rank 1 lost: its group (1, 5) is rank 4 (old
    # 5) alone, holding all four; pipeline 0 runs fewer micro-batches on ranks 0-2, pipeline 1
    # on 3-6. The groups across the two split; the short parts of each pipeline merge
    plain = make_spec(MOE, [[4, 4, 4, 4]], [([4], 2)] * 2, 1, 8, ep=2)
    host = rehost(as_hosting(plain), 1)
    assert host[0].groups == ((0, 3), (4,), (1, 5), (2, 6))
    kind = {0: 1, 1: 1, 2: 1, 3: 2, 4: 2, 5: 2, 6: 2}
    (after,) = lockstep(host, kind)
    assert after.groups == ((0, 1, 2), (3, 5, 6), (4,))
    # in (0, 1, 2) experts 0, 1 stay with 0, 1 (they held them), 2 and 3 go to the fewest (2,
    # then 0); in (3, 5, 6) 2, 3 stay with 3, 5, then 0 to 6 and 1 to 3; rank 4 keeps all
    assert after.owners == ((0, 4, 6), (1, 3, 4), (2, 3, 4), (0, 4, 5))
    (same,) = lockstep(host, dict.fromkeys(range(7), 2))  # all in step: the groups and owners stay
    assert sorted(same.groups) == sorted(host[0].groups) and same.owners == host[0].owners


@pytest.mark.slow  # in `make test-slow`; faster cases of the same path stay in `make test`
@pytest.mark.timeout(180)
def test_a_degraded_replica_with_fewer_micro_batches_keeps_every_expert_on_its_own_ranks():
    (host,) = as_hosting(run([2, 2], ep=2))
    kind = {0: 2, 1: 2, 2: 1}
    hosting = lockstep(rehost((host,), 3), kind)
    spec = make_spec(MOE, [[2, 2, 2, 2]], [([2], 2), ([1], 1)], 2, 8, dtype="float64", ep=2, etp=1, hosting=hosting)
    check(launch(spec, timeout_s=150))
