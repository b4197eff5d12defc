"""The reshard plan moves exactly the rows each rank holds in the new layout, each row once."""

import pytest

from ntp_planner.executor.parallel.reshard import reshard_plan
from ntp_planner.executor.parallel.tensor import param_index
from ntp_planner.executor.spec import TinyConfig

CFG = TinyConfig()  # 8 heads, 2 KV heads (head_dim 4), FFN 48, vocabulary 64


@pytest.mark.parametrize("key", ["q", "k", "v", "o", "gate", "up", "down", "embed", "head"])
@pytest.mark.parametrize("src, dst", [(4, 3), (3, 4), (8, 7), (4, 2), (3, 3), (5, 1)])
def test_every_destination_row_arrives_once_from_a_holder(key, src, dst):
    plan = reshard_plan(CFG, key, src, dst)
    for d in range(dst):
        wanted = param_index(CFG, key, dst, d)[1]
        got = {}
        for (s, dd), (src_pos, dst_pos) in plan.items():
            if dd != d:
                continue
            held = param_index(CFG, key, src, s)[1]
            for sp, dp in zip(src_pos, dst_pos, strict=True):
                assert dp not in got  # no row twice
                got[dp] = held[sp]  # the source really holds that row
        assert [got[i] for i in range(len(wanted))] == wanted


def test_a_rank_sends_at_most_its_own_slice():
    # TP4 -> TP3 of the FFN (12 columns each -> 16): the 4 ranks send 12 + 12 + 12 + 12 rows in all,
    # 12 + 8 + 4 + 0 of them staying put (rank 0 keeps 12, rank 1 keeps 8, rank 2 keeps 4)
    plan = reshard_plan(CFG, "gate", 4, 3)
    sent = {s: sum(len(p[0]) for (ss, _), p in plan.items() if ss == s) for s in range(4)}
    kept = {s: len(plan.get((s, s), ([], []))[0]) for s in range(3)}
    assert sent == {0: 12, 1: 12, 2: 12, 3: 12} and kept == {0: 12, 1: 8, 2: 4}
