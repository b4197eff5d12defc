"""Sharded state (ZeRO 1-3, expert parallelism) on a layout change: what each rank holds, checked
against the real model and optimizer, and the move plan applied in one process against brute
force (every element a new rank holds equals the full tensor's, what no survivor holds is
missing, nothing comes from a dead process)."""

import numpy as np
import pytest
import torch

from ntp_planner.executor.elastic import handover
from ntp_planner.executor.elastic.sharded import MOMENTS, _put, _take, holdings, plan_shards
from ntp_planner.executor.model.reference import Reference
from ntp_planner.executor.parallel.zero import ShardedOptimizer
from ntp_planner.executor.spec import TinyConfig, make_spec
from ntp_planner.executor.train.stage import StageModel

CFG = TinyConfig()  # 8 heads, 2 KV heads, FFN 48, vocabulary 64, 2 layers
MOE = TinyConfig(experts=4, top_k=2, expert_ffn=8, moe_layers=(1,), shared_ffn=6)


def spec(*widths, zero=0, cfg=CFG, ep=1):
    """Replicas at TP ``widths`` (every block at the replica's width), one stage each."""
    return make_spec(cfg, [[4, 4, 4, 4]], [([w], 1) for w in widths], 1, 4, width=4, zero=zero, ep=ep)


class _Rank:
    def __init__(self, rank):
        self.rank = rank


@pytest.mark.parametrize(
    "s",
    [spec(2, 2, zero=1), spec(4, 3, zero=2), spec(2, 2, zero=3), spec(1, 1, 1, 1, cfg=MOE, ep=2)],
    ids=["zero1", "zero2-ntp", "zero3", "moe-ep2"],
)
def test_holdings_are_what_the_model_and_optimizer_hold(s):
    torch.manual_seed(0)
    ref = Reference(s.cfg, seed=3)
    full = {k: v.detach().reshape(-1) for k, v in ref.named_parameters()}
    covered = {k: set() for k in full}
    for rank in range(s.world_size):
        replica, st = s.locate(rank)
        model = StageModel(s, s.replicas[replica].stages[st], rank, ref, _Rank(rank), torch.device("cpu"))
        engine = ShardedOptimizer(s, model, ref, _Rank(rank)) if s.zero else None
        got = holdings(s, rank)
        for i, (name, _, _, p) in enumerate(model.named_parameters()):
            param, opt = got[name]
            if s.zero < 3:
                assert torch.equal(p.detach().reshape(-1), full[name][param]), (rank, name)
            else:
                assert len(param) == 0  # ZeRO-3 frees the buffers between steps
            t = p if engine is None else engine.slots[i].master
            if t is not None:
                assert torch.equal(t.detach().reshape(-1), full[name][opt]), (rank, name)
            covered[name].update(opt.tolist())
    # AdamW's state covers every element: once under ZeRO (one shard each), on every replica at ZeRO-0
    assert all(covered[k] == set(range(len(full[k]))) for k in full)


def _apply(old, old_procs, new, new_procs):
    """The plan run in one process on state that names itself: full tensors P (weights), A, V
    (moments) known; old rank r holds them at its ``opt`` indices. Returns (plan, per new rank the
    state it ends with)."""
    gen = torch.Generator().manual_seed(1)
    shapes = {k: v.numel() for k, v in Reference(new.cfg).named_parameters()}
    truth = {k: {m: torch.randn(n, generator=gen, dtype=torch.float64) for m in MOMENTS} for k, n in shapes.items()}
    old_rank = {p: r for r, p in enumerate(old_procs)}
    kept = {}
    for r, p in enumerate(new_procs):
        if p in old_rank:
            h = holdings(old, old_rank[p])
            kept[r] = {k: {m: truth[k][m][torch.from_numpy(o)] for m in MOMENTS} | {"step": torch.tensor(5.0)}
                       for k, (_, o) in h.items()}  # fmt: skip
    plan = plan_shards(old, old_procs, new, new_procs)
    out = []
    for dst, held_ in enumerate(plan.held):
        got = {k: {"param": torch.full((len(p),), np.nan, dtype=torch.float64)}
               | {m: torch.full((len(o),), np.nan, dtype=torch.float64) for m in MOMENTS} | {"step": None}
               for k, (p, o) in held_.items()}  # fmt: skip
        for piece in [*plan.copies, *plan.moves]:
            if piece.dst == dst:
                assert piece.src in kept  # a source is a process of both layouts
                _put(got[piece.name], _take(kept[piece.src][piece.name], piece), piece)
        out.append(got)
    return plan, truth, kept, out


