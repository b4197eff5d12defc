"""Where the layers live in a pipeline: model chunks, as Megatron-LM writes them.

A pipeline of ``pp`` stages with ``vpp`` virtual stages (interleaving) cuts the model into
``pp * vpp`` chunks, in model order. Chunk ``c`` runs on pipeline stage ``c % pp`` as its virtual
chunk ``c // pp`` (Megatron-Core ``pipeline_parallel_layer_layout.py``), so stage s holds chunks s,
s + pp, s + 2 pp, ... The embedding sits in chunk 0 and the LM head with the loss in the last
chunk. A chunk holds a whole number of transformer layers, possibly none when it holds the
embedding or the loss.

Megatron's ways of writing a split, all turned into the same ``chunk_layers`` tuple here:

- an even split (``L`` divisible by ``pp * vpp``), or, ours, leading chunks one layer more;
- ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split``: the
  embedding and the loss count as one layer each, so chunk 0 (and the last chunk) hold one
  transformer layer fewer; ``L + 1`` (or ``+ 2``) must divide by ``pp * vpp``;
- an explicit ``--pipeline-model-parallel-layout`` string (``parse_layout``).

Worked example, 126 layers (Llama 3.1 405B) at pp 8 and vpp 8 with both accounts: 128 slots in
64 chunks of 2, so chunk 0 is ``E t``, chunks 1-62 are ``t t`` and chunk 63 is ``t L``; stage 0
holds chunks 0, 8, ..., 56: 15 layers and the embedding.

>>> chunks = megatron_split(126, 8, 8, embedding=True, loss=True)
>>> chunks[0], chunks[1], chunks[-1], len(chunks), sum(chunks)
(1, 2, 1, 64, 126)
>>> format_layout(parse_layout("Et*3|(tt|)*2,L", pp=2), pp=2)
'Ettt|tt|tt|L'
"""

from __future__ import annotations

import re

from topologies.errors import InputError

LAYOUT_SYMBOLS = "EtL|"


def even_split(num_layers: int, chunks: int) -> tuple[int, ...]:
    """``num_layers`` over ``chunks`` as evenly as possible, leading chunks one layer more.

    >>> even_split(10, 4)
    (3, 3, 2, 2)
    """
    base, extra = divmod(num_layers, chunks)
    return tuple(base + (1 if i < extra else 0) for i in range(chunks))


def megatron_split(num_layers: int, pp: int, vpp: int, embedding: bool, loss: bool) -> tuple[int, ...]:
    """Layers per chunk when the embedding and/or the loss count as pipeline layers (Megatron's
    ``--account-for-*-in-pipeline-split``): ``L + #accounted`` slots split evenly, the first (and
    last) chunk giving one slot to the embedding (and the loss). InputError when the slots do not
    divide evenly, as in Megatron."""
    chunks = pp * vpp
    slots = num_layers + embedding + loss
    if slots % chunks:
        raise InputError(
            f"layers({num_layers}) + embedding({int(embedding)}) + loss({int(loss)}) = {slots} is not divisible "
            f"by pp({pp}) * vpp({vpp}) = {chunks}; Megatron needs equal chunks when the embedding or the loss "
            "count as pipeline layers"
        )
    per = slots // chunks
    counts = [per] * chunks
    counts[0] -= embedding
    counts[-1] -= loss
    if min(counts) < 0:
        counted = " and ".join(n for n, k in (("the embedding", embedding), ("the loss", loss)) if k) or "nothing"
        raise InputError(f"{chunks} chunks of {per} layers each leave no room for {counted} counted as a layer")
    return tuple(counts)


def megatron_splits(num_layers: int, pp: int, vpp: int) -> dict[tuple[bool, bool], tuple[int, ...]]:
    """Every split Megatron's ``--account-for-*-in-pipeline-split`` flags give that it accepts,
    keyed by (embedding counted, loss counted).

    >>> megatron_splits(6, 2, 1)  # 8 slots split in two; 7 would not
    {(True, True): (3, 3)}
    """
    splits = {}
    for embedding, loss in ((True, True), (True, False), (False, True)):
        try:
            splits[(embedding, loss)] = megatron_split(num_layers, pp, vpp, embedding, loss)
        except InputError:
            continue
    return splits


