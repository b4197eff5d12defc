"""Where the next layout's state comes from: memory when every row has a live holder, else the
newest complete checkpoint, else the initial weights; the committed records after the start are
marked lost. Real move plans on small specs; the checkpoint folder's answers are hand-set."""

from types import SimpleNamespace

import pytest

pytest.importorskip("torch", reason="torch is not installed")

from ntp_planner.executor import checkpoint  # noqa: E402
from ntp_planner.executor.elastic.source import Source, state_source  # noqa: E402
from ntp_planner.executor.spec import TinyConfig, make_spec  # noqa: E402

CFG = TinyConfig()


def tp(*widths):
    return SimpleNamespace(spec=make_spec(CFG, [[4, 4, 4, 4]], [([w], 1) for w in widths], 1, 4, width=4))


def layout(widths, procs):
    out = tp(*widths)
    out.procs = procs
    return out


TP4X2 = layout((4, 4), tuple(range(8)))
SHRUNK = layout((3, 4), (0, 2, 3, 4, 5, 6, 7))  # process 1 died: replica 1 still holds every row
ALONE = layout((4,), (0, 1, 2, 3))
ALONE_SHRUNK = layout((3,), (0, 1, 2))  # process 3 died: its rows are nobody's


def gen(lay):
    """The generation whose layout holds the committed state."""
    return SimpleNamespace(layout=lay)


def records(*steps):
    return [{"step": s} for s in steps]


@pytest.fixture
def folder(monkeypatch):
    """A checkpoint folder whose newest complete step and its consumed samples are set by hand."""
    newest = {}

    def latest(root):
        assert root == "ckpt"
        return newest.get("step")

    def info(root, step):
        assert (root, step) == ("ckpt", newest["step"])
        return {"consumed_samples": newest["consumed"]}

    monkeypatch.setattr(checkpoint, "latest", latest)
    monkeypatch.setattr(checkpoint, "info", info)
    return newest


def test_no_layout_in_place_starts_from_the_initial_weights(folder):
    got = state_source("ntp", None, SHRUNK, 5, 40, "ckpt", [])
    assert got == Source(0, 0, "init", note="no layout had its state in place yet, so from the initial weights")


def test_every_row_held_starts_from_memory_at_the_committed_step(folder):
    folder.update(step=1, consumed=16)  # a checkpoint exists, but memory wins
    logged = records(0, 1, 2, 3)
    got = state_source("ntp", gen(TP4X2), SHRUNK, 4, 32, "ckpt", logged)
    assert (got.start, got.consumed, got.source, got.checkpoint_step, got.note) == (4, 32, "memory", None, "")
    assert got.moves.missing == () and got.moves.bytes_moved > 0  # replica 0's new TP3 ranks receive rows
    assert not any(r.get("lost") for r in logged)


def test_rows_nobody_holds_fall_back_to_the_newest_checkpoint_and_lose_the_steps_after(folder):
    folder.update(step=1, consumed=16)
    logged = records(0, 1, 2, 3)
    got = state_source("ntp", gen(ALONE), ALONE_SHRUNK, 4, 32, "ckpt", logged)
    assert (got.start, got.consumed, got.source, got.checkpoint_step) == (2, 16, "checkpoint", 1)
    assert got.note == "no live copy of rows of 12 parameters (embed, ...): from the checkpoint of step 1"
    assert len(got.moves.missing) == 12
    assert [bool(r.get("lost")) for r in logged] == [False, False, True, True]  # steps 2 and 3 are redone


def test_rows_nobody_holds_and_no_checkpoint_start_over(folder):
    logged = records(0, 1)
    got = state_source("ntp", gen(ALONE), ALONE_SHRUNK, 2, 16, "ckpt", logged)
    assert (got.start, got.consumed, got.source) == (0, 0, "init")
    assert (
        got.note == "no live copy of rows of 12 parameters (embed, ...): no checkpoint yet, so from the initial weights"
    )
    assert all(r["lost"] for r in logged)


def test_no_checkpoint_folder_is_no_checkpoint(folder):
    got = state_source("ntp", gen(ALONE), ALONE_SHRUNK, 2, 16, "", records(0))
    assert got.source == "init" and got.note.endswith("no checkpoint yet, so from the initial weights")


def test_restart_ignores_memory(folder):
    folder.update(step=3, consumed=24)
    logged = records(0, 1, 2, 3, 4)
    logged[4]["lost"] = True  # lost before: stays lost, is not counted again
    got = state_source("restart", gen(TP4X2), SHRUNK, 5, 40, "ckpt", logged)
    assert got == Source(4, 24, "checkpoint", 3, "from the checkpoint of step 3", None)
    assert [bool(r.get("lost")) for r in logged] == [False, False, False, False, True]


# The move plan is the one the processes carry with (``handover.plan``: the element mover for
# ZeRO 1-3 and expert parallelism, the row mover otherwise).


def sharded(*widths, procs, zero=0, cfg=CFG, ep=1):
    out = SimpleNamespace(spec=make_spec(cfg, [[4, 4, 4, 4]], [([w], 1) for w in widths], 1, 4, width=4,
                                         zero=zero, ep=ep), procs=procs)  # fmt: skip
    return out


def test_a_zero1_rank_lost_takes_its_adamw_shards_so_not_from_memory(folder):
    # ZeRO-1 over DP2 at TP2: process 1 (replica 0, TP rank 1) held the first half of TP rank 1's
    # AdamW state; replica 1's TP rank 1 holds only the second half: 16 parameters' shards are nobody's
    folder.update(step=1, consumed=16)
    old = sharded(2, 2, procs=(0, 1, 2, 3), zero=1)
    new = sharded(1, 2, procs=(0, 2, 3), zero=1)
    got = state_source("ntp", gen(old), new, 2, 16, "ckpt", records(0, 1))
    assert (got.source, got.start, got.checkpoint_step) == ("checkpoint", 2, 1)
    assert got.note.startswith("no live copy of rows of 16 parameters")


def test_an_ep2_spare_stands_in_from_memory():
    # MoE at ep 2 over 4 TP1 pipelines; spare 4 replaces process 1: its experts live on process 3
    moe = TinyConfig(experts=4, top_k=2, expert_ffn=8, moe_layers=(1,), shared_ffn=6)
    old = sharded(1, 1, 1, 1, procs=(0, 1, 2, 3), cfg=moe, ep=2)
    new = sharded(1, 1, 1, 1, procs=(0, 4, 2, 3), cfg=moe, ep=2)
    got = state_source("ntp", gen(old), new, 2, 8, "", [])
    assert got.source == "memory" and got.moves.missing == ()