CASES = {
    # TP2 x DP2 at ZeRO-1, process 1 dies: replica 0 runs TP1 (procs 0), replica 1 stays
    "zero1-kill": (spec(2, 2, zero=1), (0, 1, 2, 3), spec(1, 2, zero=1), (0, 2, 3)),
    # the repair of it: process 1 back, TP2 x DP2 again, everything from peers
    "zero1-repair": (spec(1, 2, zero=1), (0, 2, 3), spec(2, 2, zero=1), (0, 1, 2, 3)),
    # ZeRO-3 beside a narrower replica drops to ZeRO-2 (``relayout``): weights from the shards
    "zero3-to-zero2": (spec(2, 2, zero=3), (0, 1, 2, 3), spec(2, 1, zero=2), (0, 1, 2)),
    # MoE at ep 2 over 4 pipelines, process 3 dies: 3 pipelines at ep 1 hold every expert
    "moe-ep2-kill": (spec(1, 1, 1, 1, cfg=MOE, ep=2), (0, 1, 2, 3), spec(1, 1, 1, cfg=MOE), (0, 1, 2)),
    # and ep 2 kept when 2 of 4 pipelines go (dp-drop): experts re-paired
    "moe-ep2-drop": (spec(1, 1, 1, 1, cfg=MOE, ep=2), (0, 1, 2, 3), spec(1, 1, cfg=MOE, ep=2), (1, 2)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_plan_against_brute_force(case):
    old, old_procs, new, new_procs = CASES[case]
    plan, truth, kept, out = _apply(old, old_procs, new, new_procs)
    # brute force: per new rank and parameter, the elements no survivor's AdamW tensor holds
    alive = {}
    for p in new_procs:
        if p in old_procs:
            for k, (_, o) in holdings(old, old_procs.index(p)).items():
                alive.setdefault(k, set()).update(o.tolist())
    lost = {}
    for held_ in plan.held:
        for k, (p, o) in held_.items():
            n = len(set(p.tolist()) - alive.get(k, set())) + len(set(o.tolist()) - alive.get(k, set()))
            if n:
                lost[k] = lost.get(k, 0) + n
    assert dict(plan.missing) == lost
    for got, held_ in zip(out, plan.held, strict=True):
        for k, (p, o) in held_.items():
            ok_p = np.isin(p, list(alive.get(k, ())))
            ok_o = np.isin(o, list(alive.get(k, ())))
            assert torch.equal(got[k]["param"][ok_p], truth[k]["master"][p[ok_p]])
            for m in MOMENTS:
                assert torch.equal(got[k][m][ok_o], truth[k][m][o[ok_o]]), (k, m)
            assert got[k]["step"] in (None, 5.0)


def test_what_is_missing_by_hand():
    # ZeRO-1 TP2 x DP2 losing process 1. The embedding (64 x 32 = 2048, cut by vocabulary) has
    # flat 1024..2047 at TP rank 1; its group (1, 3) gave process 1 the shard 1024..1535: gone.
    # After: new rank 0 (process 0, TP1) holds all 2048 as its parameter; NTP's core is the TP1
    # layout, sharded over core rank 0 of each replica (new ranks 0, 1): new rank 1 (process 2)
    # updates 1024..2047; new rank 2 (process 3, TP rank 1) holds 1024..2047 as its parameter.
    # Each of the three misses those 512 elements.
    plan = plan_shards(*CASES["zero1-kill"])
    assert dict(plan.missing)["embed"] == 3 * 512
    # nothing is lost in the repair, and the newcomer receives all it holds
    repair = plan_shards(*CASES["zero1-repair"])
    assert not repair.missing and not [c for c in repair.copies if c.dst == 1]
    assert sum(len(m.dst_pos) for m in repair.moves if m.dst == 1 and m.part == "opt") == sum(
        len(o) for _, o in repair.held[1].values()
    )


def test_rows_where_rows_suffice():
    assert handover.by_rows(spec(2, 2)) and not handover.by_rows(spec(2, 2, zero=1))
    assert handover.by_rows(spec(1, 1, cfg=MOE)) and not handover.by_rows(spec(1, 1, cfg=MOE, ep=2))


def test_experts_move_from_the_peer_pipeline_of_their_group():
    # ep 2 over pipelines 0..3: experts 0-1 on pipelines 0 and 2, 2-3 on 1 and 3. Process 3 dies;
    # at ep 1 every pipeline holds all 4 experts: pipeline 0 (process 0) takes experts 2-3 from
    # process 1, pipeline 2 (process 2) too; process 1 takes experts 0-1 from process 0 or 2
    plan = plan_shards(*CASES["moe-ep2-kill"])
    assert not plan.missing
    up = {m.dst: m for m in plan.moves if m.name == "layers.1.expert_up" and m.part == "opt"}
    two_experts = 2 * 8 * 32  # expert_up is [experts, expert_ffn, hidden]
    assert sorted(up) == [0, 1, 2] and all(len(m.dst_pos) == two_experts for m in up.values())
    assert (up[0].src, up[2].src) == (1, 1) and up[1].src in (0, 2)
    assert up[0].dst_pos == tuple(range(two_experts, 2 * two_experts))  # experts 2-3 after its own 0-1
