"""Pipeline chunks: Megatron's layout grammar, its even and accounted splits, and which chunks a
stage holds under interleaving, pinned to hand-written layouts and small brute-force checks."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cost_models import MODELS, ParallelLayout, TrainingSpec, check_layout
from cost_models.pipeline_layout import (
    chunks_from_stages,
    describe_chunks,
    even_split,
    format_layout,
    megatron_split,
    parse_layout,
    stage_totals,
)

PIPELINE_LAYOUT_PY = Path(__file__).resolve().parents[2] / "cost_models" / "pipeline_layout.py"

# 126 layers at pp 8, vpp 8, embedding and loss accounted: 128 slots / 64 chunks = 2 per chunk,
# chunk 0 gives one slot to E, chunk 63 one slot to L.
LLAMA405_CHUNKS = (1,) + (2,) * 62 + (1,)


# ---- parse_layout -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "pp", "expected"),
    [
        ("Et|tt|tt|tL", 2, (1, 2, 2, 1)),
        # (tt|)*2 -> tt|tt|, t*3 -> ttt, comma dropped: Ettt|tt|tt|L
        ("Et*3|(tt|)*2,L", 2, (3, 2, 2, 0)),
        ("Et*3|(tt|)*2,L", 4, (3, 2, 2, 0)),
        # A single chunk holding everything (pp 1, no interleaving)
        ("Et*4L", 1, (4,)),
        # Embedding and loss alone in their chunks: E|t|L at pp 3
        ("E|t|L", 3, (0, 1, 0)),
        # Spaces and commas are cosmetic
        ("E t , t | t t L", 2, (2, 2)),
        # Megatron-Bridge's 70B recipe: Ett| (tt|)*34 ttt| (tt|)*3 tL
        # -> 2, then 34 x 2, then 3, then 3 x 2, then 1: 40 chunks, 2 + 68 + 3 + 6 + 1 = 80 layers.
        ("Et*2|(t*2|)*34,t*3|(t*2|)*3,tL", 4, (2,) + (2,) * 34 + (3,) + (2,) * 3 + (1,)),
        # Nested groups: ((t|)*2t|)*2 -> t|t|t|t|t|t| (6 chunks of 1), framed by E..L
        ("E((t|)*2t|)*2L", 7, (1, 1, 1, 1, 1, 1, 0)),
    ],
)
def test_parse_layout_hand_cases(text, pp, expected):
    got = parse_layout(text, pp)
    assert got == expected
    assert len(got) % pp == 0


def test_parse_layout_counts_no_mtp_layers():
    # DeepSeek-V3's 26.x recipe layout: E + 4 layers, 14 chunks of 4, 1 layer + MTP + L -> 61 layers
    chunks = parse_layout("Et*4|(t*4|)*14tmL", pp=8)
    assert chunks == (4,) + (4,) * 14 + (1,)
    assert sum(chunks) == 61


def test_parse_layout_405b_accounted_layout():
    # Et|(tt|)*62,tL: E + 1 layer, 62 chunks of 2, 1 layer + L -> 64 chunks, 1 + 124 + 1 = 126 layers.
    assert parse_layout("Et|(tt|)*62,tL", pp=8) == LLAMA405_CHUNKS


@pytest.mark.parametrize(
    ("text", "pp", "fragment"),
    [
        ("Et|tm|tL", 2, "multi-token prediction layers ('m')"),
        ("Et|tt|tt|tmtL", 2, "outside the last chunk or between its layers"),
        ("Et|tx|tL", 2, "has symbols 'x'"),
        ("Et|t?|t#L", 2, "has symbols '#?'"),
        ("Et|tt|tL", 2, "has 3 chunks, not a multiple of pp(2)"),
        ("tE|tt|tt|tL", 2, "must open its first chunk with E"),
        ("Et|Et|tt|tL", 2, "must open its first chunk with E"),
        ("t|tt|tt|tL", 2, "must open its first chunk with E"),
        ("Et|tt|tt|Lt", 2, "must close its last chunk with L"),
        ("Et|tL|tt|tL", 2, "must close its last chunk with L"),
        ("Et|tt|tt|tt", 2, "must close its last chunk with L"),
        ("", 1, "must open its first chunk with E"),
        # a 7-digit repetition count, or a written-out string over 1,000 characters
        ("E(t|)*1000000L", 1, "is too long; write repetitions as (...)*n with n < 1,000,000"),
        ("E" + "t" * 1001 + "L", 1, "is too long"),
        # counts within bounds that unroll past 100,000 symbols
        ("E(t)*999999L", 1, "unrolls to over 100,000 symbols"),
        ("E((t)*1000)*1000L", 1, "unrolls to over 100,000 symbols"),
    ],
)
def test_parse_layout_rejects_with_a_clear_message(text, pp, fragment):
    with pytest.raises(ValueError) as err:
        parse_layout(text, pp)
    assert fragment in str(err.value)


# Nested repetitions whose counts are each in bounds but whose product is ~1e12 symbols. The
# module is loaded on its own (it only needs `re` and topologies.errors) in a child process capped at 512 MiB of
# address space, so a parser that builds the string before checking its size fails fast with a
# MemoryError instead of eating the machine.
_BOMB_SCRIPT = textwrap.dedent(
    """
    import importlib.util, resource, sys
    resource.setrlimit(resource.RLIMIT_AS, (512 * 2**20, 512 * 2**20))
    spec = importlib.util.spec_from_file_location("pipeline_layout", sys.argv[1])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        module.parse_layout(sys.argv[2], pp=1)
    except Exception as e:
        print(type(e).__name__, e)
    """
)


@pytest.mark.parametrize("text", ["E((t)*999999)*999999L", "E(t*999999|)*999999L"])
def test_parse_layout_rejects_nested_repetition_bombs(text):
    out = subprocess.run(
        [sys.executable, "-c", _BOMB_SCRIPT, str(PIPELINE_LAYOUT_PY), text],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    assert out.startswith("InputError"), out


def _compressed(chunks: tuple[int, ...]) -> str:
    """Megatron's compact form written independently of format_layout: every run of equal
    chunks but the last chunk as (t*n|)*k, then the last chunk as t*n, framed by E and L."""
    body, runs = list(chunks[:-1]), []
    for n in body:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    return "E" + ",".join(f"(t*{n}|)*{k}" for n, k in runs) + f",t*{chunks[-1]}L"


chunk_tuples = st.integers(1, 4).flatmap(
    lambda pp: st.tuples(
        st.just(pp),
        st.integers(1, 4).flatmap(lambda vpp: st.lists(st.integers(0, 6), min_size=pp * vpp, max_size=pp * vpp)),
    )
)


@given(chunk_tuples)
def test_format_then_parse_round_trips(pp_and_chunks):
    pp, chunks = pp_and_chunks
    chunks = tuple(chunks)
    text = format_layout(chunks, pp)
    assert text.count("E") == 1 and text.count("L") == 1 and text.count("|") == len(chunks) - 1
    assert text.count("t") == sum(chunks)
    assert parse_layout(text, pp) == chunks


@given(chunk_tuples)
def test_compressed_layout_parses_to_its_chunks(pp_and_chunks):
    pp, chunks = pp_and_chunks
    chunks = tuple(chunks)
    assert parse_layout(_compressed(chunks), pp) == chunks


def test_format_layout_hand_cases():
    assert format_layout((1, 2, 2, 1), 2) == "Et|tt|tt|tL"
    assert format_layout((0, 3, 3, 0), 2) == "E|ttt|ttt|L"
    assert format_layout((0,), 1) == "EL"
    assert format_layout((2, 0), 2) == "Ett|L"


# ---- megatron_split, even_split, chunks_from_stages, stage_totals ------------------------------


@pytest.mark.parametrize(
    ("layers", "pp", "vpp", "embedding", "loss", "expected"),
    [
        (126, 8, 8, True, True, LLAMA405_CHUNKS),
        # 30 + 2 = 32 slots / 4 = 8: E takes one of chunk 0's, L one of chunk 3's
        (30, 4, 1, True, True, (7, 8, 8, 7)),
        # 31 + 1 = 32 slots / 4 = 8, only the first chunk gives one up
        (31, 4, 1, True, False, (7, 8, 8, 8)),
        (31, 4, 1, False, True, (8, 8, 8, 7)),
        # 62 + 2 = 64 slots / (4 * 2) = 8 per chunk; chunk 0 and chunk 7 (stage 3's second) lose one
        (62, 4, 2, True, True, (7, 8, 8, 8, 8, 8, 8, 7)),
        # 2 + 2 = 4 slots / 4 = 1: the embedding and loss chunks hold no transformer layer
        (2, 2, 2, True, True, (0, 1, 1, 0)),
        (32, 4, 1, False, False, (8, 8, 8, 8)),
    ],
)
def test_megatron_split_hand_values(layers, pp, vpp, embedding, loss, expected):
    assert megatron_split(layers, pp, vpp, embedding, loss) == expected


@pytest.mark.parametrize(
    ("layers", "pp", "vpp", "embedding", "loss", "fragment"),
    [
        (80, 4, 1, True, False, "layers(80) + embedding(1) + loss(0) = 81 is not divisible by pp(4) * vpp(1) = 4"),
        (126, 8, 4, True, False, "= 127 is not divisible by pp(8) * vpp(4) = 32"),
        (80, 8, 2, True, True, "layers(80) + embedding(1) + loss(1) = 82 is not divisible by pp(8) * vpp(2) = 16"),
    ],
)
def test_megatron_split_rejects_uneven_slots(layers, pp, vpp, embedding, loss, fragment):
    with pytest.raises(ValueError) as err:
        megatron_split(layers, pp, vpp, embedding, loss)
    assert fragment in str(err.value)


@pytest.mark.parametrize(
    ("layers", "chunks", "expected"),
    [
        (10, 4, (3, 3, 2, 2)),  # 10 = 4 * 2 + 2: two leading chunks get a third layer
        (3, 5, (1, 1, 1, 0, 0)),
        (8, 4, (2, 2, 2, 2)),
        (126, 16, (8,) * 14 + (7,) * 2),  # 126 = 16 * 7 + 14
        (0, 2, (0, 0)),
    ],
)
def test_even_split_hand_values(layers, chunks, expected):
    assert even_split(layers, chunks) == expected


@given(st.integers(0, 500), st.integers(1, 64))
def test_even_split_is_balanced_and_leading_heavy(layers, chunks):
    got = even_split(layers, chunks)
    assert len(got) == chunks and sum(got) == layers
    assert max(got) - min(got) <= 1
    assert list(got) == sorted(got, reverse=True)


@pytest.mark.parametrize(
    ("stages", "vpp", "expected"),
    [
        # stage 0: 3 -> (2, 1), stage 1: 5 -> (3, 2); chunk c = stage c % 2's (c // 2)-th
        ((3, 5), 2, (2, 3, 1, 2)),
        # stage 0: 10 -> (4, 3, 3), stage 1: 7 -> (3, 2, 2), stage 2: 4 -> (2, 1, 1)
        ((10, 7, 4), 3, (4, 3, 2, 3, 2, 1, 3, 2, 1)),
        ((19, 20, 21, 20), 1, (19, 20, 21, 20)),
    ],
)
def test_chunks_from_stages_hand_values(stages, vpp, expected):
    assert chunks_from_stages(stages, vpp) == expected


@pytest.mark.parametrize(
    ("chunks", "pp", "expected"),
    [
        ((2, 3, 1, 2), 2, (3, 5)),  # stage 0: chunks 0, 2 = 2 + 1; stage 1: chunks 1, 3 = 3 + 2
        # stage 0: chunks 0, 8, ..., 56 = 1 + 7 * 2 = 15; stage 7: chunks 7, ..., 63 = 7 * 2 + 1 = 15;
        # stages 1-6: 8 chunks of 2 = 16
        (LLAMA405_CHUNKS, 8, (15,) + (16,) * 6 + (15,)),
        ((4, 3, 2, 3, 2, 1, 3, 2, 1), 3, (10, 7, 4)),
    ],
)
def test_stage_totals_hand_values(chunks, pp, expected):
    assert stage_totals(chunks, pp) == expected


@given(st.lists(st.integers(0, 40), min_size=1, max_size=8), st.integers(1, 6))
def test_stage_totals_undo_chunks_from_stages(stages, vpp):
    stages = tuple(stages)
    chunks = chunks_from_stages(stages, vpp)
    assert len(chunks) == len(stages) * vpp
    assert stage_totals(chunks, len(stages)) == stages


@pytest.mark.parametrize(
    ("chunks", "expected"),
    [
        (LLAMA405_CHUNKS, "1/2*62/1"),
        ((3, 3, 2, 2), "3*2/2*2"),
        ((5,), "5"),
        ((0, 0), "0*2"),
        ((1, 2, 1, 2), "1/2/1/2"),
    ],
)
def test_describe_chunks_hand_values(chunks, expected):
    assert describe_chunks(chunks) == expected


@given(st.lists(st.integers(0, 4), min_size=1, max_size=30))
def test_describe_chunks_expands_back(chunks):
    text = describe_chunks(tuple(chunks))
    expanded = []
    for part in text.split("/"):
        n, _, k = part.partition("*")
        expanded += [int(n)] * int(k or 1)
    assert expanded == chunks


# ---- ParallelLayout: which chunks a stage holds -------------------------------------------------


def test_interleaved_stage_chunks_even_split():
    # 18 layers over pp 4 x vpp 2 = 8 chunks: 18 = 8 * 2 + 2 -> (3, 3, 2, 2, 2, 2, 2, 2),
    # first layers 0, 3, 6, 8, 10, 12, 14, 16. Stage s holds chunks s and s + 4.
    lay = ParallelLayout(pp=4, vpp=2, global_batch=8)
    assert lay.chunks(18) == (3, 3, 2, 2, 2, 2, 2, 2)
    assert lay.stage_chunks(0, 18) == [(0, 0, 3), (4, 10, 2)]
    assert lay.stage_chunks(1, 18) == [(1, 3, 3), (5, 12, 2)]
    assert lay.stage_chunks(2, 18) == [(2, 6, 2), (6, 14, 2)]
    assert lay.stage_chunks(3, 18) == [(3, 8, 2), (7, 16, 2)]
    assert lay.stage_layers(18) == (5, 5, 4, 4)


def test_interleaved_stage_chunks_explicit_layout():
    # 405B accounted split: chunk c starts at 1 + 2 (c - 1) for c >= 1.
    lay = ParallelLayout(pp=8, vpp=8, global_batch=64, chunk_layers=LLAMA405_CHUNKS)
    stage0 = lay.stage_chunks(0, 126)
    assert [c for c, _, _ in stage0] == [0, 8, 16, 24, 32, 40, 48, 56]
    assert stage0[0] == (0, 0, 1) and stage0[1] == (8, 15, 2) and stage0[-1] == (56, 111, 2)
    stage7 = lay.stage_chunks(7, 126)
    assert [c for c, _, _ in stage7] == [7, 15, 23, 31, 39, 47, 55, 63]
    assert stage7[0] == (7, 13, 2) and stage7[-1] == (63, 125, 1)
    assert lay.stage_layers(126) == (15, 16, 16, 16, 16, 16, 16, 15)


@given(pp=st.integers(2, 6), vpp=st.integers(1, 4), layers=st.integers(0, 80))
def test_stage_chunks_cover_every_layer_once(pp, vpp, layers):
    lay = ParallelLayout(pp=pp, vpp=vpp, global_batch=pp)
    seen = []
    for s in range(pp):
        held = lay.stage_chunks(s, layers)
        assert [c % pp for c, _, _ in held] == [s] * vpp  # chunk c lives on stage c % pp
        assert [c // pp for c, _, _ in held] == list(range(vpp))  # as its virtual chunk c // pp
        assert sum(n for _, _, n in held) == lay.stage_layers(layers)[s]
        seen += [layer for _, first, n in held for layer in range(first, first + n)]
    assert sorted(seen) == list(range(layers))


# ---- check_layout: chunk rules ------------------------------------------------------------------

LLAMA70 = MODELS["llama3-70b"]  # 80 layers


def test_check_layout_rejects_an_empty_middle_chunk():
    # (40, 0, 20, 20): stages hold 40 + 20 = 60 and 0 + 20 = 20 layers, but chunk 1 is empty.
    lay = ParallelLayout(tp=8, pp=2, vpp=2, dp=4, global_batch=64, chunk_layers=(40, 0, 20, 20))
    with pytest.raises(ValueError) as err:
        check_layout(lay, LLAMA70, TrainingSpec(seq_len=8192, global_batch=64), 64, 8)
    assert "pp(2) * vpp(2) = 4 chunks for 80 layers leave chunk(s) [1] empty" in str(err.value)


def test_check_layout_allows_empty_embedding_and_loss_chunks():
    # (0, 40, 40, 0): chunk 0 holds only the embedding, chunk 3 only the loss.
    lay = ParallelLayout(tp=8, pp=2, vpp=2, dp=4, global_batch=64, chunk_layers=(0, 40, 40, 0))
    check_layout(lay, LLAMA70, TrainingSpec(seq_len=8192, global_batch=64), 64, 8)


@pytest.mark.parametrize(
    ("vpp", "micro_batch", "message"),
    [
        # 64 / (16 * dp 1) = 4 micro-batches per step, not a multiple of pp 8
        (2, 16, "micro-batches per step (4) to be a multiple of pp(8)"),
        (2, 8, None),  # 8 micro-batches: fine
        (1, 16, None),  # 4 micro-batches but no interleaving: the rule does not apply
    ],
)
def test_check_layout_interleaved_micro_batch_rule(vpp, micro_batch, message):
    lay = ParallelLayout(tp=8, pp=8, vpp=vpp, dp=1, micro_batch=micro_batch, global_batch=64)
    training = TrainingSpec(seq_len=8192, global_batch=64)
    if message is None:
        check_layout(lay, LLAMA70, training, 64, 8)
        return
    with pytest.raises(ValueError) as err:
        check_layout(lay, LLAMA70, training, 64, 8)
    assert message in str(err.value)
