"""Which mover a layout change takes (rows for plain AdamW at ZeRO-0 without expert parallelism,
elements otherwise), what each reports missing on small specs, the kept state seen by the
element mover, and the layouts checkpoints are written and loaded in."""

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")

from ntp_planner.executor.elastic import handover  # noqa: E402
from ntp_planner.executor.elastic.sharded import ShardPlan  # noqa: E402
from ntp_planner.executor.elastic.state import MovePlan  # noqa: E402
from ntp_planner.executor.spec import TinyConfig, make_spec  # noqa: E402

CFG = TinyConfig()  # hidden 32, vocabulary 64, 2 layers: the embedding is 64 x 32
MOE = TinyConfig(experts=4, top_k=2, expert_ffn=8, moe_layers=(1,), shared_ffn=6)


def spec(*widths, zero=0, cfg=CFG, ep=1, etp=None):
    return make_spec(cfg, [[4, 4, 4, 4]], [([w], 1) for w in widths], 1, 4, width=4, zero=zero, ep=ep, etp=etp)


@pytest.mark.parametrize(
    "s, rows",
    [(spec(2, 2), True), (spec(1, 1, 1, 1, cfg=MOE), True), (spec(2, 2, zero=1), False),
     (spec(2, 2, zero=3), False), (spec(1, 1, 1, 1, cfg=MOE, ep=2), False),
     (spec(2, 2, cfg=MOE, etp=1), False)],
    ids=["zero0", "moe-ep1", "zero1", "zero3", "moe-ep2", "moe-folded-ep1"],
)  # fmt: skip
def test_by_rows(s, rows):
    assert handover.by_rows(s) is rows


def test_two_row_layouts_take_the_row_mover():
    got = handover.plan(spec(4), (0, 1, 2, 3), spec(3), (0, 1, 2))  # process 3 dies with TP rank 3's rows
    assert isinstance(got, MovePlan)
    assert dict(got.missing)["head"] == tuple(range(48, 64))  # vocabulary rows 48..63 of the head: 16 per TP4 rank


@pytest.mark.parametrize("old_zero, new_zero", [(0, 1), (1, 0), (1, 1)])
def test_a_sharded_side_takes_the_element_mover(old_zero, new_zero):
    got = handover.plan(spec(2, 2, zero=old_zero), (0, 1, 2, 3), spec(2, 2, zero=new_zero), (0, 1, 2, 3))
    assert isinstance(got, ShardPlan) and got.missing == ()  # everyone survives: everything is held


def test_a_zero1_replica_lost_takes_half_of_every_shard_with_it():
    # ZeRO-1 over DP2: per parameter, DP rank 0 (replica 0, processes 0, 1) held the first half of
    # each TP shard's AdamW state. Replica 1 goes on alone at ZeRO-1 over DP1: each of its TP2 ranks
    # needs the whole shard (embedding: 1024 elements) and has only its second half; the parameter
    # comes from the masters too, so 512 elements x 2 parts x 2 ranks = 2048 are missing
    got = handover.plan(spec(2, 2, zero=1), (0, 1, 2, 3), spec(2, zero=1), (2, 3))
    missing = dict(got.missing)
    assert isinstance(got, ShardPlan) and len(missing) == 21
    assert missing["embed"] == 2048 and missing["layers.0.q"] == 1024  # q: 512 per TP2 rank
    assert missing["layers.0.norm1"] == 64  # a norm is replicated: 16 of 32 x 2 parts x 2 ranks


def test_the_kept_state_as_the_element_mover_reads_it():
    assert handover.snapshot(None) == {}
    assert handover._flat({}) == {}
    flat = {"w": {"master": torch.zeros(3)}}
    assert handover._flat({"flat": flat}) is flat
    p = torch.arange(6.0).reshape(2, 3)
    rows = {"w": {"param": p, "exp_avg": p + 10, "exp_avg_sq": p + 20, "step": torch.tensor(4.0)}}
    got = handover._flat({"rows": rows})["w"]
    assert got["master"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert got["exp_avg"].tolist() == [10.0, 11.0, 12.0, 13.0, 14.0, 15.0]
    assert got["exp_avg_sq"].tolist()[-1] == 25.0 and got["step"].item() == 4.0


def test_checkpoints_are_written_with_every_expert_and_loaded_from_one_whole_rank():
    moe = spec(1, 1, 1, 1, cfg=MOE, ep=2)
    assert handover.checkpoint_spec(moe).ep == 1 and moe.ep == 2
    plain = spec(2, 2)
    assert handover.checkpoint_spec(plain) is plain
    one = handover._one_rank(spec(4, 4))
    assert one.world_size == 1 and one.seq_len == 4
    (replica,) = one.replicas
    (stage,) = replica.stages
    assert [(b.kind, b.layer, b.degree) for b in stage.blocks] == [
        ("embed", -1, 1), ("layer", 0, 1), ("layer", 1, 1), ("head", -1, 1)
    ]  # fmt: skip
