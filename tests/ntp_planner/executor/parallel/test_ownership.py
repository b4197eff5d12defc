"""Which heads, KV heads, FFN columns and vocabulary rows each TP rank owns (``ownership``):
hand-derived splits (NTP's 32 heads on 30 GPUs, GQA groups cut by an uneven split) and brute
force over small grids against a closed form of the owner of each unit."""

import pytest

from ntp_planner.executor.parallel.ownership import contiguous, layer_shards, vocab_shards


def owner(unit: int, units: int, degree: int) -> int:
    """The rank holding ``unit`` when ``units`` are dealt contiguously, fuller ranks first: the
    first ``extra`` ranks hold base + 1 units, the rest base (closed form, no running sum)."""
    base, extra = divmod(units, degree)
    fuller = extra * (base + 1)
    return unit // (base + 1) if unit < fuller else extra + (unit - fuller) // base


def test_contiguous_blocks_by_hand():
    assert contiguous(10, 3) == ((0, 4), (4, 7), (7, 10))
    assert contiguous(12, 4) == ((0, 3), (3, 6), (6, 9), (9, 12))
    assert contiguous(5, 5) == tuple((i, i + 1) for i in range(5))
    assert contiguous(7, 1) == ((0, 7),)


def test_32_heads_on_30_ranks_gives_the_first_two_ranks_two_heads():
    s = layer_shards(heads=32, kv_heads=32, ffn=30 * 4 + 7, degree=30)
    assert s.heads[:3] == ((0, 1), (2, 3), (4,))
    assert s.heads[29] == (31,)
    assert [len(h) for h in s.heads] == [2, 2] + [1] * 28
    assert s.kv_heads == s.heads  # MHA: every query head its own KV head, nothing cut
    # 127 FFN columns: 7 ranks of 5, then 23 of 4
    assert s.ffn[:8] == ((0, 5), (5, 10), (10, 15), (15, 20), (20, 25), (25, 30), (30, 35), (35, 39))
    assert s.ffn[-1] == (123, 127)


def test_gqa_8_kv_heads_on_3_ranks_replicates_the_two_cut_groups():
    # 32 query heads in 8 groups of 4 over 3 ranks: heads 0-10, 11-21, 22-31. Head 11 opens rank 1
    # inside group 2 (heads 8-11) and head 22 opens rank 2 inside group 5 (heads 20-23)
    s = layer_shards(heads=32, kv_heads=8, ffn=48, degree=3)
    assert s.heads == (tuple(range(0, 11)), tuple(range(11, 22)), tuple(range(22, 32)))
    assert s.kv_heads == ((0, 1, 2), (2, 3, 4, 5), (5, 6, 7))
    assert [s.kv_owners(kv) for kv in range(8)] == [(0,), (0,), (0, 1), (1,), (1,), (1, 2), (2,), (2,)]
    assert s.ffn == ((0, 16), (16, 32), (32, 48))


def test_a_split_along_group_boundaries_cuts_nothing():
    s = layer_shards(heads=32, kv_heads=8, ffn=48, degree=4)  # 8 heads = 2 groups per rank
    assert s.kv_heads == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert all(len(s.kv_owners(kv)) == 1 for kv in range(8))


def test_vocab_rows_by_hand():
    assert vocab_shards(64, 3) == ((0, 22), (22, 43), (43, 64))
    assert vocab_shards(64, 1) == ((0, 64),)
    assert vocab_shards(10, 4) == ((0, 3), (3, 6), (6, 8), (8, 10))


@pytest.mark.parametrize(
    ("heads", "ffn", "degree"),
    [(8, 48, 0), (8, 48, 9), (8, 5, 6)],
    ids=["no-rank", "more-ranks-than-heads", "more-ranks-than-ffn-columns"],
)
def test_impossible_degrees_say_why(heads, ffn, degree):
    with pytest.raises(ValueError, match=f"degree {degree} must be between 1 and the heads \\({heads}\\)"):
        layer_shards(heads=heads, kv_heads=2, ffn=ffn, degree=degree)


def test_every_unit_is_owned_once_by_its_closed_form_owner_brute_force():
    for heads in range(1, 13):
        for kv_heads in (k for k in range(1, heads + 1) if heads % k == 0):
            group = heads // kv_heads
            for degree in range(1, heads + 1):
                ffn = heads + 3
                s = layer_shards(heads, kv_heads, ffn, degree)
                case = (heads, kv_heads, degree)
                # every query head once, at its closed-form owner; shares differ by at most one
                assert sorted(h for owned in s.heads for h in owned) == list(range(heads)), case
                for r, owned in enumerate(s.heads):
                    assert all(owner(h, heads, degree) == r for h in owned), case
                assert [len(h) for h in s.heads] == sorted((len(h) for h in s.heads), reverse=True), case
                assert max(map(len, s.heads)) - min(map(len, s.heads)) <= 1, case
                # a KV head lives on every rank holding one of its group's query heads, and on no other
                for kv in range(kv_heads):
                    want = tuple(sorted({owner(h, heads, degree) for h in range(kv * group, (kv + 1) * group)}))
                    assert s.kv_owners(kv) == want, (case, kv)
                # replicas of cut KV heads = rank boundaries that fall inside a group
                cuts = sum(1 for r in range(1, degree) if s.heads[r][0] % group)
                assert sum(len(k) for k in s.kv_heads) == kv_heads + cuts, case
                # FFN columns: contiguous, every column once, at its closed-form owner
                for r, (a, b) in enumerate(s.ffn):
                    assert all(owner(c, ffn, degree) == r for c in range(a, b)), case
                assert s.ffn[0][0] == 0 and s.ffn[-1][1] == ffn
                assert all(s.ffn[r][1] == s.ffn[r + 1][0] for r in range(degree - 1)), case
