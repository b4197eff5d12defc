"""ZeRO-3's gather / free / reduce-scatter around a block (``fsdp.BlockShards``) in one process,
as rank 1 of a group of 2: its engine (``zero.ShardedOptimizer``) is replaced by a stand-in
whose all-gather puts the other member's shard before this one's and whose reduce-scatter keeps
this member's padded chunk. A 3 x 5 parameter (15 elements) shards as ceil(15 / 2) = 8: rank 1
holds elements 8..14 (7) and its reduce-scatter chunk is 8 long, one of them padding."""

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

import torch.nn.functional as F  # noqa: E402

from ntp_planner.executor.parallel.fsdp import BlockShards  # noqa: E402

SHAPE, SIZE = (3, 5), 8  # 15 elements over 2 members: chunks of 8, this rank's [8, 15)


class Engine:
    """What ``BlockShards`` reads of ``ShardedOptimizer``, for one block with one parameter."""

    def __init__(self, zero: int, reshard: bool):
        self.w = torch.arange(15.0, dtype=torch.float64).view(SHAPE) / 10
        self.bs = SimpleNamespace(block=SimpleNamespace(degree=1), tp_rank=0, tp_ranks=(0,), params={})
        master = self.w.reshape(-1)[SIZE:].clone().requires_grad_(True)
        slot = SimpleNamespace(key="up", bs=self.bs, param=self.w.clone(), master=master, low=None, full_shape=SHAPE)
        self.slots, self.comm, self.cfg = [slot], SimpleNamespace(category=lambda kind: _null()), None
        self.spec = SimpleNamespace(zero=zero, reshard_after_forward=reshard)
        self.model = SimpleNamespace(sp=False, blocks=[self.bs])
        self.gathers, self.scattered = 0, []

    def _all_gather(self, s, part):
        self.gathers += 1
        return torch.cat([self.w.reshape(-1)[:SIZE], part(s.master).detach()])  # member 0's shard, then ours

    def _reduce_scatter(self, s, g):
        self.scattered.append(g.clone())
        return F.pad(g.reshape(-1), (0, 2 * SIZE - g.numel()))[SIZE:]  # our chunk of the padded whole

    @property
    def slot(self):
        return self.slots[0]


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def forward(z3: BlockShards, engine: Engine, x: torch.Tensor) -> torch.Tensor:
    z3.enter(engine.bs)
    y = x @ engine.bs.params["up"].T
    return z3.leave(engine.bs, y)


def held(engine: Engine) -> int:
    return engine.slot.param.untyped_storage().nbytes()


XS = [torch.full((2, 5), 1.0 + i, dtype=torch.float64) for i in range(2)]
# d/dW of sum(x @ W.T) for x = c (2 rows): every element 2c; micro-batches c = 1 and 2: 2 + 4
WANT_SHARD_GRAD = [6.0] * 7


def test_zero3_frees_after_forward_and_gathers_again_for_backward():
    engine = Engine(zero=3, reshard=True)
    z3 = BlockShards(engine)
    assert held(engine) == 0  # between uses only the shard is held
    ys = [forward(z3, engine, x) for x in XS]  # two micro-batches in flight
    assert held(engine) == 0 and engine.gathers == 2
    assert ys[0].tolist() == (XS[0] @ engine.w.T).tolist()  # gathered: the whole parameter
    for y in ys:
        y.sum().backward()  # Refill gathers the weight back before the matmul's backward reads it
        assert held(engine) == 0  # and the reduce-scatter frees it again
    assert engine.gathers == 4
    assert [g.shape for g in engine.scattered] == [SHAPE, SHAPE]  # one reduce-scatter per micro-batch
    assert engine.slot.master.grad.tolist() == WANT_SHARD_GRAD  # the padded chunk cut to the 7 held


def test_kept_after_forward_the_buffer_goes_with_the_last_micro_batch_in_flight():
    engine = Engine(zero=3, reshard=False)
    z3 = BlockShards(engine)
    ys = [forward(z3, engine, x) for x in XS]
    assert held(engine) == 15 * 8 and engine.gathers == 2  # gathered once per micro-batch, kept
    ys[0].sum().backward()
    assert held(engine) == 15 * 8 and z3.in_flight[id(engine.bs)] == 1
    ys[1].sum().backward()
    assert held(engine) == 0 and z3.in_flight[id(engine.bs)] == 0 and engine.gathers == 2
    assert engine.slot.master.grad.tolist() == WANT_SHARD_GRAD


def test_the_next_gather_brings_the_updated_shard():
    engine = Engine(zero=3, reshard=True)
    z3 = BlockShards(engine)
    forward(z3, engine, XS[0]).sum().backward()
    with torch.no_grad():
        engine.slot.master.add_(1.0)  # the optimizer's step on this rank's shard
    z3.materialize()
    want = engine.w.reshape(-1).clone()
    want[SIZE:] += 1.0
    assert engine.bs.params["up"].reshape(-1).tolist() == want.tolist()


def test_zero2_keeps_the_parameters_and_reduce_scatters_every_micro_batch():
    engine = Engine(zero=2, reshard=True)
    z3 = BlockShards(engine)
    assert held(engine) == 15 * 8  # ZeRO-2: parameters stay whole
    for x in XS:
        forward(z3, engine, x).sum().backward()
    assert held(engine) == 15 * 8 and engine.gathers == 0 and len(engine.scattered) == 2
    assert engine.slot.master.grad.tolist() == WANT_SHARD_GRAD
