"""The gradient sync (``data.sync_gradients``) on forked gloo ranks against the sum worked out
in one process: every rank starts from its share of per-copy gradients (a cut KV head's
gradient split between its owners, as the TP backward leaves it) and must end holding its
layout's slice of the sum over every copy of every replica. Three paths: one degree with a cut
KV head (TP3 + TP3), copies inside a stage (a layer at degree 1 on stages of 2), and NTP
(TP3 + TP1: summed, resharded to the smallest degree, summed 1:1, resharded back)."""

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

from ntp_planner.executor.model.reference import Reference  # noqa: E402
from ntp_planner.executor.parallel.comm import Comm  # noqa: E402
from ntp_planner.executor.parallel.data import sync_gradients  # noqa: E402
from ntp_planner.executor.parallel.ownership import layer_shards  # noqa: E402
from ntp_planner.executor.parallel.tensor import param_index  # noqa: E402
from ntp_planner.executor.spec import TinyConfig, make_spec  # noqa: E402
from tests.support.gloo_ranks import run_ranks  # noqa: E402

CFG = TinyConfig()  # 8 heads of 4 in 2 KV groups, FFN 48: TP3 deals heads 3/3/2 and cuts both groups
KEYS = ("norm1", "q", "k", "v", "o", "up", "down")  # every cut: rows, columns, KV heads, replicated
BLOCK = 1  # layers.0 of the stage's embed, layers.0, layers.1, head
SPECS = {
    "tp3+tp3": make_spec(CFG, [[3, 3, 3, 3]], [([3], 1), ([3], 1)], 1, 8),
    "copies": make_spec(CFG, [[2, 1, 2, 2]], [([2], 1), ([2], 1)], 2, 8),
    "ntp-tp3+tp1": make_spec(CFG, [[3, 3, 3, 3]], [([3], 1), ([1], 1)], 1, 8),
}
SHAPES = {k: tuple(getattr(Reference(CFG).layers[0], k).shape) for k in KEYS}


def contribution(replica: int, copy: int, key: str) -> torch.Tensor:
    """One copy's whole gradient of ``key`` (float64, distinct per copy, replica and key)."""
    seed = 1000 * replica + 100 * copy + KEYS.index(key)
    return torch.randn(SHAPES[key], generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


class BlockState:  # what ``data`` reads of a rank's block (``train.stage.BlockState``)
    def __init__(self, stage, block, rank):
        self.block = block
        self.copy, self.tp_rank = stage.position(rank, block.degree)
        self.tp_ranks = stage.copy_tp_groups(block.degree)[self.copy]
        self.shards = layer_shards(CFG.heads, CFG.kv_heads, CFG.ffn, block.degree)


class Model:  # what ``data`` reads of a rank's ``StageModel``: the layer's parameters only
    sp = False

    def __init__(self, spec, rank):
        replica, s = spec.locate(rank)
        self.replica, self.stage = replica, spec.replicas[replica].stages[s]
        self.blocks = [BlockState(self.stage, b, rank) for b in self.stage.blocks]
        self.params = []
        bs = self.blocks[BLOCK]
        for key in KEYS:
            grad = local_grad(key, replica, bs)
            p = torch.zeros_like(grad, requires_grad=True)
            p.grad = grad
            self.params.append((f"layers.0.{key}", key, bs, p))

    def named_parameters(self):
        return iter(self.params)


def local_grad(key: str, replica: int, bs) -> torch.Tensor:
    """The rank's gradient before the sync: its copy's contribution in its slice; the rows of a
    KV head it shares with m - 1 other owners carry only a part (owner i: (i + 1) / (1 + .. + m))."""
    full = contribution(replica, bs.copy, key)
    idx = param_index(CFG, key, bs.block.degree, bs.tp_rank)
    if idx is None:
        return full  # replicated: every TP rank of the copy holds its copy's whole gradient
    dim, rows = idx
    mine = full.index_select(dim, torch.tensor(rows))
    if key in ("k", "v"):
        kvs = bs.shards.kv_heads[bs.tp_rank]
        for n, kv in enumerate(kvs):
            owners = bs.shards.kv_owners(kv)
            share = (owners.index(bs.tp_rank) + 1) / (len(owners) * (len(owners) + 1) / 2)
            mine[n * CFG.head_dim : (n + 1) * CFG.head_dim] *= share
    return mine


def _sync(name: str):
    def run(rank: int) -> dict:
        spec = SPECS[name]
        model = Model(spec, rank)
        comm = Comm(spec, rank)
        sync_gradients(model, spec, 0, comm, {n: SHAPES[k] for n, k, _, _ in model.params})
        bs = model.blocks[BLOCK]
        return {
            "where": (bs.block.degree, bs.tp_rank),
            **{k: p.grad for _, k, _, p in model.params},
        }

    return run


@pytest.mark.parametrize("name", list(SPECS))
def test_every_rank_holds_its_slice_of_the_sum_over_copies_and_replicas(name, tmp_path):
    spec = SPECS[name]
    world = sum(st.width for rep in spec.replicas for st in rep.stages)
    results = run_ranks(world, _sync(name), tmp_path)
    copies = [spec.replicas[r].stages[0].width // spec.replicas[r].stages[0].blocks[BLOCK].degree for r in (0, 1)]
    for key in KEYS:
        total = sum(contribution(r, c, key) for r in (0, 1) for c in range(copies[r]))
        for rank, got in enumerate(results):
            t, j = got["where"]
            idx = param_index(CFG, key, t, j)
            want = total if idx is None else total.index_select(idx[0], torch.tensor(idx[1]))
            torch.testing.assert_close(got[key], want, rtol=1e-12, atol=1e-12, msg=f"{name} rank {rank} {key}")


def test_the_cases_take_the_paths_they_name():
    # one degree, a cut KV head: TP3 gives KV head 0 to ranks 0 and 1, KV head 1 to ranks 1 and 2
    s = layer_shards(CFG.heads, CFG.kv_heads, CFG.ffn, 3)
    assert [s.kv_owners(kv) for kv in (0, 1)] == [(0, 1), (1, 2)]
    degrees = {n: [rep.stages[0].blocks[BLOCK].degree for rep in spec.replicas] for n, spec in SPECS.items()}
    assert degrees == {"tp3+tp3": [3, 3], "copies": [1, 1], "ntp-tp3+tp1": [3, 1]}
    assert [st.width for rep in SPECS["copies"].replicas for st in rep.stages] == [2, 2]  # 2 copies each
