"""The executor's collectives (``comm``): one-rank groups skipped, the progress counters and
time categories a call records (a one-process gloo group), the collectives and autograd pieces
on two forked gloo ranks against sums worked by hand, and ``lost_peer``'s classification."""

import time

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

import torch.distributed as dist  # noqa: E402

from ntp_planner.executor.parallel import comm as comm_mod  # noqa: E402
from ntp_planner.executor.parallel.comm import KINDS, Comm, GatherVocab, lost_peer  # noqa: E402
from ntp_planner.executor.spec import TinyConfig, make_spec  # noqa: E402
from tests.support.gloo_ranks import run_ranks  # noqa: E402

CFG = TinyConfig()
ONE = make_spec(CFG, [[1, 1, 1, 1]], [([1], 1)], 1, 8)  # one rank: every group has one member
TWO = make_spec(CFG, [[2, 2, 2, 2]], [([2], 1)], 1, 8)  # one stage of ranks (0, 1)


@pytest.fixture
def world_of_one(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_groups_of_one_rank_are_not_created_and_their_collectives_are_skipped():
    comm = Comm(ONE, 0, progress=[0, 0, 0])  # no process group exists: nothing may call into gloo
    assert set(comm.groups) == {(0,)} and comm.groups[(0,)] is None
    t = torch.tensor([1.0, 2.0])
    assert comm.all_reduce(t, (0,), "tp") is t and t.tolist() == [1.0, 2.0]
    assert comm.broadcast(t, 0, (0,)) is t
    (part,) = comm.all_gather(t, (0,), "tp")
    assert part is t
    assert comm.entered == 0 and comm.progress == [0, 0, 0] and comm.spent_s == dict.fromkeys(KINDS, 0.0)


def test_progress_counts_a_collective_entered_before_it_is_left(world_of_one, monkeypatch):
    # rank 1's slots of a 2-rank progress array are 4 (entered) and 5 (left); inside the call
    # the rank has entered one more collective than it has left
    progress = [0] * 6
    comm = Comm(ONE, 1, progress=progress)
    inside = []
    real = dist.all_reduce

    def watched(t, **kw):
        inside.append(list(progress))
        return real(t, **kw)

    monkeypatch.setattr(dist, "all_reduce", watched)
    comm.world_reduce(torch.ones(2))
    comm.world_reduce(torch.ones(2))
    assert inside == [[0, 0, 0, 0, 1, 0], [0, 0, 0, 0, 2, 1]]
    assert progress == [0, 0, 0, 0, 2, 2] and comm.entered == 2


def test_time_goes_to_the_enclosing_category_or_to_none(world_of_one, monkeypatch):
    comm = Comm(ONE, 0)
    real = dist.all_reduce

    def slow(t, **kw):  # a collective that waits 20 ms for its peers
        time.sleep(0.02)
        return real(t, **kw)

    monkeypatch.setattr(dist, "all_reduce", slow)
    comm.world_reduce(torch.ones(1))  # no category: untimed (the run's bookkeeping)
    assert comm.spent_s == dict.fromkeys(KINDS, 0.0)
    with comm.category("dp"):
        with comm.category("pp"):
            comm.world_reduce(torch.ones(1))
        comm.world_reduce(torch.ones(1))  # the outer category again
    assert 0.02 <= comm.spent_s["pp"] < 0.5 and 0.02 <= comm.spent_s["dp"] < 0.5
    assert comm.spent_s["tp"] == comm.spent_s["cp"] == comm.spent_s["ep"] == 0.0
    assert comm._kind is None
    with pytest.raises(ValueError, match="unknown communication category 'bubble'"):
        with comm.category("bubble"):
            pass


def test_the_fault_hook_fires_with_the_category_before_the_collective_is_entered(world_of_one):
    comm = Comm(ONE, 0, progress=[0, 0, 0])
    seen = []

    def fault(kind):
        seen.append(kind)
        raise RuntimeError("injected")

    comm.fault = fault
    with comm.category("dp"), pytest.raises(RuntimeError, match="injected"):
        comm.world_reduce(torch.ones(1))
    assert seen == ["dp"] and comm.entered == 0 and comm.progress == [0, 0, 0]
    comm.fault = None
    assert comm.gather_objects({"rank": 0}) == [{"rank": 0}]  # rank 0 gathers every rank's object


def _two_rank_collectives(rank: int) -> dict:
    comm = Comm(TWO, rank, progress=[0] * 6)
    ranks = (0, 1)
    out = {"sum": comm.all_reduce(torch.tensor([1.0, 2.0, 3.0]) * (rank + 1), ranks, "tp").tolist()}
    out["gather"] = [p.tolist() for p in comm.all_gather(torch.tensor([10.0 * rank]), ranks, "tp")]
    out["broadcast"] = comm.broadcast(torch.tensor([5.0 + rank]), 1, ranks).tolist()
    # uneven all-to-all: rank 0 keeps 1 row and sends 2 to rank 1; rank 1 sends its 3 rows to rank 0
    rows = torch.tensor([[10.0 * rank + i] for i in range(3)])
    send, recv = ([1, 2], [1, 3]) if rank == 0 else ([3, 0], [2, 0])
    out["a2a"] = comm.all_to_all(rows, ranks, send, recv).view(-1).tolist()
    # uneven sequence chunks (rows 0-2 and 3-4 of 5): reduce-scatter, then all-gather the chunks
    bounds = ((0, 3), (3, 5))
    x = torch.arange(10.0).view(1, 5, 2) * (rank + 1)
    out["rs"] = comm_mod._reduce_scatter_seq(comm, x, ranks, bounds, rank).tolist()
    mine = x[:, slice(*bounds[rank])]
    out["gs"] = comm_mod._gather_seq(comm, mine, ranks, bounds).tolist()
    # vocabulary shards of 3 and 2 columns: forward concatenates, backward keeps this rank's
    logits = torch.full((2, 3 if rank == 0 else 2), float(rank + 1), requires_grad=True)
    full = GatherVocab.apply(logits, comm, ranks, (3, 2), rank)
    (full * torch.arange(10.0).view(2, 5)).sum().backward()
    out["vocab"], out["vocab_grad"] = full.tolist(), logits.grad.tolist()
    got = comm.exchange(torch.tensor([100.0 + rank]), 1 - rank, (1,), 1 - rank, like=rows)
    out["exchange"] = got.tolist()
    out["progress"], out["spent"] = comm.progress, comm.spent_s
    return out


def test_collectives_on_two_ranks_by_hand(tmp_path):
    r0, r1 = run_ranks(2, _two_rank_collectives, tmp_path)
    for r in (r0, r1):
        assert r["sum"] == [3.0, 6.0, 9.0]
        assert r["gather"] == [[0.0], [10.0]]
        assert r["broadcast"] == [6.0]
        assert r["gs"] == [[[float(v) for v in pair] for pair in ((0, 1), (2, 3), (4, 5), (12, 14), (16, 18))]]
        assert r["vocab"] == [[1.0, 1.0, 1.0, 2.0, 2.0]] * 2
    assert r0["a2a"] == [0.0, 10.0, 11.0, 12.0] and r1["a2a"] == [1.0, 2.0]
    # the sum is 3 x arange: rank 0 keeps sequence rows 0-2, rank 1 rows 3-4
    assert r0["rs"] == [[[0.0, 3.0], [6.0, 9.0], [12.0, 15.0]]] and r1["rs"] == [[[18.0, 21.0], [24.0, 27.0]]]
    assert r0["vocab_grad"] == [[0.0, 1.0, 2.0], [5.0, 6.0, 7.0]] and r1["vocab_grad"] == [[3.0, 4.0], [8.0, 9.0]]
    assert r0["exchange"] == [101.0] and r1["exchange"] == [100.0]
    # 8 calls entered and left on each rank (GatherVocab's backward only slices), in its own slots
    assert r0["progress"] == [0, 8, 8, 0, 0, 0] and r1["progress"] == [0, 0, 0, 0, 8, 8]
    for r in (r0, r1):
        assert r["spent"]["tp"] > 0 and r["spent"]["ep"] > 0  # the all-to-all is timed under "ep"
        assert r["spent"]["dp"] == r["spent"]["pp"] == r["spent"]["cp"] == 0.0


@pytest.mark.parametrize(
    ("exc", "lost"),
    [
        (dist.DistError("anything"), True),
        (RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer"), True),
        (RuntimeError("NCCL communicator was aborted on rank 3"), True),
        (ConnectionResetError("Connection reset by peer"), True),
        (RuntimeError("Wait timed out after 30000 ms"), True),
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x8 and 16x8)"), False),
        (ValueError("degree 9 must be between 1 and the heads (8)"), False),
        (KeyError((0, 1)), False),
    ],
)
def test_lost_peer_tells_a_failed_collective_from_the_rank_s_own_error(exc, lost):
    assert lost_peer(exc) is lost
