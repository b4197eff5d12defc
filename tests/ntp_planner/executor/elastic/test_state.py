"""State carried over on a layout change: what each rank holds, which rows move where (by hand,
and simulated in one process against the reference), and the transfer itself on gloo."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ntp_planner.executor.elastic.state import carry, held, plan_moves, snapshot
from ntp_planner.executor.model.reference import Reference
from ntp_planner.executor.spec import Block, ReplicaSpec, RunSpec, StageSpec, TinyConfig, make_spec
from ntp_planner.executor.train.stage import StageModel

CFG = TinyConfig()  # 8 heads, 2 KV heads (head_dim 4), FFN 48, vocabulary 64, 2 layers
BLOCKS = [4, 4, 4, 4]  # embedding, 2 layers, head: one stage at TP4


def tp(*widths: int, pp: int = 1, cfg: TinyConfig = CFG, micro: int = 1) -> RunSpec:
    """Replicas at TP ``widths`` (every block at the replica's width), ``pp`` stages."""
    degrees = [[4] * (len(BLOCKS) // pp)] * pp
    return make_spec(cfg, degrees, [([w] * pp, 1) for w in widths], micro, 4, width=4)


def _slice(full: torch.Tensor, index) -> torch.Tensor:
    return full if index is None else full.index_select(index[0], torch.tensor(index[1]))


# ---- held agrees with StageModel ----------------------------------------------------------------
def _per_layer() -> RunSpec:
    blocks = (Block("embed", -1, 4), Block("layer", 0, 1), Block("layer", 1, 2), Block("head", -1, 4))
    stage = StageSpec((0, 1, 2, 3), blocks)
    return RunSpec(CFG, (ReplicaSpec((stage,), 1),), micro_batch=4, seq_len=4)


MOE = TinyConfig(experts=4, top_k=2, expert_ffn=8, moe_layers=(1,), shared_ffn=6)
LAYER_NORM = TinyConfig(norm="layer", mlp="gelu", bias=True, positions="learned")


@pytest.mark.parametrize(
    "spec",
    [tp(2, 2), _per_layer(), tp(4, 3), tp(2, 1, pp=2), tp(3, cfg=MOE), tp(3, 2, cfg=LAYER_NORM)],
    ids=["uniform", "per-layer", "ntp", "pp2", "moe-ep1", "layernorm-bias-learned"],
)
def test_held_is_what_stage_model_holds(spec):
    ref = Reference(spec.cfg)
    full = dict(ref.named_parameters())
    for rank in range(spec.world_size):
        replica, s = spec.locate(rank)
        model = StageModel(spec, spec.replicas[replica].stages[s], rank, ref, None, torch.device("cpu"))
        got = held(spec, rank)
        names = [name for name, *_ in model.named_parameters()]
        assert list(got) == names
        for name, _, _, t in model.named_parameters():
            assert torch.equal(t.detach(), _slice(full[name], got[name])), (rank, name)


def test_held_by_hand():
    # TP3 of 8 heads in groups of 4: query heads [0,1,2] [3,4,5] [6,7]; KV head 0 on ranks 0 and 1
    spec = tp(3)
    assert held(spec, 1)["layers.0.k"] == (0, (0, 1, 2, 3, 4, 5, 6, 7))  # KV heads 0 and 1, 4 rows each
    assert held(spec, 2)["layers.0.o"] == (1, tuple(range(24, 32)))  # heads 6, 7: columns of the output
    assert held(spec, 0)["head"] == (0, tuple(range(22)))  # vocabulary 64 = 22 + 21 + 21
    assert held(spec, 0)["layers.1.norm2"] is None


def test_expert_parallelism_is_refused_in_one_sentence():
    st_ = lambda ranks: StageSpec(ranks, (Block("embed", -1, 1), Block("layer", 0, 1), Block("head", -1, 1)))  # noqa: E731
    cfg = TinyConfig(layers=1, experts=4, top_k=2, expert_ffn=8, moe_layers=(0,))
    spec = RunSpec(cfg, (ReplicaSpec((st_((0,)),), 1), ReplicaSpec((st_((1,)),), 1)), 1, 4, ep=2)
    with pytest.raises(ValueError, match=r"^carrying state under expert parallelism \(ep 2\) is not supported"):
        held(spec, 0)


# ---- plan_moves by hand ---------------------------------------------------------------------------
OLD = tp(4, 4)  # ranks 0..3 replica 0, 4..7 replica 1
NEW = tp(3, 4)  # process 1 died: replica 0 runs TP3 on processes 0, 2, 3 (new ranks 0..2), replica 1 on 3..6
NEW_PROCS = (0, 2, 3, 4, 5, 6, 7)


def _moves(plan, name):
    return [(m.src, m.dst, m.src_pos, m.dst_pos) for m in plan.moves if m.name == name]


def test_tp4_to_tp3_moves_only_what_changes_owner():
    plan = plan_moves(OLD, tuple(range(8)), NEW, NEW_PROCS)
    assert plan.missing == ()
    up = _moves(plan, "layers.0.up")  # 48 rows: 12 per TP4 rank, 16 per TP3 rank
    # new rank 0 (process 0) kept 0..11 and needs 12..15: only process 5 (new rank 4, rows 12..23) has them;
    # new rank 1 (process 2, rows 24..35) keeps 24..31 and needs 16..23: process 5 again
    assert up[0] == (4, 0, (0, 1, 2, 3), (12, 13, 14, 15))
    assert up[1] == (4, 1, (4, 5, 6, 7, 8, 9, 10, 11), tuple(range(8)))
    # new rank 2 (process 3, rows 36..47) needs 32..35: process 2 (new rank 1) or process 6 (new rank 5),
    # positions 8..11 of either's rows 24..35
    assert up[2][0] in (1, 5) and up[2][1:] == (2, (8, 9, 10, 11), (0, 1, 2, 3)) and len(up) == 3
    copies = [(c.dst, c.src_pos, c.dst_pos) for c in plan.copies if c.name == "layers.0.up" and c.dst < 3]
    assert copies == [(0, tuple(range(12)), tuple(range(12))), (1, tuple(range(8)), tuple(range(8, 16)))] + [
        (2, tuple(range(12)), tuple(range(4, 16)))
    ]
    # the KV heads: TP4 ranks hold KV head 0, 0, 1, 1; TP3 ranks 0, {0, 1}, 1: only new rank 1 lacks a head
    assert [(m[1], m[3]) for m in _moves(plan, "layers.0.k")] == [(1, (0, 1, 2, 3))]
    # replicated norms never move: every rank had them
    assert _moves(plan, "layers.0.norm1") == []
    # bytes: param, exp_avg, exp_avg_sq rows of 32 floats, plus the step, per message
    assert plan.moves[0].bytes == plan.moves[0].rows * 3 * 32 * 4 + 4


def test_a_healthy_replica_moves_nothing():
    plan = plan_moves(OLD, tuple(range(8)), NEW, NEW_PROCS)
    assert not [m for m in plan.moves if m.dst >= 3]
    for c in plan.copies:
        if c.dst >= 3:
            assert c.src_pos == c.dst_pos
    assert len([c for c in plan.copies if c.dst >= 3]) == 4 * len(held(NEW, 3))


def test_a_dropped_replica_leaves_the_rest_in_place():
    # dp-drop: process 1 dies, replica 1 (processes 4..7) carries on alone as new ranks 0..3
    plan = plan_moves(OLD, tuple(range(8)), tp(4), (4, 5, 6, 7))
    assert plan.moves == () and plan.missing == () and plan.bytes_moved == 0
    assert plan.rows_copied == sum(1 if i is None else len(i[1]) for h in plan.held for i in h.values())
    assert all(c.src_pos == c.dst_pos for c in plan.copies)


def test_a_newcomer_gets_everything_from_peers():
    # repair: process 8 joins replica 0 as new rank 1, back to TP4 x DP2
    old, old_procs = NEW, NEW_PROCS
    plan = plan_moves(old, old_procs, OLD, (0, 8, 2, 3, 4, 5, 6, 7))
    assert not [c for c in plan.copies if c.dst == 1]
    for name, index in held(OLD, 1).items():
        got = sorted(p for m in plan.moves if m.dst == 1 and m.name == name for p in (m.dst_pos or (0,)))
        assert got == list(range(len(index[1]) if index else 1)), name
    assert sum(m.bytes for m in plan.moves if m.dst == 1) > 0


def test_rows_no_survivor_holds_are_missing():
    # one TP4 replica, process 3 dies: its FFN rows 36..47 and vocabulary rows 48..63 are gone, but
    # KV head 1 lives on as well on process 2 (TP4 ranks hold KV heads 0, 0, 1, 1)
    plan = plan_moves(tp(4), (0, 1, 2, 3), tp(3), (0, 1, 2))
    missing = dict(plan.missing)
    assert missing["layers.1.down"] == tuple(range(36, 48))
    assert missing["head"] == tuple(range(48, 64))
    assert missing["layers.0.q"] == tuple(range(24, 32))  # heads 6, 7
    assert "layers.0.k" not in missing and "layers.0.norm1" not in missing


def test_sources_share_the_load():
    # TP2 x DP3; process 0 is replaced by newcomer 6: TP rank 0's rows live on processes 2 and 4, the
    # replicated norms on every survivor
    old = tp(2, 2, 2)
    plan = plan_moves(old, tuple(range(6)), old, (6, 1, 2, 3, 4, 5))
    assert {m.dst for m in plan.moves} == {0}
    cut = [m for m in plan.moves if m.src_pos is not None]
    sent = {s: sum(m.bytes for m in plan.moves if m.src == s) for s in range(6)}
    assert {m.src for m in cut} == {2, 4}
    assert abs(sent[2] - sent[4]) <= max(m.bytes for m in cut)  # alternately, the least loaded first
    whole = [m.src for m in plan.moves if m.src_pos is None]
    assert set(whole) == {1, 3, 5}  # a norm is tiny: it goes to whoever has sent least


def test_procs_must_name_every_rank():
    with pytest.raises(ValueError, match=r"3 old procs for world 8"):
        plan_moves(OLD, (0, 1, 2), NEW, NEW_PROCS)


# ---- every new holding, after copies and moves, is exactly its rows of the full tensor -------------
def _state(full: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"param": full, "exp_avg": full * 2 + 1, "exp_avg_sq": full.square(), "step": torch.tensor(7.0)}


def simulate(old, old_procs, new, new_procs, ref: Reference) -> list[dict]:
    """The plan run in one process: each new rank's tensors built from the old holders' slices."""
    full = {n: _state(p.detach()) for n, p in ref.named_parameters()}
    old_of = {p: r for r, p in enumerate(old_procs)}
    before = {
        r: {n: {k: _slice(v, i) if k != "step" else v for k, v in full[n].items()} for n, i in held(old, r).items()}
        for r in range(old.world_size)
    }
    plan = plan_moves(old, old_procs, new, new_procs)
    after = []
    for dst, holding in enumerate(plan.held):
        out = {n: {k: torch.full_like(_slice(full[n][k], i), float("nan")) for k in ("param", "exp_avg", "exp_avg_sq")}
               for n, i in holding.items()}  # fmt: skip
        for p in (*plan.copies, *plan.moves):
            if p.dst != dst:
                continue
            src = before[old_of[new_procs[p.src]]][p.name]
            dim = None if holding[p.name] is None else holding[p.name][0]
            for k, t in out[p.name].items():
                if p.dst_pos is None:
                    assert torch.isnan(t).all()
                    t.copy_(src[k])
                else:
                    rows = t.index_select(dim, torch.tensor(p.dst_pos))
                    assert torch.isnan(rows).all(), "a row written twice"
                    t.index_copy_(dim, torch.tensor(p.dst_pos), src[k].index_select(dim, torch.tensor(p.src_pos)))
        after.append(out)
    return [plan, after, full]


@settings(max_examples=40, deadline=None)
@given(
    old_widths=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    new_widths=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    pp=st.sampled_from([1, 2]),
    data=st.data(),
)
def test_after_the_plan_every_holding_is_its_rows_of_the_full_tensor(old_widths, new_widths, pp, data):
    old, new = tp(*old_widths, pp=pp), tp(*new_widths, pp=pp)
    old_procs = tuple(range(old.world_size))
    pool = list(range(max(old.world_size + 3, new.world_size)))  # survivors and newcomers
    new_procs = tuple(data.draw(st.permutations(pool))[: new.world_size])
    ref = Reference(CFG)
    plan, after, full = simulate(old, old_procs, new, new_procs, ref)
    lost = {name: set(rows or (None,)) for name, rows in plan.missing}
    for dst, holding in enumerate(plan.held):
        for name, index in holding.items():
            for k, got in after[dst][name].items():
                want = _slice(full[name][k], index)
                if name not in lost:
                    assert torch.equal(got, want), (dst, name, k)
                    continue
                rows = [None] if index is None else list(index[1])
                for i, row in enumerate(rows):  # rows no survivor held stay unwritten, and only those
                    g = got if row is None else got.select(index[0], i)
                    w = want if row is None else want.select(index[0], i)
                    assert torch.isnan(g).all() if row in lost[name] else torch.equal(g, w), (dst, name, row)


# ---- the transfer itself: processes on gloo, one process group per generation -----------------------
GENERATIONS = (  # (spec, procs, AdamW steps taken after the carry)
    (tp(2, 2), (0, 1, 2, 3), 2),  # TP2 x DP2
    (tp(2, 1), (0, 1, 2), 1),  # process 3 died: replica 1 runs TP1 on process 2
    (tp(2, 2), (0, 1, 3, 2), 1),  # process 3 is back (a newcomer) as rank 2, process 2 renumbered 3
)
LR = 1e-2


def _grad(name: str, shape, step: int) -> torch.Tensor:
    """The full gradient of ``name`` at ``step``: the same on every holder and in the reference."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(1000 * step + sum(map(ord, name))))


def _train(named, opt, first: int, steps: int) -> None:
    for step in range(first, first + steps):
        for name, index, t in named:
            t.grad = _slice(_grad(name, FULL_SHAPES[name], step), index)
        opt.step()


FULL_SHAPES = {n: tuple(p.shape) for n, p in Reference(CFG).named_parameters()}


def _carry_worker(proc: int, store: str, out: str) -> None:
    import os
    import traceback
    from datetime import timedelta

    import torch.distributed as dist

    from ntp_planner.executor.elastic.state import carry, snapshot

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)
    try:
        base, record, state, done = dist.FileStore(store, 4), {}, {}, 0
        previous = None
        for gen, (spec, procs, steps) in enumerate(GENERATIONS):
            if proc not in procs:
                state = {}  # not a rank of this generation: whatever it held goes stale
                previous = (spec, procs)
                done += steps
                continue
            rank = procs.index(proc)
            replica, s = spec.locate(rank)
            model = StageModel(spec, spec.replicas[replica].stages[s], rank, Reference(CFG, seed=9), None, "cpu")
            opt = torch.optim.AdamW([t for *_, t in model.named_parameters()], lr=LR, weight_decay=0.01)
            if previous is not None:
                dist.init_process_group(
                    "gloo", store=dist.PrefixStore(f"gen{gen}/", base), rank=rank, world_size=len(procs),
                    timeout=timedelta(seconds=30),
                )  # fmt: skip
                plan = plan_moves(*previous, spec, procs)
                got = carry(plan, rank, state, model, opt, timeout_s=30)
                record[gen] = {"carried": snapshot(model, opt), "bytes": got}
                dist.destroy_process_group()
            else:  # generation 0 starts from the reference (seed 0); later ones must overwrite seed 9's values
                full = dict(Reference(CFG).named_parameters())
                with torch.no_grad():
                    for name, _, _, t in model.named_parameters():
                        t.copy_(_slice(full[name], held(spec, rank)[name]))
            index = held(spec, rank)
            _train([(n, index[n], t) for n, _, _, t in model.named_parameters()], opt, done, steps)
            done += steps
            state = snapshot(model, opt)
            record.setdefault(gen, {})["trained"] = state
            previous = (spec, procs)
        torch.save(record, f"{out}/{proc}.pt")
    except BaseException:
        with open(f"{out}/{proc}.err", "w") as f:
            f.write(traceback.format_exc())
        os._exit(1)
    os._exit(0)


def _reference_states() -> list[dict]:
    """Full state after each generation's steps, trained in one process."""
    ref = Reference(CFG)
    named = [(n, None, p) for n, p in ref.named_parameters()]
    opt = torch.optim.AdamW([p for *_, p in named], lr=LR, weight_decay=0.01)
    out, done = [], 0
    for _, _, steps in GENERATIONS:
        _train(named, opt, done, steps)
        done += steps
        out.append({n: {"param": p.detach().clone(), **{k: opt.state[p][k].clone() for k in ("exp_avg", "exp_avg_sq")},
                        "step": opt.state[p]["step"].clone()} for n, _, p in named})  # fmt: skip
    return out


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_carry_on_gloo_shrink_then_a_newcomer(tmp_path):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(target=_carry_worker, args=(p, str(tmp_path / "store"), str(tmp_path)), daemon=True)
        for p in range(4)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(90)
    for p in procs:
        if p.is_alive():
            p.kill()
    errors = [f.read_text() for f in sorted(tmp_path.glob("*.err"))]
    assert not errors and all(p.exitcode == 0 for p in procs), errors or [p.exitcode for p in procs]
    records = {p: torch.load(tmp_path / f"{p}.pt") for p in range(4)}
    want = _reference_states()
    for gen in (1, 2):
        (old, old_procs, _), (spec, procs_, _) = GENERATIONS[gen - 1], GENERATIONS[gen]
        plan = plan_moves(old, old_procs, spec, procs_)
        for rank, proc in enumerate(procs_):
            for when, ref_gen in (("carried", gen - 1), ("trained", gen)):
                got = records[proc][gen][when]
                for name, index in held(spec, rank).items():
                    for k in ("param", "exp_avg", "exp_avg_sq"):
                        torch.testing.assert_close(got[name][k], _slice(want[ref_gen][name][k], index))
                    assert float(got[name]["step"]) == float(want[ref_gen][name]["step"])
            assert records[proc][gen]["bytes"] == sum(m.bytes for m in plan.moves if m.dst == rank)
    assert records[3][2]["bytes"] > 0  # the newcomer received everything


def test_only_a_plain_adamw_is_carried():
    ref = Reference(CFG)
    spec = tp(1)
    model = StageModel(spec, spec.replicas[0].stages[0], 0, ref, None, torch.device("cpu"))
    sgd = torch.optim.SGD([t for *_, t in model.named_parameters()], lr=0.1)
    with pytest.raises(ValueError, match=r"needs a plain torch.optim.AdamW over the rank's tensors, not SGD"):
        snapshot(model, sgd)


def test_carry_refuses_a_plan_with_missing_rows():
    plan = plan_moves(tp(4), (0, 1, 2, 3), tp(3), (0, 1, 2))
    spec = tp(3)
    model = StageModel(spec, spec.replicas[0].stages[0], 0, Reference(CFG), None, torch.device("cpu"))
    opt = torch.optim.AdamW([t for *_, t in model.named_parameters()])
    with pytest.raises(ValueError, match=r"no surviving process holds some rows of embed, .*load the last checkpoint"):
        carry(plan, 0, {}, model, opt)