def chunks_from_stages(stage_layers: tuple[int, ...], vpp: int) -> tuple[int, ...]:
    """Model-order chunk counts from per-stage totals: stage s's layers split evenly over its
    vpp chunks (s, s + pp, ...), leading chunks one more.

    >>> chunks_from_stages((3, 5), 2)
    (2, 3, 1, 2)
    """
    pp = len(stage_layers)
    per_stage = [even_split(n, vpp) for n in stage_layers]
    return tuple(per_stage[c % pp][c // pp] for c in range(pp * vpp))


def stage_totals(chunk_layers: tuple[int, ...], pp: int) -> tuple[int, ...]:
    """Transformer layers on each stage: the sum of its chunks.

    >>> stage_totals((2, 3, 1, 2), 2)
    (3, 5)
    """
    return tuple(sum(chunk_layers[s::pp]) for s in range(pp))


def chunk_starts(chunk_layers: tuple[int, ...]) -> tuple[int, ...]:
    """Index of the first layer of each chunk (model order)."""
    starts, at = [], 0
    for n in chunk_layers:
        starts.append(at)
        at += n
    return tuple(starts)


def stage_chunk_spans(
    pp: int, vpp: int, chunk_layers: tuple[int, ...] | None, stage: int, num_layers: int
) -> list[tuple[int, int, int]]:
    """(chunk index, first layer, layer count) of every chunk of ``stage``, in the order the
    stage runs them; ``chunk_layers`` None is the even split.

    >>> stage_chunk_spans(2, 2, None, 1, 10)
    [(1, 3, 3), (3, 8, 2)]
    """
    total = pp * vpp
    if chunk_layers is None:  # the even split in closed form: the search asks this a lot
        base, extra = divmod(num_layers, total)
        return [(c, c * base + min(c, extra), base + (c < extra)) for c in range(stage, total, pp)]
    starts = chunk_starts(chunk_layers)
    return [(c, starts[c], chunk_layers[c]) for c in range(stage, total, pp)]


def _unroll(text: str) -> str:
    """Expand Megatron's repetitions: ``(...)*n`` first, then ``x*n`` for one symbol. Raises
    OverflowError before building anything longer than ``MAX_LAYOUT_CHARS``."""

    def repeat(body: str, times: str) -> str:
        if len(body) * int(times) > MAX_LAYOUT_CHARS:
            raise OverflowError
        return body * int(times)

    group = re.compile(r"\(([^()]*)\)\*(\d+)")
    while True:
        expanded = group.sub(lambda m: repeat(m.group(1), m.group(2)), text)
        if expanded == text:
            break
        if len(expanded) > MAX_LAYOUT_CHARS:
            raise OverflowError
        text = expanded
    flat = re.sub(r"(.)\*(\d+)", lambda m: repeat(m.group(1), m.group(2)), text)
    if len(flat) > MAX_LAYOUT_CHARS:
        raise OverflowError
    return flat


MAX_LAYOUT_CHARS = 100_000  # an unrolled layout longer than this is refused, not built


def parse_layout(text: str, pp: int) -> tuple[int, ...]:
    """Layers per chunk from a Megatron ``--pipeline-model-parallel-layout`` string.

    Grammar (Megatron-Core ``pipeline_parallel_layer_layout.py``): ``E`` embedding, ``t`` one
    transformer layer, ``L`` loss, ``|`` between chunks, ``(...)*n`` and ``x*n`` repeat, commas
    are cosmetic. The chunks must number a multiple of ``pp`` (vpp = chunks / pp); ``E`` opens
    the first chunk and ``L`` closes the last, once each. Multi-token prediction layers (``m``)
    are allowed only in the last chunk, beside the loss, which is where the cost model charges
    them (``ModelSpec.mtp_layers``); they are not counted as transformer layers.

    >>> parse_layout("Et|tt|tt|tmL", pp=2)
    (1, 2, 2, 1)

    >>> parse_layout("Et|tt|tt|tL", pp=2)
    (1, 2, 2, 1)
    """
    cleaned = text.replace(",", "").replace(" ", "")
    if len(cleaned) > 1000 or any(len(n) > 6 for n in re.findall(r"\d+", cleaned)):
        raise InputError(f"pipeline layout {text!r} is too long; write repetitions as (...)*n with n < 1,000,000")
    try:
        flat = _unroll(cleaned)
    except OverflowError:
        raise InputError(f"pipeline layout {text!r} unrolls to over {MAX_LAYOUT_CHARS:,} symbols") from None
    bad = sorted(set(flat) - set(LAYOUT_SYMBOLS) - {"m"})
    if bad:
        raise InputError(
            f"pipeline layout {text!r} has symbols {''.join(bad)!r}; use E (embedding), t (layer), L (loss), "
            "| (next chunk), (...)*n and x*n, e.g. 'Et*3|(tt|)*29,t|L'"
        )
    chunks = flat.split("|")
    if flat.count("E") != 1 or not chunks[0].startswith("E"):
        raise InputError(f"pipeline layout {text!r} must open its first chunk with E (the embedding), once")
    if flat.count("L") != 1 or not chunks[-1].endswith("L"):
        raise InputError(f"pipeline layout {text!r} must close its last chunk with L (the loss), once")
    if any("m" in c for c in chunks[:-1]) or chunks[-1].rstrip("L").rstrip("m").count("m"):
        raise InputError(
            f"pipeline layout {text!r} puts multi-token prediction layers ('m') outside the last chunk or between "
            "its layers; write them at the end of the last chunk, before L, e.g. 'Et|tt|tmL'"
        )
    if len(chunks) % pp:
        raise InputError(
            f"pipeline layout {text!r} has {len(chunks)} chunks, not a multiple of pp({pp}); "
            "each stage needs the same number of virtual chunks"
        )
    return tuple(c.count("t") for c in chunks)


def format_layout(chunk_layers: tuple[int, ...], pp: int) -> str:
    """The Megatron layout string of ``chunk_layers`` (``pp`` is implied by the caller's layout).

    >>> format_layout((1, 2, 2, 1), 2)
    'Et|tt|tt|tL'
    """
    del pp  # chunks are in model order; the stage of chunk c is c % pp
    segments = ["t" * n for n in chunk_layers]
    segments[0] = "E" + segments[0]
    segments[-1] = segments[-1] + "L"
    return "|".join(segments)


def describe_chunks(chunk_layers: tuple[int, ...]) -> str:
    """Run-length form of the chunk counts, e.g. '1/2*62/1'.

    >>> describe_chunks((1, 2, 2, 2, 1))
    '1/2*3/1'
    """
    runs: list[list[int]] = []
    for n in chunk_layers:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    return "/".join(f"{n}*{k}" if k > 1 else str(n) for n, k in runs)
